"""`nsys stats` CSV -> condensed profile (bench/lib/nsys_summary.py, bench/lib/timeline.py).

The fixtures in tests/fixtures/nsys/ have the columns of Nsight Systems 2024-2025's nvtx_sum,
cuda_gpu_kern_sum, cuda_gpu_mem_time_sum, cuda_api_sum and cuda_gpu_trace reports; the baseline's
headers are unquoted and its NVTX names carry nsys's ":" (empty domain) prefix, the devloss ones are
quoted and plain, and devloss has no cuda_gpu_trace file.
"""

import csv
import unittest

from tests.python import FIXTURES

from lib import nsys_summary, timeline

NSYS = FIXTURES / "nsys"


def summary(variant: str) -> timeline.ProfileSummary:
    return nsys_summary.summarize(NSYS / variant, variant)


class Phases(unittest.TestCase):
    def setUp(self):
        self.base = summary("train-baseline")

    def test_step_ranges_are_added_up_into_one_step_phase(self):
        with open(NSYS / "train-baseline_nvtx_sum.csv") as f:
            steps = [r for r in csv.DictReader(f) if r["Range"].startswith(":step ")]
        self.assertEqual(len(steps), 30)
        step = self.base.phases["step"]
        self.assertEqual(step.count, 30)
        self.assertEqual(step.total_ns, sum(int(r["Total Time (ns)"]) for r in steps))
        self.assertNotIn("step 21", self.base.phases)

    def test_empty_domain_prefix_is_dropped(self):
        self.assertIn("loss stats", self.base.phases)
        self.assertNotIn(":loss stats", self.base.phases)
        with open(NSYS / "train-baseline_nvtx_sum.csv") as f:
            recorded = {r["Range"]: int(r["Total Time (ns)"]) for r in csv.DictReader(f)}
        self.assertEqual(self.base.phases["loss stats"].total_ns, recorded[":loss stats"])

    def test_quoted_headers_parse_the_same(self):
        devloss = summary("train-devloss")
        with open(NSYS / "train-devloss_nvtx_sum.csv") as f:
            recorded = {r["Range"]: int(r["Total Time (ns)"]) for r in csv.DictReader(f)}
        self.assertEqual(devloss.phases["copy batch"].total_ns, recorded["copy batch"])
        self.assertEqual(devloss.step_count, 30)

    def test_dominant_phase_leaves_out_the_enclosing_steps(self):
        self.assertEqual(timeline.dominant_phase(self.base).name, "loss stats")
        self.assertEqual(timeline.dominant_phase(summary("train-devloss")).name, "copy batch")

    def test_where_the_time_goes(self):
        line = timeline.where_the_time_goes(self.base)
        self.assertTrue(line.startswith("where the time goes: loss stats 42% of step time, get batch 28%"), line)
        self.assertIn("host blocked in cudaMemcpy", line)
        self.assertIn("GPU busy 69% of the window", line)


class GpuSide(unittest.TestCase):
    def setUp(self):
        self.base = summary("train-baseline")

    def test_busy_is_the_union_of_the_trace_intervals(self):
        with open(NSYS / "train-baseline_cuda_gpu_trace.csv") as f:
            rows = list(csv.DictReader(f))
        starts = [int(r["Start (ns)"]) for r in rows]
        ends = [int(r["Start (ns)"]) + int(r["Duration (ns)"]) for r in rows]
        self.assertEqual(self.base.window_ns, max(ends) - min(starts))
        # The fixture's activities never overlap (one stream), so the union is the plain sum.
        self.assertEqual(self.base.busy_ns, sum(int(r["Duration (ns)"]) for r in rows))
        self.assertAlmostEqual(self.base.gpu_busy_pct, 68.5, delta=0.1)

    def test_copies_by_direction(self):
        self.assertEqual(self.base.h2d.count, 60)
        with open(NSYS / "train-baseline_cuda_gpu_mem_time_sum.csv") as f:
            ops = {r["Operation"]: int(r["Total Time (ns)"]) for r in csv.DictReader(f)}
        self.assertEqual(self.base.h2d.total_ns, ops["[CUDA memcpy Host-to-Device]"])
        self.assertEqual(self.base.d2h.total_ns, ops["[CUDA memcpy Device-to-Host]"])
        self.assertEqual(self.base.d2h.count, 30)
        self.assertEqual(self.base.other_copies.total_ns, ops["[CUDA memset]"])

    def test_kernels_longest_first(self):
        self.assertTrue(self.base.kernels[0].name.startswith("sm90_xmma_wgrad"))
        self.assertEqual(self.base.kernels[0].count, 90)
        totals = [k.total_ns for k in self.base.kernels]
        self.assertEqual(totals, sorted(totals, reverse=True))

    def test_blocking_calls(self):
        api = {a.name: a for a in self.base.api}
        self.assertEqual(self.base.sync_ns, api["cudaMemcpy"].total_ns + api["cudaStreamSynchronize"].total_ns)

    def test_missing_report_is_a_note(self):
        devloss = summary("train-devloss")
        self.assertEqual(devloss.window_ns, 0)
        self.assertIsNone(devloss.gpu_busy_pct)
        self.assertTrue(any("cuda_gpu_trace" in n for n in devloss.notes))


class CsvDetails(unittest.TestCase):
    def test_preamble_lines_before_the_header_are_skipped(self):
        text = ("NOTICE: Existing SQLite export found: x.sqlite\n"
                "Processing [x.sqlite] with [/opt/nvidia/nsight-systems/2025.3.1/host-linux-x64/reports/nvtx_sum.py]...\n"
                "Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Style,Range\n"
                "60.0,600,2,300.0,300.0,200,400,141.4,PushPop,:forward\n")
        rows = nsys_summary.read_rows(text)
        self.assertEqual(len(rows), 1)
        phases = {}
        nsys_summary.parse_nvtx_sum(rows, phases)
        self.assertEqual((phases["forward"].total_ns, phases["forward"].count), (600, 2))

    def test_other_time_units_are_converted_to_ns(self):
        rows = nsys_summary.read_rows("Time (%),Total Time (us),Instances,Style,Range\n100.0,\"1,500.5\",3,PushPop,step 7\n")
        phases = {}
        nsys_summary.parse_nvtx_sum(rows, phases)
        self.assertEqual(phases["step"].total_ns, 1500500)

    def test_no_table_at_all(self):
        self.assertEqual(nsys_summary.read_rows("SKIPPED: x.sqlite does not contain NV Tools Extension (NVTX) data.\n"), [])

    def test_copy_direction_old_and_new_names(self):
        self.assertEqual(nsys_summary.copy_direction("[CUDA memcpy HtoD]"), "h2d")
        self.assertEqual(nsys_summary.copy_direction("[CUDA memcpy Host-to-Device]"), "h2d")
        self.assertEqual(nsys_summary.copy_direction("[CUDA memcpy DtoH]"), "d2h")
        self.assertEqual(nsys_summary.copy_direction("[CUDA memcpy Device-to-Device]"), "other")
        self.assertEqual(nsys_summary.copy_direction("[CUDA memset]"), "other")

    def test_api_version_suffix(self):
        self.assertEqual(timeline.api_name("cudaMemcpy_v3020"), "cudaMemcpy")
        self.assertEqual(timeline.api_name("cuLaunchKernelEx"), "cuLaunchKernelEx")


class Markdown(unittest.TestCase):
    def test_per_binary_table(self):
        md = timeline.to_markdown(summary("train-baseline"))
        self.assertIn("## train-baseline (nsys, 30 steps)", md)
        self.assertIn("| loss stats | 527.04 | 17.57 | 42.4 | 30 |", md)
        self.assertIn("| busy % (nsys) | 68.5 |", md)
        idle = [line for line in md.splitlines() if line.startswith("| idle in gaps ")]
        self.assertTrue(idle, md)
        idle_ms = sum(float(line.split("|")[2].split("/")[0]) for line in idle)
        self.assertAlmostEqual(idle_ms, float(next(l for l in md.splitlines() if l.startswith("| idle, ms")).split("|")[2]),
                               delta=0.01 * len(idle))
        self.assertIn("| cudaMemcpy (blocks) |", md)
        self.assertEqual(md.count("| sm90_xmma_"), 3)

    def test_the_profiled_rate_line_takes_either_programs_time_per_step(self):
        for run, expected in (({"images_per_s": 69630.0, "ms_per_batch": 3.68}, "69,630 images/s, 3.68 ms per step ("),
                              ({"images_per_s": 15000.0, "ms_per_step": 8.5}, "15,000 images/s, 8.50 ms per step ("),
                              ({"images_per_s": 15000.0}, "15,000 images/s (")):
            s = summary("predict-stream")
            s.run = run
            self.assertIn(f"Under the profiler: {expected}", timeline.to_markdown(s))


if __name__ == "__main__":
    unittest.main()
