#!/usr/bin/env python3
"""`make profile GPUS=N`: bin/train on N GPUs of this machine, every rank profiled by Nsight Systems.

The ranks are started as torchrun starts them (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT), each under its own `nsys profile -o <out>/<name>_%q{RANK}` over the steady-state
window (cudaProfilerApi), so there is one report per rank, named by its rank; open them together
in Nsight Systems' multi-report view. Each report is condensed as `make profile` condenses one
binary's (lib/nsys_summary.py), plus what the gradient all-reduce cost: the time NCCL kernels ran per
step, how much of it backward hid (other kernels running at the same time) and how much was left
exposed.

    python3 bench/profile_ranks.py --gpus 2 --batch 128
    python3 bench/profile_ranks.py --gpus 2 --transport network --socket-threads 4 --socks-per-thread 4

--transport network profiles the machines simulated on this one as bench/scaling.py runs them
(lib/ranks.py: one GPU and LOCAL_RANK=0 per rank, NCCL on its socket transport over the loopback
interface); the reports are then named <binary>-<N>gpu-network_<rank>.

Writes <out>/<name>_<rank>.md beside the raw reports and bench/results/profiles-<N>gpu-<gpu>-<date>.md.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from lib import capture, nsys_summary, ranks, runner, table
from lib.ranks import free_port, run_ranks
from lib.timeline import ProfileSummary, to_markdown, where_the_time_goes

TOOL = "profile"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, required=True, help="ranks, one per GPU of this machine")
    p.add_argument("--binary", default="train", help="bin/<name> to profile (train; train-ddp-naive: one bucket)")
    p.add_argument("--batch", type=int, default=128, help="images per GPU (128)")
    p.add_argument("--warmup-steps", type=int, default=20)
    p.add_argument("--profile-steps", type=int, default=30)
    p.add_argument("--steps", type=int, default=60, help="steps in all (warm-up + window + a few after)")
    p.add_argument("--extra", default="", help="more bin/train flags, as one argument: --extra=\"--allreduce-dtype fp32 --bucket-mb 100\"")
    p.add_argument("--transport", choices=ranks.TRANSPORTS, default="local",
                   help="local: ranks as torchrun starts them on one machine; network: each rank a machine of its "
                        "own, NCCL over its socket transport on the loopback interface, as bench/scaling.py (local)")
    p.add_argument("--socket-threads", type=int, default=None, help="--transport network: NCCL_SOCKET_NTHREADS")
    p.add_argument("--socks-per-thread", type=int, default=None, help="--transport network: NCCL_NSOCKS_PERTHREAD")
    p.add_argument("--out", type=Path, default=runner.REPO_ROOT / "bench" / "out" / "profile",
                   help="raw reports, CSVs and per-rank .md (bench/out/profile, git-ignored)")
    p.add_argument("--results", type=Path, default=runner.REPO_ROOT / "bench" / "results",
                   help="where the combined profiles-<N>gpu-<gpu>-<date>.md goes (bench/results)")
    p.add_argument("--bin-dir", type=Path, default=runner.BIN_DIR)
    p.add_argument("--timeout", type=float, default=900, help="seconds for the profiled run (900)")
    args = p.parse_args(argv)
    runner.check_at_least(p, args, gpus=1, batch=1, profile_steps=1, warmup_steps=0)
    if args.steps < args.warmup_steps + args.profile_steps:
        p.error("--steps must cover --warmup-steps + --profile-steps")
    runner.check_timeout(p, args.timeout)
    args.extra_flags = runner.split_flags(p, "--extra", args.extra)
    runner.check_known(p, "--binary", [args.binary], args.bin_dir)
    if args.transport != "network" and (args.socket_threads is not None or args.socks_per_thread is not None):
        p.error("--socket-threads and --socks-per-thread set NCCL's socket transport: they need --transport network")
    args.sockets = ranks.SocketSettings(args.socket_threads, args.socks_per_thread)
    return args


def rank_environments(gpus: int, port: int, base: dict[str, str], transport: str = "local",
                      sockets: ranks.SocketSettings | None = None) -> list[dict[str, str]]:
    """What each of `gpus` ranks is started with (lib/ranks.py)."""
    return ranks.rank_environments(gpus, port, base, transport, sockets)


def report_name(args: argparse.Namespace) -> str:
    return f"{args.binary}-{args.gpus}gpu" + ("-network" if args.transport == "network" else "")


def profile_command(nsys: Path, binary: Path, args: argparse.Namespace) -> list[str]:
    """One rank's command: nsys expands %q{RANK} from the rank's environment."""
    settings = capture.Settings(out_dir=args.out, batch=args.batch, warmup_steps=args.warmup_steps,
                                profile_steps=args.profile_steps, steps=args.steps)
    # A step replayed as a CUDA graph would be one range without --cuda-graph-trace=node: the NCCL
    # kernels could not be told from the others (bin/train-ddp-naive replays its step as one too).
    graph_nodes = ["--cuda-graph-trace=node"] if args.binary in capture.CUDA_GRAPH_VARIANTS | {"train-ddp-naive"} else []
    return [str(nsys), "profile", "--trace=cuda,nvtx,osrt", *graph_nodes, "--capture-range=cudaProfilerApi",
            "--capture-range-end=stop", "-f", "true", "-o", str(args.out / (report_name(args) + "_%q{RANK}")),
            str(binary), *capture.trainer_args(settings), *args.extra_flags]


@dataclass
class RankProfile:
    rank: int
    summary: ProfileSummary
    allreduce_ns: int = 0  # NCCL kernels in the window
    hidden_ns: int = 0     # of which other kernels ran at the same time


def per_step_ms(ns: int, steps: int) -> str:
    return f"{ns / steps / 1e6:.3f}" if steps else "—"


def allreduce_table(ranks: list[RankProfile]) -> str:
    """One row per rank: step time, GPU busy, and the all-reduce split into hidden and exposed."""
    lines = ["| rank | ms per step (host) | GPU busy % | all-reduce ms/step | hidden by backward ms/step | "
             "exposed ms/step | hidden % |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in ranks:
        s, n = r.summary, r.summary.step_count
        busy = f"{s.gpu_busy_pct:.1f}" if s.gpu_busy_pct is not None else "—"
        hidden_pct = f"{100.0 * r.hidden_ns / r.allreduce_ns:.0f}" if r.allreduce_ns else "—"
        lines.append(f"| {r.rank} | {per_step_ms(s.step_ns, n)} | {busy} | {per_step_ms(r.allreduce_ns, n)} | "
                     f"{per_step_ms(r.hidden_ns, n)} | {per_step_ms(r.allreduce_ns - r.hidden_ns, n)} | {hidden_pct} |")
    return "\n".join(lines) + "\n"


def condense(args: argparse.Namespace, nsys: Path, rank: int) -> RankProfile:
    base = args.out / f"{report_name(args)}_{rank}"
    stats = [str(nsys), "stats", "--report", ",".join(nsys_summary.REPORTS), "--format", "csv",
             "--force-export=true", "--output", str(base), f"{base}.nsys-rep"]
    for report in nsys_summary.REPORTS:  # a stale CSV must not pass for this run's
        nsys_summary.report_path(base, report).unlink(missing_ok=True)
    out = runner.run(stats, args.timeout)
    if out.returncode != 0:
        runner.die(TOOL, f"nsys stats of rank {rank} failed: {runner.last_line(out.stderr)}", 1)
    reports = nsys_summary.read_reports(base)  # each CSV read and parsed once, for both uses
    summary = nsys_summary.summarize(base, f"rank {rank}", reports)
    try:
        total, hidden = nsys_summary.allreduce_time(reports["cuda_gpu_trace"] or [])
    except ValueError as e:  # a cell that is not a number: the table would be wrong, not just short
        runner.die(TOOL, f"{nsys_summary.report_path(base, 'cuda_gpu_trace')}: {e}", 1)
    return RankProfile(rank, summary, total, hidden)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    gpus = runner.gpu_names()
    if len(gpus) < args.gpus:
        runner.die(TOOL, f"--gpus {args.gpus} needs {args.gpus} GPUs; this machine has {len(gpus)}"
                   + ("" if gpus else f" ({runner.NO_GPU_LINE})"))
    binaries, missing = runner.find_binaries([args.binary], args.bin_dir)
    if missing:
        runner.die(TOOL, runner.missing_binaries_line(missing, args.bin_dir))
    nsys = runner.find_nsys()
    if nsys is None:
        runner.die(TOOL, "nsys not found (not on PATH nor under /opt/nvidia/nsight-*): profiling every rank needs "
                   "Nsight Systems; without it, `bin/train --gpus N --json` reports the exposed all-reduce time "
                   "per step in its summary")
    runner.prepare_out_dir(TOOL, args.out)
    runner.prepare_out_dir(TOOL, args.results, "--results")
    envs = rank_environments(args.gpus, free_port(), dict(os.environ), args.transport, args.sockets)
    args.out.mkdir(parents=True, exist_ok=True)  # nsys -o and nsys stats --output write into it, neither makes it
    print(f"{TOOL}: {args.binary} on {args.gpus} GPUs under nsys ...", file=sys.stderr, flush=True)
    outs = run_ranks(profile_command(nsys, binaries[args.binary], args), envs, args.timeout)
    for rank, out in enumerate(outs):
        why = table.failure_reason(out) if rank == 0 else (None if out.returncode == 0 else runner.last_line(out.stderr))
        if why:
            runner.die(TOOL, f"rank {rank} failed: {why}", 1)
    ranks = [condense(args, nsys, r) for r in range(args.gpus)]
    run = (table.summaries(outs[0].stdout) or [{}])[-1]
    gpu, date = str(run.get("gpu") or gpus[0]), str(run.get("date") or runner.today())
    runner.write_files(TOOL, {args.out / f"{report_name(args)}_{r.rank}.md": to_markdown(r.summary) for r in ranks})
    for r in ranks:
        print(f"rank {r.rank}: {where_the_time_goes(r.summary)}", flush=True)
    command = "python3 bench/profile_ranks.py " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    where = ("" if args.transport == "local" else
             f", each rank a machine of its own (NCCL's socket transport on the loopback interface; "
             f"{args.sockets.describe()})")
    text = (f"# {args.binary} on {args.gpus} GPUs{where}, every rank profiled, {gpu}, {date}\n\n- command: `{command}`\n"
            f"- nsys ({nsys}), batch {args.batch} per GPU, window of {args.profile_steps} steps after "
            f"{args.warmup_steps} warm-up steps; all-reduce = NCCL kernel time (waiting for the slowest rank "
            f"included), hidden = while other kernels ran\n\n" + allreduce_table(ranks) + "\n" +
            "\n".join(to_markdown(r.summary) for r in ranks))
    network = "-network" if args.transport == "network" else ""
    combined = args.results / f"profiles-{args.gpus}gpu{network}-{runner.slug(gpu)}-{date}.md"
    runner.write_files(TOOL, {combined: text})
    print(allreduce_table(ranks), end="")
    print(f"{TOOL}: wrote {combined}, {args.out}/{report_name(args)}_<rank>.md and the .nsys-rep files",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    runner.main_entry(TOOL, main)
