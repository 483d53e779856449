"""`nsys stats` CSV files -> ProfileSummary (timeline.py).

profile.py runs
    nsys stats --report nvtx_sum,cuda_gpu_kern_sum,cuda_gpu_mem_time_sum,cuda_api_sum,cuda_gpu_trace
               --format csv --output <prefix> <report>.nsys-rep
which writes one file per report, <prefix>_<report>.csv. The column names are those of Nsight
Systems 2024-2025 ("Total Time (ns)", "Instances", "Range", "Start (ns)", ...). Times are read in
whatever unit the header names ((ns), (us), (ms), (s)), so `--timeunit` does not break the parse,
and lines before the header (nsys's "Processing [...] with [...]" notices) are skipped.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # run as a program by mistake: say which one (before the imports below can fail)
    print(f"{sys.argv[0]} is a module (the nsys CSV reader of bench/profile.py), not a program: "
          "run python3 bench/profile.py (make profile)", file=sys.stderr)
    sys.exit(2)

import csv
import io
import math
import re
from pathlib import Path

from .timeline import ProfileSummary, Stat, add_phase, api_name, interval_union_ns, merged_intervals

REPORTS = ["nvtx_sum", "cuda_gpu_kern_sum", "cuda_gpu_mem_time_sum", "cuda_api_sum", "cuda_gpu_trace"]

_UNIT_NS = {"ns": 1, "us": 1e3, "μs": 1e3, "ms": 1e6, "s": 1e9}


def report_path(prefix: Path | str, report: str) -> Path:
    return Path(f"{prefix}_{report}.csv")


def read_rows(text: str) -> list[dict[str, str]]:
    """The rows of one report's CSV as dicts keyed by column name; [] when it has no table."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        fields = next(csv.reader([line]), [])
        if len(fields) > 1 and any(f.startswith(("Total Time", "Start")) for f in fields):
            return list(csv.DictReader(io.StringIO("\n".join(lines[i:]))))
    return []


def column(row: dict[str, str], name: str) -> str | None:
    """The key of column `name` in the row, with or without a unit: "Total Time" -> "Total Time (ns)"."""
    for key in row:
        if key is not None and (key == name or key.startswith(name + " (")):
            return key
    return None


def number(text: str | None) -> float:
    """nsys writes plain numbers in CSV, but a hand-exported table may carry thousands separators."""
    if text is None or not text.strip():
        return 0.0
    try:
        value = float(text.replace(",", ""))
    except ValueError:
        value = math.nan
    # inf would only fail later, as an OverflowError in int(); the callers name the file
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is not a number")
    return value


def time_ns(row: dict[str, str], name: str) -> int:
    """A time column in ns, whatever unit its header names."""
    key = column(row, name)
    if key is None:
        return 0
    m = re.search(r"\((\w+)\)$", key)
    scale = _UNIT_NS.get(m.group(1), 1) if m else 1
    return int(round(number(row[key]) * scale))


def count(row: dict[str, str], *names: str) -> int:
    for name in names:
        if (row.get(name) or "").strip():
            return int(number(row[name]))
    return 0


def parse_nvtx_sum(rows: list[dict[str, str]], phases: dict[str, Stat]) -> None:
    for row in rows:
        name = row.get("Range") or row.get("Name") or ""
        if name:
            add_phase(phases, name, time_ns(row, "Total Time"), count(row, "Instances", "Count"))


def parse_named_sum(rows: list[dict[str, str]], key: str = "Name", clean=lambda n: n) -> list[Stat]:
    """cuda_gpu_kern_sum and cuda_api_sum: one row per name, longest total first."""
    stats: dict[str, Stat] = {}
    for row in rows:
        name = clean(row.get(key) or "")
        if not name:
            continue
        stat = stats.setdefault(name, Stat(name, 0, 0))
        stat.total_ns += time_ns(row, "Total Time")
        stat.count += count(row, "Instances", "Num Calls", "Count")
    return sorted(stats.values(), key=lambda s: -s.total_ns)


def copy_direction(operation: str) -> str:
    """"[CUDA memcpy Host-to-Device]" (2023+) or "[CUDA memcpy HtoD]" (older) -> "h2d"."""
    op = operation.replace(" ", "").lower()
    if "host-to-device" in op or "htod" in op:
        return "h2d"
    if "device-to-host" in op or "dtoh" in op:
        return "d2h"
    return "other"


def parse_mem_time_sum(rows: list[dict[str, str]], summary: ProfileSummary) -> None:
    for row in rows:
        direction = copy_direction(row.get("Operation") or row.get("Name") or "")
        target = {"h2d": summary.h2d, "d2h": summary.d2h}.get(direction, summary.other_copies)
        target.total_ns += time_ns(row, "Total Time")
        target.count += count(row, "Count", "Instances")


def gpu_intervals(rows: list[dict[str, str]]) -> list[tuple[int, int]]:
    """(start, end) of every kernel, memcpy and memset in cuda_gpu_trace."""
    intervals = []
    for row in rows:
        start = time_ns(row, "Start")
        intervals.append((start, start + time_ns(row, "Duration")))
    return intervals


# NCCL's kernels: "ncclDevKernel_AllReduce_Sum_f16_RING_LL(...)" (2.19+), "ncclKernel_AllReduce_..." before.
NCCL_KERNEL = re.compile(r"^nccl", re.IGNORECASE)


def intersection_ns(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    """Total length where two sets of intervals overlap (each merged first)."""
    a, b = merged_intervals(a), merged_intervals(b)
    i = j = total = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def allreduce_time(rows: list[dict[str, str]]) -> tuple[int, int]:
    """From cuda_gpu_trace: the time NCCL kernels ran (overlaps counted once) and how much of it
    other kernels ran at the same time, i.e. what backward hid. An NCCL kernel also runs while it
    waits for the slowest rank, so its time is communication plus waiting."""
    nccl, compute = [], []
    for row in rows:
        name = row.get("Name") or ""
        start = time_ns(row, "Start")
        interval = (start, start + time_ns(row, "Duration"))
        if NCCL_KERNEL.match(name):
            nccl.append(interval)
        elif not name.startswith("["):  # "[CUDA memcpy ...]" and "[CUDA memset]" are not compute
            compute.append(interval)
    return interval_union_ns(nccl), intersection_ns(nccl, compute)


def parse_report(report: str, rows: list[dict[str, str]], summary: ProfileSummary) -> None:
    """Sets one report's part of summary. Each part is parsed into a fresh object and set only once
    all its rows parsed: a cell that is not a number (ValueError) leaves summary as it was."""
    if report == "nvtx_sum":
        phases: dict[str, Stat] = {}
        parse_nvtx_sum(rows, phases)
        summary.phases = phases
    elif report == "cuda_gpu_kern_sum":
        summary.kernels = parse_named_sum(rows)
    elif report == "cuda_gpu_mem_time_sum":
        copies = ProfileSummary(variant=summary.variant, source=summary.source)
        parse_mem_time_sum(rows, copies)
        summary.h2d, summary.d2h, summary.other_copies = copies.h2d, copies.d2h, copies.other_copies
    elif report == "cuda_api_sum":
        summary.api = parse_named_sum(rows, clean=api_name)
    elif report == "cuda_gpu_trace":
        summary.set_gpu_activity(gpu_intervals(rows))


def read_reports(prefix: Path | str) -> dict[str, list[dict[str, str]] | None]:
    """The rows of <prefix>_<report>.csv for every report; None for a missing file."""
    reports = {}
    for report in REPORTS:
        path = report_path(prefix, report)
        reports[report] = read_rows(path.read_text(errors="replace")) if path.is_file() else None
    return reports


def summarize(prefix: Path | str, variant: str,
              reports: dict[str, list[dict[str, str]] | None] | None = None) -> ProfileSummary:
    """The profile in <prefix>_<report>.csv (reports: those files as read_reports read them, for a
    caller that uses their rows too); a missing report becomes a note, not an error."""
    reports = read_reports(prefix) if reports is None else reports
    summary = ProfileSummary(variant=variant, source="nsys")
    for report in REPORTS:
        path = report_path(prefix, report)
        if reports[report] is None:
            summary.notes.append(f"{path.name} is missing, so its part of this profile is empty")
            continue
        try:
            parse_report(report, reports[report], summary)
        except ValueError as e:  # a hand-edited or damaged CSV spoils its own part, not the whole profile
            summary.notes.append(f"{path.name}: {e}, so its part of this profile is left out")
    return summary
