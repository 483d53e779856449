// The CUTLASS GEMM with BN statistics in its epilogue (kernel_lab/cutlass_conv_stats.h), as
// templates over the epilogue, the schedule and the tile; each cutlass_gemm_*.cu instantiates one
// schedule and tile. Compiled for sm_90a alone (wgmma and TMA need the architecture-specific target).
//
// The epilogue is a visitor tree (CUTLASS's EVT): the accumulators go to two row reductions, one of
// them through a square, which reduce over M (the pixels) into per-channel sums; the root returns
// the accumulators themselves, which are stored as y in fp16.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/check.h"
#include "core/errors.h"
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "kernel_lab/cutlass_kernel_builds.h"

namespace lab::cutlass_builds {
namespace {

using namespace cute;
namespace fusion = cutlass::epilogue::fusion;

// The root of the tree: its first input (the accumulators, passed through the reductions).
template <class T>
struct FirstOf {
  CUTLASS_HOST_DEVICE T operator()(T const& a, T const&) const { return a; }
};

using Half = cutlass::half_t;
template <int TileM, int TileN>
using TileShape = Shape<Int<TileM>, Int<TileN>, _64>;
using ClusterShape = Shape<_1, _1, _1>;
constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;

template <int TileM, int TileN>
size_t partials_count(int m, int k) {
  const CutlassPartials p = partials_layout(TileM, TileN, m, k);
  return size_t(p.rows) * size_t(p.row_len);
}

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

// The epilogue trees. Stats<Atomic, TileM, TileN>: the statistics; the CTAs' partial sums added atomically
// into the sums (StatsReduction::Atomic), or each CTA's stored, one row of partials per row of tiles
// (StatsReduction::Partials). Plain: y alone, as a plain conv writes it (StatsReduction::None), to
// tell the GEMM's own time from the statistics'.
using Acc = fusion::Sm90AccFetch;
template <bool Atomic, int TileM, int TileN>
struct Stats {
  template <class T>
  using GmemReduce = std::conditional_t<Atomic, cutlass::atomic_add<T>, cutlass::plus<T>>;
  using ChannelSum = fusion::Sm90RowReduction<cutlass::plus, cutlass::plus, GmemReduce, 0, TileShape<TileM, TileN>, float,
                                              float, kRound, Stride<_0, _1, _0>, 4, true, /*FinalReduction=*/Atomic>;
  using Square = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::multiplies, float, float, kRound>, Acc, Acc>;
  using Tree = fusion::Sm90EVT<fusion::Sm90Compute<FirstOf, Half, float, kRound>, fusion::Sm90EVT<ChannelSum, Acc>,
                               fusion::Sm90EVT<ChannelSum, Square>>;
  static constexpr StatsReduction kStats = Atomic ? StatsReduction::Atomic : StatsReduction::Partials;
  // The tree's arguments, children first: the sum of the accumulators, the sum of their squares:
  // into the sums themselves, or into the two halves of the workspace.
  static typename Tree::Arguments arguments(const CutlassConvStats& a) {
    if constexpr (Atomic) return {{{}, {a.sum}}, {{{}, {}, {}}, {a.sqsum}}, {}};
    float* part = static_cast<float*>(a.workspace);
    return {{{}, {part}}, {{{}, {}, {}}, {part ? part + partials_count<TileM, TileN>(a.m, a.k) : nullptr}}, {}};
  }
};
struct Plain {
  using Tree = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::epilogue::thread::Identity, Half, float, kRound>, Acc>;
  static constexpr StatsReduction kStats = StatsReduction::None;
  static typename Tree::Arguments arguments(const CutlassConvStats&) { return {}; }
};

// The two schedules of CUTLASS's persistent Hopper GEMM.
struct Cooperative {
  using Kernel = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using Epilogue = cutlass::epilogue::TmaWarpSpecializedCooperative;
};
struct PingPong {
  using Kernel = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  using Epilogue = cutlass::epilogue::TmaWarpSpecialized;
};

// The persistent Hopper GEMM with the epilogue tree Epi, the schedule Sched and a TileM x TileN x 64
// tile, and how to launch it.
template <class Epi, class Sched, int TileM, int TileN>
struct CutlassGemm {
  using Tree = typename Epi::Tree;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape<TileM, TileN>, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, cutlass::layout::RowMajor, 8, Half,
      cutlass::layout::RowMajor, 8, typename Sched::Epilogue, Tree>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Half, cutlass::layout::RowMajor, 8, Half,
      cutlass::layout::ColumnMajor, 8, float, TileShape<TileM, TileN>, ClusterShape,
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
  // The bytes the partial sums take in the workspace (StatsReduction::Partials), both statistics:
  // CUTLASS's own workspace follows them.
  static constexpr bool kPartials = Epi::kStats == StatsReduction::Partials;
  static size_t partials_bytes(int m, int k) { return kPartials ? 2 * partials_count<TileM, TileN>(m, k) * sizeof(float) : 0; }
  static size_t workspace(int m, int k, int c) {
    return partials_bytes(m, k) +
           Gemm::get_workspace_size(arguments({nullptr, nullptr, nullptr, nullptr, nullptr, m, k, c}));
  }

  static void run(const CutlassConvStats& a, cudaStream_t stream) {
    const typename Gemm::Arguments args = arguments(a);
    if (workspace(a.m, a.k, a.c) > a.workspace_bytes) throw Fatal("CUTLASS conv stats: workspace too small");
    cutlass::Status st = cutlass::Status::kSuccess;
    if constexpr (Epi::kStats == StatsReduction::Atomic) {
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
      Gemm gemm;
      st = gemm.initialize(args, a.workspace ? static_cast<char*>(a.workspace) + partials_bytes(a.m, a.k) : nullptr,
                           stream);
      if (st == cutlass::Status::kSuccess) st = gemm.run(stream);
      if (st == cutlass::Status::kSuccess && kPartials && !a.leave_partials) {
        const CutlassPartials p = partials_layout(TileM, TileN, a.m, a.k);
        sum_tile_partials<<<dim3((a.k + 31) / 32, 2), dim3(32, 32), 0, stream>>>(static_cast<const float*>(a.workspace),
                                                                                p.rows, p.row_len, a.k, a.sum, a.sqsum);
      }
    }
    if (st != cutlass::Status::kSuccess)
      throw Fatal(std::string("CUTLASS conv stats: ") + cutlass::cutlassGetStatusString(st));
    CUDA_CHECK(cudaGetLastError());
  }

  static const Ops* ops() {
    static const Ops o{&refusal, &workspace, &run};
    return &o;
  }
};

// The builds of one schedule and tile; Atomic where WithAtomic.
template <class Sched, int TileM, int TileN, bool WithAtomic = false>
const Ops* ops_of(StatsReduction r) {
  switch (r) {
    case StatsReduction::Partials: return CutlassGemm<Stats<false, TileM, TileN>, Sched, TileM, TileN>::ops();
    case StatsReduction::None: return CutlassGemm<Plain, Sched, TileM, TileN>::ops();
    case StatsReduction::Atomic:
      if constexpr (WithAtomic) return CutlassGemm<Stats<true, TileM, TileN>, Sched, TileM, TileN>::ops();
      return nullptr;
  }
  return nullptr;
}

}  // namespace
}  // namespace lab::cutlass_builds
