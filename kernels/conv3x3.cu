// Layer1's 3x3 convs (kernels/conv3x3.h): the resident kernel with the halo mainloop, 128x64 tiles,
// the cooperative schedule (ping-pong measured slower for the 3x3 in the kernel lab, H200,
// 2026-11-30). Compiled with CUTLASS only where CONV1X1_WITH_CUTLASS is set (sm_90a); elsewhere
// every shape is refused.
#include "kernels/conv3x3.h"

#include <cstdint>

#include <cuda_fp16.h>

#include "core/errors.h"
#include "kernels/chained_launch.cuh"
#include "kernels/conv3x3_filter.cuh"
#include "kernels/conv1x1_launch.cuh"

using namespace trainer_kernels::conv1x1;

namespace {

// The GEMM's sizes: m pixels by n output columns, k = 9 * the input channels.
struct Gemm {
  int m, n, k;
};
Gemm forward_gemm(const Conv3x3Shape& s) { return {s.n * s.h * s.w, s.k, 9 * s.c}; }
// The data gradient's: the conv of dy (k channels) into c.
Gemm dgrad_gemm(const Conv3x3Shape& s) { return {s.n * s.h * s.w, s.c, 9 * s.k}; }

std::string refusal(const Conv3x3Shape& s) {
  if (s.n <= 0 || s.h <= 0 || s.w <= 0) return "an empty batch or image";
  // Each direction's filter, 9 tiles of 64 x 64, held in shared memory.
  if (s.c != 64 || s.k != 64) return "not 64 channels in and out";
  // Each tap's view of a box starts whole image rows in: on a 1 KB swizzle pattern at 8 pixels a row.
  if (s.w % 8 || s.w > 32 || 128 % s.w || (s.h * s.w) % 128)
    return "not rows of 8 to 32 pixels (a multiple of 8) whole in tiles of 128 pixels";
  return "";
}

#if defined(CONV1X1_WITH_CUTLASS)
// The resident kernel with the halo mainloop on x (or dy) by the filter read K-major as [n, 9 * in],
// with the epilogue's parameters set by the caller.
template <class Epilogue>
void launch_halo(const void* x, const void* w, const Conv3x3Shape& s, Gemm g, int in_channels,
                 const typename Epilogue::Params& epilogue, cudaStream_t stream) {
  using K = trainer_kernels::ResidentConv<kTileM, kTileN, trainer_kernels::Operand::Halo, false, Epilogue>;
  typename K::Mainloop::Arguments args{};
  args.ptr_A = static_cast<const cutlass::half_t*>(x);  // CUTLASS's A descriptor, never loaded
  args.dA = cute::make_stride(int64_t(g.k), cute::_1{}, int64_t(g.m) * g.k);
  args.ptr_B = static_cast<const cutlass::half_t*>(w);
  args.dB = cute::make_stride(int64_t(g.k), cute::_1{}, int64_t(g.n) * g.k);
  // A tile's 128 / w rows and one above and below, one image.
  args.halo = image_rows_descriptor(x, s.n, s.h, s.w, in_channels, 128 / s.w + 2, 1);
  args.h = s.h, args.w = s.w;
  typename K::Params p{};
  p.mainloop = K::Mainloop::to_underlying_arguments(cute::make_shape(g.m, g.n, g.k, 1), args, nullptr);
  p.m = g.m, p.n = g.n, p.k = g.k;
  p.epilogue = epilogue;
  launch<K>(p, stream);
}
#endif

}  // namespace

std::string conv3x3_refusal(const Conv3x3Shape& s) {
#if defined(CONV1X1_WITH_CUTLASS)
  if (std::string why = refusal(s); !why.empty()) return why;
  // 64 channels each way: the data gradient's GEMM has the forward's shape.
  const Gemm f = forward_gemm(s);
  return gemm_refusal(f.m, f.n, f.k);
#else
  (void)s;
  return "built without it (the build covers no sm_90)";
#endif
}

int conv3x3_partial_rows(const Conv3x3Shape& s) { return ctas_per_column(forward_gemm(s).m, s.k); }
int conv3x3_dgrad_partial_rows(const Conv3x3Shape& s) { return ctas_per_column(dgrad_gemm(s).m, s.c); }
size_t conv3x3_partials_bytes(const Conv3x3Shape& s) {
  const Gemm f = forward_gemm(s), d = dgrad_gemm(s);
  return std::max(partials_bytes(2, f.m, f.n), partials_bytes(2, d.m, d.n));
}

void conv3x3_stats(const Conv3x3Stats& a, cudaStream_t stream) {
  if (const std::string why = conv3x3_refusal(a.s); !why.empty()) throw Fatal("conv3x3_stats: " + why);
  if (!a.x || !a.w || !a.y) throw Fatal("conv3x3_stats: a tensor it reads or writes is missing");
  if (const std::string why = finalize_refusal(a.finalize, true); !why.empty()) throw Fatal("conv3x3_stats: " + why);
  if (a.finalize.arrivals && !a.partials) throw Fatal("conv3x3_stats: finalizing needs the partial sums");
#if defined(CONV1X1_WITH_CUTLASS)
  trainer_kernels::StatsEpilogue::Params e{static_cast<cutlass::half_t*>(a.y), a.partials, a.finalize};
  launch_halo<trainer_kernels::StatsEpilogue>(a.x, a.w, a.s, forward_gemm(a.s), a.s.c, e, stream);
#else
  (void)stream;
#endif
}

void conv3x3_turn_filter(const void* w, void* turned, const Conv3x3Shape& s, cudaStream_t stream) {
  if (!w || !turned) throw Fatal("conv3x3_turn_filter: a filter is missing");
  static const trainer_kernels::FilterTaps turned_taps{{8, 7, 6, 5, 4, 3, 2, 1, 0}};  // (r, s) -> (2 - r, 2 - s)
  trainer_kernels::rearrange_filter(w, turned, s.k, s.c, turned_taps, stream);
}

void conv3x3_dgrad_bn(const Conv3x3DgradBn& a, cudaStream_t stream) {
  if (const std::string why = conv3x3_refusal(a.s); !why.empty()) throw Fatal("conv3x3_dgrad_bn: " + why);
  if (const std::string why = inner_grad_args_refusal(a); !why.empty()) throw Fatal("conv3x3_dgrad_bn: " + why);
  if (!a.turned) throw Fatal("conv3x3_dgrad_bn: a tensor it reads or writes is missing");
#if defined(CONV1X1_WITH_CUTLASS)
  using E = trainer_kernels::TurnedInnerGradEpilogue;
  launch_halo<E>(a.dy, a.turned, a.s, dgrad_gemm(a.s), a.s.k, inner_grad_params<E>(a), stream);
#else
  (void)stream;
#endif
}
