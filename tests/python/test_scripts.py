"""bench.py, profile.py, profile_check.py, pytorch_reference.py and grad_sensitivity.py as a user runs them.

Without a GPU (no nvidia-smi on PATH) each prints one line on stderr and exits non-zero, with no
traceback. With fake tools and binaries (fakes.py) they run end to end and write their files.
"""

import csv
import importlib.util
import tempfile
import unittest
from pathlib import Path

from tests.python.fakes import FakeMachine

LADDER = ["train-baseline", "train-devloss", "train-pinned", "train-autotune", "train-fp16", "train-nhwc",
          "train-graph", "train-fusedbn", "train-cudagraph", "train-wgradstream"]


class ScriptTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = Path(self._tmp.name)

    def tearDown(self):
        self._tmp.cleanup()

    def two_binary_machine(self, nsys):
        """A machine with train-baseline and train-devloss, the pair profile.py and profile_check.py run."""
        machine = FakeMachine(self.tmp, nsys=nsys)
        machine.add_binary("train-baseline")
        machine.add_binary("train-devloss")
        return machine

    def assertOneLineFailure(self, result, *fragments):
        self.assertNotEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertNotIn("Traceback", result.stderr)
        lines = result.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, result.stderr)
        for fragment in fragments:
            self.assertIn(fragment, lines[0])


class WithoutGpu(ScriptTest):
    def setUp(self):
        super().setUp()
        self.machine = FakeMachine(self.tmp, gpu=False)
        for v in LADDER:
            self.machine.add_binary(v)

    def elsewhere(self) -> list:
        """Output folders in the temporary directory, so that even a broken GPU check writes nothing
        into the repository."""
        return ["--bin-dir", str(self.machine.bin_dir), "--out", str(self.tmp / "out")]

    def test_bench(self):
        result = self.machine.run_script("bench.py", *self.elsewhere())
        self.assertOneLineFailure(result, "bench: no CUDA GPU on this machine; run it on the GPU machine")
        self.assertEqual(result.returncode, 2)
        self.assertEqual(self.machine.calls(), [])  # nothing was run

    def test_profile(self):
        result = self.machine.run_script("profile.py", *self.elsewhere(), "--results", str(self.tmp / "results"))
        self.assertOneLineFailure(result, "profile: no CUDA GPU")
        self.assertEqual(result.returncode, 2)

    def test_profile_check(self):
        result = self.machine.run_script("profile_check.py", *self.elsewhere())
        self.assertOneLineFailure(result, "profile_check: no CUDA GPU")

    def test_bench_as_make_runs_it(self):
        # `make bench` passes no paths; the check for a GPU comes before anything touches them.
        result = self.machine.run_script("bench.py", "--batch", "128")
        self.assertOneLineFailure(result, "no CUDA GPU")
        self.assertEqual(result.returncode, 2)


class GpuButNoCudaDevice(ScriptTest):
    """nvidia-smi lists a GPU, but the first binary finds no CUDA device (driver mismatch, say)."""

    def test_bench_stops_after_the_first_run(self):
        machine = FakeMachine(self.tmp)
        for v in LADDER:
            machine.add_binary(v, no_device=True)
        result = machine.run_script("bench.py", "--bin-dir", str(machine.bin_dir), "--out", str(self.tmp / "out"),
                                    "--no-pytorch")
        self.assertOneLineFailure(result, "bench: no CUDA GPU on this machine", "cudaGetDeviceCount")
        self.assertEqual(len(machine.calls()), 1)
        self.assertFalse((self.tmp / "out").exists())

    def test_profile_stops_too(self):
        machine = FakeMachine(self.tmp)
        machine.add_binary("train-baseline", no_device=True)
        result = machine.run_script("profile.py", "--variants", "baseline", "--bin-dir", str(machine.bin_dir),
                                    "--out", str(self.tmp / "p"), "--results", str(self.tmp / "r"))
        self.assertNotEqual(result.returncode, 0)
        self.assertNotIn("Traceback", result.stderr)
        self.assertIn("profile: no CUDA GPU on this machine", result.stderr.strip().splitlines()[-1])


class MissingBinaries(ScriptTest):
    def test_bench_names_make_variants(self):
        machine = FakeMachine(self.tmp)
        machine.add_binary("train-baseline")
        result = machine.run_script("bench.py", "--bin-dir", str(machine.bin_dir), "--out", str(self.tmp / "out"))
        self.assertOneLineFailure(result, "train-devloss", "train-nhwc", "make variants")
        self.assertEqual(machine.calls(), [])


class BenchEndToEnd(ScriptTest):
    def test_table_files_and_command_lines(self):
        machine = FakeMachine(self.tmp)
        for v in LADDER:
            machine.add_binary(v)
        out = self.tmp / "results"
        result = machine.run_script("bench.py", "--bin-dir", str(machine.bin_dir), "--out", str(out), "--no-pytorch")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertNotIn("Traceback", result.stderr)

        # Printed table: one row per binary, the failed one says why.
        table_lines = [line for line in result.stdout.splitlines() if line.startswith("| 128 |")]
        self.assertEqual(len(table_lines), len(LADDER))
        fp16 = next(line for line in table_lines if "train-fp16" in line)
        self.assertIn("failed: error: cuDNN CUDNN_STATUS_EXECUTION_FAILED", fp16)

        # Files named after the GPU and the date the binaries reported.
        md = (out / "nvidia-h100-80gb-hbm3-2026-11-21.md").read_text()
        self.assertIn("cuDNN: 9.14.0", md)
        self.assertIn("command: `python3 bench/bench.py --bin-dir", md)
        with open(out / "nvidia-h100-80gb-hbm3-2026-11-21.csv") as f:
            rows = {r["variant"]: r for r in csv.DictReader(f)}
        self.assertEqual(rows["train-baseline"]["images_per_s_median"], "3050.4")
        self.assertEqual(rows["train-baseline"]["gpu_busy_pct"], "61.2")

        # Three timed runs and one --trace run per binary, each with the same fixed window.
        calls = machine.calls()
        self.assertEqual(len(calls), len(LADDER) * 4)
        expected = ("--data synthetic --batch 128 --steps 130 --warmup-steps 30 --profile-steps 100 "
                    "--no-eval --json")
        self.assertTrue(all(expected in c for c in calls), calls[0])
        self.assertEqual(sum("--trace" in c for c in calls), len(LADDER))

    def test_batch_list_and_variant_subset(self):
        machine = FakeMachine(self.tmp)
        machine.add_binary("train-baseline")
        machine.add_binary("train-nhwc")
        result = machine.run_script("bench.py", "--bin-dir", str(machine.bin_dir), "--out", str(self.tmp / "o"),
                                    "--variants", "baseline,nhwc", "--batch", "128,256", "--runs", "1",
                                    "--no-trace", "--warmup-steps", "5", "--timed-steps", "10", "--no-pytorch")
        self.assertEqual(result.returncode, 0, result.stderr)
        calls = machine.calls()
        self.assertEqual(len(calls), 4)
        self.assertEqual(sum("--batch 256" in c for c in calls), 2)
        self.assertTrue(all("--steps 15 --warmup-steps 5 --profile-steps 10" in c for c in calls))

    def test_every_run_failed_exits_non_zero_and_writes_nothing(self):
        # train-fp16's recording fails (a cuDNN error): a table of nothing but failures is no result.
        machine = FakeMachine(self.tmp)
        machine.add_binary("train-fp16")
        out = self.tmp / "results"
        result = machine.run_script("bench.py", "--bin-dir", str(machine.bin_dir), "--out", str(out),
                                    "--variants", "fp16", "--runs", "2", "--no-trace", "--no-pytorch")
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertNotIn("Traceback", result.stderr)
        self.assertIn("bench: every run failed", result.stderr.strip().splitlines()[-1])
        self.assertIn("CUDNN_STATUS_EXECUTION_FAILED", result.stderr.strip().splitlines()[-1])
        self.assertFalse(out.exists(), "no results may be written")

    def test_no_variant_selected_is_a_usage_error(self):
        machine = FakeMachine(self.tmp)
        for spec in (",", " ", ""):
            result = machine.run_script("bench.py", "--bin-dir", str(machine.bin_dir), "--out", str(self.tmp / "o"),
                                        "--variants", spec)
            self.assertEqual(result.returncode, 2, (spec, result.stderr))
            self.assertIn("selects no variant", result.stderr)
            self.assertNotIn("Traceback", result.stderr)
        self.assertEqual(machine.calls(), [])
        self.assertFalse((self.tmp / "o").exists())

    def test_non_positive_timeout_is_a_usage_error(self):
        machine = FakeMachine(self.tmp)
        for timeout in ("-1", "0", "nan"):
            result = machine.run_script("bench.py", "--timeout", timeout)
            self.assertEqual(result.returncode, 2, (timeout, result.stderr))
            self.assertIn("--timeout must be a positive number", result.stderr)
        self.assertEqual(machine.calls(), [])

    def test_bad_batch_is_a_usage_error(self):
        machine = FakeMachine(self.tmp)
        result = machine.run_script("bench.py", "--batch", "128,big")
        self.assertEqual(result.returncode, 2)
        self.assertNotIn("Traceback", result.stderr)


class ProfileEndToEnd(ScriptTest):
    def run_profile(self, machine, *extra):
        return machine.run_script("profile.py", "--variants", "baseline,devloss", "--bin-dir", str(machine.bin_dir),
                                  "--out", str(self.tmp / "prof"), "--results", str(self.tmp / "results"), *extra)

    def test_with_nsys(self):
        machine = self.two_binary_machine(nsys=True)
        result = self.run_profile(machine)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("train-baseline: where the time goes: loss stats 42% of step time", result.stdout)
        baseline_md = (self.tmp / "prof" / "train-baseline.md").read_text()
        self.assertIn("| busy % (nsys) | 68.5 |", baseline_md)
        combined = (self.tmp / "results" / "profiles-nvidia-h100-80gb-hbm3-2026-11-21.md").read_text()
        self.assertIn("| train-baseline | nsys | loss stats (42%) |", combined)
        self.assertIn("| train-devloss | nsys | copy batch (35%) |", combined)
        profiled = [c for c in machine.calls() if c.startswith("nsys profile")]
        self.assertEqual(len(profiled), 2)
        self.assertIn("--data synthetic --batch 128 --steps 60 --warmup-steps 20 --profile-steps 30 --no-eval",
                      profiled[0])
        # Each binary runs once without nsys first, so that its autotune cache is filled unskewed.
        calls = machine.calls()
        for variant in ("train-baseline", "train-devloss"):
            under = next(i for i, c in enumerate(calls) if c.startswith("nsys profile") and f"/{variant} " in c)
            self.assertTrue(any(c.startswith(variant + " --data synthetic") for c in calls[:under]), variant)

    def test_without_nsys_falls_back_to_the_built_in_trace(self):
        machine = self.two_binary_machine(nsys=False)
        result = self.run_profile(machine)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("nsys not found", result.stderr.splitlines()[0])
        self.assertIn("bin/train --trace FILE.json", result.stderr.splitlines()[0])
        md = (self.tmp / "prof" / "train-baseline.md").read_text()
        self.assertIn("built-in trace", md)
        self.assertIn("loss stats 34% of step time (waiting on the GPU)", md)
        self.assertTrue(all("--trace" in c for c in machine.calls()))

    def test_no_nsys_uses_the_built_in_trace_without_saying_nsys_is_missing(self):
        machine = self.two_binary_machine(nsys=True)
        result = self.run_profile(machine, "--no-nsys")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertNotIn("nsys not found", result.stderr)
        self.assertFalse(any(c.startswith("nsys") for c in machine.calls()))
        self.assertTrue(all("--trace" in c for c in machine.calls()))

    def test_compare_trace_reports_both_busy_figures(self):
        machine = self.two_binary_machine(nsys=True)
        result = self.run_profile(machine, "--compare-trace")
        self.assertEqual(result.returncode, 0, result.stderr)
        md = (self.tmp / "prof" / "train-baseline.md").read_text()
        self.assertIn("| busy % (nsys) | 68.5 |", md)
        self.assertIn("| busy % (built-in trace, same definition) | 61.2 |", md)
        self.assertIn("train-baseline: GPU busy 68.5% (nsys) vs 61.2% (built-in trace, next run): 7.3 points apart",
                      result.stdout)
        combined = next((self.tmp / "results").glob("profiles-*.md")).read_text()
        self.assertIn("| GPU busy % | built-in trace busy % (next run) |", combined)
        self.assertIn("| 68.5 | 61.2 |", combined)


class NsysCommandLines(unittest.TestCase):
    """nsys traces the nodes of a CUDA graph only when told to: the builds that replay their step as a
    graph (train-cudagraph, train-wgradstream, and bin/train with every rung on) get
    --cuda-graph-trace=node."""

    def profile_command(self, variant):
        from lib import capture
        settings = capture.Settings(out_dir=Path("out"))
        profile, _ = capture.nsys_commands(Path("nsys"), Path("bin") / variant, variant, settings)
        return profile

    def test_graph_builds_trace_every_node(self):
        for variant in ("train-cudagraph", "train-wgradstream", "train"):
            profile = self.profile_command(variant)
            self.assertIn("--cuda-graph-trace=node", profile, variant)
            self.assertLess(profile.index("--cuda-graph-trace=node"), profile.index(str(Path("bin") / variant)),
                            "an option of nsys, not of the trainer")

    def test_other_rungs_do_not(self):
        for variant in ("train-baseline", "train-graph", "train-fusedbn"):
            self.assertFalse(any(a.startswith("--cuda-graph-trace") for a in self.profile_command(variant)), variant)


class ProfileCheckEndToEnd(ScriptTest):
    def test_pass_with_nsys(self):
        machine = self.two_binary_machine(nsys=True)
        result = machine.run_script("profile_check.py", "--bin-dir", str(machine.bin_dir), "--out", str(self.tmp / "c"))
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertEqual(result.stdout.strip().splitlines()[-1], "PASS")
        # The fake replays run 1 before nsys (it fills the autotune cache) and run 2 under it, so the
        # images/s runs are each binary's run 3.
        self.assertIn("images/s: 3,071 -> 3,455 = 1.12x (needs at least 1.10x): ok", result.stdout)
        self.assertIn("train-baseline: dominant phase 'loss stats'", result.stdout)


class GradSensitivity(ScriptTest):
    """bench/grad_sensitivity.py: ResNet-50's gradients under rounding-sized changes of the forward."""

    @unittest.skipIf(importlib.util.find_spec("torch") is not None, "PyTorch is installed here")
    def test_without_pytorch(self):
        result = FakeMachine(self.tmp).run_script("grad_sensitivity.py", "--batch", "2")
        self.assertOneLineFailure(result, "grad_sensitivity: PyTorch is not installed")
        self.assertEqual(result.returncode, 1)

    def test_a_batch_of_one_is_a_usage_error(self):
        # Checked before PyTorch is imported: the same with it or without.
        result = FakeMachine(self.tmp).run_script("grad_sensitivity.py", "--batch", "1")
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertNotIn("Traceback", result.stderr)
        self.assertIn("--batch must be at least 2", result.stderr)

    @unittest.skipUnless(importlib.util.find_spec("torch") is not None, "needs PyTorch")
    def test_the_table_has_each_change_and_fp16_noise_moves_more_than_one_value(self):
        result = FakeMachine(self.tmp).run_script("grad_sensitivity.py", "--batch", "2", "--threads", "2",
                                                  timeout=600)
        self.assertEqual(result.returncode, 0, result.stderr)
        rows = [line.split(" | ") for line in result.stdout.splitlines()
                if line.startswith("| ") and not line.startswith(("| change", "| ---"))]
        self.assertEqual(len(rows), 4, result.stdout)
        all_gradients = [float(r[2]) for r in rows]
        self.assertGreater(all_gradients[1], all_gradients[0], "fp16-sized noise everywhere against one value")
        self.assertTrue(all(0 < g < 10 for g in all_gradients), all_gradients)


class PytorchReference(ScriptTest):
    @unittest.skipIf(importlib.util.find_spec("torch") is not None, "PyTorch is installed here")
    def test_without_pytorch(self):
        machine = FakeMachine(self.tmp)
        result = machine.run_script("pytorch_reference.py", "--rungs", "all", "--json")
        self.assertOneLineFailure(result, "pytorch_reference: PyTorch is not installed")
        self.assertEqual(result.returncode, 2)

    def test_rung_names(self):
        from lib import pytorch_rungs
        self.assertEqual(len(pytorch_rungs.RUNGS), 13)
        self.assertEqual([r.name for r in pytorch_rungs.parse_rungs("compile,baseline")], ["baseline", "compile"])
        with self.assertRaises(ValueError):
            pytorch_rungs.parse_rungs("baseline,warp-speed")
        graphs, autotuned = pytorch_rungs.RUNGS[-2:]
        for r in (graphs, autotuned):
            self.assertTrue(r.resident and r.channels_last and r.amp == "plain" and r.cuda_graphs, r.name)
        self.assertEqual(graphs.compile_mode, "reduce-overhead")
        self.assertEqual(autotuned.compile_mode, "max-autotune")
        self.assertFalse(pytorch_rungs.parse_rungs("compile")[0].cuda_graphs)
        # The ladder is cumulative up to torch.compile: each rung keeps the previous one's switches.
        ladder = pytorch_rungs.RUNGS[:9]
        for before, after in zip(ladder, ladder[1:]):
            self.assertTrue(set(before.optimizations()) - {"amp-fp16+gradscaler"} <= set(after.optimizations()),
                            (before.name, after.name))


if __name__ == "__main__":
    unittest.main()
