"""The built-in --trace Chrome JSON -> condensed profile (bench/lib/trace_summary.py).

tests/fixtures/bench/train-baseline.trace.json is laid out as include/measure/trace.h describes the
trainer's file: a "CPU" process (NVTX phases and CUDA API calls per thread) and a "GPU 0" process
(kernels, copies per stream), times in microseconds. Two 1 ms steps; per step the GPU is busy
[320, 340) copying, [360, 950) computing (a second stream's kernel at [500, 600) overlaps), and
[960, 962) copying back, so 612 us of 1642 us in the window over both steps.
"""

import json
import tempfile
import unittest
from pathlib import Path

from tests.python import FIXTURES

from lib import timeline, trace_summary

TRACE = FIXTURES / "bench" / "train-baseline.trace.json"


class TraceSummary(unittest.TestCase):
    def setUp(self):
        self.s = trace_summary.summarize(TRACE, "train-baseline", run={"gpu_busy_pct": 74.5})

    def test_busy_is_the_union_over_the_window(self):
        self.assertEqual(self.s.busy_ns, 2 * 612_000)
        self.assertEqual(self.s.window_ns, 1_642_000)
        self.assertAlmostEqual(self.s.gpu_busy_pct, 100 * 1224 / 1642)
        self.assertEqual(self.s.trace_busy_pct, 74.5)  # the trainer's own figure, kept to compare

    def test_phases_including_a_begin_end_pair(self):
        self.assertEqual(self.s.phases["step"].count, 2)
        self.assertEqual(self.s.phases["optimizer step"].total_ns, 100_000)
        self.assertEqual(self.s.phases["optimizer step"].count, 2)
        self.assertEqual(self.s.phases["loss stats"].total_ns, 680_000)

    def test_api_calls_are_not_phases(self):
        self.assertNotIn("cudaStreamSynchronize", self.s.phases)
        self.assertEqual({a.name for a in self.s.api}, {"cudaStreamSynchronize", "cudaMemcpyAsync", "cudaLaunchKernel"})

    def test_blocking_time_is_charged_to_the_phase_that_waited(self):
        self.assertEqual(self.s.phase_wait_ns, {"loss stats": 650_000})
        line = timeline.where_the_time_goes(self.s)
        self.assertTrue(line.startswith("where the time goes: loss stats 34% of step time (waiting on the GPU)"), line)

    def test_dominant_phase_is_a_step_phase_not_the_loader_thread(self):
        self.assertIn("loader work", self.s.phases)
        self.assertEqual(timeline.dominant_phase(self.s).name, "loss stats")

    def test_kernels_and_copies(self):
        self.assertEqual(self.s.kernels[0].name, "conv_bwd_kernel(float const*, float*, int)")
        self.assertEqual(len(self.s.kernels), 4)
        self.assertEqual((self.s.h2d.count, self.s.h2d.total_ns), (2, 40_000))
        self.assertEqual((self.s.d2h.count, self.s.d2h.total_ns), (2, 4_000))

    def test_numbered_ranges_are_one_phase(self):
        self.assertEqual(timeline.range_name("step 130"), "step")
        self.assertEqual(timeline.range_name("fill batch 2"), "fill batch")
        self.assertEqual(timeline.range_name(":loss stats"), "loss stats")
        self.assertEqual(timeline.range_name("forward"), "forward")

    @staticmethod
    def summarize_events(events):
        """The summary of a trace file holding `events` (Chrome trace events, in µs)."""
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "t.json"
            path.write_text(json.dumps(events))
            return trace_summary.summarize(path, "v")

    def test_plain_event_list_without_process_names(self):
        s = self.summarize_events([{"ph": "X", "name": "k", "cat": "kernel", "ts": 0, "dur": 10},
                                   {"ph": "X", "name": "k", "cat": "kernel", "ts": 5, "dur": 10},
                                   {"ph": "X", "name": "forward", "cat": "nvtx", "ts": 0, "dur": 30}])
        self.assertEqual((s.busy_ns, s.window_ns), (15_000, 15_000))
        self.assertEqual(list(s.phases), ["forward"])

    def test_a_graph_builds_step_graph_is_a_step_phase(self):
        # A step replayed as a CUDA graph: its kernels run under the one launch in "step graph".
        s = self.summarize_events([{"ph": "X", "name": "step 40", "cat": "nvtx", "ts": 0, "dur": 100},
                                   {"ph": "X", "name": "copy batch", "cat": "nvtx", "ts": 0, "dur": 10},
                                   {"ph": "X", "name": "step graph", "cat": "nvtx", "ts": 10, "dur": 60},
                                   {"ph": "X", "name": "loss stats", "cat": "nvtx", "ts": 70, "dur": 30},
                                   {"ph": "X", "name": "k", "cat": "kernel", "ts": 12, "dur": 80}])
        self.assertEqual(timeline.dominant_phase(s).name, "step graph")
        self.assertTrue(timeline.where_the_time_goes(s).startswith("where the time goes: step graph 60% of step time"),
                        timeline.where_the_time_goes(s))
        self.assertIn("| step graph |", timeline.to_markdown(s))
        self.assertNotIn("step graph (other range)", timeline.to_markdown(s))


if __name__ == "__main__":
    unittest.main()
