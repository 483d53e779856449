"""GPU busy %: the union of activity intervals over the window (bench/timeline.py).

The same definition as the trainer's built-in trace (include/trace.h), so overlapping kernels on
two streams must count once and gaps must not count at all.
"""

import unittest

import timeline  # found through bench/, which tests/python/__init__.py puts on the import path


class IntervalUnion(unittest.TestCase):
    def test_disjoint(self):
        self.assertEqual(timeline.interval_union_ns([(0, 10), (20, 25)]), 15)

    def test_overlapping_counts_once(self):
        self.assertEqual(timeline.interval_union_ns([(0, 10), (5, 15)]), 15)

    def test_nested(self):
        self.assertEqual(timeline.interval_union_ns([(0, 100), (10, 20), (30, 40)]), 100)

    def test_touching_intervals_merge_without_double_counting(self):
        self.assertEqual(timeline.interval_union_ns([(0, 10), (10, 20)]), 20)

    def test_unsorted_input(self):
        self.assertEqual(timeline.interval_union_ns([(50, 60), (0, 10), (5, 12), (55, 70)]), 32)

    def test_chain_of_overlaps(self):
        self.assertEqual(timeline.interval_union_ns([(0, 4), (3, 8), (7, 12), (20, 21)]), 13)

    def test_empty_and_zero_length(self):
        self.assertEqual(timeline.interval_union_ns([]), 0)
        self.assertEqual(timeline.interval_union_ns([(5, 5), (7, 7)]), 0)


class BusyAndWindow(unittest.TestCase):
    def test_two_streams(self):
        # stream A: [100, 300) and [500, 600); stream B: [250, 400) overlaps A's first kernel.
        busy, window = timeline.busy_and_window_ns([(100, 300), (500, 600), (250, 400)])
        self.assertEqual((busy, window), (400, 500))

    def test_nothing_recorded(self):
        self.assertEqual(timeline.busy_and_window_ns([]), (0, 0))

    def test_percent_in_summary(self):
        s = timeline.ProfileSummary("v", "nsys", busy_ns=400, window_ns=500)
        self.assertAlmostEqual(s.gpu_busy_pct, 80.0)
        self.assertIsNone(timeline.ProfileSummary("v", "nsys").gpu_busy_pct)


if __name__ == "__main__":
    unittest.main()
