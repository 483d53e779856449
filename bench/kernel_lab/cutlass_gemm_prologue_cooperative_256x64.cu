// The CUTLASS GEMM with statistics (kernel_lab/cutlass_gemm_stats.cuh) and the previous BN applied
// to x in registers (kernels/cutlass_prologue_mainloop.cuh): the cooperative schedule with 256x64
// tiles, in a file of its own so that the builds compile side by side.
#include "kernel_lab/cutlass_kernel_builds.h"

#if defined(LAB_WITH_CUTLASS)
#include "kernel_lab/cutlass_gemm_stats.cuh"

namespace lab::cutlass_builds {
const Ops* prologue_cooperative_256x64(bool stats) { return ops_of<Cooperative, 256, 64, true>(stats); }
}  // namespace lab::cutlass_builds
#endif
