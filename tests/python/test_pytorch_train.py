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


class Recipe(unittest.TestCase):
    """bin/train's rules, as the C++ tests state them (tests/train/test_lr_scaling.cpp, test_ema_gpu.cpp)."""

    def test_the_learning_rate_follows_the_global_batch_on_several_gpus_only(self):
        def rule(batch, world, scaling=True, cap=2.0, lr=(0.02, 0.0, 1.0)):
            return tuple(round(v, 12) for v in pt.scaled_schedule(*lr, world, scaling, cap))
        self.assertEqual(rule(128, 4), (0.08, 0.0, 2.0))            # lr: 0.08 for global batch 512, warm-up 2
        self.assertEqual(rule(128, 2), (0.04, 0.0, 2.0))
        self.assertEqual(rule(32, 2), (0.04, 0.0, 2.0))             # from one GPU's --batch, whatever it is
        self.assertEqual(rule(256, 2, lr=(0.08, 0.0, 1.0)), (0.16, 0.0, 2.0))  # lr: 0.16 for 512 (0.08 x 512/256)
        self.assertEqual(rule(128, 2, cap=1.5), (0.04, 0.0, 1.5))   # the warm-up in proportion up to the cap
        self.assertEqual(rule(128, 2, lr=(0.02, 0.0, 3.0)), (0.04, 0.0, 3.0))  # never below --warmup-epochs
        self.assertEqual(rule(128, 4, cap=3.0), (0.08, 0.0, 3.0))
        self.assertEqual(rule(64, 3, lr=(0.02, 0.002, 1.0)), (0.06, 0.006, 2.0))  # the whole schedule
        self.assertEqual(rule(512, 1), (0.02, 0.0, 1.0))            # one GPU: the flags as given
        self.assertEqual(rule(128, 4, scaling=False), (0.02, 0.0, 1.0))

    def test_the_weight_averages_decay_warms_up_as_tensorflows(self):
        self.assertAlmostEqual(pt.ema_decay_at(0.999, 0), 0.1)
        self.assertAlmostEqual(pt.ema_decay_at(0.999, 90), 0.91)
        self.assertEqual(pt.ema_decay_at(0.999, 100000), 0.999)
        self.assertEqual(pt.ema_decay_at(0.5, 8), 0.5)


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
                            (["--epochs", "0"], "--epochs and --batch must be at least 1"),
                            (["--ema", "1"], "--label-smoothing and --ema must be in [0, 1)"),
                            (["--label-smoothing", "-0.1"], "--label-smoothing and --ema must be in [0, 1)"),
                            (["--image-size", "29"], "--image-size 29: Fashion-MNIST's 28x28 images are centred"),
                            (["--image-size", "26"], "give 28 plus an even number, up to 64"),
                            (["--image-size", "66"], "give 28 plus an even number, up to 64")):
            r = self.run_flags(*flags)
            self.assertEqual(r.returncode, 2, flags)
            self.assertIn(said, r.stderr)

    def test_image_size_is_bin_trains_fashion_mnist_sides(self):
        self.assertEqual(pt.parse_args([]).image_size, 32)  # as bin/train: nothing changes unless asked
        for n in (28, 30, 32, 64):
            self.assertEqual(pt.parse_args(["--image-size", str(n)]).image_size, n)

    def test_zero_init_residual_is_off_unless_given_and_takes_no_value(self):
        self.assertFalse(pt.parse_args([]).zero_init_residual)
        self.assertTrue(pt.parse_args(["--zero-init-residual"]).zero_init_residual)
        r = self.run_flags("--zero-init-residual=1")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--zero-init-residual: ignored explicit argument '1'", r.stderr)

    def test_time_to_accuracy_refuses_an_unknown_pytorch_rung_before_running_anything(self):
        r = subprocess.run([sys.executable, str(BENCH / "time_to_accuracy.py"), "--pytorch", "fastest"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--pytorch: unknown rung fastest", r.stderr)


@unittest.skipUnless(importlib.util.find_spec("torch"),
                     "PyTorch is not installed here: the model of bench/lib/pytorch_resnet.py needs it")
class ZeroInitResidual(unittest.TestCase):
    def test_only_each_blocks_last_bn_scale_starts_at_zero(self):
        from lib.pytorch_resnet import ResNet50Cifar
        plain, zeroed = ResNet50Cifar(10), ResNet50Cifar(10, zero_init_residual=True)
        bn_scales = {n: p for n, p in zeroed.named_parameters() if n.endswith(".weight") and p.ndim == 1}
        last = {n for n in bn_scales if n.endswith(".bn3.weight")}
        self.assertEqual(len(bn_scales), 53)
        self.assertEqual(len(last), 16)
        for name, p in bn_scales.items():
            self.assertEqual(float(p.abs().max() if name in last else (p - 1).abs().max()), 0.0, name)
        self.assertTrue(all(float((p - 1).abs().max()) == 0.0
                            for n, p in plain.named_parameters() if n in bn_scales), "without the flag: every scale 1")


@unittest.skipUnless(importlib.util.find_spec("torch"),
                     "PyTorch is not installed here: the images are read into torch tensors")
class ImageSize(unittest.TestCase):
    """--image-size as bin/train serves Fashion-MNIST: the 28x28 images centred on the canvas, the statistics
    over what the model sees (border included), the crop padded by side / 8."""

    def test_the_images_statistics_and_crop_pad_follow_the_side(self):
        import torch
        from lib.pytorch_data import crop_pad
        with tempfile.TemporaryDirectory() as d:
            tiny_fashion_mnist(Path(d), 12, 4)
            x28, y28 = pt.load_split(Path(d), "train", 28)
            x32, y32 = pt.load_split(Path(d), "train", 32)
        self.assertEqual((tuple(x28.shape), tuple(x32.shape)), ((12, 3, 28, 28), (12, 3, 32, 32)))
        self.assertTrue(torch.equal(x32[:, :, 2:30, 2:30], x28) and torch.equal(y28, y32))
        self.assertEqual(int(x32.sum()), int(x28.sum()), "the border is zero")
        self.assertEqual((crop_pad(28), crop_pad(32), crop_pad(64)), (3, 4, 8))  # bin/train's crop_pad_for
        # bin/train's statistics at 32 (tests/data/test_data_readers.cpp): the same sums over (32/28)^2 the pixels.
        (m28, *_), (s28, *_) = pt.input_statistics(x28)
        (m32, *_), (s32, *_) = pt.input_statistics(x32)
        area = 28 * 28 / (32 * 32)
        self.assertAlmostEqual(m32, m28 * area, places=5)
        self.assertAlmostEqual(s32 ** 2 + m32 ** 2, (s28 ** 2 + m28 ** 2) * area, places=5)


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
        self.assertEqual([j["event"] for j in lines], ["first_step", "epoch", "summary"])
        epoch, summary = lines[1:]
        self.assertEqual((epoch["epoch"], epoch["step"], summary["steps"]), (1, 2, 2))
        self.assertTrue(0 <= epoch["test_acc"] <= 1 and math.isfinite(epoch["train_loss"]), epoch)
        self.assertEqual(summary["final_test_acc"], epoch["test_acc"])
        reached = tta.first_at_target([(1.0, line) for line in r.stdout.splitlines()], 0.0, 2.0)
        self.assertEqual((reached.epoch, reached.final_acc), (1, epoch["test_acc"]))

    def run_tiny(self, *flags, ranks=1):
        import torch
        device = "cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= ranks else "cpu"
        launch = [sys.executable] if ranks == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                      "--nproc-per-node", str(ranks)]
        with tempfile.TemporaryDirectory() as d:
            tiny_fashion_mnist(Path(d), 64, 20)
            r = subprocess.run([*launch, str(BENCH / "pytorch_train.py"), "--data-dir", d, "--epochs", "2",
                                "--batch", "8", "--rung", "devloss", "--device", device, "--json", *flags],
                               capture_output=True, text=True, timeout=900)
        self.assertEqual(r.returncode, 0, r.stderr)
        return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")], r.stdout

    def test_the_recipe_flags_train_and_evaluate(self):
        events, _ = self.run_tiny("--label-smoothing", "0.1", "--ema", "0.9", "--tta-flip", "--zero-init-residual")
        self.assertEqual([j["event"] for j in events], ["first_step", "epoch", "epoch", "summary"])
        self.assertTrue(all(0 <= j["test_acc"] <= 1 for j in events[1:3]), events)

    def test_image_size_28_trains_on_the_unpadded_images(self):
        events, _ = self.run_tiny("--image-size", "28")
        self.assertEqual([j["event"] for j in events], ["first_step", "epoch", "epoch", "summary"])
        self.assertTrue(all(0 <= j["test_acc"] <= 1 for j in events[1:3]), events)

    def test_two_ranks_under_torchrun_split_each_global_batch(self):
        # 64 images, 8 per rank: 4 steps an epoch; rank 0 alone prints; the rates scaled from 8 images to 16
        events, stdout = self.run_tiny(ranks=2)
        self.assertEqual([j["event"] for j in events], ["first_step", "epoch", "epoch", "summary"], stdout)
        self.assertEqual((events[1]["step"], events[-1]["gpus"], events[-1]["global_batch"]), (4, 2, 16))
        self.assertIn("lr: 0.04 for global batch 16 (0.02 x 16/8), warm-up 2 epochs", stdout)


if __name__ == "__main__":
    unittest.main()
