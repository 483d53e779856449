"""The data set files as bin/train finds and reads them, for the Python scripts that read them outside
it: data/make_folder.py and bench/load_safetensors.py import this (standard library only), so both
look for Fashion-MNIST where bin/train --data auto looks, in its order, and check Fashion-MNIST's idx
files and CIFAR-10's batch files as its readers do (a problem is a DataError naming the file).

Each script puts this folder on sys.path itself (by its own path), so it is found whether the script
runs as `python3 data/make_folder.py` or `python3 bench/load_safetensors.py`, or is imported by the
tests.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # run as a program by mistake: say which one (before the imports below can fail)
    print(f"{sys.argv[0]} is a module (the data set readers of the scripts), not a program: "
          "run python3 data/make_folder.py", file=sys.stderr)
    sys.exit(2)

import gzip
import os
import stat
import struct
import zlib
from pathlib import Path

FASHION_MNIST_PACKAGE_DIR = "/usr/share/datasets/fashion-mnist"  # the Debian package dataset-fashion-mnist
MNIST_SIDE = 28
MNIST_MAX_SIDE = 64  # the largest canvas bin/train --image-size puts Fashion-MNIST on (kFashionMnistMaxSide)
CIFAR_SIDE = 32
CIFAR_RECORD = 1 + 3 * CIFAR_SIDE * CIFAR_SIDE
CLASSES = 10  # both data sets' labels are 0..9, as bin/train's readers require (kArrayClasses)


class DataError(Exception):
    """Source data that is missing, or that bin/train would refuse; the scripts report it on one line."""


def fashion_mnist_dirs(local: str | Path = "data/fashion-mnist") -> list[str]:
    """Where bin/train looks for Fashion-MNIST, in its order (find_fashion_mnist_dir in
    src/data/fashion_mnist.cpp): $FASHION_MNIST_DIR when set, then data/fashion-mnist (`local`,
    relative to where the script runs, as bin/train takes it, unless a caller anchors it elsewhere),
    then the Debian package's directory, which $FASHION_MNIST_PACKAGE_DIR replaces when set and not
    empty, as in the Makefile and data/prepare.sh (the tests' stand-in for the package). An empty
    $FASHION_MNIST_DIR is passed over (bin/train would look for /train-images-idx3-ubyte.gz)."""
    first = [os.environ["FASHION_MNIST_DIR"]] if os.environ.get("FASHION_MNIST_DIR") else []
    return first + [str(local), os.environ.get("FASHION_MNIST_PACKAGE_DIR") or FASHION_MNIST_PACKAGE_DIR]


def holds_fashion_mnist(directory: str | Path) -> bool:
    """bin/train's test of a candidate: it holds train-images-idx3-ubyte, .gz or not."""
    return any((Path(directory) / f).exists() for f in ("train-images-idx3-ubyte.gz", "train-images-idx3-ubyte"))


def find_fashion_mnist_dir(local: str | Path = "data/fashion-mnist") -> Path | None:
    """The first of fashion_mnist_dirs(local) that holds the training images, or None: the directory
    bin/train --data auto trains on."""
    return next((Path(d) for d in fashion_mnist_dirs(local) if holds_fashion_mnist(d)), None)


def fashion_mnist_canvas_fits(side: int) -> bool:
    """Whether bin/train serves Fashion-MNIST at --image-size `side` (src/data/data_flags.cpp): its
    28x28 images centred, never cropped, on a canvas at most MNIST_MAX_SIDE wide."""
    return MNIST_SIDE <= side <= MNIST_MAX_SIDE and (side - MNIST_SIDE) % 2 == 0


def centre_on_canvas(images: bytes, side: int, canvas: int) -> bytes:
    """Each side x side image of `images` at the centre of a canvas x canvas zero image, (canvas - side)
    / 2 pixels from each edge: Fashion-MNIST as bin/train serves it at --image-size `canvas`."""
    pad, out = (canvas - side) // 2, bytearray()
    for i in range(0, len(images), side * side):
        image = bytearray(canvas * canvas)
        for y in range(side):
            row = (y + pad) * canvas + pad
            image[row:row + side] = images[i + y * side:i + (y + 1) * side]
        out += image
    return bytes(out)


def check_regular_file(path: str | Path) -> None:
    """A DataError unless path is a regular file (a link to one counts): reading a FIFO waits for a
    writer forever, a device may never end. A path that does not exist is left to the read (OSError)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if stat.S_ISDIR(mode) or stat.S_ISREG(mode):  # a directory: the read's own "Is a directory"
        return
    kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a file")
    raise DataError(f"{path}: not a regular file ({kind})")


def read_file(path: str | Path) -> bytes:
    """The bytes of a regular file (check_regular_file first, so that a FIFO is refused, not waited on)."""
    check_regular_file(path)
    return Path(path).read_bytes()


def check_length(path: Path, data: bytes, expected: int, what: str) -> None:
    if len(data) != expected:
        raise DataError(f"{path}: {'truncated' if len(data) < expected else 'too large'}: {len(data):,} bytes, "
                        f"expected {expected:,} ({what})")


def read_maybe_gz(directory: Path, base: str) -> tuple[Path, bytes]:
    """The file bin/train reads, <base>.gz if present (decompressed), else <base>; and its bytes."""
    path = directory / (base + ".gz")
    if path.exists():
        data = read_file(path)
        try:
            return path, gzip.decompress(data)
        except (EOFError, gzip.BadGzipFile, zlib.error) as e:
            raise DataError(f"{path}: not a valid gzip file ({e})") from None
    path = directory / base
    return path, read_file(path)


def first_bad_label(labels: bytes) -> int | None:
    """The index of the first label outside 0..9, or None."""
    return next((i for i, label in enumerate(labels) if label >= CLASSES), None)


def read_idx_pair(directory: Path, images: str, labels: str) -> tuple[int, bytes, bytes]:
    """The image count and the bytes (headers included) of an idx pair, read as bin/train reads them
    (read_maybe_gz) and checked (idx_count)."""
    (ipath, img), (lpath, lab) = read_maybe_gz(directory, images), read_maybe_gz(directory, labels)
    return idx_count(ipath, img, lpath, lab), img, lab


def idx_count(ipath: Path, img: bytes, lpath: Path, lab: bytes) -> int:
    """The image count of an idx pair, checked as bin/train checks it (parse_idx in
    src/data/fashion_mnist.cpp): both headers, the same count in both, each file's length exactly what
    the count makes it, and every label 0..9."""
    if len(img) < 16 or len(lab) < 8:
        raise DataError(f"{ipath if len(img) < 16 else lpath}: truncated idx header")
    magic, count, rows, cols = struct.unpack(">IIII", img[:16])
    lmagic, lcount = struct.unpack(">II", lab[:8])
    if magic != 0x803 or (rows, cols) != (MNIST_SIDE, MNIST_SIDE):
        raise DataError(f"{ipath}: not a Fashion-MNIST image file (idx3 of 28x28 unsigned bytes)")
    if lmagic != 0x801:
        raise DataError(f"{lpath}: not a Fashion-MNIST label file (idx1 of unsigned bytes)")
    if count == 0:
        raise DataError(f"{ipath}: the header says 0 images")
    if count != lcount:
        raise DataError(f"{ipath} holds {count:,} images but {lpath} holds {lcount:,} labels")
    check_length(ipath, img, 16 + count * MNIST_SIDE * MNIST_SIDE, f"the header says {count:,} images")
    check_length(lpath, lab, 8 + count, f"the header says {count:,} labels")
    bad = first_bad_label(lab[8:])
    if bad is not None:
        raise DataError(f"{lpath}: label {lab[8 + bad]} at index {bad}, expected 0..9")
    return count


def read_cifar_batch(path: Path) -> bytes:
    """A CIFAR-10 batch file's bytes, checked: whole records (a label byte, then the R, G and B planes of
    32x32), every label 0..9. Any whole number of records, not only bin/train's 10,000:
    tests/data/test_data_folder_export.cpp exports files of 10."""
    data = read_file(path)
    if not data or len(data) % CIFAR_RECORD:
        raise DataError(f"{path}: {len(data):,} bytes, expected a whole number of {CIFAR_RECORD}-byte records "
                        "(a label byte and 3,072 pixel bytes each)")
    bad = first_bad_label(data[::CIFAR_RECORD])
    if bad is not None:
        raise DataError(f"{path}: record {bad} has label {data[bad * CIFAR_RECORD]}, expected 0..9")
    return data
