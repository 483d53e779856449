#!/usr/bin/env python3
"""The PyTorch reference trained to an accuracy: Fashion-MNIST with bin/train's recipe, one epoch line each.

The same recipe as `bin/train --data fashion-mnist`: the 28x28 images zero-padded to 32x32, the grey
channel given to all three inputs of the CIFAR stem, normalized with the padded training set's mean and
standard deviation; pad-4 random crop and horizontal flip; SGD with momentum 0.9 (Nesterov), weight
decay 5e-4 on conv and linear weights only; peak lr 0.02 with a linear warm-up over the first epoch and
a cosine decay to --min-lr; batch 128, the last partial batch dropped; after every epoch the whole test
set, with batch norm's running statistics. The optimizations are those of one rung of
bench/pytorch_reference.py (--rung; its fastest, resident-amp-cl-graphs, by default).

    python3 bench/pytorch_train.py --data fashion-mnist --epochs 15 --json

With --json it prints bin/train's epoch lines and summary (event, epoch, train_loss, test_acc, ...), so
bench/time_to_accuracy.py --pytorch RUNG times it from process start as it times the trainer.
--device cpu runs the eager fp32 path without a GPU (slow: for checking the script on small data).
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import math
import os
import sys
import time
import zlib
from pathlib import Path

from lib.pytorch_rungs import RUNGS, look_here_last, optimizer_step

TOOL = "pytorch_train"
SIDE, MNIST_SIDE = 32, 28
CLASSES = 10


def find_data_dir(given: str | None) -> Path:
    """--data-dir, else where bin/train looks: $FASHION_MNIST_DIR, data/fashion-mnist, the Debian package."""
    repo = Path(__file__).resolve().parent.parent
    candidates = [Path(given)] if given else [
        *([Path(os.environ["FASHION_MNIST_DIR"])] if os.environ.get("FASHION_MNIST_DIR") else []),
        repo / "data" / "fashion-mnist", Path("/usr/share/datasets/fashion-mnist")]
    for d in candidates:
        if (d / "train-images-idx3-ubyte.gz").exists() or (d / "train-images-idx3-ubyte").exists():
            return d
    raise ValueError(f"Fashion-MNIST not found in {', '.join(map(str, candidates))}: install the Debian "
                     "package dataset-fashion-mnist or pass --data-dir")


def read_idx(path_base: Path, magic: int, dims: int) -> tuple[bytes, list[int]]:
    """An idx file (or its .gz): its payload and its dimensions; ValueError names the file."""
    path = path_base.with_name(path_base.name + ".gz")
    if path.exists():
        try:
            raw = gzip.open(path).read()
        except (EOFError, gzip.BadGzipFile, zlib.error) as e:  # truncated or not gzip at all
            raise ValueError(f"{path}: not a whole gzip file ({e})") from None
    else:
        path = path_base
        raw = path.read_bytes()
    header = 4 + 4 * dims
    if len(raw) < header or int.from_bytes(raw[:4], "big") != magic:
        raise ValueError(f"{path}: not an idx file of {dims} dimension(s)")
    shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    if len(raw) != header + math.prod(shape):
        raise ValueError(f"{path}: {len(raw)} bytes, expected {header + math.prod(shape)} for shape {shape}")
    return raw[header:], shape


def load_split(data_dir: Path, prefix: str):
    """uint8 images N x 3 x 32 x 32 (padded, grey in all channels) and int64 labels of one split."""
    import torch
    pixels, shape = read_idx(data_dir / f"{prefix}-images-idx3-ubyte", 0x803, 3)
    labels, (n_labels,) = read_idx(data_dir / f"{prefix}-labels-idx1-ubyte", 0x801, 1)
    if shape[1:] != [MNIST_SIDE, MNIST_SIDE] or shape[0] != n_labels:
        raise ValueError(f"{data_dir}: {prefix} images {shape} and {n_labels} labels, expected N x 28 x 28 and N")
    grey = torch.frombuffer(bytearray(pixels), dtype=torch.uint8).view(shape[0], 1, MNIST_SIDE, MNIST_SIDE)
    pad = (SIDE - MNIST_SIDE) // 2
    images = torch.zeros(shape[0], 3, SIDE, SIDE, dtype=torch.uint8)
    images[:, :, pad:pad + MNIST_SIDE, pad:pad + MNIST_SIDE] = grey
    y = torch.frombuffer(bytearray(labels), dtype=torch.uint8).long()
    if int(y.max()) >= CLASSES:
        raise ValueError(f"{data_dir}: {prefix} labels go up to {int(y.max())}, expected 0..9")
    return images, y


def lr_at(step: int, peak: float, low: float, warmup: int, total: int) -> float:
    """bin/train's schedule (src/train/schedule.cpp): linear warm-up, then cosine to `low`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    span = total - warmup
    if span <= 0 or step >= total:
        return low
    return low + (peak - low) * 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / span))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    names = [r.name for r in RUNGS]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="fashion-mnist", choices=["fashion-mnist"],
                   help="the data set (Fashion-MNIST only: the accuracy comparisons are made on it)")
    p.add_argument("--data-dir", help="the idx files [bin/train's search: $FASHION_MNIST_DIR, data/fashion-mnist, "
                                      "/usr/share/datasets/fashion-mnist]")
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--min-lr", type=float, default=0.0)
    p.add_argument("--warmup-epochs", type=float, default=1.0)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--wd", type=float, default=5e-4)
    p.add_argument("--no-nesterov", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rung", default="resident-amp-cl-graphs", choices=names, metavar="RUNG",
                   help="the optimizations, a rung of bench/pytorch_reference.py: " + ", ".join(names))
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                   help="cpu: eager fp32 whatever the rung's precision and compile mode (a check, not a benchmark)")
    p.add_argument("--json", action="store_true", help="bin/train's JSON lines: one per epoch, one at the end")
    args = p.parse_args(argv)
    if args.epochs < 1 or args.batch < 1 or args.lr <= 0 or args.warmup_epochs < 0:
        p.error("--epochs and --batch must be at least 1, --lr positive, --warmup-epochs not negative")
    args.rung_spec = next(r for r in RUNGS if r.name == args.rung)
    return args


def train(args: argparse.Namespace) -> dict:
    import torch
    from torch import nn

    from lib.pytorch_data import GpuResidentData, HostDataset
    from lib.pytorch_resnet import ResNet50Cifar

    rung, device = args.rung_spec, torch.device(args.device)
    on_gpu = device.type == "cuda"
    amp = on_gpu and rung.amp is not None
    compile_mode = rung.compile_mode if on_gpu else None
    data_dir = find_data_dir(args.data_dir)
    train_x, train_y = load_split(data_dir, "train")
    test_x, test_y = load_split(data_dir, "t10k")
    if len(train_y) < args.batch:
        raise ValueError(f"{data_dir}: {len(train_y)} training images, fewer than --batch {args.batch}")
    scaled = train_x[:, 0].float().div_(255)
    mean, std = (scaled.mean().item(),) * 3, (scaled.std(unbiased=False).item(),) * 3

    torch.manual_seed(args.seed)
    torch.backends.cudnn.benchmark = rung.cudnn_benchmark
    memory_format = torch.channels_last if rung.channels_last else torch.contiguous_format
    model = ResNet50Cifar(CLASSES).to(device, memory_format=memory_format)
    decay = [p for p in model.parameters() if p.ndim > 1]      # conv and linear weights
    no_decay = [p for p in model.parameters() if p.ndim <= 1]  # BN's scale and shift, the linear bias
    optimizer = torch.optim.SGD([{"params": decay, "weight_decay": args.wd},
                                 {"params": no_decay, "weight_decay": 0.0}],
                                lr=args.lr, momentum=args.momentum, nesterov=not args.no_nesterov)
    criterion = nn.CrossEntropyLoss(reduction="sum")
    scaler = torch.amp.GradScaler("cuda") if amp and rung.amp == "scaler" else None
    net = torch.compile(model, mode=compile_mode) if compile_mode else model
    graphs = compile_mode == "reduce-overhead"

    steps_per_epoch = len(train_y) // args.batch
    total_steps = args.epochs * steps_per_epoch
    warmup = round(args.warmup_epochs * steps_per_epoch)
    if rung.resident:
        source = GpuResidentData(train_x, train_y, args.batch, device, mean, std)
        epoch_batches = lambda: (source.next_batch() for _ in range(steps_per_epoch))  # noqa: E731
    else:
        loader = torch.utils.data.DataLoader(
            HostDataset(train_x, train_y, mean, std), batch_size=args.batch, shuffle=True, drop_last=True,
            num_workers=rung.workers, pin_memory=rung.pinned and on_gpu, persistent_workers=rung.workers > 0)
        blocking = not (rung.pinned and on_gpu)
        epoch_batches = lambda: ((x.to(device, non_blocking=not blocking), y.to(device, non_blocking=not blocking))  # noqa: E731
                                 for x, y in loader)
    test_images = test_x.to(device)
    test_labels = test_y.to(device)
    norm_mean = torch.tensor(mean, device=device).view(1, 3, 1, 1)
    norm_std = torch.tensor(std, device=device).view(1, 3, 1, 1)

    def evaluate() -> tuple[float, float]:
        """Mean loss and accuracy over the test set; the last batch padded to full size (label -1
        counts nowhere), as bin/train does, so a compiled network sees one shape."""
        model.eval()
        loss = torch.zeros((), device=device)
        correct = torch.zeros((), device=device, dtype=torch.long)
        with torch.no_grad():
            for start in range(0, len(test_labels), args.batch):
                x = test_images[start:start + args.batch]
                y = test_labels[start:start + args.batch]
                if len(y) < args.batch:
                    x = torch.cat([x, x.new_zeros((args.batch - len(y), *x.shape[1:]))])
                    y = torch.cat([y, y.new_full((args.batch - len(y),), -1)])
                x = ((x.float() / 255 - norm_mean) / norm_std).contiguous(memory_format=memory_format)
                if graphs:
                    torch.compiler.cudagraph_mark_step_begin()
                with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
                    logits = net(x).float()
                valid = y >= 0
                loss += nn.functional.cross_entropy(logits[valid], y[valid], reduction="sum")
                correct += (logits.argmax(1) == y).sum()
        model.train()
        return loss.item() / len(test_labels), correct.item() / len(test_labels)

    started = time.perf_counter()
    step, report = 0, {}
    for epoch in range(args.epochs):
        loss_sum = torch.zeros((), device=device)
        correct = torch.zeros((), device=device, dtype=torch.long)
        host_loss = 0.0
        for x, y in epoch_batches():
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, args.lr, args.min_lr, warmup, total_steps)
            x = x.contiguous(memory_format=memory_format)
            if graphs:
                torch.compiler.cudagraph_mark_step_begin()
            with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
                logits = net(x)
                loss = criterion(logits.float(), y) / args.batch
            # Read the compiled network's output now: a CUDA-graph rung reuses its memory.
            correct += (logits.detach().argmax(1) == y).sum()
            optimizer_step(loss, optimizer, scaler)
            if rung.device_loss:
                loss_sum += loss.detach()
            else:
                host_loss += loss.item()  # waits for the GPU every step, as the rung measures
            step += 1
        train_loss = (loss_sum.item() if rung.device_loss else host_loss) / steps_per_epoch
        test_loss, test_acc = evaluate()
        report = {"event": "epoch", "epoch": epoch + 1, "epochs": args.epochs, "step": step,
                  "train_loss": train_loss, "train_acc": correct.item() / (steps_per_epoch * args.batch),
                  "test_loss": test_loss, "test_acc": test_acc, "seconds": time.perf_counter() - started}
        if not math.isfinite(train_loss):
            raise ValueError(f"the training loss is {train_loss} at epoch {epoch + 1}: the run diverged")
        print(json.dumps(report) if args.json else
              f"epoch {epoch + 1:2d}/{args.epochs}  train loss {train_loss:.4f} acc {100 * report['train_acc']:6.2f}%"
              f"  test loss {test_loss:.4f} acc {100 * test_acc:6.2f}%", flush=True)
    elapsed = time.perf_counter() - started
    return {"event": "summary", "variant": f"pytorch: {rung.name}", "optimizations": rung.optimizations(),
            "data": "fashion-mnist", "batch": args.batch, "epochs": args.epochs, "steps": step,
            "images_per_s": step * args.batch / elapsed, "train_seconds": elapsed,
            "final_loss": report["train_loss"], "final_train_acc": report["train_acc"],
            "final_test_loss": report["test_loss"], "final_test_acc": report["test_acc"],
            "device": torch.cuda.get_device_name() if on_gpu else "cpu", "precision": "fp16-amp" if amp else "fp32",
            "compile": compile_mode, "torch": torch.__version__, "date": datetime.date.today().isoformat()}


def main(argv: list[str] | None = None) -> int:
    look_here_last()
    args = parse_args(argv)
    try:
        import torch
    except ImportError:
        print(f"{TOOL}: PyTorch is not installed", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"{TOOL}: no CUDA GPU on this machine; run it on the GPU machine (or --device cpu to check it)",
              file=sys.stderr)
        return 2
    try:
        summary = train(args)
    except (ValueError, OSError) as e:
        print(f"{TOOL}: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(summary), flush=True)
    else:
        print(f"{summary['variant']}: test accuracy {100 * summary['final_test_acc']:.2f}% after {args.epochs} "
              f"epochs, {summary['train_seconds']:.1f} s, {summary['images_per_s']:,.0f} images/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
