#!/usr/bin/env python3
"""Wall-clock time from process start to the first epoch at a test accuracy, for each binary given.

Each binary runs alone (one after the other, so none shares the GPU), with --json; every line it
prints is stamped with the seconds since the process was started, and the first epoch line whose
test_acc reaches --target gives the time: start-up, data loading, autotuning, training and every
evaluation up to that one included. The run goes on to its end (its final accuracy is reported too).

    python3 bench/time_to_accuracy.py --target 0.94 --pytorch resident-amp-cl-graphs \
        bin/train bin/train-baseline -- --data fashion-mnist --epochs 15

--pytorch adds a row per rung of the PyTorch reference trained with bin/train's recipe
(bench/pytorch_train.py, given the same flags). The table goes to stdout and to
bench/results/time-to-<target>-<gpu>-<date>.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from lib import pytorch_rungs, runner

TOOL = "time-to-accuracy"
PYTORCH_TRAIN = Path(__file__).resolve().parent / "pytorch_train.py"


@dataclass
class Reached:
    epoch: int | None       # first epoch at the target (None: never)
    seconds: float | None   # seconds from process start to that epoch's line
    final_acc: float | None
    total_s: float


def first_at_target(stamped: list[tuple[float, str]], target: float, total_s: float) -> Reached:
    """From (seconds since start, line) pairs: the first epoch whose test_acc >= target."""
    epoch = seconds = final = None
    for t, line in stamped:
        if not line.startswith("{"):
            continue
        try:
            j = json.loads(line)
        except json.JSONDecodeError:
            continue
        acc = j.get("test_acc") if j.get("event") == "epoch" else j.get("final_test_acc")
        if not isinstance(acc, (int, float)):
            continue
        if j.get("event") == "summary":
            final = acc
        elif epoch is None and acc >= target:
            epoch, seconds = j["epoch"], t
    return Reached(epoch, seconds, final, total_s)


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


def row(name: str, r: Reached, code: int | None, err: str) -> str:
    if code != 0:
        return f"| {name} | failed (exit {code}): {runner.last_line(err)} | | | |"
    at = f"{r.seconds:.1f}" if r.seconds is not None else "not reached"
    epoch = str(r.epoch) if r.epoch is not None else "—"
    final = f"{100 * r.final_acc:.2f}%" if r.final_acc is not None else "—"
    return f"| {name} | {at} | {epoch} | {final} | {r.total_s:.1f} |"


def main(argv: list[str]) -> int:
    args_end = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", type=float, default=0.94, help="test accuracy to reach (0.94)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds before a run is stopped (1800)")
    p.add_argument("--out", type=Path, default=runner.REPO_ROOT / "bench" / "results")
    p.add_argument("--pytorch", default="", metavar="RUNGS",
                   help="a comma list of PyTorch reference rungs to time too (bench/pytorch_train.py)")
    p.add_argument("binaries", nargs="*", help="the programs to run, each with the flags after --")
    args = p.parse_args(argv[:args_end])
    flags = argv[args_end + 1:]
    if not 0 < args.target <= 1:  # also refuses nan: every comparison with it is false
        p.error(f"--target must be a test accuracy above 0 and at most 1, not {args.target:g}")
    runner.check_timeout(p, args.timeout)
    for b in args.binaries:
        if shutil.which(b) is None:  # here, not as a traceback (or a failed row) after the other runs
            p.error(f"{b} is not an executable file")
    try:
        rungs = pytorch_rungs.parse_rungs(args.pytorch) if args.pytorch else []
    except ValueError as e:
        p.error(f"--pytorch: {e}")
    runs = [(b, [b]) for b in args.binaries] + [
        (pytorch_rungs.variant_label(r), [sys.executable, str(PYTORCH_TRAIN), "--rung", r.name]) for r in rungs]
    if not runs:
        p.error("nothing to run: give binaries, --pytorch RUNGS or both")
    gpus = runner.gpu_names()
    if not gpus:
        runner.die(TOOL, runner.NO_GPU_LINE)
    runner.prepare_out_dir(TOOL, args.out)
    lines = [f"# Time to {100 * args.target:g}% test accuracy on {gpus[0]}, {runner.today()}", "",
             f"Flags: `{' '.join(flags)}`; each run alone, time from process start.", "",
             "| program | seconds to target | epoch | final accuracy | run seconds |", "| --- | --- | --- | --- | --- |"]
    for name, cmd in runs:
        t0 = time.monotonic()
        stamped, code, err = run_stamped([*cmd, *flags, "--json"], args.timeout)
        r = first_at_target(stamped, args.target, time.monotonic() - t0)
        lines.append(row(name, r, code, err))
        print(lines[-1], flush=True)
    name = f"time-to-{round(100 * args.target)}-{runner.slug(gpus[0])}-{runner.today()}.md"
    runner.write_files(TOOL, {args.out / name: "\n".join(lines) + "\n"})
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    runner.main_entry(TOOL, lambda: main(sys.argv[1:]))
