"""bin/train's --help, its usage errors (exit 2, reported before anything else is read) and a machine
without a GPU or an NVIDIA driver (exit 1), each as exactly one "error: ..." line on stderr."""

import ctypes
import os
import unittest

from tests.python.cli_harness import SYNTHETIC, TRAIN, TrainCliHarness

FLAGS = ["--data", "--data-dir", "--synthetic-size", "--image-size", "--skip-bad-images", "--cache-decoded",
         "--epochs", "--steps", "--batch", "--lr", "--min-lr", "--warmup-epochs", "--no-lr-scaling", "--warmup-cap",
         "--momentum", "--wd", "--no-nesterov", "--seed", "--no-eval", "--label-smoothing", "--ema", "--crop-pad", "--tta-flip",
         "--zero-init-residual", "--workers", "--workspace-mb", "--autotune-cache", "--no-tf32", "--deterministic",
         "--no-fuse", "--no-cuda-graph", "--loss-scale", "--loss-scale-window", "--warmup-steps", "--profile-steps", "--trace",
         "--progress-every", "--json", "--loss-log", "--sample-png", "--save", "--save-every", "--resume", "--gpus",
         "--bucket-mb", "--last-bucket-mb", "--allreduce-dtype", "--grad-compression", "--accumulate",
         "--dist-timeout", "--help"]


def nvidia_driver_installed():
    """What bin/train looks for: the kernel module's /proc entry, or a loadable libcuda."""
    if os.path.exists("/proc/driver/nvidia"):
        return True
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


@unittest.skipUnless(TRAIN.exists(), f"{TRAIN} is not built (make bin/train)")
class TrainCli(TrainCliHarness, unittest.TestCase):
    # ---- help and usage errors -----------------------------------------------------------------

    def test_help_lists_every_flag_and_the_builds_optimizations(self):
        p = self.run_train("--help", hide_gpu=False)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stderr, "")
        listed = {line.split()[0] for line in p.stdout.splitlines() if line.startswith("  --")}
        self.assertEqual(listed, set(FLAGS))
        self.assertRegex(p.stdout, r"this build: \S+: optimizations \[[a-z0-9 :-]+\] -> (fp32|fp16), (NCHW|NHWC)")

    def test_unknown_flag_exits_2(self):
        self.assert_one_error_line(self.run_train("--bach", "64"), 2, "--bach")

    def test_missing_value_exits_2(self):
        self.assert_one_error_line(self.run_train("--data", "synthetic", "--batch"), 2, "--batch")

    def test_out_of_range_value_exits_2(self):
        self.assert_one_error_line(self.run_train("--batch", "1"), 2, "--batch", "out of range")
        self.assert_one_error_line(self.run_train("--lr=-1"), 2, "--lr")

    def test_non_number_exits_2(self):
        self.assert_one_error_line(self.run_train("--epochs", "ten"), 2, "--epochs")

    def test_usage_error_wins_over_everything_else(self):
        # A bad flag is reported before any data is read or any GPU is looked for.
        self.assert_one_error_line(
            self.run_train("--data", "cifar10", "--data-dir", str(self.dir / "nowhere"), "--momentum", "2"),
            2, "--momentum")

    # ---- no GPU, no driver: exit 1 ---------------------------------------------------------------

    def test_no_gpu_exits_1_with_one_line(self):
        p = self.run_train("--data", "synthetic", "--synthetic-size", "256", "--batch", "32")
        self.assert_one_error_line(p, 1, "no CUDA device")

    @unittest.skipIf(nvidia_driver_installed(), "this machine has an NVIDIA driver")
    def test_no_driver_says_so_and_points_at_make_test(self):
        p = self.run_train(*SYNTHETIC, hide_gpu=False)
        line = self.assert_one_error_line(p, 1, "no CUDA device: no NVIDIA driver or GPU was found", "`make test`")
        self.assertNotIn("insufficient", line)

    # ---- flags -----------------------------------------------------------------------------------

    def test_an_empty_value_is_a_usage_error(self):
        for flag, value_name in (("--data-dir", "DIR"), ("--resume", "FILE"), ("--trace", "FILE")):
            with self.subTest(flag=flag):
                self.assert_one_error_line(self.run_train(flag, ""), 2,
                                           f"{flag} needs a value ({value_name}), not an empty string")

    def test_dash_h_is_help(self):
        self.assertEqual(self.run_train("-h").stdout, self.run_train("--help").stdout)
        self.assertEqual(self.run_train("-h").returncode, 0)

    def test_a_repeated_flag_is_a_usage_error(self):
        self.assert_one_error_line(self.run_train("--batch", "64", "--epochs", "2", "--batch", "32"), 2,
                                   "--batch is given twice")

    def test_a_flag_where_a_value_should_be_is_named(self):
        line = self.assert_one_error_line(self.run_train("--data-dir", "--epochs", "3"), 2)
        self.assertEqual(line, "error: --data-dir needs a value (DIR), not the flag --epochs")

    def test_a_twenty_digit_integer_is_out_of_range(self):
        self.assert_one_error_line(self.run_train("--seed", "12345678901234567890"), 2, "--seed", "out of range [0, ")


if __name__ == "__main__":
    unittest.main()
