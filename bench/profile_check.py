#!/usr/bin/env python3
"""The profile-driven check: capture, parse, find the bottleneck, apply the fix for it, measure.

On the GPU machine: profile the base rung (bin/train-baseline; nsys, else the built-in --trace),
find its dominant NVTX phase (the enclosing "step N" ranges left out), pick the rung of the ladder
that fixes that phase (--next auto, the default; the table below), profile that rung, and check
that the phase's host time per step shrank and that its images/s (from a plain --json run) is at
least 1.1x the base's. Prints which rung it picked and why (one line), the numbers, and PASS or
FAIL; exits 0 or 1 (2 when there is no GPU or a binary is not built).

    python3 bench/profile_check.py                        # baseline, then the rung for its bottleneck
    python3 bench/profile_check.py --next devloss         # an explicit rung instead of auto
    python3 bench/profile_check.py --base nhwc --next graph

The fix for each phase (auto):
    loss stats                -> devloss   the per-step sync that reads the loss back to the host
    get batch, copy batch     -> pinned    pageable copies and the loader on the training thread
    forward, backward         -> graph     host time of the legacy cudnnConvolution* calls (~170 us
                                           each); -> fp16 instead when the base's GPU busy % is at
                                           least 80 (the GPU, not the host, is the limit)
    optimizer step            -> fp16      the weight gradients the update reads are half the bytes
The rungs are cumulative (each has every fix below it): baseline -> graph measures all of them at
once, and it is the shrunken phase that ties the gain to the fix. When the table's rung is not above
--base (its fix is already in), the next rung above --base is tried instead, and the line says so.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

from lib import capture, runner, table
from lib.timeline import ProfileSummary, dominant_phase

TOOL = "profile_check"
AUTO = "auto"

# At or above this GPU busy % (of the profiled window) the GPU is taken to be the limit, below it
# the host: with the host issuing work too slowly the GPU idles between kernels.
GPU_BOUND_BUSY_PCT = 80.0

# Dominant phase -> (the rung that fixes it, what that rung removes). Forward and backward are not
# here: they have two fixes, CONV_HOST_BOUND and CONV_GPU_BOUND below, and fix_for picks by GPU busy %.
# "optimizer step" is the weakest entry (a few kernel launches; it seldom dominates): the update's
# reads of the weight gradients, which the fp16 rung keeps in half precision.
FIXES: dict[str, tuple[str, str]] = {
    "loss stats": ("devloss", "a blocking device-to-host copy of the loss every step; devloss keeps it on the GPU"),
    "get batch": ("pinned", "the batch is assembled on the training thread; pinned fills it in worker threads"),
    "copy batch": ("pinned", "a pageable host-to-device copy; pinned copies from pinned, triple-buffered memory"),
    "optimizer step": ("fp16", "the update reads fp32 weight gradients; fp16 halves their bytes"),
}
# Forward and backward in the baseline are host-bound: each legacy cudnnConvolution* call costs
# ~170 us of host time, and the graph rung runs prebuilt execution plans instead. If the GPU rather
# than the host were the limit, fp16 (tensor-core convolutions, half the bytes) would be the fix.
CONV_HOST_BOUND = ("graph", "host time of the legacy cuDNN calls; graph runs prebuilt execution plans")
CONV_GPU_BOUND = ("fp16", "GPU time of fp32 convolutions; fp16 runs them on tensor cores with half the bytes")
CONV_PHASES = ("forward", "backward")


def busy_pct(summary: ProfileSummary) -> float | None:
    """GPU busy % of the profiled window: nsys's GPU trace or the built-in trace's, when recorded."""
    return summary.gpu_busy_pct if summary.gpu_busy_pct is not None else summary.trace_busy_pct


def fix_for(phase: str, busy: float | None) -> tuple[str, str] | None:
    """(rung, why) from the table, or None for a phase it does not know."""
    if phase in CONV_PHASES:
        if busy is not None and busy >= GPU_BOUND_BUSY_PCT:
            return CONV_GPU_BOUND[0], f"GPU busy {busy:.0f}% (GPU-bound): " + CONV_GPU_BOUND[1]
        shown = f"GPU busy {busy:.0f}%" if busy is not None else "GPU busy % not recorded"
        return CONV_HOST_BOUND[0], f"{shown} (host-bound): " + CONV_HOST_BOUND[1]
    return FIXES.get(phase)


@dataclass
class Choice:
    variant: str | None     # the binary's name ("train-graph"); None when there is nothing to try
    line: str               # one line: which rung and why


def choose_rung(base: ProfileSummary, ladder: list[str] | None = None) -> Choice:
    """The rung that addresses the base profile's dominant phase (--next auto)."""
    ladder = runner.LADDER if ladder is None else ladder
    top = dominant_phase(base)
    if top is None:
        return Choice(None, f"auto: {base.variant}'s profile has no NVTX phases, so there is no bottleneck "
                            "to pick a rung for" + "".join(f" ({n})" for n in base.notes))
    share = f" ({100.0 * top.total_ns / base.step_ns:.0f}% of step time)" if base.step_ns else ""
    found = fix_for(top.name, busy_pct(base))
    above = ladder[ladder.index(base.variant) + 1:] if base.variant in ladder else None
    if found is None:
        if not above:
            return Choice(None, f"auto: {base.variant}'s dominant phase '{top.name}'{share} has no fix in the "
                                "table; pass --next NAME")
        return Choice(above[0], f"auto: {base.variant}'s dominant phase '{top.name}'{share} has no fix in the "
                                f"table; trying the next rung, {above[0]}")
    rung, why = runner.variant_name(found[0]), found[1]
    if above is not None and rung not in above:
        if not above:
            return Choice(None, f"auto: {base.variant}'s dominant phase '{top.name}'{share} would be fixed by "
                                f"{rung}, which {base.variant} already includes, and no rung is above it")
        return Choice(above[0], f"auto: {base.variant}'s dominant phase '{top.name}'{share} would be fixed by "
                                f"{rung}, which {base.variant} already includes; trying the next rung, {above[0]}")
    return Choice(rung, f"auto: {base.variant}'s dominant phase is '{top.name}'{share} -> {rung} ({why})")


@dataclass
class Verdict:
    passed: bool
    lines: list[str] = field(default_factory=list)


def phase_ms_per_step(summary: ProfileSummary, phase: str) -> float:
    """Host ms per step in the phase; 0 when the phase no longer shows up at all."""
    stat = summary.phases.get(phase)
    if stat is None:
        return 0.0
    return stat.total_ns / 1e6 / (summary.step_count or 1)


def check(base: ProfileSummary, base_ips: float | None, nxt: ProfileSummary, nxt_ips: float | None,
          min_speedup: float = 1.1) -> Verdict:
    """The decision, from two condensed profiles and the two binaries' images/s."""
    v = Verdict(passed=False)
    top = dominant_phase(base)
    if top is None:
        v.lines.append(f"FAIL: {base.variant}'s profile has no NVTX phases, so there is no bottleneck to check"
                       + "".join(f" ({n})" for n in base.notes))
        return v
    if not nxt.phases:
        v.lines.append(f"FAIL: {nxt.variant}'s profile has no NVTX phases" + "".join(f" ({n})" for n in nxt.notes))
        return v
    before, after = phase_ms_per_step(base, top.name), phase_ms_per_step(nxt, top.name)
    share = f"{100.0 * top.total_ns / base.step_ns:.0f}% of step time, " if base.step_ns else ""
    v.lines.append(f"{base.variant}: dominant phase '{top.name}' ({share}{before:.2f} ms per step)")
    shrank = after < before
    change = f"{100.0 * (after - before) / before:+.1f}%" if before else "n/a"
    v.lines.append(f"{nxt.variant}: '{top.name}' {after:.2f} ms per step ({change}): "
                   + ("shrank" if shrank else "did NOT shrink"))
    if base_ips is None or nxt_ips is None or base_ips <= 0:
        v.lines.append(f"images/s: missing ({base.variant}: {base_ips}, {nxt.variant}: {nxt_ips})")
        fast_enough = False
    else:
        ratio = nxt_ips / base_ips
        fast_enough = ratio >= min_speedup
        v.lines.append(f"images/s: {base_ips:,.0f} -> {nxt_ips:,.0f} = {ratio:.2f}x "
                       f"(needs at least {min_speedup:.2f}x): " + ("ok" if fast_enough else "too slow"))
    v.passed = shrank and fast_enough
    v.lines.append("PASS" if v.passed else "FAIL")
    return v


def images_per_s(binary: Path, args: argparse.Namespace, guard: runner.GuardedRunner) -> tuple[float | None, str]:
    """Unprofiled throughput from a plain --json run (profilers slow the step down)."""
    cmd = [str(binary), "--data", args.data, "--batch", str(args.batch),
           "--steps", str(args.warmup_steps + args.timed_steps), "--warmup-steps", str(args.warmup_steps),
           "--profile-steps", str(args.timed_steps), "--no-eval", "--json"]
    result = table.result_of(guard.run(cmd, args.timeout))
    if isinstance(result, str):
        return None, result
    return table.number(result.get("images_per_s")), ""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", default="baseline",
                   help="the rung whose bottleneck is found: baseline, nhwc, train-nhwc, ... (baseline)")
    p.add_argument("--next", default=AUTO,
                   help="the rung that should fix it; 'auto' picks it from the base's dominant phase (auto)")
    p.add_argument("--min-speedup", type=float, default=1.1, help="images/s of next over base (1.1)")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--data", default="synthetic", choices=runner.DATA_SETS)
    p.add_argument("--warmup-steps", type=int, default=30, help="for the images/s runs (30)")
    p.add_argument("--timed-steps", type=int, default=100, help="for the images/s runs (100)")
    p.add_argument("--out", type=Path, default=runner.REPO_ROOT / "bench" / "out" / "profile-check")
    p.add_argument("--bin-dir", type=Path, default=runner.BIN_DIR)
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--no-nsys", action="store_true", help="use the built-in --trace even if nsys is here")
    args = p.parse_args(argv)
    runner.check_timeout(p, args.timeout)
    runner.check_at_least(p, args, batch=1, timed_steps=1, warmup_steps=0)
    if not (math.isfinite(args.min_speedup) and args.min_speedup > 0):
        p.error(f"--min-speedup must be a positive number, not {args.min_speedup:g}")
    args.base = runner.variant_name(args.base)
    args.next = args.next if args.next == AUTO else runner.variant_name(args.next)
    runner.check_known(p, "--base", [args.base], args.bin_dir)
    if args.next != AUTO:
        runner.check_known(p, "--next", [args.next], args.bin_dir)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not runner.gpu_names():
        runner.die(TOOL, runner.NO_GPU_LINE)
    base = args.base
    nxt = None if args.next == AUTO else args.next
    binaries, missing = runner.find_binaries([base] + ([nxt] if nxt else []), args.bin_dir)
    if missing:
        runner.die(TOOL, runner.missing_binaries_line(missing, args.bin_dir))
    nsys = None if args.no_nsys else runner.find_nsys()
    print(f"{TOOL}: profiling with {nsys or 'the built-in --trace (no nsys found)'}", file=sys.stderr)

    guard = runner.GuardedRunner(TOOL)
    settings = capture.Settings(out_dir=args.out, batch=args.batch, data=args.data, timeout_s=args.timeout)
    profiles = {base: capture.capture(binaries[base], base, settings, guard, nsys)}
    if nxt is None:  # --next auto: the rung is chosen from what the base's profile shows
        choice = choose_rung(profiles[base])
        print(choice.line, flush=True)
        if choice.variant is None:
            print("FAIL")
            return 1
        nxt = choice.variant
        found, missing = runner.find_binaries([nxt], args.bin_dir)
        if missing:
            runner.die(TOOL, runner.missing_binaries_line(missing, args.bin_dir))
        binaries.update(found)
    else:
        print(f"next: {nxt} (given with --next)", flush=True)
    profiles[nxt] = capture.capture(binaries[nxt], nxt, settings, guard, nsys)
    speeds = {v: images_per_s(binaries[v], args, guard) for v in (base, nxt)}
    for v, (ips, why) in speeds.items():
        if ips is None:
            print(f"{TOOL}: {v} images/s run failed: {why}", file=sys.stderr)
    verdict = check(profiles[base], speeds[base][0], profiles[nxt], speeds[nxt][0], args.min_speedup)
    print("\n".join(verdict.lines))
    return 0 if verdict.passed else 1

if __name__ == "__main__":
    runner.main_entry(TOOL, main)
