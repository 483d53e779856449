#!/usr/bin/env python3
"""GPU kernel time per training step by kind, side by side for several profiles.

Where a step's GPU time goes, in the same kinds for bin/train and the PyTorch reference: convolutions
and GEMMs (cuDNN's and cuBLAS's kernels; in bin/train's fused patterns they carry batch norm in their
prologue and epilogue), batch norm with its ReLU and residual add (our kernels, or PyTorch's and
Triton's), the optimizer step, fills, casts, and the rest. Each profile is the `cuda_gpu_kern_sum`
report of an nsys trace of the steady-state window only, graph nodes traced one by one:

    nsys profile --trace=cuda,nvtx --cuda-graph-trace=node --capture-range=cudaProfilerApi -o ours \\
        bin/train --data synthetic --batch 128 --steps 130 --warmup-steps 30 --profile-steps 100 --no-eval
    nsys profile --trace=cuda,nvtx --cuda-graph-trace=node --capture-range=cudaProfilerApi -o torch \\
        python3 bench/pytorch_reference.py --rungs resident-amp-cl-graphs --batch 128 --timed-steps 100
    nsys stats --report cuda_gpu_kern_sum --format csv --output ours ours.nsys-rep   # ours_cuda_gpu_kern_sum.csv
    python3 bench/kernel_kinds.py --steps 100 bin/train=ours_cuda_gpu_kern_sum.csv \\
        "PyTorch graphs rung=torch_cuda_gpu_kern_sum.csv"

prints a Markdown table of µs and kernels per step (each report's totals divided by --steps, the
steps inside the capture range), and with --by-kernel the largest kernels of each kind.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from lib import runner
from lib.nsys_summary import column, count, read_rows, time_ns

TOOL = "kernel_kinds"

# First match wins: the fills before the convs (cuDNN's workspace set-up kernel carries xmma in its
# name), batch norm before the copies (Triton's BN statistics kernels end in "copy_": the running
# statistics), and cuDNN's batch-norm statistics kernel of its fused data-gradient pattern counts
# with the convs. bin/predict's BN coefficients from the running statistics, and their scale folded
# into the filters of its cuBLASLt GEMM convs, are batch norm. PyTorch's foreach copies are copies, not its optimizer; its "nocast" elementwise
# kernels are not casts. Our conv kernels are convs, their BN statistics, prologue and finalize inside:
# the 1x1 and 3x3 ones (resident_conv), the data gradients that take their weight gradients
# (resident_dgrad_wgrad) and the sum of those weight gradients' parts (dw_from_partials), the stem's
# forward and weight gradient (stem_forward, stem_wgrad_*). A conv2 filter turned for its data
# gradient (turn_filter) is a copy.
KINDS: list[tuple[str, re.Pattern]] = [
    ("optimizer step (SGD, gradient check)",
     re.compile(r"sgd_kernel|check_finite|multi_tensor_apply(?!.*::Copy<)|_foreach_(?!copy)")),
    ("fills (zeroed buffers, workspace set-up)", re.compile(r"fill_regions|FillFunctor|init_device_workspace")),
    ("convolutions and GEMMs",
     re.compile(r"xmma|nvjet|cublas|cutlass|gemm|implicit_|conv2d|cudnn|resident_(conv|dgrad_wgrad)|"
                r"dw_from_partials|stem_(forward|wgrad_)")),
    ("batch norm, ReLU, residual add",
     re.compile(r"batch_norm|\bbn_|apply_forward|apply_backward|reduce_nhwc|reduce_nchw|finalize_|relu|threshold|"
                r"eval_coefs|fold_filters")),
    ("casts and copies", re.compile(r"to_copy|_to_f16|_to_f32|(?<!no)cast|copy_|::Copy<|turn_filter", re.I)),
]
OTHER = "other (loss, pooling, input, loss scale)"
ORDER = [k for k, _ in KINDS] + [OTHER]


def kind_of(name: str) -> str:
    for kind, pattern in KINDS:
        if pattern.search(name):
            return kind
    return OTHER


@dataclass
class KindTotal:
    ns: int = 0
    kernels: int = 0
    largest: list[tuple[int, int, str]] = field(default_factory=list)  # (ns, instances, name)


def split(rows: list[dict[str, str]]) -> dict[str, KindTotal]:
    """The report's rows added up by kind."""
    out: dict[str, KindTotal] = {}
    for row in rows:
        name = row.get("Name") or ""
        if not name:
            continue
        t = out.setdefault(kind_of(name), KindTotal())
        ns, n = time_ns(row, "Total Time"), count(row, "Instances", "Count")
        t.ns += ns
        t.kernels += n
        t.largest.append((ns, n, name))
    for t in out.values():
        t.largest.sort(reverse=True)
    return out


def load(path: Path) -> dict[str, KindTotal]:
    try:
        rows = read_rows(path.read_text())
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a text file (expected nsys's cuda_gpu_kern_sum CSV)") from None
    # Other reports (cuda_api_sum, nvtx_sum) are CSV tables too: only the kernel summary has these.
    if not rows or "Name" not in rows[0] or "Instances" not in rows[0] or column(rows[0], "Total Time") is None:
        raise ValueError(f"{path}: no cuda_gpu_kern_sum table in it (columns Name, Total Time, Instances)")
    try:
        return split(rows)
    except ValueError as e:  # a bad cell ("inf", "52703x448"): say which file holds it
        raise ValueError(f"{path}: {e}") from None


def table(profiles: list[tuple[str, dict[str, KindTotal]]], steps: int) -> str:
    head = "| kind | " + " | ".join(f"{label}: µs a step | kernels a step" for label, _ in profiles) + " |"
    lines = [head, "| --- |" + " ---: | ---: |" * len(profiles)]
    kinds = [k for k in ORDER if any(k in s for _, s in profiles)]
    for k in kinds:
        cells = []
        for _, s in profiles:
            t = s.get(k, KindTotal())
            cells += [f"{t.ns / steps / 1e3:,.0f}", f"{t.kernels / steps:,.1f}"]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    totals = []
    for _, s in profiles:
        totals += [f"{sum(t.ns for t in s.values()) / steps / 1e3:,.0f}",
                   f"{sum(t.kernels for t in s.values()) / steps:,.1f}"]
    lines.append("| **all kernels** | " + " | ".join(totals) + " |")
    return "\n".join(lines)


def largest_lines(label: str, s: dict[str, KindTotal], steps: int, n: int) -> list[str]:
    out = [f"{label}:"]
    for k in ORDER:
        if k not in s:
            continue
        out.append(f"  {k}:")
        for ns, inst, name in s[k].largest[:n]:
            out.append(f"    {ns / steps / 1e3:8.1f} µs {inst / steps:5.1f}x  {name[:140]}")
    return out


def add_step_arguments(p: argparse.ArgumentParser, by_kernel: str) -> None:
    """--steps (the steps profiled, each report's totals divided by them) and --by-kernel N; checked by
    check_step_arguments. Shared with bench/kernel_bytes.py."""
    p.add_argument("--steps", type=int, required=True, help="steps in each capture range (bin/train's --profile-steps)")
    p.add_argument("--by-kernel", type=int, default=0, metavar="N", help=by_kernel)


def check_step_arguments(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.steps < 1:
        p.error("--steps must be at least 1")
    if args.by_kernel < 0:
        p.error("--by-kernel must be at least 0")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("profiles", nargs="+", metavar="LABEL=CSV", help="a column's label and its cuda_gpu_kern_sum CSV")
    add_step_arguments(p, "also list the N largest kernels of each kind")
    args = p.parse_args(argv)
    check_step_arguments(p, args)
    for spec in args.profiles:
        if "=" not in spec or not spec.split("=", 1)[0] or not spec.split("=", 1)[1]:
            p.error(f"{spec!r}: expected LABEL=CSV")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    profiles = []
    for spec in args.profiles:
        label, path = spec.split("=", 1)
        try:
            profiles.append((label, load(Path(path))))
        except (OSError, ValueError) as e:
            print(f"{TOOL}: {e}", file=sys.stderr)
            # no such file is an argument error (2); a file whose table is not what nsys writes, 1
            return 2 if isinstance(e, OSError) else 1
    print(table(profiles, args.steps))
    if args.by_kernel:
        for label, s in profiles:
            print("\n".join(["", *largest_lines(label, s, args.steps, args.by_kernel)]))
    return 0


if __name__ == "__main__":
    runner.main_entry(TOOL, main)
