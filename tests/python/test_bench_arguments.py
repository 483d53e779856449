"""Bad input to the bench tools as a user gives it: a usage error (exit 2) or one line and exit 1, before
any run where it can be known then; never a traceback, a hang, or a good result overwritten by a run
that produced nothing. Ctrl-C is one line, exit 130, with no child left running.
"""

import contextlib
import importlib.util
import io
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path
from unittest import mock

from tests.python import BENCH, FIXTURES
from tests.python.fakes import FakeMachine, _write_executable, popen_interruptible
from tests.python.test_bench_predict import add_predict_machine

import kernel_kinds  # noqa: E402  (bench/ is on sys.path: tests/python/__init__.py)
from lib import nsys_summary, runner  # noqa: E402

GPU_SLUG = "nvidia-h100-80gb-hbm3"  # the fake nvidia-smi's GPU

# A binary that records its pid and sleeps: what Ctrl-C interrupts.
SLEEPER = r'''
import os, sys, time
from pathlib import Path
Path({pid_file!r}).write_text(str(os.getpid()))
time.sleep(120)
'''


def tool_module(name):
    """bench/<name>.py as a module of its own name, whatever sys.modules holds: bench/profile.py's name
    is also the standard library's profiler's."""
    spec = importlib.util.spec_from_file_location(f"bench_tool_{name}", BENCH / f"{name}.py")
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # (a dataclass looks itself up there)
    spec.loader.exec_module(module)
    return module


class BenchTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = Path(self._tmp.name)
        self.machine = FakeMachine(self.tmp)
        self.out = self.tmp / "out"

    def tearDown(self):
        self._tmp.cleanup()

    def run_tool(self, script, *args):
        return self.machine.run_script(script, "--bin-dir", str(self.machine.bin_dir), *args)

    def assertRefused(self, result, code, fragment):
        """Exit `code`, no traceback, and the last stderr line (the only one, but for argparse's usage
        line) says what was wrong."""
        self.assertEqual(result.returncode, code, result.stderr)
        self.assertNotIn("Traceback", result.stderr)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        self.assertIn(fragment, lines[-1])
        if lines[0].startswith("usage:"):  # argparse's usage (however many lines it wraps to), then the error
            self.assertIn(": error: ", lines[-1])
            self.assertEqual(sum(": error: " in line for line in lines), 1, result.stderr)
        else:
            self.assertEqual(len(lines), 1, result.stderr)


# Each tool with the arguments it needs to get as far as its --timeout check.
TOOLS = {"bench.py": [], "bench_predict.py": [], "profile.py": [], "profile_check.py": [], "scaling.py": [],
         "profile_ranks.py": ["--gpus", "1"], "folder_bench.py": ["--data-dir", "."]}


class Timeout(BenchTest):
    def test_every_tool_refuses_a_timeout_that_is_not_a_positive_number(self):
        for script, args in [*TOOLS.items(), ("time_to_accuracy.py", [])]:
            for timeout in ("-1", "0", "nan", "inf"):
                with self.subTest(script=script, timeout=timeout):
                    extra = [sys.executable] if script == "time_to_accuracy.py" else ["--bin-dir", "."]
                    result = self.machine.run_script(script, *args, f"--timeout={timeout}", *extra)
                    self.assertRefused(result, 2, f"--timeout must be a positive number of seconds, not {timeout}")
        self.assertEqual(self.machine.calls(), [])


class ArgumentsBeforeTheGpu(BenchTest):
    """Every argument a tool can check alone is checked before it looks for a GPU: `bench.py --variants
    nosuch` answered "no CUDA GPU on this machine", which sends a user to the wrong machine."""

    def setUp(self):
        super().setUp()
        (self.tmp / "no-gpu").mkdir()
        self.machine = FakeMachine(self.tmp / "no-gpu", gpu=False)

    def test_a_bad_argument_is_a_usage_error_on_a_machine_without_a_gpu(self):
        cases = [("bench.py", ["--variants", "nosuch"], "--variants: no binary 'train-nosuch': the ladder is baseline, "
                                                        "devloss"),
                 ("bench.py", ["--variants", "baseline,nosuch"], "no binary 'train-nosuch'"),
                 ("bench.py", ["--warmup-steps", "-1"], "--warmup-steps must be at least 0, not -1"),
                 ("bench.py", ["--data", "bogus"], "argument --data: invalid choice: 'bogus'"),
                 ("bench_predict.py", ["--variants", "nosuch"], "--variants: no binary 'predict-nosuch'"),
                 ("profile.py", ["--variants", "nosuch"], "--variants: no binary 'train-nosuch'"),
                 ("profile.py", ["--program", "predict", "--variants", "nosuch"], "no binary 'predict-nosuch'"),
                 ("scaling.py", ["--variants", "nosuch"], "--variants: no binary 'train-nosuch'"),
                 ("scaling.py", ["--warmup-steps", "-1"], "--warmup-steps must be at least 0"),
                 ("profile_ranks.py", ["--gpus", "1", "--binary", "nosuch"], "--binary: no binary 'nosuch'"),
                 ("profile_ranks.py", ["--gpus", "1", "--batch", "0"], "--batch must be at least 1, not 0"),
                 ("profile_check.py", ["--base", "nosuch"], "--base: no binary 'train-nosuch'"),
                 ("profile_check.py", ["--next", "nosuch"], "--next: no binary 'train-nosuch'"),
                 ("profile_check.py", ["--min-speedup", "nan"], "--min-speedup must be a positive number, not nan"),
                 ("profile_check.py", ["--batch", "0"], "--batch must be at least 1"),
                 ("profile_check.py", ["--data", "bogus"], "argument --data: invalid choice: 'bogus'"),
                 ("folder_bench.py", ["--data-dir", "nowhere"], "--data-dir nowhere: not a directory"),
                 ("folder_bench.py", ["--data-dir", ".", "--image-size", "12"], "--image-size must be a multiple of 8"),
                 ("folder_bench.py", ["--data-dir", ".", "--batch", "1"], "--batch must be at least 2")]
        for script, args, fragment in cases:
            with self.subTest(script=script, args=args):
                result = self.run_tool(script, *args)
                self.assertRefused(result, 2, fragment)
                self.assertNotIn(runner.NO_GPU_LINE, result.stderr)
        self.assertEqual(self.machine.calls(), [])

    def test_a_binary_of_make_custom_is_a_variant_once_built(self):
        self.machine.add_binary("train-mine")
        self.assertRefused(self.run_tool("bench.py", "--variants", "mine", "--no-pytorch"), 2, runner.NO_GPU_LINE)
        self.assertRefused(self.run_tool("profile_check.py", "--base", "mine", "--next", "fp32-nhwc"), 2,
                           runner.NO_GPU_LINE)


class UnwritableOutput(BenchTest):
    def test_an_out_that_cannot_take_files_stops_before_any_run(self):
        a_file = self.tmp / "a-file"
        a_file.write_text("")
        self.machine.add_binary("train-baseline")
        add_predict_machine(self.machine)
        _write_executable(self.tmp / "prog", "#!/bin/sh\nexit 0\n")
        runs = [("bench.py", ["--variants", "baseline", "--no-pytorch", "--out"]),
                ("bench_predict.py", ["--variants", "baseline", "--out"]),
                ("scaling.py", ["--variants", "baseline", "--gpus", "1", "--out"]),
                ("profile.py", ["--variants", "baseline", "--no-nsys", "--results"]),
                ("profile.py", ["--variants", "baseline", "--no-nsys", "--out"])]
        for script, args in runs:
            for out, why in ((a_file, "not a directory"), (a_file / "sub", "cannot create the directory")):
                with self.subTest(script=script, flag=args[-1], out=out):
                    self.assertRefused(self.run_tool(script, *args, str(out)), 2, f"{args[-1]} {out}: {why}")
        for out in (a_file, a_file / "sub"):
            result = self.machine.run_script("time_to_accuracy.py", "--out", str(out), str(self.tmp / "prog"))
            self.assertRefused(result, 2, f"--out {out}:")
        self.assertEqual(self.machine.calls(), [])

    def test_a_failed_write_at_the_end_is_one_line_and_exit_1(self):
        a_file = self.tmp / "a-file"
        a_file.write_text("")
        err = io.StringIO()
        with contextlib.redirect_stderr(err), self.assertRaises(SystemExit) as e:
            runner.write_files("tool", {a_file / "x.md": "text"})
        self.assertEqual(e.exception.code, 1)
        self.assertEqual(err.getvalue(), f"tool: cannot write {a_file / 'x.md'}: Not a directory\n")


class NothingToWrite(BenchTest):
    def test_bench_predict_with_every_run_failed_keeps_the_earlier_results(self):
        add_predict_machine(self.machine)
        _write_executable(self.machine.bin_dir / "predict-baseline", "#!/bin/sh\necho 'error: out of memory' >&2\nexit 1\n")
        self.out.mkdir()
        earlier = [self.out / f"predict-{GPU_SLUG}-{runner.today()}.{ext}" for ext in ("md", "csv")]
        for path in earlier:
            path.write_text("a good earlier result\n")
        result = self.run_tool("bench_predict.py", "--variants", "baseline", "--runs", "1", "--out", str(self.out))
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertNotIn("Traceback", result.stderr)  # after the progress lines, one saying why
        self.assertEqual(result.stderr.splitlines()[-1], "bench-predict: every run failed (the last: error: out of "
                                                          "memory); no results written")
        self.assertEqual([p.read_text() for p in earlier], ["a good earlier result\n"] * 2)

    def test_no_variant_is_a_usage_error(self):
        for script in ("bench_predict.py", "profile.py", "scaling.py"):
            for spec in ("", ",,"):
                with self.subTest(script=script, spec=spec):
                    self.assertRefused(self.run_tool(script, "--variants", spec), 2, "--variants")
        self.assertEqual(self.machine.calls(), [])

    def test_profile_that_captured_nothing_keeps_the_earlier_report(self):
        self.machine.add_binary("train-fp16")  # its recording fails (a cuDNN error)
        self.out.mkdir()
        earlier = self.out / f"profiles-{GPU_SLUG}-{runner.today()}.md"
        earlier.write_text("a good earlier report\n")
        result = self.run_tool("profile.py", "--variants", "fp16", "--no-nsys", "--results", str(self.out),
                               "--out", str(self.tmp / "raw"))
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertNotIn("Traceback", result.stderr)
        self.assertIn("profile: no profile captured anything", result.stderr.splitlines()[-1])
        self.assertEqual(earlier.read_text(), "a good earlier report\n")

    def test_profile_keeps_an_earlier_per_variant_report_for_a_variant_that_captured_nothing(self):
        self.machine.add_binary("train-baseline")
        self.machine.add_binary("train-fp16")  # its recording fails (a cuDNN error)
        raw = self.tmp / "raw"
        raw.mkdir()
        earlier = raw / "train-fp16.md"
        for variants, code in (("fp16", 1), ("baseline,fp16", 0)):
            earlier.write_text("a good earlier report\n")
            with self.subTest(variants=variants):
                result = self.run_tool("profile.py", "--variants", variants, "--no-nsys", "--results", str(self.out),
                                       "--out", str(raw))
                self.assertEqual(result.returncode, code, result.stderr)
                self.assertNotIn("Traceback", result.stderr)
                self.assertEqual(earlier.read_text(), "a good earlier report\n")
        self.assertIn("built-in trace", (raw / "train-baseline.md").read_text())
        self.assertIn("(none for train-fp16: nothing captured)", result.stderr.splitlines()[-1])
        self.assertIn("| train-fp16 |", next(self.out.glob("profiles-*.md")).read_text())

    def test_profile_step_counts(self):
        for args in (["--batch", "0"], ["--profile-steps", "0"], ["--warmup-steps", "-1"]):
            with self.subTest(args=args):
                self.assertRefused(self.run_tool("profile.py", *args), 2, "must be at least")


class BadCells(BenchTest):
    def test_a_bad_number_in_an_nsys_csv_is_a_note_naming_the_file(self):
        for path in (FIXTURES / "nsys").glob("train-devloss_*.csv"):
            shutil.copy(path, self.tmp / path.name)
        nvtx = self.tmp / "train-devloss_nvtx_sum.csv"
        nvtx.write_text(nvtx.read_text().replace("368550102", "52703x448", 1))
        summary = nsys_summary.summarize(self.tmp / "train-devloss", "train-devloss")
        self.assertTrue(any(n.startswith("train-devloss_nvtx_sum.csv: '52703x448' is not a number")
                            for n in summary.notes), summary.notes)
        self.assertTrue(summary.kernels)  # the other reports still count

    def test_a_bad_cell_in_the_last_row_leaves_none_of_its_report_in_the_summary(self):
        for path in (FIXTURES / "nsys").glob("train-baseline_*.csv"):
            shutil.copy(path, self.tmp / path.name)
        for report, good, bad in (("nvtx_sum", "26878226", "26878x226"), ("cuda_gpu_mem_time_sum", ",63000,", ",63x00,")):
            path = self.tmp / f"train-baseline_{report}.csv"
            lines = path.read_text().splitlines()
            self.assertIn(good, lines[-1])
            path.write_text("\n".join(lines[:-1] + [lines[-1].replace(good, bad)]) + "\n")
        summary = nsys_summary.summarize(self.tmp / "train-baseline", "train-baseline")
        for report in ("nvtx_sum", "cuda_gpu_mem_time_sum"):
            self.assertTrue(any(n.startswith(f"train-baseline_{report}.csv: ") and n.endswith("is left out")
                                for n in summary.notes), summary.notes)
        self.assertEqual(summary.phases, {})  # not the rows before the bad one
        self.assertEqual([(c.total_ns, c.count) for c in (summary.h2d, summary.d2h, summary.other_copies)], [(0, 0)] * 3)
        self.assertTrue(summary.kernels and summary.api and summary.window_ns)  # the other reports still count

    def test_kernel_kinds_names_the_file_with_a_bad_cell(self):
        source = FIXTURES / "nsys" / "kinds-train_cuda_gpu_kern_sum.csv"
        header, first, *rest = source.read_text().splitlines()
        cells = first.split(",")
        for bad in ("inf", "52703x448"):
            cells[1] = bad  # Total Time (ns)
            path = self.tmp / f"{bad}.csv"
            path.write_text("\n".join([header, ",".join(cells), *rest]) + "\n")
            err = io.StringIO()
            with self.subTest(cell=bad), contextlib.redirect_stderr(err):
                self.assertEqual(kernel_kinds.main(["--steps", "100", f"x={path}"]), 1)
                self.assertEqual(err.getvalue(), f"kernel_kinds: {path}: {bad!r} is not a number\n")


class TimeToAccuracyArguments(BenchTest):
    def test_missing_or_non_executable_binary_is_a_usage_error(self):
        not_executable = self.tmp / "not-executable"
        not_executable.write_text("")
        for binary in (self.tmp / "missing", not_executable):
            with self.subTest(binary=binary):
                result = self.machine.run_script("time_to_accuracy.py", "--out", str(self.out), str(binary))
                self.assertRefused(result, 2, f"{binary} is not an executable file")
        self.assertFalse(self.out.exists())

    def test_target_must_be_an_accuracy(self):
        for target in ("nan", "inf", "-1", "0", "1.5"):
            with self.subTest(target=target):
                result = self.machine.run_script("time_to_accuracy.py", f"--target={target}", sys.executable)
                self.assertRefused(result, 2, "--target must be a test accuracy above 0 and at most 1")


class ListsAndFlags(BenchTest):
    def test_bench_pytorch_flags_are_checked_before_any_run(self):
        self.machine.add_binary("train-baseline")
        for args, fragment in ((["--pytorch-rungs", "bogus"], "--pytorch-rungs"),
                               (["--pytorch-runs", "0"], "must be at least 1"),
                               (["--pytorch-runs=-1"], "must be at least 1")):
            with self.subTest(args=args):
                self.assertRefused(self.run_tool("bench.py", "--variants", "baseline", *args), 2, fragment)
        self.assertEqual(self.machine.calls(), [])

    def test_empty_and_repeated_list_items_are_usage_errors(self):
        for script, args, fragment in (("bench.py", ["--batch", "128,,256"], "--batch '128,,256' has an empty item"),
                                       ("scaling.py", ["--gpus", "1,,1"], "--gpus '1,,1' has an empty item"),
                                       ("scaling.py", ["--gpus", "1,1"], "--gpus '1,1' names 1 twice"),
                                       ("scaling.py", ["--gpus", "1,x"], "--gpus: 'x' is not a valid item")):
            with self.subTest(script=script, args=args):
                self.assertRefused(self.run_tool(script, *args), 2, fragment)

    def test_an_empty_or_repeated_variant_is_a_usage_error(self):
        # Each tool with two of its variants and the binary name the first one stands for.
        for script, args, (a, b, name) in (("bench.py", [], ("baseline", "devloss", "train-baseline")),
                                           ("bench_predict.py", [], ("baseline", "stream", "predict-baseline")),
                                           ("profile.py", [], ("baseline", "devloss", "train-baseline")),
                                           ("profile.py", ["--program", "predict"], ("pool", "async", "predict-pool")),
                                           ("scaling.py", [], ("train", "train-ddp-naive", "train"))):
            for spec, fragment in ((f"{a},,{b}", f"--variants '{a},,{b}' has an empty item"),
                                   (f"{a},{a}", f"--variants '{a},{a}' names {name} twice"),
                                   (f"{a},{name},{b}", f"--variants '{a},{name},{b}' names {name} twice")):
                with self.subTest(script=script, args=args, spec=spec):
                    self.assertRefused(self.run_tool(script, *args, "--variants", spec), 2, fragment)
        for script, spec, name in (("bench.py", "all,fp16", "train-fp16"), ("bench_predict.py", "stream,all", "predict-stream")):
            with self.subTest(script=script, spec=spec):
                self.assertRefused(self.run_tool(script, "--variants", spec), 2,
                                   f"--variants {spec!r} names {name} twice ('all' is the whole ladder)")
        self.assertEqual(self.machine.calls(), [])

    def test_bench_parses_pytorch_rungs_once(self):
        bench = tool_module("bench")
        args = bench.parse_args(["--pytorch-rungs", "compile,baseline", "--pytorch-runs", "2"])
        ran = []

        def run(cmd, timeout_s, env=None):  # the PyTorch ladder's run, failing at once
            ran.append(cmd)
            return runner.RunOutput(1, "", "error: no torch here", timeout_s)

        with mock.patch.object(bench.pytorch_rungs, "parse_rungs", side_effect=AssertionError("parsed again")), \
                mock.patch.object(runner, "run", run), contextlib.redirect_stderr(io.StringIO()):
            for batch in (128, 256):
                bench.Bench(args, {}).measure_pytorch(batch)
        self.assertEqual(len(ran), 4)
        self.assertEqual({cmd[cmd.index("--rungs") + 1] for cmd in ran}, {"baseline,compile"})

    def test_each_tool_keeps_its_parsed_variants(self):
        bench, bench_predict, profile, scaling = (tool_module(name) for name in ("bench", "bench_predict", "profile",
                                                                                 "scaling"))
        ladder = runner.LADDERS["train"]
        self.assertEqual(bench.parse_args(["--variants", "all,train"]).variant_list, ladder + ["train"])
        self.assertEqual(bench_predict.parse_args([]).variant_list, runner.LADDERS["predict"] + ["predict"])
        self.assertEqual(profile.parse_args(["--variants", "devloss,train-baseline"]).variant_list,
                         ["train-devloss", "train-baseline"])
        self.assertEqual(profile.parse_args(["--program", "predict", "--variants", "stream"]).variant_list,
                         ["predict-stream"])
        self.assertEqual(scaling.parse_args(["--variants", "train, ddp-naive"]).variant_list, ["train", "train-ddp-naive"])

    def test_an_unclosed_quote_in_extra_is_a_usage_error(self):
        for script, args in (("scaling.py", []), ("profile_ranks.py", ["--gpus", "1"])):
            with self.subTest(script=script):
                self.assertRefused(self.run_tool(script, *args, '--extra=--foo "bar'), 2, "No closing quotation")


class CtrlC(BenchTest):
    def interrupt(self, script, *args):
        """Starts the tool, waits for its sleeping binary to start, sends SIGINT to the tool alone."""
        pid_file = self.tmp / "child.pid"
        env = {k: v for k, v in os.environ.items() if k not in ("PATH", "PYTHONPATH")}
        env["PATH"] = str(self.machine.tools)
        tool = popen_interruptible([sys.executable, str(BENCH / script), *args], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, env=env, cwd=self.tmp)
        try:
            deadline = time.monotonic() + 30
            while not (pid_file.is_file() and pid_file.read_text()) and time.monotonic() < deadline:
                time.sleep(0.05)
            child = int(pid_file.read_text())
            tool.send_signal(signal.SIGINT)
            _, err = tool.communicate(timeout=20)  # well before any --timeout
        finally:
            if tool.poll() is None:
                tool.kill()
                tool.wait()
        self.assertEqual(tool.returncode, 130, err)
        self.assertEqual(err.strip().splitlines()[-1], f"{script_tool(script)}: interrupted")
        self.assertNotIn("Traceback", err)
        self.assertFalse(alive(child), "the child was left running")

    def sleeper(self, name):
        _write_executable(self.machine.bin_dir / name, f"#!{sys.executable}\n"
                          + SLEEPER.format(pid_file=str(self.tmp / "child.pid")))
        return self.machine.bin_dir / name

    def test_bench(self):
        self.sleeper("train-baseline")
        self.interrupt("bench.py", "--bin-dir", str(self.machine.bin_dir), "--variants", "baseline",
                       "--no-pytorch", "--out", str(self.out))
        self.assertFalse(self.out.exists())

    def test_time_to_accuracy(self):
        self.interrupt("time_to_accuracy.py", "--out", str(self.out), str(self.sleeper("prog")))
        self.assertFalse(self.out.exists())


def script_tool(script):
    return {"bench.py": "bench", "time_to_accuracy.py": "time-to-accuracy"}[script]


def alive(pid):
    """Whether pid runs (a zombie not yet reaped counts as gone); waits a little for the kill to land."""
    for _ in range(50):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        if state == "Z":
            return False
        time.sleep(0.1)
    return True


if __name__ == "__main__":
    unittest.main()
