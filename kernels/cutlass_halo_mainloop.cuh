// The mainloop of a CUTLASS Hopper GEMM that is a 3x3 stride-1 convolution with a pad of 1, NHWC, as
// kernels/cutlass_taps_mainloop.cuh's, but loading x a third as often and the filter once.
//
// Why: the taps mainloop loads, for every tile of 128 pixels, x at each of the 9 taps (9 boxes of 16
// KB) and the filter's 9 tiles (8 KB each) again: 216 KB from L2 per tile at 64 channels, and its
// kernel runs at layer1 no faster than cuDNN's (52.7 against 51.2 µs, H200, batch 256). Here:
//   - a stage holds one box of x for the tile's rows and one row above and below it (the halo: 6
//     rows of 32 at layer1), at one column shift s - 1; the taps (r, s) for r = 0, 1, 2 are the
//     same box read r image rows further on. A row is W pixels of 128 bytes, W a multiple of 8, so
//     each of those views starts on a whole 1 KB swizzle pattern and is the 128 x 64 tile wgmma
//     reads (the TMA writes the box in the 128-byte swizzle, as a 2-D box of its rows would land);
//   - the filter (9 tiles of 64 x 64 at 64 channels, 72 KB) is loaded once per CTA, with its first
//     stage, and stays in shared memory: a CTA keeps one column of output channels for all its tiles.
// So a tile reads 3 boxes of 24 KB: 72 KB in place of 216. Only for 64 input channels (layer1: the
// filter of 128 would not leave room for the stages).
//
// The producer: per 64 channels and column shift, one box into the next stage. The consumer: per
// stage, the 3 taps' 4 k-blocks of 16 (12 wgmmas) in one batch; a stage goes back once the next
// stage's batch is issued and the stage's own is done.
#pragma once

#include "cute/tensor.hpp"  // first: the atoms below need its algorithms declared
#include "cute/arch/copy_sm90_tma.hpp"
#include "cute/atom/copy_traits_sm90_tma.hpp"
#include "cutlass/gemm/collective/builders/sm90_common.inl"
#include "cutlass/pipeline/pipeline.hpp"

namespace trainer_kernels {

using namespace cute;

// Own: CUTLASS's SS mainloop (the collective builder's) for the GEMM [M, 9C] by [9C, K], its TMA
// descriptor of the filter and its MMA reused; carveout: the shared memory the kernel keeps for the
// epilogue.
template <class Own, int carveout>
struct HaloMainloop : Own {
  using Base = Own;
  static constexpr int kBlockM = size<0>(typename Base::TileShape{});
  static constexpr int kBlockN = size<1>(typename Base::TileShape{});
  static constexpr int kBlockK = size<2>(typename Base::TileShape{});
  static constexpr int kChannels = 64;                  // the conv's input channels: one k-block of 64
  static constexpr int kFilterTiles = 9 * kChannels / kBlockK;
  static constexpr int kTapsPerStage = 3;               // r = 0, 1, 2 from one box
  static constexpr int kMaxBoxRows = 192;               // 128 pixels and two image rows of up to 32
  static constexpr int kBoxElems = kMaxBoxRows * kBlockK;
  using Tile = Shape<Int<kBlockM>, Int<kBlockK>>;
  using SmemLayoutTileA = decltype(tile_to_shape(typename Base::SmemLayoutAtomA{}, Tile{}));
  using SmemLayoutFilter = decltype(tile_to_shape(typename Base::SmemLayoutAtomB{},
                                                  make_shape(Int<kBlockN>{}, Int<kBlockK>{}, Int<kFilterTiles>{})));
  static constexpr int kFilterBytes = kFilterTiles * kBlockN * kBlockK * 2;
  // What is left after the epilogue's share, the filter and the pipeline's barriers (16 bytes a
  // stage) and 1 KB for alignment, in boxes.
  static constexpr int kStages = (cutlass::gemm::collective::detail::sm90_smem_capacity_bytes - carveout -
                                  kFilterBytes - 1024) / (kBoxElems * 2 + 16);
  static_assert(kStages >= 2, "room for two stages of x");
  using MainloopPipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = cutlass::PipelineState<kStages>;
  using PipelineStorage = typename MainloopPipeline::SharedStorage;
  struct TensorStorage : cute::aligned_struct<1024, _0> {
    cute::array_aligned<cutlass::half_t, kStages * kBoxElems, 1024> smem_A;
    cute::array_aligned<cutlass::half_t, cute::cosize_v<SmemLayoutFilter>, 1024> smem_B;
  };

  // The GEMM's (A's pointer stands for x: CUTLASS's A descriptor is made, never loaded), and x's
  // 4-D box descriptor (64 channels, W columns, 128 / W + 2 rows, 1 image) and shape.
  struct Arguments : Base::Arguments {
    cute::TmaDescriptor halo{};
    int h = 0, w = 0;
  };
  struct Params : Base::Params {
    cute::TmaDescriptor halo;
    int h, w;
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& shape, Arguments const& args, void* workspace) {
    Params p{Base::to_underlying_arguments(shape, args, workspace), args.halo, args.h, args.w};
    p.tma_transaction_bytes = uint32_t(kBlockM + 2 * args.w) * kBlockK * 2;  // a stage: one box
    return p;
  }

  CUTLASS_DEVICE static void prefetch_tma_descriptors(Params const& p) {
    Base::prefetch_tma_descriptors(p);
    cute::prefetch_tma_descriptor(&p.halo);
  }

  bool filter_loaded = false;  // the producer's: the filter goes with the CTA's first stage

  // The producer: each stage's box of x (its 64 channels, column shift s - 1, from the row above
  // the tile's first), into the next free stage; before the first, the filter, counted in the
  // first stage's bytes. The tile's pixels start at a whole row: the launcher checks the shape.
  template <class TensorA, class TensorB, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(Params const& p, MainloopPipeline pipeline, PipelineState write,
                           cute::tuple<TensorA, TensorB> const& inputs, BlockCoord const& blk, KTileIterator k_iter,
                           int stages, int, uint32_t, TensorStorage& st) {
    if (!cute::elect_one_sync()) return;
    auto [m, n, k, l] = blk;
    const int image = p.h * p.w, pixel0 = int(m) * kBlockM;
    const int img = pixel0 / image, h0 = pixel0 % image / p.w;
    const uint64_t hint = uint64_t(TMA::CacheHintSm90::EVICT_NORMAL);
    CUTLASS_PRAGMA_NO_UNROLL
    for (; stages > 0; --stages) {
      pipeline.producer_acquire(write);
      auto* barrier = pipeline.producer_get_barrier(write);
      if (!filter_loaded) {
        pipeline.producer_expect_transaction(write, kFilterBytes);
        Tensor sB = make_tensor(make_smem_ptr(st.smem_B.data()), SmemLayoutFilter{});
        auto tma_b = p.tma_load_b.get_slice(0);
        Tensor tBgB = tma_b.partition_S(get<1>(inputs)(_, _, n, _, l));
        Tensor tBsB = tma_b.partition_D(sB);
        CUTLASS_PRAGMA_UNROLL
        for (int t = 0; t < kFilterTiles; ++t) copy(p.tma_load_b.with(*barrier, uint16_t(0)), tBgB(_, _, _, t), tBsB(_, _, _, t));
        filter_loaded = true;
      }
      const int step = *k_iter, s = step % kTapsPerStage, c0 = step / kTapsPerStage * kBlockK;
      SM90_TMA_LOAD_4D::copy(&p.halo, barrier, hint, st.smem_A.data() + write.index() * kBoxElems, c0, s - 1,
                             h0 - 1, img);
      ++k_iter;
      ++write;
    }
  }

  CUTLASS_DEVICE void load_tail(MainloopPipeline pipeline, PipelineState write) {
    if (cute::elect_one_sync()) pipeline.producer_tail(write);
  }

  // The consumer's loop over a tile's stages (3 per 64 channels): from each, the taps (r, s) of its
  // column shift s, r image rows into the box, by the filter's tile of that tap.
  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState read, FrgTensorC& accum, int stages, int thread_idx,
                          TensorStorage& st, Params const& p) {
    using TiledMma = typename Base::TiledMma;
    constexpr int kWarpGroups = size(TiledMma{}) / cutlass::NumThreadsPerWarpGroup;
    const int warp_group = __shfl_sync(0xFFFFFFFF, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    TiledMma tiled_mma;
    auto thread_mma =
        tiled_mma.get_slice(make_layout(Int<kWarpGroups>{}, Int<cutlass::NumThreadsPerWarpGroup>{})(warp_group));
    Tensor sB = make_tensor(make_smem_ptr(st.smem_B.data()), SmemLayoutFilter{});
    Tensor tCrB = thread_mma.make_fragment_B(thread_mma.partition_B(sB));  // (MMA, MMA_N, MMA_K, TILES)
    const int row_elems = p.w * kBlockK;  // one image row of the box

    tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
    warpgroup_fence_operand(accum);
    PipelineState release = read;
    CUTLASS_PRAGMA_NO_UNROLL
    for (int step = 0; step < stages; ++step) {
      pipeline.consumer_wait(read);
      const cutlass::half_t* box = st.smem_A.data() + read.index() * kBoxElems;
      const int s = step % kTapsPerStage, chunk = step / kTapsPerStage;
      warpgroup_fence_operand(accum);
      warpgroup_arrive();
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < kTapsPerStage; ++r) {
        Tensor sA = make_tensor(make_smem_ptr(box + r * row_elems), SmemLayoutTileA{});
        Tensor tCrA = thread_mma.make_fragment_A(thread_mma.partition_A(sA));  // (MMA, MMA_M, MMA_K)
        const int tile = (3 * r + s) * (kChannels / kBlockK) + chunk;
        CUTLASS_PRAGMA_UNROLL
        for (int kb = 0; kb < size<2>(tCrA); ++kb) {
          cute::gemm(tiled_mma, tCrA(_, _, kb), tCrB(_, _, kb, tile), accum);
          tiled_mma.accumulate_ = GMMA::ScaleOut::One;
        }
      }
      warpgroup_commit_batch();
      warpgroup_wait<1>();  // the previous stage's batch done: give that stage back
      warpgroup_fence_operand(accum);
      if (step > 0) {
        pipeline.consumer_release(release);
        ++release;
      }
      ++read;
    }
    warpgroup_wait<0>();
    if (stages > 0) pipeline.consumer_release(release);
    warpgroup_fence_operand(accum);
  }

  // mma() has waited for its wgmmas and given back every stage it read.
  CUTLASS_DEVICE void mma_tail(MainloopPipeline, PipelineState, int) {}
};

}  // namespace trainer_kernels
