#!/usr/bin/env python3
"""A-B runs of bin/train: two or more builds (or one build with different flags) on this GPU, in
alternating order, with one autotune cache for all, to measure what one change buys.

Each positional argument is a variant, LABEL=COMMAND: a label (letters, digits, - _ . +), then the
command, split as the shell splits it: VAR=VALUE words first set the environment of that variant's
runs, then the binary (a path: relative to the current directory, or absolute), then its flags.
Every run is `COMMAND --data synthetic --batch B --steps W+T --warmup-steps W --profile-steps T
--no-eval --json --autotune-cache CACHE`; its figure is the images/s of its summary line.

One fill run of the first variant comes first (it fills the cache, so that every variant runs the
same cuDNN algorithms; not counted). A variant whose command gives `--autotune-cache FILE` runs
with that file, which must exist, instead of the shared cache: two caches of one autotune pass that
differ in chosen engines, say, run by the same binary. The fill run is then the first variant's that
shares the cache; where none does, there is none. Then --rounds rounds, each running every variant
once: round 1 in the order given, round 2 in the reverse order, round 3 in the order given, and so
on, so that no variant always runs first (A B, B A, A B, B A). The report gives each round's
images/s, the medians, ms per step, and for each variant against the first the change in ms per
step, and whether it was faster (or slower) in every round or the rounds disagree.

    mkdir -p /tmp/base && git archive main | tar -x -C /tmp/base && make -C /tmp/base
    python3 bench/ab.py main=/tmp/base/bin/train new=bin/train --rounds 4
    python3 bench/ab.py fused=bin/train nofuse="bin/train --no-fuse dgrad-drelu-dbn" --out ab.md
    python3 bench/ab.py off=bin/train on="PROBE_X=1 bin/train" --batch 256 --cache /tmp/ab-cache.txt
    python3 bench/ab.py fastest="bin/train --autotune-cache T.txt" energy="bin/train --autotune-cache E.txt"

With --clocks, nvidia-smi samples the GPU every 100 ms through each counted run, and the report
adds each variant's SM clock, power, energy an image and how often the power cap held the clock
down, over the samples with the GPU busy inside each run's timed window (lib/gpu_clocks.py; the GPU
is CUDA_VISIBLE_DEVICES's first, else 0).

A run that fails stops the tool (one line, exit 1, nothing written).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from lib import gpu_clocks, runner, table

TOOL = "ab"
LABEL = re.compile(r"[A-Za-z0-9_.+-]+")
ENV_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
# The flags every run gets from this tool: a variant that set them too would not measure the same work.
# --autotune-cache is the one a variant may give: its own cache in place of the shared one.
TOOL_FLAGS = ["--data", "--batch", "--steps", "--warmup-steps", "--profile-steps", "--no-eval", "--json"]
OWN_CACHE = "--autotune-cache"


@dataclass
class Variant:
    label: str
    spec: str                      # the COMMAND as given, for the report
    env: dict[str, str]
    binary: Path                   # absolute, so that a bare name is not looked up on PATH
    flags: list[str]
    own_cache: Path | None = None  # its --autotune-cache, in place of the shared one
    figures: list[float] = field(default_factory=list)  # images/s, one per round
    clocks: list[gpu_clocks.ClockSummary | None] = field(default_factory=list)  # --clocks: one per round

    def command(self, args: argparse.Namespace, cache: Path) -> list[str]:
        return [str(self.binary), *self.flags, "--data", "synthetic", "--batch", str(args.batch),
                "--steps", str(args.warmup_steps + args.timed_steps), "--warmup-steps", str(args.warmup_steps),
                "--profile-steps", str(args.timed_steps), "--no-eval", "--json",
                "--autotune-cache", str(self.own_cache or cache)]


def parse_variant(spec: str) -> Variant:
    """LABEL=COMMAND as a Variant; anything wrong with it (the binary too) is one line and exit 2."""
    label, sep, command = spec.partition("=")
    if not sep or not LABEL.fullmatch(label):
        runner.die(TOOL, f"{spec!r} is not LABEL=COMMAND (a label of letters, digits, '-', '_', '.', '+', then '=', "
                         "then the command)")
    try:
        words = shlex.split(command)
    except ValueError as e:
        runner.die(TOOL, f"{label}: {command!r}: {e}")
    env = {}
    while words and ENV_WORD.match(words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    if not words:
        runner.die(TOOL, f"{label}: {command!r} names no binary")
    binary = Path(words[0]).expanduser().absolute()
    if not binary.is_file():
        runner.die(TOOL, f"{label}: {words[0]}: no such binary" + (" (not a file)" if binary.exists() else ""))
    if not os.access(binary, os.X_OK):
        runner.die(TOOL, f"{label}: {words[0]}: not executable")
    flags, own_cache = take_own_cache(label, words[1:])
    for flag in flags:
        name = flag.split("=", 1)[0]
        if name in TOOL_FLAGS:
            runner.die(TOOL, f"{label}: {name} is set by ab.py for every run"
                             + (f" (use ab.py's {name})" if name in ("--batch", "--warmup-steps") else ""))
    return Variant(label, command, env, binary, flags, own_cache)


def take_own_cache(label: str, flags: list[str]) -> tuple[list[str], Path | None]:
    """A variant's flags without its --autotune-cache FILE (or =FILE), and that file: absolute, an
    existing file (a cache filled before, not one this tool would fill)."""
    rest, found = [], []
    it = iter(flags)
    for flag in it:
        name, eq, value = flag.partition("=")
        if name != OWN_CACHE:
            rest.append(flag)
            continue
        if not eq:
            value = next(it, "")
        if not value:
            runner.die(TOOL, f"{label}: {OWN_CACHE} needs a file")
        found.append(value)
    if not found:
        return rest, None
    if len(found) > 1:
        runner.die(TOOL, f"{label}: {OWN_CACHE} given {len(found)} times")
    path = Path(found[0]).expanduser().absolute()
    if not path.is_file():
        runner.die(TOOL, f"{label}: {OWN_CACHE} {found[0]}: no such file (a variant's own cache must exist; "
                         "the shared one is ab.py's --cache)")
    return rest, path


def check_out_file(out: Path) -> None:
    """--out FILE before any run: a file that could be written (its directory made where missing)."""
    if out.is_dir():
        runner.die(TOOL, f"--out {out}: is a directory (--out takes a file name, e.g. ab.md)")
    if out.exists() and not os.access(out, os.W_OK):
        runner.die(TOOL, f"--out {out}: the file is not writable")
    runner.prepare_out_dir(TOOL, out.parent)  # (names the directory: "--out DIR: not a directory")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = runner.OneLineParser(TOOL, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("variants", nargs="+", metavar="LABEL=COMMAND",
                   help="a variant: label, '=', then [VAR=VALUE ...] BINARY [FLAGS ...] (at least two)")
    p.add_argument("--batch", type=int, default=128, metavar="B", help="images per step (128)")
    p.add_argument("--warmup-steps", type=int, default=30, metavar="W", help="steps before the timed window (30)")
    p.add_argument("--timed-steps", type=int, default=100, metavar="T", help="steps in the timed window (100)")
    p.add_argument("--rounds", type=int, default=4, metavar="R",
                   help="rounds, each running every variant once (4, at least 2)")
    p.add_argument("--cache", type=Path, default=None, metavar="PATH",
                   help="the autotune cache every run shares (default: a new file in a temporary directory, "
                        "removed at the end)")
    p.add_argument("--timeout", type=float, default=300, metavar="S",
                   help="seconds before a run counts as failed (300)")
    p.add_argument("--out", type=Path, default=None, metavar="FILE.md",
                   help="also write the report to this file")
    p.add_argument("--clocks", action="store_true",
                   help="sample the GPU's SM clock, power and power cap with nvidia-smi through each counted run "
                        "and report them")
    args = p.parse_intermixed_args(argv)
    runner.check_at_least(p, args, batch=1, warmup_steps=0, timed_steps=1, rounds=2)
    runner.check_timeout(p, args.timeout)
    args.variant_list = [parse_variant(spec) for spec in args.variants]
    if len(args.variant_list) < 2:
        p.error("give at least two variants, LABEL=COMMAND each (e.g. main=/tmp/base/bin/train new=bin/train)")
    labels = [v.label for v in args.variant_list]
    for label in labels:
        if labels.count(label) > 1:
            p.error(f"the label {label!r} names two variants")
    if args.cache is not None:
        args.cache = args.cache.expanduser().absolute()
        if args.cache.is_dir():
            p.error(f"--cache {args.cache}: is a directory (--cache takes a file)")
        if not args.cache.parent.is_dir():
            p.error(f"--cache {args.cache}: no directory {args.cache.parent}")
    if args.out is not None:
        check_out_file(args.out)
    return args


def order_of(round_number: int, variants: list[Variant]) -> list[Variant]:
    """Round 1 in the order given, round 2 reversed, round 3 as given, ..."""
    return list(variants) if round_number % 2 == 1 else list(reversed(variants))


def measure(guard: runner.GuardedRunner, variant: Variant, args: argparse.Namespace, cache: Path,
            where: str, sampler: gpu_clocks.ClockSampler | None = None) -> tuple[float, dict]:
    """One run's images/s and summary line, and with `sampler` its clocks (over its timed window) into
    variant.clocks; a failed run stops the tool (one line, exit 1)."""
    def run() -> runner.RunOutput:
        return guard.run(variant.command(args, cache), args.timeout, variant.env)
    out, samples = sampler.around(run) if sampler else (run(), [])
    result = table.result_of(out)
    if isinstance(result, str):
        runner.die(TOOL, f"{variant.label} failed in {where}: {result}; nothing written", 1)
    if sampler:
        variant.clocks.append(gpu_clocks.summarize(samples, gpu_clocks.window_of(result)))
    figure = table.number(result.get("images_per_s"))
    if figure is None:
        runner.die(TOOL, f"{variant.label} failed in {where}: its summary line has no images_per_s; nothing written", 1)
    return figure, result


def images(value: float) -> str:
    return table.fmt(value, 0, thousands=True)


def ms_per_step(batch: int, images_per_s: float) -> float:
    return batch * 1000.0 / images_per_s


def verdict(base: Variant, other: Variant) -> str:
    """Whether other was faster than base in each round's pair of runs."""
    rounds = len(base.figures)
    faster = sum(o > b for b, o in zip(base.figures, other.figures))
    slower = sum(o < b for b, o in zip(base.figures, other.figures))
    if faster == rounds:
        return "faster in every round"
    if slower == rounds:
        return "slower in every round"
    return f"rounds disagree ({faster} of {rounds} faster)"


def against(base: Variant, other: Variant, batch: int) -> str:
    """"5.731 -> 5.670 ms (-1.07%), faster in every round": ms per step from the medians."""
    before = ms_per_step(batch, statistics.median(base.figures))
    after = ms_per_step(batch, statistics.median(other.figures))
    return f"{before:.3f} -> {after:.3f} ms ({100 * (after - before) / before:+.2f}%), {verdict(base, other)}"


def markdown(variants: list[Variant], orders: list[list[Variant]], batch: int) -> str:
    base = variants[0]
    lines = ["| round | order | " + " | ".join(v.label for v in variants) + " |",
             "| ---: | --- | " + " | ".join("---:" for _ in variants) + " |"]
    for n, order in enumerate(orders):
        lines.append(f"| {n + 1} | {', '.join(v.label for v in order)} | "
                     + " | ".join(images(v.figures[n]) for v in variants) + " |")
    medians = [statistics.median(v.figures) for v in variants]
    lines.append("| median | | " + " | ".join(images(m) for m in medians) + " |")
    lines.append("| ms per step | | " + " | ".join(f"{ms_per_step(batch, m):.2f}" for m in medians) + " |")
    lines.append(f"| against {base.label} | | " + " | ".join(
        "" if v is base else against(base, v, batch) for v in variants) + " |")
    return "\n".join(lines) + "\n"


def median_of(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def energy_row(variants: list[Variant]) -> str:
    """Each variant's energy an image: each counted run's power over its images/s (W / (images/s) = J an
    image), the median of its runs'. Where the power cap holds the clock down, a step's time follows its
    energy: this row tells a lever that does less work from one that only moves it."""
    cells = []
    for v in variants:
        value = median_of([e for c, f in zip(v.clocks, v.figures) if c is not None
                           and (e := gpu_clocks.mj_per_image(c, f)) is not None])
        cells.append("—" if value is None else table.fmt(value, 1, thousands=True))
    return "| energy, mJ an image | " + " | ".join(cells) + " |"


def clocks_markdown(variants: list[Variant]) -> str:
    """Each variant's SM clock, power-capped share and power: medians of its runs' (lib/gpu_clocks.py)."""
    def row(name: str, pick, fmt) -> str:
        cells = []
        for v in variants:
            value = median_of([pick(c) for c in v.clocks if c is not None])
            cells.append("—" if value is None else fmt(value))
        return f"| {name} | " + " | ".join(cells) + " |"
    lines = ["| | " + " | ".join(v.label for v in variants) + " |",
             "| --- | " + " | ".join("---:" for _ in variants) + " |",
             row("SM clock, MHz", lambda c: c.sm_mhz, lambda x: table.fmt(x, 0, thousands=True)),
             row("power-capped samples", lambda c: c.capped_share, lambda x: f"{100 * x:.0f}%"),
             row("power, W", lambda c: c.power_w, lambda x: f"{x:.0f}"),
             energy_row(variants),
             "| runs with busy samples | " + " | ".join(
                 f"{sum(c is not None for c in v.clocks)} of {len(v.clocks)}" for v in variants) + " |"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    gpus = runner.gpu_names()
    if not gpus:
        runner.die(TOOL, runner.NO_GPU_LINE)
    variants: list[Variant] = args.variant_list
    sampler = gpu_clocks.sampler_for_visible_gpu(TOOL) if args.clocks else None
    guard = runner.GuardedRunner(TOOL)
    with tempfile.TemporaryDirectory(prefix="ab-cache-") as scratch:
        cache = args.cache or Path(scratch) / "autotune-cache.txt"
        sharing = [v for v in variants if v.own_cache is None]
        first = sharing[0] if sharing else None
        fill, summary = None, {}
        if first:
            print(f"{TOOL}: fill run, {first.label} (fills the autotune cache {cache}; not counted)",
                  file=sys.stderr, flush=True)
            fill, summary = measure(guard, first, args, cache, "the fill run")
        orders = []
        for n in range(1, args.rounds + 1):
            orders.append(order_of(n, variants))
            for variant in orders[-1]:
                print(f"{TOOL}: round {n}/{args.rounds}, {variant.label}", file=sys.stderr, flush=True)
                figure, result = measure(guard, variant, args, cache, f"round {n}", sampler)
                variant.figures.append(figure)
                summary = summary or result

    gpu = str(summary.get("gpu") or gpus[0])
    date = runner.today()
    cache_line = (f"`{cache}`" if args.cache else "a new file in a temporary directory, removed at the end")
    own = [v for v in variants if v.own_cache]
    if own:  # the shared cache only where a variant ran with it
        cache_line = ("; ".join(f"{v.label}'s own `{v.own_cache}`" for v in own)
                      + (f"; the others' shared: {cache_line}" if first else ""))
    fill_line = (f"- fill run of {first.label} (fills the cache; not counted): {images(fill)} images/s\n\n" if first
                 else "- no fill run: every variant brought its own cache\n\n")
    report = (f"# A-B run, {gpu}, {date}\n\n"
              f"- command: `python3 bench/ab.py {shlex.join(argv)}`\n"
              f"- GPU: {gpu}\n- date: {date}\n"
              f"- synthetic data, batch {args.batch}, {args.warmup_steps} warm-up + {args.timed_steps} timed "
              f"steps a run; {args.rounds} rounds, in the order given and reversed by turns\n"
              f"- autotune cache{'s' if own else ''}{'' if own else ', shared by every run'}: {cache_line}\n"
              + "".join(f"- {v.label}: `{v.spec}`\n" for v in variants)
              + fill_line
              + "images/s of each run; ms per step = batch x 1000 / median images/s; `against` compares the medians' "
              "ms per step, and each round's pair of runs\n\n"
              + markdown(variants, orders, args.batch))
    if sampler:
        report += (f"\nSM clock, power and the power cap through each variant's runs (nvidia-smi every "
                   f"{gpu_clocks.PERIOD_MS} ms on GPU {sampler.gpu}; the samples with the GPU at least "
                   f"{gpu_clocks.BUSY_PERCENT}% busy, inside each run's timed window where its summary gives it; "
                   "medians of its runs'; power-capped: the software power cap's "
                   "clock-event reason set)\n\n" + clocks_markdown(variants))
    print(report, end="")
    if args.out is not None:
        runner.write_files(TOOL, {args.out: report})
        print(f"{TOOL}: wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    runner.main_entry(TOOL, main)
