// Whether the kernels of a training step's chain are launched chained (programmatic dependent
// launch, kernels/chained_launch.cuh): the BN passes and their finalizes, our resident convs. The
// training network switches it for its thread at the start of its forward and backward
// (TrainingNetwork; --no-fuse chained-launch); elsewhere kernels launch as usual.
//
// Why: a chained kernel is launched while the kernel before it on the stream still runs, and waits
// on the GPU (griddepcontrol.wait) until that kernel has ended and its writes are visible, so the
// launch's latency is not paid between them. On an H200 (2026-11-30, bench/ab.py, 3 rounds, against
// --no-fuse ...,chained-launch): batch 256 8.373 -> 8.347 ms a step (-0.32%), batch 128 4.549 ->
// 4.510 (-0.86%), faster in every round. Each kernel letting the next launch as it starts
// (griddepcontrol.launch_dependents), tried first, was faster at batch 128 (4.537 against 4.599
// unchained) but slower at 256 (8.423 against 8.321: the next kernels' CTAs, waiting, held SMs the
// weight gradients' lane wanted), and is not done
// (bench/results/levers-session37-nvidia-h200-2026-11-30.md).
#pragma once

// For the calling thread: on where `on` and the current device can (compute capability 9.0 and up:
// older GPUs have no programmatic launch).
void set_chained_launches(bool on);
bool chained_launches();
// Whether the current device can (compute capability 9.0 and up).
bool device_chains_launches();
