"""The PyTorch reference's ladder of rungs (the optimizations each turns on, in the order the
usual PyTorch tuning adds them) and the pieces of a training step every PyTorch tool runs the same way:
bench/pytorch_reference.py times the rungs, bench/pytorch_train.py trains one to an accuracy, and
bench/bench.py and time_to_accuracy.py take rung names from here. Imports without PyTorch.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # run as a program by mistake: say which one (before the imports below can fail)
    print(f"{sys.argv[0]} is a module (the PyTorch reference's rungs), not a program: "
          "run python3 bench/pytorch_reference.py", file=sys.stderr)
    sys.exit(2)

import dataclasses
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Rung:
    name: str
    description: str
    resident: bool = False        # data set kept on the GPU, augmented there; no DataLoader
    workers: int = 0              # DataLoader worker processes
    pinned: bool = False          # pin_memory=True and non_blocking copies
    device_loss: bool = False     # accumulate loss.detach() on the GPU instead of loss.item() each step
    cudnn_benchmark: bool = False
    amp: str | None = None        # None (fp32), "scaler" (fp16 autocast + GradScaler), "plain" (no scaler)
    channels_last: bool = False
    # None (eager), "default", "reduce-overhead" (CUDA graphs), "max-autotune" (Triton-tuned kernels
    # and CUDA graphs)
    compile_mode: str | None = None

    @property
    def cuda_graphs(self) -> bool:
        """torch.compile replays the step as CUDA graphs (its graph trees need each step marked)."""
        return self.compile_mode in ("reduce-overhead", "max-autotune")

    def optimizations(self) -> list[str]:
        on = []
        if self.resident:
            on.append("gpu-resident-data")
        if self.device_loss:
            on.append("devloss")
        if self.pinned:
            on.append("pinned")
        if self.workers:
            on.append(f"workers{self.workers}")
        if self.cudnn_benchmark:
            on.append("cudnn.benchmark")
        if self.amp:
            on.append("amp-fp16" + ("+gradscaler" if self.amp == "scaler" else ""))
        if self.channels_last:
            on.append("channels_last")
        if self.compile_mode:
            on.append("compile" if self.compile_mode == "default" else f"compile:{self.compile_mode}")
        return on


def _ladder() -> list[Rung]:
    r = Rung("baseline", "DataLoader with no workers, loss.item() every step, pageable copies")
    rungs = [r]
    for name, description, change in [
        ("devloss", "on-device loss accumulation (loss.detach())", dict(device_loss=True)),
        ("pinned", "+ pinned memory, non_blocking copies", dict(pinned=True)),
        ("workers", "+ 8 DataLoader workers", dict(workers=8)),
        ("cudnn-benchmark", "+ cudnn.benchmark", dict(cudnn_benchmark=True)),
        ("amp-gradscaler", "+ AMP fp16 with GradScaler", dict(amp="scaler")),
        ("amp", "+ AMP without GradScaler", dict(amp="plain")),
        ("channels-last", "+ channels_last", dict(channels_last=True)),
        ("compile", "+ torch.compile", dict(compile_mode="default")),
    ]:
        r = dataclasses.replace(r, name=name, description=description, **change)
        rungs.append(r)
    resident = Rung("resident-fp32", "data resident on the GPU, fp32 eager", resident=True,
                    device_loss=True, cudnn_benchmark=True)
    resident_amp = dataclasses.replace(resident, name="resident-amp-cl",
                                       description="data resident on the GPU, AMP + channels_last eager",
                                       amp="plain", channels_last=True)
    graphs = dataclasses.replace(resident_amp, name="resident-amp-cl-graphs",
                                 description="data resident on the GPU, AMP + channels_last, "
                                             'torch.compile(mode="reduce-overhead") (CUDA graphs)',
                                 compile_mode="reduce-overhead")
    # PyTorch's strongest mode: Triton kernels chosen by timing (conv and matmul templates among
    # them) and CUDA graphs. Its compile takes minutes (379 s on an H100, 2026-11-26).
    autotuned = dataclasses.replace(graphs, name="resident-amp-cl-max-autotune",
                                    description="data resident on the GPU, AMP + channels_last, "
                                                'torch.compile(mode="max-autotune") (Triton autotuning, CUDA graphs)',
                                    compile_mode="max-autotune")
    return rungs + [resident, resident_amp, graphs, autotuned]


RUNGS = _ladder()


def variant_label(rung: Rung) -> str:
    return f"pytorch: {rung.name}"


def parse_rungs(spec: str) -> list[Rung]:
    """'all' or a comma list of rung names, kept in ladder order; ValueError names an unknown one."""
    wanted = [s.strip() for s in spec.split(",") if s.strip()]
    if "all" in wanted:
        return list(RUNGS)
    known = {r.name for r in RUNGS}
    unknown = [w for w in wanted if w not in known]
    if unknown or not wanted:
        raise ValueError(f"unknown rung {', '.join(unknown) or '(none given)'}; "
                         f"known: all, {', '.join(r.name for r in RUNGS)}")
    return [r for r in RUNGS if r.name in wanted]


def optimizer_step(loss, optimizer, scaler) -> None:
    """Backward and the SGD step; through the GradScaler on the rung that has one (scaler not None)."""
    optimizer.zero_grad(set_to_none=True)
    if scaler:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    else:
        loss.backward()
        optimizer.step()


def look_here_last() -> None:
    """Python puts a script's folder first on sys.path, where bench/profile.py would stand in for the
    standard library's `profile` module, which torch imports (through cProfile). With bench/ last,
    lib (pytorch_data, pytorch_resnet) is still found."""
    here = str(Path(__file__).resolve().parents[1])
    if here in sys.path:
        sys.path.remove(here)
    sys.path.append(here)
