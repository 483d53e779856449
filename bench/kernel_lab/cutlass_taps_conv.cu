// The 3x3 conv of kernel_lab/cutlass_taps_conv.h: x's 4-D TMA descriptor, then the resident kernel
// with the taps mainloop. In a build without sm_90 it refuses every shape.
#if defined(LAB_WITH_CUTLASS)
// CUTLASS first (its code names cute's Layout unqualified; the project's ::Layout would clash).
#define CONV1X1_WITH_CUTLASS
#include "cutlass/cuda_host_adapter.hpp"
#include "kernels/conv1x1_launch.cuh"
#endif

#include "kernel_lab/cutlass_taps_conv.h"

#include "core/errors.h"
#include "kernels/conv1x1_stats.h"

namespace lab {

std::string taps_conv_refusal(const ConvGeometry& g) {
#if defined(LAB_WITH_CUTLASS)
  if (std::string why = sm90a_gpu_refusal(); !why.empty()) return why;
  if (g.r != 3 || g.stride != 1 || g.pad != 1) return "not a 3x3 stride-1 conv with a pad of 1";
  if (g.c % 64 || g.k % 64) return "channels not multiples of 64";
  const int image = g.h * g.w;
  const bool rows = g.w <= 128 && 128 % g.w == 0 && (image % 128 == 0 || 128 % image == 0);
  if (!rows) return "a 128-pixel tile is not whole rows of one image, nor whole images";
  return trainer_kernels::conv1x1::gemm_refusal(g.n * image, g.k, 9 * g.c);
#else
  (void)g;
  return "built without CUTLASS (the build covers no sm_90)";
#endif
}

void taps_conv(const ConvGeometry& g, const void* x, const void* w, void* y, float* partials, cudaStream_t stream) {
  if (const std::string why = taps_conv_refusal(g); !why.empty()) throw Fatal("taps conv: " + why);
#if defined(LAB_WITH_CUTLASS)
  using namespace trainer_kernels;
  // Boxes of 64 channels by a tile's 128 pixels: whole rows of one image, or whole images.
  const int image = g.h * g.w, rows = std::min(g.h, 128 / g.w), images = std::max(1, 128 / image);
  const cute::TmaDescriptor desc = conv1x1::image_rows_descriptor(x, g.n, g.h, g.w, g.c, rows, images);
  const int m = g.n * image, k9 = 9 * g.c;
  {
    using K = ResidentConv<conv1x1::kTileM, conv1x1::kTileN, Operand::Taps, false, StatsEpilogue>;
    typename K::Mainloop::Arguments args{};
    args.ptr_A = static_cast<const cutlass::half_t*>(x);  // CUTLASS's A descriptor, never loaded
    args.dA = cute::make_stride(int64_t(k9), cute::_1{}, int64_t(m) * k9);
    args.ptr_B = static_cast<const cutlass::half_t*>(w);  // w[k][(r, s, c)]: K-major
    args.dB = cute::make_stride(int64_t(k9), cute::_1{}, int64_t(g.k) * k9);
    args.taps = desc;
    args.h = g.h, args.w = g.w, args.c = g.c;
    typename K::Params p{};
    p.mainloop = K::Mainloop::to_underlying_arguments(cute::make_shape(m, g.k, k9, 1), args, nullptr);
    p.m = m, p.n = g.k, p.k = k9;
    p.epilogue = {static_cast<cutlass::half_t*>(y), partials, {}};
    conv1x1::launch<K>(p, stream);
  }
#else
  (void)x, (void)w, (void)y, (void)partials, (void)stream;
#endif
}

}  // namespace lab
