"""bench/power_model.py without a GPU: each phase's row from samples inside its window, the table,
and what it says where it cannot run (arguments, no PyTorch). Its GPU run is checked on a GPU
(bench/results/levers-session41-nvidia-h200-2026-12-01.md)."""

import contextlib
import io
import subprocess
import sys
import tempfile
import types
import unittest
from unittest import mock

from tests.python import REPO

import power_model
from lib.gpu_clocks import SW_POWER_CAP, Sample


def sample(t, watts, mhz=1980, capped=False):
    return Sample(t, mhz, watts, SW_POWER_CAP if capped else 0, 100)


class Summarize(unittest.TestCase):
    def test_only_the_samples_inside_the_window_count(self):
        idle = power_model.Arm("idle", 0.0, "", start=10.0, end=14.0)
        copy = power_model.Arm("HBM copy", 4e9, "B", start=20.0, end=24.0, rate=4e12)
        samples = ([sample(t, 120) for t in (10.5, 11, 12, 13)] + [sample(t, 600) for t in (18, 19, 19.9)]  # ramp up
                   + [sample(t, 620, 1900, capped=t > 22) for t in (20, 21, 22, 23, 24)] + [sample(30, 125)])
        i = power_model.summarize(idle, samples, None)
        self.assertEqual((i.power_w, i.samples, i.pj), (120, 4, None))
        c = power_model.summarize(copy, samples, i.power_w)
        self.assertEqual((c.power_w, c.sm_mhz, c.samples), (620, 1900, 5))
        self.assertAlmostEqual(c.capped_share, 2 / 5)
        self.assertAlmostEqual(c.pj, (620 - 120) / 4e12 * 1e12)  # 0.125 pJ a byte

    def test_a_window_without_samples_gives_none(self):
        arm = power_model.Arm("gemm", 1.0, "FLOP", start=5.0, end=6.0, rate=1e15)
        self.assertIsNone(power_model.summarize(arm, [sample(7.0, 700)], 100.0))

    def test_the_table_names_each_unit(self):
        rows = [power_model.Row("idle", 0.0, "", 120, 1980, 0.0, 30, None),
                power_model.Row("HBM copy, 2 GiB", 4.2e12, "B", 616, 1980, 0.0, 65, 118.1),
                power_model.Row("cuBLAS GEMM 8192^3", 6.4e14, "FLOP", 688, 1425, 1.0, 65, 0.883)]
        lines = power_model.table(rows).splitlines()
        self.assertEqual(len(lines), 5)
        self.assertEqual(lines[2], "| idle | - | 120 | 1,980 | 0% | 30 | - |")
        self.assertEqual(lines[3], "| HBM copy, 2 GiB | 4.2 TB/s | 616 | 1,980 | 0% | 65 | 118.100 pJ a byte |")
        self.assertEqual(lines[4], "| cuBLAS GEMM 8192^3 | 640.0 TFLOP/s | 688 | 1,425 | 100% | 65 | 0.883 pJ a FLOP |")


class FakeClock:
    """time.time() that advances 0.25 s at each read; sleep() advances it too."""

    def __init__(self, start=1000.0):
        self.now = start

    def time(self):
        self.now += 0.25
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def fake_torch(ms_between_events):
    """What hold() asks of torch: CUDA events whose elapsed_time is fixed, a synchronize that counts."""
    class Event:
        def __init__(self, enable_timing=False):
            pass

        def record(self):
            pass

        def elapsed_time(self, other):
            return ms_between_events

    cuda = types.SimpleNamespace(Event=Event, synchronize=lambda: None)
    return types.SimpleNamespace(cuda=cuda)


class Hold(unittest.TestCase):
    def test_the_rate_counts_the_calls_of_the_window_alone(self):
        clock, calls = FakeClock(), []
        arm = power_model.Arm("gemm", 2e12, "FLOP")
        with mock.patch.object(power_model.time, "time", clock.time):
            power_model.hold(arm, lambda: calls.append(clock.now), 8.0, fake_torch(ms_between_events=500.0))
        # 1.5 s settle (a quarter of 8, at most 1.5), then the window to 8 s; 10 calls each 0.25 s read
        self.assertGreaterEqual(arm.start, 1000.0 + 1.5)
        self.assertLessEqual(arm.end, 1000.0 + 8.0 + 1.0)
        settle_calls = sum(1 for t in calls if t < arm.start)
        window_calls = len(calls) - settle_calls
        self.assertGreater(settle_calls, 0)
        self.assertEqual(window_calls % 10, 0)
        self.assertAlmostEqual(arm.rate, 2e12 * window_calls / 0.5)  # 500 ms between the window's events

    def test_a_short_hold_settles_a_quarter(self):
        self.assertEqual(power_model.settle_seconds(2.0), 0.5)
        self.assertEqual(power_model.settle_seconds(60.0), 1.5)


class RowsOf(unittest.TestCase):
    def test_energy_above_the_idle_row(self):
        idle = power_model.Arm("idle", 0.0, "", start=0.0, end=4.0)
        copy = power_model.Arm("HBM copy", 1.0, "B", start=10.0, end=14.0, rate=4e12)
        rows = power_model.rows_of(idle, [copy], [sample(2, 124), sample(12, 624)])
        self.assertEqual([r.label for r in rows], ["idle", "HBM copy"])
        self.assertAlmostEqual(rows[1].pj, 125.0)

    def test_a_phase_without_samples_is_one_line_and_exit_2(self):
        idle = power_model.Arm("idle", 0.0, "", start=0.0, end=4.0)
        copy = power_model.Arm("HBM copy", 1.0, "B", start=10.0, end=14.0, rate=4e12)
        for samples, missing in (([sample(12, 624)], "idle"), ([sample(2, 124)], "HBM copy")):
            err = io.StringIO()
            with self.subTest(missing=missing), contextlib.redirect_stderr(err), self.assertRaises(SystemExit) as e:
                power_model.rows_of(idle, [copy], samples)
            self.assertEqual(e.exception.code, 2)
            self.assertEqual(err.getvalue(), f"power_model: no power sample fell inside {missing}'s window: "
                                             "hold each phase longer\n")


class Arguments(unittest.TestCase):
    def test_bad_arguments_are_usage_errors(self):
        for args in (["--hold", "1"], ["--hold", "nan"], ["--hold", "inf"], ["--hold", "601"], ["--phases", "idle,fan"],
                     ["--phases", ","],
                     ["--out", "/no/such/dir/power.md"]):
            err = io.StringIO()
            with self.subTest(args=args), contextlib.redirect_stderr(err), self.assertRaises(SystemExit) as e:
                power_model.parse_args(args)
            self.assertEqual(e.exception.code, 2)
            self.assertIn(": error: --", err.getvalue())

    def test_idle_always_and_the_phases_in_their_own_order(self):
        self.assertEqual(power_model.parse_args(["--phases", "tiles, hbm-copy"]).phases, ["idle", "hbm-copy", "tiles"])
        self.assertEqual(power_model.parse_args(["--phases", "idle"]).phases, ["idle"])
        self.assertEqual(power_model.parse_args([]).phases, power_model.PHASES)

    def test_out_naming_a_directory_is_refused_before_any_work(self):
        with tempfile.TemporaryDirectory() as d, contextlib.redirect_stderr(io.StringIO()) as err, \
                self.assertRaises(SystemExit) as e:
            power_model.parse_args(["--out", d])
        self.assertEqual(e.exception.code, 2)
        self.assertIn(f"--out: {d} is a directory, not a file", err.getvalue())

    def test_without_pytorch_one_line_and_exit_2(self):
        # PyTorch hidden, as on a machine without it (CI's): the tool says so before nvidia-smi or a GPU.
        code = ("import sys, runpy; sys.modules['torch'] = None; sys.argv = ['bench/power_model.py', '--hold', '2']; "
                "sys.path.insert(0, 'bench'); runpy.run_path('bench/power_model.py', run_name='__main__')")
        p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
        self.assertEqual((p.returncode, p.stdout), (2, ""))
        self.assertEqual(p.stderr, "power_model: needs PyTorch (python3 -c 'import torch' fails here)\n")


if __name__ == "__main__":
    unittest.main()
