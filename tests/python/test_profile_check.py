"""The profile-driven check (bench/profile_check.py): find the base rung's dominant phase, pick the
rung that fixes it (--next auto), then require that this rung shrank the phase and is at least 1.1x
as fast. The decision and the choice are pure functions; main() runs here on fake profiles, and the
script end to end on the fake machine of fakes.py. No GPU needed."""

import contextlib
import io
import tempfile
import unittest
from pathlib import Path
from unittest import mock

from tests.python import FIXTURES
from tests.python.fakes import FakeMachine

import profile_check  # bench/, on sys.path through tests/python/__init__.py
from lib import nsys_summary, runner
from lib.timeline import ProfileSummary, Stat

NSYS = FIXTURES / "nsys"


def profile(variant: str, steps: int = 30, busy_pct: float | None = None, **phase_ms: float) -> ProfileSummary:
    s = ProfileSummary(variant, "nsys")
    s.phases["step"] = Stat("step", int(sum(phase_ms.values()) * steps * 1e6), steps)
    for name, ms in phase_ms.items():
        name = name.replace("_", " ")
        s.phases[name] = Stat(name, int(ms * steps * 1e6), steps)
    if busy_pct is not None:
        s.window_ns = 1_000_000
        s.busy_ns = int(busy_pct * 10_000)
    return s


# The baseline as measured on an H100 (host ms per step in each NVTX range): backward and forward
# are host-bound legacy cuDNN calls; devloss removes only the 2.4 ms "loss stats" sync.
def h100_baseline(**overrides) -> ProfileSummary:
    phases = dict(backward=12.7, forward=8.4, loss_stats=2.4, get_batch=2.0, copy_batch=0.6, optimizer_step=0.9)
    phases.update(overrides)
    return profile("train-baseline", **phases)


class RecordedProfiles(unittest.TestCase):
    def setUp(self):
        self.base = nsys_summary.summarize(NSYS / "train-baseline", "train-baseline")
        self.devloss = nsys_summary.summarize(NSYS / "train-devloss", "train-devloss")

    def test_pass(self):
        v = profile_check.check(self.base, 3050.0, self.devloss, 3480.0)
        self.assertTrue(v.passed, v.lines)
        self.assertIn("dominant phase 'loss stats'", v.lines[0])
        self.assertIn("shrank", v.lines[1])
        self.assertEqual(v.lines[-1], "PASS")

    def test_fail_when_not_fast_enough(self):
        v = profile_check.check(self.base, 3050.0, self.devloss, 3300.0)  # 1.08x
        self.assertFalse(v.passed)
        self.assertIn("too slow", v.lines[2])
        self.assertEqual(v.lines[-1], "FAIL")

    def test_fail_when_the_bottleneck_did_not_shrink(self):
        # The "fix" profiled against itself: same phase times, even if it measured faster.
        v = profile_check.check(self.base, 3050.0, self.base, 4000.0)
        self.assertFalse(v.passed)
        self.assertIn("did NOT shrink", v.lines[1])

    def test_fail_without_images_per_s(self):
        self.assertFalse(profile_check.check(self.base, None, self.devloss, 3480.0).passed)


class Decision(unittest.TestCase):
    def test_enclosing_step_is_never_the_bottleneck(self):
        base = profile("b", get_batch=10, loss_stats=20)
        nxt = profile("n", get_batch=10, loss_stats=1)
        v = profile_check.check(base, 100.0, nxt, 150.0)
        self.assertTrue(v.passed, v.lines)
        self.assertIn("'loss stats'", v.lines[0])

    def test_phase_compared_per_step_when_step_counts_differ(self):
        base = profile("b", steps=30, loss_stats=20, forward=5)
        nxt = profile("n", steps=60, loss_stats=15, forward=5)  # more total time, less per step
        self.assertTrue(profile_check.check(base, 100.0, nxt, 120.0).passed)

    def test_phase_gone_from_the_next_rung_counts_as_shrunk(self):
        base = profile("b", loss_stats=20, forward=5)
        nxt = profile("n", forward=5)
        self.assertTrue(profile_check.check(base, 100.0, nxt, 200.0).passed)

    def test_exactly_the_minimum_speedup_passes(self):
        base = profile("b", loss_stats=20)
        nxt = profile("n", loss_stats=10)
        self.assertTrue(profile_check.check(base, 100.0, nxt, 110.0).passed)
        self.assertFalse(profile_check.check(base, 100.0, nxt, 109.9).passed)

    def test_empty_profiles_fail_with_the_reason(self):
        empty = ProfileSummary("b", "nsys", notes=["nsys profile failed: error: no CUDA device found"])
        v = profile_check.check(empty, 100.0, profile("n", forward=1), 200.0)
        self.assertFalse(v.passed)
        self.assertIn("no CUDA device", v.lines[0])
        v = profile_check.check(profile("b", forward=1), 100.0, ProfileSummary("n", "nsys"), 200.0)
        self.assertFalse(v.passed)


class ChooseRung(unittest.TestCase):
    """--next auto: the table from the dominant phase to the rung that fixes it."""

    def pick(self, base: ProfileSummary) -> str | None:
        return profile_check.choose_rung(base).variant

    def test_loss_stats_picks_devloss(self):
        choice = profile_check.choose_rung(profile("train-baseline", loss_stats=20, forward=5, backward=8))
        self.assertEqual(choice.variant, "train-devloss")
        self.assertIn("'loss stats'", choice.line)
        self.assertIn("-> train-devloss", choice.line)
        self.assertEqual(len(choice.line.splitlines()), 1)

    def test_recorded_baseline_picks_devloss(self):
        base = nsys_summary.summarize(NSYS / "train-baseline", "train-baseline")
        self.assertEqual(self.pick(base), "train-devloss")

    def test_get_batch_and_copy_batch_pick_pinned(self):
        self.assertEqual(self.pick(profile("train-baseline", get_batch=20, forward=5, loss_stats=2)), "train-pinned")
        self.assertEqual(self.pick(profile("train-devloss", copy_batch=20, forward=5)), "train-pinned")

    def test_backward_picks_graph_when_host_bound(self):
        choice = profile_check.choose_rung(h100_baseline())
        self.assertEqual(choice.variant, "train-graph")
        self.assertIn("'backward'", choice.line)
        self.assertIn("host-bound", choice.line)
        self.assertIn("GPU busy % not recorded", choice.line)
        choice = profile_check.choose_rung(profile("train-baseline", busy_pct=55.0, forward=20, backward=10))
        self.assertEqual(choice.variant, "train-graph")
        self.assertIn("GPU busy 55% (host-bound)", choice.line)

    def test_forward_or_backward_picks_fp16_when_gpu_bound(self):
        choice = profile_check.choose_rung(profile("train-baseline", busy_pct=95.0, backward=20, forward=10))
        self.assertEqual(choice.variant, "train-fp16")
        self.assertIn("GPU busy 95% (GPU-bound)", choice.line)
        self.assertEqual(self.pick(profile("train-baseline", busy_pct=80.0, forward=20)), "train-fp16")
        self.assertEqual(self.pick(profile("train-baseline", busy_pct=79.9, forward=20)), "train-graph")

    def test_optimizer_step_picks_fp16(self):
        self.assertEqual(self.pick(profile("train-baseline", optimizer_step=20, forward=5)), "train-fp16")

    def test_fix_already_in_the_base_tries_the_next_rung(self):
        choice = profile_check.choose_rung(profile("train-nhwc", busy_pct=95.0, backward=20, forward=10))
        self.assertEqual(choice.variant, "train-graph")
        self.assertIn("train-fp16, which train-nhwc already includes; trying the next rung, train-graph",
                      choice.line)

    def test_nothing_above_the_top_rung(self):
        choice = profile_check.choose_rung(profile(runner.LADDER[-1], loss_stats=20))
        self.assertIsNone(choice.variant)
        self.assertIn("no rung is above it", choice.line)

    def test_empty_profile_picks_nothing(self):
        empty = ProfileSummary("train-baseline", "nsys", notes=["nsys profile failed: error: no CUDA device found"])
        choice = profile_check.choose_rung(empty)
        self.assertIsNone(choice.variant)
        self.assertIn("no CUDA device", choice.line)


class MainOnFakeProfiles(unittest.TestCase):
    """main() with the capture and the images/s runs replaced by fixed profiles and numbers."""

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.bin_dir = Path(self._tmp.name) / "bin"
        self.bin_dir.mkdir()
        for v in ("train-baseline", "train-devloss", "train-pinned", "train-fp16", "train-nhwc", "train-graph"):
            (self.bin_dir / v).write_text("#!/bin/sh\n")
            (self.bin_dir / v).chmod(0o755)
        self.captured = []

    def tearDown(self):
        self._tmp.cleanup()

    def main(self, profiles: dict, ips: dict, *args: str) -> tuple[int, str, str]:
        def fake_capture(binary, variant, settings, guard, nsys, compare_trace=False):
            self.captured.append(variant)
            p = profiles[variant]
            p.variant = variant
            return p

        out, err = io.StringIO(), io.StringIO()
        with mock.patch.object(profile_check.runner, "gpu_names", return_value=["NVIDIA H100 80GB HBM3"]), \
                mock.patch.object(profile_check.capture, "capture", side_effect=fake_capture), \
                mock.patch.object(profile_check, "images_per_s", side_effect=lambda b, a, g: (ips[b.name], "")), \
                contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = profile_check.main(["--bin-dir", str(self.bin_dir), "--out", self._tmp.name, "--no-nsys",
                                           *args])
            except SystemExit as e:
                code = e.code
        return code, out.getvalue(), err.getvalue()

    def test_auto_is_the_default_and_picks_graph_for_backward(self):
        code, out, _ = self.main({"train-baseline": h100_baseline(),
                                  "train-graph": profile("g", backward=2.0, forward=1.5, loss_stats=0.1, get_batch=0.2)},
                                 {"train-baseline": 4740.0, "train-graph": 30000.0})
        self.assertEqual(code, 0, out)
        self.assertEqual(self.captured, ["train-baseline", "train-graph"])
        lines = out.strip().splitlines()
        self.assertTrue(lines[0].startswith("auto: train-baseline's dominant phase is 'backward'"), lines[0])
        self.assertIn("-> train-graph (GPU busy % not recorded (host-bound): host time of the legacy cuDNN calls",
                      lines[0])
        self.assertIn("train-graph: 'backward' 2.00 ms per step (-84.3%): shrank", out)
        self.assertEqual(lines[-1], "PASS")

    def test_auto_picks_devloss_for_loss_stats(self):
        code, out, _ = self.main({"train-baseline": profile("b", loss_stats=20, forward=5, backward=8),
                                  "train-devloss": profile("d", loss_stats=0.1, forward=5, backward=8)},
                                 {"train-baseline": 100.0, "train-devloss": 150.0}, "--next", "auto")
        self.assertEqual(code, 0, out)
        self.assertEqual(self.captured, ["train-baseline", "train-devloss"])
        self.assertIn("-> train-devloss", out.splitlines()[0])

    def test_auto_picks_pinned_for_get_batch(self):
        code, out, _ = self.main({"train-baseline": profile("b", get_batch=20, forward=5, loss_stats=2),
                                  "train-pinned": profile("p", get_batch=1, forward=5, loss_stats=2)},
                                 {"train-baseline": 100.0, "train-pinned": 200.0})
        self.assertEqual(code, 0, out)
        self.assertEqual(self.captured, ["train-baseline", "train-pinned"])
        self.assertIn("dominant phase is 'get batch'", out.splitlines()[0])
        self.assertIn("-> train-pinned", out.splitlines()[0])

    def test_explicit_next_is_used_as_given(self):
        # The H100 case of issue 4: devloss removes the 2.4 ms sync, but the dominant phase is backward.
        code, out, _ = self.main({"train-baseline": h100_baseline(), "train-devloss": h100_baseline(loss_stats=0.05)},
                                 {"train-baseline": 4740.0, "train-devloss": 5070.0}, "--next", "devloss")
        self.assertEqual(code, 1, out)
        self.assertEqual(self.captured, ["train-baseline", "train-devloss"])
        self.assertEqual(out.splitlines()[0], "next: train-devloss (given with --next)")
        self.assertIn("'backward' 12.70 ms per step (+0.0%): did NOT shrink", out)
        self.assertIn("= 1.07x (needs at least 1.10x): too slow", out)
        self.assertEqual(out.strip().splitlines()[-1], "FAIL")

    def test_explicit_base_and_next(self):
        code, out, _ = self.main({"train-nhwc": profile("n", backward=6, forward=4, loss_stats=0.1),
                                  "train-graph": profile("g", backward=2, forward=1.5, loss_stats=0.1)},
                                 {"train-nhwc": 12000.0, "train-graph": 30000.0}, "--base", "nhwc", "--next", "graph")
        self.assertEqual(code, 0, out)
        self.assertEqual(self.captured, ["train-nhwc", "train-graph"])
        self.assertIn("train-nhwc: dominant phase 'backward'", out)

    def test_fail_when_the_picked_rung_did_not_shrink_the_phase(self):
        code, out, _ = self.main({"train-baseline": h100_baseline(), "train-graph": h100_baseline()},
                                 {"train-baseline": 4740.0, "train-graph": 9000.0})
        self.assertEqual(code, 1, out)
        self.assertIn("-> train-graph", out.splitlines()[0])
        self.assertIn("did NOT shrink", out)
        self.assertEqual(out.strip().splitlines()[-1], "FAIL")

    def test_fail_when_the_picked_rung_is_not_fast_enough(self):
        code, out, _ = self.main({"train-baseline": profile("b", loss_stats=20, forward=5),
                                  "train-devloss": profile("d", loss_stats=1, forward=5)},
                                 {"train-baseline": 100.0, "train-devloss": 105.0})
        self.assertEqual(code, 1, out)
        self.assertIn("shrank", out)
        self.assertIn("1.05x (needs at least 1.10x): too slow", out)
        self.assertEqual(out.strip().splitlines()[-1], "FAIL")

    def test_fail_when_there_is_nothing_to_pick(self):
        code, out, _ = self.main({"train-baseline": ProfileSummary("b", "built-in trace")}, {})
        self.assertEqual(code, 1, out)
        self.assertEqual(self.captured, ["train-baseline"])
        self.assertIn("no NVTX phases", out.splitlines()[0])
        self.assertEqual(out.strip().splitlines()[-1], "FAIL")

    def test_picked_rung_not_built(self):
        (self.bin_dir / "train-graph").unlink()
        code, out, err = self.main({"train-baseline": h100_baseline()}, {})
        self.assertEqual(code, 2)
        self.assertIn("-> train-graph", out)
        self.assertIn("train-graph not built", err)
        self.assertEqual(self.captured, ["train-baseline"])


class ScriptEndToEnd(unittest.TestCase):
    """bench/profile_check.py as a user runs it, on the fake machine (fake nsys and trainers)."""

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = Path(self._tmp.name)

    def tearDown(self):
        self._tmp.cleanup()

    def run_check(self, nsys: bool, *args: str):
        root = Path(tempfile.mkdtemp(dir=self.tmp))  # a fresh machine per run: the fakes count their runs
        machine = FakeMachine(root, nsys=nsys)
        machine.add_binary("train-baseline")
        machine.add_binary("train-devloss")
        return machine.run_script("profile_check.py", "--bin-dir", str(machine.bin_dir),
                                  "--out", str(root / "c"), *args)

    def test_auto_and_explicit_next_pass_with_nsys(self):
        for args in ([], ["--next", "auto"], ["--next", "devloss"], ["--base", "baseline", "--next", "train-devloss"]):
            with self.subTest(args=args):
                result = self.run_check(True, *args)
                self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
                lines = result.stdout.strip().splitlines()
                if "--next" in args and args[args.index("--next") + 1] != "auto":
                    self.assertEqual(lines[0], "next: train-devloss (given with --next)")
                else:
                    self.assertIn("auto: train-baseline's dominant phase is 'loss stats' (42% of step time) "
                                  "-> train-devloss", lines[0])
                self.assertIn("images/s: 3,071 -> 3,455 = 1.12x (needs at least 1.10x): ok", result.stdout)
                self.assertEqual(lines[-1], "PASS")

    def test_fail_prints_fail_and_exits_1(self):
        # Without nsys the fake trainers all write the same --trace file, so devloss shrinks nothing.
        result = self.run_check(False)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertNotIn("Traceback", result.stderr)
        self.assertIn("-> train-devloss", result.stdout.splitlines()[0])
        self.assertIn("did NOT shrink", result.stdout)
        self.assertEqual(result.stdout.strip().splitlines()[-1], "FAIL")


if __name__ == "__main__":
    unittest.main()
