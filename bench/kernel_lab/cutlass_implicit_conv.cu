// The CUTLASS implicit-GEMM conv (cutlass_implicit_conv.h): its builds and the dispatch to them
// (cutlass_implicit_fprop.cu, cutlass_implicit_dgrad.cu). In a build without sm_90 it refuses all.
#include "kernel_lab/cutlass_implicit_conv.h"

#include "kernels/conv1x1_stats.h"

namespace lab {

const std::vector<ImplicitConvBuild>& implicit_conv_builds() {
  static const std::vector<ImplicitConvBuild> all{{ImplicitOp::Fprop, 128, 64},
                                                  {ImplicitOp::Fprop, 128, 128},
                                                  {ImplicitOp::Dgrad, 128, 64},
                                                  {ImplicitOp::Dgrad, 128, 128}};
  return all;
}

std::string implicit_conv_text(const ImplicitConvBuild& b) {
  return std::string("CUTLASS implicit GEMM ") + (b.op == ImplicitOp::Fprop ? "conv" : "dgrad") +
         " alone (ours; a CTA a tile, " + std::to_string(b.tile_m) + "x" + std::to_string(b.tile_n) + " tiles)";
}

ImplicitConvRun implicit_conv(const ImplicitConvBuild& b, const ConvGeometry& g, const void* in, const void* w,
                              void* out, void* ws) {
#if defined(LAB_WITH_CUTLASS)
  if (std::string why = sm90a_gpu_refusal(); !why.empty()) return {.refused = why};
  if (b.op == ImplicitOp::Dgrad && g.stride != 1)
    return {.refused = "a strided data gradient (CUTLASS's Hopper implicit GEMM runs unit strides)"};
  const implicit_builds::Maker make =
      b.op == ImplicitOp::Fprop ? implicit_builds::fprop(b.tile_m, b.tile_n) : implicit_builds::dgrad(b.tile_m, b.tile_n);
  if (!make) return {.refused = "no build of that tile"};
  return make(g, in, w, out, ws);
#else
  (void)b, (void)g, (void)in, (void)w, (void)out, (void)ws;
  return {.refused = "built without CUTLASS (the build covers no sm_90)"};
#endif
}

}  // namespace lab
