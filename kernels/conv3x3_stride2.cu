// The stride-2 3x3 data gradient by parity (kernels/conv3x3_stride2.h): the resident kernel with the
// phases mainloop, 128x64 tiles, the cooperative schedule. Compiled with CUTLASS only where
// CONV1X1_WITH_CUTLASS is set (sm_90a); elsewhere every shape is refused.
#include "kernels/conv3x3_stride2.h"

#include <cstdint>

#include <cuda_fp16.h>

#include "core/errors.h"
#include "kernels/chained_launch.cuh"
#include "kernels/conv1x1_launch.cuh"
#include "kernels/conv3x3_filter.cuh"
#include "kernels/conv3x3_parity.h"

using namespace trainer_kernels::conv1x1;

namespace {

// The GEMM: the four phases' rows (dy's pixels each) by c columns, k = 9 taps of dy's channels.
struct Gemm {
  int m, n, k;
};
int phase_pixels(const Conv3x3Shape& s) { return s.n * (s.h / 2) * (s.w / 2); }
Gemm gemm(const Conv3x3Shape& s) { return {4 * phase_pixels(s), s.c, 9 * s.k}; }

std::string refusal(const Conv3x3Shape& s) {
  if (s.n <= 0 || s.h <= 0 || s.w <= 0) return "an empty batch or image";
  if (s.h % 2 || s.w % 2) return "odd sides (dx would not be twice dy)";
  if (s.c % 64 || s.k % 64) return "channels not multiples of 64";
  // A tile's 128 pixels of dy: whole rows of one image, or whole images (the TMA box's shape).
  const int h = s.h / 2, w = s.w / 2, image = h * w;
  if (w > 128 || 128 % w || (image % 128 && 128 % image)) return "dy's rows not whole in tiles of 128 pixels";
  if (phase_pixels(s) % 128) return "a phase not whole tiles of 128 pixels";
  return "";
}

// The phases' taps in order: tap t of phase f (parity_first_tap(f) <= t) is the filter's (r, s).
trainer_kernels::FilterTaps phase_taps() {
  trainer_kernels::FilterTaps taps{};
  for (int phase = 0; phase < 4; ++phase)
    for (int t = 0; t < parity_taps(phase); ++t) {
      const ParityTap tap = parity_tap(phase, t);
      taps.from[parity_first_tap(phase) + t] = int8_t(tap.r * 3 + tap.s);
    }
  return taps;
}

}  // namespace

std::string conv3x3_stride2_dgrad_refusal(const Conv3x3Shape& s) {
#if defined(CONV1X1_WITH_CUTLASS)
  if (std::string why = refusal(s); !why.empty()) return why;
  const Gemm g = gemm(s);
  return gemm_refusal(g.m, g.n, g.k);
#else
  (void)s;
  return "built without it (the build covers no sm_90)";
#endif
}

int conv3x3_stride2_dgrad_partial_rows(const Conv3x3Shape& s) { return ctas_per_column(gemm(s).m, s.c); }
size_t conv3x3_stride2_dgrad_partials_bytes(const Conv3x3Shape& s) { return partials_bytes(2, gemm(s).m, s.c); }

void conv3x3_stride2_phase_filter(const void* w, void* phases, const Conv3x3Shape& s, cudaStream_t stream) {
  if (!w || !phases) throw Fatal("conv3x3_stride2_phase_filter: a filter is missing");
  if (s.c % 64 || s.k % 64) throw Fatal("conv3x3_stride2_phase_filter: channels not multiples of 64");
  static const trainer_kernels::FilterTaps taps = phase_taps();
  trainer_kernels::rearrange_filter(w, phases, s.k, s.c, taps, stream);
}

void conv3x3_stride2_dgrad_bn(const Conv3x3DgradBn& a, cudaStream_t stream) {
  if (const std::string why = conv3x3_stride2_dgrad_refusal(a.s); !why.empty())
    throw Fatal("conv3x3_stride2_dgrad_bn: " + why);
  if (const std::string why = inner_grad_args_refusal(a); !why.empty()) throw Fatal("conv3x3_stride2_dgrad_bn: " + why);
  if (!a.turned) throw Fatal("conv3x3_stride2_dgrad_bn: a tensor it reads or writes is missing");
#if defined(CONV1X1_WITH_CUTLASS)
  using E = trainer_kernels::PhasesInnerGradEpilogue;
  using K = trainer_kernels::ResidentConv<kTileM, kTileN, trainer_kernels::Operand::Phases, false, E>;
  const Gemm g = gemm(a.s);
  const int h = a.s.h / 2, w = a.s.w / 2, image = h * w;
  typename K::Mainloop::Arguments args{};
  args.ptr_A = static_cast<const cutlass::half_t*>(a.dy);  // CUTLASS's A descriptor, never loaded
  args.dA = cute::make_stride(int64_t(g.k), cute::_1{}, int64_t(g.m) * g.k);
  args.ptr_B = static_cast<const cutlass::half_t*>(a.turned);  // phases[c][(tap, k)]: K-major
  args.dB = cute::make_stride(int64_t(g.k), cute::_1{}, int64_t(g.n) * g.k);
  // Boxes of 64 channels by a tile's 128 pixels: whole rows of one image, or whole images.
  args.taps = image_rows_descriptor(a.dy, a.s.n, h, w, a.s.k, std::min(h, 128 / w), std::max(1, 128 / image));
  args.h = h, args.w = w, args.c = a.s.k;
  args.phase_tiles = phase_pixels(a.s) / kTileM;
  typename K::Params p{};
  p.mainloop = K::Mainloop::to_underlying_arguments(cute::make_shape(g.m, g.n, g.k, 1), args, nullptr);
  p.m = g.m, p.n = g.n, p.k = g.k;
  p.epilogue = inner_grad_params<E>(a);
  p.epilogue.phase_rows = cutlass::FastDivmod(phase_pixels(a.s));
  p.epilogue.img_hw = cutlass::FastDivmod(image);
  p.epilogue.img_w = cutlass::FastDivmod(w);
  p.epilogue.half_h = h, p.epilogue.half_w = w;
  launch<K>(p, stream);
#else
  (void)stream;
#endif
}
