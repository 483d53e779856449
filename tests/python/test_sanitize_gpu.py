"""tests/sanitize_gpu.sh (`make sanitize-gpu`) against a fake compute-sanitizer and fake binaries.

The fake sanitizer records its command line, runs the program, and prints the summary line the real
one prints; a mode file tells it to report an error, or to miss the planted race of the probe (a
kernel filter that selects nothing). nvidia-smi is faked too, so these run the same with or without
a GPU.
"""

import os
import stat
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

from tests.python import REPO

SCRIPT = REPO / "tests" / "sanitize_gpu.sh"

# Report lines as compute-sanitizer 2025.3.1 printed them on the H100 (2026-11-23).
FAKE_SANITIZER = r'''
import subprocess, sys
from pathlib import Path
ROOT = Path({root!r})
args = sys.argv[1:]
with (ROOT / "calls.log").open("a") as log:
    log.write(" ".join(args) + "\n")
mode = (ROOT / "mode").read_text().strip() if (ROOT / "mode").exists() else "clean"
tool = args[args.index("--tool") + 1]
error_exit = int(args[args.index("--error-exitcode") + 1])
i = 0  # every option the script passes takes a value; the program comes after them
while args[i].startswith("--"):
    i += 2
program = args[i:]
print("========= COMPUTE-SANITIZER")
name = Path(program[0]).name
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

    def test_all_clean_passes_and_racecheck_checks_only_our_kernels(self):
        result = self.run_script()
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertEqual(result.stdout.strip().splitlines()[-1], "sanitize-gpu: passed, no reports")
        self.assertEqual(result.stdout.count(" ok "), 9, result.stdout)  # the probe and 8 checks
        calls = self.calls()
        self.assertEqual(len(calls), 9)
        for call in calls:
            filtered = "--kernel-name kns=trainer_kernels" in call
            self.assertEqual(filtered, "--tool racecheck" in call, call)
        self.assertTrue(any("unit_tests --gtest_filter=*GpuBatchNorm*:" in c for c in calls), calls)
        # the fused patterns (off under --deterministic) are memchecked through their unit tests
        fused = [c for c in calls if "--tool memcheck" in c and "unit_tests" in c]
        self.assertEqual(len(fused), 1, calls)
        self.assertIn("Shapes/FusedGpu*", fused[0])
        self.assertIn("Shapes/GemmGpu*", fused[0])
        self.assertIn("PredictGpu.BatchNormInTheConvEpiloguesGivesTheUnfusedLogits", fused[0])
        self.assertIn("PredictGpu.GemmConvsWithTheBnFoldedInGiveTheUnfusedLogits", fused[0])  # cuBLASLt's 1x1 convs
        # the training runs under racecheck are the fp32 builds with --no-tf32 (no tensor-core kernels)
        race_runs = [c for c in calls if "--tool racecheck" in c and "--data synthetic" in c]
        self.assertEqual([Path(c.split(" --data")[0].split()[-1]).name for c in race_runs],
                         ["train-baseline", "train-fp32-nhwc"])
        for call in race_runs:
            self.assertTrue(call.endswith("--deterministic --no-tf32"), call)
        self.assertTrue((self.root / "logs" / "racecheck-train-fp32-nhwc.log").is_file())

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
