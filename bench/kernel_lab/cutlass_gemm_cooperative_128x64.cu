// The CUTLASS GEMM with statistics (kernel_lab/cutlass_gemm_stats.cuh): the cooperative schedule
// with 128x64 tiles, in a file of its own so that the builds compile side by side.
#include "kernel_lab/cutlass_kernel_builds.h"

#if defined(LAB_WITH_CUTLASS)
#include "kernel_lab/cutlass_gemm_stats.cuh"

namespace lab::cutlass_builds {
const Ops* cooperative_128x64(bool stats) { return ops_of<Cooperative, 128, 64>(stats); }
}  // namespace lab::cutlass_builds
#endif
