"""tests/run_tests.py: its Python tally (every failure counts, a subTest's included) and --suites."""
import contextlib
import importlib.util
import io
import unittest

from tests.python import REPO

_spec = importlib.util.spec_from_file_location("run_tests", REPO / "tests" / "run_tests.py")
run_tests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run_tests)


def sample_case():
    # Made here, not at module level, so that discovery does not run its failing tests.
    class _Sample(unittest.TestCase):
        def test_fails_in_one_subtest(self):
            for i in range(3):
                with self.subTest(i=i):
                    self.assertNotEqual(i, 1)

        def test_passes_its_subtests(self):
            for i in range(2):
                with self.subTest(i=i):
                    self.assertGreaterEqual(i, 0)

        def test_fails_plainly(self):
            self.assertEqual(1, 2)

    return _Sample


def tally_of(*names):
    tally = run_tests.Tally()
    sample = sample_case()
    suite = unittest.TestSuite(sample(n) for n in names)
    runner = unittest.TextTestRunner(stream=io.StringIO(),
                                     resultclass=lambda *a, **k: run_tests._Result(*a, tally=tally, **k))
    runner.run(suite)
    return tally


class PythonTally(unittest.TestCase):
    def test_a_failing_subtest_is_a_failure(self):
        t = tally_of("test_fails_in_one_subtest")
        self.assertEqual((t.passed, t.failed), (0, 1))
        self.assertIn("i=1", t.failures[0][1])

    def test_passing_subtests_make_one_pass(self):
        t = tally_of("test_passes_its_subtests")
        self.assertEqual((t.passed, t.failed), (1, 0))

    def test_a_plain_failure_still_counts(self):
        t = tally_of("test_fails_plainly")
        self.assertEqual((t.passed, t.failed), (0, 1))


class Suites(unittest.TestCase):
    def test_all_by_default_in_their_order(self):
        self.assertEqual(run_tests.parse_suites([]), ["gtest", "python", "fuzz"])

    def test_a_subset_runs_in_the_fixed_order(self):
        self.assertEqual(run_tests.parse_suites(["--suites", "fuzz,gtest"]), ["gtest", "fuzz"])
        self.assertEqual(run_tests.parse_suites(["--suites", "python"]), ["python"])

    def test_an_unknown_or_empty_list_is_a_usage_error(self):
        for argv in (["--suites", "gtest,pytest"], ["--suites", ","]):
            with self.subTest(argv=argv), self.assertRaises(SystemExit) as e, \
                    contextlib.redirect_stderr(io.StringIO()) as err:
                run_tests.parse_suites(argv)
            self.assertEqual(e.exception.code, 2)
            self.assertIn("--suites", err.getvalue())


if __name__ == "__main__":
    unittest.main()
