"""The trainer's built-in `--trace FILE.json` (Chrome trace format) -> ProfileSummary (timeline.py).

What the trainer writes (include/measure/trace.h, write_chrome_trace): a process "CPU" with a row per
thread holding the NVTX phase ranges and the CUDA runtime API calls, and a process "GPU <n>" with a
row per stream holding kernels, memcpys and memsets; times in microseconds. Processes are told
apart by their "process_name" metadata events; where those are missing, an event's "cat" decides.
Both complete events ("ph": "X") and begin/end pairs ("B"/"E") are read.

Unlike nsys's API summary, the trace knows which thread and phase each API call ran in, so the
blocking calls (cudaStreamSynchronize, cudaMemcpy, ...) are charged to the phase that made them:
that is what lets "where the time goes" say "loss stats ... (waiting on the GPU)".
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # run as a program by mistake: say which one (before the imports below can fail)
    print(f"{sys.argv[0]} is a module (the --trace reader of bench/profile.py), not a program: "
          "run python3 bench/profile.py (make profile)", file=sys.stderr)
    sys.exit(2)

import json
import re
from pathlib import Path

from .timeline import STEP, STEP_PHASES, SYNC_CALLS, ProfileSummary, Stat, add_phase, api_name, range_name

GPU_CATEGORIES = ("kernel", "memcpy", "memset", "gpu")
API_CATEGORIES = ("api", "runtime", "driver")


def load_events(path: Path | str) -> list[dict]:
    data = json.loads(Path(path).read_text())
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    return [e for e in events if isinstance(e, dict)]


def complete_events(events: list[dict]) -> list[dict]:
    """X events as they are, and B/E pairs on the same pid/tid joined into X events."""
    done, open_ = [], {}
    for e in events:
        ph = e.get("ph")
        if ph == "X":
            done.append(e)
        elif ph == "B":
            open_.setdefault((e.get("pid"), e.get("tid")), []).append(e)
        elif ph == "E":
            stack = open_.get((e.get("pid"), e.get("tid")))
            if stack:
                begin = stack.pop()
                done.append({**begin, "ph": "X", "dur": float(e.get("ts", 0)) - float(begin.get("ts", 0))})
    return done


def _us_to_ns(value) -> int:
    return int(round(float(value or 0) * 1000))


def is_api_call(event: dict) -> bool:
    cat = str(event.get("cat", "")).lower()
    return any(c in cat for c in API_CATEGORIES) or bool(re.match(r"cu[A-Z]|cuda[A-Z]", event.get("name", "")))


def summarize(path: Path | str, variant: str, run: dict | None = None) -> ProfileSummary:
    events = load_events(path)
    process = {e.get("pid"): str(e.get("args", {}).get("name", "")) for e in events
               if e.get("ph") == "M" and e.get("name") == "process_name"}

    def on_gpu(e: dict) -> bool:
        if e.get("pid") in process:
            return process[e["pid"]].upper().startswith("GPU")
        cat = str(e.get("cat", "")).lower()
        return any(c in cat for c in GPU_CATEGORIES)

    summary = ProfileSummary(variant=variant, source="built-in trace", run=run)
    intervals, kernels, api, ranges, calls = [], {}, {}, [], []
    for e in complete_events(events):
        start, dur = _us_to_ns(e.get("ts")), _us_to_ns(e.get("dur"))
        name = str(e.get("name", ""))
        if on_gpu(e):
            intervals.append((start, start + dur))
            lowered = name.lower()
            if "memcpy" in lowered or "memset" in lowered:
                direction = _copy_direction(lowered, e.get("args", {}))
                target = {"h2d": summary.h2d, "d2h": summary.d2h}.get(direction, summary.other_copies)
                target.total_ns += dur
                target.count += 1
            else:
                stat = kernels.setdefault(name, Stat(name, 0, 0))
                stat.total_ns += dur
                stat.count += 1
        elif is_api_call(e):
            stat = api.setdefault(api_name(name), Stat(api_name(name), 0, 0))
            stat.total_ns += dur
            stat.count += 1
            calls.append((e.get("tid"), start, start + dur, api_name(name)))
        else:
            add_phase(summary.phases, name, dur, 1)
            ranges.append((e.get("tid"), start, start + dur, range_name(name)))

    summary.kernels = sorted(kernels.values(), key=lambda s: -s.total_ns)
    summary.api = sorted(api.values(), key=lambda s: -s.total_ns)
    summary.set_gpu_activity(intervals)
    summary.phase_wait_ns = blocking_time_per_phase(ranges, calls)
    if run and run.get("gpu_busy_pct") is not None:
        summary.trace_busy_pct = float(run["gpu_busy_pct"])
    return summary


def _copy_direction(lowered_name: str, args: dict) -> str:
    text = (lowered_name + " " + str(args.get("kind", "")) + " " + str(args.get("copy", ""))).lower()
    if "htod" in text or "host-to-device" in text or "hosttodevice" in text:
        return "h2d"
    if "dtoh" in text or "device-to-host" in text or "devicetohost" in text:
        return "d2h"
    return "other"


def blocking_time_per_phase(ranges: list[tuple], calls: list[tuple]) -> dict[str, int]:
    """Time of the blocking API calls, charged to the step phase (else the innermost non-step range)
    open on the same thread when each call started."""
    wait: dict[str, int] = {}
    for tid, start, end, name in calls:
        if name not in SYNC_CALLS:
            continue
        enclosing = [r for r in ranges if r[0] == tid and r[1] <= start < r[2] and r[3] != STEP]
        if not enclosing:
            continue
        phases = [r for r in enclosing if r[3] in STEP_PHASES] or enclosing
        innermost = max(phases, key=lambda r: r[1])
        wait[innermost[3]] = wait.get(innermost[3], 0) + (end - start)
    return wait
