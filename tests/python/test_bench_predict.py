"""bench/bench_predict.py (`make bench-predict`) and `bench/profile.py --program predict` as a user runs
them: without a GPU, one line and exit 2; with fake nvidia-smi, bin/train and bin/predict rungs
(these stand-ins print what the real ones print, with made-up numbers that only the wiring sees),
the checkpoint is made first, every rung gets the same command, and the table and files come out.
"""

import csv
import sys
import tempfile
import unittest
from pathlib import Path

from tests.python import FIXTURES
from tests.python.fakes import FakeMachine, _write_executable

RUNGS = {"predict-baseline": [], "predict-workers": ["workers"], "predict-pool": ["workers", "pool"],
         "predict-async": ["workers", "pool", "async"], "predict-stream": ["workers", "pool", "async", "stream"],
         "predict": ["workers", "pool", "async", "stream"]}

# bin/predict: needs its --checkpoint; prints the summary line of the real one (made-up speeds).
FAKE_PREDICT = r'''
import json, shutil, sys
from pathlib import Path
VARIANT, RUNGS, LOG, TRACE = {variant!r}, {rungs!r}, Path({log!r}), Path({trace!r})
args = sys.argv[1:]
with LOG.open("a") as log:
    log.write(" ".join([VARIANT] + args) + "\n")
if not Path(args[args.index("--checkpoint") + 1]).is_file():
    sys.exit("error: " + args[args.index("--checkpoint") + 1] + ": cannot open: No such file or directory")
if "--trace" in args:
    shutil.copy(TRACE, args[args.index("--trace") + 1])
print(json.dumps({{"event": "summary", "variant": VARIANT, "egress": RUNGS, "gpu": "NVIDIA H100 80GB HBM3",
                  "cudnn": 91400, "date": "2026-11-30", "images_per_s": 1000.0 * (1 + len(RUNGS)),
                  "data_stall_pct": 0.5, "egress_wait_s": 0.25 * len(RUNGS)}}))
'''

# bin/train as the bench uses it: writes the checkpoint it is asked for.
FAKE_TRAIN = r'''
import sys
from pathlib import Path
args = sys.argv[1:]
with Path({log!r}).open("a") as log:
    log.write(" ".join(["train"] + args) + "\n")
Path(args[args.index("--save") + 1]).write_bytes(b"RN50CKPT")
'''


def add_predict_machine(machine: FakeMachine, rungs=RUNGS) -> None:
    for name, on in rungs.items():
        _write_executable(machine.bin_dir / name, f"#!{sys.executable}\n" + FAKE_PREDICT.format(
            variant=name, rungs=on, log=str(machine.log), trace=str(FIXTURES / "bench" / "train-baseline.trace.json")))
    _write_executable(machine.bin_dir / "train", f"#!{sys.executable}\n" + FAKE_TRAIN.format(log=str(machine.log)))


class BenchPredict(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = Path(self._tmp.name)

    def tearDown(self):
        self._tmp.cleanup()

    def test_without_a_gpu_one_line(self):
        machine = FakeMachine(self.tmp, gpu=False)
        add_predict_machine(machine)
        result = machine.run_script("bench_predict.py", "--bin-dir", str(machine.bin_dir), "--out", str(self.tmp / "o"))
        self.assertEqual(result.returncode, 2)
        self.assertEqual(result.stderr.strip(), "bench-predict: no CUDA GPU on this machine; run it on the GPU machine")
        self.assertEqual(machine.calls(), [])

    def test_missing_rungs_name_make_predict_variants(self):
        machine = FakeMachine(self.tmp)
        add_predict_machine(machine, {"predict-baseline": []})
        result = machine.run_script("bench_predict.py", "--bin-dir", str(machine.bin_dir), "--out", str(self.tmp / "o"))
        self.assertEqual(result.returncode, 2)
        self.assertIn("predict-workers", result.stderr)
        self.assertIn("run `make predict-variants` first", result.stderr)

    def test_table_files_and_command_lines(self):
        machine = FakeMachine(self.tmp)
        add_predict_machine(machine)
        out = self.tmp / "out"
        result = machine.run_script("bench_predict.py", "--bin-dir", str(machine.bin_dir), "--out", str(out), "--runs", "2")
        self.assertEqual(result.returncode, 0, result.stderr)
        calls = machine.calls()
        self.assertTrue(calls[0].startswith("train "), "the checkpoint comes first")
        self.assertIn("--save", calls[0])
        predicted = calls[1:]
        self.assertEqual(len(predicted), 2 * len(RUNGS))
        for call in predicted:
            self.assertIn("--data synthetic --split train --synthetic-size 51200 --batch 256 --warmup-batches 10", call)
            self.assertIn("--features ", call)
            self.assertIn("--json", call)
        self.assertEqual(len({c.split(" ", 1)[1] for c in predicted}), 1, "every rung gets the same command")
        md = (out / "predict-nvidia-h100-80gb-hbm3-2026-11-30.md").read_text()
        self.assertIn("| 256 | predict-baseline | none | 1,000 (1,000–1,000) | 1.00x | 256.00 |", md)
        self.assertIn("| 256 | predict-stream | workers, pool, async, stream | 5,000 (5,000–5,000) | 5.00x |", md)
        with (out / "predict-nvidia-h100-80gb-hbm3-2026-11-30.csv").open() as f:
            rows = list(csv.DictReader(f))
        self.assertEqual([r["variant"] for r in rows], list(RUNGS))
        self.assertEqual(rows[2]["egress_wait_s"], "0.5")

    def test_profile_predict_uses_the_egress_ladder_and_its_window(self):
        machine = FakeMachine(self.tmp)  # no nsys: the built-in trace
        add_predict_machine(machine)
        result = machine.run_script("profile.py", "--program", "predict", "--variants", "baseline,stream",
                                    "--bin-dir", str(machine.bin_dir), "--out", str(self.tmp / "p"),
                                    "--results", str(self.tmp / "results"))
        self.assertEqual(result.returncode, 0, result.stderr)
        calls = machine.calls()
        self.assertTrue(calls[0].startswith("train "))
        self.assertEqual([c.split()[0] for c in calls[1:]], ["predict-baseline", "predict-stream"])
        for call in calls[1:]:
            self.assertIn("--split train --synthetic-size 6400 --batch 128 --warmup-batches 20 --features", call)
            self.assertIn("--trace ", call)
        self.assertTrue(any((self.tmp / "results").glob("predict-profiles-*.md")))


if __name__ == "__main__":
    unittest.main()
