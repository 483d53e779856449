// A CUTLASS Hopper mainloop's loads with a second tile of A's shape beside A's in every stage: for
// the kernels that make their A operand from two tensors as they read them. The forward's join in
// conv1 (kernels/cutlass_join_mainloop.cuh: x and the shortcut), and the join's backward in conv3's
// data gradient (kernels/conv1x1_dgrad_wgrad_kernel.cuh: dz and a3). The second tile, R, is loaded
// by one more TMA copy onto the stage's barrier and counted in its transaction bytes; the stage
// count is CUTLASS's for a stage of two A tiles and a B tile.
#pragma once

#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/gemm/collective/builders/sm90_common.inl"
#include "cutlass/gemm/collective/collective_builder.hpp"

namespace trainer_kernels {

using namespace cute;

// CUTLASS's shared-memory-sourced mainloop (wgmma reads A and B from the stages) for fp16 A[M, K]
// (K-major) and B as LayoutB, fp32 accumulators, with as many stages as fit when each also holds a
// second A tile, beside `carveout` bytes for the kernel's own use.
template <class KernelSchedule, class TileShape, int carveout, class LayoutB>
struct PairedStagesMainloop {
  using Half = cutlass::half_t;
  using StageShape = Shape<Int<2 * size<0>(TileShape{})>, decltype(get<1>(TileShape{})), decltype(get<2>(TileShape{}))>;
  static constexpr int kStages = cutlass::gemm::collective::detail::compute_stage_count_or_override<
      cutlass::gemm::collective::detail::sm90_smem_capacity_bytes, Half, Half, StageShape,
      carveout>(cutlass::gemm::collective::StageCountAutoCarveout<carveout>{});
  using Base = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Half, cutlass::layout::RowMajor, 8, Half, LayoutB, 8, float,
      TileShape, Shape<_1, _1, _1>, cutlass::gemm::collective::StageCount<kStages>, KernelSchedule>::CollectiveOp;
};

// Base's loads, A's tile and R's of each k-tile into every stage. What the consumer does with the
// two is the deriving mainloop's (or the kernel's).
template <class Base>
struct PairedA : Base {
  using typename Base::MainloopPipeline;
  using typename Base::PipelineState;
  using typename Base::SmemLayoutA;
  using typename Base::SmemLayoutB;
  using typename Base::TileShape;

  // A's and B's tiles of every stage (CUTLASS's), then R's, as A's and 1024-byte aligned as the
  // 128-byte swizzle's pattern repeats.
  struct TensorStorage : Base::TensorStorage {
    alignas(1024) cute::array_aligned<cutlass::half_t, cute::cosize_v<SmemLayoutA>, 1024> smem_R;
  };

  // The GEMM's arguments, and R: fp16 [M, K], as A.
  struct Arguments : Base::Arguments {
    const void* second = nullptr;
  };
  struct Params : Base::Params {
    typename Base::Params::TMA_A tma_load_r;
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& shape, Arguments const& args, void* workspace) {
    typename Base::Arguments r = args;
    r.ptr_A = static_cast<const cutlass::half_t*>(args.second);
    Params p{Base::to_underlying_arguments(shape, args, workspace),
             Base::to_underlying_arguments(shape, r, workspace).tma_load_a};
    p.tma_transaction_bytes += Base::TmaTransactionBytesMK;  // R's tile lands on the stage's barrier too
    return p;
  }

  CUTLASS_DEVICE static void prefetch_tma_descriptors(Params const& p) {
    Base::prefetch_tma_descriptors(p);
    cute::prefetch_tma_descriptor(p.tma_load_r.get_tma_descriptor());
  }

  // A's and B's tiled views (CUTLASS's), then R's: (BLK_M, BLK_K, m, k, l).
  template <class ProblemShapeMNKL>
  CUTLASS_DEVICE auto load_init(ProblemShapeMNKL const& shape, Params const& p) const {
    auto ab = Base::load_init(shape, p);
    auto [M, N, K, L] = shape;
    Tensor mR = p.tma_load_r.get_tma_tensor(make_shape(M, K, L));
    Tensor gR = local_tile(mR, TileShape{}, make_coord(_, _, _), Step<_1, Underscore, _1>{});
    return cute::make_tuple(get<0>(ab), get<1>(ab), gR);
  }

  // The producer: A's, R's and B's tiles of each k-tile into the next free stage (no cluster).
  template <class TensorA, class TensorB, class TensorR, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(Params const& p, MainloopPipeline pipeline, PipelineState write,
                           cute::tuple<TensorA, TensorB, TensorR> const& inputs, BlockCoord const& blk,
                           KTileIterator k_iter, int k_tile_count, int, uint32_t, TensorStorage& st) {
    if (!cute::elect_one_sync()) return;
    Tensor sA = as_position_independent_swizzle_tensor(make_tensor(make_smem_ptr(st.smem_A.data()), SmemLayoutA{}));
    Tensor sB = as_position_independent_swizzle_tensor(make_tensor(make_smem_ptr(st.smem_B.data()), SmemLayoutB{}));
    Tensor sR = as_position_independent_swizzle_tensor(make_tensor(make_smem_ptr(st.smem_R.data()), SmemLayoutA{}));
    auto tma_a = p.tma_load_a.get_slice(0);
    auto tma_b = p.tma_load_b.get_slice(0);
    auto tma_r = p.tma_load_r.get_slice(0);
    auto [m, n, k, l] = blk;
    Tensor tAgA = tma_a.partition_S(get<0>(inputs)(_, _, m, _, l));  // (TMA, TMA_M, TMA_K, k)
    Tensor tAsA = tma_a.partition_D(sA);                              // (TMA, TMA_M, TMA_K, PIPE)
    Tensor tBgB = tma_b.partition_S(get<1>(inputs)(_, _, n, _, l));
    Tensor tBsB = tma_b.partition_D(sB);
    Tensor tRgR = tma_r.partition_S(get<2>(inputs)(_, _, m, _, l));
    Tensor tRsR = tma_r.partition_D(sR);
    const uint16_t no_multicast = 0;
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tile_count > 0; --k_tile_count) {
      pipeline.producer_acquire(write);
      auto* barrier = pipeline.producer_get_barrier(write);
      const int stage = write.index();
      copy(p.tma_load_a.with(*barrier, no_multicast), tAgA(_, _, _, *k_iter), tAsA(_, _, _, stage));
      copy(p.tma_load_r.with(*barrier, no_multicast), tRgR(_, _, _, *k_iter), tRsR(_, _, _, stage));
      copy(p.tma_load_b.with(*barrier, no_multicast), tBgB(_, _, _, *k_iter), tBsB(_, _, _, stage));
      ++k_iter;
      ++write;
    }
  }
};

}  // namespace trainer_kernels
