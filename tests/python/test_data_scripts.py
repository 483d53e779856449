"""data/prepare.sh and data/make_folder.py as `make run`, `make data` and `make data-folder` run them,
on tiny Fashion-MNIST idx files and CIFAR-10 batch files made here.

prepare.sh runs as a copy in a temporary tree with a curl that always fails, so that it never
downloads, and never sees the CIFAR-10 or Fashion-MNIST a developer has under the real data/, with
FASHION_MNIST_PACKAGE_DIR naming a directory of the test's in place of the Debian package's.
"""

import contextlib
import gzip
import importlib.util
import io
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

from tests.python import REPO

CIFAR_RECORD = 3073  # a label byte, then 32x32 pixels of each of R, G, B


def write_fashion_mnist(directory: Path, gz: bool = False, train: int = 12, test: int = 5) -> None:
    """The four idx files with `train` and `test` 28x28 images, labels 0..9 in turn."""
    directory.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", train), ("t10k", test)):
        files = {f"{split}-images-idx3-ubyte": struct.pack(">IIII", 0x803, n, 28, 28) +
                 bytes((i * 7) % 256 for i in range(n * 28 * 28)),
                 f"{split}-labels-idx1-ubyte": struct.pack(">II", 0x801, n) + bytes(i % 10 for i in range(n))}
        for name, data in files.items():
            if gz:
                (directory / (name + ".gz")).write_bytes(gzip.compress(data))
            else:
                (directory / name).write_bytes(data)


def load_make_folder():
    """data/make_folder.py as a module of its own, so that a test can replace its functions."""
    spec = importlib.util.spec_from_file_location("make_folder", REPO / "data" / "make_folder.py")
    make_folder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_folder)
    return make_folder


class PrepareLooksWhereTrainLooks(unittest.TestCase):
    """The Fashion-MNIST look-up of bin/train (find_fashion_mnist_dir): $FASHION_MNIST_DIR when set,
    then data/fashion-mnist, then the package's directory; .gz or uncompressed; a set directory
    without the files falls through to the next; relative paths from where it is run."""

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = Path(self._tmp.name)
        (self.tmp / "data").mkdir()
        shutil.copy(REPO / "data" / "prepare.sh", self.tmp / "data" / "prepare.sh")
        fake_bin = self.tmp / "fake-bin"
        fake_bin.mkdir()
        (fake_bin / "curl").write_text("#!/bin/sh\nexit 7\n")  # curl's "could not connect"
        (fake_bin / "curl").chmod(0o755)
        self.path = f"{fake_bin}:{os.environ['PATH']}"
        self.package_dir = self.tmp / "package"  # empty: the package is not installed

    def tearDown(self):
        self._tmp.cleanup()

    def prepare(self, *args, fashion_mnist_dir=None):
        env = {k: v for k, v in os.environ.items() if k != "FASHION_MNIST_DIR"}
        env["PATH"] = self.path
        env["FASHION_MNIST_PACKAGE_DIR"] = str(self.package_dir)
        if fashion_mnist_dir is not None:
            env["FASHION_MNIST_DIR"] = str(fashion_mnist_dir)
        return subprocess.run(["bash", "data/prepare.sh", *args], cwd=self.tmp, env=env, capture_output=True,
                              text=True, timeout=60)

    def assertUses(self, p, directory):
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn(f"data: using Fashion-MNIST from {directory} instead", p.stdout)

    def test_uncompressed_files_in_fashion_mnist_dir(self):
        write_fashion_mnist(self.tmp / "fmraw")
        self.assertUses(self.prepare("--strict", fashion_mnist_dir=self.tmp / "fmraw"), self.tmp / "fmraw")

    def test_gz_files_in_fashion_mnist_dir(self):
        write_fashion_mnist(self.tmp / "fmgz", gz=True)
        self.assertUses(self.prepare("--strict", fashion_mnist_dir=self.tmp / "fmgz"), self.tmp / "fmgz")

    def test_relative_fashion_mnist_dir_is_from_where_it_runs(self):
        write_fashion_mnist(self.tmp / "fmraw")
        self.assertUses(self.prepare("--strict", fashion_mnist_dir="fmraw"), "fmraw")

    def test_data_fashion_mnist(self):
        write_fashion_mnist(self.tmp / "data" / "fashion-mnist")
        self.assertUses(self.prepare("--strict"), "data/fashion-mnist")

    def test_fashion_mnist_dir_comes_first(self):
        write_fashion_mnist(self.tmp / "data" / "fashion-mnist")
        write_fashion_mnist(self.tmp / "fmraw")
        self.assertUses(self.prepare("--strict", fashion_mnist_dir=self.tmp / "fmraw"), self.tmp / "fmraw")

    def test_a_set_dir_without_the_files_falls_through(self):
        write_fashion_mnist(self.tmp / "data" / "fashion-mnist")
        (self.tmp / "empty").mkdir()
        for missing in (self.tmp / "nonexistent", self.tmp / "empty"):
            self.assertUses(self.prepare("--strict", fashion_mnist_dir=missing), "data/fashion-mnist")

    def test_a_set_dir_without_the_files_falls_through_to_the_package(self):
        write_fashion_mnist(self.package_dir, gz=True)
        self.assertUses(self.prepare("--strict", fashion_mnist_dir="/nonexistent"), self.package_dir)

    def test_nothing_anywhere(self):
        p = self.prepare("--strict", fashion_mnist_dir=self.tmp / "nonexistent")
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertEqual(p.stderr.strip().splitlines(), [
            f"data: Fashion-MNIST is not installed either (looked in {self.tmp / 'nonexistent'}, data/fashion-mnist, "
            f"{self.package_dir}): sudo apt-get install dataset-fashion-mnist"])
        p = self.prepare("--strict", fashion_mnist_dir="")
        self.assertIn("(looked in data/fashion-mnist, ", p.stderr)  # an empty FASHION_MNIST_DIR is not listed
        self.assertEqual(self.prepare().returncode, 0)  # without --strict, a missing data set is no failure


    def test_help_prints_the_usage_and_fetches_nothing(self):
        for flag in ("--help", "-h"):
            with self.subTest(flag=flag):
                p = self.prepare(flag)  # it used to start the CIFAR-10 download
                self.assertEqual(p.returncode, 0, p.stderr)
                self.assertTrue(p.stdout.startswith("usage: bash data/prepare.sh [--strict] [--help]\n"), p.stdout)
                self.assertNotIn("fetching", p.stdout)
                self.assertEqual(p.stderr, "")

    def test_an_unknown_argument_is_refused_before_anything_is_fetched(self):
        # --strict counted only as the first argument: `--bogus --strict` exited 0 with no data.
        for args in (["--bogus", "--strict"], ["--strict", "--bogus"], ["strict"]):
            with self.subTest(args=args):
                p = self.prepare(*args)
                self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
                self.assertEqual(p.stdout, "")
                bad = next(a for a in args if a != "--strict")
                self.assertEqual(p.stderr, f"data/prepare.sh: unknown argument '{bad}' (see --help)\n")
        write_fashion_mnist(self.tmp / "data" / "fashion-mnist")
        self.assertUses(self.prepare("--strict", "--strict"), "data/fashion-mnist")  # a repeat is no error

class MakeFolderLooksWhereTrainLooks(unittest.TestCase):
    """make_folder.py without --fashion-mnist-dir takes the directory bin/train --data auto takes:
    $FASHION_MNIST_DIR, then the tree's data/fashion-mnist, then the package's directory, which
    FASHION_MNIST_PACKAGE_DIR names here as it does for prepare.sh and the Makefile. It runs as a copy
    in a temporary tree (with data/dataset_files.py beside it), so that the real data/ is not seen."""

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = Path(self._tmp.name)
        (self.tmp / "tree" / "data").mkdir(parents=True)
        for name in ("make_folder.py", "dataset_files.py"):
            shutil.copy(REPO / "data" / name, self.tmp / "tree" / "data" / name)
        self.package_dir = self.tmp / "package"

    def tearDown(self):
        self._tmp.cleanup()

    def source(self, fashion_mnist_dir=None) -> str:
        """The directory make_folder.py names in its `wrote ...` line, the set written with --limit 2."""
        env = {k: v for k, v in os.environ.items() if k != "FASHION_MNIST_DIR"}
        env["FASHION_MNIST_PACKAGE_DIR"] = str(self.package_dir)
        if fashion_mnist_dir is not None:
            env["FASHION_MNIST_DIR"] = str(fashion_mnist_dir)
        out = self.tmp / "out"
        shutil.rmtree(out, ignore_errors=True)
        p = subprocess.run([sys.executable, str(self.tmp / "tree" / "data" / "make_folder.py"), "--out", str(out),
                            "--cifar-dir", str(self.tmp / "no-cifar"), "--limit", "2"], cwd=self.tmp, env=env,
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        first = p.stdout.splitlines()[0]
        self.assertTrue(first.startswith("data-folder: wrote 2 train and 2 test PNGs of Fashion-MNIST (from "), first)
        return first.split("(from ", 1)[1].split(") to ", 1)[0]

    def test_the_package_dir_is_fashion_mnist_package_dir(self):
        write_fashion_mnist(self.package_dir, gz=True)
        self.assertEqual(self.source(), str(self.package_dir))  # the old script looked in /usr/share/datasets only

    def test_in_bin_trains_order(self):
        local = self.tmp / "tree" / "data" / "fashion-mnist"
        for d in (self.package_dir, local, self.tmp / "fmraw"):
            write_fashion_mnist(d)
        self.assertEqual(self.source(fashion_mnist_dir=self.tmp / "fmraw"), str(self.tmp / "fmraw"))
        self.assertEqual(self.source(), str(local))
        (self.tmp / "tests-only").mkdir()
        (self.tmp / "tests-only" / "t10k-images-idx3-ubyte").write_bytes(b"")  # no training images: passed over
        self.assertEqual(self.source(fashion_mnist_dir=self.tmp / "tests-only"), str(local))
        shutil.rmtree(local)
        self.assertEqual(self.source(fashion_mnist_dir=""), str(self.package_dir))


class MakeFolder(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = Path(self._tmp.name)
        self.fm = self.tmp / "fm"
        self.out = self.tmp / "out"
        write_fashion_mnist(self.fm)

    def tearDown(self):
        self._tmp.cleanup()

    def make_folder(self, *args, fashion=None, cifar=None):
        return subprocess.run([sys.executable, str(REPO / "data" / "make_folder.py"), "--out", str(self.out),
                               "--fashion-mnist-dir", str(fashion or self.fm), "--cifar-dir",
                               str(cifar or self.tmp / "no-cifar"), *args], capture_output=True, text=True, timeout=120)

    def write_cifar(self, test_bytes: int = 12 * CIFAR_RECORD, label: int = 0) -> Path:
        """data_batch_1.bin and test_batch.bin of 12 records, the first labelled `label`, the others 0;
        with --limit up to 12 only those two are read."""
        cifar = self.tmp / "cifar"
        cifar.mkdir()
        (cifar / "data_batch_1.bin").write_bytes(bytes([label]) + bytes(12 * CIFAR_RECORD - 1))
        (cifar / "test_batch.bin").write_bytes(bytes(test_bytes))
        return cifar

    def assertFails(self, p, message, kept=()):
        """One data-folder error line, exit 1, and in --out only the sets `kept` (written before the
        failure): no set under its final name from the failed one, no .tmp."""
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertNotIn("Traceback", p.stderr)
        self.assertEqual(p.stderr.strip().splitlines(), [f"data-folder: error: {message}"])
        left = sorted(f.name for f in self.out.iterdir()) if self.out.is_dir() else []
        self.assertEqual(left, list(kept))

    def pngs(self, name: str) -> list:
        return sorted(str(f.relative_to(self.out / name)) for f in (self.out / name).rglob("*.png"))

    def test_writes_both_sets(self):  # what the failing cases below change one thing of
        p = self.make_folder("--limit", "11", cifar=self.write_cifar())
        self.assertEqual(p.returncode, 0, p.stderr)
        pngs = self.pngs("fashion-mnist-png")
        self.assertEqual(len(pngs), 11 + 5)
        self.assertIn("train/0_T-shirt_top/00010.png", pngs)
        self.assertIn("test/4_Coat/00004.png", pngs)
        self.assertEqual(len(self.pngs("cifar-10-png")), 11 + 11)
        self.assertEqual(sorted(f.name for f in self.out.iterdir()), ["cifar-10-png", "fashion-mnist-png"])

    def test_reads_gz_files(self):
        write_fashion_mnist(self.tmp / "fmgz", gz=True)
        p = self.make_folder(fashion=self.tmp / "fmgz")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(len(self.pngs("fashion-mnist-png")), 12 + 5)

    def test_limit_must_be_at_least_one(self):
        for limit in ("0", "-1"):
            p = self.make_folder("--limit", limit)
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertIn(f"error: --limit must be at least 1, not {limit}", p.stderr)
            self.assertFalse(self.out.exists())

    def test_missing_fashion_mnist_dir(self):
        p = self.make_folder(fashion=self.tmp / "nonexistent")
        self.assertFails(p, f"--fashion-mnist-dir {self.tmp / 'nonexistent'}: no train-images-idx3-ubyte(.gz) there")
        self.assertFalse(self.out.exists())

    def test_truncated_gz(self):
        write_fashion_mnist(self.tmp / "fmgz", gz=True)
        gz = self.tmp / "fmgz" / "t10k-images-idx3-ubyte.gz"  # the test split, read before the train split is written
        gz.write_bytes(gz.read_bytes()[:-20])
        p = self.make_folder(fashion=self.tmp / "fmgz")
        self.assertFails(p, f"{gz}: not a valid gzip file (Compressed file ended before the end-of-stream "
                            "marker was reached)")

    def test_file_lengths_are_checked_against_the_header(self):
        images, labels = self.fm / "train-images-idx3-ubyte", self.fm / "t10k-labels-idx1-ubyte"
        os.truncate(images, 5000)
        self.assertFails(self.make_folder(), f"{images}: truncated: 5,000 bytes, expected 9,424 (the header says "
                                             "12 images)")
        write_fashion_mnist(self.fm)
        with open(labels, "ab") as f:
            f.write(b"\0")
        self.assertFails(self.make_folder(), f"{labels}: too large: 14 bytes, expected 13 (the header says 5 labels)")

    def test_header_and_label_checks(self):
        labels = self.fm / "train-labels-idx1-ubyte"
        data = bytearray(labels.read_bytes())
        data[8 + 3] = 10
        labels.write_bytes(bytes(data))
        self.assertFails(self.make_folder(), f"{labels}: label 10 at index 3, expected 0..9")
        labels.write_bytes(struct.pack(">II", 0x801, 11) + bytes(11))
        self.assertFails(self.make_folder(), f"{self.fm / 'train-images-idx3-ubyte'} holds 12 images but {labels} "
                                             "holds 11 labels")

    def test_cifar_file_lengths_and_labels(self):
        for size in (5000, 0):
            cifar = self.write_cifar(test_bytes=size)
            p = self.make_folder("--limit", "3", cifar=cifar)
            self.assertFails(p, f"{cifar / 'test_batch.bin'}: {size:,} bytes, expected a whole number of 3073-byte "
                                "records (a label byte and 3,072 pixel bytes each)", kept=["fashion-mnist-png"])
            self.assertEqual(len(self.pngs("fashion-mnist-png")), 3 + 3)  # the set before it is complete
            shutil.rmtree(cifar)
        p = self.make_folder("--limit", "3", cifar=self.write_cifar(label=10))
        self.assertFails(p, f"{cifar / 'data_batch_1.bin'}: record 0 has label 10, expected 0..9",
                         kept=["fashion-mnist-png"])

    def test_out_that_cannot_be_written(self):
        (self.tmp / "a-file").write_text("")
        self.out = self.tmp / "a-file" / "data"
        p = self.make_folder()
        self.assertFails(p, f"{self.out / 'fashion-mnist-png.tmp' / 'train' / '0_T-shirt_top'}: Not a directory")

    @unittest.skipIf(os.geteuid() == 0, "root writes into read-only directories")
    def test_read_only_out(self):
        self.out.mkdir(mode=0o555)
        self.assertFails(self.make_folder(), f"{self.out / 'fashion-mnist-png.tmp'}: Permission denied")

    def test_a_bad_test_file_is_found_before_any_png_is_written(self):
        """Every source file of both splits of a set is read and checked before its first PNG, so a
        bad test file no longer costs writing (then removing) the whole train split first."""
        make_folder = load_make_folder()
        written = []  # the channels of each PNG made

        def counted_png(width, height, channels, pixels, png_bytes=make_folder.png_bytes):
            written.append(channels)
            return png_bytes(width, height, channels, pixels)
        make_folder.png_bytes = counted_png

        def run(*args):
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                status = make_folder.main(["--out", str(self.out), "--fashion-mnist-dir", str(self.fm), *args])
            return status, err.getvalue()
        labels = self.fm / "t10k-labels-idx1-ubyte"
        os.truncate(labels, 12)
        self.assertEqual(run("--cifar-dir", str(self.tmp / "no-cifar")),
                         (1, f"data-folder: error: {labels}: truncated: 12 bytes, expected 13 (the header says 5 "
                             "labels)\n"))
        self.assertEqual(written, [])  # the old script wrote the 12 train PNGs first
        self.assertFalse(self.out.exists())
        write_fashion_mnist(self.fm)
        cifar = self.write_cifar(test_bytes=5000)
        self.assertEqual(run("--limit", "3", "--cifar-dir", str(cifar)),
                         (1, f"data-folder: error: {cifar / 'test_batch.bin'}: 5,000 bytes, expected a whole number "
                             "of 3073-byte records (a label byte and 3,072 pixel bytes each)\n"))
        self.assertEqual(written, [1] * 6)  # Fashion-MNIST's 3 + 3 grey PNGs, none of CIFAR-10's train split
        self.assertEqual(sorted(f.name for f in self.out.iterdir()), ["fashion-mnist-png"])

    def test_an_interrupt_is_one_line_and_exit_130(self):
        make_folder = load_make_folder()

        def interrupted(*args, **kwargs):
            raise KeyboardInterrupt
        make_folder.write_set = interrupted
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            status = make_folder.main(["--out", str(self.out), "--fashion-mnist-dir", str(self.fm),
                                       "--cifar-dir", str(self.tmp / "no-cifar")])
        self.assertEqual(status, 130)
        self.assertEqual(err.getvalue(), "data-folder: error: interrupted; no folder was left half-written\n")

    def test_an_interrupt_leaves_no_tmp(self):
        make_folder = load_make_folder()

        def images():
            yield 0, bytes(32 * 32)
            raise KeyboardInterrupt
        with self.assertRaises(KeyboardInterrupt):
            make_folder.write_set(self.out / "set", ["a"], 1, {"train": images(), "test": iter([])})
        self.assertEqual(list(self.out.iterdir()), [])


if __name__ == "__main__":
    unittest.main()
