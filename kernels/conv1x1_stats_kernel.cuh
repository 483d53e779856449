// A 1x1 conv with its output's BN statistics as a persistent kernel of ours, built from CUTLASS's
// pieces (TMA loads, the stage pipeline, wgmma) but with its own tile loop and epilogue.
//
// Why: CUTLASS's epilogue reduces each tile's statistics across its warps (shared memory, barriers)
// before the next tile's mainloop, and writes a row of partial sums per row of tiles: at layer1's
// 4,096 tiles that costs more than the GEMM. Here each CTA keeps one column of tiles (TileN output
// channels) and walks down its rows of pixels, so a thread's accumulators fall on the same channels
// in every tile: it adds each tile's values and squares into registers, and reduces across lanes
// and warps once, at its end, into one row of partial sums (rows: the CTAs of a column, at most one
// per SM). bn_finalize_partials (kernels/batchnorm.h) adds the rows up.
//
// Roles (384 threads, one CTA an SM): warp 0 issues the TMA loads of A and B tile after tile,
// stages ahead; the two consumer warpgroups each multiply 64 of the tile's 128 rows, or ping-pong
// each all of every other tile (CUTLASS's mainloop, or with the previous BN the prologue's,
// kernels/cutlass_prologue_mainloop.cuh), then add y's statistics from their accumulators and store
// y in fp16 through shared memory, whole rows at once. Launched by kernels/conv1x1_stats.cu.
#pragma once

#include <cuda_fp16.h>

#include <type_traits>

#include "cutlass/arch/barrier.h"
#include "cutlass/arch/reg_reconfig.h"
#include "cutlass/pipeline/pipeline.hpp"
#include "kernels/cutlass_prologue_mainloop.cuh"

namespace trainer_kernels {

template <int TileM, int TileN, bool Prologue, bool PingPong>
struct ResidentConvStats {
  using Tile = Shape<Int<TileM>, Int<TileN>, _64>;
  static constexpr int kThreads = 384;
  static constexpr int kConsumerThreads = 256;
  static constexpr int kConsumerWarps = kConsumerThreads / 32;
  // Cooperative: both consumer warpgroups on each tile, 64 rows each. PingPong: each warpgroup
  // on every other tile of the CTA, all its rows, so that one stores while the other multiplies.
  static constexpr int kGroupsPerTile = PingPong ? 1 : 2;
  static constexpr int kTileThreads = kGroupsPerTile * cutlass::NumThreadsPerWarpGroup;
  static constexpr int kStagingTiles = PingPong ? 2 : 1;
  using Schedule = std::conditional_t<PingPong, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                                      cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
  // Each consumer warp's column sums, then its sums of squares, for the reduction at the end.
  static constexpr int kStatsBytes = 2 * kConsumerWarps * TileN * int(sizeof(float));
  // y's tile in fp16 on its way out, each row padded by 16 bytes: the accumulators' lanes (8 rows
  // by 4 column pairs) then write 32 different banks.
  static constexpr int kRowPitch = TileN + 8;
  static constexpr int kStagingBytes = kStagingTiles * TileM * kRowPitch * 2;
  static constexpr int kCarveout = kStatsBytes + kStagingBytes + 64;  // 64: the turns' barriers
  // Without a prologue CUTLASS's own mainloop (wgmma reads A from shared memory).
  using OwnMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cutlass::half_t, cutlass::layout::RowMajor, 8,
      cutlass::half_t, cutlass::layout::ColumnMajor, 8, float, Tile, Shape<_1, _1, _1>,
      cutlass::gemm::collective::StageCountAutoCarveout<kCarveout>, Schedule>::CollectiveOp;
  using Mainloop = std::conditional_t<Prologue, PrologueMainloop<Schedule, Tile, kCarveout>, OwnMainloop>;
  using TiledMma = typename Mainloop::TiledMma;
  using Pipeline = typename Mainloop::MainloopPipeline;
  using PipeState = typename Mainloop::PipelineState;
  // Ping-pong: the warpgroups' mainloops by turns. Not only for speed: a warpgroup that started its
  // tile while the other still read the stages could see a stage's barrier a phase early (mbarrier
  // waits test a phase's parity) once a tile has more k-tiles than there are stages.
  using TurnBarrier = cutlass::OrderedSequenceBarrier<1, 2>;

  struct SharedStorage {
    typename Mainloop::TensorStorage tensors;
    typename Mainloop::PipelineStorage pipeline;
    alignas(16) typename TurnBarrier::SharedStorage turns;
    float stats[2][kConsumerWarps][TileN];
    alignas(16) __half y[kStagingTiles][TileM][kRowPitch];
  };

  struct Params {
    typename Mainloop::Params mainloop;
    int m, k, c;
    cutlass::half_t* y;       // [m, k]
    float* partials;          // [2][ctas_per_column][k], or nullptr: y alone
    int n_tiles;              // columns of tiles (k / TileN)
    int m_tiles;              // rows of tiles (m / TileM)
    int ctas_per_column;      // the grid is n_tiles x ctas_per_column
  };
};

// Named barriers (0 is __syncthreads'): all consumers, and each tile's threads (ping-pong: each
// warpgroup's own).
constexpr int kConsumersBarrier = 1;
constexpr int kTileBarrier = 2;

template <class K>
__global__ void __launch_bounds__(K::kThreads, 1) resident_conv_stats(const __grid_constant__ typename K::Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900
  extern __shared__ char smem_raw[];
  auto& ss = *reinterpret_cast<typename K::SharedStorage*>(smem_raw);
  constexpr int TileM = size<0>(typename K::Tile{});
  constexpr int TileN = size<1>(typename K::Tile{});
  const int warp_group = threadIdx.x / cutlass::NumThreadsPerWarpGroup;
  const int warp = threadIdx.x / 32;
  if (threadIdx.x == 0) K::Mainloop::prefetch_tma_descriptors(p.mainloop);

  typename K::Pipeline::Params pp;
  pp.role = warp == 0         ? K::Pipeline::ThreadCategory::Producer
            : warp_group == 0 ? K::Pipeline::ThreadCategory::NonParticipant
                              : K::Pipeline::ThreadCategory::Consumer;
  pp.is_leader = threadIdx.x % cutlass::NumThreadsPerWarpGroup == 0;
  pp.num_consumers = K::kTileThreads;  // the threads that read each stage
  pp.transaction_bytes = p.mainloop.tma_transaction_bytes;
  typename K::Pipeline pipeline(ss.pipeline, pp, Shape<_1, _1, _1>{});
  typename K::TurnBarrier::Params tp;
  tp.group_id = warp_group == 2 ? 1 : 0;
  tp.group_size = cutlass::NumThreadsPerWarpGroup;
  typename K::TurnBarrier turns(ss.turns, tp);
  __syncthreads();  // the barriers initialised before anyone waits on them

  typename K::Mainloop mainloop;
  auto inputs = mainloop.load_init(make_shape(p.m, p.k, p.c, 1), p.mainloop);
  const int column = blockIdx.x % p.n_tiles;  // this CTA's column of tiles
  const int first = blockIdx.x / p.n_tiles;   // its first row of tiles, then every ctas_per_column-th
  const int k_tiles = p.c / size<2>(typename K::Tile{});

  if (warp_group == 0) {
    cutlass::arch::warpgroup_reg_dealloc<40>();
    if (warp != 0) return;
    typename K::PipeState write = cutlass::make_producer_start_state<typename K::Pipeline>();
    for (int mt = first; mt < p.m_tiles; mt += p.ctas_per_column) {
      auto k_iter = make_coord_iterator(shape<3>(get<0>(inputs)));
      mainloop.load(p.mainloop, pipeline, write, inputs, make_coord(mt, column, _, 0), k_iter, k_tiles,
                    threadIdx.x % 32, 0, ss.tensors);
      write.advance(k_tiles);
    }
    mainloop.load_tail(pipeline, write);
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<232>();
  const int t = threadIdx.x - cutlass::NumThreadsPerWarpGroup;  // 0..255
  const int group = K::kGroupsPerTile == 1 ? t / cutlass::NumThreadsPerWarpGroup : 0;  // ping-pong: whose tiles
  const int tt = t % K::kTileThreads;  // the thread within its tile
  typename K::TiledMma tiled_mma;
  auto thread_mma = tiled_mma.get_thread_slice(tt);
  // Each accumulator's (row, column) in the tile; a thread's columns are the same in every tile.
  Tensor cC = thread_mma.partition_C(make_identity_tensor(make_shape(Int<TileM>{}, Int<TileN>{})));
  Tensor accum = partition_fragment_C(tiled_mma, make_shape(Int<TileM>{}, Int<TileN>{}));
  // wgmma's accumulators: values (2 neighbouring columns, 2 rows 8 apart, TileN / 8 groups of 8
  // columns) by row blocks: a thread holds 2 * TileN / 8 columns, its statistics one slot each.
  static_assert(size<0>(accum) == TileN / 2 && size<2>(accum) == 1, "not wgmma's m64nNk16 accumulator layout");
  constexpr int kGroups8 = TileN / 8, kSlots = 2 * kGroups8;
  auto value = [&](int v0, int v1, int v2, int m) -> float& {
    return accum(make_coord(make_coord(v0, v1, v2), m, 0));
  };
  auto slot_column = [&](int v0, int v2) { return get<1>(cC(make_coord(make_coord(v0, 0, v2), 0, 0))); };
  float sum[kSlots], sqsum[kSlots];
  CUTLASS_PRAGMA_UNROLL
  for (int s = 0; s < kSlots; ++s) sum[s] = sqsum[s] = 0.f;
  const bool stats = p.partials != nullptr;
  const int n0 = column * TileN;
  __half(*staged)[K::kRowPitch] = ss.y[group];

  typename K::PipeState read;
  read.advance(group * k_tiles);  // ping-pong: the second warpgroup starts at the CTA's second tile
  for (int mt = first + group * p.ctas_per_column; mt < p.m_tiles; mt += p.ctas_per_column * (2 / K::kGroupsPerTile)) {
    if constexpr (K::kGroupsPerTile == 1) turns.wait();
    mainloop.mma(pipeline, read, accum, k_tiles, tt, ss.tensors, p.mainloop);
    if constexpr (K::kGroupsPerTile == 1) turns.arrive();
    mainloop.mma_tail(pipeline, read, k_tiles);  // the wgmmas done, the last stages given back
    read.advance(k_tiles * (2 / K::kGroupsPerTile));  // its own tile, and ping-pong: the other's
    // The statistics of the fp32 accumulators; y in fp16 through shared memory, the neighbouring
    // columns as one half2, then out in whole rows of 16-byte chunks (whole sectors, not the
    // fragments' 16-byte pieces).
    cutlass::arch::NamedBarrier::sync(K::kTileThreads, kTileBarrier + group);  // the last tile's read
    CUTLASS_PRAGMA_UNROLL
    for (int m = 0; m < size<1>(accum); ++m)
      CUTLASS_PRAGMA_UNROLL
      for (int v2 = 0; v2 < kGroups8; ++v2)
        CUTLASS_PRAGMA_UNROLL
        for (int v1 = 0; v1 < 2; ++v1) {
          const float a = value(0, v1, v2, m), b = value(1, v1, v2, m);
          const auto rc = cC(make_coord(make_coord(0, v1, v2), m, 0));
          *reinterpret_cast<__half2*>(&staged[get<0>(rc)][get<1>(rc)]) = __floats2half2_rn(a, b);
          if (stats) {
            sum[2 * v2] += a;
            sum[2 * v2 + 1] += b;
            sqsum[2 * v2] += a * a;
            sqsum[2 * v2 + 1] += b * b;
          }
        }
    cutlass::arch::NamedBarrier::sync(K::kTileThreads, kTileBarrier + group);
    constexpr int kChunks = TileN / 8;  // 16-byte chunks a row
    cutlass::half_t* y = p.y + int64_t(mt) * TileM * p.k + n0;
    CUTLASS_PRAGMA_UNROLL
    for (int c = tt; c < TileM * kChunks; c += K::kTileThreads) {
      const int row = c / kChunks, col = c % kChunks * 8;
      *reinterpret_cast<uint4*>(y + int64_t(row) * p.k + col) = *reinterpret_cast<const uint4*>(&staged[row][col]);
    }
  }
  if (!stats) return;

  // Across the lanes that hold the same columns (those of one lane % 4), then across the warps:
  // after the shuffles lanes 0-3 hold their warp's sums, each of its own columns.
  CUTLASS_PRAGMA_UNROLL
  for (int s = 0; s < kSlots; ++s) {
    CUTLASS_PRAGMA_UNROLL
    for (int lanes = 4; lanes < 32; lanes *= 2) {
      sum[s] += __shfl_xor_sync(0xFFFFFFFF, sum[s], lanes);
      sqsum[s] += __shfl_xor_sync(0xFFFFFFFF, sqsum[s], lanes);
    }
  }
  const int cw = t / 32, lane = t % 32;
  if (lane < 4) {
    CUTLASS_PRAGMA_UNROLL
    for (int v2 = 0; v2 < kGroups8; ++v2)
      CUTLASS_PRAGMA_UNROLL
      for (int v0 = 0; v0 < 2; ++v0) {
        ss.stats[0][cw][slot_column(v0, v2)] = sum[2 * v2 + v0];
        ss.stats[1][cw][slot_column(v0, v2)] = sqsum[2 * v2 + v0];
      }
  }
  cutlass::arch::NamedBarrier::sync(K::kConsumerThreads, kConsumersBarrier);
  if (t < 2 * TileN) {
    const int which = t / TileN, col = t % TileN;
    float total = 0.f;
    for (int w = 0; w < K::kConsumerWarps; ++w) total += ss.stats[which][w][col];
    p.partials[(int64_t(which) * p.ctas_per_column + first) * p.k + n0 + col] = total;
  }
#endif
}

}  // namespace trainer_kernels
