#!/usr/bin/env python3
"""The bytes a training step moves through DRAM and L2, by kernel kind, from Nsight Compute.

Why: at batch 256 an H200 runs bin/train at its 700 W power cap, where a step's time follows its
energy, and moving bytes costs energy (bench/power_model.py: 117-132 pJ a byte copied through HBM,
at most 58 through L2 alone, on H200s). The time a kernel takes does not say how many bytes it moved;
ncu's counters do. One step (the graph's kernels profiled one by one, caches left as the previous
kernel left them, clocks as they are), after a run without ncu that fills the autotune cache (the
choices measured under ncu are skewed, and not saved):

    bin/train --data synthetic --batch 256 --steps 1 --no-eval
    ncu --profile-from-start off --cache-control none --clock-control none --graph-profiling node \\
        --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,gpu__time_duration.sum \\
        --csv --log-file step.csv \\
        bin/train --data synthetic --batch 256 --steps 32 --warmup-steps 30 --profile-steps 1 --no-eval
    python3 bench/kernel_bytes.py --steps 1 step.csv --by-kernel 10

prints a Markdown table of DRAM and L2 bytes a step by kind (bench/kernel_kinds.py's kinds), and with
--by-kernel the kernels that move the most DRAM bytes. Kernels run alone under ncu: a kernel that
shares the GPU with the weight gradients' stream in training may find less (or more) in L2.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kernel_kinds import ORDER, add_step_arguments, check_step_arguments, kind_of
from lib import runner

TOOL = "kernel_bytes"
DRAM_READ, DRAM_WRITE, L2, TIME = ("dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_bytes.sum",
                                   "gpu__time_duration.sum")
METRICS = (DRAM_READ, DRAM_WRITE, L2, TIME)
UNITS = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12,
         "ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}


@dataclass
class Kernel:
    name: str
    dram: float = 0.0  # bytes read and written
    l2: float = 0.0    # bytes through L2 (lts__t_bytes)
    us: float = 0.0    # its time, alone


def value(row: dict[str, str]) -> float:
    """A row's metric in bytes or µs; ValueError naming what is wrong."""
    unit, text = row.get("Metric Unit") or "", (row.get("Metric Value") or "").replace(",", "")
    if unit not in UNITS:
        raise ValueError(f"{row.get('Metric Name')}: unit {unit!r} is not one of {', '.join(UNITS)}")
    try:
        number = float(text)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{row.get('Metric Name')}: {text!r} is not a number of {unit}s")
    return number * UNITS[unit]


COLUMNS = ("ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value")


def read_kernels(text: str) -> list[Kernel]:
    """Each profiled kernel of ncu's --csv output (its ==PROF== and ==WARNING== lines skipped), in
    launch order; ValueError saying what is wrong where the table is not ncu's: a column, a cell or
    one of METRICS missing, a metric given twice for a kernel (two runs' rows in one file), a
    kernel's ID not a number (other output mixed in)."""
    lines = [line for line in text.splitlines() if not line.startswith("==")]
    try:
        rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    except csv.Error as e:
        raise ValueError(f"not ncu's CSV: {e}") from None
    if not rows or not set(COLUMNS) <= set(rows[0]):
        raise ValueError(f"no ncu --csv metrics table in it (columns {', '.join(COLUMNS)})")
    kernels: dict[tuple[str, str], Kernel] = {}  # by (process, ID): IDs count from 0 in each process
    seen: dict[tuple[str, str], set[str]] = {}
    for line, row in enumerate(rows, start=2):  # the header is line 1 of the table
        if not (row["ID"] or "").isdigit():
            raise ValueError(f"table row {line}: kernel ID {row['ID']!r} is not a number (other output mixed into the CSV?)")
        if any(row.get(c) is None for c in COLUMNS):
            raise ValueError(f"table row {line} has too few cells")
        key = (row.get("Process ID") or "", row["ID"])
        k = kernels.setdefault(key, Kernel(row["Kernel Name"]))
        metric = row["Metric Name"]
        if k.name != row["Kernel Name"] or metric in seen.setdefault(key, set()):
            raise ValueError(f"table row {line}: kernel {row['ID']} given twice (two runs' rows in one file?)")
        seen[key].add(metric)
        if metric in (DRAM_READ, DRAM_WRITE):
            k.dram += value(row)
        elif metric == L2:
            k.l2 = value(row)
        elif metric == TIME:
            k.us = value(row)
    for key, metrics in seen.items():
        missing = sorted(set(METRICS) - metrics)
        if missing:
            raise ValueError(f"kernel {key[1]} ({kernels[key].name[:60]}) lacks {', '.join(missing)} "
                             f"(ncu --metrics {','.join(METRICS)})")
    return list(kernels.values())


def totals(kernels: list[Kernel], key: Callable[[Kernel], str]) -> dict[str, tuple[Kernel, int]]:
    """The kernels added up by key(kernel): each key's sums (a Kernel named by the key) and count."""
    out: dict[str, tuple[Kernel, int]] = {}
    for k in kernels:
        name = key(k)
        total, n = out.get(name, (Kernel(name), 0))
        total.dram, total.l2, total.us = total.dram + k.dram, total.l2 + k.l2, total.us + k.us
        out[name] = (total, n + 1)
    return out


def by_kind(kernels: list[Kernel]) -> dict[str, tuple[Kernel, int]]:
    """Each kind's sums and its number of kernels."""
    return totals(kernels, lambda k: kind_of(k.name))


SORT_KEYS = {"dram": ("DRAM", lambda k: k.dram), "l2": ("L2", lambda k: k.l2)}


def by_name(kernels: list[Kernel], sort: str = "dram") -> list[tuple[Kernel, int]]:
    """Each kernel name's sums over its launches and their number, the most bytes (of DRAM or L2,
    by sort) first."""
    key = SORT_KEYS[sort][1]
    return sorted(totals(kernels, lambda k: k.name).values(), key=lambda t: -key(t[0]))


def row(label: str, k: Kernel, n: int, steps: int) -> str:
    rate = f"{k.dram / k.us / 1e3:,.0f}" if k.us else "-"
    return (f"| {label} | {k.dram / steps / 1e6:,.0f} | {k.l2 / steps / 1e6:,.0f} | {n / steps:,.1f} | "
            f"{k.us / steps:,.0f} | {rate} |")


def table(kernels: list[Kernel], steps: int) -> str:
    kinds = by_kind(kernels)
    lines = ["| kind | DRAM, MB a step | L2, MB a step | kernels a step | µs a step, each alone | DRAM GB/s |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    lines += [row(kind, *kinds[kind], steps) for kind in ORDER if kind in kinds]
    everything = Kernel("all", sum(k.dram for k in kernels), sum(k.l2 for k in kernels), sum(k.us for k in kernels))
    lines.append(row("**all kernels**", everything, len(kernels), steps))
    return "\n".join(lines)


def largest(kernels: list[Kernel], steps: int, n: int, sort: str = "dram") -> str:
    lines = [f"The {n} kernels that move the most {SORT_KEYS[sort][0]} bytes:", "",
             "| kernel | DRAM, MB a step | L2, MB a step | launches a step | µs a step, each alone | DRAM GB/s |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for k, count in by_name(kernels, sort)[:n]:
        lines.append(row(f"`{k.name[:120]}`", k, count, steps))
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("csv", type=Path, help="ncu's --csv --log-file output with the four metrics above")
    add_step_arguments(p, "also list the N kernels that move the most bytes (--sort)")
    p.add_argument("--sort", choices=sorted(SORT_KEYS), default="dram",
                   help="--by-kernel's order: the most DRAM bytes first (default), or the most L2 bytes (the "
                        "operands' tiles read again by a GEMM's other tiles show there, not in DRAM)")
    args = p.parse_args(argv)
    check_step_arguments(p, args)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        text = args.csv.read_text(encoding="utf-8-sig")  # a BOM, as some editors save CSV, is not a column name's
    except (OSError, UnicodeDecodeError) as e:
        print(f"{TOOL}: {args.csv}: {e.strerror if isinstance(e, OSError) else 'not a text file'}", file=sys.stderr)
        return 2
    try:
        kernels = read_kernels(text)
    except ValueError as e:
        print(f"{TOOL}: {args.csv}: {e}", file=sys.stderr)
        return 1
    print(table(kernels, args.steps))
    if args.by_kernel:
        print("\n" + largest(kernels, args.steps, args.by_kernel, args.sort))
    return 0


if __name__ == "__main__":
    runner.main_entry(TOOL, main)
