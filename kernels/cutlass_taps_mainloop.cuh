// The mainloop of a CUTLASS Hopper GEMM that is a 3x3 stride-1 convolution with a pad of 1, NHWC: the
// implicit GEMM y[M pixels, K] = A[M, 9C] w[K, 9C]^T, A never stored. Each k-tile of A is x at one
// tap (r, s) and 64 of its channels, for the tile's 128 pixels (whole image rows): one 4-D TMA box
// (64 channels, W columns, 128 / W rows, 1 image; or whole images where one is under 128 pixels) at
// the tile's first row shifted by r - 1 and its first column by s - 1. The TMA fills the rows and
// columns the shift takes outside the image with zeros: the padding. B is the KRSC filter read as
// [K, 9C], as a 1x1 conv's: k-tile t is tap t / (C / 64), channels 64 (t % (C / 64)) on.
//
// Why: cuDNN's 3x3 convs at layer1's 64 channels run at 380 TFLOPS where the same FLOPs at layer4's
// 512 take 610 (H200, batch 256, bench/results/levers-session28-nvidia-h200-2026-11-30.md), and
// CUTLASS's own implicit GEMM runs slower than cuDNN's. The box lands in shared memory as a 128 x 64
// tile of 128-byte rows swizzled as a 2-D box would, the layout CUTLASS's mainloop reads: only the
// producer changes, the rest (wgmma from shared memory, the stages) is CUTLASS's. In the kernel lab
// only (bench/kernel_lab/cutlass_taps_conv.h).
#pragma once

#include "cute/arch/copy_sm90_tma.hpp"
#include "cute/atom/copy_traits_sm90_tma.hpp"
#include "cute/tensor.hpp"

namespace trainer_kernels {

using namespace cute;

// Own: CUTLASS's mainloop (the collective builder's) for the GEMM [M, 9C] by [9C, K].
template <class Own>
struct TapsMainloop : Own {
  using Base = Own;
  using typename Base::MainloopPipeline;
  using typename Base::PipelineState;
  using typename Base::SmemLayoutA;
  using typename Base::SmemLayoutB;
  using typename Base::TensorStorage;
  static constexpr int kBlockM = size<0>(typename Base::TileShape{});
  static constexpr int kBlockK = size<2>(typename Base::TileShape{});
  static constexpr int kTileElems = kBlockM * kBlockK;  // one stage's A, in halves
  static_assert(cute::cosize_v<SmemLayoutA> == kTileElems * Base::DispatchPolicy::Stages,
                "A's stages one after another in shared memory");

  // The GEMM's arguments (A's pointer stands for x: CUTLASS's A descriptor is made, never loaded),
  // and x's 4-D box descriptor (taps_descriptor() below) and shape.
  struct Arguments : Base::Arguments {
    cute::TmaDescriptor taps{};
    int h = 0, w = 0, c = 0;
  };
  struct Params : Base::Params {
    cute::TmaDescriptor taps;
    int h, w, c;
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& shape, Arguments const& args, void* workspace) {
    return {Base::to_underlying_arguments(shape, args, workspace), args.taps, args.h, args.w, args.c};
  }

  CUTLASS_DEVICE static void prefetch_tma_descriptors(Params const& p) {
    Base::prefetch_tma_descriptors(p);
    cute::prefetch_tma_descriptor(&p.taps);
  }

  // The producer: each k-tile's box of x at its tap and w's tile, into the next free stage (no
  // cluster). The tile's pixels start at a whole row (or image): the launcher checks the shape.
  template <class TensorA, class TensorB, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(Params const& p, MainloopPipeline pipeline, PipelineState write,
                           cute::tuple<TensorA, TensorB> const& inputs, BlockCoord const& blk, KTileIterator k_iter,
                           int k_tile_count, int, uint32_t, TensorStorage& st) {
    if (!cute::elect_one_sync()) return;
    Tensor sB = make_tensor(make_smem_ptr(st.smem_B.data()), SmemLayoutB{});
    auto tma_b = p.tma_load_b.get_slice(0);
    auto [m, n, k, l] = blk;
    Tensor tBgB = tma_b.partition_S(get<1>(inputs)(_, _, n, _, l));
    Tensor tBsB = tma_b.partition_D(sB);
    const int image = p.h * p.w, pixel0 = int(m) * kBlockM;
    const int img = pixel0 / image, h0 = pixel0 % image / p.w;
    const int channel_tiles = p.c / kBlockK;
    const uint64_t hint = uint64_t(TMA::CacheHintSm90::EVICT_NORMAL);
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tile_count > 0; --k_tile_count) {
      pipeline.producer_acquire(write);
      auto* barrier = pipeline.producer_get_barrier(write);
      const int stage = write.index(), kt = *k_iter;
      const int tap = kt / channel_tiles, c0 = kt % channel_tiles * kBlockK;
      SM90_TMA_LOAD_4D::copy(&p.taps, barrier, hint, st.smem_A.data() + stage * kTileElems, c0, tap % 3 - 1,
                             h0 + tap / 3 - 1, img);
      copy(p.tma_load_b.with(*barrier, uint16_t(0)), tBgB(_, _, _, kt), tBsB(_, _, _, stage));
      ++k_iter;
      ++write;
    }
  }
};

}  // namespace trainer_kernels
