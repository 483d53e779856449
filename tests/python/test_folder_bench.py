"""bench/folder_bench.py: its parsers and table rows on given text, its checks of arguments and
binaries against stand-ins, and its decode part run for real against bin/decode_rate on a small image
folder made of the committed fixtures (no GPU needed for that part; without a GPU the training part,
bin/train's, stops with one line). bin/decode_rate's own command line too.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

from tests.python import BENCH, FIXTURES, REPO

import folder_bench  # noqa: E402  (bench/ is on sys.path: tests/python/__init__.py)
from lib import runner  # noqa: E402

TRAIN = REPO / "bin" / "train"
DECODE_RATE = REPO / "bin" / "decode_rate"


class Parsers(unittest.TestCase):
    def test_decode_line(self):
        line = ("cache: decoded 70,000 images into 68.4 MiB in 5.00 s with 2 threads: "
                "14,000 images/s (7,000 per thread)")
        rate = folder_bench.parse_decode_line("data: folder x: ...\n" + line + "\nnormalisation: ...")
        self.assertEqual(rate, folder_bench.DecodeRate(2, 70000, 5.0, 14000.0, 7000.0))
        self.assertIsNone(folder_bench.parse_decode_line("data: folder x: 1 train, 1 test images"))
        one = folder_bench.parse_decode_line(line.replace("2 threads", "1 thread"))
        self.assertEqual(one.threads, 1)

    def test_worker_counts(self):
        self.assertEqual(folder_bench.worker_counts("1,2,4,8,cores-1", 16), [1, 2, 4, 8, 15])
        self.assertEqual(folder_bench.worker_counts("1,2,4,8,cores-1", 2), [1, 2, 4, 8])
        self.assertEqual(folder_bench.worker_counts("cores, 3", 6), [6, 3])
        with self.assertRaises(ValueError):
            folder_bench.worker_counts("0", 4)

    def test_training_rows(self):
        ok = runner.RunOutput(0, 'start\n{"event": "summary", "images_per_s": 12345.6, "data_stall_pct": 37.25}\n', "")
        self.assertEqual(folder_bench.training_row("w 4", ok), "| w 4 | 12,346 | 37.2 | |")
        failed = runner.RunOutput(1, "", "error: cls/x.png: cannot decode the PNG (bad zlib header)\n")
        row = folder_bench.training_row("w 8", failed)
        self.assertIn("failed: error: cls/x.png: cannot decode", row)


# Stands in for bin/decode_rate: logs its command line and prints a decode line; with BREAK_OUT set,
# first turns that path into a file, as if --out went away during the run.
FAKE_DECODE_RATE = """#!/bin/sh
echo "$@" >> "$(dirname "$0")/calls.log"
if [ -n "${BREAK_OUT:-}" ]; then rm -rf "$BREAK_OUT" && touch "$BREAK_OUT"; fi
echo "cache: decoded 12 images into 0.0 MiB in 0.01 s with 1 thread: 1,200 images/s (1,200 per thread)"
"""


class ArgumentsAndOutput(unittest.TestCase):
    """--timeout and --out checked before any run, and a failed write: one line each, never a traceback."""

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = Path(self._tmp.name)
        self.bin = self.tmp / "bin"
        self.bin.mkdir()
        (self.tmp / "images").mkdir()  # the fake bin/decode_rate reads nothing from it
        (self.bin / "decode_rate").write_text(FAKE_DECODE_RATE)
        (self.bin / "decode_rate").chmod(0o755)

    def tearDown(self):
        self._tmp.cleanup()

    def run_bench(self, *extra, env=None, decode_only=True):
        return subprocess.run([sys.executable, str(BENCH / "folder_bench.py"), "--data-dir", str(self.tmp / "images"),
                               "--bin-dir", str(self.bin), *(["--decode-only"] if decode_only else []), *extra],
                              capture_output=True, text=True, env=dict(os.environ, **(env or {})), timeout=60)

    def runs(self) -> int:
        log = self.bin / "calls.log"
        return len(log.read_text().splitlines()) if log.exists() else 0

    def assertOneLine(self, p, code, pattern):
        self.assertEqual(p.returncode, code, p.stderr)
        self.assertNotIn("Traceback", p.stderr)
        lines = p.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, p.stderr)
        self.assertRegex(lines[0], pattern)

    def test_fake_decode_rate_makes_a_table(self):  # what the tests below change one thing of
        p = self.run_bench("--out", str(self.tmp / "out"))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(len(list((self.tmp / "out").glob("decode-*.md"))), 1)
        self.assertGreaterEqual(self.runs(), 1)
        # bin/decode_rate is asked for the folder and size at each thread count, one thread first
        calls = (self.bin / "calls.log").read_text().splitlines()
        self.assertEqual(calls[0], f"--data-dir {self.tmp / 'images'} --image-size 32 --workers 1")

    def test_decode_only_needs_no_bin_train(self):
        self.assertFalse((self.bin / "train").exists())
        p = self.run_bench("--out", str(self.tmp / "out"))
        self.assertEqual(p.returncode, 0, p.stderr)

    def test_a_missing_binary_stops_before_any_run(self):
        # without --decode-only both are needed, and bin/train is not there
        p = self.run_bench("--out", str(self.tmp / "out"), decode_only=False)
        self.assertOneLine(p, 2, rf"^bench-folder: {re.escape(str(self.bin / 'train'))} is not built: run `make` first$")
        (self.bin / "decode_rate").unlink()
        p = self.run_bench("--out", str(self.tmp / "out"))
        self.assertOneLine(p, 2, rf"^bench-folder: {re.escape(str(self.bin / 'decode_rate'))} is not built: "
                                 r"run `make bin/decode_rate` first$")
        self.assertEqual(p.stdout, "")
        self.assertFalse((self.tmp / "out").exists())
        self.assertEqual(self.runs(), 0)

    def test_bad_arguments_are_usage_errors_before_any_run(self):
        for extra, message in ((["--image-size", "12"], "--image-size must be a multiple of 8"),
                               (["--workers", "0"], "--workers: a worker count must be at least 1"),
                               (["--batch", "1"], "--batch"),
                               (["--data-dir", str(self.tmp / "missing")], "not a directory")):
            with self.subTest(extra=extra):
                p = self.run_bench("--out", str(self.tmp / "out"), *extra)
                self.assertEqual(p.returncode, 2, p.stderr)
                self.assertIn(message, p.stderr)
                self.assertNotIn("Traceback", p.stderr)
        self.assertEqual(self.runs(), 0)

    def test_non_positive_or_infinite_timeout_is_a_usage_error(self):
        for timeout in ("-1", "0", "nan", "inf"):
            p = self.run_bench("--timeout", timeout, "--out", str(self.tmp / "out"))
            self.assertEqual(p.returncode, 2, (timeout, p.stderr))
            self.assertIn(f"--timeout must be a positive number of seconds, not {timeout}", p.stderr)
            self.assertNotIn("Traceback", p.stderr)
        self.assertEqual(self.runs(), 0)

    def test_out_that_cannot_be_made_stops_before_any_run(self):
        (self.tmp / "a-file").write_text("")
        p = self.run_bench("--out", str(self.tmp / "a-file" / "results"))
        self.assertOneLine(p, 2, r"^bench-folder: --out .*/a-file/results: cannot create the directory: Not a directory$")
        self.assertEqual(p.stdout, "")
        self.assertEqual(self.runs(), 0)

    @unittest.skipIf(os.geteuid() == 0, "root writes into read-only directories")
    def test_read_only_out_stops_before_any_run(self):
        ro = self.tmp / "read-only"
        ro.mkdir(mode=0o555)
        for out, pattern in ((ro, r"the directory is not writable$"),
                             (ro / "results", r"cannot create the directory: Permission denied$")):
            p = self.run_bench("--out", str(out))
            self.assertOneLine(p, 2, rf"^bench-folder: --out {re.escape(str(out))}: {pattern}")
        self.assertEqual(self.runs(), 0)

    def test_a_failed_write_after_the_runs_is_one_line(self):
        out = self.tmp / "out"
        p = self.run_bench("--out", str(out), env={"BREAK_OUT": str(out)})
        self.assertIn("| 1 | 12 |", p.stdout)  # the table was printed
        self.assertOneLine(p, 1, rf"^bench-folder: cannot write {re.escape(str(out))}/decode-.*\.md: Not a directory$")


@unittest.skipUnless(DECODE_RATE.exists(), f"{DECODE_RATE} is not built (make bin/decode_rate)")
class DecodeRun(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = Path(self._tmp.name)
        for split in ("train", "test"):
            for cls in ("a", "b"):
                (self.tmp / "images" / split / cls).mkdir(parents=True)
                for name in ("rgb.png", "rgb.jpg", "palette.gif"):
                    shutil.copy(FIXTURES / "images" / name, self.tmp / "images" / split / cls / name)

    def tearDown(self):
        self._tmp.cleanup()

    def run_bench(self, *extra):
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PATH="/usr/bin:/bin")  # no nvidia-smi: no GPU
        return subprocess.run([sys.executable, str(BENCH / "folder_bench.py"), "--data-dir", str(self.tmp / "images"),
                               "--batch", "2", "--out", str(self.tmp / "out"), *extra],
                              capture_output=True, text=True, env=env, timeout=300)

    def test_decode_only_measures_one_thread_and_writes_the_table(self):
        p = self.run_bench("--decode-only")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertRegex(p.stdout, r"\| 1 \| 12 \| [\d.]+ \| [\d,]+ \| [\d,]+ \|")
        written = list((self.tmp / "out").glob("decode-*.md"))
        self.assertEqual(len(written), 1)
        self.assertIn("| threads | images |", written[0].read_text())

    def test_decode_only_reads_every_core_too(self):
        p = self.run_bench("--decode-only")
        self.assertEqual(p.returncode, 0, p.stderr)
        cores = os.cpu_count() or 1
        if cores > 1:
            self.assertRegex(p.stdout, rf"\| {cores} \| 12 \| ")

    @unittest.skipUnless(TRAIN.exists(), f"{TRAIN} is not built (make bin/train)")
    def test_without_a_gpu_the_training_part_stops_with_one_line(self):
        p = self.run_bench()
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("| 1 | 12 |", p.stdout)  # the decode part ran
        # One line: from the GPU look-up where nvidia-smi is missing, or (where /usr/bin has it, as on
        # a GPU machine with CUDA_VISIBLE_DEVICES="") from the first training run, with its reason.
        lines = p.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, p.stderr)
        self.assertRegex(lines[0], rf"^bench-folder: {re.escape(runner.NO_GPU_LINE)}( \(error: no CUDA device.*\))?$")


@unittest.skipUnless(DECODE_RATE.exists(), f"{DECODE_RATE} is not built (make bin/decode_rate)")
class DecodeRateProgram(unittest.TestCase):
    """bin/decode_rate: bin/train's reader of --cache-decoded on the CPU alone, its line as bin/train's;
    a bad command line is exit 2, a bad folder exit 1, each one line."""

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = Path(self._tmp.name)
        for split in ("train", "test"):
            (self.tmp / "images" / split / "a").mkdir(parents=True)
            shutil.copy(FIXTURES / "images" / "rgb.jpg", self.tmp / "images" / split / "a" / "x.jpg")

    def tearDown(self):
        self._tmp.cleanup()

    def run_program(self, *args):
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
        return subprocess.run([str(DECODE_RATE), *args], capture_output=True, text=True, env=env, timeout=60)

    def test_prints_the_line_bin_train_prints(self):
        p = self.run_program("--data-dir", str(self.tmp / "images"), "--workers", "2", "--image-size", "512")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("data: folder", p.stdout)
        rate = folder_bench.parse_decode_line(p.stdout)
        self.assertIsNotNone(rate, p.stdout)
        self.assertEqual((rate.threads, rate.images), (2, 2))
        self.assertIn("cache: decoded 2 images into 1.5 MiB", p.stdout)  # 2 x 512 x 512 x 3 bytes

    def test_help(self):
        p = self.run_program("--help")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertTrue(p.stdout.startswith("usage: decode_rate --data-dir DIR"), p.stdout)

    def test_a_bad_command_line_is_exit_2(self):
        for args, message in ((["--workers", "2"], "--data-dir DIR is required"),
                              (["--data-dir", "x", "--image-size", "12"], "--image-size 12 is not a multiple of 8"),
                              (["--data-dir", "x", "--workers", "0"], "--workers"),
                              (["--data-dir", "x", "--epochs", "1"], "unknown flag '--epochs'")):
            with self.subTest(args=args):
                p = self.run_program(*args)
                self.assertEqual(p.returncode, 2, p.stderr)
                self.assertEqual(p.stdout, "")
                self.assertRegex(p.stderr, rf"^error: [^\n]*{re.escape(message)}[^\n]*\n$")

    def test_a_bad_folder_is_exit_1_with_one_line(self):
        (self.tmp / "images" / "train" / "a" / "bad.png").write_bytes(b"not a png")
        p = self.run_program("--data-dir", str(self.tmp / "images"))
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertRegex(p.stderr, r"^error: .*bad\.png: .*\n$")
        p = self.run_program("--data-dir", str(self.tmp / "images"), "--skip-bad-images")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertRegex(p.stderr, r"^warning: --skip-bad-images: left out 1 bad image file")
        p = self.run_program("--data-dir", str(self.tmp / "missing"))
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertEqual(len(p.stderr.splitlines()), 1, p.stderr)


if __name__ == "__main__":
    unittest.main()
