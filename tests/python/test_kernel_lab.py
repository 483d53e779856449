"""bin/kernel_lab as a user meets it: --help, usage errors (exit 2) and no GPU (exit 2), each one
"error: ..." line on stderr; and, on a machine with a GPU, small lab runs in which every version
passes its check against the CPU reference (or, for a cuDNN pattern, is refused with a reason).

The runs without a GPU hide it (CUDA_VISIBLE_DEVICES=""), so they behave the same on a machine with
one. The GPU runs skip, with the lab's own line as the reason, where it finds no GPU.
"""

import json
import os
import subprocess
import tempfile
import unittest
from collections import Counter
from pathlib import Path

from tests.python import REPO
from tests.python.cli_harness import CliAssertions

LAB = REPO / "bin" / "kernel_lab"
FLAGS = ["--batch", "--check-batch", "--runs", "--shapes", "--only", "--formats", "--autotune", "--no-check",
         "--flush-mb", "--as-graph", "--workspace-mb", "--json", "--help"]
PATTERNS = ("ConvStats", "SbrConvStats", "SbrWgrad", "DgradDreluDbn")
# Versions that may be refused, with a reason: cuDNN's fused patterns, and our kernels at shapes
# they do not take (the CUTLASS GEMMs at strided convs, the 3x3 kernels at 1x1 convs).
MAY_REFUSE = PATTERNS + ("CUTLASS ", "our ")
OPERATIONS = ["bn-stats", "bn-apply", "bn-backward", "join-projection-forward", "join-identity-forward",
              "join-projection-backward", "join-identity-backward", "conv-forward", "conv-dgrad", "conv-wgrad"]


def run_lab(*args, hide_gpu, cwd, timeout=600):
    env = dict(os.environ)
    if hide_gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return subprocess.run([str(LAB), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@unittest.skipUnless(LAB.exists(), f"{LAB} is not built (make kernel-lab)")
class KernelLabCommandLine(CliAssertions, unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="test-kernel-lab-")

    def tearDown(self):
        self.tmp.cleanup()

    def lab(self, *args, hide_gpu=True):
        p = run_lab(*args, hide_gpu=hide_gpu, cwd=self.tmp.name)
        self.assert_no_crash(p, args)
        return p

    def test_help_lists_every_flag_and_operation(self):
        p = self.lab("--help", hide_gpu=False)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stderr, "")
        listed = {line.split()[0] for line in p.stdout.splitlines() if line.startswith("  --")}
        self.assertEqual(listed, set(FLAGS))
        for op in OPERATIONS:
            self.assertIn(op, p.stdout)

    def test_usage_errors_exit_2(self):
        self.assert_one_error_line(self.lab("--runz", "3"), 2, "--runz")
        self.assert_one_error_line(self.lab("--shapes", "100x3x3"), 2, "100x3x3", "not a batch-norm tensor")
        self.assert_one_error_line(self.lab("--only", "gemm"), 2, "gemm")
        self.assert_one_error_line(self.lab("--batch", "3"), 2, "--check-batch")
        self.assert_one_error_line(self.lab("--runs"), 2, "--runs")

    def test_a_json_path_that_cannot_be_written_is_refused_first(self):
        p = self.lab("--json", "/no/such/dir/lab.jsonl")
        self.assert_one_error_line(p, 1, "--json /no/such/dir/lab.jsonl: the directory /no/such/dir does not exist")

    def test_no_gpu_is_one_line_and_exit_2(self):
        self.assert_one_error_line(self.lab("--only", "bn-stats"), 2, "needs a CUDA GPU")
        self.assertEqual(self.lab("--only", "bn-stats").stdout, "", "nothing printed before the GPU is found")


@unittest.skipUnless(LAB.exists(), f"{LAB} is not built (make kernel-lab)")
class KernelLabOnGpu(unittest.TestCase):
    """Small runs: two shapes, a few timed runs each (seconds on an H100, cuDNN's plans included)."""

    def run_rows(self, *args):
        with tempfile.TemporaryDirectory(prefix="test-kernel-lab-") as tmp:
            out = Path(tmp) / "lab.jsonl"
            p = run_lab(*args, "--runs", "3", "--json", str(out), hide_gpu=False, cwd=tmp)
            if p.returncode == 2 and "needs a CUDA GPU" in p.stderr:
                self.skipTest("no CUDA device: " + p.stderr.strip())
            self.assertIn(p.returncode, (0, 1), p.stderr)
            lines = [json.loads(line) for line in out.read_text().splitlines()]
        self.assertEqual(lines[0]["event"], "start")
        self.assertEqual(lines[-1]["event"], "end")
        rows = lines[1:-1]
        self.assertEqual(lines[-1]["rows"], len(rows))
        self.assertIn("kernel lab: %d versions measured" % len(rows), p.stdout)
        self.assertEqual(p.returncode, 0, "a version failed:\n" + p.stdout[-4000:])
        return lines[0], rows

    def test_an_existing_json_file_is_kept_while_the_lab_runs(self):
        # Rows reach the file only when the run ends: a run stopped midway leaves the last one's.
        with tempfile.TemporaryDirectory(prefix="test-kernel-lab-") as tmp:
            out = Path(tmp) / "lab.jsonl"
            out.write_text("an earlier run\n")
            p = subprocess.Popen([str(LAB), "--json", str(out)], cwd=tmp, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)
            try:
                p.wait(timeout=8)
            except subprocess.TimeoutExpired:
                pass
            running = p.poll() is None
            kept = out.read_text()
            p.kill()
            _, err = p.communicate()
            if not running and p.returncode == 2 and "needs a CUDA GPU" in err:
                self.skipTest("no CUDA device: " + err.strip())
            self.assertTrue(running, "the whole lab ran in 8 s: nothing to stop midway")
            self.assertEqual(kept, "an earlier run\n")

    def test_batch_norm_and_join_versions_pass_their_checks(self):
        _, rows = self.run_rows("--only", "bn,join", "--shapes", "512x4x4,2048x4x4")
        # 2 shapes x 3 formats: 1 + 1 + 2 versions of the BN operations. Joins only at 2048x4x4, 3
        # formats: forward 2 versions (projection) and 1 (identity); backward 3 and 2, the network's
        # form (bn_backward from the ReLU bits, dy in two parts) among them.
        self.assertEqual(dict(Counter(r["op"] for r in rows)), {
            "bn-stats": 6, "bn-apply": 6, "bn-backward": 12, "join-projection-forward": 6,
            "join-identity-forward": 3, "join-projection-backward": 9, "join-identity-backward": 6})
        for r in rows:
            self.assertEqual(r["status"], "ok", r)
            self.assertGreater(r["ms_median"], 0, r)
            self.assertGreater(r["gb_per_s"], 0, r)

    def test_conv_versions_pass_their_checks_or_are_refused(self):
        start, rows = self.run_rows("--only", "conv", "--shapes", "2048x4x4")
        # The three convs that read or write 2048x4x4 (layer4's conv3, shortcut and conv1): cuDNN's 3
        # versions each, our CUTLASS builds of the conv's kind (6 with the previous BN's prologue, at
        # conv3; 10 without) and our 3x3 conv's 2; conv3's data gradient in 10 versions (cuDNN's 3, our
        # 3x3 kernels' 3, our 1x1 kernel's 4), its weight gradient in cuDNN's 3.
        self.assertEqual(dict(Counter(r["op"] for r in rows)), {"conv-forward": 41, "conv-dgrad": 10, "conv-wgrad": 3})
        for r in rows:
            self.assertIn(r["status"], ("ok", "refused"), r)
            if r["status"] == "refused":
                self.assertTrue(r["why"], r)
                self.assertTrue(r["version"].startswith(MAY_REFUSE),
                                "only cuDNN's fused patterns and our kernels may be refused: " + r["version"])
            else:
                self.assertGreater(r["ms_median"], 0, r)
                self.assertNotIn("gb_per_s", r, "convs are compute-bound: no GB/s")
        # Our 1x1 kernels take the 1x1 stride-1 convs on sm_90 (the GPUs they are built for).
        if start["sm"] == 90:
            ours = [r for r in rows if r["op"] == "conv-forward" and r["shape"].startswith("1x1/1 ")
                    and r["version"].startswith("CUTLASS ")]
            self.assertTrue(ours and all(r["status"] == "ok" for r in ours), ours)


if __name__ == "__main__":
    unittest.main()
