"""bench/ab.py (A-B runs of bin/train) against a fake nvidia-smi (fakes.FakeMachine) and a fake trainer.

The fake trainer appends one JSON line per run to calls.log: its path, its FAKE_VARIANT and PROBE_X
variables and its arguments. Its images/s come from FAKE_IPS, a comma list set in the variant's
COMMAND: the n-th run of a variant prints the n-th figure (a variant's first run of all is the fill
run for the first variant). FAKE_FAIL=n makes its n-th run fail, FAKE_SLEEP makes every run sleep,
FAKE_NO_IPS leaves images_per_s out of its summary line. FAKE_CLOCK ("MHz, W, reasons") is what the
fake nvidia-smi of the Clocks tests reports, with the GPU busy, while the run sleeps; FAKE_WINDOW=sleep
reports the sleep as the run's timed window, FAKE_WINDOW=past a window before the run.
"""

import datetime
import json
import os
import re
import sys
import tempfile
import time
import unittest
import unittest.mock
from pathlib import Path

from tests.python.fakes import FakeMachine, _write_executable

import ab  # noqa: E402  (bench/ is on sys.path: tests/python/__init__.py)
from lib import gpu_clocks  # noqa: E402

FAKE_TRAINER = r'''
import json, os, sys, time
from pathlib import Path
LOG = Path({log!r})
label = os.environ.get("FAKE_VARIANT", "-")
args = sys.argv[1:]
with LOG.open("a") as log:
    log.write(json.dumps({{"binary": sys.argv[0], "variant": label, "probe": os.environ.get("PROBE_X"),
                           "args": args}}) + "\n")
counter = LOG.with_name(label + ".count")
n = int(counter.read_text()) + 1 if counter.exists() else 1
counter.write_text(str(n))
with open(args[args.index("--autotune-cache") + 1], "a") as cache:
    cache.write("algo\n")
clock = LOG.with_name("clock.state")
if os.environ.get("FAKE_CLOCK"):
    clock.write_text(os.environ["FAKE_CLOCK"])
window = [int(time.time() * 1000)]
time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
window.append(int(time.time() * 1000))
clock.unlink(missing_ok=True)
print("step 5/7  loss 2.3  1,000 images/s")
if os.environ.get("FAKE_FAIL") == str(n):
    print("warning: something first", file=sys.stderr)
    print("error: cuDNN CUDNN_STATUS_EXECUTION_FAILED in cudnnBackendExecute", file=sys.stderr)
    sys.exit(1)
figures = os.environ["FAKE_IPS"].split(",")
summary = {{"event": "summary", "images_per_s": float(figures[n - 1]), "ms_per_step": 1.0}}
if os.environ.get("FAKE_NO_IPS"):
    del summary["images_per_s"]
if os.environ.get("FAKE_WINDOW") == "sleep":  # the timed window: the sleep
    summary.update(window_start_unix_ms=window[0], window_end_unix_ms=window[1])
elif os.environ.get("FAKE_WINDOW") == "past":  # a window long before the run: no sample is inside it
    summary.update(window_start_unix_ms=1000, window_end_unix_ms=2000)
print(json.dumps({{"event": "epoch", "images_per_s": 1.0}}))
print(json.dumps(summary))
'''

PROGRESS = re.compile(r"ab: (fill run, \S+ \(fills the autotune cache .*; not counted\)|round \d+/\d+, \S+)")


class AbTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = Path(self._tmp.name)
        self.machine = FakeMachine(self.tmp)
        for build in ("base", "new"):
            (self.tmp / build).mkdir()
            _write_executable(self.tmp / build / "train",
                              f"#!{sys.executable} -S\n" + FAKE_TRAINER.format(log=str(self.machine.log)))

    def tearDown(self):
        self._tmp.cleanup()

    def ab(self, *args):
        """bench/ab.py run in the temporary directory, with --batch 64, 2 + 5 steps unless given."""
        quick = [] if "--batch" in args else ["--batch", "64", "--warmup-steps", "2", "--timed-steps", "5"]
        return self.machine.run_script("ab.py", *args, *quick, timeout=60)

    def calls(self):
        return [json.loads(line) for line in self.machine.calls()]

    def runs_of(self, result):
        """The calls of a run that succeeded, and the variant of each in the order they ran."""
        self.assertEqual(result.returncode, 0, result.stderr)
        calls = self.calls()
        return calls, [c["variant"] for c in calls]

    def assertUsageError(self, result, fragment):
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertEqual(result.stdout, "")
        lines = result.stderr.splitlines()
        self.assertEqual(len(lines), 1, result.stderr)
        self.assertTrue(lines[0].startswith("ab: "), lines[0])
        self.assertIn(fragment, lines[0])
        self.assertEqual(self.calls(), [], "nothing may run")

    def assertOneFailureLine(self, result, *fragments):
        """Exit 1; besides the progress lines, one stderr line, the last, saying what failed."""
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertNotIn("Traceback", result.stderr)
        lines = result.stderr.splitlines()
        self.assertEqual([line for line in lines if not PROGRESS.fullmatch(line)], lines[-1:], result.stderr)
        for fragment in fragments:
            self.assertIn(fragment, lines[-1])
        self.assertTrue(lines[-1].endswith("; nothing written"), lines[-1])
        self.assertEqual(result.stdout, "")

    def table_row(self, stdout, first_cell):
        rows = [line for line in stdout.splitlines() if line.startswith(f"| {first_cell} |")]
        self.assertEqual(len(rows), 1, stdout)
        return [cell.strip() for cell in rows[0].strip("|").split("|")]


class TwoVariants(AbTest):
    def test_alternating_order_flags_environment_and_table(self):
        cache = self.tmp / "shared-cache.txt"
        result = self.ab("a=FAKE_VARIANT=a FAKE_IPS=900,1000,1010,990,1000 base/train",
                         f"b=FAKE_VARIANT=b PROBE_X=1 FAKE_IPS=1100,1020,1000,1050 {self.tmp}/new/train",
                         "--rounds", "4", "--cache", str(cache))
        calls, order = self.runs_of(result)
        self.assertEqual(order, ["a", "a", "b", "b", "a", "a", "b", "b", "a"])
        self.assertEqual([Path(c["binary"]).parent.name for c in calls],
                         ["base", "base", "new", "new", "base", "base", "new", "new", "base"])
        expected = ["--data", "synthetic", "--batch", "64", "--steps", "7", "--warmup-steps", "2",
                    "--profile-steps", "5", "--no-eval", "--json", "--autotune-cache", str(cache)]
        for call in calls:
            self.assertEqual(call["args"], expected)
            self.assertEqual(call["probe"], "1" if call["variant"] == "b" else None)
        self.assertEqual(cache.read_text(), "algo\n" * 9)  # every run used the one cache

        out = result.stdout
        self.assertIn("- command: `python3 bench/ab.py 'a=FAKE_VARIANT=a FAKE_IPS=900,1000,1010,990,1000 base/train'",
                      out)
        self.assertIn("- GPU: NVIDIA H100 80GB HBM3", out)
        self.assertIn(f"- autotune cache, shared by every run: `{cache}`", out)
        self.assertIn("- fill run of a (fills the cache; not counted): 900 images/s", out)
        self.assertIn("- b: `FAKE_VARIANT=b PROBE_X=1 FAKE_IPS=1100,1020,1000,1050", out)
        self.assertIn("| round | order | a | b |", out)
        self.assertEqual(self.table_row(out, "1"), ["1", "a, b", "1,000", "1,100"])
        self.assertEqual(self.table_row(out, "2"), ["2", "b, a", "1,010", "1,020"])
        self.assertEqual(self.table_row(out, "3"), ["3", "a, b", "990", "1,000"])
        self.assertEqual(self.table_row(out, "4"), ["4", "b, a", "1,000", "1,050"])
        self.assertEqual(self.table_row(out, "median"), ["median", "", "1,000", "1,035"])
        self.assertEqual(self.table_row(out, "ms per step"), ["ms per step", "", "64.00", "61.84"])
        # 64 x 1000 / 1000 = 64.000 ms, 64 x 1000 / 1035 = 61.836 ms: -3.38%
        self.assertEqual(self.table_row(out, "against a"),
                         ["against a", "", "", "64.000 -> 61.836 ms (-3.38%), faster in every round"])
        self.assertTrue(all(PROGRESS.fullmatch(line) for line in result.stderr.splitlines()), result.stderr)

    def test_the_default_cache_is_one_temporary_file_removed_at_the_end(self):
        result = self.ab("a=FAKE_VARIANT=a FAKE_IPS=1,2,2 base/train", "b=FAKE_VARIANT=b FAKE_IPS=1,1 new/train",
                         "--rounds", "2")
        self.assertEqual(result.returncode, 0, result.stderr)
        caches = {c["args"][c["args"].index("--autotune-cache") + 1] for c in self.calls()}
        self.assertEqual(len(caches), 1)
        self.assertFalse(Path(caches.pop()).parent.exists())
        self.assertIn("- autotune cache, shared by every run: a new file in a temporary directory, removed at the end",
                      result.stdout)
        self.assertIn("(+100.00%), slower in every round", result.stdout)

    def test_rounds_that_disagree_say_how_many_were_faster(self):
        result = self.ab("a=FAKE_VARIANT=a FAKE_IPS=1000,1000,1000,1000,1000 base/train",
                         "b=FAKE_VARIANT=b FAKE_IPS=1010,990,1020,1000 new/train", "--rounds", "4")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(self.table_row(result.stdout, "against a")[3],
                         "64.000 -> 63.682 ms (-0.50%), rounds disagree (2 of 4 faster)")

    def test_one_binary_with_different_flags(self):
        result = self.ab("plain=FAKE_VARIANT=p FAKE_IPS=5,5,5 base/train",
                         "nofuse=FAKE_VARIANT=n FAKE_IPS=4,4 'base/train' --no-fuse dgrad-drelu-dbn", "--rounds", "2")
        self.assertEqual(result.returncode, 0, result.stderr)
        for call in self.calls():
            self.assertEqual(call["args"][:2] == ["--no-fuse", "dgrad-drelu-dbn"], call["variant"] == "n", call)
            self.assertEqual(call["args"].count("--batch"), 1)


class OwnCaches(AbTest):
    """A variant that gives --autotune-cache FILE runs with it; the others share ab.py's cache."""

    def test_a_variant_with_its_own_cache_and_one_sharing(self):
        own = self.tmp / "T.txt"
        own.write_text("filled\n")
        shared = self.tmp / "shared.txt"
        result = self.ab("a=FAKE_VARIANT=a FAKE_IPS=1,2,2 base/train",
                         f"b=FAKE_VARIANT=b FAKE_IPS=3,3 new/train --autotune-cache {own} --no-fuse x",
                         "--rounds", "2", "--cache", str(shared))
        calls, order = self.runs_of(result)
        self.assertEqual(order, ["a", "a", "b", "b", "a"])  # the fill run is a's
        for call in calls:
            args = call["args"]
            self.assertEqual(args.count("--autotune-cache"), 1, args)
            self.assertEqual(args[args.index("--autotune-cache") + 1], str(own if call["variant"] == "b" else shared))
            self.assertEqual("--no-fuse" in args, call["variant"] == "b")
        self.assertEqual(own.read_text(), "filled\n" + "algo\n" * 2)
        self.assertIn(f"- autotune caches: b's own `{own}`; the others' shared: `{shared}`", result.stdout)
        self.assertIn("- fill run of a (fills the cache; not counted): 1 images/s", result.stdout)

    def test_every_variant_with_its_own_cache_runs_no_fill_run(self):
        for name in ("T.txt", "E.txt"):
            (self.tmp / name).write_text("filled\n")
        result = self.ab(f"T=FAKE_VARIANT=T FAKE_IPS=10,10 base/train --autotune-cache={self.tmp}/T.txt",
                         "E=FAKE_VARIANT=E FAKE_IPS=11,9 base/train --autotune-cache E.txt", "--rounds", "2")
        self.assertEqual(self.runs_of(result)[1], ["T", "E", "E", "T"])
        self.assertNotIn("fill run,", result.stderr)
        self.assertIn(f"- autotune caches: T's own `{self.tmp}/T.txt`; E's own `{self.tmp}/E.txt`\n", result.stdout)
        self.assertIn("- no fill run: every variant brought its own cache", result.stdout)
        self.assertIn("rounds disagree (1 of 2 faster)", result.stdout)


class ThreeVariants(AbTest):
    def test_orders_alternate_and_each_is_compared_with_the_first(self):
        result = self.ab("A=FAKE_VARIANT=A FAKE_IPS=1,100,100,100 base/train",
                         "B=FAKE_VARIANT=B FAKE_IPS=110,110,110 new/train",
                         "C=FAKE_VARIANT=C FAKE_IPS=90,120,90 base/train", "--rounds", "3")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual("".join(c["variant"] for c in self.calls()), "A" + "ABC" + "CBA" + "ABC")
        out = result.stdout
        self.assertIn("| round | order | A | B | C |", out)
        self.assertEqual(self.table_row(out, "2")[1], "C, B, A")
        self.assertEqual(self.table_row(out, "3")[1], "A, B, C")
        against = self.table_row(out, "against A")
        self.assertEqual(against[2], "")
        self.assertTrue(against[3].endswith("faster in every round"), against)
        self.assertTrue(against[4].endswith("(+11.11%), rounds disagree (1 of 3 faster)"), against)


class FailedRuns(AbTest):
    def test_a_failing_run_stops_the_tool_and_writes_nothing(self):
        out = self.tmp / "results" / "ab.md"
        result = self.ab("a=FAKE_VARIANT=a FAKE_IPS=1,1,1,1,1 base/train",
                         "b=FAKE_VARIANT=b FAKE_FAIL=2 FAKE_IPS=1,1,1,1 new/train", "--out", str(out))
        self.assertOneFailureLine(result, "ab: b failed in round 2: error: cuDNN CUDNN_STATUS_EXECUTION_FAILED")
        self.assertEqual([c["variant"] for c in self.calls()], ["a", "a", "b", "b"])  # round 2 ran b first
        self.assertFalse(out.exists())
        self.assertFalse(out.parent.exists())

    def test_a_failing_fill_run(self):
        result = self.ab("a=FAKE_VARIANT=a FAKE_FAIL=1 FAKE_IPS=1 base/train", "b=FAKE_VARIANT=b FAKE_IPS=1 new/train")
        self.assertOneFailureLine(result, "ab: a failed in the fill run: error: cuDNN")
        self.assertEqual(len(self.calls()), 1)

    def test_a_run_that_times_out(self):
        result = self.ab("a=FAKE_VARIANT=a FAKE_SLEEP=20 FAKE_IPS=1 base/train",
                         "b=FAKE_VARIANT=b FAKE_IPS=1 new/train",
                         "--timeout", "0.5")
        self.assertOneFailureLine(result, "ab: a failed in the fill run: timed out after 0.5 s")

    def test_a_summary_without_images_per_s(self):
        result = self.ab("a=FAKE_VARIANT=a FAKE_IPS=1,1 base/train",
                         "b=FAKE_VARIANT=b FAKE_NO_IPS=1 FAKE_IPS=1 new/train")
        self.assertOneFailureLine(result, "ab: b failed in round 1: its summary line has no images_per_s")


class UsageErrors(AbTest):
    def test_each_is_one_line_exit_2_before_any_run(self):
        a, b = "a=FAKE_IPS=1 base/train", "b=FAKE_IPS=1 new/train"
        (self.tmp / "not-executable").write_text("")
        (self.tmp / "a-file").write_text("")
        cases = [((a,), "give at least two variants"),
                 ((a, "a=FAKE_IPS=1 new/train"), "the label 'a' names two variants"),
                 ((a, "new/train"), "'new/train' is not LABEL=COMMAND"),
                 ((a, "b c=new/train"), "'b c=new/train' is not LABEL=COMMAND"),
                 ((a, "b=FAKE_IPS=1 nowhere/train"), "b: nowhere/train: no such binary"),
                 ((a, "b=not-executable"), "b: not-executable: not executable"),
                 ((a, "b=FAKE_IPS=1"), "b: 'FAKE_IPS=1' names no binary"),
                 ((a, "b=new/train 'unclosed"), "b: \"new/train 'unclosed\": No closing quotation"),
                 ((a, "b=new/train --batch 256"), "b: --batch is set by ab.py for every run (use ab.py's --batch)"),
                 ((a, "b=new/train --autotune-cache=x"), "b: --autotune-cache x: no such file"),
                 ((a, "b=new/train --autotune-cache"), "b: --autotune-cache needs a file"),
                 ((a, "b=new/train --autotune-cache a-file --autotune-cache=a-file"),
                  "b: --autotune-cache given 2 times"),
                 ((a, b, "--rounds", "1"), "--rounds must be at least 2, not 1"),
                 ((a, b, "--timeout", "0"), "--timeout must be a positive number of seconds, not 0"),
                 ((a, b, "--out", str(self.tmp)), "is a directory"),
                 ((a, b, "--out", str(self.tmp / "a-file" / "ab.md")), "not a directory"),
                 ((a, b, "--cache", str(self.tmp / "nowhere" / "cache.txt")), "no directory"),
                 ((a, b, "--bogus"), "unrecognized arguments: --bogus")]
        for args, fragment in cases:
            with self.subTest(args=args):
                self.assertUsageError(self.ab(*args), fragment)

    def test_no_gpu(self):
        (self.tmp / "no-gpu").mkdir()
        machine = FakeMachine(self.tmp / "no-gpu", gpu=False)
        result = machine.run_script("ab.py", f"a={self.tmp}/base/train", f"b={self.tmp}/new/train")
        self.assertUsageError(result, "ab: no CUDA GPU on this machine")


class Out(AbTest):
    def test_out_holds_the_report_that_was_printed(self):
        out = self.tmp / "results" / "ab.md"
        result = self.ab("a=FAKE_VARIANT=a FAKE_IPS=1,2,3 base/train", "b=FAKE_VARIANT=b FAKE_IPS=4,5 new/train",
                         "--rounds", "2", "--out", str(out))
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(out.read_text(), result.stdout)
        self.assertTrue(result.stdout.startswith("# A-B run, NVIDIA H100 80GB HBM3, "), result.stdout)
        self.assertEqual(result.stderr.splitlines()[-1], f"ab: wrote {out}")


FAKE_SMI = r'''
import datetime, sys, time
from pathlib import Path
STATE, LOG = Path({state!r}), Path({log!r})
args = sys.argv[1:]
if "-L" in args:
    print("GPU 0: NVIDIA H200 (UUID: GPU-00000000-fake)")
    sys.exit(0)
with LOG.open("a") as log:
    log.write(" ".join(args) + "\n")
def sample():  # idle unless a fake run holds the clock state
    now = datetime.datetime.now().strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
    return now + ", " + (STATE.read_text() + ", 100" if STATE.exists() else "1980, 80.5, 0x0000000000000001, 0")
if "-lms" not in args:
    print(sample())
    sys.exit(0)
while True:
    print(sample(), flush=True)
    time.sleep(int(args[args.index("-lms") + 1]) / 1000)
'''


class Clocks(AbTest):
    """--clocks against a fake nvidia-smi that reports a run's FAKE_CLOCK while it runs."""

    def setUp(self):
        super().setUp()
        self.smi_log = self.tmp / "smi.log"
        _write_executable(self.machine.tools / "nvidia-smi", f"#!{sys.executable}\n" + FAKE_SMI.format(
            state=str(self.machine.log.with_name("clock.state")), log=str(self.smi_log)))

    def test_each_variant_has_its_runs_clock_power_and_capped_share(self):
        result = self.ab("a=FAKE_VARIANT=a FAKE_SLEEP=0.5 'FAKE_CLOCK=1980, 600.0, 0x0000000000000000' "
                         "FAKE_IPS=1,1,1 base/train",
                         "b=FAKE_VARIANT=b FAKE_SLEEP=0.5 'FAKE_CLOCK=1890, 710.4, 0x0000000000000004' "
                         "FAKE_IPS=1,1 new/train", "--rounds", "2", "--clocks")
        self.assertEqual(result.returncode, 0, result.stderr)
        out = result.stdout
        self.assertIn("nvidia-smi every 100 ms on GPU 0; the samples with the GPU at least 90% busy", out)
        self.assertIn("| | a | b |\n| --- | ---: | ---: |\n| SM clock, MHz |", out)
        self.assertEqual(self.table_row(out, "SM clock, MHz"), ["SM clock, MHz", "1,980", "1,890"])
        self.assertEqual(self.table_row(out, "power-capped samples"), ["power-capped samples", "0%", "100%"])
        self.assertEqual(self.table_row(out, "power, W"), ["power, W", "600", "710"])
        # 1 image/s a run (FAKE_IPS): the power itself, in mJ an image
        self.assertEqual(self.table_row(out, "energy, mJ an image"), ["energy, mJ an image", "600,000.0", "710,400.0"])
        self.assertEqual(self.table_row(out, "runs with busy samples"), ["runs with busy samples", "2 of 2", "2 of 2"])
        queries = self.smi_log.read_text().splitlines()
        self.assertEqual(len(queries), 5, queries)  # the check, then the 4 counted runs (not the fill run)
        self.assertNotIn("-lms", queries[0])
        for q in queries:
            self.assertIn("--query-gpu=timestamp,clocks.sm,power.draw.instant,clocks_throttle_reasons.active,"
                          "utilization.gpu", q)
            self.assertIn("-i 0", q)
        self.assertTrue(all(q.endswith("-lms 100") for q in queries[1:]), queries)

    def test_a_run_too_short_for_a_busy_sample_shows_a_dash(self):
        result = self.ab("a=FAKE_VARIANT=a FAKE_IPS=1,1,1 base/train", "b=FAKE_VARIANT=b FAKE_IPS=1,1 new/train",
                         "--rounds", "2", "--clocks")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(self.table_row(result.stdout, "SM clock, MHz"), ["SM clock, MHz", "—", "—"])
        self.assertEqual(self.table_row(result.stdout, "energy, mJ an image"), ["energy, mJ an image", "—", "—"])
        self.assertEqual(self.table_row(result.stdout, "runs with busy samples"),
                         ["runs with busy samples", "0 of 2", "0 of 2"])

    def test_only_the_samples_inside_a_reported_window_count(self):
        result = self.ab("a=FAKE_VARIANT=a FAKE_SLEEP=0.5 FAKE_WINDOW=sleep 'FAKE_CLOCK=1890, 710.4, 0x0000000000000004' "
                         "FAKE_IPS=1,1,1 base/train",
                         "b=FAKE_VARIANT=b FAKE_SLEEP=0.5 FAKE_WINDOW=past 'FAKE_CLOCK=1890, 710.4, 0x0000000000000004' "
                         "FAKE_IPS=1,1 new/train", "--rounds", "2", "--clocks")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(self.table_row(result.stdout, "power, W"), ["power, W", "710", "—"])
        self.assertEqual(self.table_row(result.stdout, "runs with busy samples"),
                         ["runs with busy samples", "2 of 2", "0 of 2"])

    def test_the_gpu_is_cuda_visible_devices_first(self):
        with unittest.mock.patch.dict(os.environ, {"CUDA_VISIBLE_DEVICES": "GPU-1234,0"}):
            result = self.ab("a=FAKE_VARIANT=a FAKE_IPS=1,1,1 base/train", "b=FAKE_VARIANT=b FAKE_IPS=1,1 new/train",
                             "--rounds", "2", "--clocks")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertTrue(all("-i GPU-1234" in q for q in self.smi_log.read_text().splitlines()))

    def test_clocks_nvidia_smi_cannot_report_stop_the_tool_before_any_run(self):
        _write_executable(self.machine.tools / "nvidia-smi",
                          "#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-0)'\n")  # -L only
        result = self.ab("a=FAKE_VARIANT=a FAKE_IPS=1 base/train", "b=FAKE_VARIANT=b FAKE_IPS=1 new/train", "--clocks")
        self.assertUsageError(result, "ab: --clocks: nvidia-smi cannot report timestamp,clocks.sm,power.draw.instant")


class ClockSummaries(unittest.TestCase):
    def test_lines_as_nvidia_smi_printed_them_on_an_h200(self):
        sample = gpu_clocks.parse_sample("2026/12/01 05:25:13.494, 1890, 710.39, 0x0000000000000004, 100")
        self.assertEqual(sample, gpu_clocks.Sample(datetime.datetime(2026, 12, 1, 5, 25, 13, 494000).timestamp(),
                                                   1890, 710.39, 4, 100))
        for line in ("2026/12/01 05:25:13.494, [N/A], 710.39, 0x0000000000000004, 100", "No devices were found",
                     "2026/12/01 05:25:13.494, 1890, 710.39, 0x4", "1890, 710.39, 0x0000000000000004, 100",
                     "yesterday, 1890, 710.39, 0x0000000000000004, 100"):
            self.assertIsNone(gpu_clocks.parse_sample(line), line)

    def test_only_busy_samples_count(self):
        samples = [gpu_clocks.Sample(1.0, 1980, 80.0, 1, 0), gpu_clocks.Sample(2.0, 1890, 710.0, 4, 100),
                   gpu_clocks.Sample(3.0, 1740, 700.0, 4 | 1, 95), gpu_clocks.Sample(4.0, 1980, 650.0, 0, 90)]
        summary = gpu_clocks.summarize(samples)
        self.assertEqual(summary.busy_samples, 3)
        self.assertEqual(summary.sm_mhz, 1890)
        self.assertAlmostEqual(summary.capped_share, 2 / 3)
        self.assertEqual(summary.power_w, 700.0)
        self.assertIsNone(gpu_clocks.summarize(samples[:1]))

    def test_a_window_keeps_the_samples_inside_it(self):
        samples = [gpu_clocks.Sample(t, 1980 - t, 600.0 + t, 4, 100) for t in (1.0, 2.0, 3.0, 4.0)]
        summary = gpu_clocks.summarize(samples, (2.0, 3.0))
        self.assertEqual((summary.busy_samples, summary.power_w), (2, 602.5))
        self.assertIsNone(gpu_clocks.summarize(samples, (5.0, 6.0)))

    def test_the_sampler_keeps_every_sample_of_a_long_run(self):
        # 5,000 lines (330 KB) at once, then one more: through a pipe nobody read until stop(), nvidia-smi
        # would block after about 64 KB and never write the last line (a run of torch.compile's minutes)
        with tempfile.TemporaryDirectory() as tmp:
            _write_executable(Path(tmp) / "nvidia-smi", "#!/bin/sh\ni=0\nwhile [ $i -lt 5000 ]; do\n"
                              "  echo '2026/12/01 05:25:13.494, 1890, 710.39, 0x0000000000000004, 100'; i=$((i+1))\n"
                              "done\necho '2026/12/01 05:25:14.000, 1234, 500.0, 0x0000000000000000, 100'\n"
                              "exec /bin/sleep 30\n")
            with unittest.mock.patch.dict(os.environ, {"PATH": tmp}):
                sampler = gpu_clocks.ClockSampler("0")
                sampler.start()
                time.sleep(1.0)
                samples = sampler.stop()
        self.assertEqual(len(samples), 5001)
        self.assertEqual(samples[-1].sm_mhz, 1234)

    def test_a_summary_lines_window(self):
        self.assertEqual(gpu_clocks.window_of({"window_start_unix_ms": 1500, "window_end_unix_ms": 2500}), (1.5, 2.5))
        for bad in ({}, {"window_start_unix_ms": 1500}, {"window_start_unix_ms": 2500, "window_end_unix_ms": 1500},
                    {"window_start_unix_ms": 0, "window_end_unix_ms": 0},
                    {"window_start_unix_ms": "1500", "window_end_unix_ms": 2500}):
            self.assertIsNone(gpu_clocks.window_of(bad), bad)


class Verdict(unittest.TestCase):
    def test_ties_count_neither_way(self):
        def pair(base, other):
            return ab.verdict(ab.Variant("a", "", {}, Path("x"), [], figures=base),
                              ab.Variant("b", "", {}, Path("x"), [], figures=other))

        self.assertEqual(pair([1, 1], [2, 3]), "faster in every round")
        self.assertEqual(pair([2, 3], [1, 1]), "slower in every round")
        self.assertEqual(pair([1, 1], [1, 0]), "rounds disagree (0 of 2 faster)")
        self.assertEqual([[v.label for v in ab.order_of(n, [ab.Variant(x, "", {}, Path("x"), []) for x in "ABC"])]
                          for n in (1, 2, 3, 4)], [list("ABC"), list("CBA"), list("ABC"), list("CBA")])


if __name__ == "__main__":
    unittest.main()
