"""bin/train's output paths (--save, --loss-log, --sample-png, --trace, --autotune-cache): checked at
start, before the data and the GPU, and the autotune cache of the program's repository or, outside
one, of the working directory."""

import re
import unittest

from tests.python import REPO
from tests.python.cli_harness import SYNTHETIC, TRAIN, TrainCliHarness, copy_program


@unittest.skipUnless(TRAIN.exists(), f"{TRAIN} is not built (make bin/train)")
class TrainCli(TrainCliHarness, unittest.TestCase):
    # ---- output paths: checked before the data is loaded and before the GPU -----------------------

    def test_save_into_a_missing_directory_is_refused_at_start(self):
        p = self.run_train("--save", "/no/such/dir/x.ckpt")
        line = self.assert_one_error_line(p, 1)
        self.assertEqual(line, "error: --save /no/such/dir/x.ckpt: the directory /no/such/dir does not exist")

    def test_output_paths_are_checked_before_the_data(self):
        # A broken data set would be reported first if the paths were checked after loading it.
        data = self.write_cifar(truncate="data_batch_1.bin")
        for flag in ("--save", "--loss-log", "--sample-png", "--trace", "--autotune-cache"):
            with self.subTest(flag=flag):
                bad = str(self.dir / "missing" / "out.file")
                p = self.run_train("--data", "cifar10", "--data-dir", str(data), flag, bad)
                self.assert_one_error_line(p, 1, f"{flag} {bad}: the directory {self.dir / 'missing'} does not exist")

    def test_two_flags_naming_one_file_are_a_usage_error_before_the_data(self):
        # bin/train writes its autotune cache (autotune-cache.txt of the repository unless
        # --autotune-cache says where).
        data = self.write_cifar(truncate="data_batch_1.bin")
        cache = REPO / "autotune-cache.txt"
        p = self.run_train("--data", "cifar10", "--data-dir", str(data), "--save", str(cache))
        self.assert_one_error_line(p, 2, f"--save and --autotune-cache name the same file, {cache}")
        p = self.run_train("--data", "cifar10", "--data-dir", str(data), "--resume", "r.ckpt", "--loss-log", "./r.ckpt")
        self.assert_one_error_line(p, 2, "--resume and --loss-log name the same file, ./r.ckpt")

    def test_an_unwritable_directory_or_a_directory_as_file_is_refused(self):
        # /proc takes no new files, whoever asks (root included).
        self.assert_one_error_line(self.run_train("--loss-log", "/proc/loss.txt"), 1,
                                   "--loss-log /proc/loss.txt: cannot create files in the directory /proc")
        self.assert_one_error_line(self.run_train("--save", str(self.dir)), 1, "--save", "is a directory")

    # ---- the autotune cache: the program's repository's, or a warning where it cannot be written -

    def test_from_another_directory_the_autotune_cache_is_the_programs_repositorys(self):
        repo = self.fake_repository()
        elsewhere = self.dir / "elsewhere"
        elsewhere.mkdir()
        help_text = self.run_train("--help", program=repo / "bin" / "train", cwd=elsewhere).stdout
        self.assertIn(f"[default: {repo}/autotune-cache.txt]", help_text)
        if not re.search(r"optimizations \[[^\]]*\bautotune\b", help_text):
            self.skipTest("bin/train is not an autotuning build: it writes no autotune cache")
        data = self.write_cifar(truncate="data_batch_1.bin")
        p = self.run_train("--data-dir", str(data), "--save", str(repo / "autotune-cache.txt"),
                           program=repo / "bin" / "train", cwd=elsewhere)
        self.assert_one_error_line(p, 2, f"--save and --autotune-cache name the same file, {repo}/autotune-cache.txt")

    def test_an_unwritable_default_autotune_cache_is_a_warning_not_an_error(self):
        # A program outside a repository keeps its cache in the working directory; /proc takes no
        # new files, whoever asks. A --autotune-cache the user names must still be writable (above).
        if not re.search(r"optimizations \[[^\]]*\bautotune\b", self.run_train("--help").stdout):
            self.skipTest("bin/train is not an autotuning build: it writes no autotune cache")
        alone = self.dir / "alone"
        alone.mkdir()
        copy_program(TRAIN, alone / "train")
        p = self.run_train(*SYNTHETIC, program=alone / "train", cwd="/proc")
        self.assertEqual(p.returncode, 1, p.stderr)
        lines = p.stderr.splitlines()
        self.assertEqual(len(lines), 2, lines)
        self.assertRegex(lines[0], r"^warning: --autotune-cache autotune-cache.txt: cannot create files in the "
                                   r"directory \.: .*; training without saving the measured algorithms ")
        self.assertIn("no CUDA device", lines[1])


if __name__ == "__main__":
    unittest.main()
