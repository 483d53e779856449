"""GPU busy %: the union of activity intervals over the window (bench/lib/timeline.py).

The same definition as the trainer's built-in trace (include/measure/trace.h), so overlapping kernels on
two streams must count once and gaps must not count at all.
"""

import unittest

from lib import timeline  # bench/lib/, found through bench/, which tests/python/__init__.py puts on the import path


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


class IdleByGapLength(unittest.TestCase):
    def test_each_gap_lands_in_its_class(self):
        # gaps: 1,000 ns (< 2 µs), 5,000 (2-10 µs), 50,000 (10-100 µs), 500,000 (0.1-1 ms), 2,000,000 (>= 1 ms)
        ends = [(0, 10)]
        for gap in (1_000, 5_000, 50_000, 500_000, 2_000_000):
            start = ends[-1][1] + gap
            ends.append((start, start + 10))
        classes = timeline.idle_by_gap_length(ends)
        self.assertEqual([c.name for c in classes], [label for _, label in timeline.GAP_CLASSES])
        self.assertEqual([(c.total_ns, c.count) for c in classes],
                         [(1_000, 1), (5_000, 1), (50_000, 1), (500_000, 1), (2_000_000, 1)])

    def test_class_limits_belong_to_the_longer_class(self):
        # a gap of exactly 2,000 ns is "2-10 µs", one of exactly 10,000 ns is "10-100 µs"
        classes = timeline.idle_by_gap_length([(0, 1), (2_001, 2_002), (12_002, 12_003)])
        self.assertEqual([c.count for c in classes], [0, 1, 1, 0, 0])

    def test_overlaps_are_not_gaps_and_the_classes_add_up_to_the_idle_time(self):
        intervals = [(100, 300), (250, 400), (500, 600), (580, 590), (3_000, 3_100), (3_100, 3_200)]
        classes = timeline.idle_by_gap_length(intervals)
        busy, window = timeline.busy_and_window_ns(intervals)
        self.assertEqual(sum(c.total_ns for c in classes), window - busy)
        self.assertEqual(sum(c.count for c in classes), 2)  # 400->500 and 600->3,000; touching ones join

    def test_nothing_or_one_activity_has_no_gaps(self):
        for intervals in ([], [(5, 9)], [(5, 9), (7, 8)]):
            self.assertEqual(sum(c.count for c in timeline.idle_by_gap_length(intervals)), 0)


if __name__ == "__main__":
    unittest.main()
