// The 1x1 conv with BN statistics (kernels/conv1x1_stats.h): which shapes it runs, and the launch
// of kernels/conv1x1_stats_kernel.cuh with 128x64 tiles, with or without the prologue, either
// schedule. The kernel is compiled only where CONV1X1_WITH_CUTLASS is set (the Makefile: sm_90a,
// where the build covers sm_90); elsewhere every shape is refused.
#include "kernels/conv1x1_stats.h"

#include <algorithm>

#include "core/check.h"
#include "core/errors.h"

#if defined(CONV1X1_WITH_CUTLASS)
#include "kernels/conv1x1_stats_kernel.cuh"
#endif

namespace {

constexpr int kTileM = 128, kTileN = 64;

// What the kernel asks of the GPU: read once, on the first GPU it runs on (as one_wave_grid in
// kernels/common.cuh), not at each of a step's 33 launches.
struct Gpu {
  int sms, cc;  // cc: major * 10 + minor
};
const Gpu& gpu() {
  static const Gpu g = [] {
    int dev = 0, sms = 0, major = 0, minor = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    return Gpu{sms, 10 * major + minor};
  }();
  return g;
}

// The CTAs that share a column of tiles: as many as fill the SMs, one CTA an SM.
int ctas_per_column(int m, int k) { return std::max(1, std::min(m / kTileM, gpu().sms / std::max(1, k / kTileN))); }

#if defined(CONV1X1_WITH_CUTLASS)

template <bool Prologue, bool PingPong>
void launch(const Conv1x1Stats& a, cudaStream_t stream) {
  using K = trainer_kernels::ResidentConvStats<kTileM, kTileN, Prologue, PingPong>;
  typename K::Mainloop::Arguments args{};
  args.ptr_A = static_cast<const cutlass::half_t*>(a.x);
  args.dA = cute::make_stride(int64_t(a.c), cute::_1{}, int64_t(a.m) * a.c);
  args.ptr_B = static_cast<const cutlass::half_t*>(a.w);
  args.dB = cute::make_stride(int64_t(a.c), cute::_1{}, int64_t(a.k) * a.c);
  if constexpr (Prologue) {
    args.scale = a.scale;
    args.shift = a.shift;
  }
  const typename K::Params p{K::Mainloop::to_underlying_arguments(cute::make_shape(a.m, a.k, a.c, 1), args, nullptr),
                             a.m,
                             a.k,
                             a.c,
                             static_cast<cutlass::half_t*>(a.y),
                             a.partials,
                             a.k / kTileN,
                             a.m / kTileM,
                             ctas_per_column(a.m, a.k)};
  constexpr int smem = int(sizeof(typename K::SharedStorage));
  static const bool sized = [] {  // once a build: above 48 KiB a kernel must ask for its shared memory
    CUDA_CHECK(cudaFuncSetAttribute(trainer_kernels::resident_conv_stats<K>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    smem));
    return true;
  }();
  (void)sized;
  trainer_kernels::resident_conv_stats<K><<<p.n_tiles * p.ctas_per_column, K::kThreads, smem, stream>>>(p);
  CUDA_CHECK(cudaGetLastError());
}
#endif

}  // namespace

std::string sm90a_gpu_refusal() {
  const int cc = gpu().cc;
  return cc == 90 ? "" : "compiled for sm_90a only (this GPU is sm_" + std::to_string(cc) + ")";
}

std::string conv1x1_stats_refusal(int m, int k, int c) {
#if defined(CONV1X1_WITH_CUTLASS)
  if (const std::string why = sm90a_gpu_refusal(); !why.empty()) return why;
  if (m <= 0 || m % kTileM) return "pixels not a positive multiple of the tile's 128 rows";
  if (k <= 0 || k % kTileN) return "output channels not a positive multiple of the tile's 64";
  if (c <= 0 || c % 64) return "input channels not a positive multiple of the k-tile's 64";
  if (k / kTileN > gpu().sms) return "more columns of tiles than SMs";
  return "";
#else
  (void)m, (void)k, (void)c;
  return "built without it (the build covers no sm_90)";
#endif
}

int conv1x1_partial_rows(int m, int k) { return ctas_per_column(m, k); }

size_t conv1x1_partials_bytes(int m, int k) { return 2 * size_t(conv1x1_partial_rows(m, k)) * k * sizeof(float); }

void conv1x1_stats(const Conv1x1Stats& a, cudaStream_t stream) {
  if (const std::string why = conv1x1_stats_refusal(a.m, a.k, a.c); !why.empty())
    throw Fatal("conv1x1_stats: " + why);
  if (!a.scale != !a.shift) throw Fatal("conv1x1_stats: the prologue needs both its scale and its shift");
#if defined(CONV1X1_WITH_CUTLASS)
  const bool pp = a.schedule == Conv1x1Schedule::PingPong;
  if (a.scale) pp ? launch<true, true>(a, stream) : launch<true, false>(a, stream);
  else pp ? launch<false, true>(a, stream) : launch<false, false>(a, stream);
#else
  (void)stream;
#endif
}
