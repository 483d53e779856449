// The data-gradient builds of kernel_lab/cutlass_implicit_conv.h (only in a build with CUTLASS).
#if defined(LAB_WITH_CUTLASS)
#include "kernel_lab/cutlass_implicit_conv_build.cuh"

namespace lab::implicit_builds {
Maker dgrad(int tile_m, int tile_n) {
  using Op = cutlass::conv::Operator;
  if (tile_m == 128 && tile_n == 64) return &Build<Op::kDgrad, 128, 64>::make;
  if (tile_m == 128 && tile_n == 128) return &Build<Op::kDgrad, 128, 128>::make;
  return nullptr;
}
}  // namespace lab::implicit_builds
#endif
