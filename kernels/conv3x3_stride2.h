// The data gradient of the 3x3 stride-2 convs with a pad of 1 (the first conv2 of layers 2-4) by a
// kernel of ours, with the backward sums of the BN + ReLU before the conv, in place of cuDNN's
// DgradDreluDbn there (its strided_dgrad_indexed, then dbn_stats).
//
// dx splits by the parity of its pixels into four stride-1 convs of dy with 1, 2, 2 and 4 of the
// filter's taps (kernels/conv3x3_parity.h): our resident kernel (kernels/conv1x1_stats_kernel.cuh)
// runs them as one GEMM whose rows are the four phases' dy pixels one after another, dy loaded at
// each tap by a 4-D TMA box (kernels/cutlass_phases_mainloop.cuh), and its epilogue writes each row
// at dx's pixel of that phase, with the ReLU mask and the BN sums as layer1's 3x3 data gradient
// has them (kernels/conv3x3.h). The filter, rearranged once a step after the update, is
// conv3x3_stride2_phase_filter's: the 9 taps in the phases' order, [c][tap][k].
//
// Measured on an H200 (2026-12-03, bench/results/levers-session54-nvidia-h200-2026-12-03.md): in the
// step's trace the three took 214.8 µs against cuDNN's 241.0 at batch 256, 118.8 against 156.1 at
// 128, yet the step ran 0.33% and 0.20% slower with them (bench/ab.py, 3 rounds, slower in every
// one): the chain got shorter, and the weight-gradient lane's GEMMs then ran beside the next conv1,
// 41 µs longer at batch 256. So the trainer keeps cuDNN's pattern. The kernel lab times this one
// beside it (bin/kernel_lab --only conv-dgrad); bench/results/strided-dgrad-probe-2026-12-03.diff
// puts it in the trainer (--no-fuse own-strided-dgrad) for the next try.
//
// Hopper only (TMA, wgmma), compiled for sm_90a where the build covers sm_90; elsewhere every shape
// is refused.
#pragma once

#include <cstddef>
#include <string>

#include <cuda_runtime.h>

#include "kernels/conv3x3.h"

// s: x's images and sides (dy is h / 2 by w / 2), c = x's channels, k = dy's.
// "" where this build and GPU run the shape, else why not: channels multiples of 64, even sides,
// dy's rows whole in tiles of 128 pixels (or whole images in one), each phase whole tiles.
std::string conv3x3_stride2_dgrad_refusal(const Conv3x3Shape& s);
int conv3x3_stride2_dgrad_partial_rows(const Conv3x3Shape& s);  // rows of c sums each of dz and dz * xhat
size_t conv3x3_stride2_dgrad_partials_bytes(const Conv3x3Shape& s);

// phases[c][t][k] = w[k][r][s][c] for the 9 taps t of the phases in order (parity_tap), fp16;
// w is KRSC [k, 3, 3, c].
void conv3x3_stride2_phase_filter(const void* w, void* phases, const Conv3x3Shape& s, cudaStream_t stream);

// dz [n, h, w, c] and its sums, as conv3x3_dgrad_bn (kernels/conv3x3.h) for the stride-1 conv: a.dy
// is [n, h / 2, w / 2, k], a.turned the phases' filter (conv3x3_stride2_phase_filter), a.s as above.
// A refused shape, a missing tensor or a CUDA error throws (Fatal).
void conv3x3_stride2_dgrad_bn(const Conv3x3DgradBn& a, cudaStream_t stream);
