#!/usr/bin/env python3
"""`make profile`: an Nsight Systems profile of every binary's steady-state window, condensed.

For each binary: `nsys profile` over the 30 steps after 20 warm-up steps (the binary brackets them
with cudaProfilerStart/Stop), `nsys stats` to CSV, then one Markdown table per binary: host time per
NVTX phase, GPU busy/idle, top kernels, copies, CUDA API, and a line saying where the time goes.
Without nsys, the binaries' built-in `--trace` gives the same tables.

    python3 bench/profile.py --variants baseline,devloss --compare-trace
    python3 bench/profile.py --program predict          # bin/predict's egress ladder instead

Writes <out>/<variant>.md (beside the raw reports) and bench/results/profiles-<gpu>-<date>.md
(predict-profiles-<gpu>-<date>.md for --program predict).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from lib import capture, runner
from lib.timeline import ProfileSummary, dominant_phase, to_markdown, where_the_time_goes

TOOL = "profile"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--program", choices=["train", "predict"], default="train",
                   help="whose ladder: bin/train's (train-*) or bin/predict's egress rungs (predict-*), whose "
                        "window is --profile-steps batches after --warmup-steps, with --features (train)")
    p.add_argument("--variants", default="all",
                   help="comma list of ladder names, 'all' for the ladder; add 'train' (or 'predict') for bin/train "
                        "(bin/predict)")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--warmup-steps", type=int, default=20)
    p.add_argument("--profile-steps", type=int, default=30)
    p.add_argument("--steps", type=int, default=60, help="steps in all (warm-up + window + a few after)")
    p.add_argument("--out", type=Path, default=runner.REPO_ROOT / "bench" / "out" / "profile",
                   help="raw reports, CSVs, traces and per-binary .md (bench/out/profile, git-ignored)")
    p.add_argument("--results", type=Path, default=runner.REPO_ROOT / "bench" / "results",
                   help="where the combined profiles-<gpu>-<date>.md goes (bench/results)")
    p.add_argument("--bin-dir", type=Path, default=runner.BIN_DIR)
    p.add_argument("--timeout", type=float, default=900, help="seconds per command (900)")
    p.add_argument("--compare-trace", action="store_true",
                   help="with nsys, also run each binary with --trace and report both GPU busy %%")
    p.add_argument("--no-nsys", action="store_true", help="use the built-in --trace even if nsys is here")
    args = p.parse_args(argv)
    if args.batch < 1 or args.profile_steps < 1 or args.warmup_steps < 0:
        p.error("--batch and --profile-steps must be at least 1, --warmup-steps at least 0")
    if args.steps < args.warmup_steps + args.profile_steps:
        p.error("--steps must cover --warmup-steps + --profile-steps")
    runner.check_timeout(p, args.timeout)
    args.variant_list = runner.parse_variants(p, args.variants, args.program)
    runner.check_known(p, "--variants", args.variant_list, args.bin_dir, args.program)
    return args


def busy_comparison(s: ProfileSummary) -> str | None:
    """With --compare-trace: both GPU busy figures and how far apart they are (None without both).
    They come from two runs of the same command: CUPTI (CUDA 13.0, drivers before r610) serves one
    client per process, and nsys is one, so the trace cannot record inside nsys's run."""
    if s.gpu_busy_pct is None or s.trace_busy_pct is None or s.source != "nsys":
        return None
    return (f"GPU busy {s.gpu_busy_pct:.1f}% (nsys) vs {s.trace_busy_pct:.1f}% (built-in trace, next run): "
            f"{abs(s.gpu_busy_pct - s.trace_busy_pct):.1f} points apart")


def combined_report(summaries: list[ProfileSummary], gpu: str, date: str, command: str, how: str,
                    what: str = "the training step") -> str:
    compared = any(busy_comparison(s) for s in summaries)
    lines = [f"# Profiles of {what}, {gpu}, {date}", "",
             f"- command: `{command}`", f"- {how}", "",
             "| binary | source | dominant phase | ms per step (host) | GPU busy % |" +
             (" built-in trace busy % (next run) |" if compared else ""),
             "| --- | --- | --- | ---: | ---: |" + (" ---: |" if compared else "")]
    for s in summaries:
        top = dominant_phase(s)
        share = f"{top.name} ({100.0 * top.total_ns / s.step_ns:.0f}%)" if top and s.step_ns else "—"
        per_step = f"{s.step_ns / s.step_count / 1e6:.2f}" if s.step_count else "—"
        busy = f"{s.gpu_busy_pct:.1f}" if s.gpu_busy_pct is not None else "—"
        row = f"| {s.variant} | {s.source} | {share} | {per_step} | {busy} |"
        if compared:
            row += f" {s.trace_busy_pct:.1f} |" if s.trace_busy_pct is not None else " — |"
        lines.append(row)
    return "\n".join(lines) + "\n\n" + "\n".join(to_markdown(s) for s in summaries)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    gpus, binaries = runner.require_gpu_and_binaries(TOOL, args.variant_list, args.bin_dir, args.program)
    runner.prepare_out_dir(TOOL, args.out)
    runner.prepare_out_dir(TOOL, args.results, "--results")
    nsys = None if args.no_nsys else runner.find_nsys()
    if nsys is None and not args.no_nsys:  # --no-nsys asked for the built-in trace: nothing to explain
        print(f"{TOOL}: nsys not found (not on PATH nor under /opt/nvidia/nsight-*); `bin/train --trace "
              "FILE.json` is the built-in alternative, so each binary runs with --trace instead",
              file=sys.stderr)

    guard = runner.GuardedRunner(TOOL)
    checkpoint = (runner.make_predict_checkpoint(TOOL, args.bin_dir, args.out, guard, args.timeout)
                  if args.program == "predict" else None)
    settings = capture.Settings(out_dir=args.out, batch=args.batch, warmup_steps=args.warmup_steps,
                                profile_steps=args.profile_steps, steps=args.steps, timeout_s=args.timeout,
                                program=args.program, checkpoint=checkpoint)
    summaries, empty = [], []
    for variant in args.variant_list:
        print(f"{TOOL}: {variant} ...", file=sys.stderr, flush=True)
        s = capture.capture(binaries[variant], variant, settings, guard, nsys, args.compare_trace)
        if s.captured():  # else an earlier good <variant>.md stays
            runner.write_files(TOOL, {args.out / f"{variant}.md": to_markdown(s)})
        else:
            empty.append(variant)
        print(f"{variant}: {where_the_time_goes(s)}" + "".join(f" [{n}]" for n in s.notes), flush=True)
        comparison = busy_comparison(s)
        if comparison:
            print(f"{variant}: {comparison}", flush=True)
        summaries.append(s)

    if not any(s.captured() for s in summaries):
        # Nothing captured: a report of empty tables must not replace a good one of the same name.
        runner.die(TOOL, "no profile captured anything (see the lines above); no combined report written", 1)
    run = next((s.run for s in summaries if s.run), {})
    gpu = str(run.get("gpu") or gpus[0])
    date = str(run.get("date") or runner.today())
    command = "python3 bench/profile.py " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    how = (f"nsys ({nsys}), " if nsys else "built-in --trace (no nsys), ") + \
          (f"batch {args.batch}, window of {args.profile_steps} steps after {args.warmup_steps} warm-up steps")
    prefix, what = ("predict-profiles", "bin/predict's batches") if args.program == "predict" else \
        ("profiles", "the training step")
    combined = args.results / f"{prefix}-{runner.slug(gpu)}-{date}.md"
    runner.write_files(TOOL, {combined: combined_report(summaries, gpu, date, command, how, what)})
    print(f"{TOOL}: wrote {combined} and {args.out}/<variant>.md"
          + (f" (none for {', '.join(empty)}: nothing captured)" if empty else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    runner.main_entry(TOOL, main)
