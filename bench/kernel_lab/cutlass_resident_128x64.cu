// The resident conv with statistics (kernel_lab/cutlass_resident_kernel.cuh), 128x64 tiles, with
// and without the previous BN's prologue, both schedules, and how to launch it.
#include "kernel_lab/cutlass_kernel_builds.h"

#if defined(LAB_WITH_CUTLASS)
#include <algorithm>

#include "core/check.h"
#include "core/errors.h"
#include "kernel_lab/cutlass_resident_kernel.cuh"

namespace lab::cutlass_builds {
namespace {

constexpr int kTileM = 128, kTileN = 64;

int sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    return v;
  }();
  return n;
}

// The CTAs that share a column of tiles: as many as fill the SMs, one CTA an SM.
int ctas_per_column(int m, int k) { return std::max(1, std::min(m / kTileM, sm_count() / std::max(1, k / kTileN))); }

template <bool Prologue, bool PingPong, bool Stats>
struct Resident {
  using K = ResidentConvStats<kTileM, kTileN, Prologue, PingPong>;

  static std::string refusal(int m, int k, int c) {
    if (m % kTileM) return "pixels not a multiple of the tile's 128 rows";
    if (k % kTileN) return "output channels not a multiple of the tile's 64";
    if (c % 64) return "input channels not a multiple of 64";
    if (k / kTileN > sm_count()) return "more columns of tiles than SMs";
    return "";
  }
  static CutlassPartials partials(int m, int k) { return {ctas_per_column(m, k), k}; }
  static size_t workspace(int m, int k, int) { return Stats ? 2 * size_t(ctas_per_column(m, k)) * k * sizeof(float) : 0; }

  static void run(const CutlassConvStats& a, cudaStream_t stream) {
    if (workspace(a.m, a.k, a.c) > a.workspace_bytes) throw Fatal("resident conv stats: workspace too small");
    if (Prologue && (!a.scale || !a.shift)) throw Fatal("resident conv stats: the prologue's scale and shift missing");
    typename K::Mainloop::Arguments args{};
    args.ptr_A = static_cast<const cutlass::half_t*>(a.x);
    args.dA = make_stride(int64_t(a.c), _1{}, int64_t(a.m) * a.c);
    args.ptr_B = static_cast<const cutlass::half_t*>(a.w);
    args.dB = make_stride(int64_t(a.c), _1{}, int64_t(a.k) * a.c);
    if constexpr (Prologue) {
      args.scale = a.scale;
      args.shift = a.shift;
    }
    typename K::Params p{K::Mainloop::to_underlying_arguments(make_shape(a.m, a.k, a.c, 1), args, nullptr),
                         a.m,
                         a.k,
                         a.c,
                         static_cast<cutlass::half_t*>(a.y),
                         Stats ? static_cast<float*>(a.workspace) : nullptr,
                         a.k / kTileN,
                         a.m / kTileM,
                         ctas_per_column(a.m, a.k)};
    constexpr int smem = int(sizeof(typename K::SharedStorage));
    static const bool sized = [] {
      CUDA_CHECK(cudaFuncSetAttribute(resident_conv_stats<K>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      return true;
    }();
    (void)sized;
    resident_conv_stats<K><<<p.n_tiles * p.ctas_per_column, K::kThreads, smem, stream>>>(p);
    CUDA_CHECK(cudaGetLastError());
  }

  static const Ops* ops() {
    static const Ops o{&refusal, &workspace, &run, &partials};
    return &o;
  }
};

template <bool Prologue, bool PingPong>
const Ops* resident_of(bool stats) {
  return stats ? Resident<Prologue, PingPong, true>::ops() : Resident<Prologue, PingPong, false>::ops();
}

}  // namespace

const Ops* resident_128x64(bool stats, bool prologue, bool pingpong) {
  if (prologue) return pingpong ? resident_of<true, true>(stats) : resident_of<true, false>(stats);
  return pingpong ? resident_of<false, true>(stats) : resident_of<false, false>(stats);
}

}  // namespace lab::cutlass_builds
#endif
