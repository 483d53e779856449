"""The charts of the bench tables, where matplotlib is installed (it is optional): images/s as bars
(bench.py), test accuracy against wall seconds as lines (time_to_accuracy.py)."""

from __future__ import annotations

import sys

if __name__ == "__main__":  # run as a program by mistake: say which one (before the imports below can fail)
    print(f"{sys.argv[0]} is a module (the charts of bench/bench.py's and time_to_accuracy.py's tables), "
          "not a program: run python3 bench/bench.py (make bench)", file=sys.stderr)
    sys.exit(2)

from pathlib import Path

from .table import Row


def _pyplot():
    """matplotlib's pyplot without a display (a GPU server has none), or None where it is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def write_chart(rows: list[Row], path: Path, title: str) -> str | None:
    """Writes the PNG and returns None, or returns why there is no chart."""
    plt = _pyplot()
    if plt is None:
        return "matplotlib is not installed, so no chart"
    measured = [r for r in rows if not r.failed]
    if not measured:
        return "no variant was measured, so no chart"

    several_batches = len({r.batch for r in measured}) > 1
    labels = [f"{r.variant}\nbatch {r.batch}" if several_batches else r.variant for r in measured]
    medians = [r.median for r in measured]
    # Error bars from the median down to the slowest and up to the fastest run.
    spread = [[r.median - min(r.images_per_s) for r in measured],
              [max(r.images_per_s) - r.median for r in measured]]
    colors = ["tab:orange" if r.variant.startswith("pytorch") else "tab:blue" for r in measured]

    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(measured)), 4.5))
    bars = ax.bar(range(len(measured)), medians, yerr=spread, capsize=3, color=colors)
    ax.bar_label(bars, labels=[f"{m:,.0f}" for m in medians], fontsize=7, padding=2)
    ax.set_xticks(range(len(measured)), labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("images/s (median, min–max)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


def write_accuracy_chart(rows: list[tuple[str, list[list[tuple[float, float]]]]], path: Path, target: float,
                         title: str) -> str | None:
    """Test accuracy against wall seconds: one colour per row (name, its runs' (seconds, accuracy)
    curves), a line per run, and the target across. Writes the PNG and returns None, or returns why
    there is no chart."""
    plt = _pyplot()
    if plt is None:
        return "matplotlib is not installed, so no chart"
    drawn = [(name, runs) for name, runs in rows if runs]
    if not drawn:
        return "no run printed a test accuracy, so no chart"
    fig, ax = plt.subplots(figsize=(8.0, 5.0))
    for i, (name, runs) in enumerate(drawn):
        color = f"C{i % 10}"
        for k, curve in enumerate(runs):
            seconds, acc = zip(*curve)
            ax.plot(seconds, [100 * a for a in acc], color=color, marker=".", linewidth=1, alpha=0.8,
                    label=name if k == 0 else None)
    ax.axhline(100 * target, color="grey", linestyle="--", linewidth=1, label=f"target {100 * target:g}%")
    lows = [100 * a for _, runs in drawn for curve in runs for _, a in curve]
    ax.set_ylim(max(min(lows), 100 * target - 10), min(100.0, max(max(lows), 100 * target) + 1))
    ax.set_xlabel("seconds from process start")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None
