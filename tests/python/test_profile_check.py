"""The decision of the profile-driven check (bench/profile_check.py): find the baseline's dominant
phase, then require that the next rung shrank it and is at least 1.1x as fast."""

import unittest

from tests.python import FIXTURES

import nsys_summary
import profile_check
from timeline import ProfileSummary, Stat

NSYS = FIXTURES / "nsys"


def profile(variant: str, steps: int = 30, **phase_ms: float) -> ProfileSummary:
    s = ProfileSummary(variant, "nsys")
    s.phases["step"] = Stat("step", int(sum(phase_ms.values()) * steps * 1e6), steps)
    for name, ms in phase_ms.items():
        name = name.replace("_", " ")
        s.phases[name] = Stat(name, int(ms * steps * 1e6), steps)
    return s


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


if __name__ == "__main__":
    unittest.main()
