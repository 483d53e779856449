"""bench/bench.py --clocks against a fake nvidia-smi that reports the GPU busy and power-capped at a
fixed clock and power: every row of a timed binary gets its clock, power, capped share and energy an
image, in a second table of the report and in the CSV; a machine whose nvidia-smi cannot report them
stops the tool before any run. The fake trainer replays tests/fixtures/bench/ (no window bounds in
its summary lines: every busy sample of the run counts). PyTorch's process runs every rung in one
go: each rung's row gets the samples of its own timed window alone.
"""

import contextlib
import csv
import io
import json
import tempfile
import unittest
from pathlib import Path
from unittest import mock

from tests.python.fakes import FakeMachine, _write_executable
from tests.python.test_bench_arguments import tool_module

from lib import gpu_clocks, runner  # noqa: E402  (bench/ is on sys.path: tests/python/__init__.py)

GPU_SLUG = "nvidia-h100-80gb-hbm3"

# nvidia-smi as sh, so that it prints its first sample before the fake trainer (Python) has started;
# the tools by their paths: the tests' PATH holds the fakes alone.
FAKE_SMI = r'''#!/bin/sh
case "$*" in
  *-L*) echo 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-fake)'; exit 0 ;;
esac
sample() { echo "$(/bin/date '+%Y/%m/%d %H:%M:%S.%3N'), 1890, 710.4, 0x0000000000000004, 100"; }
case "$*" in
  *-lms*) while true; do sample; /bin/sleep 0.05; done ;;
  *) sample ;;
esac
'''


class BenchClocks(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = Path(self._tmp.name)
        self.machine = FakeMachine(self.tmp)
        self.machine.add_binary("train-baseline")
        self.out = self.tmp / "out"

    def tearDown(self):
        self._tmp.cleanup()

    def bench(self, *args):
        return self.machine.run_script("bench.py", "--bin-dir", str(self.machine.bin_dir), "--variants",
                                       "train-baseline", "--runs", "2", "--no-trace", "--no-pytorch",
                                       "--out", str(self.out), *args)

    def csv_rows(self):
        with next(self.out.glob(f"{GPU_SLUG}-*.csv")).open() as f:
            return list(csv.DictReader(f))

    def test_each_row_has_its_clock_power_and_energy_an_image(self):
        _write_executable(self.machine.tools / "nvidia-smi", FAKE_SMI)
        result = self.bench("--clocks")
        self.assertEqual(result.returncode, 0, result.stderr)
        report = next(self.out.glob(f"{GPU_SLUG}-*.md")).read_text()
        self.assertIn("Power (`--clocks`: nvidia-smi every 100 ms through each run;", report)
        # the fixture's two runs: 3,050.4 and 3,012.9 images/s at 710.4 W: 232.9 and 235.8 mJ an image
        self.assertIn("| 128 | train-baseline | 1,890 | 710 | 100% | 234.3 |", report)
        self.assertIn("| 128 | train-baseline | 1,890 | 710 | 100% | 234.3 |", result.stdout)
        rows = self.csv_rows()
        self.assertEqual((rows[0]["sm_mhz"], rows[0]["power_w"], rows[0]["power_capped_pct"], rows[0]["mj_per_image"]),
                         ("1890", "710.4", "100", "234.34"))

    def test_without_clocks_there_is_no_power_table_and_empty_csv_cells(self):
        result = self.bench()
        self.assertEqual(result.returncode, 0, result.stderr)
        report = next(self.out.glob(f"{GPU_SLUG}-*.md")).read_text()
        self.assertNotIn("Power (", report)
        rows = self.csv_rows()
        self.assertEqual((rows[0]["power_w"], rows[0]["mj_per_image"]), ("", ""))

    def test_an_nvidia_smi_that_cannot_report_stops_the_tool_before_any_run(self):
        result = self.bench("--clocks")  # FakeMachine's nvidia-smi answers -L alone
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertEqual(result.stderr.strip().splitlines()[-1][:60],
                         "bench: --clocks: nvidia-smi cannot report timestamp,clocks.sm"[:60])
        self.assertEqual(self.machine.calls(), [], "no binary ran")



class PyTorchRungsClocks(unittest.TestCase):
    def test_each_rung_gets_its_own_windows_samples_and_compiling_counts_for_none(self):
        bench = tool_module("bench")
        args = bench.parse_args(["--pytorch-rungs", "resident-amp-cl-graphs,resident-amp-cl-max-autotune",
                                 "--clocks"])
        labels = ["pytorch: resident-amp-cl-graphs", "pytorch: resident-amp-cl-max-autotune"]
        windows = {labels[0]: (100_000, 101_000), labels[1]: (200_000, 201_000)}  # ms since the epoch
        lines = [json.dumps({"event": "summary", "variant": v, "images_per_s": 1000.0,
                             "window_start_unix_ms": a, "window_end_unix_ms": b}) for v, (a, b) in windows.items()]

        def run(cmd, timeout_s, env=None):
            return runner.RunOutput(0, "\n".join(lines) + "\n", "", timeout_s)

        class Sampler(gpu_clocks.ClockSampler):  # busy throughout: compiling at 300 W, the windows at 600 and 700
            def start(self):
                pass

            def stop(self):
                power = lambda t: 600.0 if 100 <= t <= 101 else 700.0 if 200 <= t <= 201 else 300.0  # noqa: E731
                return [gpu_clocks.Sample(t / 10, 1980, power(t / 10), 0, 100) for t in range(0, 2100, 5)]

        with mock.patch.object(runner, "run", run), contextlib.redirect_stderr(io.StringIO()):
            rows = bench.Bench(args, {}, Sampler("0")).measure_pytorch(256)
        self.assertEqual([(r.variant, r.power_w, r.mj_per_image) for r in rows],
                         [(labels[0], 600.0, 600.0), (labels[1], 700.0, 700.0)])


if __name__ == "__main__":
    unittest.main()
