"""Capture one binary's profile over its steady-state window: with nsys, or with its built-in trace.

Used by profile.py (every binary) and profile_check.py (two adjacent rungs). The binary brackets
the window with cudaProfilerStart/Stop, so nsys records exactly the --profile-steps steps after the
warm-up (--capture-range=cudaProfilerApi); the built-in --trace records the same window.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # run as a program by mistake: say which one (before the imports below can fail)
    print(f"{sys.argv[0]} is a module (the capture of bench/profile.py and profile_check.py), not a program: "
          "run python3 bench/profile.py (make profile)", file=sys.stderr)
    sys.exit(2)

from dataclasses import dataclass
from pathlib import Path

from . import nsys_summary, table, trace_summary
from .runner import GuardedRunner, RunOutput, last_line
from .timeline import ProfileSummary


@dataclass
class Settings:
    out_dir: Path           # where reports, CSVs and traces go
    batch: int = 128
    warmup_steps: int = 20
    profile_steps: int = 30
    steps: int = 60         # a few steps after the window, so it closes before the process ends
    data: str = "synthetic"
    timeout_s: float = 900
    program: str = "train"          # or "predict": bin/predict's egress ladder
    checkpoint: Path | None = None  # what bin/predict loads (runner.make_predict_checkpoint)


def trainer_args(s: Settings) -> list[str]:
    if s.program == "predict":
        return predict_args(s)
    return ["--data", s.data, "--batch", str(s.batch), "--steps", str(s.steps),
            "--warmup-steps", str(s.warmup_steps), "--profile-steps", str(s.profile_steps),
            "--no-eval", "--json"]


# The binaries that replay their step as one CUDA graph (OPT_CUDA_GRAPH: the cudagraph and
# wgradstream rungs, and bin/train, which has every rung on). nsys records a graph launch as one
# range unless told to trace its nodes: the kernel tables and the idle gaps between kernels would
# then see one item per step.
CUDA_GRAPH_VARIANTS = {"train-cudagraph", "train-wgradstream", "train"}


def predict_args(s: Settings) -> list[str]:
    """bin/predict over exactly warm-up + window batches of synthetic images, writing its CSV and
    features (writing them is part of what its window measures); the window is every batch after
    the warm-up."""
    return ["--checkpoint", str(s.checkpoint), "--data", s.data, "--split", "train",
            "--synthetic-size", str((s.warmup_steps + s.profile_steps) * s.batch), "--batch", str(s.batch),
            "--warmup-batches", str(s.warmup_steps), "--features", str(s.out_dir / "predict-features.npy"),
            "--out", str(s.out_dir / "predict-rows.csv"), "--json"]


def nsys_commands(nsys: Path, binary: Path, variant: str, s: Settings) -> tuple[list[str], list[str]]:
    """`nsys profile` over the cudaProfilerApi range, then `nsys stats` into <out>/<variant>_<report>.csv."""
    base = s.out_dir / variant
    graph_nodes = ["--cuda-graph-trace=node"] if variant in CUDA_GRAPH_VARIANTS else []
    profile = [str(nsys), "profile", "--trace=cuda,nvtx,osrt", *graph_nodes, "--capture-range=cudaProfilerApi",
               "--capture-range-end=stop", "-f", "true", "-o", str(base), str(binary), *trainer_args(s)]
    # --force-export: re-export the SQLite file, which nsys otherwise reuses from an older report.
    stats = [str(nsys), "stats", "--report", ",".join(nsys_summary.REPORTS), "--format", "csv",
             "--force-export=true", "--output", str(base), f"{base}.nsys-rep"]
    return profile, stats


def _summary_of(out: RunOutput) -> dict | None:
    found = table.summaries(out.stdout)
    return found[-1] if found else None


def _failed(variant: str, source: str, what: str, out: RunOutput) -> ProfileSummary:
    reason = table.failure_reason(out) or last_line(out.stderr) or f"exit code {out.returncode}"
    return ProfileSummary(variant=variant, source=source, notes=[f"{what} failed: {reason}"])


def with_nsys(nsys: Path, binary: Path, variant: str, s: Settings, runner: GuardedRunner) -> ProfileSummary:
    s.out_dir.mkdir(parents=True, exist_ok=True)
    profile_cmd, stats_cmd = nsys_commands(nsys, binary, variant, s)
    for report in nsys_summary.REPORTS:  # a stale CSV must not pass for this run's
        nsys_summary.report_path(s.out_dir / variant, report).unlink(missing_ok=True)
    # The same run without nsys first: an autotuning build measures cuDNN's algorithms at its first
    # start, and a profiler's overhead skews those timings (the binaries then keep them out of the
    # autotune cache). The profiled run reads this run's choices from the cache, as later runs do.
    filled = runner.run([str(binary), *trainer_args(s)], s.timeout_s)
    if table.failure_reason(filled):  # (also a non-zero exit or a timeout)
        return _failed(variant, "nsys", "the run before nsys (it fills the autotune cache)", filled)
    profiled = runner.run(profile_cmd, s.timeout_s)
    if profiled.returncode != 0:
        return _failed(variant, "nsys", "nsys profile", profiled)
    stats = runner.run(stats_cmd, s.timeout_s)
    if stats.returncode != 0:
        return _failed(variant, "nsys", "nsys stats", stats)
    summary = nsys_summary.summarize(s.out_dir / variant, variant)
    summary.run = _summary_of(profiled)
    return summary


def with_trace(binary: Path, variant: str, s: Settings, runner: GuardedRunner) -> ProfileSummary:
    s.out_dir.mkdir(parents=True, exist_ok=True)
    trace = s.out_dir / f"{variant}.trace.json"
    trace.unlink(missing_ok=True)
    out = runner.run([str(binary), *trainer_args(s), "--trace", str(trace)], s.timeout_s)
    if table.failure_reason(out):
        return _failed(variant, "built-in trace", "the --trace run", out)
    if not trace.is_file():
        return ProfileSummary(variant=variant, source="built-in trace", run=_summary_of(out),
                              notes=[f"the --trace run exited 0 but wrote no {trace.name}"])
    return trace_summary.summarize(trace, variant, run=_summary_of(out))


def capture(binary: Path, variant: str, s: Settings, runner: GuardedRunner, nsys: Path | None,
            compare_trace: bool = False) -> ProfileSummary:
    """nsys when there is one (plus, on request, a --trace run for its GPU busy %), else the trace."""
    if nsys is None:
        return with_trace(binary, variant, s, runner)
    summary = with_nsys(nsys, binary, variant, s, runner)
    if compare_trace:
        traced = with_trace(binary, variant, s, runner)
        summary.trace_busy_pct = traced.trace_busy_pct if traced.trace_busy_pct is not None else traced.gpu_busy_pct
        summary.notes += traced.notes
    return summary
