// A 1x1 stride-1 convolution with its output's BN statistics in the epilogue, written with CUTLASS
// (Hopper: TMA, warp-specialized wgmma), for the kernel lab only: how close a kernel of our own comes
// to cuDNN's fused ConvStats at the network's shapes, before any of it goes near the trainer.
//
// In NHWC a 1x1 stride-1 conv is one GEMM: y[M, K] = x[M, C] w[K, C]^T, M = N*H*W. The epilogue
// writes y in fp16 and reduces, per output channel, the sum and the sum of squares of the fp32
// accumulators into `sum` and `sqsum`, as cuDNN's GenStats gives them to bn_finalize_sums. How the
// CTAs' partial sums come together is the variant:
//   Atomic    each CTA adds its partials into the sums atomically (fp32, in no fixed order)
//   Partials  each CTA stores its partials in the workspace, a row per row of tiles, and a kernel of
//             ours adds the rows up (a fixed order: deterministic)
//   None      no statistics: y alone, the GEMM's own time (sum and sqsum are not touched)
// and `ping_pong` picks the schedule: both consumer warpgroups on one tile (false), or each on its
// own tile by turns, one's epilogue beside the other's mainloop (true; not for Atomic).
#pragma once

#include <cstddef>
#include <string>

#include <cuda_runtime.h>

namespace lab {

enum class StatsReduction { Atomic, Partials, None };

struct CutlassConvStats {
  const void* x;  // fp16 [M, C]
  const void* w;  // fp16 [K, C]
  void* y;        // fp16 [M, K]
  float* sum;     // [K], overwritten
  float* sqsum;   // [K], overwritten
  int m, k, c;
  void* workspace = nullptr;  // cutlass_conv_stats_workspace() bytes
  size_t workspace_bytes = 0;
};

// "" when this GPU and build can run it (sm_90 and the sm_90a code compiled in), else why not.
std::string cutlass_conv_stats_refusal(StatsReduction r, bool ping_pong, int m, int k, int c);
size_t cutlass_conv_stats_workspace(StatsReduction r, bool ping_pong, int m, int k, int c);
// The GEMM with its statistics on `stream`, after zeroing what it adds into. CUDA and CUTLASS
// errors are thrown (Fatal).
void cutlass_conv_stats(StatsReduction r, bool ping_pong, const CutlassConvStats& a, cudaStream_t stream);

}  // namespace lab
