// The mainloop of a CUTLASS Hopper GEMM that is the data gradient of a 3x3 stride-2 conv with a pad
// of 1, by parity (kernels/conv3x3_parity.h): the GEMM's rows are the four phases' pixels one after
// another, each phase's the pixels of dy [n, h, w] in order, so its rows of tiles fall in one phase
// each (the launcher checks that a phase is whole tiles). A tile of phase f has
// parity_taps(f) * C / 64 k-tiles: dy at each of the phase's taps, one 4-D TMA box (64 channels,
// w columns, 128 / w rows, 1 image; or whole images) at the tile's first row and column shifted by
// the tap's (dr, ds), the rows and columns past dy's edge filled with zeros by the TMA; B's k-tile
// the phases' filter's [c][tap][k] at the phase's taps. As kernels/cutlass_taps_mainloop.cuh does
// it for the stride-1 conv: only the producer changes, wgmma from shared memory and the stages are
// CUTLASS's.
//
// Why: cuDNN's strided data gradient with the BN sums (strided_dgrad_indexed, then dbn_stats) took
// 62, 76 and 104 µs at layers 4, 3 and 2 in session 38's batch-256 trace, where its stride-1 data
// gradients of the same FLOPs take 37-67 (docs/speed.md).
#pragma once

#include "cute/arch/copy_sm90_tma.hpp"
#include "cute/atom/copy_traits_sm90_tma.hpp"
#include "cute/tensor.hpp"
#include "kernels/conv3x3_parity.h"

namespace trainer_kernels {

using namespace cute;

// Own: CUTLASS's mainloop (the collective builder's) for the GEMM [4 M, 9K] by [9K, C].
template <class Own>
struct PhasesMainloop : Own {
  using Base = Own;
  using typename Base::MainloopPipeline;
  using typename Base::PipelineState;
  using typename Base::TensorStorage;
  static constexpr int kBlockM = size<0>(typename Base::TileShape{});
  static constexpr int kBlockK = size<2>(typename Base::TileShape{});
  static constexpr int kTileElems = kBlockM * kBlockK;  // one stage's A, in halves
  static_assert(cute::cosize_v<typename Base::SmemLayoutA> == kTileElems * Base::DispatchPolicy::Stages,
                "A's stages one after another in shared memory");

  // The GEMM's arguments (A's pointer stands for dy: CUTLASS's A descriptor is made, never loaded),
  // dy's 4-D box descriptor (image_rows_descriptor) and shape, and the rows of tiles a phase.
  struct Arguments : Base::Arguments {
    cute::TmaDescriptor taps{};
    int h = 0, w = 0, c = 0;  // dy's rows, columns and channels
    int phase_tiles = 0;
  };
  struct Params : Base::Params {
    cute::TmaDescriptor taps;
    int h, w, c, phase_tiles;
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& shape, Arguments const& args, void* workspace) {
    return {Base::to_underlying_arguments(shape, args, workspace), args.taps, args.h, args.w, args.c, args.phase_tiles};
  }

  CUTLASS_DEVICE static void prefetch_tma_descriptors(Params const& p) {
    Base::prefetch_tma_descriptors(p);
    cute::prefetch_tma_descriptor(&p.taps);
  }

  // The k-tiles of row of tiles mt: its phase's taps, each C / 64 of them.
  CUTLASS_DEVICE static int k_tiles_of(Params const& p, int mt) {
    return parity_taps(mt / p.phase_tiles) * (p.c / kBlockK);
  }

  // The producer: each k-tile's box of dy at its tap and the filter's tile, into the next free stage
  // (no cluster).
  template <class TensorA, class TensorB, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(Params const& p, MainloopPipeline pipeline, PipelineState write,
                           cute::tuple<TensorA, TensorB> const& inputs, BlockCoord const& blk, KTileIterator,
                           int k_tile_count, int, uint32_t, TensorStorage& st) {
    if (!cute::elect_one_sync()) return;
    Tensor sB = make_tensor(make_smem_ptr(st.smem_B.data()), typename Base::SmemLayoutB{});
    auto tma_b = p.tma_load_b.get_slice(0);
    auto [m, n, k, l] = blk;
    Tensor tBgB = tma_b.partition_S(get<1>(inputs)(_, _, n, _, l));
    Tensor tBsB = tma_b.partition_D(sB);
    const int phase = int(m) / p.phase_tiles;
    const int image = p.h * p.w, pixel0 = (int(m) - phase * p.phase_tiles) * kBlockM;
    const int img = pixel0 / image, h0 = pixel0 % image / p.w;
    const int channel_tiles = p.c / kBlockK, first = parity_first_tap(phase) * channel_tiles;
    const uint64_t hint = uint64_t(TMA::CacheHintSm90::EVICT_NORMAL);
    CUTLASS_PRAGMA_NO_UNROLL
    for (int kt = 0; kt < k_tile_count; ++kt) {
      pipeline.producer_acquire(write);
      auto* barrier = pipeline.producer_get_barrier(write);
      const ParityTap tap = parity_tap(phase, kt / channel_tiles);
      SM90_TMA_LOAD_4D::copy(&p.taps, barrier, hint, st.smem_A.data() + write.index() * kTileElems,
                             kt % channel_tiles * kBlockK, tap.ds, h0 + tap.dr, img);
      copy(p.tma_load_b.with(*barrier, uint16_t(0)), tBgB(_, _, _, first + kt), tBsB(_, _, _, write.index()));
      ++write;
    }
  }
};

}  // namespace trainer_kernels
