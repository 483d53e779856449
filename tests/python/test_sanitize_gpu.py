"""tests/sanitize_gpu.sh (`make sanitize-gpu`) against a fake compute-sanitizer and fake binaries.

The fake sanitizer records its command line, runs the program, and prints the summary line the real
one prints; a mode file tells it to report an error, or to miss the planted race of the probe (a
kernel filter that selects nothing). nvidia-smi is faked too, so these run the same with or without
a GPU. The script runs its checks side by side: the fake appends to calls.log (and finished.log) one
short line per write, and a delays file makes it sleep, so that the checks finish out of order.
"""

import json
import os
import re
import stat
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path

from tests.python import REPO

SCRIPT = REPO / "tests" / "sanitize_gpu.sh"

# Report lines as compute-sanitizer 2025.3.1 printed them on the H100 (2026-11-23).
FAKE_SANITIZER = r'''
import json, os, subprocess, sys, time
from pathlib import Path
ROOT = Path({root!r})
args = sys.argv[1:]
shard = ""
if "GTEST_SHARD_INDEX" in os.environ or "GTEST_TOTAL_SHARDS" in os.environ:
    shard = " [shard %s/%s]" % (os.environ.get("GTEST_SHARD_INDEX"), os.environ.get("GTEST_TOTAL_SHARDS"))
with (ROOT / "calls.log").open("a") as log:  # the checks run side by side: one short write each
    log.write(" ".join(args) + shard + "\n")
mode = (ROOT / "mode").read_text().strip() if (ROOT / "mode").exists() else "clean"
tool = args[args.index("--tool") + 1]
error_exit = int(args[args.index("--error-exitcode") + 1])
i = 0  # every option the script passes takes a value; the program comes after them
while args[i].startswith("--"):
    i += 2
program = args[i:]
print("========= COMPUTE-SANITIZER")
name = Path(program[0]).name
key = f"{{tool}} {{name}}{{shard}}"  # e.g. "memcheck train", "memcheck unit_tests [shard 0/4]"
if (ROOT / "delays").exists():  # seconds to sleep, by key, so that the checks finish in another order
    time.sleep(json.loads((ROOT / "delays").read_text()).get(key, 0))
    with (ROOT / "finished.log").open("a") as log:
        log.write(key + "\n")
if tool == "racecheck" and mode == "hardware-exception":
    # what a tensor-core cuDNN kernel did under racecheck, whatever the kernel filter selected
    print("========= Internal Sanitizer Error: The Sanitizer failed to handle a hardware exception.")
    print("error: cuDNN error CUDNN_STATUS_EXECUTION_FAILED in cudnnBackendExecute at src/conv_graph.cpp:25: true")
    print("========= Target application returned an error")
    print("========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)")
    sys.exit(error_exit)
rc = subprocess.run(program).returncode
if tool == "racecheck":
    if name == "racecheck_probe" and mode != "blind":
        if "--racecheck-report all" in " ".join(args):
            print("========= Error: Potential WAW hazard detected at __shared__ 0x480 in block (0,0,0) :")
            print("=========     Write Thread (32,0,0) at trainer_kernels::<unnamed>::planted_race(int *)+0xa0 in racecheck_probe.cu:12")
            print("=========     Write Thread (224,0,0) at trainer_kernels::<unnamed>::planted_race(int *)+0xa0 in racecheck_probe.cu:12")
            print("========= RACECHECK SUMMARY: 100 hazards displayed (556 errors, 124 warnings)")
        else:  # the default report, --racecheck-report analysis: no per-hazard lines
            print("========= Error: Race reported between Write access at trainer_kernels::<unnamed>::planted_race(int *)+0xa0 in racecheck_probe.cu:12")
            print("=========     and Read access at trainer_kernels::<unnamed>::planted_race(int *)+0xb0 in racecheck_probe.cu:13 [768 hazards]")
            print("========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)")
        sys.exit(error_exit)
    print("========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)")
elif mode == "memcheck-error" and tool == "memcheck" and name == "train-baseline":
    print("========= Invalid __global__ read of size 4 bytes")
    print("========= ERROR SUMMARY: 1 error")
    sys.exit(error_exit)
else:
    print("========= ERROR SUMMARY: 0 errors")
sys.exit(rc)
'''


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


class SanitizeGpuScript(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.root = Path(self._tmp.name)
        self.tools, self.bin = self.root / "tools", self.root / "bin"
        self.tools.mkdir()
        self.bin.mkdir()
        _executable(self.tools / "nvidia-smi", "#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-fake)'\n")
        _executable(self.tools / "compute-sanitizer", f"#!{sys.executable}\n" + FAKE_SANITIZER.format(root=str(self.root)))
        for b in ("train", "train-baseline", "train-fp32-nhwc", "unit_tests", "racecheck_probe"):
            _executable(self.bin / b, "#!/bin/sh\nexit 0\n")

    def tearDown(self):
        self._tmp.cleanup()

    def run_script(self, mode: str = "clean") -> subprocess.CompletedProcess:
        """Runs the script; mode tells the fake sanitizer what to report (see FAKE_SANITIZER)."""
        (self.root / "mode").write_text(mode)
        env = dict(os.environ, PATH=f"{self.tools}:/usr/bin:/bin", BIN_DIR=str(self.bin),
                   SANITIZE_GPU_LOGS=str(self.root / "logs"))
        return subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=120)

    def calls(self) -> list[str]:
        log = self.root / "calls.log"
        return log.read_text().splitlines() if log.exists() else []

    def racecheck_filter(self) -> tuple[list[str], list[str]]:
        """The unit-test racecheck's gtest filter, split: the patterns it runs and the tests left out."""
        [call] = [c for c in self.calls() if "--tool racecheck" in c and "unit_tests" in c]
        included, excluded = call.split("--gtest_filter=")[1].split()[0].split("-")
        return included.split(":"), excluded.split(":")

    def test_all_clean_passes_and_racecheck_checks_only_our_kernels(self):
        result = self.run_script()
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertEqual(result.stdout.strip().splitlines()[-1], "sanitize-gpu: passed, no reports")
        self.assertEqual(result.stdout.count(" ok "), 12, result.stdout)  # the probe, 7 checks, 4 shards
        calls = self.calls()
        self.assertEqual(len(calls), 12)
        for call in calls:
            filtered = "--kernel-name kns=trainer_kernels" in call
            self.assertEqual(filtered, "--tool racecheck" in call, call)
        self.assertTrue(any("unit_tests --gtest_filter=*GpuBatchNorm*:" in c for c in calls), calls)
        # our convs' unit tests are racechecked too, all but those whose shapes give a ping-pong CTA's
        # warpgroups unequal numbers of tiles (racecheck's false positives), which are memchecked
        included, excluded = self.racecheck_filter()
        for family in ("Conv1x1Stats*", "Conv1x1Dgrad*", "Conv3x3*"):
            self.assertIn(family, included)
        self.assertIn("Conv1x1Stats.FinalizedInTheKernelAsTheFinalizeKernelDoes", excluded)
        self.assertFalse([name for name in excluded if "TwoTilesEveryCta" in name], excluded)
        # the fused patterns (off under --deterministic) are memchecked through their unit tests, as 4
        # gtest shards of the same filter; nothing else runs sharded
        fused = [c for c in calls if "--tool memcheck" in c and "unit_tests" in c]
        self.assertEqual(len(fused), 4, calls)
        self.assertEqual(len({c.split(" [shard")[0] for c in fused}), 1, fused)
        for call in fused:
            self.assertIn("Shapes/FusedGpu*", call)
            self.assertIn("Shapes/GemmGpu*", call)
            self.assertIn("PredictGpu.BatchNormInTheConvEpiloguesGivesTheUnfusedLogits", call)
            self.assertIn("PredictGpu.GemmConvsWithTheBnFoldedInGiveTheUnfusedLogits", call)  # cuBLASLt's 1x1 convs
            self.assertIn("Conv1x1Dgrad*", call)  # our 1x1 convs' data gradients with BN sums
        self.assertEqual(sorted(c.split(" [shard ")[1] for c in fused), ["0/4]", "1/4]", "2/4]", "3/4]"])
        self.assertEqual(sum("[shard" in c for c in calls), 4, calls)
        for k in range(1, 5):
            self.assertTrue((self.root / "logs" / f"memcheck-fused-unit-tests-{k}of4.log").is_file())
        # the training runs under racecheck are the fp32 builds with --no-tf32 (no tensor-core kernels);
        # they start side by side, so calls.log has them in either order
        race_runs = [c for c in calls if "--tool racecheck" in c and "--data synthetic" in c]
        self.assertEqual(sorted(Path(c.split(" --data")[0].split()[-1]).name for c in race_runs),
                         ["train-baseline", "train-fp32-nhwc"])
        for call in race_runs:
            self.assertTrue(call.endswith("--deterministic --no-tf32"), call)
        self.assertTrue((self.root / "logs" / "racecheck-train-fp32-nhwc.log").is_file())

    def test_every_conv_test_left_out_of_racecheck_exists_and_has_a_two_tile_shape_beside_it(self):
        # a renamed or deleted test would leave a dead name here; each family left out keeps a test of
        # two tiles a CTA that racecheck runs
        self.run_script()
        excluded = self.racecheck_filter()[1]
        sources = "".join(p.read_text() for p in (REPO / "tests" / "kernels").glob("test_conv*_gpu.cpp"))
        self.assertGreaterEqual(len(excluded), 1)
        for name in excluded:
            suite, test = name.split(".")
            self.assertTrue(f"TEST({suite}, {test})" in sources, f"{name}: no such test")
            self.assertTrue(re.search(rf"TEST\({suite}, \w*TwoTilesEveryCta\w*\)", sources), f"{suite}: no two-tile test")

    def test_results_are_printed_in_the_order_listed_whatever_order_the_checks_finish_in(self):
        # the earlier a check is listed, the longer the fake sleeps: they finish in reverse order
        keys = ["memcheck train", "synccheck train", "memcheck train-baseline", "synccheck train-baseline",
                "racecheck train-baseline", "racecheck train-fp32-nhwc", "racecheck unit_tests"]
        keys += [f"memcheck unit_tests [shard {k}/4]" for k in range(4)]
        (self.root / "delays").write_text(json.dumps({key: 0.15 * (len(keys) - n) for n, key in enumerate(keys)}))
        start = time.monotonic()
        result = self.run_script()
        elapsed = time.monotonic() - start
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        finished = (self.root / "finished.log").read_text().splitlines()
        self.assertEqual(finished[0], "racecheck racecheck_probe")  # the probe, before any check starts
        self.assertEqual(sorted(finished[1:]), sorted(keys))
        self.assertLess(finished.index(keys[-1]), finished.index(keys[0]))  # they did finish out of order
        names = [line.split()[1] for line in result.stdout.splitlines()]
        shards = [f"memcheck-fused-unit-tests-{k}of4" for k in range(1, 5)]
        self.assertEqual(names, ["racecheck-probe", "memcheck-train", "synccheck-train", "memcheck-train-baseline",
                                 "synccheck-train-baseline", "racecheck-train-baseline", "racecheck-train-fp32-nhwc",
                                 "racecheck-unit-tests", *shards, "passed,"])
        # side by side: about as long as the slowest check (1.65 s), not as the sum of the sleeps (9.9 s)
        self.assertLess(elapsed, 6, result.stdout)

    def test_a_filter_that_misses_the_planted_race_fails(self):
        result = self.run_script("blind")
        self.assertEqual(result.returncode, 1)
        self.assertIn("racecheck-probe", result.stdout)
        self.assertIn("did not report the planted race", result.stdout)
        self.assertEqual(result.stdout.strip().splitlines()[-1], "sanitize-gpu: FAILED")

    def test_an_internal_sanitizer_error_is_not_taken_for_the_planted_race(self):
        # its summary counts one error, but the probe's race is not in the log: the probe fails,
        # and so does every racecheck, with the tool's message shown
        result = self.run_script("hardware-exception")
        self.assertEqual(result.returncode, 1)
        self.assertIn("did not report the planted race (exit status 99", result.stdout)
        self.assertIn("racecheck-train-fp32-nhwc", result.stdout)
        self.assertIn("Internal Sanitizer Error: The Sanitizer failed to handle a hardware exception", result.stdout)
        self.assertIn("memcheck-train ", result.stdout)

    def test_a_report_fails_and_shows_its_log(self):
        result = self.run_script("memcheck-error")
        self.assertEqual(result.returncode, 1)
        self.assertIn("memcheck-train-baseline", result.stdout)
        self.assertIn("FAILED (exit status 99", result.stdout)
        self.assertIn("Invalid __global__ read of size 4 bytes", result.stdout)
        self.assertIn("memcheck-train ", result.stdout.replace("memcheck-train-baseline", ""))  # others still ran

    def test_without_a_gpu_one_line_and_nothing_runs(self):
        _executable(self.tools / "nvidia-smi", "#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
        result = self.run_script()
        self.assertEqual(result.returncode, 2)
        self.assertEqual(result.stderr.strip(), "sanitize-gpu: no CUDA GPU on this machine; run it on the GPU machine")
        self.assertEqual(self.calls(), [])

    def test_a_missing_binary_is_named(self):
        (self.bin / "racecheck_probe").unlink()
        result = self.run_script()
        self.assertEqual(result.returncode, 2)
        self.assertIn("racecheck_probe is not built: run make sanitize-gpu", result.stderr.strip())
        self.assertEqual(len(result.stderr.strip().splitlines()), 1)
        self.assertEqual(self.calls(), [])


if __name__ == "__main__":
    unittest.main()
