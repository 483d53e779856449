"""bench/time_to_accuracy.py: which lines give the time to the target and the start-up, the table on
recorded runs (tests/fixtures/bench/tta/), the rows and commands of bin/train and PyTorch on 1 and N
GPUs, argument errors before any GPU is looked for, and whole runs of the tool against a fake trainer."""

import json
import os
import sys
import tempfile
import time
import unittest
from pathlib import Path

import time_to_accuracy as tta  # noqa: E402  (bench/ is on sys.path: tests/python/__init__.py)
from lib import pytorch_rungs, runner  # noqa: E402

from tests.python import FIXTURES
from tests.python.fakes import FakeMachine, _write_executable

RECORDED = FIXTURES / "bench" / "tta"
GRAPHS = next(r for r in pytorch_rungs.RUNGS if r.name == "resident-amp-cl-graphs")


def epoch(n, acc):
    return f'{{"event": "epoch", "epoch": {n}, "test_acc": {acc}}}'


def recorded(name):
    """A fixture's (seconds since start, line) pairs, as run_stamped returns them."""
    stamped = []
    for line in (RECORDED / f"{name}.stamped").read_text().splitlines():
        t, text = line.split("\t", 1)
        stamped.append((float(t), text))
    return stamped


def recorded_run(name, seed):
    stamped = recorded(name)
    return tta.Run(seed, stamped, 0, "", stamped[-1][0])


class FirstAtTarget(unittest.TestCase):
    def test_the_first_epoch_at_or_above_the_target_gives_the_time(self):
        stamped = [(0.5, "data: fashion-mnist ..."), (10.0, epoch(1, 0.90)), (20.0, epoch(2, 0.94)),
                   (30.0, epoch(3, 0.95)), (31.0, '{"event": "summary", "final_test_acc": 0.95}')]
        self.assertEqual(tta.first_at_target(stamped, 0.94, 32.0), tta.Reached(2, 20.0, 0.95, 32.0))

    def test_never_reached_and_bad_lines(self):
        stamped = [(1.0, "{not json"), (2.0, epoch(1, 0.5)), (3.0, '{"event": "epoch", "epoch": 2, "test_acc": null}'),
                   (3.5, "[1, 2]")]
        self.assertEqual(tta.first_at_target(stamped, 0.94, 4.0), tta.Reached(None, None, None, 4.0))

    def test_run_stamped_stamps_lines_and_stops_a_silent_run_at_the_timeout(self):
        stamped, code, err = tta.run_stamped([sys.executable, "-c", "import sys; print('a'); sys.stderr.write('e'*200000); print('b')"], 30)
        self.assertEqual(([line for _, line in stamped], code, len(err)), (["a", "b"], 0, 200000))
        t0 = time.monotonic()
        stamped, code, _ = tta.run_stamped([sys.executable, "-c", "import time; time.sleep(60)"], 0.5)
        self.assertLess(time.monotonic() - t0, 20)
        self.assertEqual((stamped, code), ([], -9))


class RecordedRuns(unittest.TestCase):
    """bin/train's and pytorch_train.py's --json output as the tool stamped it."""

    def test_start_up_target_final_and_curve_of_a_trainer_run(self):
        stamped = recorded("train-1gpu.seed0")
        self.assertEqual(tta.startup_seconds(stamped), 6.2, "the first_step line's stamp")
        self.assertEqual(tta.first_at_target(stamped, 0.94, 22.5), tta.Reached(4, 18.6, 0.9433, 22.5))
        curve = tta.accuracy_curve(stamped)
        self.assertEqual([round(t, 1) for t, _ in curve], [9.3, 12.4, 15.5, 18.6, 21.7])
        self.assertEqual([a for _, a in curve], [0.8512, 0.9023, 0.9241, 0.9407, 0.9433])

    def test_a_pytorch_run_and_one_without_a_first_step_line(self):
        stamped = recorded("pytorch-1gpu.seed0")
        self.assertEqual(tta.startup_seconds(stamped), 41.3)
        self.assertEqual(tta.first_at_target(stamped, 0.94, 83.0).epoch, 4)
        self.assertIsNone(tta.startup_seconds([(1.0, epoch(1, 0.9))]))

    def test_the_start_up_line_gives_each_phase_and_the_process_age(self):
        self.assertEqual(tta.startup_phases(recorded("train-2gpu.seed0")),
                         {"data": 1.1, "ranks": 0.8, "GPU": 0.4, "network": 0.41, "loader and step graphs": 0.06,
                          "start state": 0.03, tta.AGE: 3.4})
        self.assertEqual(tta.startup_phases([(1.0, "start-up: data 0.20 s, GPU 1.50 s")]), {"data": 0.2, "GPU": 1.5},
                         "without /proc the line has no age")
        self.assertIsNone(tta.startup_phases(recorded("pytorch-1gpu.seed0")), "PyTorch's runs print none")
        self.assertIsNone(tta.startup_phases([(1.0, "start-up: data 0.20 s, GPU soon")]), "a malformed line")
        self.assertEqual(tta.startup_section([tta.RowResult(tta.RowSpec("p", 1, []), [recorded_run("pytorch-1gpu.seed0", 0)])]),
                         [], "no section where no run printed the line")

    def rows(self):
        one = tta.RowResult(tta.RowSpec("bin/train", 1, ["bin/train"]),
                            [recorded_run(f"train-1gpu.seed{s}", s) for s in range(3)])
        failed = tta.Run(1, [(0.1, "train: ...")], 1, "warning: x\nerror: rank 1: stopping: rank 0 failed\n", 12.0)
        two = tta.RowResult(tta.RowSpec("bin/train", 2, ["bin/train", "--gpus", "2"]),
                            [recorded_run("train-2gpu.seed0", 0), failed])
        torch_row = tta.RowResult(tta.RowSpec("pytorch: resident-amp-cl-graphs", 1, [], pytorch=True),
                                  [recorded_run("pytorch-1gpu.seed0", 0)])
        broken = tta.RowResult(tta.RowSpec("pytorch: resident-amp-cl-graphs (DDP)", 2, [], pytorch=True),
                               [tta.Run(0, [], 1, "pytorch_train: rank 0: no GPU\n", 3.0)])
        return [one, two, torch_row, broken]

    def test_the_table_gives_medians_ranges_and_every_run(self):
        text = tta.report(self.rows(), 0.94, "NVIDIA H100 80GB HBM3", "2026-11-27", ["--data", "fashion-mnist"],
                          ["PyTorch is not installed here"])
        self.assertEqual(text.splitlines(), [
            "# Time to 94% test accuracy on NVIDIA H100 80GB HBM3, 2026-11-27",
            "",
            "Flags: `--data fashion-mnist`; each run alone, times from process start (median over the seeds, range in "
            "brackets). Start-up: process start to the first training step done.",
            "",
            "Note: PyTorch is not installed here",
            "",
            "| program | GPUs | seconds to 94% | seeds reaching it | epochs at it | final accuracy | start-up seconds | "
            "run seconds |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
            "| bin/train | 1 | 20.3 (18.6–22.0) | 2 of 3 | 4, 5 | 94.12% (93.91%–94.33%) | 6.2 (6.0–6.4) | "
            "22.5 (22.2–22.8) |",
            "| bin/train | 2 | 16.6 | 1 of 2 (1 failed) | 4 | 94.21% | 9.8 | 19.1 |",
            "| pytorch: resident-amp-cl-graphs | 1 | 74.3 | 1 of 1 | 4 | 94.40% | 41.3 | 83.0 |",
            "| pytorch: resident-amp-cl-graphs (DDP) | 2 | failed (exit 1): pytorch_train: rank 0: no GPU | | | | | |",
            "",
            "## Every run",
            "",
            "| row | seed | seconds to 94% | epoch | final accuracy | start-up seconds | run seconds |",
            "| --- | --- | --- | --- | --- | --- | --- |",
            "| bin/train, 1 GPU | 0 | 18.6 | 4 | 94.33% | 6.2 | 22.5 |",
            "| bin/train, 1 GPU | 1 | 22.0 | 5 | 94.12% | 6.0 | 22.8 |",
            "| bin/train, 1 GPU | 2 | not reached | — | 93.91% | 6.4 | 22.2 |",
            "| bin/train, 2 GPUs | 0 | 16.6 | 4 | 94.21% | 9.8 | 19.1 |",
            "| bin/train, 2 GPUs | 1 | failed (exit 1): error: rank 1: stopping: rank 0 failed | | | | |",
            "| pytorch: resident-amp-cl-graphs, 1 GPU | 0 | 74.3 | 4 | 94.40% | 41.3 | 83.0 |",
            "| pytorch: resident-amp-cl-graphs (DDP), 2 GPUs | 0 | failed (exit 1): pytorch_train: rank 0: no GPU | | | "
            "| |",
            "",
            "## Where the start-up went",
            "",
            "From bin/train's `start-up:` line (medians over the seeds, seconds): each set-up phase, the process's age "
            "at the end of its set-up, and from there to the first step done (the first steps and their graph capture; "
            "with --gpus, also the launcher's time before it started the rank).",
            "",
            "| row | data | ranks | GPU | network | loader and step graphs | start state | process age | "
            "then to the first step |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
            "| bin/train, 1 GPU | 1.10 (1.00–1.20) | — | 0.52 (0.50–0.55) | 0.41 (0.40–0.45) | 0.06 (0.05–0.07) | "
            "0.01 (0.01–0.02) | 2.60 (2.45–2.80) | 3.60 (3.55–3.60) |",
            "| bin/train, 2 GPUs | 1.10 | 0.80 | 0.40 | 0.41 | 0.06 | 0.03 | 3.40 | 6.40 |"])

    def test_the_chart_draws_every_run_that_printed_an_accuracy(self):
        names = [(name, len(runs)) for name, runs in tta.curves(self.rows())]
        self.assertEqual(names, [("bin/train, 1 GPU", 3), ("bin/train, 2 GPUs", 1),
                                 ("pytorch: resident-amp-cl-graphs, 1 GPU", 1),
                                 ("pytorch: resident-amp-cl-graphs (DDP), 2 GPUs", 0)])
        with tempfile.TemporaryDirectory() as d:
            png = Path(d) / "chart.png"
            why = tta.chart.write_accuracy_chart(tta.curves(self.rows()), png, 0.94, "title")
            if why:
                self.assertEqual(why, "matplotlib is not installed, so no chart")
            else:
                self.assertEqual(png.read_bytes()[:8], b"\x89PNG\r\n\x1a\n")
            self.assertIn(tta.chart.write_accuracy_chart([("x", [])], png, 0.94, "t"),
                          ("no run printed a test accuracy, so no chart", "matplotlib is not installed, so no chart"))


class Rows(unittest.TestCase):
    def test_bin_train_on_n_gpus_and_pytorch_alone_or_under_torchrun(self):
        specs = tta.row_specs(["bin/train"], [GRAPHS], [1, 2])
        self.assertEqual([(s.name, s.pytorch) for s in specs],
                         [("bin/train, 1 GPU", False), ("bin/train, 2 GPUs", False),
                          ("pytorch: resident-amp-cl-graphs, 1 GPU", True),
                          ("pytorch: resident-amp-cl-graphs (DDP), 2 GPUs", True)])
        flags = ["--data", "fashion-mnist"]
        self.assertEqual(specs[0].command(7, flags), ["bin/train", "--data", "fashion-mnist", "--seed", "7", "--json"])
        self.assertEqual(specs[1].command(0, flags)[:3], ["bin/train", "--gpus", "2"])
        script = str(tta.PYTORCH_TRAIN)
        self.assertEqual(specs[2].command(1, flags), [sys.executable, script, "--rung", "resident-amp-cl-graphs",
                                                      "--data", "fashion-mnist", "--seed", "1", "--json"])
        self.assertEqual(specs[3].command(1, [])[:7], [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                       "--nproc-per-node", "2", script])

    def test_image_size_reaches_both_programs_and_means_the_same_to_pytorch_train(self):
        import pytorch_train
        flags = ["--data", "fashion-mnist", "--image-size", "28"]
        for spec in tta.row_specs(["bin/train"], [GRAPHS], [1, 2]):
            command = spec.command(0, flags)
            self.assertEqual(command[command.index("--image-size") + 1], "28", spec.name)
            if spec.pytorch:  # what the script's own parser makes of its part of the command
                args = pytorch_train.parse_args(command[command.index(str(tta.PYTORCH_TRAIN)) + 1:])
                self.assertEqual((args.image_size, args.data, args.seed, args.json), (28, "fashion-mnist", 0, True))


# A trainer that prints bin/train's --json lines at once: 3 epochs, the accuracy rising with --gpus and
# the seed, its command line appended to calls.log; --seed 13 fails as a rank would.
FAKE = r'''
import json, sys
from pathlib import Path
args = sys.argv[1:]
with Path({log!r}).open("a") as log:
    log.write(" ".join(args) + "\n")
seed = int(args[args.index("--seed") + 1])
gpus = int(args[args.index("--gpus") + 1]) if "--gpus" in args else 1
if seed == 13:
    sys.exit("error: rank 1: stopping: rank 0 failed")
print("model: ResNet-50 (CIFAR stem) ...")
print(json.dumps({{"event": "first_step", "step": 1}}), flush=True)
for e in range(3):
    print(json.dumps({{"event": "epoch", "epoch": e + 1, "test_acc": 0.9 + 0.02 * e + 0.001 * gpus + 0.0001 * seed}}))
print(json.dumps({{"event": "summary", "final_test_acc": 0.94 + 0.001 * gpus + 0.0001 * seed}}))
'''


class FakeTrainerCase(unittest.TestCase):
    """A fake machine with one H100 and the fake trainer above as self.prog."""

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.tmp = Path(self._tmp.name)
        self.machine = FakeMachine(self.tmp)
        self.out = self.tmp / "out"
        self.prog = self.tmp / "fake-train"
        _write_executable(self.prog, f"#!{sys.executable}\n" + FAKE.format(log=str(self.machine.log)))


class WholeRuns(FakeTrainerCase):
    def two_gpus(self):
        _write_executable(self.machine.tools / "nvidia-smi", "#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: a)'\n"
                                                             "echo 'GPU 1: NVIDIA H100 80GB HBM3 (UUID: b)'\n")

    def tool(self, *args):
        return self.machine.run_script("time_to_accuracy.py", "--out", str(self.out), *args)

    def test_one_and_two_gpus_three_seeds_each(self):
        self.two_gpus()
        r = self.tool("--gpus", "1,2", "--seeds", "0,1,2", str(self.prog), "--", "--epochs", "3")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.machine.calls(), [f"--epochs 3 --seed {s} --json" for s in range(3)] +
                         [f"--gpus 2 --epochs 3 --seed {s} --json" for s in range(3)])
        [md] = self.out.glob("time-to-94-nvidia-h100-80gb-hbm3-*.md")
        text = md.read_text()
        self.assertIn(f"| {self.prog} | 1 | ", text)
        self.assertIn(f"| {self.prog} | 2 | ", text)
        self.assertIn("| 3 of 3 | 3, 3, 3 | 94.11% (94.10%–94.12%) |", text)  # 1 GPU: 0.94 + 0.001 + 0.0001 x seed
        self.assertEqual(text.count(f"| {self.prog}, 2 GPUs | "), 3)
        self.assertIn(text, r.stdout)
        pngs = list(self.out.glob("*.png"))
        self.assertTrue(pngs or "matplotlib is not installed" in r.stderr, r.stderr)

    def test_a_failed_seed_is_a_row_note_and_all_failed_writes_nothing(self):
        r = self.tool("--seeds", "0,13", str(self.prog))
        self.assertEqual(r.returncode, 0, r.stderr)
        text = next(self.out.glob("*.md")).read_text()
        self.assertIn("| 1 of 2 (1 failed) |", text)
        self.assertIn("| 13 | failed (exit 1): error: rank 1: stopping: rank 0 failed |", text)
        for md in self.out.glob("*"):
            md.unlink()
        r = self.tool("--seeds", "13", str(self.prog))
        self.assertEqual(r.returncode, 1)
        self.assertEqual(r.stderr.strip().splitlines()[-1], "time-to-accuracy: every run failed (the last: failed "
                                                            "(exit 1): error: rank 1: stopping: rank 0 failed); no "
                                                            "results written")
        self.assertEqual(list(self.out.glob("*")), [])

    def test_more_gpus_than_the_machine_has_is_one_line_before_any_run(self):
        r = self.tool("--gpus", "1,2", str(self.prog))
        self.assertEqual(r.returncode, 2)
        self.assertEqual(r.stderr.strip(), "time-to-accuracy: --gpus 1,2: this machine has 1 GPU")
        self.assertEqual(self.machine.calls(), [])

    @unittest.skipIf(tta.importlib.util.find_spec("torch"), "PyTorch is installed here: its rows would run")
    def test_without_pytorch_its_rows_are_left_out_with_a_note(self):
        r = self.tool("--seeds", "0", "--pytorch", "resident-amp-cl-graphs", str(self.prog))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("PyTorch is not installed here, so no rows for --pytorch resident-amp-cl-graphs", r.stderr)
        text = next(self.out.glob("*.md")).read_text()
        self.assertIn("Note: PyTorch is not installed here", text)
        self.assertNotIn("| pytorch", text)
        r = self.tool("--pytorch", "resident-amp-cl-graphs")
        self.assertEqual(r.returncode, 2)
        self.assertIn("nothing left to run", r.stderr)


class RecordAndCombine(FakeTrainerCase):
    """--record keeps the runs; --combine makes one table and chart of several records, running nothing."""

    def setUp(self):
        super().setUp()
        self.progs = [self.prog, self.tmp / "other-train"]
        _write_executable(self.progs[1], self.prog.read_text())

    def tool(self, *args):
        return self.machine.run_script("time_to_accuracy.py", *args)

    def record(self, name, prog, *flags, seeds="0,1"):
        r = self.tool("--out", str(self.tmp / name), "--seeds", seeds, "--record", str(self.tmp / f"{name}.json"),
                      str(prog), "--", *flags)
        self.assertEqual(r.returncode, 0, r.stderr)
        return self.tmp / f"{name}.json"

    def test_two_records_make_one_table_with_every_row(self):
        a, b = self.record("a", self.progs[0], "--epochs", "3"), self.record("b", self.progs[1], "--epochs", "3")
        calls = len(self.machine.calls())
        r = self.tool("--out", str(self.tmp / "both"), "--combine", str(a), str(b))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(len(self.machine.calls()), calls, "--combine runs nothing")
        [md] = (self.tmp / "both").glob("time-to-94-nvidia-h100-80gb-hbm3-*.md")
        text = md.read_text()
        alone = next((self.tmp / "a").glob("*.md")).read_text()
        for prog in self.progs:
            self.assertIn(f"| {prog} | 1 | ", text)
            self.assertEqual(text.count(f"| {prog}, 1 GPU | "), 2)
        self.assertIn("Note: rows combined from a.json, b.json (--combine)", text)
        self.assertIn(alone.split("## Every run")[1].splitlines()[4], text)  # a's first run, as a's own table has it
        self.assertTrue(list((self.tmp / "both").glob("*.png")) or "matplotlib is not installed" in r.stderr, r.stderr)

    def test_the_seeds_of_one_row_in_several_records_are_one_row(self):
        a, c = self.record("a", self.progs[0], "--epochs", "3"), self.record("c", self.progs[0], "--epochs", "3", seeds="2")
        r = self.tool("--out", str(self.tmp / "both"), "--combine", str(a), str(c))
        self.assertEqual(r.returncode, 0, r.stderr)
        text = next((self.tmp / "both").glob("*.md")).read_text()
        self.assertEqual(text.count(f"| {self.progs[0]} | 1 | "), 1, text)
        self.assertRegex(text, r"\| \d of 3 \|")  # one row of the three seeds
        self.assertEqual(text.count(f"| {self.progs[0]}, 1 GPU | "), 3)
        r = self.tool("--combine", str(a), str(a))
        self.assertEqual(r.returncode, 2)
        self.assertIn("has a seed in two of a.json, a.json", r.stderr)

    def test_records_of_other_flags_or_not_records_are_one_line(self):
        a, b = self.record("a", self.progs[0], "--epochs", "3"), self.record("b", self.progs[1], "--epochs", "4")
        r = self.tool("--combine", str(a), str(b))
        self.assertEqual(r.returncode, 2)
        self.assertRegex(r.stderr.strip(), r"^time-to-accuracy: --combine: .*b\.json has flags \['--epochs', '4'\], "
                                           r".*a\.json has \['--epochs', '3'\]: the rows would not measure")
        bad = self.tmp / "bad.json"
        good = json.loads(a.read_text())
        odd = [dict(good, target=float("nan")), dict(good, target=2), dict(good, date="../x"),
               dict(good, rows=[]), dict(good, tool="other")]
        for text in ("not json", '{"tool": "time-to-accuracy"}', '{"rows": []}', *map(json.dumps, odd)):
            bad.write_text(text)
            r = self.tool("--combine", str(bad))
            self.assertEqual(r.returncode, 2, text)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
            self.assertIn(f"--combine: {bad} is not a record of --record", r.stderr)
        r = self.tool("--combine", str(self.tmp / "missing.json"))
        self.assertEqual((r.returncode, r.stderr.count("\n")), (2, 1), r.stderr)
        self.assertIn("cannot read", r.stderr)


class ArgumentsBeforeTheGpu(unittest.TestCase):
    """Every argument the tool can check alone is one line and exit 2 on a machine without a GPU,
    before anything runs (bench/lib/runner.py's rule for every bench tool)."""

    def test_bad_lists_and_flags_the_tool_sets(self):
        with tempfile.TemporaryDirectory() as d:
            machine = FakeMachine(Path(d), gpu=False)
            cases = [(["--gpus", "0"], "--gpus '0': each count must be at least 1"),
                     (["--gpus", "1,,2"], "--gpus '1,,2' has an empty item"),
                     (["--gpus", "1,1"], "--gpus '1,1' names 1 twice"),
                     (["--gpus", "two"], "--gpus: 'two' is not a valid item"),
                     (["--seeds", "-1"], "--seeds '-1': each seed must be at least 0"),
                     (["--seeds", "0,x"], "--seeds: 'x' is not a valid item"),
                     (["--pytorch", "fastest"], "--pytorch: unknown rung fastest"),
                     ([sys.executable, "--", "--seed", "3"], "--seed after -- is set by the tool for each run "
                                                             "(use --seeds)"),
                     ([sys.executable, "--", "--gpus=2"], "--gpus after -- is set by the tool for each run"),
                     ([sys.executable, "--", "--json"], "--json after -- is set by the tool for each run"),
                     ([], "nothing to run: give binaries, --pytorch RUNGS or both"),
                     (["--combine", "a.json", "--pytorch", "resident-amp-cl-graphs"], "--combine runs nothing"),
                     (["--target", "0.9", "--combine", "a.json"], "--combine runs nothing"),
                     (["--record", d, sys.executable], f"--record {d} is a directory")]
            for args, fragment in cases:
                with self.subTest(args=args):
                    r = machine.run_script("time_to_accuracy.py", *args)
                    self.assertEqual(r.returncode, 2, r.stderr)
                    self.assertNotIn("Traceback", r.stderr)
                    self.assertIn(fragment, r.stderr.strip().splitlines()[-1])
                    self.assertNotIn(runner.NO_GPU_LINE, r.stderr)
            r = machine.run_script("time_to_accuracy.py", sys.executable)
            self.assertEqual((r.returncode, r.stderr.strip()), (2, f"time-to-accuracy: {runner.NO_GPU_LINE}"))
            self.assertEqual(machine.calls(), [])


if __name__ == "__main__":
    unittest.main()
