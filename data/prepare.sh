#!/usr/bin/env bash
# Fetches CIFAR-10 (binary version) from its official address into data/cifar-10-batches-bin and
# checks its MD5. When that fails (offline), says so and points at Fashion-MNIST, which Debian ships
# as the package dataset-fashion-mnist (/usr/share/datasets/fashion-mnist); bin/train --data auto
# then trains on it.
#   data/prepare.sh           never fails for lack of CIFAR-10 alone
#   data/prepare.sh --strict  used by `make run` and `make data`: exits 1 unless some real data set
#                             (CIFAR-10 or Fashion-MNIST) is available
set -u
usage() {
  echo "usage: bash data/prepare.sh [--strict] [--help]"
  echo "Fetches CIFAR-10 into data/cifar-10-batches-bin (MD5 checked); offline, points at Fashion-MNIST,"
  echo "which bin/train --data auto uses instead (Debian's dataset-fashion-mnist)."
  echo "  --strict  exit 1 unless CIFAR-10 or Fashion-MNIST is available (make run, make data)"
  echo "  --help    print this help"
}
# Every argument is read before anything is fetched: --help must not start the download, and a flag
# mistyped beside --strict must not pass unnoticed.
strict=0
for arg in "$@"; do
  case $arg in
    --strict) strict=1 ;;
    --help|-h) usage; exit 0 ;;
    *) echo "data/prepare.sh: unknown argument '$arg' (see --help)" >&2; exit 2 ;;
  esac
done
# Fashion-MNIST is looked for where bin/train --data auto looks (find_fashion_mnist_dir in
# src/data/fashion_mnist.cpp), with its rules: $FASHION_MNIST_DIR when set, then data/fashion-mnist,
# then the Debian package's directory; the first that holds train-images-idx3-ubyte.gz or the
# uncompressed train-images-idx3-ubyte wins, so a set directory without it falls through to the next.
# That is done here, before the cd below, because bin/train takes relative paths from the directory
# it runs in, and `make run` runs it from the one it runs this script from. FASHION_MNIST_PACKAGE_DIR
# stands for the package's directory in the tests.
package_dir=${FASHION_MNIST_PACKAGE_DIR:-/usr/share/datasets/fashion-mnist}
fmnist=""
for dir in ${FASHION_MNIST_DIR+"$FASHION_MNIST_DIR"} data/fashion-mnist "$package_dir"; do
  if [ -e "$dir/train-images-idx3-ubyte.gz" ] || [ -e "$dir/train-images-idx3-ubyte" ]; then fmnist=$dir; break; fi
done
cd "$(dirname "$0")"
URL=https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz
MD5=c32a1d4ab5d03f1284b67883e8d87530

if [ -f cifar-10-batches-bin/data_batch_1.bin ] && [ -f cifar-10-batches-bin/test_batch.bin ]; then
  echo "data: CIFAR-10 present in data/cifar-10-batches-bin"; exit 0
fi
echo "data: fetching CIFAR-10 from $URL"
if curl -fL --connect-timeout 15 --max-time 600 -o cifar-10-binary.tar.gz.part "$URL" 2>/dev/null; then
  got=$(md5sum cifar-10-binary.tar.gz.part | cut -d' ' -f1)
  if [ "$got" = "$MD5" ]; then
    mv cifar-10-binary.tar.gz.part cifar-10-binary.tar.gz
    tar -xzf cifar-10-binary.tar.gz && rm -f cifar-10-binary.tar.gz
    echo "data: CIFAR-10 ready in data/cifar-10-batches-bin (MD5 $MD5 checked)"; exit 0
  fi
  echo "data: the download's MD5 is $got, expected $MD5: discarded"
else
  echo "data: CIFAR-10 could not be downloaded (no internet access to www.cs.toronto.edu?)"
fi
rm -f cifar-10-binary.tar.gz.part
if [ -n "$fmnist" ]; then
  echo "data: using Fashion-MNIST from $fmnist instead (real data: 60000 train, 10000 test images)"; exit 0
fi
echo "data: Fashion-MNIST is not installed either (looked in ${FASHION_MNIST_DIR:+$FASHION_MNIST_DIR, }data/fashion-mnist," \
     "$package_dir): sudo apt-get install dataset-fashion-mnist" >&2
exit $strict
