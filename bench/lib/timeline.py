"""A profile of the steady-state window, condensed: where a training step's time goes.

Both sources of a profile fill the same ProfileSummary: `nsys stats` CSV files (nsys_summary.py)
and the trainer's built-in `--trace` Chrome JSON (trace_summary.py). From it come the Markdown
table per binary, the one-line "where the time goes", and the bottleneck that profile_check.py
acts on. Pure functions; nothing here runs a program.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # run as a program by mistake: say which one (before the imports below can fail)
    print(f"{sys.argv[0]} is a module (the profile summary of bench/profile.py), not a program: "
          "run python3 bench/profile.py (make profile)", file=sys.stderr)
    sys.exit(2)

import re
from dataclasses import dataclass, field

# The phases of one training step, as the trainer's NVTX ranges name them (include/measure/profiling.h),
# in the order they run, then those of a bin/predict batch (get batch, compute, copy to CPU, process
# output; with output workers, "process output" runs on their threads, so its host time, summed over
# them, may exceed the step's). Each step or batch is also wrapped in a "step N" range. Builds that
# replay the step as a CUDA graph have "step graph" (one launch) where the others have forward,
# backward, optimizer step (and, with --accumulate, "accumulate" after each micro-batch's backward).
STEP_PHASES = ["get batch", "copy batch", "step graph", "forward", "backward", "accumulate", "optimizer step",
               "loss stats", "compute", "copy to CPU", "process output"]
STEP = "step"

# Host calls that block until the GPU has caught up: time in them is time the host waits.
SYNC_CALLS = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
              "cudaMemcpy2D", "cuStreamSynchronize", "cuCtxSynchronize",
              "cuEventSynchronize", "cuMemcpyDtoH", "cuMemcpyHtoD"}


def range_name(raw: str) -> str:
    """One name per phase: "step 17" -> "step", the loader's "fill batch 2" -> "fill batch";
    nsys's ":forward" (an empty NVTX domain before the colon) -> "forward"."""
    name = raw.strip()
    if name.startswith(":"):
        name = name[1:]
    return re.sub(r" \d+$", "", name)


def api_name(raw: str) -> str:
    """"cudaMemcpy_v3020" -> "cudaMemcpy": nsys appends the API version to some names."""
    return re.sub(r"_v\d+$", "", raw.strip())


@dataclass
class Stat:
    """A named total: an NVTX range, a kernel, or an API call."""
    name: str
    total_ns: int
    count: int


def merged_intervals(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(start, end) intervals, sorted, with overlapping and touching ones joined; empty ones dropped."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def interval_union_ns(intervals: list[tuple[int, int]]) -> int:
    """Total length covered by (start, end) intervals, overlaps counted once."""
    return sum(end - start for start, end in merged_intervals(intervals))


# Idle time sorted by the length of the gap it is in. Gaps of a few microseconds are the launch
# latency between back-to-back kernels (fewer kernels, fused ones or CUDA graphs remove them); long
# ones are the GPU waiting for the host (a synchronising call, a late batch, a slow launch path).
GAP_CLASSES = [(2_000, "< 2 µs"), (10_000, "2-10 µs"), (100_000, "10-100 µs"), (1_000_000, "0.1-1 ms"),
               (None, "≥ 1 ms")]


def idle_by_gap_length(intervals: list[tuple[int, int]]) -> list[Stat]:
    """The idle stretches between GPU activities in the window, as one Stat per GAP_CLASSES entry
    (total idle ns, number of gaps); their totals add up to window - busy."""
    classes = [Stat(label, 0, 0) for _, label in GAP_CLASSES]
    spans = merged_intervals(intervals)
    for (_, prev_end), (next_start, _) in zip(spans, spans[1:]):
        gap = next_start - prev_end
        i = next(k for k, (limit, _) in enumerate(GAP_CLASSES) if limit is None or gap < limit)
        classes[i].total_ns += gap
        classes[i].count += 1
    return classes


def busy_and_window_ns(intervals: list[tuple[int, int]]) -> tuple[int, int]:
    """GPU busy time (union of activity intervals) and the window from first start to last end:
    the same definition as the trainer's built-in trace (include/measure/trace.h), so the two compare."""
    if not intervals:
        return 0, 0
    window = max(e for _, e in intervals) - min(s for s, _ in intervals)
    return interval_union_ns(intervals), window


@dataclass
class ProfileSummary:
    variant: str
    source: str                                   # "nsys" or "built-in trace"
    phases: dict[str, Stat] = field(default_factory=dict)  # by range_name(); "step" sums the steps
    kernels: list[Stat] = field(default_factory=list)      # longest total first
    api: list[Stat] = field(default_factory=list)          # longest total first
    h2d: Stat = field(default_factory=lambda: Stat("host to device", 0, 0))
    d2h: Stat = field(default_factory=lambda: Stat("device to host", 0, 0))
    other_copies: Stat = field(default_factory=lambda: Stat("device to device / memset", 0, 0))
    busy_ns: int = 0
    window_ns: int = 0
    idle_gaps: list[Stat] = field(default_factory=list)    # idle_by_gap_length() of the window
    phase_wait_ns: dict[str, int] = field(default_factory=dict)  # blocking-call time inside each phase
    trace_busy_pct: float | None = None           # the built-in trace's figure, when it ran too
    run: dict | None = None                       # the binary's --json summary of the profiled run
    notes: list[str] = field(default_factory=list)

    def set_gpu_activity(self, intervals: list[tuple[int, int]]) -> None:
        """busy_ns, window_ns and idle_gaps from the (start, end) of every kernel, copy and memset."""
        self.busy_ns, self.window_ns = busy_and_window_ns(intervals)
        self.idle_gaps = idle_by_gap_length(intervals)

    def captured(self) -> bool:
        """Whether the profile holds anything: a failed run's has notes only, and a report of its
        empty tables must not replace a good one of the same name."""
        return bool(self.phases or self.kernels or self.window_ns)

    @property
    def gpu_busy_pct(self) -> float | None:
        return 100.0 * self.busy_ns / self.window_ns if self.window_ns else None

    @property
    def step_ns(self) -> int:
        """Host time of all steps in the window: the "step N" ranges, else the phases added up."""
        if STEP in self.phases:
            return self.phases[STEP].total_ns
        return sum(self.phases[p].total_ns for p in STEP_PHASES if p in self.phases)

    @property
    def step_count(self) -> int:
        return self.phases[STEP].count if STEP in self.phases else 0

    @property
    def sync_ns(self) -> int:
        return sum(a.total_ns for a in self.api if a.name in SYNC_CALLS)


def add_phase(phases: dict[str, Stat], raw_name: str, total_ns: int, count: int) -> None:
    name = range_name(raw_name)
    stat = phases.setdefault(name, Stat(name, 0, 0))
    stat.total_ns += total_ns
    stat.count += count


def dominant_phase(summary: ProfileSummary) -> Stat | None:
    """The step phase with the most host time. The "step N" ranges enclose the others, so they are
    left out; ranges other than the step phases (nested per-layer ranges, loader threads) count only
    when none of them was recorded."""
    named = [s for n, s in summary.phases.items() if n in STEP_PHASES]
    others = [s for n, s in summary.phases.items() if n != STEP and n not in STEP_PHASES]
    pool = named or others
    return max(pool, key=lambda s: s.total_ns) if pool else None


def where_the_time_goes(summary: ProfileSummary) -> str:
    """"loss stats 62% of step time (waiting on the GPU), forward 20%, ...; GPU busy 35%"."""
    step = summary.step_ns
    if not step:
        return "where the time goes: no NVTX step phases were recorded"
    parts = []
    phases = sorted((s for n, s in summary.phases.items() if n in STEP_PHASES), key=lambda s: -s.total_ns)
    for i, s in enumerate(phases):
        pct = 100.0 * s.total_ns / step
        text = f"{s.name} {_pct(pct)}" + (" of step time" if i == 0 else "")
        wait = summary.phase_wait_ns.get(s.name, 0)
        if s.total_ns and wait >= 0.5 * s.total_ns:
            text += " (waiting on the GPU)"
        parts.append(text)
    outside = step - sum(s.total_ns for s in phases)
    if phases and outside > 0.02 * step and STEP in summary.phases:
        parts.append(f"outside the phases {_pct(100.0 * outside / step)}")
    line = "where the time goes: " + ", ".join(parts)
    if summary.sync_ns >= 0.01 * step and not summary.phase_wait_ns:
        # nsys's API summary is not split by phase: say how long the host blocked, in all.
        blocking = sorted((a for a in summary.api if a.name in SYNC_CALLS), key=lambda a: -a.total_ns)
        names = ", ".join(a.name for a in blocking[:2])
        line += f"; host blocked in {names} for {_pct(100.0 * summary.sync_ns / step)} of step time"
    if summary.gpu_busy_pct is not None:
        line += f"; GPU busy {_pct(summary.gpu_busy_pct)} of the window"
    return line


def _pct(value: float) -> str:
    return "<1%" if 0 < value < 0.5 else f"{value:.0f}%"


# ---- Markdown -----------------------------------------------------------------------------------------

def _ms(ns: int | float) -> str:
    return f"{ns / 1e6:,.2f}"


def short_kernel_name(name: str, width: int = 80) -> str:
    """Kernel names from cuDNN and templates run to hundreds of characters; the start says enough."""
    name = re.sub(r"^void ", "", name.strip())
    return name if len(name) <= width else name[:width - 1] + "…"


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def to_markdown(summary: ProfileSummary, top_kernels: int = 10, top_api: int = 6) -> str:
    s = summary
    steps = s.step_count
    run = s.run or {}
    head = f"## {s.variant} ({s.source}"
    if steps:
        head += f", {steps} steps"
    if run.get("batch"):
        head += f", batch {run['batch']}"
    head += ")\n\n"
    lines = [head + where_the_time_goes(s) + "\n"]
    if run.get("images_per_s"):
        # bin/train's summary says ms_per_step, bin/predict's ms_per_batch; a run with neither gets none.
        ms = run.get("ms_per_step") or run.get("ms_per_batch")
        per_step = f", {ms:.2f} ms per step" if ms else ""
        lines.append(f"Under the profiler: {run['images_per_s']:,.0f} images/s{per_step} "
                     f"(the bench table has the unprofiled numbers).\n")

    per_step = steps or 1
    lines.append("| phase (host, NVTX) | total ms | ms per step | % of step | instances |")
    lines.append("| --- | ---: | ---: | ---: | ---: |")
    ordered = [STEP] + STEP_PHASES + sorted(n for n in s.phases if n != STEP and n not in STEP_PHASES)
    for name in ordered:
        if name not in s.phases:
            continue
        stat = s.phases[name]
        pct = f"{100.0 * stat.total_ns / s.step_ns:.1f}" if s.step_ns else "—"
        label = name if name in STEP_PHASES or name == STEP else f"{name} (other range)"
        lines.append(f"| {_md(label)} | {_ms(stat.total_ns)} | {_ms(stat.total_ns / per_step)} | {pct} | {stat.count} |")

    lines.append("")
    lines.append("| GPU | value |")
    lines.append("| --- | ---: |")
    if s.window_ns:
        lines.append(f"| window (first to last GPU activity), ms | {_ms(s.window_ns)} |")
        lines.append(f"| busy (union of kernels, copies, memsets), ms | {_ms(s.busy_ns)} |")
        lines.append(f"| idle, ms | {_ms(s.window_ns - s.busy_ns)} |")
        lines.append(f"| busy % ({s.source}) | {s.gpu_busy_pct:.1f} |")
        for gap in s.idle_gaps:
            if gap.count:
                lines.append(f"| idle in gaps {gap.name}: ms / count | {_ms(gap.total_ns)} / {gap.count} |")
    if s.trace_busy_pct is not None:
        label = "built-in trace, same definition" if s.source == "nsys" else "as the trainer reported it"
        lines.append(f"| busy % ({label}) | {s.trace_busy_pct:.1f} |")
    for copy in (s.h2d, s.d2h, s.other_copies):
        lines.append(f"| {copy.name}: ms / count | {_ms(copy.total_ns)} / {copy.count} |")

    if s.kernels:
        kernel_total = sum(k.total_ns for k in s.kernels) or 1
        lines += ["", "| top kernels | total ms | % of kernel time | instances | avg µs |",
                  "| --- | ---: | ---: | ---: | ---: |"]
        for k in s.kernels[:top_kernels]:
            lines.append(f"| {_md(short_kernel_name(k.name))} | {_ms(k.total_ns)} | "
                         f"{100.0 * k.total_ns / kernel_total:.1f} | {k.count} | {k.total_ns / max(k.count, 1) / 1e3:,.1f} |")
    if s.api:
        lines += ["", "| CUDA API (host) | total ms | calls |", "| --- | ---: | ---: |"]
        for a in s.api[:top_api]:
            blocking = " (blocks)" if a.name in SYNC_CALLS else ""
            lines.append(f"| {_md(a.name)}{blocking} | {_ms(a.total_ns)} | {a.count} |")
    for note in s.notes:
        lines.append(f"\nNote: {note}")
    return "\n".join(lines) + "\n"
