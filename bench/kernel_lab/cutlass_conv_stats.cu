// The CUTLASS 1x1 conv with BN statistics (cutlass_conv_stats.h). Compiled for sm_90a alone (wgmma
// and TMA need the architecture-specific target); in a build without sm_90 it refuses every shape.
//
// The epilogue is a visitor tree (CUTLASS's EVT): the accumulators go to two row reductions, one of
// them through a square, which reduce over M (the pixels) into per-channel sums; the root returns
// the accumulators themselves, which are stored as y in fp16.
#include "kernel_lab/cutlass_conv_stats.h"

#include <cstdint>
#include <type_traits>

#include "core/check.h"
#include "core/errors.h"

#if defined(LAB_WITH_CUTLASS)
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#endif

namespace lab {

#if defined(LAB_WITH_CUTLASS)
namespace {

using namespace cute;
namespace fusion = cutlass::epilogue::fusion;

// The root of the tree: its first input (the accumulators, passed through the reductions).
template <class T>
struct FirstOf {
  CUTLASS_HOST_DEVICE T operator()(T const& a, T const&) const { return a; }
};

using Half = cutlass::half_t;
constexpr int kTileM = 128, kTileN = 64;
using TileShape = Shape<Int<kTileM>, Int<kTileN>, _64>;
using ClusterShape = Shape<_1, _1, _1>;
constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;

// The partial sums of one statistic, StatsReduction::Partials: a row of K rounded up to whole tiles
// for each row of tiles (the layout CUTLASS's row reduction writes them in).
int partial_rows(int m) { return (m + kTileM - 1) / kTileM; }
int partial_row_len(int k) { return (k + kTileN - 1) / kTileN * kTileN; }
size_t partials_count(int m, int k) { return size_t(partial_rows(m)) * size_t(partial_row_len(k)); }

// Adds up the rows of partials of both statistics, each column in a fixed order (deterministic):
// a block of 32 x 32 threads per 32 channels and statistic, each thread a strided share of the rows.
__global__ void sum_tile_partials(const float* part, int rows, int row_len, int k, float* sum, float* sqsum) {
  __shared__ float acc[32][33];
  const int col = blockIdx.x * 32 + threadIdx.x;
  const float* p = part + (blockIdx.y ? size_t(rows) * row_len : 0);
  float s = 0.f;
  if (col < k) {
#pragma unroll 8
    for (int r = threadIdx.y; r < rows; r += 32) s += p[size_t(r) * row_len + col];
  }
  acc[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < k) {
    for (int r = 1; r < 32; ++r) s += acc[r][threadIdx.x];
    (blockIdx.y ? sqsum : sum)[col] = s;
  }
}

// The epilogue trees. Stats<Final>: the statistics; the CTAs' partial sums added atomically into
// the sums (Final = true: StatsReduction::Atomic), or each CTA's stored, one row of partials per row
// of tiles, for sum_tile_partials below to add up (Final = false: StatsReduction::Partials).
// Plain: y alone, as a plain conv writes it (StatsReduction::None), to tell the GEMM's own time from
// the statistics'.
using Acc = fusion::Sm90AccFetch;
template <bool Atomic>
struct Stats {
  template <class T>
  using GmemReduce = std::conditional_t<Atomic, cutlass::atomic_add<T>, cutlass::plus<T>>;
  using ChannelSum = fusion::Sm90RowReduction<cutlass::plus, cutlass::plus, GmemReduce, 0, TileShape, float, float,
                                              kRound, Stride<_0, _1, _0>, 4, true, /*FinalReduction=*/Atomic>;
  using Square = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::multiplies, float, float, kRound>, Acc, Acc>;
  using Tree = fusion::Sm90EVT<fusion::Sm90Compute<FirstOf, Half, float, kRound>, fusion::Sm90EVT<ChannelSum, Acc>,
                               fusion::Sm90EVT<ChannelSum, Square>>;
  static constexpr bool kAtomic = Atomic;
  // The tree's arguments, children first: the sum of the accumulators, the sum of their squares:
  // into the sums themselves, or into the two halves of the workspace.
  static typename Tree::Arguments arguments(const CutlassConvStats& a) {
    if constexpr (Atomic) return {{{}, {a.sum}}, {{{}, {}, {}}, {a.sqsum}}, {}};
    float* part = static_cast<float*>(a.workspace);
    return {{{}, {part}}, {{{}, {}, {}}, {part ? part + partials_count(a.m, a.k) : nullptr}}, {}};
  }
};
struct Plain {
  using Tree = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::epilogue::thread::Identity, Half, float, kRound>, Acc>;
  static constexpr bool kAtomic = false;
  static typename Tree::Arguments arguments(const CutlassConvStats&) { return {}; }
};

// The two schedules of CUTLASS's persistent Hopper GEMM: both consumer warpgroups on one tile
// (cooperative), or each on a tile of its own by turns, so that one's epilogue runs while the
// other's mainloop does (ping-pong).
struct Cooperative {
  using Kernel = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using Epilogue = cutlass::epilogue::TmaWarpSpecializedCooperative;
};
struct PingPong {
  using Kernel = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  using Epilogue = cutlass::epilogue::TmaWarpSpecialized;
};

// The Hopper GEMM (one 128x64x64 tile at a time, persistent) with the epilogue tree Epi and the
// schedule Sched, and how to launch it.
template <class Epi, class Sched>
struct CutlassGemm {
  using Tree = typename Epi::Tree;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, cutlass::layout::RowMajor, 8, Half,
      cutlass::layout::RowMajor, 8, typename Sched::Epilogue, Tree>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Half, cutlass::layout::RowMajor, 8, Half,
      cutlass::layout::ColumnMajor, 8, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      typename Sched::Kernel>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments arguments(const CutlassConvStats& a) {
    // Packed row-major x [M, C], w [K, C] (each row a filter: column-major B) and y [M, K].
    const typename Kernel::StrideA sa = make_stride(int64_t(a.c), _1{}, int64_t(a.m) * a.c);
    const typename Kernel::StrideB sb = make_stride(int64_t(a.c), _1{}, int64_t(a.k) * a.c);
    const typename Kernel::StrideD sd = make_stride(int64_t(a.k), _1{}, int64_t(a.m) * a.k);
    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                  {a.m, a.k, a.c, 1},
                                  {static_cast<const Half*>(a.x), sa, static_cast<const Half*>(a.w), sb},
                                  {{}, nullptr, sd, static_cast<Half*>(a.y), sd}};
    args.epilogue.thread = Epi::arguments(a);
    return args;
  }

  static std::string refusal(int m, int k, int c) {
    const CutlassConvStats probe{nullptr, nullptr, nullptr, nullptr, nullptr, m, k, c};
    return Gemm::can_implement(arguments(probe)) == cutlass::Status::kSuccess ? ""
                                                                              : "CUTLASS cannot implement this shape";
  }
  // Whether the statistics go through rows of partials in the workspace (StatsReduction::Partials),
  // and the bytes they take there, both statistics: CUTLASS's own workspace follows them.
  static constexpr bool kPartials = !Epi::kAtomic && !std::is_same_v<Epi, Plain>;
  static size_t partials_bytes(int m, int k) { return kPartials ? 2 * partials_count(m, k) * sizeof(float) : 0; }
  static size_t workspace(int m, int k, int c) {
    return partials_bytes(m, k) +
           Gemm::get_workspace_size(arguments({nullptr, nullptr, nullptr, nullptr, nullptr, m, k, c}));
  }

  static void run(const CutlassConvStats& a, cudaStream_t stream) {
    const typename Gemm::Arguments args = arguments(a);
    if (workspace(a.m, a.k, a.c) > a.workspace_bytes) throw Fatal("CUTLASS conv stats: workspace too small");
    cutlass::Status st = cutlass::Status::kSuccess;
    if constexpr (Epi::kAtomic) {
      // The adapter's initialize() would zero the sums with the driver API (cuMemsetD32Async),
      // which bin/kernel_lab does not link: they are zeroed here and the kernel launched from its
      // params, its shared memory allowed once.
      static const cudaError_t smem = cudaFuncSetAttribute(
          cutlass::device_kernel<Kernel>, cudaFuncAttributeMaxDynamicSharedMemorySize, Kernel::SharedStorageSize);
      CUDA_CHECK(smem);
      CUDA_CHECK(cudaMemsetAsync(a.sum, 0, sizeof(float) * a.k, stream));
      CUDA_CHECK(cudaMemsetAsync(a.sqsum, 0, sizeof(float) * a.k, stream));
      typename Kernel::Params params = Kernel::to_underlying_arguments(args, a.workspace);
      st = Gemm::run(params, stream);
    } else {
      // CUTLASS's own workspace (none for these kernels today) follows the partial sums.
      Gemm gemm;
      st = gemm.initialize(args, a.workspace ? static_cast<char*>(a.workspace) + partials_bytes(a.m, a.k) : nullptr,
                           stream);
      if (st == cutlass::Status::kSuccess) st = gemm.run(stream);
      if (st == cutlass::Status::kSuccess && kPartials) {
        sum_tile_partials<<<dim3((a.k + 31) / 32, 2), dim3(32, 32), 0, stream>>>(
            static_cast<const float*>(a.workspace), partial_rows(a.m), partial_row_len(a.k), a.k, a.sum, a.sqsum);
      }
    }
    if (st != cutlass::Status::kSuccess)
      throw Fatal(std::string("CUTLASS conv stats: ") + cutlass::cutlassGetStatusString(st));
    CUDA_CHECK(cudaGetLastError());
  }
};

// Calls f with the kernel of (r, ping_pong) (an object of its type, to read its static members from).
template <class F>
auto with_kernel(StatsReduction r, bool ping_pong, F&& f) {
  if (ping_pong && r == StatsReduction::Partials) return f(CutlassGemm<Stats<false>, PingPong>{});
  if (ping_pong && r == StatsReduction::None) return f(CutlassGemm<Plain, PingPong>{});
  if (ping_pong) throw Fatal("CUTLASS conv stats: no ping-pong build of the atomic statistics");
  if (r == StatsReduction::Atomic) return f(CutlassGemm<Stats<true>, Cooperative>{});
  if (r == StatsReduction::Partials) return f(CutlassGemm<Stats<false>, Cooperative>{});
  return f(CutlassGemm<Plain, Cooperative>{});
}

std::string gpu_refusal() {
  int dev = 0, major = 0, minor = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  if (major != 9 || minor != 0)
    return "compiled for sm_90a only (this GPU is sm_" + std::to_string(10 * major + minor) + ")";
  return "";
}

}  // namespace
#endif

std::string cutlass_conv_stats_refusal(StatsReduction r, bool ping_pong, int m, int k, int c) {
#if defined(LAB_WITH_CUTLASS)
  if (const std::string why = gpu_refusal(); !why.empty()) return why;
  if (k % 8 || c % 8) return "channels not in multiples of 8";
  if (ping_pong && r == StatsReduction::Atomic) return "no ping-pong build of the atomic statistics";
  return with_kernel(r, ping_pong, [&](auto g) { return decltype(g)::refusal(m, k, c); });
#else
  return "built without CUTLASS (the build covers no sm_90)";
#endif
}

size_t cutlass_conv_stats_workspace(StatsReduction r, bool ping_pong, int m, int k, int c) {
#if defined(LAB_WITH_CUTLASS)
  return with_kernel(r, ping_pong, [&](auto g) { return decltype(g)::workspace(m, k, c); });
#else
  return 0;
#endif
}

void cutlass_conv_stats(StatsReduction r, bool ping_pong, const CutlassConvStats& a, cudaStream_t stream) {
#if defined(LAB_WITH_CUTLASS)
  with_kernel(r, ping_pong, [&](auto g) { decltype(g)::run(a, stream); });
#else
  throw Fatal("CUTLASS conv stats: " + cutlass_conv_stats_refusal(r, ping_pong, a.m, a.k, a.c));
#endif
}

}  // namespace lab
