// A 1x1 stride-1 convolution with its output's BN statistics in the epilogue, written with CUTLASS
// (Hopper: TMA, warp-specialized wgmma), for the kernel lab only: how close a kernel of our own comes
// to cuDNN's fused ConvStats at the network's shapes, before any of it goes near the trainer.
//
// In NHWC a 1x1 stride-1 conv is one GEMM: y[M, K] = x[M, C] w[K, C]^T, M = N*H*W. The epilogue
// writes y in fp16 and reduces, per output channel, the sum and the sum of squares of the fp32
// accumulators. How the CTAs' partial sums come together is the build's StatsReduction:
//   Atomic    each CTA adds its partials into `sum` and `sqsum` atomically (fp32, in no fixed order)
//   Partials  each CTA stores its partials in the workspace, a row per row of tiles, which a kernel
//             of ours adds up into `sum` and `sqsum` (a fixed order: deterministic), or which are
//             left there for bn_finalize_partials to read (`leave_partials`)
//   None      no statistics: y alone, the GEMM's own time (sum and sqsum are not touched)
// Its schedule: both consumer warpgroups on one tile (Cooperative), or each on a tile of its own by
// turns, so that one's epilogue runs beside the other's mainloop (PingPong). Its tile: tile_m
// pixels by tile_n output channels, 64 input channels a step.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <cuda_runtime.h>

namespace lab {

enum class StatsReduction { Atomic, Partials, None };
enum class Schedule { Cooperative, PingPong };

// One build of the kernel.
struct CutlassKernel {
  StatsReduction stats;
  Schedule schedule;
  int tile_m, tile_n;
};
// Every build there is, in the order the lab shows them.
const std::vector<CutlassKernel>& cutlass_kernels();
// "cooperative, 128x64 tiles" and the like.
std::string cutlass_kernel_text(const CutlassKernel& k);

struct CutlassConvStats {
  const void* x;  // fp16 [M, C]
  const void* w;  // fp16 [K, C]
  void* y;        // fp16 [M, K]
  float* sum;     // [K], overwritten (not with leave_partials)
  float* sqsum;   // [K], overwritten (not with leave_partials)
  int m, k, c;
  void* workspace = nullptr;  // cutlass_conv_stats_workspace() bytes
  size_t workspace_bytes = 0;
  bool leave_partials = false;  // Partials: leave the rows in the workspace, unsummed
};

// Where StatsReduction::Partials leaves its rows: at the start of the workspace, `rows` rows of
// `row_len` floats for the sums, then as many for the sums of squares.
struct CutlassPartials {
  int rows, row_len;
};
CutlassPartials cutlass_partials_layout(const CutlassKernel& kernel, int m, int k);

// "" when this GPU and build can run it (sm_90 and the sm_90a code compiled in), else why not.
std::string cutlass_conv_stats_refusal(const CutlassKernel& kernel, int m, int k, int c);
size_t cutlass_conv_stats_workspace(const CutlassKernel& kernel, int m, int k, int c);
// The GEMM with its statistics on `stream`, after zeroing what it adds into. CUDA and CUTLASS
// errors are thrown (Fatal).
void cutlass_conv_stats(const CutlassKernel& kernel, const CutlassConvStats& a, cudaStream_t stream);

}  // namespace lab
