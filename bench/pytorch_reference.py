#!/usr/bin/env python3
"""The PyTorch reference: the same ResNet-50 training step, timed up the usual optimization ladder.

Every rung trains a fresh model (SGD, momentum 0.9, Nesterov, weight decay 5e-4) on random uint8
CIFAR-shaped data with pad-4 random crop, flip and normalize, for --warmup-steps untimed steps and
--timed-steps timed ones, between two torch.cuda.synchronize() calls. The rungs are those of
shared/anchors.md; they are cumulative up to "compile", then three runs with the data on the GPU.

    python3 bench/pytorch_reference.py --rungs all --batch 128 --json

With --json, each rung prints one summary line with the keys of the CUDA trainer's summary where
they mean the same thing (variant "pytorch: <rung>"), or {"event": "rung_failed", ...} if it broke.
The timed steps are bracketed by cudaProfilerStart/Stop, as bin/train's window is, so that
`nsys profile --capture-range=cudaProfilerApi --cuda-graph-trace=node` traces one rung's steady state
alone (the first rung's: nsys stops at the first range's end).
The rungs themselves are in lib/pytorch_rungs.py (bench.py and time_to_accuracy.py read their names
there, without PyTorch); running this needs PyTorch.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import sys
import time

from lib.pytorch_rungs import RUNGS, Rung, look_here_last, optimizer_step, parse_rungs, variant_label

TOOL = "pytorch_reference"
BASE_LR = 0.1  # peak learning rate, as the CUDA trainer's default


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rungs", default="all", help="'all' or a comma list of: " + ", ".join(r.name for r in RUNGS))
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--warmup-steps", type=int, default=30)
    p.add_argument("--timed-steps", type=int, default=100)
    p.add_argument("--images", type=int, default=50000, help="size of the random data set (50000, as CIFAR-10)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="one summary JSON line per rung")
    args = p.parse_args(argv)
    try:
        args.rung_list = parse_rungs(args.rungs)
    except ValueError as e:
        p.error(str(e))
    if args.batch < 1 or args.timed_steps < 1 or args.warmup_steps < 0 or args.images < args.batch:
        p.error("--batch and --timed-steps must be at least 1, --images at least --batch")
    return args


# ---- the timed run (everything below needs torch) -----------------------------------------------------

def measure(rung: Rung, args: argparse.Namespace, images, labels) -> dict:
    import torch
    from torch import nn

    from lib.pytorch_data import GpuResidentData, HostDataset
    from lib.pytorch_resnet import ResNet50Cifar

    device = torch.device("cuda")
    torch.manual_seed(args.seed)
    torch.backends.cudnn.benchmark = rung.cudnn_benchmark
    torch.cuda.reset_peak_memory_stats()
    memory_format = torch.channels_last if rung.channels_last else torch.contiguous_format

    model = ResNet50Cifar().to(device, memory_format=memory_format)
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=BASE_LR, momentum=0.9, nesterov=True, weight_decay=5e-4)
    criterion = nn.CrossEntropyLoss()
    scaler = torch.amp.GradScaler("cuda") if rung.amp == "scaler" else None
    net = torch.compile(model, mode=rung.compile_mode) if rung.compile_mode else model
    graphs = rung.cuda_graphs

    if rung.resident:
        source = GpuResidentData(images, labels, args.batch, device)
        next_batch = source.next_batch
    else:
        loader = torch.utils.data.DataLoader(
            HostDataset(images, labels), batch_size=args.batch, shuffle=True, drop_last=True,
            num_workers=rung.workers, pin_memory=rung.pinned, persistent_workers=rung.workers > 0)
        batches = iter(loader)

        def next_batch():
            nonlocal batches
            try:
                x, y = next(batches)
            except StopIteration:  # epoch boundary (only at large batch sizes): start the next one
                batches = iter(loader)
                x, y = next(batches)
            return (x.to(device, non_blocking=rung.pinned), y.to(device, non_blocking=rung.pinned))

    # The CUDA trainer's learning-rate warm-up: linear over the first epoch. Without it, lr 0.1 on a
    # fresh network diverges within the first hundred steps and the loss column means nothing.
    steps_per_epoch = max(1, len(labels) // args.batch)

    loss_sum = torch.zeros((), device=device)
    host_loss_sum = 0.0
    steps = args.warmup_steps + args.timed_steps
    start = start_unix = 0.0
    for step in range(steps):
        if step == args.warmup_steps:
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
            start = time.perf_counter()
            start_unix = time.time()
            loss_sum.zero_()
            host_loss_sum = 0.0
        if graphs:  # tells the CUDA graph trees that the previous step's outputs may be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        for group in optimizer.param_groups:
            group["lr"] = BASE_LR * min(1.0, (step + 1) / steps_per_epoch)
        x, y = next_batch()
        x = x.contiguous(memory_format=memory_format)
        with torch.autocast("cuda", dtype=torch.float16, enabled=rung.amp is not None):
            loss = criterion(net(x), y)
        optimizer_step(loss, optimizer, scaler)
        if rung.device_loss:
            loss_sum += loss.detach().float()
        else:
            host_loss_sum += loss.item()  # waits for the GPU every step: what the baseline measures
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    end_unix = time.time()
    torch.cuda.profiler.stop()

    mean_loss = (loss_sum.item() if rung.device_loss else host_loss_sum) / args.timed_steps
    return {
        "event": "summary",
        "variant": variant_label(rung),
        "description": rung.description,
        "optimizations": rung.optimizations(),
        "settings": {
            "precision": "fp16-amp" if rung.amp else "fp32",
            "layout": "NHWC" if rung.channels_last else "NCHW",
            "loader": "gpu-resident" if rung.resident else f"DataLoader({rung.workers} workers)",
            "pinned": rung.pinned,
            "device_loss": rung.device_loss,
            "cudnn_benchmark": rung.cudnn_benchmark,
            "grad_scaler": rung.amp == "scaler",
            "compile": rung.compile_mode,
            "tf32_conv": torch.backends.cudnn.allow_tf32,
            "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        },
        "gpu": torch.cuda.get_device_name(),
        "cudnn": torch.backends.cudnn.version(),
        "torch": torch.__version__,
        "batch": args.batch,
        "data": "synthetic",
        "steps": steps,
        "warmup_steps": args.warmup_steps,
        "timed_steps": args.timed_steps,
        "images_per_s": args.timed_steps * args.batch / elapsed,
        "ms_per_step": 1000.0 * elapsed / args.timed_steps,
        # the timed window on the wall clock, as bin/train reports it: for a power sampler outside
        "window_start_unix_ms": int(start_unix * 1000),
        "window_end_unix_ms": int(end_unix * 1000),
        "data_stall_pct": None,
        "gpu_busy_pct": None,
        "peak_gpu_mem_mb": torch.cuda.max_memory_allocated() / 2**20,
        "final_loss": mean_loss,  # mean training loss over the timed window
        "final_train_acc": None,
        "final_test_acc": None,
        "params": params,
        "date": datetime.date.today().isoformat(),
    }


def release_memory() -> None:
    """Between rungs: drop compiled graphs and cached blocks so each rung starts from the same state."""
    import gc

    import torch
    torch._dynamo.reset()
    gc.collect()
    torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    look_here_last()
    try:
        import torch
    except ImportError:
        print(f"{TOOL}: PyTorch is not installed", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print(f"{TOOL}: no CUDA GPU on this machine; run it on the GPU machine", file=sys.stderr)
        return 2
    from lib.pytorch_data import random_images

    images, labels = random_images(args.images, args.seed)
    failed = 0
    for rung in args.rung_list:
        try:
            result = measure(rung, args, images, labels)
        except Exception as e:  # one broken rung (say, torch.compile without a compiler) is a table row
            with contextlib.suppress(Exception):  # a rung broken in its timed steps leaves no capture range open
                torch.cuda.profiler.stop()
            failed += 1
            message = (str(e).strip().splitlines() or [type(e).__name__])[0]
            result = {"event": "rung_failed", "variant": variant_label(rung),
                      "error": f"{type(e).__name__}: {message}"}
            print(f"{TOOL}: {rung.name} failed: {result['error']}", file=sys.stderr)
        finally:
            release_memory()
        if args.json:
            print(json.dumps(result), flush=True)
        elif result["event"] == "summary":
            print(f"{result['variant']:<34} {result['images_per_s']:>9,.0f} images/s "
                  f"{result['ms_per_step']:>7.2f} ms/step  ({rung.description})", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
