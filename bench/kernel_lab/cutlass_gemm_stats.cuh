// The CUTLASS GEMM with BN statistics in its epilogue (kernel_lab/cutlass_conv_stats.h), as
// templates over the epilogue, the schedule and the tile; each cutlass_gemm_*.cu instantiates one
// schedule and tile. Compiled for sm_90a alone (wgmma and TMA need the architecture-specific target).
//
// The epilogue is a visitor tree (CUTLASS's EVT): the accumulators go to two row reductions, one of
// them through a square, which reduce over M (the pixels) into per-channel sums; the root returns
// the accumulators themselves, which are stored as y in fp16.
#pragma once

#include <cstdint>

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
#include "kernels/cutlass_prologue_mainloop.cuh"

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

// The epilogue trees. Stats<TileM, TileN>: y and the statistics, each CTA's partial sums stored, one
// row per row of tiles (FinalReduction = false: bn_finalize_partials adds them up). Plain: y alone,
// as a plain conv writes it, to tell the GEMM's own time from the statistics'.
using Acc = fusion::Sm90AccFetch;
template <int TileM, int TileN>
struct Stats {
  using ChannelSum = fusion::Sm90RowReduction<cutlass::plus, cutlass::plus, cutlass::plus, 0, TileShape<TileM, TileN>,
                                              float, float, kRound, Stride<_0, _1, _0>, 4, true,
                                              /*FinalReduction=*/false>;
  using Square = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::multiplies, float, float, kRound>, Acc, Acc>;
  using Tree = fusion::Sm90EVT<fusion::Sm90Compute<FirstOf, Half, float, kRound>, fusion::Sm90EVT<ChannelSum, Acc>,
                               fusion::Sm90EVT<ChannelSum, Square>>;
  static constexpr bool kStats = true;
  // The tree's arguments, children first: the sums of the accumulators into the workspace's first
  // half, the sums of their squares into its second.
  static typename Tree::Arguments arguments(const CutlassConvStats& a) {
    float* part = static_cast<float*>(a.workspace);
    return {{{}, {part}}, {{{}, {}, {}}, {part ? part + partials_count<TileM, TileN>(a.m, a.k) : nullptr}}, {}};
  }
};
struct Plain {
  using Tree = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::epilogue::thread::Identity, Half, float, kRound>, Acc>;
  static constexpr bool kStats = false;
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
// tile, and how to launch it. Prologue: the previous BN applied to x in registers
// (kernels/cutlass_prologue_mainloop.cuh), else CUTLASS's own mainloop, A read by wgmma from shared memory.
template <class Epi, class Sched, int TileM, int TileN, bool Prologue = false>
struct CutlassGemm {
  using Tree = typename Epi::Tree;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape<TileM, TileN>, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, cutlass::layout::RowMajor, 8, Half,
      cutlass::layout::RowMajor, 8, typename Sched::Epilogue, Tree>::CollectiveOp;

  static constexpr int kEpilogueBytes = static_cast<int>(sizeof(typename Epilogue::SharedStorage));
  using OwnMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Half, cutlass::layout::RowMajor, 8, Half,
      cutlass::layout::ColumnMajor, 8, float, TileShape<TileM, TileN>, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<kEpilogueBytes>, typename Sched::Kernel>::CollectiveOp;
  using Mainloop = std::conditional_t<
      Prologue, trainer_kernels::PrologueMainloop<typename Sched::Kernel, TileShape<TileM, TileN>, kEpilogueBytes>, OwnMainloop>;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments arguments(const CutlassConvStats& a) {
    // Packed row-major x [M, C], w [K, C] (each row a filter: column-major B) and y [M, K].
    const typename Kernel::StrideA sa = make_stride(int64_t(a.c), _1{}, int64_t(a.m) * a.c);
    const typename Kernel::StrideB sb = make_stride(int64_t(a.c), _1{}, int64_t(a.k) * a.c);
    const typename Kernel::StrideD sd = make_stride(int64_t(a.k), _1{}, int64_t(a.m) * a.k);
    typename Mainloop::Arguments mainloop{};
    if constexpr (Prologue)
      mainloop = {{static_cast<const Half*>(a.x), sa, static_cast<const Half*>(a.w), sb}, a.scale, a.shift};
    else
      mainloop = {static_cast<const Half*>(a.x), sa, static_cast<const Half*>(a.w), sb};
    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                  {a.m, a.k, a.c, 1},
                                  mainloop,
                                  {{}, nullptr, sd, static_cast<Half*>(a.y), sd}};
    args.epilogue.thread = Epi::arguments(a);
    return args;
  }

  static std::string refusal(int m, int k, int c) {
    // The prologue's loop reads the BN's coefficients of whole k-tiles, and TMA's zero rows past M
    // would go through it as relu(shift) into the statistics.
    if (Prologue && c % 64) return "input channels not a multiple of 64";
    if (Prologue && m % TileM) return "pixels not a multiple of the tile's " + std::to_string(TileM) + " rows";
    const CutlassConvStats probe{nullptr, nullptr, nullptr, m, k, c};
    return Gemm::can_implement(arguments(probe)) == cutlass::Status::kSuccess ? ""
                                                                              : "CUTLASS cannot implement this shape";
  }
  // The bytes the partial sums take in the workspace, both statistics: CUTLASS's own workspace
  // follows them.
  static size_t partials_bytes(int m, int k) {
    return Epi::kStats ? 2 * partials_count<TileM, TileN>(m, k) * sizeof(float) : 0;
  }
  static size_t workspace(int m, int k, int c) {
    return partials_bytes(m, k) +
           Gemm::get_workspace_size(arguments({nullptr, nullptr, nullptr, m, k, c}));
  }

  static void run(const CutlassConvStats& a, cudaStream_t stream) {
    const typename Gemm::Arguments args = arguments(a);
    if (workspace(a.m, a.k, a.c) > a.workspace_bytes) throw Fatal("CUTLASS conv stats: workspace too small");
    if (Prologue && (!a.scale || !a.shift)) throw Fatal("CUTLASS conv stats: the prologue's scale and shift missing");
    Gemm gemm;
    cutlass::Status st = gemm.initialize(
        args, a.workspace ? static_cast<char*>(a.workspace) + partials_bytes(a.m, a.k) : nullptr, stream);
    if (st == cutlass::Status::kSuccess) st = gemm.run(stream);
    if (st != cutlass::Status::kSuccess)
      throw Fatal(std::string("CUTLASS conv stats: ") + cutlass::cutlassGetStatusString(st));
    CUDA_CHECK(cudaGetLastError());
  }

  static CutlassPartials partials(int m, int k) { return partials_layout(TileM, TileN, m, k); }

  static const Ops* ops() {
    static const Ops o{&refusal, &workspace, &run, &partials};
    return &o;
  }
};

// The builds of one schedule and tile.
template <class Sched, int TileM, int TileN, bool Prologue = false>
const Ops* ops_of(bool stats) {
  return stats ? CutlassGemm<Stats<TileM, TileN>, Sched, TileM, TileN, Prologue>::ops()
               : CutlassGemm<Plain, Sched, TileM, TileN, Prologue>::ops();
}

}  // namespace
}  // namespace lab::cutlass_builds
