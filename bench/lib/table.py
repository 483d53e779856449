"""The images/sec table: from the binaries' --json output to Markdown and CSV.

Pure functions of recorded output (no subprocess calls), so the whole table can be tested against
committed recordings. A run counts when it exited 0 and printed a summary line; anything else
becomes a row or a note that says what went wrong, never an exception.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # run as a program by mistake: say which one (before the imports below can fail)
    print(f"{sys.argv[0]} is a module (the images/s table of the bench tools), not a program: "
          "run python3 bench/bench.py (make bench)", file=sys.stderr)
    sys.exit(2)

import csv
import io
import json
import math
import statistics
from dataclasses import dataclass, field

from .runner import RunOutput, last_line

BASELINE = "train-baseline"
MISSING = "—"  # what a cell shows when the binary did not report the number


# ---- reading one run's output ----------------------------------------------------------------------

def parse_json_lines(text: str) -> list[dict]:
    """The JSON objects of a --json stdout; the trainer interleaves plain lines, which are skipped."""
    objects = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue  # a progress line that happens to start with "{", or one cut off by a crash
        if isinstance(obj, dict):
            objects.append(obj)
    return objects


def summaries(text: str) -> list[dict]:
    """The summary lines of a run: one for a trainer binary, one per rung for pytorch_reference.py."""
    return [o for o in parse_json_lines(text) if o.get("event") == "summary"]


def failure_reason(out: RunOutput) -> str | None:
    """Why a run does not count (None when it does): timeout, non-zero exit, or no summary line."""
    if out.returncode is None:
        return f"timed out after {out.timeout_s:g} s" if out.timeout_s else "timed out"
    if out.returncode != 0:
        return last_line(out.stderr) or f"exit code {out.returncode}"
    if not summaries(out.stdout):
        why = "no summary line in its output"
        return f"{why} ({last_line(out.stderr)})" if last_line(out.stderr) else why
    return None


def number(value) -> float | None:
    """A finite number from a JSON field; None for null, missing, text, booleans and NaN."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


# ---- one row per variant (and batch) ----------------------------------------------------------------

@dataclass
class Row:
    variant: str
    batch: int | None
    runs: int                                    # runs attempted (timed runs, not the trace run)
    images_per_s: list[float] = field(default_factory=list)  # one per successful run
    failures: list[str] = field(default_factory=list)        # one reason per failed run
    optimizations: list[str] | None = None
    ms_per_step: float | None = None
    gpu_busy_pct: float | None = None
    data_stall_pct: float | None = None
    peak_gpu_mem_mb: float | None = None
    final_loss: float | None = None
    notes: list[str] = field(default_factory=list)
    meta: dict = field(default_factory=dict)     # gpu, cudnn, date, settings of the first good run
    # bench.py --clocks: over the runs' timed windows, medians of the runs' (lib/gpu_clocks.py)
    sm_mhz: float | None = None
    power_w: float | None = None
    capped_pct: float | None = None              # of the busy samples, those the power cap held down
    mj_per_image: float | None = None            # each run's power over its images/s

    @property
    def failed(self) -> bool:
        return not self.images_per_s

    @property
    def median(self) -> float | None:
        return statistics.median(self.images_per_s) if self.images_per_s else None


def _median_of(runs: list[dict], key: str) -> float | None:
    values = [v for v in (number(r.get(key)) for r in runs) if v is not None]
    return statistics.median(values) if values else None


def start_event(text: str) -> dict | None:
    """The {"event": "start"} line a binary prints before it touches the GPU: what it was built with."""
    return next((o for o in parse_json_lines(text) if o.get("event") == "start"), None)


def build_row(variant: str, batch: int | None, results: list[dict | str],
              trace: dict | str | None = None, start: dict | None = None) -> Row:
    """A row from the variant's timed runs (a summary dict, or the reason the run failed) and the
    optional --trace run, which only contributes GPU busy % (tracing slows the run down). `start`,
    a start line, names the optimizations of a binary that never got as far as a summary."""
    good = [r for r in results if isinstance(r, dict)]
    row = Row(variant=variant, batch=batch, runs=len(results),
              failures=[r for r in results if isinstance(r, str)])
    for s in good:
        ips = number(s.get("images_per_s"))
        if ips is None:
            row.failures.append("summary line has no images_per_s")
        else:
            row.images_per_s.append(ips)
    if good or start:
        first = good[0] if good else start
        opts = first.get("optimizations")
        row.optimizations = [str(o) for o in opts] if isinstance(opts, list) else None
        row.meta = {k: first.get(k) for k in ("gpu", "cudnn", "date", "settings") if first.get(k) is not None}
    row.ms_per_step = _median_of(good, "ms_per_step")
    if row.ms_per_step is None and row.median and batch:
        row.ms_per_step = 1000.0 * batch / row.median  # older summaries lack it; same quantity
    row.data_stall_pct = _median_of(good, "data_stall_pct")
    peaks = [v for v in (number(s.get("peak_gpu_mem_mb")) for s in good) if v is not None]
    row.peak_gpu_mem_mb = max(peaks) if peaks else None
    row.final_loss = _median_of(good, "final_loss")
    if isinstance(trace, dict):
        row.gpu_busy_pct = number(trace.get("gpu_busy_pct"))
    elif isinstance(trace, str) and not row.failed:  # a failed row already says why
        row.notes.append(f"trace run failed: {trace}")
    if row.failures and not row.failed:
        row.notes.append(f"{len(row.failures)} of {row.runs} runs failed: {row.failures[-1]}")
    return row


def result_of(out: RunOutput, variant: str | None = None) -> dict | str:
    """One trainer run as build_row wants it: its summary, or why it failed."""
    reason = failure_reason(out)
    if reason:
        return reason
    found = [s for s in summaries(out.stdout) if variant is None or s.get("variant") == variant]
    return found[-1] if found else "no summary line in its output"


def rows_from_multi_variant(outs: list[RunOutput], variants: list[str], batch: int | None) -> list[Row]:
    """Rows for a process that measures several variants in one go (pytorch_reference.py): each run
    prints a summary per variant, or a {"event": "rung_failed"} line for a variant that broke."""
    per_variant: dict[str, list[dict | str]] = {v: [] for v in variants}
    for out in outs:
        objects = parse_json_lines(out.stdout)
        for v in variants:
            mine = [o for o in objects if o.get("variant") == v]
            done = [o for o in mine if o.get("event") == "summary"]
            broke = [o for o in mine if o.get("event") == "rung_failed"]
            if done:
                per_variant[v].append(done[-1])
            elif broke:
                per_variant[v].append(str(broke[-1].get("error") or "failed"))
            else:  # the process died before it got to this variant
                per_variant[v].append(failure_reason(out) or "not measured: the run ended before it")
    return [build_row(v, batch, per_variant[v]) for v in variants]


# ---- formatting -------------------------------------------------------------------------------------

def speedup(row: Row, rows: list[Row]) -> float | None:
    """Median images/s over the trainer baseline's median at the same batch size."""
    base = next((r for r in rows if r.variant == BASELINE and r.batch == row.batch and not r.failed), None)
    if base is None or row.failed:
        return None
    return row.median / base.median


def fmt(value: float | None, digits: int = 1, thousands: bool = False) -> str:
    if value is None:
        return MISSING
    return f"{value:,.{digits}f}" if thousands else f"{value:.{digits}f}"


def images_cell(row: Row) -> str:
    if row.failed:
        return f"failed: {row.failures[-1] if row.failures else 'no run'}"
    lo, hi = min(row.images_per_s), max(row.images_per_s)
    spread = f" ({lo:,.0f}–{hi:,.0f})" if len(row.images_per_s) > 1 else ""
    return f"{row.median:,.0f}{spread}"


def optimizations_cell(row: Row) -> str:
    if row.optimizations is None:
        return MISSING
    return ", ".join(row.optimizations) if row.optimizations else "none"


COLUMNS = ["batch", "variant", "optimizations", "images/s median (min–max)", "speedup", "ms/step",
           "GPU busy %", "data stall %", "peak GPU MB", "final loss", "notes"]


def markdown_table(rows: list[Row]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join(" --- " for _ in COLUMNS) + "|"]
    for row in rows:
        sp = speedup(row, rows)
        cells = [
            str(row.batch) if row.batch is not None else MISSING,
            row.variant,
            optimizations_cell(row),
            images_cell(row),
            f"{sp:.2f}x" if sp is not None else MISSING,
            fmt(row.ms_per_step, 2),
            fmt(row.gpu_busy_pct, 1),
            fmt(row.data_stall_pct, 1),
            fmt(row.peak_gpu_mem_mb, 0, thousands=True),
            fmt(row.final_loss, 3),
            "; ".join(row.notes),
        ]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def power_markdown(rows: list[Row]) -> str:
    """bench.py --clocks' table: each row's SM clock, power, power-capped share and energy an image;
    "" where no row has them."""
    if all(r.power_w is None for r in rows):
        return ""
    lines = ["| batch | variant | SM clock, MHz | power, W | power-capped samples | energy, mJ an image |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    for row in rows:
        capped = MISSING if row.capped_pct is None else f"{row.capped_pct:.0f}%"
        lines.append(f"| {row.batch if row.batch is not None else MISSING} | {_cell(row.variant)} | "
                     f"{fmt(row.sm_mhz, 0, thousands=True)} | {fmt(row.power_w, 0)} | {capped} | "
                     f"{fmt(row.mj_per_image, 1)} |")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    """Keeps a stderr message from breaking the table: no pipes, no newlines."""
    return text.replace("|", "\\|").replace("\n", " ").strip()


CSV_FIELDS = ["batch", "variant", "optimizations", "status", "runs", "runs_ok", "images_per_s_median",
              "images_per_s_min", "images_per_s_max", "speedup", "ms_per_step", "gpu_busy_pct",
              "data_stall_pct", "peak_gpu_mem_mb", "final_loss", "error", "notes", "sm_mhz", "power_w",
              "power_capped_pct", "mj_per_image"]


def csv_text(rows: list[Row]) -> str:
    """The same table for spreadsheets: plain numbers, empty where unknown."""
    def num(v: float | None, digits: int) -> str:
        return "" if v is None else f"{v:.{digits}f}"

    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({
            "batch": row.batch if row.batch is not None else "",
            "variant": row.variant,
            "optimizations": " ".join(row.optimizations or []),
            "status": "failed" if row.failed else "ok",
            "runs": row.runs,
            "runs_ok": len(row.images_per_s),
            "images_per_s_median": num(row.median, 1),
            "images_per_s_min": num(min(row.images_per_s) if row.images_per_s else None, 1),
            "images_per_s_max": num(max(row.images_per_s) if row.images_per_s else None, 1),
            "speedup": num(speedup(row, rows), 3),
            "ms_per_step": num(row.ms_per_step, 3),
            "gpu_busy_pct": num(row.gpu_busy_pct, 1),
            "data_stall_pct": num(row.data_stall_pct, 2),
            "peak_gpu_mem_mb": num(row.peak_gpu_mem_mb, 0),
            "final_loss": num(row.final_loss, 4),
            "error": row.failures[-1] if row.failed and row.failures else "",
            "notes": "; ".join(row.notes),
            "sm_mhz": num(row.sm_mhz, 0),
            "power_w": num(row.power_w, 1),
            "power_capped_pct": num(row.capped_pct, 0),
            "mj_per_image": num(row.mj_per_image, 2),
        })
    return buf.getvalue()


def cudnn_version(code) -> str:
    """cuDNN's CUDNN_VERSION number as x.y.z: 91400 -> 9.14.0 (cuDNN 9), 8907 -> 8.9.7 (cuDNN 8)."""
    v = number(code)
    if v is None:
        return MISSING
    v = int(v)
    if v >= 90000:
        return f"{v // 10000}.{v % 10000 // 100}.{v % 100}"
    return f"{v // 1000}.{v % 1000 // 100}.{v % 100}"


def run_metadata(rows: list[Row]) -> dict:
    """GPU, cuDNN and date as the binaries reported them (the first row that has each)."""
    meta = {}
    for row in rows:
        for key, value in row.meta.items():
            meta.setdefault(key, value)
    return meta


def report_markdown(rows: list[Row], command: str, gpu: str, date: str, settings_line: str) -> str:
    """The results file: how it was measured, then the table."""
    meta = run_metadata(rows)
    power = power_markdown(rows)
    return (
        f"# Training throughput, ResNet-50 (CIFAR stem), {gpu}, {date}\n\n"
        f"- command: `{command}`\n"
        f"- GPU: {meta.get('gpu', gpu)}\n"
        f"- cuDNN: {cudnn_version(meta.get('cudnn'))}\n"
        f"- date: {date}\n"
        f"- {settings_line}\n"
        "- images/s: median over the runs (min–max in brackets), measured by each binary over its\n"
        "  timed window after the warm-up steps; speedup is over train-baseline at the same batch.\n"
        "- GPU busy %: from one extra run with `--trace` (union of kernel, memcpy and memset\n"
        "  intervals over the window); that run is not part of the images/s.\n\n"
        + markdown_table(rows)
        + ("" if not power else
           "\nPower (`--clocks`: nvidia-smi every 100 ms through each run; the samples with the GPU at least\n"
           "90% busy inside the run's timed window; medians of the runs'; energy an image: each run's power\n"
           "over its images/s):\n\n" + power)
    )
