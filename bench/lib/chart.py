"""Bar chart of the images/s table, where matplotlib is installed (it is optional)."""

from __future__ import annotations

import sys

if __name__ == "__main__":  # run as a program by mistake: say which one (before the imports below can fail)
    print(f"{sys.argv[0]} is a module (the chart of bench/bench.py's table), not a program: "
          "run python3 bench/bench.py (make bench)", file=sys.stderr)
    sys.exit(2)

from pathlib import Path

from .table import Row


def write_chart(rows: list[Row], path: Path, title: str) -> str | None:
    """Writes the PNG and returns None, or returns why there is no chart."""
    try:
        import matplotlib
        matplotlib.use("Agg")  # no display on a GPU server
        import matplotlib.pyplot as plt
    except ImportError:
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
