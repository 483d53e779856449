#!/usr/bin/env python3
"""`make bench-scaling`: images/s of data-parallel training on 1, 2, 4, ... GPUs of this machine, at
the same batch per GPU, and the scaling efficiency: images/s on N GPUs over N times the images/s
on one. Beside it, what the gradient all-reduce costs a step, as bin/train --json reports it (GPU
timestamps around every bucket, in eager and CUDA-graph steps alike): the bytes each rank sends,
the bus bandwidth its communication stream achieved, and the time left exposed after backward.

Each binary runs `--gpus N --data synthetic --batch B --steps W+T --warmup-steps W --profile-steps T
--no-eval --json` --runs times (median in the table). bin/train overlaps the gradient buckets with
backward; bin/train-ddp-naive all-reduces once after the whole backward, for comparison.

--transport network runs every GPU count above one as that many machines simulated on this one
(lib/ranks.py): each rank is started with torchrun's variables but LOCAL_RANK=0 and one GPU of its
own (CUDA_VISIBLE_DEVICES), and NCCL is kept off peer-to-peer, shared memory and InfiniBand, so the
gradients cross its socket transport over the loopback interface; --socket-threads and
--socks-per-thread set NCCL_SOCKET_NTHREADS and NCCL_NSOCKS_PERTHREAD for it.

    python3 bench/scaling.py --gpus 1,2,4 --batch 128
    python3 bench/scaling.py --gpus 1,2 --transport network --socket-threads 4 --socks-per-thread 4 \
        --extra="--grad-compression int8"

Writes bench/results/scaling-<gpu>-<date>.{md,csv} (scaling-network-<gpu>-<date> for the network
transport).
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import shlex
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from lib import ranks, runner, table

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
    p.add_argument("--transport", choices=ranks.TRANSPORTS, default="local",
                   help="local: bin/train --gpus N on this machine (NVLink, PCIe); network: each rank a machine of "
                        "its own, NCCL over its socket transport on the loopback interface (local)")
    p.add_argument("--socket-threads", type=int, default=None,
                   help="--transport network: NCCL_SOCKET_NTHREADS, NCCL's socket threads per connection (NCCL's default)")
    p.add_argument("--socks-per-thread", type=int, default=None,
                   help="--transport network: NCCL_NSOCKS_PERTHREAD, sockets per thread (NCCL's default)")
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
    if args.transport != "network" and (args.socket_threads is not None or args.socks_per_thread is not None):
        p.error("--socket-threads and --socks-per-thread set NCCL's socket transport: they need --transport network")
    for flag, value in (("--socket-threads", args.socket_threads), ("--socks-per-thread", args.socks_per_thread)):
        if value is not None and not 1 <= value <= 64:
            p.error(f"{flag} must be between 1 and 64 (NCCL's limit on threads x sockets is 64), not {value}")
    if (args.socket_threads or 1) * (args.socks_per_thread or 1) > 64:
        p.error("--socket-threads x --socks-per-thread must be at most 64 (NCCL's limit)")
    args.sockets = ranks.SocketSettings(args.socket_threads, args.socks_per_thread)
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
    """One run's command line: bin/train --gpus N, or (the network transport) each rank's own."""
    starts_ranks = gpus > 1 and args.transport == "local"
    cmd = [str(binary)] + (["--gpus", str(gpus)] if starts_ranks else [])
    return cmd + ["--data", "synthetic", "--batch", str(args.batch),
                  "--steps", str(args.warmup_steps + args.timed_steps), "--warmup-steps", str(args.warmup_steps),
                  "--profile-steps", str(args.timed_steps), "--no-eval", "--json", *args.extra_flags]


def run_point(guard: runner.GuardedRunner, binary: Path, gpus: int, args: argparse.Namespace) -> runner.RunOutput:
    """One run on `gpus` GPUs: one process (one GPU, or --gpus N), or one per simulated machine."""
    cmd = command(binary, gpus, args)
    if gpus == 1 or args.transport == "local":
        return guard.run(cmd, args.timeout)
    envs = ranks.rank_environments(gpus, ranks.free_port(), dict(os.environ), args.transport, args.sockets)
    return ranks.as_one_run(ranks.run_ranks(cmd, envs, args.timeout))


@dataclass
class Point:
    """One binary on one GPU count: table.Row's images/s runs (at the global batch), and the medians
    of rank 0's all-reduce: exposed ms a step, MB a step, bus bandwidth."""
    gpus: int
    row: table.Row
    exposed_ms: float | None = None
    mb_per_step: float | None = None
    busbw_gbs: float | None = None


def median_of(values: list[float | None]) -> float | None:
    found = [v for v in values if v is not None]
    return statistics.median(found) if found else None


def allreduce_of(summary: dict) -> tuple[float | None, float | None]:
    """MB a step and rank 0's bus bandwidth from a summary's "allreduce" object (None where absent)."""
    a = summary.get("allreduce")
    if not isinstance(a, dict):
        return None, None
    mb = table.number(a.get("bytes_per_step"))
    rank0 = (a.get("ranks") or {}).get("0") if isinstance(a.get("ranks"), dict) else None
    return (mb / 1e6 if mb is not None else None,
            table.number(rank0.get("busbw_gbs")) if isinstance(rank0, dict) else None)


def make_point(variant: str, gpus: int, batch: int, results: list[dict | str]) -> Point:
    good = [r for r in results if isinstance(r, dict)]
    reduce = [allreduce_of(r) for r in good]
    return Point(gpus, table.build_row(variant, batch * gpus, results),
                 median_of([table.number(r.get("allreduce_exposed_ms_per_step")) for r in good]),
                 median_of([m for m, _ in reduce]), median_of([b for _, b in reduce]))


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
        several = p.gpus > 1
        out.append([p.row.variant, str(p.gpus), str(p.row.batch), table.images_cell(p.row), per_gpu,
                    f"{100 * eff:.1f}%" if eff is not None else table.MISSING, table.fmt(p.row.ms_per_step, 2),
                    table.fmt(p.exposed_ms, 3) if several else "—", table.fmt(p.mb_per_step, 1) if several else "—",
                    table.fmt(p.busbw_gbs, 2) if several else "—", "; ".join(p.row.notes)])
    return out


HEADER = ["variant", "GPUs", "global batch", "images/s median (min–max)", "images/s per GPU",
          "scaling efficiency", "ms/step", "all-reduce exposed ms/step", "all-reduce MB/step", "bus GB/s", "notes"]


def markdown(points: list[Point]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows(points)]
    return "\n".join(lines) + "\n"


def csv_text(points: list[Point]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(HEADER)
    w.writerows(rows(points))
    return buf.getvalue()


def micro_batches(flags: list[str]) -> int:
    """--accumulate N among bin/train's flags: a step takes N x --batch images per GPU."""
    for i, f in enumerate(flags):
        if f.startswith("--accumulate="):
            return int(f.split("=", 1)[1]) if f.split("=", 1)[1].isdigit() else 1
        if f == "--accumulate" and i + 1 < len(flags) and flags[i + 1].isdigit():
            return int(flags[i + 1])
    return 1


def transport_line(args: argparse.Namespace) -> str:
    if args.transport == "local":
        return "transport: local (bin/train --gpus N; NCCL picks NVLink, PCIe or shared memory)"
    nccl = " ".join(f"{k}={v}" for k, v in ranks.NETWORK_NCCL.items())
    return (f"transport: network, each rank a machine of its own (LOCAL_RANK=0, one GPU each; {nccl}, "
            f"NCCL_IB_DISABLE=1 unless set; {args.sockets.describe()})")


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
                results.append(table.result_of(run_point(guard, binaries[variant], n, args)))
            points.append(make_point(variant, n, args.batch * micro_batches(args.extra_flags), results))
    print(markdown(points), end="")
    runner.stop_if_all_failed(TOOL, [p.row for p in points])
    date = runner.today()
    command_line = "python3 bench/scaling.py " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    report = (f"# Data-parallel scaling, {gpus[0]}, {date}\n\n- command: `{command_line}`\n"
              f"- synthetic data, batch {args.batch} per GPU, {args.warmup_steps} warm-up + {args.timed_steps} timed "
              f"steps, median of {args.runs} runs; efficiency = images/s on N GPUs / (N x images/s on 1)\n"
              f"- {transport_line(args)}\n"
              f"- all-reduce columns: rank 0's, from bin/train's GPU timestamps (bus GB/s = MB a step x 2(N-1)/N "
              f"over the communication stream's time on the buckets)\n\n"
              + markdown(points))
    kind = "scaling-network" if args.transport == "network" else "scaling"
    stem = args.out / f"{kind}-{runner.slug(gpus[0])}-{date}"
    runner.write_files(TOOL, {stem.with_suffix(".md"): report, stem.with_suffix(".csv"): csv_text(points)})
    print(f"{TOOL}: wrote {stem}.md and .csv", file=sys.stderr)
    return 0


if __name__ == "__main__":
    runner.main_entry(TOOL, main)
