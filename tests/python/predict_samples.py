"""Files written by bin/predict's own writers, for the Python tests to read back: the GoogleTest
PredictSamples.FilesForThePythonReaders writes them into $PREDICT_SAMPLES_DIR (tests/predict/
test_samples.cpp), including sample.ckpt, a checkpoint of the real network whose every value is a
formula (sample_value below, the same as tests/support/sample_checkpoint.h). Made once per process
and shared by the test modules (the checkpoint is 188 MB)."""

from __future__ import annotations

import atexit
import os
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

from tests.python import REPO

UNIT_TESTS = REPO / "bin" / "unit_tests"
PREDICT = REPO / "bin" / "predict"
_made: Path | None = None


def f32(x: float) -> float:
    """x rounded to float32, as C++'s static_cast<float> rounds it."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def sample_value(tensor: int, e: int) -> float:
    return f32(((tensor * 7919 + e * 31) % 10007) / 10007.0 - 0.5)


def sample_running(i: int) -> float:
    return f32(0.25 + (i % 1009) / 1009.0)


def samples() -> Path:
    """The directory of sample files (raises unittest.SkipTest-worthy RuntimeError if they cannot be made)."""
    global _made
    if _made is None:
        d = Path(tempfile.mkdtemp(prefix="predict-samples-"))
        atexit.register(shutil.rmtree, d, True)
        env = dict(os.environ, PREDICT_SAMPLES_DIR=str(d))
        p = subprocess.run([str(UNIT_TESTS), "--gtest_filter=PredictSamples.*"], env=env, capture_output=True, text=True,
                           timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"bin/unit_tests --gtest_filter=PredictSamples.* failed:\n{p.stdout[-2000:]}")
        _made = d
    return _made
