"""bench/folder_bench.py: its parsers and table rows on given text, and its decode part run for real
against bin/train on a small image folder made of the committed fixtures (no GPU needed for that
part; without a GPU the training part stops with one line).
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


# Stands in for bin/train --cache-decoded: logs its command line and prints a decode line; with
# BREAK_OUT set, first turns that path into a file, as if --out went away during the run.
FAKE_TRAIN = """#!/bin/sh
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
        (self.tmp / "images").mkdir()  # the fake bin/train reads nothing from it
        (self.bin / "train").write_text(FAKE_TRAIN)
        (self.bin / "train").chmod(0o755)

    def tearDown(self):
        self._tmp.cleanup()

    def run_bench(self, *extra, env=None):
        return subprocess.run([sys.executable, str(BENCH / "folder_bench.py"), "--data-dir", str(self.tmp / "images"),
                               "--bin-dir", str(self.bin), "--decode-only", *extra],
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

    def test_fake_train_makes_a_table(self):  # what the tests below change one thing of
        p = self.run_bench("--out", str(self.tmp / "out"))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(len(list((self.tmp / "out").glob("decode-*.md"))), 1)
        self.assertGreaterEqual(self.runs(), 1)

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


@unittest.skipUnless(TRAIN.exists(), f"{TRAIN} is not built (make bin/train)")
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

    def test_without_a_gpu_the_training_part_stops_with_one_line(self):
        p = self.run_bench()
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("| 1 | 12 |", p.stdout)  # the decode part ran
        # One line: from the GPU look-up where nvidia-smi is missing, or (where /usr/bin has it, as on
        # a GPU machine with CUDA_VISIBLE_DEVICES="") from the first training run, with its reason.
        lines = p.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, p.stderr)
        self.assertRegex(lines[0], rf"^bench-folder: {re.escape(runner.NO_GPU_LINE)}( \(error: no CUDA device.*\))?$")


if __name__ == "__main__":
    unittest.main()
