// A 1x1 stride-1 convolution with its output's BN statistics in the epilogue, written with CUTLASS
// (Hopper: TMA, warp-specialized wgmma), for the kernel lab only: how close a kernel of our own comes
// to cuDNN's fused ConvStats at the network's shapes, before any of it goes near the trainer.
//
// In NHWC a 1x1 stride-1 conv is one GEMM: y[M, K] = x[M, C] w[K, C]^T, M = N*H*W. The epilogue
// writes y in fp16 and reduces, per output channel, the sum and the sum of squares of the fp32
// accumulators, one row of partial sums per row of tiles, left in the workspace for
// bn_finalize_partials (kernels/batchnorm.h) to add up in a fixed order. Each build has a version
// without the statistics too, y alone, to tell the GEMM's own time from theirs.
//
// Measured on an H200 and removed (bench/results/kernel-lab-cutlass-conv-forward-*.md): the
// partials added atomically into the sums (3x slower), and a kernel of ours adding the rows before
// bn_finalize_sums (one launch more than bn_finalize_partials, 3-5% slower); 128x128 tiles.
// Its schedule: both consumer warpgroups on one tile (Cooperative), or each on a tile of its own by
// turns, so that one's epilogue runs beside the other's mainloop (PingPong). Its tile: tile_m
// pixels by tile_n output channels, 64 input channels a step.
//
// With a prologue (conv3 of a bottleneck, as cuDNN's SbrConvStats): x is the previous BN's input and
// the GEMM reads relu(x * scale + shift), scale and shift fp16 per input channel, applied to each
// k-block of x in registers before its wgmma (kernels/cutlass_prologue_mainloop.cuh).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <cuda_runtime.h>

namespace lab {

// Resident*: not CUTLASS's kernel but the trainer's (kernels/conv1x1_stats.h), each CTA one column
// of tiles, their statistics added in registers; its consumer warpgroups on one tile, or ping-pong.
enum class Schedule { Cooperative, PingPong, Resident, ResidentPingPong };

// One build of the kernel.
struct CutlassKernel {
  bool stats;  // false: y alone
  Schedule schedule;
  int tile_m, tile_n;
  bool prologue = false;  // the previous BN applied as x is read
};
// Every build there is, in the order the lab shows them.
const std::vector<CutlassKernel>& cutlass_kernels();
// "cooperative, 128x64 tiles" and the like.
std::string cutlass_kernel_text(const CutlassKernel& k);

struct CutlassConvStats {
  const void* x;  // fp16 [M, C]
  const void* w;  // fp16 [K, C]
  void* y;        // fp16 [M, K]
  int m, k, c;
  void* workspace = nullptr;  // cutlass_conv_stats_workspace() bytes
  size_t workspace_bytes = 0;
  const void* scale = nullptr;  // fp16 [C]: the prologue's, for a build with one
  const void* shift = nullptr;
};

// Where the statistics are left: at the start of the workspace, `rows` rows of `row_len` floats
// for the sums, then as many for the sums of squares.
struct CutlassPartials {
  int rows, row_len;
};
CutlassPartials cutlass_partials_layout(const CutlassKernel& kernel, int m, int k);

// "" when this GPU and build can run it (sm_90 and the sm_90a code compiled in), else why not.
std::string cutlass_conv_stats_refusal(const CutlassKernel& kernel, int m, int k, int c);
size_t cutlass_conv_stats_workspace(const CutlassKernel& kernel, int m, int k, int c);
// The GEMM with its statistics on `stream`. CUDA and CUTLASS errors are thrown (Fatal).
void cutlass_conv_stats(const CutlassKernel& kernel, const CutlassConvStats& a, cudaStream_t stream);

}  // namespace lab
