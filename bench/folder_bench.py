#!/usr/bin/env python3
"""`make bench-folder`: training from an image folder, decoding every epoch (seed 000's CPU-bound
case), for several loader thread counts, and how fast one core decodes.

1. Decode rate (CPU only, no GPU needed): `bin/decode_rate --data-dir DIR --workers W` reads the
   folder with bin/train's own reader, as `bin/train --data folder --cache-decoded --workers W` does
   (every header checked, every image decoded, resized and centre-cropped into memory on W threads),
   and prints bin/train's `cache: decoded ...` line; with W = 1 that is the rate of one core, with
   W = all cores the machine's. (bin/train itself looks for its GPU before such a decode, issue 38,
   so it cannot measure this on a machine without one.)
2. Training (GPU, bin/train): images/s and data stall % of the steady-state window for --workers 1,
   2, 4, 8 and cores - 1, each decoding every epoch in the pinned loader's threads; then the same
   with --cache-decoded (decoded once), and bin/train-baseline (decoding on the main thread) when
   built.

The table goes to stdout and to bench/results/folder-<gpu>-<date>.md (or decode-<host>-<date>.md with
--decode-only, which needs bin/decode_rate alone: `make bin/decode_rate`).

    python3 bench/folder_bench.py --data-dir data/fashion-mnist-png [--image-size 32] [--decode-only]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path

from lib import runner, table

TOOL = "bench-folder"
DECODE_LINE = re.compile(r"cache: decoded ([\d,]+) images into .* in ([\d.]+) s with (\d+) threads?: "
                         r"([\d,]+) images/s \(([\d,]+) per thread\)")


@dataclass
class DecodeRate:
    threads: int
    images: int
    seconds: float
    images_per_s: float
    per_thread: float


def parse_decode_line(stdout: str) -> DecodeRate | None:
    """The `cache: decoded ...` line of bin/decode_rate (bin/train's with --cache-decoded); None when absent."""
    m = DECODE_LINE.search(stdout)
    if not m:
        return None
    num = lambda s: float(s.replace(",", ""))
    return DecodeRate(int(m.group(3)), int(num(m.group(1))), float(m.group(2)), num(m.group(4)), num(m.group(5)))


def worker_counts(spec: str, cores: int) -> list[int]:
    """"1,2,4,8,cores-1" -> distinct counts in order; "cores-1" and "cores" are this machine's."""
    counts = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        n = {"cores-1": max(1, cores - 1), "cores": cores}.get(part)
        if n is None:
            n = int(part)
        if n < 1:
            raise ValueError(f"a worker count must be at least 1, not {part}")
        if n not in counts:
            counts.append(n)
    return counts


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, required=True, help="the image folder (DIR/train/<class>/..., DIR/test/...)")
    p.add_argument("--image-size", type=int, default=32, help="--image-size of the runs (32)")
    p.add_argument("--workers", default="1,2,4,8,cores-1", help="loader thread counts (1,2,4,8,cores-1)")
    p.add_argument("--batch", type=int, default=128, help="batch size (128)")
    p.add_argument("--warmup-steps", type=int, default=30, help="steps before the timed window (30)")
    p.add_argument("--timed-steps", type=int, default=100, help="steps in the timed window (100)")
    p.add_argument("--decode-only", action="store_true", help="only the decode rate (no GPU needed)")
    p.add_argument("--bin-dir", type=Path, default=runner.BIN_DIR, help="where the binaries are (bin)")
    p.add_argument("--out", type=Path, default=runner.REPO_ROOT / "bench" / "results", help="where the .md goes")
    p.add_argument("--timeout", type=float, default=1800, help="seconds before a run counts as failed (1800)")
    args = p.parse_args(argv)
    try:
        args.worker_counts = worker_counts(args.workers, os.cpu_count() or 1)
    except ValueError as e:
        p.error(f"--workers: {e}")
    runner.check_timeout(p, args.timeout)
    runner.check_at_least(p, args, batch=2, timed_steps=1, warmup_steps=0)
    if not 8 <= args.image_size <= 1024 or args.image_size % 8:
        p.error(f"--image-size must be a multiple of 8 from 8 to 1024 (as bin/train takes it), not {args.image_size}")
    if not args.data_dir.is_dir():
        p.error(f"--data-dir {args.data_dir}: not a directory (an image folder: DIR/train/<class>/..., DIR/test/...)")
    return args


def folder_flags(args: argparse.Namespace) -> list[str]:
    return ["--data", "folder", "--data-dir", str(args.data_dir), "--image-size", str(args.image_size),
            "--batch", str(args.batch)]


def decode_rates(args: argparse.Namespace, decode_rate: Path) -> list[str]:
    """Rows of the decode table, from bin/decode_rate (CPU only): one thread, then every core."""
    rows = []
    for threads in dict.fromkeys([1, os.cpu_count() or 1]):
        out = runner.run([str(decode_rate), "--data-dir", str(args.data_dir), "--image-size", str(args.image_size),
                          "--workers", str(threads)], args.timeout)
        rate = parse_decode_line(out.stdout)
        if rate is None:
            runner.die(TOOL, f"no decode line from {decode_rate} ({runner.last_line(out.stderr) or 'no output'})", 1)
        rows.append(f"| {rate.threads} | {rate.images:,} | {rate.seconds:.2f} | {rate.images_per_s:,.0f} | "
                    f"{rate.per_thread:,.0f} |")
    return rows


def training_row(label: str, out: runner.RunOutput) -> str:
    reason = table.failure_reason(out)
    if reason:
        return f"| {label} | {table.MISSING} | {table.MISSING} | failed: {reason} |"
    s = table.summaries(out.stdout)[-1]
    return (f"| {label} | {table.fmt(table.number(s.get('images_per_s')), 0, thousands=True)} | "
            f"{table.fmt(table.number(s.get('data_stall_pct')), 1)} | |")


def training_rows(args: argparse.Namespace, train: Path) -> list[str]:
    steps = ["--steps", str(args.warmup_steps + args.timed_steps), "--warmup-steps", str(args.warmup_steps),
             "--profile-steps", str(args.timed_steps), "--epochs", "1000", "--no-eval", "--json"]
    guard = runner.GuardedRunner(TOOL)
    rows = []
    for w in args.worker_counts:
        out = guard.run([str(train), *folder_flags(args), *steps, "--workers", str(w)], args.timeout)
        rows.append(training_row(f"bin/train, decoding every epoch, --workers {w}", out))
    out = guard.run([str(train), *folder_flags(args), *steps, "--cache-decoded"], args.timeout)
    rows.append(training_row("bin/train, --cache-decoded (decoded once)", out))
    baseline = args.bin_dir / "train-baseline"
    if baseline.exists():
        out = guard.run([str(baseline), *folder_flags(args), *steps], args.timeout)
        rows.append(training_row("bin/train-baseline, decoding on the main thread", out))
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    decode_rate, train = args.bin_dir / "decode_rate", args.bin_dir / "train"
    needed = [(decode_rate, "make bin/decode_rate")] + ([] if args.decode_only else [(train, "make")])
    for binary, make in needed:  # before anything runs or is written
        if not binary.exists():
            runner.die(TOOL, f"{binary} is not built: run `{make}` first")
    runner.prepare_out_dir(TOOL, args.out)
    cpu = platform.processor() or platform.machine()
    lines = [f"# Image folder: {args.data_dir} at {args.image_size}x{args.image_size}, batch {args.batch}", "",
             f"Decode rate (read + decode + resize/crop, bin/decode_rate: bin/train's reader), {os.cpu_count()} cores "
             f"({cpu}), {runner.today()}:", "",
             "| threads | images | seconds | images/s | images/s per thread |", "| --- | --- | --- | --- | --- |"]
    lines += decode_rates(args, decode_rate)
    print("\n".join(lines), flush=True)
    name = f"decode-{runner.slug(platform.node())}-{runner.today()}.md"
    if not args.decode_only:
        gpus = runner.gpu_names()
        if not gpus:
            runner.die(TOOL, runner.NO_GPU_LINE)
        more = ["", f"Training on {gpus[0]}: steady-state window of {args.timed_steps} steps after "
                f"{args.warmup_steps}:", "", "| run | images/s | data stall % | notes |", "| --- | --- | --- | --- |"]
        more += training_rows(args, train)
        print("\n".join(more))
        lines += more
        name = f"folder-{runner.slug(gpus[0])}-{runner.today()}.md"
    runner.write_files(TOOL, {args.out / name: "\n".join(lines) + "\n"})
    print(f"\nwritten to {args.out / name}")
    return 0


if __name__ == "__main__":
    runner.main_entry(TOOL, main)
