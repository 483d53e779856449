#!/usr/bin/env python3
"""`make bench-scaling`: images/s of data-parallel training on 1, 2, 4, ... GPUs of this machine, at
the same batch per GPU, and the scaling efficiency: images/s on N GPUs over N times the images/s
on one. Beside it, the exposed all-reduce time per step (from the end of backward to the end of
the last gradient bucket, measured by the trainer with CUDA events; bin/train --json reports it).

Each binary runs `--gpus N --data synthetic --batch B --steps W+T --warmup-steps W --profile-steps T
--no-eval --json` --runs times (median in the table). bin/train overlaps the gradient buckets with
backward; bin/train-ddp-naive all-reduces once after the whole backward, for comparison.

    python3 bench/scaling.py --gpus 1,2,4 --batch 128

Writes bench/results/scaling-<gpu>-<date>.{md,csv}.
"""

from __future__ import annotations

import argparse
import csv
import io
import shlex
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from lib import runner, table

TOOL = "bench-scaling"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", default="", help="comma list of GPU counts (default: 1, 2, 4, ... up to the GPUs here)")
    p.add_argument("--batch", type=int, default=128, help="images per GPU (128)")
    p.add_argument("--warmup-steps", type=int, default=30, help="steps before the timed window (30)")
    p.add_argument("--timed-steps", type=int, default=100, help="steps in the timed window (100)")
    p.add_argument("--runs", type=int, default=3, help="runs per point; the table shows the median (3)")
    p.add_argument("--variants", default="train,train-ddp-naive", help="binaries (train,train-ddp-naive)")
    p.add_argument("--extra", default="", help="more bin/train flags, as one argument: --extra=\"--allreduce-dtype fp32\"")
    p.add_argument("--out", type=Path, default=runner.REPO_ROOT / "bench" / "results")
    p.add_argument("--bin-dir", type=Path, default=runner.BIN_DIR)
    p.add_argument("--timeout", type=float, default=900, help="seconds before a run counts as failed (900)")
    args = p.parse_args(argv)
    # --gpus '' (the default) means 1, 2, 4, ... up to the GPUs here
    args.gpu_counts = runner.parse_list(p, "--gpus", args.gpus, int, distinct=True) if args.gpus.strip() else []
    if any(g < 1 for g in args.gpu_counts):
        p.error(f"--gpus must be at least 1, not {min(args.gpu_counts)}")
    runner.check_at_least(p, args, batch=1, runs=1, timed_steps=1, warmup_steps=0)
    runner.check_timeout(p, args.timeout)
    args.variant_list = runner.parse_variants(p, args.variants, with_all=False)
    runner.check_known(p, "--variants", args.variant_list, args.bin_dir)
    args.extra_flags = runner.split_flags(p, "--extra", args.extra)
    return args


def default_counts(available: int) -> list[int]:
    counts, n = [], 1
    while n <= available:
        counts.append(n)
        n *= 2
    if available not in counts:
        counts.append(available)
    return counts


def command(binary: Path, gpus: int, args: argparse.Namespace) -> list[str]:
    cmd = [str(binary)] + (["--gpus", str(gpus)] if gpus > 1 else [])
    return cmd + ["--data", "synthetic", "--batch", str(args.batch),
                  "--steps", str(args.warmup_steps + args.timed_steps), "--warmup-steps", str(args.warmup_steps),
                  "--profile-steps", str(args.timed_steps), "--no-eval", "--json", *args.extra_flags]


@dataclass
class Point:
    """One binary on one GPU count: table.Row's images/s runs (at the global batch), and the median
    exposed all-reduce time."""
    gpus: int
    row: table.Row
    exposed_ms: float | None = None


def make_point(variant: str, gpus: int, batch: int, results: list[dict | str]) -> Point:
    exposed = [v for v in (table.number(r.get("allreduce_exposed_ms_per_step")) for r in results
                           if isinstance(r, dict)) if v is not None]
    return Point(gpus, table.build_row(variant, batch * gpus, results), statistics.median(exposed) if exposed else None)


def efficiency(point: Point, points: list[Point]) -> float | None:
    """images/s on N GPUs over N times the same binary's images/s on one GPU."""
    one = next((p for p in points if p.row.variant == point.row.variant and p.gpus == 1), None)
    if one is None or point.row.failed or one.row.failed:
        return None
    return point.row.median / (point.gpus * one.row.median)


def rows(points: list[Point]) -> list[list[str]]:
    out = []
    for p in points:
        eff = efficiency(p, points)
        per_gpu = table.fmt(p.row.median / p.gpus, 0, True) if not p.row.failed else table.MISSING
        out.append([p.row.variant, str(p.gpus), str(p.row.batch), table.images_cell(p.row), per_gpu,
                    f"{100 * eff:.1f}%" if eff is not None else table.MISSING, table.fmt(p.row.ms_per_step, 2),
                    table.fmt(p.exposed_ms, 3) if p.gpus > 1 else "—", "; ".join(p.row.notes)])
    return out


HEADER = ["variant", "GPUs", "global batch", "images/s median (min–max)", "images/s per GPU",
          "scaling efficiency", "ms/step", "all-reduce exposed ms/step", "notes"]


def markdown(points: list[Point]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows(points)]
    return "\n".join(lines) + "\n"


def csv_text(points: list[Point]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(HEADER)
    w.writerows(rows(points))
    return buf.getvalue()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    gpus = runner.gpu_names()
    if not gpus:
        runner.die(TOOL, runner.NO_GPU_LINE)
    counts = args.gpu_counts or default_counts(len(gpus))
    if max(counts) > len(gpus):
        runner.die(TOOL, f"--gpus {max(counts)} needs {max(counts)} GPUs; this machine has {len(gpus)}")
    binaries, missing = runner.find_binaries(args.variant_list, args.bin_dir)
    if missing:
        runner.die(TOOL, runner.missing_binaries_line(missing, args.bin_dir))
    runner.prepare_out_dir(TOOL, args.out)
    guard = runner.GuardedRunner(TOOL)
    points = []
    for variant in args.variant_list:
        for n in counts:
            results = []
            for run in range(args.runs):
                print(f"{TOOL}: {variant} on {n} GPU{'s' if n > 1 else ''}, run {run + 1}/{args.runs}",
                      file=sys.stderr, flush=True)
                results.append(table.result_of(guard.run(command(binaries[variant], n, args), args.timeout)))
            points.append(make_point(variant, n, args.batch, results))
    print(markdown(points), end="")
    runner.stop_if_all_failed(TOOL, [p.row for p in points])
    date = runner.today()
    command_line = "python3 bench/scaling.py " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    report = (f"# Data-parallel scaling, {gpus[0]}, {date}\n\n- command: `{command_line}`\n"
              f"- synthetic data, batch {args.batch} per GPU, {args.warmup_steps} warm-up + {args.timed_steps} timed "
              f"steps, median of {args.runs} runs; efficiency = images/s on N GPUs / (N x images/s on 1)\n\n"
              + markdown(points))
    stem = args.out / f"scaling-{runner.slug(gpus[0])}-{date}"
    runner.write_files(TOOL, {stem.with_suffix(".md"): report, stem.with_suffix(".csv"): csv_text(points)})
    print(f"{TOOL}: wrote {stem}.md and .csv", file=sys.stderr)
    return 0


if __name__ == "__main__":
    runner.main_entry(TOOL, main)
