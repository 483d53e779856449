#!/usr/bin/env python3
"""The PyTorch reference trained to an accuracy: Fashion-MNIST with bin/train's recipe, one epoch line each.

The same recipe as `bin/train --data fashion-mnist`: the 28x28 images zero-padded to 32x32 (--image-size
N: centred on an N x N canvas, 28 to 64 with N - 28 even; 28: no padding), the grey channel given to all
three inputs of the CIFAR stem, normalized with the mean and standard deviation of the training set as
the model sees it (padding included); a random crop padded by N/8 (4 at 32, 3 at 28; bin/train's
crop_pad_for) or --crop-pad, and horizontal flip; SGD with momentum 0.9 (Nesterov), weight
decay 5e-4 on conv and linear weights only; peak lr 0.02 with a linear warm-up over the first epoch and
a cosine decay to --min-lr; batch 128, the last partial batch dropped; after every epoch the whole test
set, with batch norm's running statistics. The optimizations are those of one rung of
bench/pytorch_reference.py (--rung; its fastest, resident-amp-cl-graphs, by default). bin/train's
recipe flags mean the same here: --label-smoothing, --ema (with its decay warm-up), --tta-flip (the
mean of the logits of each test image and its mirror), --zero-init-residual (each block's last BN
scale starts at 0), and on several GPUs the learning rate scaled with the global batch
(--no-lr-scaling, --warmup-cap; src/train/lr_scaling.cpp).

    python3 bench/pytorch_train.py --data fashion-mnist --epochs 15 --json
    torchrun --standalone --nproc-per-node 2 bench/pytorch_train.py --data fashion-mnist --json

Under torchrun (WORLD_SIZE > 1) it trains with DistributedDataParallel, one process per GPU, as bin/train
--gpus does: --batch per GPU, every global batch split over the ranks, batch norm's statistics per rank
(broadcast_buffers off) and its running statistics averaged before each evaluation, the evaluation split
over the ranks, rank 0 alone printing.

With --json it prints bin/train's epoch lines and summary (event, epoch, train_loss, test_acc, ...) and
its first_step line, so bench/time_to_accuracy.py --pytorch RUNG times it from process start as it times
the trainer. --device cpu runs the eager fp32 path without a GPU (slow: for checking the script on small
data; under torchrun the ranks then meet over gloo).
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
from dataclasses import dataclass
from pathlib import Path

from lib.pytorch_rungs import RUNGS, look_here_last, optimizer_step

DATA = Path(__file__).resolve().parent.parent / "data"
if str(DATA) not in sys.path:
    sys.path.insert(0, str(DATA))
from dataset_files import MNIST_MAX_SIDE, MNIST_SIDE, fashion_mnist_canvas_fits  # noqa: E402  (bin/train's rule)

TOOL = "pytorch_train"
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


def input_statistics(images) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """bin/train's normalisation (src/data/normalization.cpp): the mean and population standard deviation
    of every pixel of the training images as the model sees them, the zero border included, in [0, 1];
    the grey channel's for all three."""
    scaled = images[:, 0].float().div_(255)
    return (scaled.mean().item(),) * 3, (scaled.std(unbiased=False).item(),) * 3


def load_split(data_dir: Path, prefix: str, side: int = 32):
    """uint8 images N x 3 x side x side (each 28x28 image centred on a zero canvas, grey in all channels)
    and int64 labels of one split."""
    import torch
    pixels, shape = read_idx(data_dir / f"{prefix}-images-idx3-ubyte", 0x803, 3)
    labels, (n_labels,) = read_idx(data_dir / f"{prefix}-labels-idx1-ubyte", 0x801, 1)
    if shape[1:] != [MNIST_SIDE, MNIST_SIDE] or shape[0] != n_labels:
        raise ValueError(f"{data_dir}: {prefix} images {shape} and {n_labels} labels, expected N x 28 x 28 and N")
    grey = torch.frombuffer(bytearray(pixels), dtype=torch.uint8).view(shape[0], 1, MNIST_SIDE, MNIST_SIDE)
    pad = (side - MNIST_SIDE) // 2
    images = torch.zeros(shape[0], 3, side, side, dtype=torch.uint8)
    images[:, :, pad:pad + MNIST_SIDE, pad:pad + MNIST_SIDE] = grey
    y = torch.frombuffer(bytearray(labels), dtype=torch.uint8).long()
    if int(y.max()) >= CLASSES:
        raise ValueError(f"{data_dir}: {prefix} labels go up to {int(y.max())}, expected 0..9")
    return images, y


def scaled_schedule(lr: float, min_lr: float, warmup_epochs: float, world: int, scaling: bool,
                    warmup_cap: float) -> tuple[float, float, float]:
    """bin/train's rule (src/train/lr_scaling.cpp): the flags are the recipe of one GPU's --batch; on
    several GPUs, unless --no-lr-scaling, the rates times world (the global batch over that batch: this
    twin has no --accumulate) and the warm-up grown in proportion up to the cap, never below
    --warmup-epochs."""
    if world <= 1 or not scaling:
        return lr, min_lr, warmup_epochs
    k = world
    return lr * k, min_lr * k, max(warmup_epochs, min(warmup_epochs * k, warmup_cap))


def ema_decay_at(decay: float, step: int) -> float:
    """bin/train's decay of the weight average after step `step` (kernels/ema.h): TensorFlow's warm-up."""
    return min(decay, (1 + step) / (10 + step))


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
    p.add_argument("--image-size", type=int, default=32, metavar="N",
                   help=f"side of the images the model sees: the 28x28 images centred on an N x N zero canvas, "
                        f"28 to {MNIST_MAX_SIDE} with N - 28 even (28: no padding; bin/train's --image-size) [32]")
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--min-lr", type=float, default=0.0)
    p.add_argument("--warmup-epochs", type=float, default=1.0)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--wd", type=float, default=5e-4)
    p.add_argument("--no-nesterov", action="store_true")
    p.add_argument("--no-lr-scaling", action="store_true",
                   help="on several GPUs, the rates as given instead of scaled with the global batch")
    p.add_argument("--warmup-cap", type=float, default=2.0,
                   help="on several GPUs, the scaled warm-up's most epochs (2)")
    p.add_argument("--label-smoothing", type=float, default=0.0)
    p.add_argument("--ema", type=float, default=0.0, help="decay of the weight average evaluated (0: none)")
    p.add_argument("--crop-pad", type=int, default=None,
                   help="the random crop's shift in pixels each way (0: flips only; bin/train's --crop-pad) [side/8]")
    p.add_argument("--tta-flip", action="store_true", help="score the mean logits of each test image and its mirror")
    p.add_argument("--zero-init-residual", action="store_true",
                   help="start each residual block as its shortcut: its last BN's scale (bn3.weight) 0 instead of 1")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rung", default="resident-amp-cl-graphs", choices=names, metavar="RUNG",
                   help="the optimizations, a rung of bench/pytorch_reference.py: " + ", ".join(names))
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                   help="cpu: eager fp32 whatever the rung's precision and compile mode (a check, not a benchmark)")
    p.add_argument("--json", action="store_true", help="bin/train's JSON lines: one per epoch, one at the end")
    args = p.parse_args(argv)
    if args.epochs < 1 or args.batch < 1 or args.lr <= 0 or args.warmup_epochs < 0:
        p.error("--epochs and --batch must be at least 1, --lr positive, --warmup-epochs not negative")
    if not (0 <= args.label_smoothing < 1 and 0 <= args.ema < 1 and args.warmup_cap >= 0):
        p.error("--label-smoothing and --ema must be in [0, 1), --warmup-cap not negative")
    if args.crop_pad is not None and not 0 <= args.crop_pad <= args.image_size // 2:
        p.error(f"--crop-pad {args.crop_pad}: from 0 to half the image side ({args.image_size // 2})")
    if not fashion_mnist_canvas_fits(args.image_size):
        p.error(f"--image-size {args.image_size}: Fashion-MNIST's 28x28 images are centred, never cropped: give 28 "
                f"plus an even number, up to {MNIST_MAX_SIDE} (28, 30, 32, ...)")
    args.rung_spec = next(r for r in RUNGS if r.name == args.rung)
    return args


@dataclass(frozen=True)
class Ranks:
    """This process among torchrun's (RANK, WORLD_SIZE, LOCAL_RANK), or alone."""
    rank: int = 0
    world: int = 1
    local: int = 0

    @staticmethod
    def from_env() -> "Ranks":
        env = os.environ
        return Ranks(int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1")), int(env.get("LOCAL_RANK", "0")))


def train(args: argparse.Namespace, ranks: Ranks) -> dict:
    import torch
    import torch.distributed as dist
    from torch import nn

    from lib.pytorch_data import GpuResidentData, HostDataset
    from lib.pytorch_resnet import ResNet50Cifar

    rung = args.rung_spec
    on_gpu = args.device == "cuda"
    device = torch.device(f"cuda:{ranks.local}" if on_gpu else "cpu")
    several = ranks.world > 1
    amp = on_gpu and rung.amp is not None
    compile_mode = rung.compile_mode if on_gpu else None
    data_dir = find_data_dir(args.data_dir)
    train_x, train_y = load_split(data_dir, "train", args.image_size)
    test_x, test_y = load_split(data_dir, "t10k", args.image_size)
    global_batch = args.batch * ranks.world
    if len(train_y) < global_batch:
        raise ValueError(f"{data_dir}: {len(train_y)} training images, fewer than a global batch of {global_batch}")
    mean, std = input_statistics(train_x)

    torch.manual_seed(args.seed)
    torch.backends.cudnn.benchmark = rung.cudnn_benchmark
    memory_format = torch.channels_last if rung.channels_last else torch.contiguous_format
    model = ResNet50Cifar(CLASSES, args.zero_init_residual).to(device, memory_format=memory_format)
    decay = [p for p in model.parameters() if p.ndim > 1]      # conv and linear weights
    no_decay = [p for p in model.parameters() if p.ndim <= 1]  # BN's scale and shift, the linear bias
    peak, low, warmup_epochs = scaled_schedule(args.lr, args.min_lr, args.warmup_epochs, ranks.world,
                                               not args.no_lr_scaling, args.warmup_cap)
    optimizer = torch.optim.SGD([{"params": decay, "weight_decay": args.wd},
                                 {"params": no_decay, "weight_decay": 0.0}],
                                lr=peak, momentum=args.momentum, nesterov=not args.no_nesterov)
    criterion = nn.CrossEntropyLoss(reduction="sum", label_smoothing=args.label_smoothing)
    scaler = torch.amp.GradScaler("cuda") if amp and rung.amp == "scaler" else None
    # Several ranks: DDP averages the gradients; each rank keeps its own BN statistics, as bin/train's.
    trained = model if not several else nn.parallel.DistributedDataParallel(
        model, device_ids=[ranks.local] if on_gpu else None, broadcast_buffers=False)
    net = torch.compile(trained, mode=compile_mode) if compile_mode else trained
    graphs = on_gpu and rung.cuda_graphs
    weights = [p.detach() for p in model.parameters()]
    average = [w.clone() for w in weights] if args.ema > 0 else None  # --ema: bin/train's weight average

    steps_per_epoch = len(train_y) // global_batch
    total_steps = args.epochs * steps_per_epoch
    warmup = round(warmup_epochs * steps_per_epoch)
    if several and ranks.rank == 0:  # bin/train's start line
        why = "--no-lr-scaling: --lr as given" if args.no_lr_scaling else f"{args.lr:g} x {global_batch}/{args.batch}"
        print(f"lr: {peak:g} for global batch {global_batch} ({why}), warm-up {warmup_epochs:g} "
              f"epoch{'' if warmup_epochs == 1 else 's'}", flush=True)
    if rung.resident:
        source = GpuResidentData(train_x, train_y, args.batch, device, mean, std, rank=ranks.rank, world=ranks.world,
                                 pad=args.crop_pad)
        epoch_batches = lambda epoch: (source.next_batch() for _ in range(steps_per_epoch))  # noqa: E731
    else:
        dataset = HostDataset(train_x, train_y, mean, std, pad=args.crop_pad)
        sampler = torch.utils.data.DistributedSampler(dataset, ranks.world, ranks.rank, shuffle=True, seed=args.seed,
                                                      drop_last=True) if several else None
        loader = torch.utils.data.DataLoader(
            dataset, batch_size=args.batch, shuffle=sampler is None, sampler=sampler, drop_last=True,
            num_workers=rung.workers, pin_memory=rung.pinned and on_gpu, persistent_workers=rung.workers > 0)
        blocking = not (rung.pinned and on_gpu)

        def epoch_batches(epoch):
            if sampler:
                sampler.set_epoch(epoch)
            return ((x.to(device, non_blocking=not blocking), y.to(device, non_blocking=not blocking))
                    for x, y in loader)
    test_images = test_x.to(device)
    test_labels = test_y.to(device)
    norm_mean = torch.tensor(mean, device=device).view(1, 3, 1, 1)
    norm_std = torch.tensor(std, device=device).view(1, 3, 1, 1)

    def sum_over_ranks(values: list[float]) -> list[float]:
        t = torch.tensor(values, device=device, dtype=torch.float64)
        if several:
            dist.all_reduce(t)
        return t.tolist()

    def swap_average():
        """The weight average into the network and the weights into the average (twice: as they were)."""
        with torch.no_grad():
            for w, a in zip(weights, average):
                kept = w.clone()
                w.copy_(a)
                a.copy_(kept)

    def logits_of(x):
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
            return net(x).float().clone()  # a copy: a CUDA-graph rung reuses its output's memory

    def evaluate() -> tuple[float, float]:
        """Mean loss and accuracy over the test set, with bin/train's evaluation: the BN running
        statistics averaged over the ranks, the weight average if any, the mirror too with --tta-flip,
        every batch of full size (the last padded, label -1 counting nowhere, so a compiled network sees
        one shape), the batches dealt round the ranks (as many to each) and the counts summed."""
        model.eval()
        if several:
            with torch.no_grad():
                for m in model.modules():
                    if isinstance(m, nn.BatchNorm2d):
                        for buffer in (m.running_mean, m.running_var):
                            dist.all_reduce(buffer)
                            buffer.div_(ranks.world)
        if average:
            swap_average()
        loss = torch.zeros((), device=device)
        correct = torch.zeros((), device=device, dtype=torch.long)
        chunks = math.ceil(len(test_labels) / args.batch)
        with torch.no_grad():
            for chunk in range(ranks.rank, math.ceil(chunks / ranks.world) * ranks.world, ranks.world):
                x = test_images[chunk * args.batch:(chunk + 1) * args.batch]
                y = test_labels[chunk * args.batch:(chunk + 1) * args.batch]
                if len(y) < args.batch:
                    x = torch.cat([x, x.new_zeros((args.batch - len(y), *test_images.shape[1:]))])
                    y = torch.cat([y, y.new_full((args.batch - len(y),), -1)])
                x = ((x.float() / 255 - norm_mean) / norm_std).contiguous(memory_format=memory_format)
                logits = logits_of(x)
                if args.tta_flip:  # the mean of the logits of the batch and its mirror
                    logits = 0.5 * (logits + logits_of(x.flip(3)))
                valid = y >= 0
                loss += nn.functional.cross_entropy(logits[valid], y[valid], reduction="sum")
                correct += (logits.argmax(1) == y).sum()
        if average:
            swap_average()
        model.train()
        loss_sum, right = sum_over_ranks([loss.item(), correct.item()])
        return loss_sum / len(test_labels), right / len(test_labels)

    started = time.perf_counter()
    step, report = 0, {}
    for epoch in range(args.epochs):
        loss_sum = torch.zeros((), device=device)
        correct = torch.zeros((), device=device, dtype=torch.long)
        host_loss = 0.0
        for x, y in epoch_batches(epoch):
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, peak, low, warmup, total_steps)
            x = x.contiguous(memory_format=memory_format)
            if graphs:
                torch.compiler.cudagraph_mark_step_begin()
            with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
                logits = net(x)
                loss = criterion(logits.float(), y) / args.batch
            # Read the compiled network's output now: a CUDA-graph rung reuses its memory.
            correct += (logits.detach().argmax(1) == y).sum()
            scale = scaler.get_scale() if scaler and average else None
            optimizer_step(loss, optimizer, scaler)
            if average and (scale is None or scaler.get_scale() >= scale):  # not a step the scaler skipped
                torch._foreach_lerp_(average, weights, 1.0 - ema_decay_at(args.ema, step))
            if rung.device_loss:
                loss_sum += loss.detach()
            else:
                host_loss += loss.item()  # waits for the GPU every step, as the rung measures
            step += 1
            if step == 1:
                first_step(args, ranks, on_gpu)
        loss_total, right = sum_over_ranks([loss_sum.item() if rung.device_loss else host_loss, correct.item()])
        train_loss = loss_total / ranks.world / steps_per_epoch
        test_loss, test_acc = evaluate()
        report = {"event": "epoch", "epoch": epoch + 1, "epochs": args.epochs, "step": step,
                  "train_loss": train_loss, "train_acc": right / (steps_per_epoch * global_batch),
                  "test_loss": test_loss, "test_acc": test_acc, "lr": lr_at(step - 1, peak, low, warmup, total_steps),
                  "seconds": time.perf_counter() - started}
        if not math.isfinite(train_loss):
            raise ValueError(f"the training loss is {train_loss} at epoch {epoch + 1}: the run diverged")
        if ranks.rank == 0:
            print(json.dumps(report) if args.json else
                  f"epoch {epoch + 1:2d}/{args.epochs}  train loss {train_loss:.4f} acc {100 * report['train_acc']:6.2f}%"
                  f"  test loss {test_loss:.4f} acc {100 * test_acc:6.2f}%", flush=True)
    elapsed = time.perf_counter() - started
    return {"event": "summary", "variant": f"pytorch: {rung.name}", "optimizations": rung.optimizations(),
            "data": "fashion-mnist", "batch": args.batch, "epochs": args.epochs, "steps": step,
            "images_per_s": step * global_batch / elapsed, "train_seconds": elapsed,
            "final_loss": report["train_loss"], "final_train_acc": report["train_acc"],
            "final_test_loss": report["test_loss"], "final_test_acc": report["test_acc"],
            "gpus": ranks.world, "global_batch": global_batch, "lr": peak,
            "device": torch.cuda.get_device_name(device) if on_gpu else "cpu", "precision": "fp16-amp" if amp else "fp32",
            "compile": compile_mode, "torch": torch.__version__, "date": datetime.date.today().isoformat()}


def first_step(args: argparse.Namespace, ranks: Ranks, on_gpu: bool) -> None:
    """bin/train's first_step line, once the first step has run on the GPU: where start-up ends."""
    import torch
    if not args.json:
        return
    if on_gpu:
        torch.cuda.synchronize()
    if ranks.rank == 0:
        print(json.dumps({"event": "first_step", "step": 1}), flush=True)


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
    ranks = Ranks.from_env()
    prefix = f"rank {ranks.rank}: " if ranks.world > 1 else ""
    if ranks.world > 1:
        import torch.distributed as dist
        if args.device == "cuda":
            torch.cuda.set_device(ranks.local)
        dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    try:
        summary = train(args, ranks)
    except (ValueError, OSError) as e:
        print(f"{TOOL}: {prefix}{e}", file=sys.stderr)
        return 1
    finally:
        if ranks.world > 1:
            torch.distributed.destroy_process_group()
    if ranks.rank != 0:
        return 0
    if args.json:
        print(json.dumps(summary), flush=True)
    else:
        print(f"{summary['variant']}: test accuracy {100 * summary['final_test_acc']:.2f}% after {args.epochs} "
              f"epochs, {summary['train_seconds']:.1f} s, {summary['images_per_s']:,.0f} images/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
