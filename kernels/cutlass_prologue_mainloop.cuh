// The mainloop of a CUTLASS Hopper GEMM that applies the previous BN to its A operand as it reads it:
// a = relu(a * scale[k] + shift[k]), scale and shift per input channel k (per column of A), in fp16,
// as cuDNN's SbrConvStats reads them. For conv3 of a bottleneck (1x1, stride 1: one GEMM), whose
// input the network does not store: it stores the previous BN's input and lets the next conv apply it.
//
// Why a mainloop of our own: TMA puts A in shared memory and wgmma reads it from there, untouched;
// no CUTLASS Hopper mainloop changes A on the way. CUTLASS's register-sourced one
// (MainloopSm90TmaGmmaRmemAWarpSpecialized, made for operands that must be converted) copies each
// k-block of A from shared memory into registers before its wgmma: that copy is where the BN goes.
// This type inherits everything from it (shared memory, TMA loads, the producer) but the consumer's
// loop, which it writes again with the transform after each copy.
//
// The consumer's loop, per k-tile of 64 input channels: wait for the tile's TMA loads; then for each
// k-block of 16 copy it to registers, transform it and issue its wgmma, as soon as the wgmma that
// last read those registers (a k-tile earlier) is done, so that up to four run while the next are
// prepared; a stage goes back to the producer once its k-tile's wgmmas are done.
#pragma once

#include <cuda_fp16.h>

#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/gemm/collective/builders/sm90_common.inl"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/sm90_mma_tma_gmma_rs_warpspecialized.hpp"

namespace trainer_kernels {

using namespace cute;

// CUTLASS's register-sourced mainloop for fp16 x[M, C] (K-major A) and w[K, C] (K-major B), fp32
// accumulators, as its collective builder would make it for a schedule and a tile, with the stage
// count that leaves `carveout` bytes of shared memory to the epilogue; a_tiles: the tiles of A's
// shape a stage holds (2: the join's residual beside x, kernels/cutlass_join_mainloop.cuh).
template <class KernelSchedule, class TileShape, int carveout, int a_tiles = 1>
struct RegisterAMainloop {
  using Half = cutlass::half_t;
  using Stride = cute::Stride<int64_t, _1, int64_t>;
  static constexpr bool kCooperative = std::is_same_v<KernelSchedule, cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
  // Cooperative: the two consumer warpgroups split each tile's rows.
  using AtomLayout = std::conditional_t<kCooperative, Layout<Shape<_2, _1, _1>>, Layout<Shape<_1, _1, _1>>>;
  using TiledMma = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Half, Half, float, TileShape, GMMA::Major::K, GMMA::Major::K>(), AtomLayout{}));
  using SmemAtomA = decltype(cutlass::gemm::collective::detail::rs_smem_selector<
                             GMMA::Major::K, Half, decltype(get<0>(TileShape{})), decltype(get<2>(TileShape{})), false>());
  using SmemAtomB = decltype(cutlass::gemm::collective::detail::rs_smem_selector<
                             GMMA::Major::K, Half, decltype(get<1>(TileShape{})), decltype(get<2>(TileShape{})), false>());
  // CUTLASS's builder's count, a stage's a_tiles tiles of A counted as one tile a_tiles times taller.
  using StageShape = Shape<Int<a_tiles * size<0>(TileShape{})>, decltype(get<1>(TileShape{})), decltype(get<2>(TileShape{}))>;
  static constexpr int kStages = cutlass::gemm::collective::detail::compute_stage_count_or_override<
      cutlass::gemm::collective::detail::sm90_smem_capacity_bytes, Half, Half, StageShape,
      carveout>(cutlass::gemm::collective::StageCountAutoCarveout<carveout>{});
  using Policy = cutlass::gemm::MainloopSm90TmaGmmaRmemAWarpSpecialized<kStages, Shape<_1, _1, _1>, KernelSchedule>;
  using Base = cutlass::gemm::collective::CollectiveMma<Policy, TileShape, Half, Stride, Half, Stride, TiledMma,
                                                        SM90_TMA_LOAD, SmemAtomA, Copy_Atom<AutoVectorizingCopy, Half>,
                                                        cute::identity, SM90_TMA_LOAD, SmemAtomB, void, cute::identity>;
};

// B's fragments of every stage as the thread's warpgroup reads them (wgmma takes B from shared memory).
template <class TiledMma, class SmemB>
CUTLASS_DEVICE auto warpgroup_fragment_B(TiledMma const& tiled_mma, SmemB const& sB, int thread_idx) {
  constexpr int kWarpGroups = size(TiledMma{}) / cutlass::NumThreadsPerWarpGroup;
  const int warp_group = __shfl_sync(0xFFFFFFFF, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
  auto group_mma =
      tiled_mma.get_slice(make_layout(Int<kWarpGroups>{}, Int<cutlass::NumThreadsPerWarpGroup>{})(warp_group));
  return group_mma.make_fragment_B(group_mma.partition_B(sB));  // (MMA, MMA_N, MMA_K, PIPE)
}

template <class KernelSchedule, class TileShape, int carveout>
struct PrologueMainloop : RegisterAMainloop<KernelSchedule, TileShape, carveout>::Base {
  using Base = typename RegisterAMainloop<KernelSchedule, TileShape, carveout>::Base;
  using typename Base::MainloopPipeline;
  using typename Base::PipelineState;
  using typename Base::SmemLayoutA;
  using typename Base::SmemLayoutB;
  using typename Base::TensorStorage;
  using typename Base::TiledMma;
  static constexpr int kBlockK = size<2>(TileShape{});

  // The GEMM's arguments and the BN's: fp16 [C] each, C a multiple of the tile's 64.
  struct Arguments : Base::Arguments {
    const void* scale = nullptr;
    const void* shift = nullptr;
  };
  struct Params : Base::Params {
    const __half2* scale;  // pairs of input channels, as the fragments hold them
    const __half2* shift;
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& shape, Arguments const& args, void* workspace) {
    return {Base::to_underlying_arguments(shape, args, workspace), static_cast<const __half2*>(args.scale),
            static_cast<const __half2*>(args.shift)};
  }

  // relu(a * scale + shift) on one k-block of A in registers: the elements come in pairs of
  // neighbouring columns (wgmma's A fragment), each pair one half2 of the BN's coefficients,
  // `coef` holding them for the pairs of the first row block (the others have the same columns).
  template <class Frag, int kPairs>
  CUTLASS_DEVICE static void apply_bn(Frag&& a, const __half2 (&scale)[kPairs], const __half2 (&shift)[kPairs]) {
    static_assert(size<0>(Frag{}) == 2 * kPairs);
    CUTLASS_PRAGMA_UNROLL
    for (int m = 0; m < size<1>(a); ++m)
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kPairs; ++j) {
        __half2 v = __halves2half2(a(2 * j, m).to_half(), a(2 * j + 1, m).to_half());
        v = __hfma2_relu(v, scale[j], shift[j]);
        a(2 * j, m) = cutlass::half_t(__low2half(v));
        a(2 * j + 1, m) = cutlass::half_t(__high2half(v));
      }
  }

  // The consumer's loop (see the top of this file); the kernel calls it once per output tile, from
  // the first k-tile on (no split-K).
  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum, int k_tile_count,
                          int thread_idx, TensorStorage& shared_tensors, Params const& params) {
    Tensor sA = as_position_independent_swizzle_tensor(
        make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{}));  // (BLK_M, BLK_K, PIPE)
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});  // (BLK_N, BLK_K, PIPE)

    TiledMma tiled_mma;
    auto thread_mma = tiled_mma.get_thread_slice(thread_idx);

    Tensor tCrA = thread_mma.partition_fragment_A(sA(_, _, Int<0>{}));  // (MMA, MMA_M, MMA_K)
    Tensor tCrB = warpgroup_fragment_B(tiled_mma, sB, thread_idx);       // (MMA, MMA_N, MMA_K, PIPE)
    // Each A element's (row, column) in the tile, partitioned as the fragment is.
    Tensor tCcA = thread_mma.partition_A(make_identity_tensor(make_shape(size<0>(TileShape{}), Int<kBlockK>{})));

    auto copy_A = make_tiled_copy_A(typename Base::InternalSmemCopyAtomA{}, tiled_mma);
    auto thread_copy_A = copy_A.get_thread_slice(thread_idx);
    Tensor tCrA_copy = thread_copy_A.retile_D(tCrA);     // (CPY, CPY_M, CPY_K)
    Tensor tCsA_copy = thread_copy_A.partition_S(sA);    // (CPY, CPY_M, CPY_K, PIPE)
    constexpr int kBlocks = size<2>(tCrA);
    constexpr int kPairs = size<0>(tCrA) / 2;  // column pairs of a k-block, a row block

    tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
    warpgroup_fence_operand(accum);
    PipelineState release = smem_pipe_read;
    CUTLASS_PRAGMA_NO_UNROLL
    for (int k_tile = 0; k_tile < k_tile_count; ++k_tile) {
      // This k-tile's coefficients of the thread's columns, loaded while its stage may still land.
      __half2 scale[kBlocks][kPairs], shift[kBlocks][kPairs];
      CUTLASS_PRAGMA_UNROLL
      for (int kb = 0; kb < kBlocks; ++kb)
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < kPairs; ++j) {
          const int pair = (k_tile * kBlockK + get<1>(tCcA(2 * j, 0, kb))) / 2;
          scale[kb][j] = __ldg(params.scale + pair);
          shift[kb][j] = __ldg(params.shift + pair);
        }
      pipeline.consumer_wait(smem_pipe_read);
      const int stage = smem_pipe_read.index();
      CUTLASS_PRAGMA_UNROLL
      for (int kb = 0; kb < kBlocks; ++kb) {
        // A k-block's registers were last read by the wgmma kBlocks batches ago: at most
        // kBlocks - 1 still running frees them; before the last k-block, all of the previous
        // k-tile's wgmmas are done, and its stage goes back to the producer.
        warpgroup_wait<kBlocks - 1>();
        if (kb == kBlocks - 1 && k_tile > 0) {
          pipeline.consumer_release(release);
          ++release;
        }
        copy(copy_A, tCsA_copy(_, _, kb, stage), tCrA_copy(_, _, kb));
        apply_bn(tCrA(_, _, kb), scale[kb], shift[kb]);
        warpgroup_fence_operand(accum);
        warpgroup_arrive();
        cute::gemm(tiled_mma, tCrA(_, _, kb), tCrB(_, _, kb, stage), accum);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
        warpgroup_commit_batch();
        warpgroup_fence_operand(accum);
      }
      ++smem_pipe_read;
    }
    warpgroup_wait<0>();
    if (k_tile_count > 0) pipeline.consumer_release(release);
    warpgroup_fence_operand(accum);
  }

  // mma() has waited for its wgmmas and given back every stage it read.
  CUTLASS_DEVICE void mma_tail(MainloopPipeline, PipelineState, int) {}
};

}  // namespace trainer_kernels
