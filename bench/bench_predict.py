#!/usr/bin/env python3
"""`make bench-predict`: images/s of every rung of bin/predict's egress ladder, side by side, on one GPU.

Seed 001's second case study: batched inference whose outputs are copied to the host and processed
there. Every rung predicts the same synthetic images (the train split of --synthetic-size images)
from the same checkpoint, which one step of bin/train makes first, at the same batch, writing its
CSV and (unless --no-features) the 2048-d features as .npy, --runs times; the table shows the median
of the images/s each binary measures over its batches after --warmup-batches (outputs written
included). Results land in bench/results/predict-<gpu>-<date>.{md,csv}.

    python3 bench/bench_predict.py --batch 256 --runs 3
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from pathlib import Path

from lib import runner, table

TOOL = "bench-predict"
BASELINE = "predict-baseline"
COLUMNS = ["batch", "variant", "egress rungs", "images/s median (min–max)", "speedup", "ms/batch",
           "data stall %", "waited for buffers s", "notes"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=256, help="images per batch (256)")
    p.add_argument("--synthetic-size", type=int, default=51200,
                   help="synthetic images predicted (the train split): 200 batches of 256 (51200)")
    p.add_argument("--warmup-batches", type=int, default=10, help="batches before the timed window (10)")
    p.add_argument("--runs", type=int, default=3, help="runs per rung; the table shows the median (3)")
    p.add_argument("--variants", default="all,predict",
                   help="comma list of rungs (baseline, workers, pool, async, stream), 'all' for the five; "
                        "'predict' for bin/predict (all,predict)")
    p.add_argument("--workers", type=int, help="--workers of the rungs with output workers (the binary's default)")
    p.add_argument("--no-features", action="store_true", help="predictions CSV only, no --features .npy")
    p.add_argument("--features-dtype", default="float32", choices=["float16", "float32"])
    p.add_argument("--out", type=Path, default=runner.REPO_ROOT / "bench" / "results",
                   help="where the .md and .csv go (bench/results)")
    p.add_argument("--bin-dir", type=Path, default=runner.BIN_DIR, help="where the binaries are (bin)")
    p.add_argument("--timeout", type=float, default=900, help="seconds before a run counts as failed (900)")
    args = p.parse_args(argv)
    if min(args.batch, args.runs, args.synthetic_size) < 1 or args.warmup_batches < 0:
        p.error("--batch, --runs and --synthetic-size must be at least 1, --warmup-batches at least 0")
    if args.synthetic_size < (args.warmup_batches + 1) * args.batch:
        p.error("--synthetic-size must hold more than --warmup-batches batches")
    runner.check_timeout(p, args.timeout)
    args.variant_list = runner.parse_variants(p, args.variants, "predict")
    runner.check_known(p, "--variants", args.variant_list, args.bin_dir, "predict")
    return args


def predict_command(binary: Path, args: argparse.Namespace, checkpoint: Path, scratch: Path) -> list[str]:
    cmd = [str(binary), "--checkpoint", str(checkpoint), "--data", "synthetic", "--split", "train",
           "--synthetic-size", str(args.synthetic_size), "--batch", str(args.batch),
           "--warmup-batches", str(args.warmup_batches), "--out", str(scratch / "predictions.csv"), "--json"]
    if not args.no_features:
        cmd += ["--features", str(scratch / "features.npy"), "--features-dtype", args.features_dtype]
    if args.workers:
        cmd += ["--workers", str(args.workers)]
    return cmd


def measure(guard: runner.GuardedRunner, variant: str, cmd: list[str], args: argparse.Namespace) -> table.Row:
    results = []
    for i in range(args.runs):
        result = table.result_of(guard.run(cmd, args.timeout))
        results.append(result)
        ips = table.number(result.get("images_per_s")) if isinstance(result, dict) else None
        progress(f"{variant}, run {i + 1}/{args.runs}: " + (f"{ips:,.0f} images/s" if ips is not None else f"failed: {result}"))
    row = table.build_row(variant, args.batch, results)
    good = [r for r in results if isinstance(r, dict)]
    if good:
        row.optimizations = [str(r) for r in good[0].get("egress", [])]
        waits = sorted(w for w in (table.number(r.get("egress_wait_s")) for r in good) if w is not None)
        row.meta["egress_wait_s"] = waits[len(waits) // 2] if waits else None
    return row


def speedup(row: table.Row, rows: list[table.Row]) -> float | None:
    base = next((r for r in rows if r.variant == BASELINE and not r.failed), None)
    return None if base is None or row.failed else row.median / base.median


def markdown_table(rows: list[table.Row]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join(" --- " for _ in COLUMNS) + "|"]
    for row in rows:
        sp = speedup(row, rows)
        cells = [str(row.batch), row.variant, table.optimizations_cell(row), table.images_cell(row),
                 f"{sp:.2f}x" if sp is not None else table.MISSING, table.fmt(row.ms_per_step, 2),
                 table.fmt(row.data_stall_pct, 1), table.fmt(row.meta.get("egress_wait_s"), 3), "; ".join(row.notes)]
        lines.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def csv_text(rows: list[table.Row]) -> str:
    out = ["batch,variant,egress,status,runs_ok,images_per_s_median,images_per_s_min,images_per_s_max,speedup,"
           "ms_per_batch,data_stall_pct,egress_wait_s"]
    for row in rows:
        sp = speedup(row, rows)
        nums = [row.median, min(row.images_per_s, default=None), max(row.images_per_s, default=None), sp,
                row.ms_per_step, row.data_stall_pct, row.meta.get("egress_wait_s")]
        out.append(",".join([str(row.batch), row.variant, " ".join(row.optimizations or []),
                             "failed" if row.failed else "ok", str(len(row.images_per_s))] +
                            ["" if v is None else f"{v:.4g}" for v in nums]))
    return "\n".join(out) + "\n"


def report(rows: list[table.Row], command: str, gpu: str, date: str, args: argparse.Namespace) -> str:
    meta = table.run_metadata(rows)
    outputs = "the predictions CSV" + ("" if args.no_features else f" and the features as {args.features_dtype} .npy")
    return (f"# bin/predict egress ladder, ResNet-50 (CIFAR stem) inference, {gpu}, {date}\n\n"
            f"- command: `{command}`\n- GPU: {meta.get('gpu', gpu)}\n- cuDNN: {table.cudnn_version(meta.get('cudnn'))}\n"
            f"- data: {args.synthetic_size} synthetic images at batch {args.batch}, writing {outputs}; "
            f"{args.runs} runs per rung\n"
            f"- images/s: median (min–max), measured by each binary from batch {args.warmup_batches} to the last "
            "output written; speedup over predict-baseline\n- waited for buffers: seconds the main thread waited "
            "for a free output buffer (workers behind)\n\n" + markdown_table(rows))


def progress(line: str) -> None:
    print(f"{TOOL}: {line}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    gpus, binaries = runner.require_gpu_and_binaries(TOOL, args.variant_list, args.bin_dir, "predict")
    runner.prepare_out_dir(TOOL, args.out)
    guard = runner.GuardedRunner(TOOL)
    with tempfile.TemporaryDirectory(prefix="bench-predict-") as scratch:
        checkpoint = runner.make_predict_checkpoint(TOOL, args.bin_dir, Path(scratch), guard, args.timeout)
        rows = [measure(guard, v, predict_command(binaries[v], args, checkpoint, Path(scratch)), args)
                for v in args.variant_list]
    meta = table.run_metadata(rows)
    gpu, date = str(meta.get("gpu") or gpus[0]), str(meta.get("date") or runner.today())
    command = "python3 bench/bench_predict.py " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    print(markdown_table(rows))
    runner.stop_if_all_failed(TOOL, rows)
    stem = args.out / f"predict-{runner.slug(gpu)}-{date}"
    runner.write_files(TOOL, {Path(f"{stem}.md"): report(rows, command, gpu, date, args),
                              Path(f"{stem}.csv"): csv_text(rows)})
    progress(f"wrote {stem}.md, {stem}.csv")
    return 0


if __name__ == "__main__":
    runner.main_entry(TOOL, main)
