#!/usr/bin/env python3
"""What a GPU's power goes into: idle, bytes through HBM, bytes through L2 alone, and fp16 tensor-core
math at several tile shapes, each held for --hold seconds while nvidia-smi samples the power.

Why: at batch 256 an H200 runs bin/train at its 700 W power cap, where a step's time follows its
energy. Which costs the energy, the bytes or the math, decides which lever can pay. Each phase runs
one kind of work back to back on the GPU (PyTorch for the copies and cuBLAS's GEMM, Triton for the
GEMMs of fixed tiles) and reports its rate, the median power and SM clock of the samples inside it,
and its energy a unit above the idle power (pJ a byte moved, read and written counted, or a FLOP):

    python3 bench/power_model.py                      # about 80 s
    python3 bench/power_model.py --hold 5 --phases hbm-copy,l2-copy --out power.md

Phases: idle (always: the energies are above it); hbm-copy (2 GiB copied to 2 GiB: DRAM and L2);
l2-copy (12 MiB to 12 MiB, held in L2, 64 copies replayed as one CUDA graph); gemm and gemm-zeros
(cuBLAS, 8192^3, random operands and zeros: how much of the math's energy is the data's toggling);
tiles (one Triton GEMM, 8192^3, at tiles of 128x64, 128x128, 128x256 and
64x64: each operand tile is read again for every tile of the other, so smaller tiles move more bytes
a FLOP). Needs PyTorch with CUDA (and Triton for tiles) and nvidia-smi.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from lib import gpu_clocks, runner
from lib.gpu_clocks import Sample

TOOL = "power_model"
PHASES = ["idle", "hbm-copy", "l2-copy", "gemm", "gemm-zeros", "tiles"]
GEMM_N = 8192
TILES = [(128, 64, 4, 4), (128, 128, 8, 4), (128, 256, 8, 3), (64, 64, 4, 4)]  # BM, BN, warps, stages
L2_COPIES = 64  # copies a replay of the l2-copy phase


@dataclass
class Arm:
    """One phase's work: label, one call's work (bytes or FLOPs) and its unit; rate: work a second."""
    label: str
    work: float
    unit: str  # "B" or "FLOP"
    start: float = 0.0  # the counted samples' window, seconds since the epoch
    end: float = 0.0
    rate: float = 0.0


@dataclass
class Row:
    label: str
    rate: float
    unit: str
    power_w: float
    sm_mhz: float
    capped_share: float  # of the samples, those with the power cap's clock-event reason set
    samples: int
    pj: float | None  # energy a unit above idle, in pJ


def summarize(arm: Arm, samples: list[Sample], idle_w: float | None) -> Row | None:
    """Every sample inside the arm's window, busy or not (the idle phase is not): median power and
    clock, power-capped share, and pJ a unit above idle_w; None where no sample fell inside."""
    c = gpu_clocks.summarize(samples, (arm.start, arm.end), min_busy=0)
    if c is None:
        return None
    pj = (c.power_w - idle_w) / arm.rate * 1e12 if arm.rate and idle_w is not None else None
    return Row(arm.label, arm.rate, arm.unit, c.power_w, c.sm_mhz, c.capped_share, c.busy_samples, pj)


def table(rows: list[Row]) -> str:
    lines = ["| phase | rate | power, W | SM clock, MHz | power-capped samples | samples | energy above idle |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        rate = f"{r.rate / 1e12:,.1f} T{r.unit}/s" if r.rate else "-"
        pj = f"{r.pj:.3f} pJ a {'byte' if r.unit == 'B' else 'FLOP'}" if r.pj is not None else "-"
        lines.append(f"| {r.label} | {rate} | {r.power_w:,.0f} | {r.sm_mhz:,.0f} | {r.capped_share:.0%} | {r.samples} | {pj} |")
    return "\n".join(lines)


def settle_seconds(seconds: float) -> float:
    """The first part of a phase, not counted: the clock and power settle (a quarter, at most 1.5 s)."""
    return min(1.5, seconds / 4)


def hold(arm: Arm, call: Callable[[], None], seconds: float, torch) -> None:
    """call() back to back for `seconds`. After the settling part, the arm's window starts and its
    rate is timed by CUDA events over the same calls its power samples cover."""
    begin = time.time()

    def repeat(until: float) -> int:
        calls = 0
        while time.time() < until:
            for _ in range(10):
                call()
            calls += 10
            torch.cuda.synchronize()
        return calls

    repeat(begin + settle_seconds(seconds))
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    arm.start = time.time()
    t0.record()
    calls = repeat(begin + seconds)
    t1.record()
    torch.cuda.synchronize()
    arm.end = time.time()
    arm.rate = arm.work * calls / (t0.elapsed_time(t1) / 1000.0)


def rows_of(idle: Arm, arms: list[Arm], samples: list[Sample]) -> list[Row]:
    """The idle row, then each arm's with its energy above idle; one line and exit where a phase has
    no sample inside its window."""
    rows = []
    for arm in [idle, *arms]:
        r = summarize(arm, samples, rows[0].power_w if rows else None)
        if r is None:
            runner.die(TOOL, f"no power sample fell inside {arm.label}'s window: hold each phase longer")
        rows.append(r)
    return rows


def triton_gemm():
    """A plain Triton fp16 GEMM, C = A B (row-major, fp32 accumulation), tiles BM x BN x 64, grouped
    launch order so that neighbouring CTAs share operand tiles in L2."""
    import triton
    import triton.language as tl

    @triton.jit
    def gemm(a, b, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr):
        pid = tl.program_id(0)
        tiles_m, tiles_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
        first = pid // (GROUP * tiles_n) * GROUP
        rows = min(tiles_m - first, GROUP)
        tm = first + pid % (GROUP * tiles_n) % rows
        tn = pid % (GROUP * tiles_n) // rows
        rm, rn, rk = tm * BM + tl.arange(0, BM), tn * BN + tl.arange(0, BN), tl.arange(0, BK)
        pa, pb = a + rm[:, None] * K + rk[None, :], b + rk[:, None] * N + rn[None, :]
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for _ in range(0, K, BK):
            acc = tl.dot(tl.load(pa), tl.load(pb), acc)
            pa += BK
            pb += BK * N
        tl.store(c + rm[:, None] * N + rn[None, :], acc.to(tl.float16))

    return triton, gemm


def replayed(torch, work: Callable[[], None], times: int) -> Callable[[], None]:
    """One call that replays `times` of work() captured in a CUDA graph: a copy held in L2 lasts a few
    µs, and launched one at a time the launches, not L2, would set its pace."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        work()  # warm-up outside the capture, as PyTorch asks
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(times):
            work()
    return graph.replay


def prepare(torch, phases: list[str]) -> list[tuple[Arm, Callable[[], None]]]:
    """Each phase's arms and their calls, each call run once (Triton's checked against cuBLAS)."""
    dev = torch.device("cuda")
    arms: list[tuple[Arm, Callable[[], None]]] = []
    if "hbm-copy" in phases:
        src = torch.randint(0, 255, (2 << 30,), dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        arms.append((Arm("HBM copy, 2 GiB", 2.0 * src.numel(), "B"), lambda: dst.copy_(src)))
    if "l2-copy" in phases:
        small = torch.randint(0, 255, (12 << 20,), dtype=torch.uint8, device=dev)
        small_dst = torch.empty_like(small)
        arms.append((Arm("L2 copy, 12 MiB", 2.0 * small.numel() * L2_COPIES, "B"),
                     replayed(torch, lambda: small_dst.copy_(small), L2_COPIES)))
    n = GEMM_N
    flops = 2.0 * n ** 3
    if {"gemm", "gemm-zeros", "tiles"} & set(phases):
        x, y = (torch.randn(n, n, device=dev, dtype=torch.half) for _ in range(2))
        out = torch.empty(n, n, device=dev, dtype=torch.half)
    if "gemm" in phases:
        arms.append((Arm(f"cuBLAS GEMM {n}^3", flops, "FLOP"), lambda: torch.mm(x, y, out=out)))
    if "gemm-zeros" in phases:
        z = torch.zeros(n, n, device=dev, dtype=torch.half)
        arms.append((Arm(f"cuBLAS GEMM {n}^3, zeros", flops, "FLOP"), lambda: torch.mm(z, z, out=out)))
    if "tiles" in phases:
        try:
            triton, gemm = triton_gemm()
        except ImportError:
            runner.die(TOOL, "the tiles phase needs Triton (python3 -c 'import triton' fails here)")
        want = torch.mm(x, y).float()
        for bm, bn, warps, stages in TILES:
            grid = (triton.cdiv(n, bm) * triton.cdiv(n, bn),)

            def call(bm=bm, bn=bn, warps=warps, stages=stages, grid=grid):
                gemm[grid](x, y, out, n, n, n, BM=bm, BN=bn, BK=64, GROUP=8, num_warps=warps, num_stages=stages)

            call()
            err = (out.float() - want).abs().max().item()
            if err > 0.5:  # fp32 accumulation in another order: far below this
                runner.die(TOOL, f"Triton's GEMM at tile {bm}x{bn} differs from cuBLAS's by {err}")
            arms.append((Arm(f"Triton GEMM {n}^3, tile {bm}x{bn}", flops, "FLOP"), call))
    for _, call in arms:
        call()
    torch.cuda.synchronize()
    return arms


def run(phases: list[str], seconds: float) -> list[Row]:
    try:
        import torch
    except ImportError:
        runner.die(TOOL, "needs PyTorch (python3 -c 'import torch' fails here)")
    if not torch.cuda.is_available():
        runner.die(TOOL, "needs a CUDA GPU (torch.cuda.is_available() is False)")
    sampler = gpu_clocks.sampler_for_visible_gpu(TOOL, asked_by="")
    try:
        arms = prepare(torch, phases)
    except Exception as e:  # out of GPU memory, a Triton tile the GPU cannot hold, ...: one line, not a traceback
        runner.die(TOOL, f"setting up the phases failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", 1)
    idle = Arm("idle", 0.0, "")
    sampler.start()
    try:
        begin = time.time()
        time.sleep(seconds)
        idle.start, idle.end = begin + settle_seconds(seconds), time.time()
        for arm, call in arms:
            hold(arm, call, seconds, torch)
    finally:
        samples = sampler.stop()
    return rows_of(idle, [arm for arm, _ in arms], samples)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hold", type=float, default=8.0, metavar="S", help="seconds each phase runs (8; at least 2)")
    p.add_argument("--phases", default=",".join(PHASES),
                   help=f"comma list of {', '.join(PHASES)} (all); idle runs always, the phases in this order")
    p.add_argument("--out", type=Path, default=None, metavar="FILE.md", help="also write the table here")
    args = p.parse_args(argv)
    if not 2 <= args.hold <= 600:
        p.error("--hold must be 2 to 600 seconds: the first part of each phase is not counted")
    if args.out and not args.out.parent.is_dir():
        p.error(f"--out: {args.out.parent} is not a directory")
    if args.out and args.out.is_dir():
        p.error(f"--out: {args.out} is a directory, not a file")
    given = [s.strip() for s in args.phases.split(",") if s.strip()]
    unknown = [s for s in given if s not in PHASES]
    if unknown or not given:
        p.error(f"--phases: {', '.join(unknown) or 'none given'}: expected a comma list of {', '.join(PHASES)}")
    # idle always (the energy above it needs it), the rest in PHASES' order, whatever order was given
    args.phases = [s for s in PHASES if s == "idle" or s in given]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = run(args.phases, args.hold)
    text = table(rows)
    print(text)
    if args.out:
        try:
            args.out.write_text(f"`python3 bench/power_model.py --hold {args.hold:g} --phases {','.join(args.phases)}`, "
                                f"{', '.join(runner.gpu_names()) or 'GPU'}, {time.strftime('%Y-%m-%d')}\n\n{text}\n")
        except OSError as e:
            print(f"{TOOL}: cannot write {args.out}: {e.strerror}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    runner.main_entry(TOOL, main)
