#!/usr/bin/env python3
"""How far a rounding-sized change of the forward moves ResNet-50's gradients at its initial weights.

The network of bin/train (bench/lib/pytorch_resnet.py, torchvision's initialisation) in float64, so
the only differences are the ones made on purpose: one input value moved by one fp16 step, and every
conv output multiplied by (1 + u) with u uniform in (-e, e), for e the size of fp16 rounding (2^-11)
and of fp32 rounding in a sum (1e-6). Each is compared with the unperturbed gradients (two draws of
the fp16-sized noise, with each other) by the relative L2 difference over all gradients and per
tensor. It answers whether two runs whose forward rounds differently (cuDNN's fused patterns reduce
in an order that changes from run to run) can be expected to have gradients far apart at the start
of training, where bin/train's unfused build has identical ones:

    python3 bench/grad_sensitivity.py --batch 8 > bench/results/grad-sensitivity-<date>.md

prints a Markdown table. Runs on the CPU (about 15 s at batch 8 on two cores); --device cuda for a GPU.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from lib.pytorch_rungs import look_here_last  # needs no PyTorch

FP16_STEP = 2.0 ** -10  # one step of fp16 near 1.0
FP16_ROUNDING = 2.0 ** -11
FP32_SUM_ROUNDING = 1e-6


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "CPU"


def parse_args(argv):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="The per-tensor columns: the stem's conv, the last block's last BN bias, the fc weight.")
    p.add_argument("--batch", type=int, default=8, help="images in the batch (8)")
    p.add_argument("--seed", type=int, default=0, help="weights, images and labels (0)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where to run (cpu)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads for PyTorch (0: its default)")
    args = p.parse_args(argv)
    if args.batch < 2:
        p.error("--batch must be at least 2 (batch norm in training mode needs two images)")
    if args.threads < 0:
        p.error("--threads must be 0 or more")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    look_here_last()
    try:
        import torch
    except ImportError:
        print("grad_sensitivity: PyTorch is not installed (pip install torch)", file=sys.stderr)
        return 1
    from lib.pytorch_resnet import ResNet50Cifar

    if args.device == "cuda" and not torch.cuda.is_available():
        print("grad_sensitivity: --device cuda, but PyTorch sees no GPU", file=sys.stderr)
        return 1
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    model = ResNet50Cifar().double().to(device).train()
    x = torch.randn(args.batch, 3, 32, 32).half().double().to(device)  # fp16 images, as bin/train's
    y = torch.randint(0, 10, (args.batch,)).to(device)
    names = [n for n, _ in model.named_parameters()]

    def gradients(images, noise=0.0, draw=1):
        """The loss and every parameter's gradient, each conv output times (1 + U(-noise, noise))."""
        model.zero_grad()
        hooks = []
        if noise:
            g = torch.Generator(device=device).manual_seed(draw)

            def perturb(module, inputs, out):
                u = torch.rand(out.shape, generator=g, dtype=out.dtype, device=device)
                return out * (1 + noise * (2 * u - 1))

            hooks = [m.register_forward_hook(perturb) for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
        loss = torch.nn.functional.cross_entropy(model(images), y)
        loss.backward()
        for h in hooks:
            h.remove()
        return loss.item(), [p.grad.detach().clone() for p in model.parameters()]

    def relative(a, b):
        return ((a - b).norm() / b.norm()).item()

    started = time.monotonic()
    base = gradients(x)
    moved = x.clone()
    moved[0, 0, 5, 5] = (moved[0, 0, 5, 5].half().float() * (1 + FP16_STEP)).double()
    rows = [("one input value moved by one fp16 step", gradients(moved), base),
            ("every conv output times (1 + U(-2^-11, 2^-11)): fp16 rounding", gradients(x, FP16_ROUNDING), base),
            ("the same, another draw, against the first", gradients(x, FP16_ROUNDING, 2),
             gradients(x, FP16_ROUNDING, 1)),
            ("every conv output times (1 + U(-1e-6, 1e-6)): fp32 rounding of a sum", gradients(x, FP32_SUM_ROUNDING),
             base)]
    picks = [names.index("stem.0.weight"), names.index(f"blocks.{len(model.blocks) - 1}.bn3.bias"),
             names.index("fc.weight")]
    where = torch.cuda.get_device_name(device) if args.device == "cuda" else cpu_name()
    print(f"# Gradient sensitivity of ResNet-50 (CIFAR stem) at its initial weights, float64, {where}\n")
    print(f"`python3 bench/grad_sensitivity.py --batch {args.batch} --seed {args.seed} --device {args.device}`, "
          f"torch {torch.__version__}, {time.strftime('%Y-%m-%d')}. Relative L2 difference of the gradients "
          "against the unperturbed run (the second noise row: two draws against each other).\n")
    print("| change of the forward | loss change | all gradients | " + " | ".join(names[i] for i in picks)
          + " | tensors over 1% |")
    print("| --- | ---: | ---: | " + " | ".join("---:" for _ in picks) + " | ---: |")
    for title, (loss, grads), (loss0, grads0) in rows:
        per = [relative(a, b) for a, b in zip(grads, grads0)]
        total = relative(torch.cat([g.flatten() for g in grads]), torch.cat([g.flatten() for g in grads0]))
        print(f"| {title} | {abs(loss - loss0) / abs(loss0):.2g} | {total:.3g} | "
              + " | ".join(f"{per[i]:.3g}" for i in picks)
              + f" | {sum(r > 1e-2 for r in per)} of {len(per)} |")
    print(f"\n{time.monotonic() - started:.0f} s.")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("grad_sensitivity: interrupted", file=sys.stderr)
        sys.exit(130)
