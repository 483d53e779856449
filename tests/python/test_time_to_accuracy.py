"""bench/time_to_accuracy.py: which epoch line gives the time, on given stamped output."""

import sys
import time
import unittest

import time_to_accuracy as tta  # noqa: E402  (bench/ is on sys.path: tests/python/__init__.py)


def epoch(n, acc):
    return f'{{"event": "epoch", "epoch": {n}, "test_acc": {acc}}}'


class FirstAtTarget(unittest.TestCase):
    def test_the_first_epoch_at_or_above_the_target_gives_the_time(self):
        stamped = [(0.5, "data: fashion-mnist ..."), (10.0, epoch(1, 0.90)), (20.0, epoch(2, 0.94)),
                   (30.0, epoch(3, 0.95)), (31.0, '{"event": "summary", "final_test_acc": 0.95}')]
        self.assertEqual(tta.first_at_target(stamped, 0.94, 32.0), tta.Reached(2, 20.0, 0.95, 32.0))

    def test_never_reached_and_bad_lines(self):
        stamped = [(1.0, "{not json"), (2.0, epoch(1, 0.5)), (3.0, '{"event": "epoch", "epoch": 2, "test_acc": null}')]
        self.assertEqual(tta.first_at_target(stamped, 0.94, 4.0), tta.Reached(None, None, None, 4.0))

    def test_run_stamped_stamps_lines_and_stops_a_silent_run_at_the_timeout(self):
        stamped, code, err = tta.run_stamped([sys.executable, "-c", "import sys; print('a'); sys.stderr.write('e'*200000); print('b')"], 30)
        self.assertEqual(([line for _, line in stamped], code, len(err)), (["a", "b"], 0, 200000))
        t0 = time.monotonic()
        stamped, code, _ = tta.run_stamped([sys.executable, "-c", "import time; time.sleep(60)"], 0.5)
        self.assertLess(time.monotonic() - t0, 20)
        self.assertEqual((stamped, code), ([], -9))

    def test_rows(self):
        self.assertEqual(tta.row("bin/train", tta.Reached(15, 61.25, 0.9407, 63.0), 0, ""),
                         "| bin/train | 61.2 | 15 | 94.07% | 63.0 |")
        self.assertIn("not reached", tta.row("b", tta.Reached(None, None, 0.9, 5.0), 0, ""))
        self.assertIn("failed (exit 1): error: x", tta.row("b", tta.Reached(None, None, None, 1.0), 1, "error: x\n"))


if __name__ == "__main__":
    unittest.main()
