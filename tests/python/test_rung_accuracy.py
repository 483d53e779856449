"""bench/rung_accuracy.py against a fake nvidia-smi (fakes.FakeMachine) and fake rung binaries.

A fake rung appends a JSON line to calls.log as it starts (its pid) and one as it ends: its name,
arguments, working directory, CUDA_VISIBLE_DEVICES, whether its autotune cache existed, and its start
and end times. A fill run (`--steps 1 --no-eval`) writes the cache and prints a summary without an
accuracy; FAKE_FILL_FAIL names a binary whose fill run fails, FAKE_NO_DEVICE makes it say there is
no CUDA device. A training run prints an epoch line per epoch and a summary whose final test
accuracy is 0.9375 + 0.001 * seed, less FAKE_DROP where FAKE_DROP_FOR names the binary (and
FAKE_DROP_SEED, where given, the seed). FAKE_FAIL ("train-graph:2") makes that binary's run of that
seed fail; FAKE_SLEEP makes every training run sleep; FAKE_STALL_AFTER=k makes it print its first k
epochs and then hang; FAKE_FIRST_EPOCH=k makes it start at epoch k, as a resumed run does."""

import signal

import json
import os
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path

import rung_accuracy  # noqa: E402  (bench/ is on sys.path: tests/python/__init__.py)

from tests.python import BENCH
from tests.python.fakes import FakeMachine, _write_executable, popen_interruptible

FAKE_RUNG = r'''
import json, os, sys, time
from pathlib import Path
name, args = Path(sys.argv[0]).name, sys.argv[1:]
fill, seed = "--steps" in args, int(args[args.index("--seed") + 1])
cache = Path(args[args.index("--autotune-cache") + 1])
start = time.time()
def log(**record):
    with open({log!r}, "a") as f:
        f.write(json.dumps(record) + "\n")
log(event="start", name=name, pid=os.getpid(), fill=fill)
if os.environ.get("FAKE_NO_DEVICE"):
    sys.exit("error: no CUDA device found: cudaGetDeviceCount returned 100")
if fill:
    if os.environ.get("FAKE_FILL_FAIL") == name:
        sys.exit("error: no Fashion-MNIST files found")
    cache.write_text("fake cache")
    log(event="end", name=name, args=args, fill=True, start=start, end=time.time())
    print(json.dumps({{"event": "summary", "final_test_acc": None}}))
    sys.exit(0)
time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
log(event="end", name=name, args=args, fill=False, cwd=os.getcwd(), cache_existed=cache.exists(),
    gpu=os.environ.get("CUDA_VISIBLE_DEVICES"), start=start, end=time.time())
if os.environ.get("FAKE_FAIL") == f"{{name}}:{{seed}}":
    print("warning: something odd first", file=sys.stderr)
    print("error: the fake run failed", file=sys.stderr)
    sys.exit(1)
epochs = int(args[args.index("--epochs") + 1])
dropped = os.environ.get("FAKE_DROP_FOR") == name and os.environ.get("FAKE_DROP_SEED", str(seed)) == str(seed)
final = 0.9375 + 0.001 * seed - (float(os.environ.get("FAKE_DROP", "0")) if dropped else 0)
print("train-x: optimizations [...]")
for e in range(int(os.environ.get("FAKE_FIRST_EPOCH", "1")), epochs + 1):
    if str(e - 1) == os.environ.get("FAKE_STALL_AFTER"):
        sys.stdout.flush()
        time.sleep(60)
    print(json.dumps({{"event": "epoch", "epoch": e, "test_acc": final - 0.01 * (epochs - e)}}))
print(json.dumps({{"event": "summary", "gpu": "NVIDIA H100 80GB HBM3", "cudnn": 91400, "final_test_acc": final}}))
'''


class RungAccuracyTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = Path(self._tmp.name)
        self.machine = FakeMachine(self.tmp)
        for rung in ("train-fp16", "train-graph", "train"):
            _write_executable(self.machine.bin_dir / rung,
                              f"#!{sys.executable} -S\n" + FAKE_RUNG.format(log=str(self.machine.log)))

    def tearDown(self):
        self._tmp.cleanup()

    def command(self, *args, **env):
        """bench/rung_accuracy.py's command and environment: the fake machine's tools alone on PATH,
        its bin/ as --bin-dir unless given, 2 epochs a run unless given."""
        environ = {k: v for k, v in os.environ.items() if k not in ("PATH", "PYTHONPATH", "CUDA_VISIBLE_DEVICES")}
        environ.update(PATH=str(self.machine.tools), **env)
        quick = ([] if "--epochs" in args else ["--epochs", "2"]) + (
            [] if "--bin-dir" in args else ["--bin-dir", str(self.machine.bin_dir)])
        return [sys.executable, str(BENCH / "rung_accuracy.py"), *quick, *args], environ

    def tool(self, *args, **env):
        cmd, environ = self.command(*args, **env)
        return subprocess.run(cmd, capture_output=True, text=True, env=environ, timeout=60, cwd=self.tmp)

    def calls(self, fill=False):
        """The ended runs, training runs (or fill runs), in the order they ended."""
        return [c for c in map(json.loads, self.machine.calls()) if c["event"] == "end" and c["fill"] == fill]

    def row(self, stdout, binary):
        rows = [line for line in stdout.splitlines() if line.startswith(f"| `{binary}` |")]
        self.assertGreaterEqual(len(rows), 1, stdout)
        return [cell.strip() for cell in rows[0].strip("|").split("|")]

    def assertUsageError(self, result, fragment):
        self.assertEqual(result.returncode, 2, result.stderr)
        lines = result.stderr.splitlines()
        self.assertEqual(len(lines), 1, result.stderr)
        self.assertTrue(lines[0].startswith("rung-accuracy: "), lines[0])
        self.assertIn(fragment, lines[0])
        self.assertEqual((result.stdout, self.machine.calls()), ("", []), "nothing may run")


class EveryRunAtTheFloor(RungAccuracyTest):
    def test_each_binary_and_seed_its_flags_directory_and_cache(self):
        out = self.tmp / "results" / "acc.md"
        result = self.tool("--variants", "fp16,graph", "--seeds", "1,2", "--out", str(out), "--", "--lr", "0.03")
        self.assertEqual(result.returncode, 0, result.stderr)
        calls = self.calls()
        self.assertEqual(sorted((c["name"], c["args"][c["args"].index("--seed") + 1]) for c in calls),
                         [("train-fp16", "1"), ("train-fp16", "2"), ("train-graph", "1"), ("train-graph", "2")])
        for c in calls:
            args = c["args"]
            self.assertEqual(args[:8], ["--data", "fashion-mnist", "--epochs", "2", "--batch", "128", "--lr", "0.03"])
            self.assertIn("--json", args)
            self.assertIsNone(c["gpu"], "one GPU: CUDA_VISIBLE_DEVICES left as it was")
        self.assertEqual({c["cwd"] for c in calls}, {str(self.tmp)}, "in the current directory")
        fills = self.calls(fill=True)
        self.assertEqual([c["name"] for c in fills], ["train-fp16", "train-graph"], "a fill run a binary, in order")
        for f in fills:
            self.assertEqual(f["args"][-10:-2], ["--lr", "0.03", "--steps", "1", "--no-eval", "--seed", "1", "--json"])
        self.assertLessEqual(max(f["end"] for f in fills), min(c["start"] for c in calls), "the fill runs first, alone")
        self.assertTrue(all(c["cache_existed"] for c in calls), "every training run finds its cache filled")
        caches = {c["name"]: {c2["args"][c2["args"].index("--autotune-cache") + 1] for c2 in calls if c2["name"] == c["name"]}
                  for c in calls}
        self.assertEqual([len(v) for v in caches.values()], [1, 1], "one cache a binary, for all its seeds")
        self.assertNotEqual(caches["train-fp16"], caches["train-graph"])
        for path in caches["train-fp16"] | caches["train-graph"]:
            self.assertFalse(Path(path).exists(), "the caches are removed at the end")
        self.assertEqual(self.row(result.stdout, "train-fp16"), ["`train-fp16`", "93.85%", "93.95%", "93.90%", "93.85%"])
        self.assertIn("Every run ended at 93.80% or more (4 runs).", result.stdout)
        self.assertIn("- command: `python3 bench/rung_accuracy.py --epochs 2 --bin-dir", result.stdout)
        self.assertIn("--epochs 2 --batch 128 --lr 0.03 --seed S --json", result.stdout)
        self.assertIn("1 at a time on one GPU, no two sharing a GPU", result.stdout)
        self.assertIn("GPU: NVIDIA H100 80GB HBM3; cuDNN 9.14.0", result.stdout)
        each = [line for line in result.stdout.splitlines() if line.startswith("| `train-graph` | 2 |")]
        self.assertEqual(len(each), 1, result.stdout)
        self.assertIn("| 93.95% | 2 (93.95%) |", each[0])
        self.assertTrue(each[0].endswith("| 93.0 94.0 |"), each[0])
        self.assertEqual(out.read_text(), result.stdout)
        self.assertIn("rung-accuracy: train-graph seed 2: 93.95%", result.stderr)

    def test_the_default_is_the_ladder_and_three_seeds(self):
        args = rung_accuracy.parse_args(["--bin-dir", str(self.machine.bin_dir)])
        self.assertEqual(args.binaries[0], "train-baseline")
        self.assertEqual(len(args.binaries), 10)
        self.assertEqual((args.seed_list, args.jobs, args.floor, args.epochs, args.batch), ([1, 2, 3], None, 93.8, 15, 128))

    def test_by_default_a_run_a_gpu(self):
        result = self.tool("--variants", "graph", "--seeds", "1,2,3,4", FAKE_SLEEP="0.5", CUDA_VISIBLE_DEVICES="3,5,6")
        self.assertEqual(result.returncode, 0, result.stderr)
        calls = sorted(self.calls(), key=lambda c: c["start"])
        self.assertLess(calls[2]["start"], min(c["end"] for c in calls[:2]), "three GPUs: the first three runs overlap")
        self.assertGreaterEqual(calls[3]["start"], min(c["end"] for c in calls[:3]), "never four at once")
        self.assertEqual(sorted(c["gpu"] for c in calls[:3]), ["3", "5", "6"])
        self.assertIn("3 at a time on GPUs 3, 5, 6, one a job slot, no two sharing a GPU", result.stdout)

    def test_more_jobs_than_gpus_go_round_robin(self):
        result = self.tool("--variants", "graph", "--seeds", "1,2,3", "--jobs", "3", CUDA_VISIBLE_DEVICES="0,1")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("3 at a time on GPUs 0, 1, round robin, so the seconds are not throughput figures", result.stdout)

    def test_a_resumed_run_names_its_epochs(self):
        result = self.tool("--variants", "graph", "--seeds", "1", FAKE_FIRST_EPOCH="2")
        self.assertEqual(result.returncode, 0, result.stderr)
        each = [line for line in result.stdout.splitlines() if line.startswith("| `train-graph` | 1 |")]
        self.assertTrue(each[0].startswith("| `train-graph` | 1 | 93.85% | 2 (93.85%) |"), each[0])

    def test_more_jobs_than_gpus_say_their_seconds_are_shared(self):
        result = self.tool("--variants", "graph", "--seeds", "1,2", "--jobs", "2", FAKE_SLEEP="0.5")
        self.assertEqual(result.returncode, 0, result.stderr)
        calls = sorted(self.calls(), key=lambda c: c["start"])
        self.assertLess(calls[1]["start"], calls[0]["end"], "--jobs 2 on one GPU: side by side")
        self.assertIn("2 at a time on one GPU, so the seconds are not throughput figures", result.stdout)

    def test_jobs_run_side_by_side_and_each_slot_on_its_gpu(self):
        result = self.tool("--variants", "fp16,graph", "--seeds", "1,2", "--jobs", "2", FAKE_SLEEP="0.5",
                           CUDA_VISIBLE_DEVICES="3,5")
        self.assertEqual(result.returncode, 0, result.stderr)
        calls = sorted(self.calls(), key=lambda c: c["start"])
        self.assertLess(calls[1]["start"], calls[0]["end"], "the first two runs overlap")
        self.assertEqual({calls[0]["gpu"], calls[1]["gpu"]}, {"3", "5"}, "the two slots on their GPUs")
        self.assertTrue(all(c["gpu"] in ("3", "5") for c in calls))
        self.assertIn("2 at a time on GPUs 3, 5, one a job slot", result.stdout)
        each = [line for line in result.stdout.splitlines() if line.startswith("| `train-fp16` | 1 |")]
        self.assertRegex(each[0], r"^\| `train-fp16` \| 1 \| [35] \| 93.85% \|", "the run's GPU")

    def test_a_relative_bin_dir_and_a_run_exactly_at_the_floor(self):
        result = self.tool("--bin-dir", "bin", "--variants", "graph", "--seeds", "1,2", FAKE_DROP="0.0005",
                           FAKE_DROP_FOR="train-graph", FAKE_DROP_SEED="1")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(self.row(result.stdout, "train-graph")[1], "93.80%")
        self.assertIn("Every run ended at 93.80% or more (2 runs).", result.stdout)
        self.assertIn("1 at a time", self.tool("--variants", "graph", "--seeds", "1", "--jobs", "8").stdout)


class BelowOrFailed(RungAccuracyTest):
    def test_a_run_below_the_floor_is_named_and_the_exit_status_is_1(self):
        out = self.tmp / "acc.md"
        result = self.tool("--variants", "fp16,graph", "--seeds", "1,2", "--out", str(out),
                           FAKE_DROP="0.001", FAKE_DROP_FOR="train-graph")  # seed 1: 93.75%, seed 2: 93.85%
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn("3 of 4 runs ended at 93.80% or more. Below it: `train-graph` seed 1 (93.75%).", result.stdout)
        self.assertEqual(self.row(result.stdout, "train-graph")[-1], "93.75%", "the lowest")
        self.assertTrue(out.is_file(), "the report is written all the same")

    def test_a_failed_run_is_a_cell_and_a_reason(self):
        result = self.tool("--variants", "graph", "--seeds", "1,2", FAKE_FAIL="train-graph:2")
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertEqual(self.row(result.stdout, "train-graph"), ["`train-graph`", "93.85%", "failed", "93.85% (1 of 2)", "93.85% (1 of 2)"])
        self.assertIn("Failed: `train-graph` seed 2: error: the fake run failed.", result.stdout)
        self.assertIn("## Failed runs\n\n`train-graph` seed 2, the last 2 lines it printed on stderr:\n\n```\n"
                      "warning: something odd first\nerror: the fake run failed\n```\n", result.stdout)

    def test_a_fill_run_that_fails_fails_its_binary_alone(self):
        result = self.tool("--variants", "fp16,graph", "--seeds", "1,2", FAKE_FILL_FAIL="train-graph")
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertEqual(self.row(result.stdout, "train-graph"), ["`train-graph`", "failed", "failed", "—", "—"])
        self.assertEqual(self.row(result.stdout, "train-fp16")[1:3], ["93.85%", "93.95%"])
        self.assertIn("Failed: `train-graph` seed 1: its fill run failed: error: no Fashion-MNIST files found;", result.stdout)
        self.assertEqual({c["name"] for c in self.calls()}, {"train-fp16"}, "the failed binary trains no seed")

    def test_no_cuda_device_at_the_first_fill_run_is_exit_2(self):
        result = self.tool("--variants", "fp16,graph", FAKE_NO_DEVICE="1")
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertEqual(result.stderr.splitlines()[-1],
                         "rung-accuracy: no CUDA GPU on this machine; run it on the GPU machine "
                         "(error: no CUDA device found: cudaGetDeviceCount returned 100)")
        self.assertEqual(len(self.machine.calls()), 1, "nothing runs after it")

    def test_ctrl_c_stops_every_run_and_exits_130(self):
        cmd, environ = self.command("--variants", "fp16,graph", "--seeds", "1", "--jobs", "2", FAKE_SLEEP="60")
        tool = popen_interruptible(cmd, env=environ, cwd=self.tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            for _ in range(200):  # both training runs started
                started = [json.loads(line) for line in self.machine.calls()]
                pids = [c["pid"] for c in started if c["event"] == "start" and not c["fill"]]
                if len(pids) == 2:
                    break
                time.sleep(0.05)
            self.assertEqual(len(pids), 2, self.machine.calls())
            tool.send_signal(signal.SIGINT)
            _, err = tool.communicate(timeout=30)
        finally:
            tool.kill()
        self.assertEqual(tool.returncode, 130, err)
        self.assertEqual(err.splitlines()[-1], "rung-accuracy: interrupted")
        for pid in pids:
            self.assertFalse(alive(pid), f"run {pid} still going")

    def test_every_run_failed_is_still_reported(self):
        out = self.tmp / "acc.md"
        result = self.tool("--variants", "graph", "--seeds", "2", "--out", str(out), FAKE_FAIL="train-graph:2")
        self.assertEqual(result.returncode, 1)
        self.assertEqual(self.row(result.stdout, "train-graph"), ["`train-graph`", "failed", "—", "—"])
        self.assertIn("0 of 1 runs ended at 93.80% or more. Failed: `train-graph` seed 2: error: the fake run failed.",
                      result.stdout)
        self.assertEqual(out.read_text(), result.stdout)

    def test_every_fill_run_failed_is_reported_with_no_training_run(self):
        result = self.tool("--variants", "graph", "--seeds", "1,2", FAKE_FILL_FAIL="train-graph")
        self.assertEqual(result.returncode, 1)
        self.assertIn("no training run started (every fill run failed)", result.stdout)
        self.assertNotIn("at a time", result.stdout)
        self.assertEqual(self.calls(), [], "nothing trained")

    def test_a_run_past_its_timeout_is_stopped_and_reported(self):
        result = self.tool("--variants", "graph", "--seeds", "1", "--timeout", "0.5", FAKE_SLEEP="30")
        self.assertEqual(result.returncode, 1)
        self.assertIn("Failed: `train-graph` seed 1: timed out after 0.5 s.", result.stdout)

    def test_a_run_stopped_partway_says_how_far_it_got(self):
        result = self.tool("--variants", "graph", "--seeds", "1", "--timeout", "1.5", FAKE_STALL_AFTER="1")
        self.assertEqual(result.returncode, 1)
        self.assertIn("Failed: `train-graph` seed 1: timed out after 1.5 s, after epoch 1 of 2 (test 92.85%).",
                      result.stdout)
        self.assertIn("rung-accuracy: train-graph seed 1: timed out after 1.5 s, after epoch 1 of 2 (test 92.85%)",
                      result.stderr)
        each = [line for line in result.stdout.splitlines() if line.startswith("| `train-graph` | 1 |")]
        self.assertTrue(each[0].startswith("| `train-graph` | 1 | failed | 1 (92.85%) |"), each[0])
        self.assertTrue(each[0].endswith("| 92.8 |"), each[0])


class Usage(RungAccuracyTest):
    def test_usage_errors_run_nothing(self):
        for args, fragment in [
            (["--", "--seed", "4"], "--seed after -- is set by the tool"),
            (["--", "--autotune-cache=x.txt"], "--autotune-cache after -- is set by the tool"),
            (["--seeds", "1,,2"], "--seeds"),
            (["--seeds", "1,1"], "--seeds"),
            (["--seeds=-1,2"], "each seed must be at least 0"),
            (["--", "--steps", "5"], "--steps after -- is set by the tool"),
            (["--jobs", "0"], "--jobs must be at least 1"),
            (["--variants", "fastest"], "no binary 'train-fastest'"),
            (["--floor", "0"], "--floor is a percentage"),
            (["--timeout", "nan"], "--timeout must be a positive number"),
            (["--out", "."], "is a directory"),
        ]:
            with self.subTest(args=args):
                self.assertUsageError(self.tool(*args), fragment)

    def test_no_gpu_and_a_binary_not_built(self):
        (self.machine.tools / "nvidia-smi").unlink()
        result = self.tool("--variants", "graph")
        self.assertEqual((result.returncode, result.stderr.strip()),
                         (2, "rung-accuracy: no CUDA GPU on this machine; run it on the GPU machine"))
        _write_executable(self.machine.tools / "nvidia-smi", "#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-1)'\n")
        result = self.tool("--variants", "nhwc")
        self.assertEqual(result.returncode, 2)
        self.assertIn("train-nhwc not built: run `make variants`", result.stderr)


def alive(pid):
    """Whether a process runs (a zombie, ended but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


class VisibleGpus(unittest.TestCase):
    def test_one_gpu_each_slot_where_several_are_visible(self):
        saved = os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        try:
            self.assertEqual(rung_accuracy.visible_gpus(1), [None])
            self.assertEqual(rung_accuracy.visible_gpus(4), ["0", "1", "2", "3"])
            os.environ["CUDA_VISIBLE_DEVICES"] = "2, 7"
            self.assertEqual(rung_accuracy.visible_gpus(8), ["2", "7"])
            os.environ["CUDA_VISIBLE_DEVICES"] = "6"
            self.assertEqual(rung_accuracy.visible_gpus(8), [None])
            os.environ["CUDA_VISIBLE_DEVICES"] = ""
            self.assertEqual(rung_accuracy.visible_gpus(8), [None], "none visible: left as it is")
        finally:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            if saved is not None:
                os.environ["CUDA_VISIBLE_DEVICES"] = saved


if __name__ == "__main__":
    unittest.main()
