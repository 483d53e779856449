#!/usr/bin/env python3
"""Does every rung still train a good model? Each rung's final test accuracy on Fashion-MNIST over
several seeds, against a floor.

A faster rung that trains a worse model is a bug, so the ladder's target is every rung at 93.8% or
more after 15 epochs, with three seeds where a result is within half a point of that. This tool runs
every (rung, seed) pair to its end:

    bin/<rung> --data fashion-mnist --epochs E --batch B [flags after --] --seed S --json
        --autotune-cache <that rung's cache>

First, one rung after another and alone on the GPU, a fill run of each rung (one step, no
evaluation, not counted) measures its cuDNN engines into an autotune cache of its own, in a temporary
directory removed at the end. Its training runs then read that cache: none of them autotunes beside
another run or writes a file another writes. A rung whose fill run fails is not run further (its
runs are reported failed, with the fill run's reason). Then the training runs, --jobs at a time, in
the current directory (bin/train writes nothing there unless asked). By default one run a visible
GPU (`nvidia-smi -L`, or the list in CUDA_VISIBLE_DEVICES), the k-th job slot on the k-th GPU. On
one H200, two train-graph runs side by side took 179 s together, where a run of train-fusedbn,
-cudagraph or -wgradstream alone takes 36-42 s. Runs sharing a GPU (--jobs above the GPUs, slots
round robin) each run slower, so their seconds are not throughput figures.

    python3 bench/rung_accuracy.py                                   # the ladder, seeds 1,2,3, a run a GPU
    python3 bench/rung_accuracy.py --variants graph,fusedbn --seeds 2,3 --out acc.md
    python3 bench/rung_accuracy.py --variants train --seeds 1 --floor 94 -- --lr 0.03

The report: a row per binary with each seed's final test accuracy, the mean and the lowest; a line
saying which runs ended below --floor or failed; then every run's test accuracy per epoch, and the
last lines a failed run printed. It goes to stdout, and to --out FILE.md where given. Exit status 0
when every run ended at the floor or above, 1 when any ended below it or failed (the report is still
written, with how far each failed run got), 2 for a usage error, no GPU (nvidia-smi lists none, or
the first fill run finds no CUDA device) or a binary not built.
"""

from __future__ import annotations

import argparse
import os
import queue
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from lib import runner, table

TOOL = "rung-accuracy"
# Set by the tool for every run: not to be given after --.
TOOL_FLAGS = ["--data", "--epochs", "--batch", "--seed", "--json", "--autotune-cache", "--steps", "--no-eval"]
FAILED_LINES = 10  # of a failed run's stderr, kept in the report


@dataclass
class Run:
    """One (binary, seed) run, and what it left."""
    binary: str
    seed: int
    gpu: str | None = None          # CUDA_VISIBLE_DEVICES given to it (None: left as it was)
    seconds: float | None = None
    final: float | None = None      # final test accuracy, 0..1
    curve: list[float] = field(default_factory=list)  # test accuracy at each epoch it ran, 0..1
    epochs: list[int] = field(default_factory=list)   # those epochs' numbers (a resumed run starts late)
    failure: str | None = None
    stderr_tail: list[str] = field(default_factory=list)  # a failed run's last lines
    summary: dict = field(default_factory=dict)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    argv = sys.argv[1:] if argv is None else argv
    extra: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1:]
    p = runner.OneLineParser(TOOL, prog="bench/rung_accuracy.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", default="all", metavar="LIST",
                   help="rungs to run: ladder names, 'all' (the ladder, the default) or 'train' for bin/train")
    p.add_argument("--seeds", default="1,2,3", metavar="LIST", help="seeds, a comma list (1,2,3)")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="runs at a time (one a visible GPU; more share a GPU and run slower)")
    p.add_argument("--floor", type=float, default=93.8, metavar="PCT",
                   help="the final test accuracy, in percent, that every run must reach (93.8)")
    p.add_argument("--epochs", type=int, default=15, metavar="E", help="epochs a run (15)")
    p.add_argument("--batch", type=int, default=128, metavar="B", help="images a step (128)")
    p.add_argument("--timeout", type=float, default=3600, metavar="S", help="seconds before a run is stopped (3600)")
    p.add_argument("--bin-dir", type=Path, default=runner.BIN_DIR, metavar="DIR", help="where the binaries are (bin/)")
    p.add_argument("--out", type=Path, default=None, metavar="FILE.md", help="also write the report here")
    args = p.parse_args(argv)
    args.extra = extra
    args.binaries = runner.parse_variants(p, args.variants)
    args.seed_list = runner.parse_list(p, "--seeds", args.seeds, int, distinct=True)
    if any(s < 0 for s in args.seed_list):
        p.error(f"--seeds {args.seeds!r}: each seed must be at least 0")
    runner.check_at_least(p, args, epochs=1, batch=1)
    if args.jobs is not None:
        runner.check_at_least(p, args, jobs=1)
    runner.check_timeout(p, args.timeout)
    if not 0 < args.floor <= 100:
        p.error(f"--floor is a percentage above 0 and at most 100, not {args.floor:g}")
    for flag in extra:
        if flag.split("=", 1)[0] in TOOL_FLAGS:
            p.error(f"{flag.split('=', 1)[0]} after -- is set by the tool for every run")
    runner.check_known(p, "--variants", args.binaries, args.bin_dir)
    args.bin_dir = args.bin_dir.resolve()
    if args.out is not None:
        if args.out.is_dir():
            p.error(f"--out {args.out}: is a directory (--out takes a file name, e.g. accuracy.md)")
        runner.prepare_out_dir(TOOL, args.out.parent)
    return args


def visible_gpus(count: int) -> list[str | None]:
    """What each job slot's CUDA_VISIBLE_DEVICES is set to: one GPU each, round robin, where several
    are visible; [None] (left as it is) where one is, or none (CUDA_VISIBLE_DEVICES set empty)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [str(i) for i in range(count)] if listed is None else [g.strip() for g in listed.split(",") if g.strip()]
    return ids if len(ids) > 1 else [None]


def result_of(run: Run, out: runner.RunOutput, total_epochs: int) -> Run:
    """A finished run's final accuracy and curve from its --json lines, or why it does not count (with
    how far a run that stopped early got: its curve is kept and reported)."""
    run.failure = table.failure_reason(out)
    objects = table.parse_json_lines(out.stdout)
    for o in (o for o in objects if o.get("event") == "epoch"):
        accuracy, number = table.number(o.get("test_acc")), table.number(o.get("epoch"))
        if accuracy is not None:
            run.curve.append(accuracy)
            run.epochs.append(int(number) if number is not None else len(run.epochs) + 1)
    if run.failure is not None:
        run.stderr_tail = [line for line in out.stderr.splitlines() if line.strip()][-FAILED_LINES:]
        if run.curve:
            run.failure += f", after epoch {run.epochs[-1]} of {total_epochs} (test {pct(run.curve[-1])})"
    summary = next((o for o in objects if o.get("event") == "summary"), {})
    run.summary = summary
    run.final = table.number(summary.get("final_test_acc"))
    if run.failure is None and run.final is None:
        run.failure = "its summary has no final test accuracy (was it run with --no-eval?)"
    return run


class Pool:
    """--jobs worker threads taking runs off a queue; every child is killed if the tool is stopped."""

    def __init__(self, args: argparse.Namespace, binaries: dict[str, Path], scratch: Path):
        self.args, self.binaries, self.scratch = args, binaries, scratch
        self.children: set[subprocess.Popen] = set()
        self.lock = threading.Lock()
        self.stopping = False
        self.slots = 0  # training runs at a time, once started: none where every fill run failed

    def cache(self, binary: str) -> Path:
        return self.scratch / f"{binary}.autotune-cache.txt"

    def command(self, binary: str, seed: int, before: list[str], after: list[str]) -> list[str]:
        """A run of the rung on Fashion-MNIST with the flags after -- and its own cache: `before` goes
        ahead of --batch, `after` behind the flags after --."""
        return [str(self.binaries[binary]), "--data", "fashion-mnist", *before, "--batch", str(self.args.batch),
                *self.args.extra, *after, "--seed", str(seed), "--json", "--autotune-cache", str(self.cache(binary))]

    def fill(self, binary: str, seed: int, guard: runner.GuardedRunner) -> str | None:
        """The rung's fill run, alone: one step, no evaluation, its engines measured into its cache. Why
        it failed, or None."""
        print(f"{TOOL}: {binary}: fill run (measures its engines alone into its autotune cache; not counted)",
              file=sys.stderr, flush=True)
        out = guard.run(self.command(binary, seed, [], ["--steps", "1", "--no-eval"]), self.args.timeout)
        return table.failure_reason(out)

    def execute(self, run: Run) -> runner.RunOutput:
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": run.gpu} if run.gpu is not None else None
        try:
            cmd = self.command(run.binary, run.seed, ["--epochs", str(self.args.epochs)], [])
            child = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     errors="replace")
        except OSError as e:
            return runner.RunOutput(127, "", f"error: cannot run {self.binaries[run.binary]}: {e.strerror}")
        with self.lock:
            if self.stopping:
                child.kill()
            self.children.add(child)
        try:
            stdout, stderr = child.communicate(timeout=self.args.timeout)
            return runner.RunOutput(child.returncode, stdout, stderr, self.args.timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            stdout, stderr = child.communicate()
            return runner.RunOutput(None, stdout, stderr, self.args.timeout)
        finally:
            with self.lock:
                self.children.discard(child)

    def worker(self, todo: queue.Queue, gpu: str | None, done: list[Run]) -> None:
        while True:
            with self.lock:
                if self.stopping or todo.empty():
                    return
                run = todo.get_nowait()
                run.gpu = gpu
                where = f" on GPU {gpu}" if gpu is not None else ""
                print(f"{TOOL}: {run.binary} seed {run.seed}{where}: started", file=sys.stderr, flush=True)
            t0 = time.monotonic()
            out = self.execute(run)
            run.seconds = time.monotonic() - t0
            result_of(run, out, self.args.epochs)
            how = run.failure or f"{100 * run.final:.2f}%"
            with self.lock:  # (stopped: a run killed by the tool says nothing after the tool's last line)
                if self.stopping:
                    return
                print(f"{TOOL}: {run.binary} seed {run.seed}: {how} ({run.seconds:.0f} s)", file=sys.stderr, flush=True)
                done.append(run)

    def run_all(self, runs: list[Run], gpus: list[str | None]) -> list[Run]:
        """The fill runs, then the training runs of every rung whose fill run did not fail."""
        guard = runner.GuardedRunner(TOOL)
        done: list[Run] = []
        todo: queue.Queue = queue.Queue()
        for binary in dict.fromkeys(r.binary for r in runs):
            why = self.fill(binary, self.args.seed_list[0], guard)
            for r in (r for r in runs if r.binary == binary):
                if why is None:
                    todo.put(r)
                else:
                    r.failure, r.seconds = f"its fill run failed: {why}", 0.0
                    done.append(r)
        queued = todo.qsize()
        threads = [threading.Thread(target=self.worker, args=(todo, gpus[k % len(gpus)], done), daemon=True)
                   for k in range(min(self.args.jobs, queued))]
        self.slots = len(threads)
        for t in threads:
            t.start()
        try:
            for t in threads:
                while t.is_alive():
                    t.join(0.2)  # (a bare join would hold off Ctrl-C until the run ends)
        finally:
            with self.lock:
                self.stopping = True
                for child in self.children:
                    child.kill()
        order = {(r.binary, r.seed): k for k, r in enumerate(runs)}
        return sorted(done, key=lambda r: order[(r.binary, r.seed)])


def pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.2f}%"


def results_table(runs: list[Run], binaries: list[str], seeds: list[int]) -> str:
    by = {(r.binary, r.seed): r for r in runs}
    lines = ["| binary | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | lowest |",
             "| --- | " + " | ".join("---:" for _ in seeds) + " | ---: | ---: |"]
    for b in binaries:
        finals = [by[(b, s)].final for s in seeds if by[(b, s)].failure is None]
        cells = [pct(by[(b, s)].final) if by[(b, s)].failure is None else "failed" for s in seeds]
        of = f" ({len(finals)} of {len(seeds)})" if finals and len(finals) < len(seeds) else ""  # failed seeds left out
        mean, lowest = (statistics.fmean(finals), min(finals)) if finals else (None, None)
        lines.append(f"| `{b}` | " + " | ".join(cells) + f" | {pct(mean)}{of} | {pct(lowest)}{of} |")
    return "\n".join(lines) + "\n"


def verdict(runs: list[Run], floor: float) -> str:
    finished = [r for r in runs if r.failure is None]
    below = [r for r in finished if 100 * r.final < floor - 1e-9]
    failed = [r for r in runs if r.failure is not None]
    parts = []
    if not below and not failed:
        parts.append(f"Every run ended at {floor:.2f}% or more ({len(runs)} run{'s' if len(runs) > 1 else ''}).")
    else:
        parts.append(f"{len(finished) - len(below)} of {len(runs)} runs ended at {floor:.2f}% or more.")
    if below:
        parts.append("Below it: " + ", ".join(f"`{r.binary}` seed {r.seed} ({pct(r.final)})" for r in below) + ".")
    if failed:
        parts.append("Failed: " + "; ".join(f"`{r.binary}` seed {r.seed}: {r.failure}" for r in failed) + ".")
    return " ".join(parts) + "\n"


def runs_table(runs: list[Run], several_gpus: bool) -> str:
    """Each run; with several GPUs, which one it ran on."""
    gpu_head, gpu_rule = ("GPU | ", "--- | ") if several_gpus else ("", "")
    lines = [f"| binary | seed | {gpu_head}final | best epoch | seconds | test accuracy per epoch (%) |",
             f"| --- | ---: | {gpu_rule}---: | --- | ---: | --- |"]
    for r in runs:
        best = max(range(len(r.curve)), key=lambda k: r.curve[k]) if r.curve else None
        best_cell = f"{r.epochs[best]} ({pct(r.curve[best])})" if best is not None else "—"
        curve = " ".join(f"{100 * a:.1f}" for a in r.curve) or "—"
        final = pct(r.final) if r.failure is None else "failed"
        gpu = f"{r.gpu or '—'} | " if several_gpus else ""
        seconds = f"{r.seconds:.0f}" if r.seconds else "—"
        lines.append(f"| `{r.binary}` | {r.seed} | {gpu}{final} | {best_cell} | {seconds} | {curve} |")
    return "\n".join(lines) + "\n"


def how_run(slots: int, gpus: list[str | None]) -> str:
    """How the training runs shared the GPUs: slot k ran on gpus[k % len(gpus)]."""
    if slots == 0:
        return "no training run started (every fill run failed)"
    used = list(dict.fromkeys(gpus[k % len(gpus)] for k in range(slots)))
    if None in used or len(used) == 1:
        where = "on one GPU"
    else:
        where = f"on GPUs {', '.join(used)}, " + ("one a job slot" if slots == len(used) else "round robin")
    if slots > len(used):  # more runs at a time than GPUs: they share one, and slow each other
        return f"{slots} at a time {where}, so the seconds are not throughput figures"
    return f"{slots} at a time {where}, no two sharing a GPU"


def report(args: argparse.Namespace, argv: list[str], runs: list[Run], gpus: list[str | None], slots: int,
           gpu_name: str) -> str:
    meta = next((r.summary for r in runs if r.summary), {})
    gpu = str(meta.get("gpu") or gpu_name)
    date = runner.today()
    extra = f" {shlex.join(args.extra)}" if args.extra else ""
    return (f"# Fashion-MNIST test accuracy of each rung, {gpu}, {date}\n\n"
            f"- command: `python3 bench/rung_accuracy.py {shlex.join(argv)}`\n"
            f"- GPU: {gpu}; cuDNN {table.cudnn_version(meta.get('cudnn'))}; date: {date}\n"
            f"- each run: `bin/<binary> --data fashion-mnist --epochs {args.epochs} --batch {args.batch}{extra} "
            f"--seed S --json --autotune-cache <its binary's cache>`, the cache filled first by a run of the binary "
            f"alone (`--steps 1 --no-eval`); {how_run(slots, gpus)}\n"
            f"- floor: {args.floor:.2f}% final test accuracy\n\n"
            + results_table(runs, args.binaries, args.seed_list) + "\n" + verdict(runs, args.floor)
            + "\n## Each run\n\n" + runs_table(runs, gpus != [None]) + failed_lines(runs))


def failed_lines(runs: list[Run]) -> str:
    """The last lines each failed run printed on stderr, to tell why without running it again."""
    text = ""
    for r in runs:
        if r.failure is not None and r.stderr_tail:
            text += (f"\n`{r.binary}` seed {r.seed}, the last {len(r.stderr_tail)} lines it printed on stderr:\n\n"
                     "```\n" + "\n".join(r.stderr_tail) + "\n```\n")
    return ("\n## Failed runs\n" + text) if text else ""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    names, binaries = runner.require_gpu_and_binaries(TOOL, args.binaries, args.bin_dir)
    gpus = visible_gpus(len(names))
    if args.jobs is None:
        args.jobs = len(gpus)  # a run a GPU ([None]: one)
    runs = [Run(b, s) for b in args.binaries for s in args.seed_list]
    with tempfile.TemporaryDirectory(prefix="rung-accuracy-") as scratch:
        pool = Pool(args, binaries, Path(scratch))
        runs = pool.run_all(runs, gpus)
    text = report(args, argv, runs, gpus, pool.slots, names[0])
    print(text, end="")
    if args.out is not None:
        runner.write_files(TOOL, {args.out: text})
        print(f"{TOOL}: wrote {args.out}", file=sys.stderr)
    ok = all(r.failure is None and 100 * r.final >= args.floor - 1e-9 for r in runs)
    return 0 if ok else 1


if __name__ == "__main__":
    runner.main_entry(TOOL, main)
