// The CUTLASS GEMM with statistics (kernel_lab/cutlass_gemm_stats.cuh): the cooperative schedule
// with 256x64 tiles (each consumer warpgroup 128 of the rows: half as many tiles, so half as many
// epilogue reductions), in a file of its own so that the builds compile side by side.
#include "kernel_lab/cutlass_kernel_builds.h"

#if defined(LAB_WITH_CUTLASS)
#include "kernel_lab/cutlass_gemm_stats.cuh"

namespace lab::cutlass_builds {
const Ops* cooperative_256x64(bool stats) { return ops_of<Cooperative, 256, 64>(stats); }
}  // namespace lab::cutlass_builds
#endif
