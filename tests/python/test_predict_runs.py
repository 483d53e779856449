"""bin/predict end to end on the GPU (each test skips without one, saying why): a checkpoint from a
short bin/train run is predicted by every rung of the egress ladder that is built. Checked: the
accuracy equals the trainer's own test accuracy at that checkpoint (both --deterministic, so both
take the same conv algorithms and compute the same logits); every rung writes the same CSV and the
same .npy bytes, whatever its number of output workers (rows in image order); the features file
has one 2048-d row per image; float16 features are the float32 ones rounded; the PNG is written and
no temporary file is left.
"""

import json
import os
import shutil
import struct
import subprocess
import tempfile
import unittest
from pathlib import Path

from tests.python import REPO
from tests.python.test_predict_cli import RUNGS
from tests.python.test_predict_files import read_npy
from tests.python.test_training_runs import no_gpu_reason

TRAIN = REPO / "bin" / "train"
DATA = ["--data", "synthetic", "--synthetic-size", "640", "--batch", "32"]  # a test set of 128 images
TIMEOUT_S = 600


def summary(stdout):
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    found = [line for line in lines if line.get("event") == "summary"]
    return found[-1] if found else None


@unittest.skipUnless((REPO / "bin" / "predict").exists() and TRAIN.exists(), "bin/predict and bin/train are not built")
class PredictRuns(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        reason = no_gpu_reason()
        if reason:
            raise unittest.SkipTest(reason)
        cls.dir = Path(tempfile.mkdtemp(prefix="test-predict-runs-"))
        train = subprocess.run([str(TRAIN), *DATA, "--seed", "7", "--deterministic", "--epochs", "1", "--steps", "6",
                                "--save", "m.ckpt", "--json"], cwd=cls.dir, capture_output=True, text=True,
                               timeout=TIMEOUT_S)
        if train.returncode != 0:
            raise AssertionError(f"bin/train failed: {train.stderr[-2000:]}")
        cls.trainer_accuracy = summary(train.stdout)["final_test_acc"]
        cls.runs = {}
        for name in RUNGS:
            binary = REPO / "bin" / name
            if binary.exists():
                cls.runs[name] = cls.predict(binary, name, [])

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    @classmethod
    def predict(cls, binary, name, extra):
        out = cls.dir / name
        out.mkdir(exist_ok=True)
        p = subprocess.run([str(binary), "--checkpoint", str(cls.dir / "m.ckpt"), *DATA, "--deterministic", "--workers",
                            "4", "--features", "f.npy", "--out", "p.csv", "--json", *extra], cwd=out,
                           capture_output=True, text=True, timeout=TIMEOUT_S)
        return p, out

    def test_every_rung_runs_and_matches_the_trainers_accuracy(self):
        for name, (p, _) in self.runs.items():
            with self.subTest(name):
                self.assertEqual(p.returncode, 0, p.stderr[-2000:])
                s = summary(p.stdout)
                self.assertEqual(s["variant"], name)
                self.assertEqual(s["egress"], RUNGS[name])
                self.assertEqual(s["images"], 128)
                self.assertAlmostEqual(s["accuracy"], self.trainer_accuracy, places=6)
                self.assertGreater(s["images_per_s"], 0)

    def test_every_rung_writes_the_same_files(self):
        first = None
        for name, (p, out) in self.runs.items():
            with self.subTest(name):
                self.assertEqual(p.returncode, 0, p.stderr[-2000:])
                files = {f: (out / f).read_bytes() for f in ("p.csv", "f.npy")}
                self.assertTrue((out / "p.confusion.png").is_file())
                self.assertEqual([f.name for f in out.iterdir() if ".tmp" in f.name], [])
                rows = files["p.csv"].decode().splitlines()
                self.assertEqual(len(rows), 129)
                self.assertEqual([r.split(",")[0] for r in rows[1:]], [str(i) for i in range(128)])
                if first is None:
                    first = files
                else:
                    self.assertEqual(files, first, "rungs must differ in speed only")

    def test_features_file(self):
        p, out = self.runs["predict"]
        self.assertEqual(p.returncode, 0, p.stderr[-2000:])
        descr, shape, values = read_npy(out / "f.npy")
        self.assertEqual((descr, shape), ("<f4", (128, 2048)))
        self.assertTrue(all(v >= 0 for v in values), "averages of ReLU outputs")
        half, out16 = self.predict(REPO / "bin" / "predict", "predict-f16", ["--features-dtype", "float16"])
        self.assertEqual(half.returncode, 0, half.stderr[-2000:])
        descr16, shape16, values16 = read_npy(out16 / "f.npy")
        self.assertEqual((descr16, shape16), ("<f2", (128, 2048)))
        for a, b in zip(values[::97], values16[::97]):
            self.assertEqual(b, struct.unpack("<e", struct.pack("<e", a))[0])


if __name__ == "__main__":
    unittest.main()
