"""The images/s table (bench/lib/table.py) against recorded --json output in tests/fixtures/bench/."""

import csv
import io
import unittest

from tests.python import FIXTURES

from lib import table
from lib.runner import RunOutput

BENCH_FIXTURES = FIXTURES / "bench"


def recorded(name: str, returncode: int = 0) -> RunOutput:
    """One recorded run: <name>.jsonl is its stdout, <name>.stderr (if any) its stderr."""
    stderr = BENCH_FIXTURES / f"{name}.stderr"
    return RunOutput(returncode, (BENCH_FIXTURES / f"{name}.jsonl").read_text(),
                     stderr.read_text() if stderr.exists() else "", 900)


def ladder_rows() -> list:
    """The table bench.py would build from the recorded ladder at batch 128."""
    rows = []
    for variant, codes in [("train-baseline", (0, 0, 0)), ("train-devloss", (0, 0, 0)),
                           ("train-pinned", (0, 0, 0)), ("train-autotune", (0, 0, 0)),
                           ("train-fp16", (1,)), ("train-nhwc", (0, 0, 0))]:
        outs = [recorded(f"{variant}.run{i + 1}", rc) for i, rc in enumerate(codes)]
        results = [table.result_of(out) for out in outs]
        trace_file = BENCH_FIXTURES / f"{variant}.trace.jsonl"
        trace = table.result_of(recorded(f"{variant}.trace")) if trace_file.exists() else None
        rows.append(table.build_row(variant, 128, results, trace, table.start_event(outs[0].stdout)))
    return rows


def markdown_rows(markdown: str) -> dict:
    """Table cells by variant name, from the Markdown table."""
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split(" | ")]
    cells = {}
    for line in lines[2:]:
        values = [c.strip() for c in line.strip().strip("|").split(" | ")]
        cells[values[1]] = dict(zip(header, values))
    return cells


class ParseJsonLines(unittest.TestCase):
    def test_skips_plain_lines_broken_json_and_non_objects(self):
        text = 'hello\n{"event": "epoch", "epoch": 1}\n{ not json\n[1, 2]\n42\n  {"event": "summary"}  \n'
        self.assertEqual(table.parse_json_lines(text), [{"event": "epoch", "epoch": 1}, {"event": "summary"}])

    def test_finds_the_summary_among_progress_and_epoch_lines(self):
        found = table.summaries(recorded("train-devloss.run2").stdout)
        self.assertEqual(len(found), 1)
        self.assertEqual(found[0]["variant"], "train-devloss")
        self.assertEqual(found[0]["images_per_s"], 3502.5)


class FailureReasons(unittest.TestCase):
    def test_non_zero_exit_gives_the_last_stderr_line(self):
        reason = table.failure_reason(recorded("train-fp16.run1", returncode=1))
        self.assertTrue(reason.startswith("error: cuDNN CUDNN_STATUS_EXECUTION_FAILED"), reason)

    def test_timeout(self):
        self.assertEqual(table.failure_reason(RunOutput(None, "", "", 900)), "timed out after 900 s")

    def test_exit_zero_without_summary_line(self):
        reason = table.failure_reason(recorded("train-autotune.run2"))
        self.assertIn("no summary line", reason)

    def test_good_run_has_no_failure(self):
        self.assertIsNone(table.failure_reason(recorded("train-baseline.run1")))

    def test_exit_code_when_stderr_is_empty(self):
        self.assertEqual(table.failure_reason(RunOutput(139, "", "", 900)), "exit code 139")


class Rows(unittest.TestCase):
    def setUp(self):
        self.rows = {r.variant: r for r in ladder_rows()}

    def test_median_min_max_of_three_runs(self):
        base = self.rows["train-baseline"]
        self.assertEqual(base.images_per_s, [3050.4, 3012.9, 3071.2])
        self.assertAlmostEqual(base.median, 3050.4)
        self.assertEqual(table.images_cell(base), "3,050 (3,013–3,071)")

    def test_speedup_is_over_the_baseline_median(self):
        devloss = self.rows["train-devloss"]
        self.assertAlmostEqual(table.speedup(devloss, list(self.rows.values())), 3480.0 / 3050.4)
        self.assertAlmostEqual(table.speedup(self.rows["train-baseline"], list(self.rows.values())), 1.0)

    def test_gpu_busy_comes_from_the_trace_run_only(self):
        self.assertEqual(self.rows["train-baseline"].gpu_busy_pct, 61.2)
        self.assertIsNone(self.rows["train-pinned"].gpu_busy_pct)  # null in its trace run

    def test_failed_binary_is_a_row_that_says_so(self):
        fp16 = self.rows["train-fp16"]
        self.assertTrue(fp16.failed)
        self.assertTrue(table.images_cell(fp16).startswith("failed: error: cuDNN CUDNN_STATUS_EXECUTION_FAILED"))
        self.assertIsNone(table.speedup(fp16, list(self.rows.values())))

    def test_one_failed_run_of_three_is_a_note_not_a_failed_row(self):
        autotune = self.rows["train-autotune"]
        self.assertFalse(autotune.failed)
        self.assertEqual(autotune.images_per_s, [6410.0, 6388.2])
        self.assertIn("1 of 3 runs failed", autotune.notes[0])

    def test_missing_and_null_fields(self):
        pinned = self.rows["train-pinned"]
        self.assertIsNone(pinned.peak_gpu_mem_mb)
        self.assertIsNone(pinned.data_stall_pct)
        # ms_per_step is missing from these summaries: derived from batch and images/s instead.
        self.assertAlmostEqual(pinned.ms_per_step, 1000 * 128 / 5990.0)

    def test_summary_without_images_per_s_fails_the_run(self):
        row = table.build_row("train-x", 128, [{"event": "summary", "variant": "train-x", "ms_per_step": 5.0}])
        self.assertTrue(row.failed)
        self.assertEqual(row.failures, ["summary line has no images_per_s"])

    def test_no_baseline_means_no_speedup(self):
        rows = [r for r in self.rows.values() if r.variant != "train-baseline"]
        self.assertIsNone(table.speedup(rows[0], rows))

    def test_speedup_compares_within_the_same_batch(self):
        base256 = table.build_row("train-baseline", 256, [{"images_per_s": 4000.0}])
        dev128 = self.rows["train-devloss"]
        rows = [base256, dev128]
        self.assertIsNone(table.speedup(dev128, rows))


class Markdown(unittest.TestCase):
    def setUp(self):
        self.rows = ladder_rows()
        self.markdown = table.markdown_table(self.rows)
        self.cells = markdown_rows(self.markdown)

    def test_every_line_has_every_column(self):
        lines = [line for line in self.markdown.splitlines() if line.startswith("|")]
        self.assertEqual(len(lines), 2 + 6)
        widths = {line.replace("\\|", "").count("|") for line in lines}
        self.assertEqual(widths, {len(table.COLUMNS) + 1})

    def test_cells(self):
        self.assertEqual(self.cells["train-devloss"]["speedup"], "1.14x")
        self.assertEqual(self.cells["train-baseline"]["optimizations"], "none")
        self.assertEqual(self.cells["train-nhwc"]["optimizations"], "devloss, pinned, autotune, fp16, nhwc")
        self.assertEqual(self.cells["train-baseline"]["GPU busy %"], "61.2")
        self.assertEqual(self.cells["train-pinned"]["peak GPU MB"], table.MISSING)
        self.assertEqual(self.cells["train-baseline"]["peak GPU MB"], "6,210")
        self.assertTrue(self.cells["train-fp16"]["images/s median (min–max)"].startswith("failed: error: cuDNN"))
        # From its start line: the binary died before any summary.
        self.assertEqual(self.cells["train-fp16"]["optimizations"], "devloss, pinned, autotune, fp16")
        self.assertEqual(self.cells["train-fp16"]["speedup"], table.MISSING)

    def test_pipes_in_an_error_message_do_not_break_the_table(self):
        row = table.build_row("train-x", 128, ["error: bad | worse\nand more"])
        line = table.markdown_table([row]).splitlines()[2]
        self.assertIn("bad \\| worse and more", line)

    def test_report_names_gpu_cudnn_date_and_command(self):
        report = table.report_markdown(self.rows, "python3 bench/bench.py --runs 3", "NVIDIA H100 80GB HBM3",
                                       "2026-11-21", "data synthetic")
        self.assertIn("cuDNN: 9.14.0", report)
        self.assertIn("`python3 bench/bench.py --runs 3`", report)
        self.assertIn("2026-11-21", report)
        self.assertIn("GPU: NVIDIA H100 80GB HBM3", report)


class Csv(unittest.TestCase):
    def test_round_trip(self):
        rows = list(csv.DictReader(io.StringIO(table.csv_text(ladder_rows()))))
        by_variant = {r["variant"]: r for r in rows}
        self.assertEqual(len(rows), 6)
        self.assertEqual(by_variant["train-baseline"]["images_per_s_median"], "3050.4")
        self.assertEqual(by_variant["train-baseline"]["images_per_s_min"], "3012.9")
        self.assertEqual(by_variant["train-devloss"]["speedup"], f"{3480.0 / 3050.4:.3f}")
        self.assertEqual(by_variant["train-fp16"]["status"], "failed")
        self.assertIn("CUDNN_STATUS_EXECUTION_FAILED", by_variant["train-fp16"]["error"])
        self.assertEqual(by_variant["train-pinned"]["peak_gpu_mem_mb"], "")
        self.assertEqual(by_variant["train-autotune"]["runs_ok"], "2")


class PytorchRows(unittest.TestCase):
    VARIANTS = ["pytorch: baseline", "pytorch: compile", "pytorch: resident-amp-cl-graphs"]

    def test_rows_from_one_recorded_run_of_every_rung(self):
        out = RunOutput(0, (BENCH_FIXTURES / "pytorch-reference.h200.jsonl").read_text(), "", 900)
        rows = table.rows_from_multi_variant([out], self.VARIANTS, 128)
        self.assertEqual([r.variant for r in rows], self.VARIANTS)
        self.assertFalse(any(r.failed for r in rows))
        graphs = rows[2]
        self.assertGreater(graphs.median, 10000)
        self.assertIn("compile:reduce-overhead", graphs.optimizations)

    def test_a_broken_rung_and_a_run_that_died_early(self):
        lines = (BENCH_FIXTURES / "pytorch-reference.h200.jsonl").read_text().splitlines()
        broken = [line for line in lines if '"pytorch: baseline"' in line]
        broken.append('{"event": "rung_failed", "variant": "pytorch: compile", '
                      '"error": "BackendCompilerFailed: backend=\'inductor\' raised: no C compiler"}')
        out = RunOutput(1, "\n".join(broken), "Segmentation fault (core dumped)\n", 900)
        rows = {r.variant: r for r in table.rows_from_multi_variant([out], self.VARIANTS, 128)}
        self.assertFalse(rows["pytorch: baseline"].failed)
        self.assertIn("BackendCompilerFailed", table.images_cell(rows["pytorch: compile"]))
        self.assertEqual(table.images_cell(rows["pytorch: resident-amp-cl-graphs"]),
                         "failed: Segmentation fault (core dumped)")


class Numbers(unittest.TestCase):
    def test_number_rejects_what_is_not_a_finite_number(self):
        for value in (None, "12", True, float("nan"), float("inf"), [1]):
            self.assertIsNone(table.number(value), value)
        self.assertEqual(table.number(3), 3.0)

    def test_cudnn_versions(self):
        self.assertEqual(table.cudnn_version(91400), "9.14.0")
        self.assertEqual(table.cudnn_version(90100), "9.1.0")
        self.assertEqual(table.cudnn_version(8907), "8.9.7")
        self.assertEqual(table.cudnn_version(None), table.MISSING)


if __name__ == "__main__":
    unittest.main()
