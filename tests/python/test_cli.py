"""bin/train's command line as a user meets it: --help, usage errors (exit 2), and input errors
(exit 1), each reported as exactly one "error: ..." line on stderr, never a crash.

The runs that need no GPU hide it (CUDA_VISIBLE_DEVICES=""), so they behave the same on a machine
with one: the data and checkpoint errors must come out before the GPU is looked for, which is what
tells a user with a broken data set about the data set, not about the GPU.
"""

import os
import subprocess
import tempfile
import unittest
from pathlib import Path

from tests.python import REPO

TRAIN = REPO / "bin" / "train"
CIFAR_FILES = ["data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin",
               "data_batch_5.bin", "test_batch.bin"]
CIFAR_FILE_BYTES = 10000 * 3073

FLAGS = ["--data", "--data-dir", "--synthetic-size", "--image-size", "--skip-bad-images", "--cache-decoded",
         "--epochs", "--steps", "--batch", "--lr", "--min-lr", "--warmup-epochs", "--momentum", "--wd", "--no-nesterov",
         "--seed", "--no-eval", "--workers", "--workspace-mb", "--autotune-cache", "--no-tf32", "--deterministic",
         "--no-cuda-graph", "--loss-scale", "--loss-scale-window", "--warmup-steps", "--profile-steps", "--trace",
         "--progress-every", "--json", "--loss-log", "--sample-png", "--save", "--save-every", "--resume", "--gpus",
         "--bucket-mb", "--allreduce-dtype", "--dist-timeout", "--help"]

# What a crash or an unhandled exception would leave in the output.
CRASH_SIGNS = ["Traceback", "Segmentation fault", "core dumped", "Aborted", "terminate called",
               "what():", "AddressSanitizer", "double free"]


class CliAssertions:
    """What the command-line tests of every program check of a finished process."""

    def assert_no_crash(self, p, args):
        for sign in CRASH_SIGNS:
            self.assertNotIn(sign, p.stdout + p.stderr, f"crash-like output from {args}")
        self.assertGreaterEqual(p.returncode, 0, f"killed by signal {-p.returncode}: {args}")

    def assert_one_error_line(self, p, code, *parts):
        self.assertEqual(p.returncode, code, f"stderr: {p.stderr!r}")
        lines = p.stderr.splitlines()
        self.assertEqual(len(lines), 1, f"expected one line on stderr, got {lines!r}")
        self.assertTrue(lines[0].startswith("error: "), lines[0])
        for part in parts:
            self.assertIn(part, lines[0])
        return lines[0]


@unittest.skipUnless(TRAIN.exists(), f"{TRAIN} is not built (make bin/train)")
class TrainCli(CliAssertions, unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="test-cli-")
        self.dir = Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def run_train(self, *args, hide_gpu=True):
        env = dict(os.environ)
        if hide_gpu:
            env["CUDA_VISIBLE_DEVICES"] = ""
        # In a scratch directory, so nothing (an autotune cache, a checkpoint) lands in the repository.
        p = subprocess.run([str(TRAIN), *args], cwd=self.dir, env=env, capture_output=True, text=True,
                           timeout=300)
        self.assert_no_crash(p, args)
        self.assertFalse(any(self.dir.glob("core*")), "a core file was written")
        return p

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

    # ---- input errors --------------------------------------------------------------------------

    def test_no_gpu_exits_1_with_one_line(self):
        p = self.run_train("--data", "synthetic", "--synthetic-size", "256", "--batch", "32")
        self.assert_one_error_line(p, 1, "no CUDA device")

    def write_cifar(self, truncate=None):
        """Six CIFAR-10 batch files of zeros (label 0, black images: valid); `truncate` loses 1000 bytes."""
        data = self.dir / "cifar"
        data.mkdir()
        for name in CIFAR_FILES:
            with open(data / name, "wb") as f:
                f.truncate(CIFAR_FILE_BYTES - (1000 if name == truncate else 0))  # sparse, instant
        return data

    def test_truncated_cifar_file_is_reported_before_the_gpu(self):
        data = self.write_cifar(truncate="data_batch_3.bin")
        p = self.run_train("--data", "cifar10", "--data-dir", str(data))
        line = self.assert_one_error_line(p, 1, str(data / "data_batch_3.bin"), "truncated")
        self.assertNotIn("CUDA", line)

    def test_valid_cifar_gets_as_far_as_the_gpu(self):
        # The same set-up without the damage passes data validation: the error is the GPU's. This is
        # what makes the test above prove the order rather than a data error that always comes first.
        data = self.write_cifar()
        p = self.run_train("--data", "cifar10", "--data-dir", str(data), "--batch", "32")
        self.assert_one_error_line(p, 1, "no CUDA device")

    def test_missing_cifar_directory_exits_1(self):
        missing = self.dir / "no-such-dir"
        self.assert_one_error_line(self.run_train("--data", "cifar10", "--data-dir", str(missing)), 1, str(missing))

    # ---- image folders (--data folder) ---------------------------------------------------------

    def write_folder(self, truncate=None):
        """train/ and test/ with classes cat and dog, three fixture images each; `truncate` (a name under
        train/) loses its last 20 bytes."""
        fixtures = REPO / "tests" / "fixtures" / "images"
        root = self.dir / "images"
        for split in ("train", "test"):
            for cls in ("cat", "dog"):
                (root / split / cls).mkdir(parents=True)
                for name in ("rgb.png", "rgb.jpg", "grey.pgm"):
                    (root / split / cls / name).write_bytes((fixtures / name).read_bytes())
        if truncate:
            path = root / "train" / truncate
            path.write_bytes(path.read_bytes()[:-20])
        return root

    def test_folder_prints_its_data_line_and_classes_then_stops_at_the_gpu(self):
        root = self.write_folder()
        p = self.run_train("--data", "folder", "--data-dir", str(root), "--batch", "2", "--image-size", "64")
        self.assert_one_error_line(p, 1, "no CUDA device")
        self.assertIn(f"data: folder {root}: 6 train, 6 test images, 2 classes, 64x64, 3 channels", p.stdout)
        self.assertIn("classes: cat, dog", p.stdout)
        self.assertIn("normalisation: mean", p.stdout)
        p = self.run_train("--data", "folder", "--data-dir", str(root), "--batch", "2", "--cache-decoded")
        self.assert_one_error_line(p, 1, "no CUDA device")
        self.assertRegex(p.stdout, r"cache: decoded 12 images into .* with \d+ threads?: [\d,]+ images/s")

    def test_truncated_png_in_a_folder_is_one_line_naming_it_before_the_gpu(self):
        root = self.write_folder(truncate="dog/rgb.png")
        p = self.run_train("--data", "folder", "--data-dir", str(root), "--batch", "2")
        line = self.assert_one_error_line(p, 1, str(root / "train" / "dog" / "rgb.png"), "truncated")
        self.assertNotIn("CUDA", line)
        self.assertNotIn("data: folder", p.stdout)

    def test_skip_bad_images_warns_with_the_count_and_goes_on(self):
        root = self.write_folder(truncate="dog/rgb.png")
        p = self.run_train("--data", "folder", "--data-dir", str(root), "--batch", "2", "--skip-bad-images")
        self.assertEqual(p.returncode, 1, p.stderr)
        lines = p.stderr.splitlines()
        self.assertEqual(len(lines), 2, lines)
        self.assertTrue(lines[0].startswith("warning: --skip-bad-images: left out 1 bad image file ("), lines[0])
        self.assertIn(str(root / "train" / "dog" / "rgb.png"), lines[0])
        self.assertIn("no CUDA device", lines[1])
        self.assertIn("5 train, 6 test images", p.stdout)

    def test_folder_without_data_dir_exits_2(self):
        self.assert_one_error_line(self.run_train("--data", "folder"), 2, "--data-dir")

    def test_missing_folder_exits_1_naming_it(self):
        missing = self.dir / "no-such-folder"
        self.assert_one_error_line(self.run_train("--data", "folder", "--data-dir", str(missing)), 1, str(missing))

    def test_missing_resume_file_exits_1_naming_it(self):
        missing = self.dir / "missing.ckpt"
        p = self.run_train("--data", "synthetic", "--synthetic-size", "256", "--batch", "32", "--resume", str(missing))
        line = self.assert_one_error_line(p, 1, str(missing))
        self.assertNotIn("CUDA", line)

    def test_corrupt_resume_file_exits_1_naming_it(self):
        bad = self.dir / "bad.ckpt"
        bad.write_bytes(b"RN50CKPT" + b"\x01\x00\x00\x00" + b"\xff" * 10)
        p = self.run_train("--data", "synthetic", "--synthetic-size", "256", "--batch", "32", "--resume", str(bad))
        line = self.assert_one_error_line(p, 1, str(bad))
        self.assertNotIn("CUDA", line)


if __name__ == "__main__":
    unittest.main()
