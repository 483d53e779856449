#!/usr/bin/env python3
"""The profile-driven check: capture, parse, find the bottleneck, fix it, measure.

On the GPU machine: profile bin/train-baseline and bin/train-devloss (nsys, else the built-in
--trace), find the baseline's dominant NVTX phase (the enclosing "step N" ranges left out), and
check that in the next rung that phase's time per step shrank and its images/s (from a plain --json
run) is at least 1.1x the baseline's. Prints the numbers and PASS or FAIL; exits 0 or 1.

    python3 bench/profile_check.py [--base baseline --next devloss --min-speedup 1.1]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

import capture
import runner
import table
from timeline import ProfileSummary, dominant_phase

TOOL = "profile_check"


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
    p.add_argument("--base", default="baseline", help="the rung whose bottleneck is found (baseline)")
    p.add_argument("--next", default="devloss", help="the rung that should fix it (devloss)")
    p.add_argument("--min-speedup", type=float, default=1.1)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--data", default="synthetic")
    p.add_argument("--warmup-steps", type=int, default=30, help="for the images/s runs (30)")
    p.add_argument("--timed-steps", type=int, default=100, help="for the images/s runs (100)")
    p.add_argument("--out", type=Path, default=runner.REPO_ROOT / "bench" / "out" / "profile-check")
    p.add_argument("--bin-dir", type=Path, default=runner.BIN_DIR)
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--no-nsys", action="store_true", help="use the built-in --trace even if nsys is here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not runner.gpu_names():
        runner.die(TOOL, runner.NO_GPU_LINE)
    base, nxt = runner.variant_name(args.base), runner.variant_name(args.next)
    binaries, missing = runner.find_binaries([base, nxt], args.bin_dir)
    if missing:
        runner.die(TOOL, runner.missing_binaries_line(missing, args.bin_dir))
    nsys = None if args.no_nsys else runner.find_nsys()
    print(f"{TOOL}: profiling with {nsys or 'the built-in --trace (no nsys found)'}", file=sys.stderr)

    guard = runner.GuardedRunner(TOOL)
    settings = capture.Settings(out_dir=args.out, batch=args.batch, data=args.data, timeout_s=args.timeout)
    profiles = {v: capture.capture(binaries[v], v, settings, guard, nsys) for v in (base, nxt)}
    speeds = {v: images_per_s(binaries[v], args, guard) for v in (base, nxt)}
    for v, (ips, why) in speeds.items():
        if ips is None:
            print(f"{TOOL}: {v} images/s run failed: {why}", file=sys.stderr)
    verdict = check(profiles[base], speeds[base][0], profiles[nxt], speeds[nxt][0], args.min_speedup)
    print("\n".join(verdict.lines))
    return 0 if verdict.passed else 1


if __name__ == "__main__":
    sys.exit(main())
