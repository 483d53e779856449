"""What the command-line tests of bin/train share: how a run is started and what every finished run
is checked for (no crash, and an error as exactly one "error: ..." line on stderr).

The runs that need no GPU hide it (CUDA_VISIBLE_DEVICES=""), so they behave the same on a machine
with one: the data and checkpoint errors must come out before the GPU is looked for, which is what
tells a user with a broken data set about the data set, not about the GPU.
"""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.python import REPO

TRAIN = REPO / "bin" / "train"
CIFAR_FILES = ["data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin",
               "data_batch_5.bin", "test_batch.bin"]
CIFAR_FILE_BYTES = 10000 * 3073

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


SYNTHETIC = ["--data", "synthetic", "--synthetic-size", "256", "--batch", "32"]


class TrainCliHarness(CliAssertions):
    """A scratch directory per test and bin/train run in it; mixed into each module's TrainCli."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="test-cli-")
        self.dir = Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def run_train(self, *args, hide_gpu=True, timeout=300, program=TRAIN, cwd=None):
        env = dict(os.environ)
        if hide_gpu:
            env["CUDA_VISIBLE_DEVICES"] = ""
        # In a scratch directory, so nothing (an autotune cache, a checkpoint) lands in the repository.
        p = subprocess.run([str(program), *args], cwd=cwd or self.dir, env=env, capture_output=True, text=True,
                           timeout=timeout)
        self.assert_no_crash(p, args)
        self.assertFalse(any(self.dir.glob("core*")), "a core file was written")
        return p

    def fake_repository(self):
        """bin/train in a repository of its own (bin/, a Makefile), as in a clone elsewhere; its root."""
        repo = self.dir / "repo"
        (repo / "bin").mkdir(parents=True)
        (repo / "Makefile").write_text("")
        copy_program(TRAIN, repo / "bin" / "train")
        return repo

    def write_cifar(self, truncate=None, data=None):
        """Six CIFAR-10 batch files of zeros (label 0, black images: valid) in `data` (default: cifar/ of
        the scratch directory); `truncate` loses 1000 bytes."""
        data = data or self.dir / "cifar"
        data.mkdir(parents=True)
        for name in CIFAR_FILES:
            with open(data / name, "wb") as f:
                f.truncate(CIFAR_FILE_BYTES - (1000 if name == truncate else 0))  # sparse, instant
        return data


def copy_program(program, to):
    """A hard link where the file system allows one (instant), else a copy."""
    try:
        os.link(program, to)
    except OSError:
        shutil.copy2(program, to)

