"""bench/pytorch_train.py: bin/train's schedule, the idx reader's refusals, the flags, and (where PyTorch
is installed) a run on a tiny made-up data set whose lines bench/time_to_accuracy.py reads."""

import gzip
import importlib.util
import json
import math
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import pytorch_train as pt  # noqa: E402  (bench/ is on sys.path: tests/python/__init__.py)
import time_to_accuracy as tta  # noqa: E402

from tests.python import BENCH


def write_idx(path: Path, magic: int, shape: tuple, payload: bytes) -> None:
    header = magic.to_bytes(4, "big") + b"".join(s.to_bytes(4, "big") for s in shape)
    with gzip.open(path, "wb") as f:
        f.write(header + payload)


def tiny_fashion_mnist(folder: Path, train: int, test: int) -> None:
    """idx files in Fashion-MNIST's names: images whose brightness says the class."""
    for prefix, n in (("train", train), ("t10k", test)):
        labels = bytes(i % 10 for i in range(n))
        pixels = b"".join(bytes([25 * label]) * 784 for label in labels)
        write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", 0x803, (n, 28, 28), pixels)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", 0x801, (n,), labels)


class Schedule(unittest.TestCase):
    def test_the_same_warm_up_and_cosine_as_the_trainer(self):
        # src/train/schedule.cpp: peak * (step + 1) / warmup, then low + (peak - low) * (1 + cos) / 2.
        self.assertAlmostEqual(pt.lr_at(0, 0.02, 0.0, 100, 1000), 0.02 / 100)
        self.assertAlmostEqual(pt.lr_at(99, 0.02, 0.0, 100, 1000), 0.02)
        self.assertAlmostEqual(pt.lr_at(100, 0.02, 0.0, 100, 1000), 0.02)
        self.assertAlmostEqual(pt.lr_at(550, 0.02, 0.002, 100, 1000), 0.002 + 0.018 * 0.5)
        self.assertAlmostEqual(pt.lr_at(1000, 0.02, 0.002, 100, 1000), 0.002)
        self.assertAlmostEqual(pt.lr_at(5, 0.1, 0.0, 0, 10), 0.05 * (1 + math.cos(math.pi / 2)))


class IdxFiles(unittest.TestCase):
    def test_a_wrong_magic_or_size_names_the_file(self):
        with tempfile.TemporaryDirectory() as d:
            base = Path(d) / "train-labels-idx1-ubyte"
            write_idx(base.with_name(base.name + ".gz"), 0x803, (3,), b"\0\1\2")
            with self.assertRaisesRegex(ValueError, "train-labels-idx1-ubyte.gz: not an idx file of 1"):
                pt.read_idx(base, 0x801, 1)
            write_idx(base.with_name(base.name + ".gz"), 0x801, (4,), b"\0\1\2")
            with self.assertRaisesRegex(ValueError, "11 bytes, expected 12 for shape"):
                pt.read_idx(base, 0x801, 1)
            write_idx(base.with_name(base.name + ".gz"), 0x801, (3,), b"\0\1\2")
            self.assertEqual(pt.read_idx(base, 0x801, 1), (b"\0\1\2", [3]))

    def test_a_truncated_or_foreign_gz_names_the_file(self):
        with tempfile.TemporaryDirectory() as d:
            base = Path(d) / "t10k-images-idx3-ubyte"
            gz = base.with_name(base.name + ".gz")
            write_idx(gz, 0x803, (2, 28, 28), bytes(2 * 784))
            gz.write_bytes(gz.read_bytes()[:30])
            with self.assertRaisesRegex(ValueError, r"t10k-images-idx3-ubyte.gz: not a whole gzip file"):
                pt.read_idx(base, 0x803, 3)
            gz.write_bytes(b"plain text, not gzip")
            with self.assertRaisesRegex(ValueError, r"t10k-images-idx3-ubyte.gz: not a whole gzip file"):
                pt.read_idx(base, 0x803, 3)

    def test_a_missing_data_dir_says_what_to_install(self):
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaisesRegex(ValueError, "install the Debian package dataset-fashion-mnist"):
                pt.find_data_dir(d)


class Flags(unittest.TestCase):
    def run_flags(self, *flags):
        return subprocess.run([sys.executable, str(BENCH / "pytorch_train.py"), *flags],
                              capture_output=True, text=True, timeout=60)

    def test_bin_train_flags_it_does_not_have_and_unknown_rungs_are_refused(self):
        for flags, said in ((["--gpus", "2"], "unrecognized arguments: --gpus 2"),
                            (["--rung", "fastest"], "invalid choice: 'fastest'"),
                            (["--data", "cifar10"], "invalid choice: 'cifar10'"),
                            (["--epochs", "0"], "--epochs and --batch must be at least 1")):
            r = self.run_flags(*flags)
            self.assertEqual(r.returncode, 2, flags)
            self.assertIn(said, r.stderr)

    def test_time_to_accuracy_refuses_an_unknown_pytorch_rung_before_running_anything(self):
        r = subprocess.run([sys.executable, str(BENCH / "time_to_accuracy.py"), "--pytorch", "fastest"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--pytorch: unknown rung fastest", r.stderr)


@unittest.skipUnless(importlib.util.find_spec("torch"),
                     "PyTorch is not installed here: the run of bench/pytorch_train.py on tiny data needs it")
class TinyRun(unittest.TestCase):
    def test_epoch_lines_and_summary_as_bin_train_prints_them(self):
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
        with tempfile.TemporaryDirectory() as d:
            tiny_fashion_mnist(Path(d), 32, 20)
            r = subprocess.run([sys.executable, str(BENCH / "pytorch_train.py"), "--data-dir", d, "--epochs", "1",
                                "--batch", "16", "--rung", "devloss", "--device", device, "--json"],
                               capture_output=True, text=True, timeout=900)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = [json.loads(line) for line in r.stdout.splitlines()]
        self.assertEqual([j["event"] for j in lines], ["epoch", "summary"])
        epoch, summary = lines
        self.assertEqual((epoch["epoch"], epoch["step"], summary["steps"]), (1, 2, 2))
        self.assertTrue(0 <= epoch["test_acc"] <= 1 and math.isfinite(epoch["train_loss"]), epoch)
        self.assertEqual(summary["final_test_acc"], epoch["test_acc"])
        reached = tta.first_at_target([(1.0, line) for line in r.stdout.splitlines()], 0.0, 2.0)
        self.assertEqual((reached.epoch, reached.final_acc), (1, epoch["test_acc"]))


if __name__ == "__main__":
    unittest.main()
