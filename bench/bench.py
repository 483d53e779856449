#!/usr/bin/env python3
"""`make bench`: images/s of every rung of the optimization ladder, side by side, on one GPU.

Each binary trains on the same data and batch for the same warm-up and timed steps, --runs times
(the median goes in the table), plus one run with --trace for the GPU busy %. Where PyTorch is
installed, bench/pytorch_reference.py adds its own ladder to the same table. Results land in
bench/results/<gpu>-<date>.{md,csv,png}.

    python3 bench/bench.py --batch 128,256 --runs 3
    python3 bench/bench.py --batch 256 --timed-steps 600 --variants train --clocks

With --clocks, nvidia-smi samples the GPU every 100 ms through each timed run (bin/train's and each
PyTorch process's), and a second table gives every row's SM clock, power, how often the power cap
held the clock down and the energy an image, over the samples inside the runs' timed windows
(lib/gpu_clocks.py). Where the cap holds the clock down, a step's time follows its energy.
"""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import statistics
import sys
import tempfile
from pathlib import Path

from lib import gpu_clocks, pytorch_rungs, runner, table
from lib.chart import write_chart

TOOL = "bench"
PYTORCH_REFERENCE = Path(__file__).resolve().parent / "pytorch_reference.py"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", default="128", help="batch size, or a comma list: 128,256 (default 128)")
    p.add_argument("--warmup-steps", type=int, default=30, help="steps before the timed window (30)")
    p.add_argument("--timed-steps", type=int, default=100, help="steps in the timed window (100)")
    p.add_argument("--runs", type=int, default=3, help="timed runs per variant; the table shows the median (3)")
    p.add_argument("--variants", default="all",
                   help="comma list of ladder names, 'all' for the ten rungs; add 'train' for bin/train")
    p.add_argument("--data", default="synthetic", choices=runner.DATA_SETS, help="the binaries' --data (synthetic)")
    p.add_argument("--data-dir", help="passed to the binaries as --data-dir")
    p.add_argument("--out", type=Path, default=runner.REPO_ROOT / "bench" / "results",
                   help="where the .md, .csv and .png go (bench/results)")
    p.add_argument("--bin-dir", type=Path, default=runner.BIN_DIR, help="where the binaries are (bin)")
    p.add_argument("--timeout", type=float, default=900, help="seconds before a run counts as failed (900)")
    p.add_argument("--no-trace", action="store_true", help="skip the extra --trace run (no GPU busy %%)")
    p.add_argument("--no-pytorch", action="store_true", help="skip the PyTorch reference rows")
    p.add_argument("--pytorch-rungs", default="all", help="rungs of pytorch_reference.py ('all')")
    p.add_argument("--pytorch-runs", type=int, default=1,
                   help="runs of the PyTorch ladder; each costs minutes of torch.compile (1)")
    p.add_argument("--clocks", action="store_true",
                   help="sample the GPU's SM clock and power with nvidia-smi through each timed run and add "
                        "each row's clock, power, power-capped share and energy an image")
    args = p.parse_args(argv)
    args.batches = runner.parse_list(p, "--batch", args.batch, int)
    if min(args.batches) < 1:
        p.error(f"--batch must be at least 1, not {min(args.batches)}")
    runner.check_at_least(p, args, runs=1, timed_steps=1, pytorch_runs=1, warmup_steps=0)
    runner.check_timeout(p, args.timeout)
    try:  # here, not after every CUDA binary ran
        args.pytorch_rung_list = pytorch_rungs.parse_rungs(args.pytorch_rungs)
    except ValueError as e:
        p.error(f"--pytorch-rungs: {e}")
    args.variant_list = runner.parse_variants(p, args.variants)
    runner.check_known(p, "--variants", args.variant_list, args.bin_dir)
    return args


def trainer_command(binary: Path, args: argparse.Namespace, batch: int) -> list[str]:
    cmd = [str(binary), "--data", args.data, "--batch", str(batch),
           "--steps", str(args.warmup_steps + args.timed_steps),
           "--warmup-steps", str(args.warmup_steps), "--profile-steps", str(args.timed_steps),
           "--no-eval", "--json"]
    if args.data_dir:
        cmd += ["--data-dir", args.data_dir]
    return cmd


class Bench:
    def __init__(self, args: argparse.Namespace, binaries: dict[str, Path],
                 sampler: gpu_clocks.ClockSampler | None = None):
        self.args = args
        self.binaries = binaries
        self.runner = runner.GuardedRunner(TOOL)
        self.sampler = sampler

    def run(self, cmd: list[str]) -> runner.RunOutput:
        return self.runner.run(cmd, self.args.timeout)

    def sampled(self, cmd: list[str], timeout: float) -> tuple[runner.RunOutput, list[gpu_clocks.Sample]]:
        """A run, and with --clocks the GPU's samples through it."""
        def run() -> runner.RunOutput:
            return self.runner.run(cmd, timeout)
        return self.sampler.around(run) if self.sampler else (run(), [])

    def measure(self, variant: str, batch: int, trace_dir: Path) -> table.Row:
        cmd = trainer_command(self.binaries[variant], self.args, batch)
        results, start, clocks = [], None, []
        for i in range(self.args.runs):
            out, samples = self.sampled(cmd, self.args.timeout)
            start = start or table.start_event(out.stdout)
            result = table.result_of(out)
            results.append(result)
            if isinstance(result, dict):
                clocks.append((gpu_clocks.summarize(samples, gpu_clocks.window_of(result)), result))
            progress(f"{variant}, batch {batch}, run {i + 1}/{self.args.runs}: " + describe(result))
        trace = None
        if not self.args.no_trace:
            trace = table.result_of(self.run(cmd + ["--trace", str(trace_dir / f"{variant}-{batch}.json")]))
            busy = table.number(trace.get("gpu_busy_pct")) if isinstance(trace, dict) else None
            progress(f"{variant}, batch {batch}, trace run: "
                     + (f"GPU busy {busy:.1f}%" if busy is not None else describe(trace)))
        row = table.build_row(variant, batch, results, trace, start)
        set_clocks(row, clocks)
        return row

    def measure_pytorch(self, batch: int) -> list[table.Row]:
        rungs = self.args.pytorch_rung_list
        labels = [pytorch_rungs.variant_label(r) for r in rungs]
        cmd = [sys.executable, str(PYTORCH_REFERENCE), "--batch", str(batch),
               "--warmup-steps", str(self.args.warmup_steps), "--timed-steps", str(self.args.timed_steps),
               "--rungs", ",".join(r.name for r in rungs), "--json"]
        outs, clocks = [], {label: [] for label in labels}
        for i in range(self.args.pytorch_runs):
            progress(f"PyTorch reference, batch {batch}, run {i + 1}/{self.args.pytorch_runs} "
                     f"({len(rungs)} rungs; torch.compile takes minutes)")
            out, samples = self.sampled(cmd, self.args.timeout * len(rungs))
            outs.append(out)
            for label in labels:  # one process runs every rung: each rung's samples are its own window's
                result = table.result_of(out, label)
                window = gpu_clocks.window_of(result) if isinstance(result, dict) else None
                if window:  # without one, torch.compile's minutes would count
                    clocks[label].append((gpu_clocks.summarize(samples, window), result))
        rows = table.rows_from_multi_variant(outs, labels, batch)
        for row in rows:
            set_clocks(row, clocks[row.variant])
        return rows


def set_clocks(row: table.Row, runs: list[tuple[gpu_clocks.ClockSummary | None, dict]]) -> None:
    """The row's clock columns from its runs' clock summaries and summary lines: medians over the runs
    with busy samples in their window; energy an image = a run's power over its images/s."""
    got = [(c, table.number(r.get("images_per_s"))) for c, r in runs if c is not None]
    if not got:
        return
    row.sm_mhz = statistics.median(c.sm_mhz for c, _ in got)
    row.power_w = statistics.median(c.power_w for c, _ in got)
    row.capped_pct = 100 * statistics.median(c.capped_share for c, _ in got)
    energies = [e for c, ips in got if (e := gpu_clocks.mj_per_image(c, ips)) is not None]
    row.mj_per_image = statistics.median(energies) if energies else None


def describe(result: dict | str) -> str:
    if isinstance(result, str):
        return f"failed: {result}"
    ips = table.number(result.get("images_per_s"))
    return f"{ips:,.0f} images/s" if ips is not None else "no images_per_s in its summary"


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def progress(line: str) -> None:
    print(f"{TOOL}: {line}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    gpus, binaries = runner.require_gpu_and_binaries(TOOL, args.variant_list, args.bin_dir)
    with_pytorch = not args.no_pytorch and importlib.util.find_spec("torch") is not None

    runner.prepare_out_dir(TOOL, args.out)
    sampler = gpu_clocks.sampler_for_visible_gpu(TOOL) if args.clocks else None
    bench = Bench(args, binaries, sampler)
    rows: list[table.Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-trace-") as trace_dir:
        for batch in args.batches:
            rows += [bench.measure(v, batch, Path(trace_dir)) for v in args.variant_list]
            if with_pytorch:
                rows += bench.measure_pytorch(batch)

    if not args.no_pytorch and not with_pytorch:
        progress("PyTorch is not installed here, so no PyTorch reference rows")
    meta = table.run_metadata(rows)
    gpu = str(meta.get("gpu") or gpus[0])
    date = str(meta.get("date") or runner.today())
    command = "python3 bench/bench.py " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    settings = (f"data {args.data}, {args.warmup_steps} warm-up + {args.timed_steps} timed steps, "
                f"{plural(args.runs, 'run')} per binary" + ("" if args.no_trace else " (+1 run with --trace)")
                + (f", PyTorch: {plural(args.pytorch_runs, 'run')} of each rung" if with_pytorch else ""))
    report = table.report_markdown(rows, command, gpu, date, settings)

    print(table.markdown_table(rows))
    if args.clocks:
        print(table.power_markdown(rows) or "--clocks: no run had busy samples inside its timed window\n")
    runner.stop_if_all_failed(TOOL, rows)
    stem = args.out / f"{runner.slug(gpu)}-{date}"
    runner.write_files(TOOL, {Path(f"{stem}.md"): report, Path(f"{stem}.csv"): table.csv_text(rows)})
    written = [f"{stem}.md", f"{stem}.csv"]
    why_no_chart = write_chart(rows, Path(f"{stem}.png"), f"ResNet-50 training images/s, {gpu}, {date}")
    if why_no_chart:
        progress(why_no_chart)
    else:
        written.append(f"{stem}.png")
    progress("wrote " + ", ".join(written))
    return 0


if __name__ == "__main__":
    runner.main_entry(TOOL, main)
