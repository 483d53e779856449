#!/usr/bin/env python3
"""Wall-clock time from process start to a test accuracy, on 1 and N GPUs, over several seeds.

Each program runs alone (one run after the other, so none shares a GPU), with --json, once per GPU
count of --gpus and seed of --seeds: bin/train (and any program given) with --gpus N --seed S, and
each rung of --pytorch as bench/pytorch_train.py with bin/train's recipe, on several GPUs with
DistributedDataParallel under torchrun. Every line a run prints is stamped with the seconds since
the process was started. The first epoch line whose test_acc reaches --target gives the time to it:
start-up, data loading, autotuning, training and every evaluation up to that one included. The
first_step line gives the start-up time (process start to the first step done), reported apart, and
bin/train's `start-up:` line where it went (each set-up phase; on several GPUs
`ranks`: the rendezvous, the CUDA context and NCCL's communicator). A
run goes on to its end: its final accuracy is reported too.

    python3 bench/time_to_accuracy.py --target 0.94 --gpus 1,2 --seeds 0,1,2 \\
        --pytorch resident-amp-cl-graphs bin/train -- --data fashion-mnist --epochs 15

The flags after -- go to every run (bin/train's recipe flags mean the same to pytorch_train.py). A row
per program and GPU count: the median seconds to the target and their range, how many seeds reached
it, the epoch, the final accuracy, the start-up; then every run. The table goes to stdout and to
bench/results/time-to-<target>-<gpu>-<date>.md, and a PNG of test accuracy against wall seconds for
every run beside it (where matplotlib is installed). Without PyTorch the --pytorch rows are left out,
with a note.

--record FILE also keeps every run's stamped lines as JSON; --combine FILE... makes one table and one
chart of several such records without running anything, as when the rows of bin/train and of
PyTorch ran at the same time on different GPUs of one host (two runs of the tool, CUDA_VISIBLE_DEVICES
apart): the records must agree on the target, the flags and the GPU, and the rows of one program on as
many GPUs become one row of all their seeds (each seed once).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from lib import chart, pytorch_rungs, runner

TOOL = "time-to-accuracy"
PYTORCH_TRAIN = Path(__file__).resolve().parent / "pytorch_train.py"
# Set by the tool for every run: not to be given after --.
OWN_FLAGS = ("--seed", "--gpus", "--json")


@dataclass
class Reached:
    epoch: int | None       # first epoch at the target (None: never)
    seconds: float | None   # seconds from process start to that epoch's line
    final_acc: float | None
    total_s: float


def first_at_target(stamped: list[tuple[float, str]], target: float, total_s: float) -> Reached:
    """From (seconds since start, line) pairs: the first epoch whose test_acc >= target."""
    epoch = seconds = final = None
    for t, j in json_events(stamped):
        acc = j.get("test_acc") if j.get("event") == "epoch" else j.get("final_test_acc")
        if not isinstance(acc, (int, float)):
            continue
        if j.get("event") == "summary":
            final = acc
        elif j.get("event") == "epoch" and epoch is None and acc >= target:
            epoch, seconds = j["epoch"], t
    return Reached(epoch, seconds, final, total_s)


def json_events(stamped: list[tuple[float, str]]) -> list[tuple[float, dict]]:
    """The stamped lines that are JSON objects (the rest, start-up text and the like, left out)."""
    events = []
    for t, line in stamped:
        if not line.startswith("{"):
            continue
        try:
            j = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(j, dict):
            events.append((t, j))
    return events


def startup_seconds(stamped: list[tuple[float, str]]) -> float | None:
    """Seconds from process start to the first_step line (None: the run printed none)."""
    return next((t for t, j in json_events(stamped) if j.get("event") == "first_step"), None)


# bin/train's last set-up line: `start-up: data 0.41 s, GPU 0.35 s, ...; 2.10 s since the process began`.
STARTUP_LINE = re.compile(r"start-up: (?P<phases>.+?)(?:; (?P<age>\d+(?:\.\d+)?) s since the process began)?")
PHASE = re.compile(r"(?P<name>.+) (?P<seconds>\d+(?:\.\d+)?) s")
AGE = "process age"  # the key of the process's age at the end of its set-up


def startup_phases(stamped: list[tuple[float, str]]) -> dict[str, float] | None:
    """bin/train's `start-up:` line as {phase: seconds}, in its order, with AGE where it says it; None
    where the run printed no such line (PyTorch's runs, older builds) or a malformed one."""
    for _, line in stamped:
        m = STARTUP_LINE.fullmatch(line)
        if m is None:
            continue
        phases = {}
        for part in m["phases"].split(", "):
            pm = PHASE.fullmatch(part)
            if pm is None:
                return None
            phases[pm["name"]] = float(pm["seconds"])
        if m["age"] is not None:
            phases[AGE] = float(m["age"])
        return phases
    return None


def accuracy_curve(stamped: list[tuple[float, str]]) -> list[tuple[float, float]]:
    """(seconds, test accuracy) at each epoch line that has one."""
    return [(t, j["test_acc"]) for t, j in json_events(stamped)
            if j.get("event") == "epoch" and isinstance(j.get("test_acc"), (int, float))]


@dataclass
class Run:
    """One run of one row: what it printed, stamped, and how it ended."""
    seed: int
    stamped: list[tuple[float, str]]
    code: int | None
    err: str
    total_s: float

    def reached(self, target: float) -> Reached:
        return first_at_target(self.stamped, target, self.total_s)

    @property
    def failure(self) -> str | None:
        if self.code == 0:
            return None
        return f"failed (exit {self.code}): {runner.last_line(self.err)}"


@dataclass
class RowSpec:
    """A program on a number of GPUs, and the command that runs it for a seed."""
    program: str
    gpus: int
    base: list[str]        # the command before the seed and the flags after --
    pytorch: bool = False

    @property
    def name(self) -> str:
        return f"{self.program}, {self.gpus} GPU{'s' if self.gpus > 1 else ''}"

    def command(self, seed: int, flags: list[str]) -> list[str]:
        return [*self.base, *flags, "--seed", str(seed), "--json"]


def row_specs(binaries: list[str], rungs: list, gpu_counts: list[int]) -> list[RowSpec]:
    """bin/train alone on one GPU, with --gpus N on several; a PyTorch rung alone on one GPU, under
    torchrun on several."""
    specs = []
    for b in binaries:
        for n in gpu_counts:
            specs.append(RowSpec(b, n, [b] if n == 1 else [b, "--gpus", str(n)]))
    for r in rungs:
        label = pytorch_rungs.variant_label(r)
        for n in gpu_counts:
            script = [str(PYTORCH_TRAIN), "--rung", r.name]
            if n == 1:
                specs.append(RowSpec(label, 1, [sys.executable, *script], pytorch=True))
            else:
                torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n)]
                specs.append(RowSpec(label + " (DDP)", n, [*torchrun, *script], pytorch=True))
    return specs


@dataclass
class RowResult:
    spec: RowSpec
    runs: list[Run] = field(default_factory=list)


@dataclass
class Results:
    """What a report is made of: measured now, or read back from --record files (--combine)."""
    rows: list[RowResult]
    target: float
    gpu: str
    date: str
    flags: list[str]
    notes: list[str]


def median_range(values: list[float], fmt: str) -> str:
    """"12.3 (11.0–13.9)", or the value alone when there is one; "—" for none."""
    if not values:
        return "—"
    m = fmt.format(statistics.median(values))
    return m if len(values) == 1 else f"{m} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def summary_row(row: RowResult, target: float) -> str:
    """The row's line of the table: over its runs that did not fail."""
    good = [r for r in row.runs if r.failure is None]
    if not good:
        why = row.runs[-1].failure if row.runs else "no run"
        return f"| {row.spec.program} | {row.spec.gpus} | {why} | | | | | |"
    reached = [r.reached(target) for r in good]
    hit = [x for x in reached if x.seconds is not None]
    finals = [100 * x.final_acc for x in reached if x.final_acc is not None]
    startups = [s for s in (startup_seconds(r.stamped) for r in good) if s is not None]
    epochs = sorted(x.epoch for x in hit)
    failed = len(row.runs) - len(good)
    runs = f"{len(hit)} of {len(row.runs)}" + (f" ({failed} failed)" if failed else "")
    cells = [row.spec.program, str(row.spec.gpus), median_range([x.seconds for x in hit], "{:.1f}"), runs,
             ", ".join(map(str, epochs)) or "—", median_range(finals, "{:.2f}%"), median_range(startups, "{:.1f}"),
             median_range([r.total_s for r in good], "{:.1f}")]
    return "| " + " | ".join(cells) + " |"


def run_line(row: RowResult, run: Run, target: float) -> str:
    if run.failure:
        return f"| {row.spec.name} | {run.seed} | {run.failure} | | | | |"
    r = run.reached(target)
    at = f"{r.seconds:.1f}" if r.seconds is not None else "not reached"
    startup = startup_seconds(run.stamped)
    cells = [row.spec.name, str(run.seed), at, str(r.epoch) if r.epoch is not None else "—",
             f"{100 * r.final_acc:.2f}%" if r.final_acc is not None else "—",
             f"{startup:.1f}" if startup is not None else "—", f"{run.total_s:.1f}"]
    return "| " + " | ".join(cells) + " |"


def report(rows: list[RowResult], target: float, gpu: str, date: str, flags: list[str], notes: list[str]) -> str:
    """The results file: the summary table (medians over the seeds), then every run."""
    pct = f"{100 * target:g}%"
    lines = [f"# Time to {pct} test accuracy on {gpu}, {date}", "",
             f"Flags: `{' '.join(flags)}`; each run alone, times from process start (median over the seeds, "
             "range in brackets). Start-up: process start to the first training step done.", ""]
    lines += [f"Note: {n}" for n in notes] + ([""] if notes else [])
    lines += [f"| program | GPUs | seconds to {pct} | seeds reaching it | epochs at it | final accuracy | "
              "start-up seconds | run seconds |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [summary_row(r, target) for r in rows]
    lines += ["", "## Every run", "", f"| row | seed | seconds to {pct} | epoch | final accuracy | start-up seconds | "
              "run seconds |", "| --- | --- | --- | --- | --- | --- | --- |"]
    lines += [run_line(r, run, target) for r in rows for run in r.runs]
    lines += startup_section(rows)
    return "\n".join(lines) + "\n"


def startup_section(rows: list[RowResult]) -> list[str]:
    """Where each row's start-up went, from its runs' `start-up:` lines (medians over the seeds); no
    section where no run printed one."""
    per_row = []
    for row in rows:
        found = []  # (phases, seconds to the first step) of each run that printed the line
        for r in row.runs:
            phases = startup_phases(r.stamped) if r.failure is None else None
            if phases is not None:
                found.append((phases, startup_seconds(r.stamped)))
        if found:
            per_row.append((row, found))
    if not per_row:
        return []
    names = []  # every phase, in the order the runs print them (a phase of some rows only, such as
    for _, found in per_row:  # ranks, goes after the phase it follows there); the age apart
        for p, _ in found:
            before = -1
            for n in (n for n in p if n != AGE):
                if n not in names:
                    names.insert(before + 1, n)
                before = names.index(n)
    lines = ["", "## Where the start-up went", "",
             "From bin/train's `start-up:` line (medians over the seeds, seconds): each set-up phase, the "
             "process's age at the end of its set-up, and from there to the first step done (the first steps "
             "and their graph capture; with --gpus, also the launcher's time before it started the rank).", "",
             "| row | " + " | ".join(names) + f" | {AGE} | then to the first step |",
             "| --- |" + " ---: |" * (len(names) + 2)]
    for row, found in per_row:
        cells = [median_range([p[n] for p, _ in found if n in p], "{:.2f}") for n in names]
        cells.append(median_range([p[AGE] for p, _ in found if AGE in p], "{:.2f}"))
        cells.append(median_range([first - p[AGE] for p, first in found if AGE in p and first is not None], "{:.2f}"))
        lines.append(f"| {row.spec.name} | " + " | ".join(cells) + " |")
    return lines


def curves(rows: list[RowResult]) -> list[tuple[str, list[list[tuple[float, float]]]]]:
    """Per row, the accuracy curve of each run that printed one: what the PNG draws."""
    return [(r.spec.name, [c for c in (accuracy_curve(run.stamped) for run in r.runs) if c]) for r in rows]


def run_stamped(cmd: list[str], timeout_s: float) -> tuple[list[tuple[float, str]], int | None, str]:
    """Runs cmd, stamping each stdout line as it arrives; a timer kills a run that outlasts timeout_s
    (silent or not). stderr goes to a file, so a chatty stderr cannot block the stdout reader."""
    t0 = time.monotonic()
    with tempfile.TemporaryFile("w+") as err:
        try:
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        except OSError as e:  # a program that vanished or lost its x bit since the check: a failed row
            return [], 127, f"error: cannot run {cmd[0]}: {e.strerror}"
        # daemon: a pending timer must not keep the tool alive after Ctrl-C (it would wait out timeout_s)
        timer = threading.Timer(timeout_s, p.kill)
        timer.daemon = True
        timer.start()
        try:
            stamped = [(time.monotonic() - t0, line.strip()) for line in p.stdout]
            code = p.wait()
        finally:  # on Ctrl-C too: no timer left pending, no child left running
            timer.cancel()
            if p.poll() is None:
                p.kill()
                p.wait()
            p.stdout.close()
        err.seek(0)
        return stamped, code, err.read()


def record_of(res: Results) -> dict:
    """What --record keeps: enough to make the report and the chart again (--combine)."""
    return {"tool": TOOL, "target": res.target, "gpu": res.gpu, "date": res.date, "flags": res.flags,
            "notes": res.notes,
            "rows": [{"program": r.spec.program, "gpus": r.spec.gpus, "base": r.spec.base, "pytorch": r.spec.pytorch,
                      "runs": [{"seed": run.seed, "stamped": run.stamped, "code": run.code, "err": run.err,
                                "total_s": run.total_s} for run in r.runs]} for r in res.rows]}


def load_record(path: Path) -> Results:
    """A --record file, checked: one line and exit 2 for one that is not (runner.die)."""
    try:
        rec = json.loads(path.read_text())
        rows = [RowResult(RowSpec(r["program"], int(r["gpus"]), list(r["base"]), bool(r["pytorch"])),
                          [Run(int(x["seed"]), [(float(t), str(line)) for t, line in x["stamped"]], x["code"],
                               str(x["err"]), float(x["total_s"])) for x in r["runs"]]) for r in rec["rows"]]
        if rec.get("tool") != TOOL:
            raise ValueError(f"not a record of {TOOL}")
        target, date = float(rec["target"]), str(rec["date"])
        if not 0 < target <= 1:  # also refuses nan
            raise ValueError(f"target {target!r} is not a test accuracy")
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", date):  # it names the results file
            raise ValueError(f"date {date!r} is not YYYY-MM-DD")
        if not any(run for row in rows for run in row.runs):
            raise ValueError("it holds no runs")
        return Results(rows, target, str(rec["gpu"]), date, [str(f) for f in rec["flags"]],
                       [str(n) for n in rec["notes"]])
    except OSError as e:
        runner.die(TOOL, f"--combine: cannot read {path}: {e.strerror}", code=2)
    except (ValueError, KeyError, TypeError) as e:  # json.JSONDecodeError is a ValueError
        runner.die(TOOL, f"--combine: {path} is not a record of --record ({e})", code=2)


def merged_rows(rows: list[RowResult], paths: list[Path]) -> list[RowResult]:
    """Rows of the same program on as many GPUs are one row of all their runs (seeds run on the GPUs of a
    host side by side, one record each), in the order each first came; a seed twice in one row is an error."""
    merged: dict[tuple, RowResult] = {}
    for row in rows:
        key = (row.spec.program, row.spec.gpus, row.spec.pytorch)
        if key not in merged:
            merged[key] = RowResult(row.spec, list(row.runs))
            continue
        seeds = {run.seed for run in merged[key].runs}
        if any(run.seed in seeds for run in row.runs):
            runner.die(TOOL, f"--combine: {row.spec.name} has a seed in two of {', '.join(p.name for p in paths)}: "
                             "each seed of a row once", code=2)
        merged[key].runs.extend(row.runs)
    return list(merged.values())


def combine_records(paths: list[Path]) -> Results:
    """The records of --combine as one: their rows in order, those of one program and GPU count merged;
    they must agree on what was measured."""
    recs = [load_record(p) for p in paths]
    first = recs[0]
    for path, rec in zip(paths[1:], recs[1:]):
        for key in ("target", "flags", "gpu"):
            if getattr(rec, key) != getattr(first, key):
                runner.die(TOOL, f"--combine: {path} has {key} {getattr(rec, key)!r}, {paths[0]} has "
                                 f"{getattr(first, key)!r}: the rows would not measure the same thing", code=2)
    notes = [n for rec in recs for n in rec.notes]
    notes.append("rows combined from " + ", ".join(p.name for p in paths) + " (--combine): each a run of this tool, "
                 "its runs one after another; the runs of different records may have gone at the same time on "
                 "other GPUs of one host; the records' dates: " + ", ".join(rec.date for rec in recs))
    rows = merged_rows([row for rec in recs for row in rec.rows], paths)
    return Results(rows, first.target, first.gpu, first.date, first.flags, notes)


def check_flags(p: argparse.ArgumentParser, flags: list[str]) -> None:
    """The flags after -- may not set what the tool sets for each run."""
    for f in flags:
        name = f.split("=", 1)[0]
        if name in OWN_FLAGS:
            instead = {"--seed": "--seeds", "--gpus": "--gpus before --"}.get(name, "nothing: the tool adds it")
            p.error(f"{name} after -- is set by the tool for each run (use {instead})")


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str], list, list[int], list[int]]:
    """Every argument, checked before any GPU is looked for: one line and exit 2 for a bad one."""
    args_end = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", type=float, default=0.94, help="test accuracy to reach (0.94)")
    p.add_argument("--gpus", default="1", metavar="LIST", help="GPU counts, each a row per program (1)")
    p.add_argument("--seeds", default="0,1,2", metavar="LIST", help="a run per seed in every row (0,1,2)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds before a run is stopped (1800)")
    p.add_argument("--out", type=Path, default=runner.REPO_ROOT / "bench" / "results")
    p.add_argument("--pytorch", default="", metavar="RUNGS",
                   help="a comma list of PyTorch reference rungs to time too (bench/pytorch_train.py)")
    p.add_argument("--record", type=Path, metavar="FILE", help="also keep every run's stamped lines here (JSON)")
    p.add_argument("--combine", type=Path, nargs="+", metavar="FILE",
                   help="run nothing: one table and chart of these --record files")
    p.add_argument("binaries", nargs="*", help="the programs to run, each with the flags after --")
    args = p.parse_args(argv[:args_end])
    flags = argv[args_end + 1:]
    if not 0 < args.target <= 1:  # also refuses nan: every comparison with it is false
        p.error(f"--target must be a test accuracy above 0 and at most 1, not {args.target:g}")
    runner.check_timeout(p, args.timeout)
    gpus = runner.parse_list(p, "--gpus", args.gpus, int, distinct=True)
    seeds = runner.parse_list(p, "--seeds", args.seeds, int, distinct=True)
    if any(n < 1 for n in gpus):
        p.error(f"--gpus {args.gpus!r}: each count must be at least 1")
    if any(s < 0 for s in seeds):
        p.error(f"--seeds {args.seeds!r}: each seed must be at least 0")
    check_flags(p, flags)
    for b in args.binaries:
        if shutil.which(b) is None:  # here, not as a traceback (or a failed row) after the other runs
            p.error(f"{b} is not an executable file")
    try:
        rungs = pytorch_rungs.parse_rungs(args.pytorch) if args.pytorch else []
    except ValueError as e:
        p.error(f"--pytorch: {e}")
    given = {a.split("=", 1)[0] for a in argv[:args_end]}
    if args.combine and (args.binaries or rungs or flags or args.record or
                         given & {"--target", "--gpus", "--seeds", "--timeout"}):
        p.error("--combine runs nothing: give it no programs, --pytorch, --record, --target, --gpus, --seeds, "
                "--timeout or flags after --")
    if args.record and args.record.is_dir():  # here, not after the runs
        p.error(f"--record {args.record} is a directory")
    if not args.binaries and not rungs and not args.combine:
        p.error("nothing to run: give binaries, --pytorch RUNGS or both")
    return args, flags, rungs, gpus, seeds


def main(argv: list[str]) -> int:
    args, flags, rungs, gpu_counts, seeds = parse_args(argv)
    if args.combine:
        combined = combine_records(args.combine)
        runner.prepare_out_dir(TOOL, args.out)
        write_report(combined, args.out)
        return 0
    notes = []
    if rungs and importlib.util.find_spec("torch") is None:
        notes.append(f"PyTorch is not installed here, so no rows for --pytorch {args.pytorch}")
        print(f"{TOOL}: {notes[-1]}", file=sys.stderr)
        rungs = []
        if not args.binaries:
            runner.die(TOOL, "nothing left to run: PyTorch is not installed and no binaries were given")
    gpus = runner.gpu_names()
    if not gpus:
        runner.die(TOOL, runner.NO_GPU_LINE)
    if max(gpu_counts) > len(gpus):
        runner.die(TOOL, f"--gpus {args.gpus}: this machine has {len(gpus)} GPU{'s' if len(gpus) > 1 else ''}")
    runner.prepare_out_dir(TOOL, args.out)
    if args.record:
        runner.prepare_out_dir(TOOL, args.record.parent, "--record")
    rows = [RowResult(spec) for spec in row_specs(args.binaries, rungs, gpu_counts)]
    for row in rows:
        for seed in seeds:
            t0 = time.monotonic()
            stamped, code, err = run_stamped(row.spec.command(seed, flags), args.timeout)
            row.runs.append(Run(seed, stamped, code, err, time.monotonic() - t0))
            print(run_line(row, row.runs[-1], args.target), flush=True)
    failures = [run.failure for row in rows for run in row.runs]
    if all(failures):  # a table of failures is no result: it must not overwrite a good one of the same name
        runner.die(TOOL, f"every run failed (the last: {failures[-1]}); no results written", code=1)
    measured = Results(rows, args.target, gpus[0], runner.today(), flags, notes)  # one date for both files
    write_report(measured, args.out)
    if args.record:  # after the report: a path that cannot be written loses the record, not the table
        runner.write_files(TOOL, {args.record: json.dumps(record_of(measured)) + "\n"})
    return 0


def write_report(res: Results, out: Path) -> None:
    """The results file and its chart, named by the target, the GPU and the date; the table to stdout."""
    text = report(res.rows, res.target, res.gpu, res.date, res.flags, res.notes)
    stem = f"time-to-{round(100 * res.target)}-{runner.slug(res.gpu)}-{res.date}"
    runner.write_files(TOOL, {out / f"{stem}.md": text})
    why_not = chart.write_accuracy_chart(curves(res.rows), out / f"{stem}.png", res.target,
                                         f"Test accuracy against wall seconds, {res.gpu}, {res.date}")
    print(text, end="")
    if why_not:
        print(f"{TOOL}: {why_not}", file=sys.stderr)


if __name__ == "__main__":
    runner.main_entry(TOOL, lambda: main(sys.argv[1:]))
