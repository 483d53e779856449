"""bench/bench.py --clocks against a fake nvidia-smi that reports the GPU busy and power-capped at a
fixed clock and power: every row of a timed binary gets its clock, power, capped share and energy an
image, in a second table of the report and in the CSV; a machine whose nvidia-smi cannot report them
stops the tool before any run. The fake trainer replays tests/fixtures/bench/ (no window bounds in
its summary lines: every busy sample of the run counts).
"""

import csv
import tempfile
import unittest
from pathlib import Path

from tests.python.fakes import FakeMachine, _write_executable

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


if __name__ == "__main__":
    unittest.main()
