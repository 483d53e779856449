// Whether the kernels of a training step's chain are launched chained (programmatic dependent
// launch, kernels/chained_launch.cuh): the BN passes and their finalizes, our resident convs, and
// the chain's other kernels of ours (the stem's, the pooling, the loss, the BN reductions, the finite
// check and the SGD update). The training network switches it for its thread at the start of its
// forward and backward (TrainingNetwork; --no-fuse chained-launch); elsewhere kernels launch as usual.
//
// Why: a chained kernel is launched while the kernel before it on the stream still runs, and waits
// on the GPU (griddepcontrol.wait) until that kernel has ended and its writes are visible, so the
// launch's latency is not paid between them. The finalizes, a few CTAs each, also let the next kernel
// launch as they start (chain_release), so that its CTAs take the SMs while the finalize runs.
// On H200s (2026-11-30, bench/ab.py, 3 rounds, faster in every round;
// bench/results/levers-session37-nvidia-h200-2026-11-30.md): chained, against --no-fuse
// ...,chained-launch, batch 256 8.373 -> 8.347 ms a step (-0.32%), batch 128 4.549 -> 4.510
// (-0.86%); then the finalizes' release, 8.306 -> 8.252 (-0.66%) and 4.503 -> 4.444 (-1.31%). The
// release in our convs too gave less (-0.45%, 2 of 3 rounds; -0.52%), and in every kernel was
// slower at batch 256 (8.423 against 8.321 unchained: the next kernels' CTAs, waiting, held SMs the
// weight gradients' lane wanted). The chain's other kernels chained too, with the pooling made
// vector-wide and the loss's sums warp-wide (2026-12-01): 8.171 -> 8.144 ms (-0.33%) at batch 256,
// 4.458 -> 4.431 (-0.63%) at 128, faster in every round
// (bench/results/levers-session38-nvidia-h200-2026-12-01.md).
#pragma once

// For the calling thread: on where `on` and the current device can (compute capability 9.0 and up:
// older GPUs have no programmatic launch).
void set_chained_launches(bool on);
bool chained_launches();
// Whether the current device can (compute capability 9.0 and up).
bool device_chains_launches();
