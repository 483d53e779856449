// A 1x1 conv as a persistent kernel of ours, built from CUTLASS's pieces (TMA loads, the stage
// pipeline, wgmma) but with its own tile loop and epilogue, which takes BN sums of what it writes.
//
// Why: CUTLASS's epilogue reduces each tile's statistics across its warps (shared memory, barriers)
// before the next tile's mainloop, and writes a row of partial sums per row of tiles: at layer1's
// 4,096 tiles that costs more than the GEMM. Here each CTA keeps one column of tiles (TileN output
// channels) and walks down its rows of pixels, so a thread's sums fall on the same channels in
// every tile: it adds each tile's into registers, and reduces across lanes and warps once, at its
// end, into one row of partial sums (rows: the CTAs of a column, at most one per SM). A finalize
// kernel adds the rows up (kernels/batchnorm.h), or, given the BN (kernels/conv1x1_finalize.h), the
// last CTA of the column to write its row does (finalize_column; the forward and conv3's data
// gradient: not the join's, where it measured slower).
//
// Roles (384 threads, one CTA an SM): warp 0 issues the TMA loads of A and B (and the join's
// shortcut) tile after tile,
// stages ahead; the two consumer warpgroups each multiply 64 of the tile's 128 rows, or ping-pong
// each all of every other tile (CUTLASS's mainloop, or with the previous BN the prologue's,
// kernels/cutlass_prologue_mainloop.cuh, or with the previous join kernels/cutlass_join_mainloop.cuh), then put the tile in fp16 in shared memory and hand it to
// the epilogue, which writes it out in whole rows (kernels/conv1x1_epilogues.cuh):
//   - StatsEpilogue (the forward, kernels/conv1x1_stats.h): y, and y's statistics, added from the
//     fp32 accumulators;
//   - BnGradEpilogue (a data gradient, kernels/conv1x1_dgrad_join.h and conv1x1_dgrad_bn.h): the
//     BN + ReLU backward it feeds: dz (masked; for a join with the shortcut's part added) and the
//     sums of dz and dz * xhat the BN backward needs.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cutlass/arch/barrier.h"
#include "cutlass/arch/reg_reconfig.h"
#include "cutlass/pipeline/pipeline.hpp"
#include "kernels/chained_launch.cuh"
#include "kernels/conv1x1_epilogues.cuh"
#include "kernels/cutlass_halo_mainloop.cuh"
#include "kernels/cutlass_join_mainloop.cuh"
#include "kernels/cutlass_paired_mainloop.cuh"
#include "kernels/cutlass_phases_mainloop.cuh"
#include "kernels/cutlass_prologue_mainloop.cuh"
#include "kernels/cutlass_taps_mainloop.cuh"

namespace trainer_kernels {

// What the GEMM multiplies as its A operand: x as stored, relu(x * scale + shift) (the previous BN,
// kernels/cutlass_prologue_mainloop.cuh) or the previous block's join with an identity shortcut or a
// projection's (JoinBn: the shortcut through its BN; kernels/cutlass_join_mainloop.cuh), computed as x
// is read. The joins are two kernels: each a branch less inside its mainloop. Taps: a 3x3 stride-1
// conv's implicit GEMM, x loaded at each tap (kernels/cutlass_taps_mainloop.cuh; the kernel lab's);
// Halo: the same conv, x loaded once for 3 taps and the filter once a CTA (kernels/cutlass_halo_mainloop.cuh).
// Phases: a 3x3 stride-2 conv's data gradient by the parity of dx's pixels, its tiles of 1, 2 or 4
// taps (kernels/cutlass_phases_mainloop.cuh; cooperative only).
// JoinGrad: a data gradient's dy made from the join's dz and a3 as they are read (the join's BN
// backward apply), each stage holding both tiles (kernels/cutlass_paired_mainloop.cuh); only the
// consumer of kernels/conv1x1_dgrad_wgrad_kernel.cuh makes it.
enum class Operand { Stored, Bn, Join, JoinBn, Taps, Halo, Phases, JoinGrad };

// Shared memory a kernel variant keeps beside ResidentConv's own (the data gradient that also takes
// the weight gradient, kernels/conv1x1_dgrad_wgrad_kernel.cuh): none for the others, whose layout it
// leaves as it is.
template <int Bytes>
struct ExtraSmem {
  alignas(1024) char extra[Bytes];  // 1024: a swizzled wgmma operand may start there
};
template <>
struct ExtraSmem<0> {};

template <int TileM, int TileN, Operand A, bool PingPong, class Epilogue, int ExtraBytes = 0>
struct ResidentConv {
  using Tile = Shape<Int<TileM>, Int<TileN>, _64>;
  using Epi = Epilogue;
  static constexpr int kTileM = TileM, kTileN = TileN;
  static constexpr int kThreads = 384;
  static constexpr int kConsumerThreads = 256;
  static constexpr int kConsumerWarps = kConsumerThreads / 32;
  // Cooperative: both consumer warpgroups on each tile, 64 rows each. PingPong: each warpgroup
  // on every other tile of the CTA, all its rows, so that one stores while the other multiplies.
  static constexpr int kGroupsPerTile = PingPong ? 1 : 2;
  static constexpr int kTileThreads = kGroupsPerTile * cutlass::NumThreadsPerWarpGroup;
  static constexpr int kStagingTiles = PingPong ? 2 : 1;
  // Named barriers (CUTLASS's NamedBarrier adds its reserved ids to these): all consumers, and
  // each tile's threads (ping-pong: each warpgroup's own).
  static constexpr int kConsumersBarrier = 1;
  static constexpr int kTileBarrier = 2;
  using Schedule = std::conditional_t<PingPong, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                                      cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
  // Each consumer warp's column sums, for the reduction at the end.
  static constexpr int kStatsBytes = Epilogue::kSums * kConsumerWarps * TileN * int(sizeof(float));
  // The output tile in fp16 on its way out, each row padded by 16 bytes: the accumulators' lanes (8
  // rows by 4 column pairs) then write 32 different banks.
  static constexpr int kRowPitch = TileN + 8;
  static constexpr int kStagingBytes = kStagingTiles * TileM * kRowPitch * 2;
  // The tiles the epilogue reads beside its own (at least one, unused, where it reads none).
  static constexpr int kSideTensors = Epilogue::kSideTensors > 0 ? Epilogue::kSideTensors : 1;
  static constexpr int kSideRows = Epilogue::kSideTensors > 0 ? TileM : 1;
  static constexpr int kSideBytes = kStagingTiles * kSideTensors * kSideRows * TileN * 2;
  static constexpr int kCarveout = kStatsBytes + kStagingBytes + kSideBytes + ExtraBytes + 64;  // 64: the turns' barriers
  // Without a prologue CUTLASS's own mainloop (wgmma reads A from shared memory).
  using OwnMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cutlass::half_t, cutlass::layout::RowMajor, 8,
      cutlass::half_t, typename Epilogue::LayoutB, 8, float, Tile, Shape<_1, _1, _1>,
      cutlass::gemm::collective::StageCountAutoCarveout<kCarveout>, Schedule>::CollectiveOp;
  static constexpr Operand kOperand = A;
  static_assert(A == Operand::Stored || A == Operand::JoinGrad ||
                    std::is_same_v<typename Epilogue::LayoutB, cutlass::layout::ColumnMajor>,
                "the prologue mainloops and the taps read a K-major B");
  using PairedMainloop =
      PairedA<typename PairedStagesMainloop<Schedule, Tile, kCarveout, typename Epilogue::LayoutB>::Base>;
  using Mainloop = std::conditional_t<
      A == Operand::JoinGrad, PairedMainloop,
      std::conditional_t<
      A == Operand::Join || A == Operand::JoinBn, JoinMainloop<Schedule, Tile, kCarveout, A == Operand::JoinBn>,
      std::conditional_t<A == Operand::Bn, PrologueMainloop<Schedule, Tile, kCarveout>,
                         std::conditional_t<A == Operand::Taps, TapsMainloop<OwnMainloop>,
                                            std::conditional_t<A == Operand::Halo, HaloMainloop<OwnMainloop, kCarveout>,
                                                               std::conditional_t<A == Operand::Phases,
                                                                                  PhasesMainloop<OwnMainloop>,
                                                                                  OwnMainloop>>>>>>;
  // The phases' tiles differ in k-tiles: each warpgroup's stage count would differ from the other's.
  static_assert(A != Operand::Phases || !PingPong, "the phases run on the cooperative schedule");
  // The pipeline's stages a tile: a k-tile each, or with the halo one box of x for 3 taps.
  static constexpr int kTapsPerStage = A == Operand::Halo ? 3 : 1;
  using TiledMma = typename Mainloop::TiledMma;
  using Pipeline = typename Mainloop::MainloopPipeline;
  using PipeState = typename Mainloop::PipelineState;
  // Ping-pong: the warpgroups' mainloops by turns. Not only for speed: a warpgroup that started its
  // tile while the other still read the stages could see a stage's barrier a phase early (mbarrier
  // waits test a phase's parity) once a tile has more k-tiles than there are stages.
  using TurnBarrier = cutlass::OrderedSequenceBarrier<1, 2>;

  struct SharedStorage : ExtraSmem<ExtraBytes> {
    typename Mainloop::TensorStorage tensors;
    typename Mainloop::PipelineStorage pipeline;
    alignas(16) typename TurnBarrier::SharedStorage turns;
    float stats[Epilogue::kSums][kConsumerWarps][TileN];
    alignas(16) __half staged[kStagingTiles][TileM][kRowPitch];
    alignas(16) __half side[kStagingTiles][kSideTensors][kSideRows][TileN];
    int last_of_column;  // finalize_column: whether this CTA finalizes its column
  };

  struct Params {
    typename Mainloop::Params mainloop;
    int m, n, k;              // the GEMM's: [m, k] by [k, n]
    typename Epilogue::Params epilogue;
    int n_tiles;              // columns of tiles (n / TileN)
    int m_tiles;              // rows of tiles (m / TileM)
    int ctas_per_column;      // the grid is n_tiles x ctas_per_column
  };
};

// After the epilogue's finish(), where it finalizes the BN (kernels/conv1x1_finalize.h): each CTA
// counts itself in its column's counter once its row of partial sums is out; the last to arrive
// adds the column's rows up and hands each channel's totals to the epilogue's finalize_channel. It is
// all latency, on the step's critical path, so every load is issued before the first add: each
// thread 4 channels (16 bytes) of a row's sums, of every 16th row, in one round (up to 144 rows: the
// CTAs of a column are at most one an SM). Loaded a few at a time, the adds waiting on each, the
// 132 rows of layer1's conv3 made its kernel 49 µs against 32 without the finalize (H200 traces,
// 2026-11-29). The order is fixed whichever CTA is last: each thread adds its rows in order, in
// double, then the 16 parts are added in order. Consumer threads.
template <class K, class Run>
__device__ void finalize_column(int t, typename K::SharedStorage& ss, const Run& epilogue, int column, int rows,
                                int n0, int n, double M) {
  constexpr int kQuads = K::kTileN / 4, kParts = K::kConsumerThreads / kQuads, kRowsEach = 9;
  constexpr int kSums = K::Epi::kSums;
  static_assert(K::kConsumerThreads % kQuads == 0, "every consumer thread a quarter of a row");
  using Scratch = double[kSums][kParts][K::kTileN];
  static_assert(sizeof(Scratch) <= sizeof(ss.staged), "the sums' scratch lives in the staging tiles, done with");
  // The count, equivalent to CUTLASS's GenericBarrier (cutlass/barrier.h: a fence and a relaxed add
  // after a barrier to arrive, an acquiring load then a barrier to wait): after a barrier, one
  // thread's acquire-release atomic, which releases what every thread of the CTA wrote before the
  // barrier and, at the last CTA, acquires what the others released; the barrier after it passes
  // that on to the CTA's threads. (A fence in every thread and a relaxed atomic timed the same.)
  unsigned* arrivals = epilogue.arrivals() + column;
  cutlass::arch::NamedBarrier::sync(K::kConsumerThreads, K::kConsumersBarrier);
  if (t == 0) {
    unsigned before;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;\n" : "=r"(before) : "l"(arrivals) : "memory");
    // A counter not zero at the launch (counters shared with a kernel running beside, or too few)
    // would finalize before every row is written, silently, and stay wrong: stop the kernel instead.
    if (before >= unsigned(rows)) __trap();
    const bool last = before == unsigned(rows - 1);
    if (last) *arrivals = 0;  // every CTA of the column counted: ready for the next launch
    ss.last_of_column = last;
  }
  cutlass::arch::NamedBarrier::sync(K::kConsumerThreads, K::kConsumersBarrier);
  if (!ss.last_of_column) return;
  typename Run::ChannelInputs in{};
  if (t < K::kTileN) in = epilogue.channel_inputs(n0 + t);  // in flight with the sums
  const int quad = t % kQuads, part = t / kQuads;
  double acc[kSums][4] = {};
  for (int r0 = part; r0 < rows; r0 += kRowsEach * kParts) {  // one round up to 144 rows
    float4 v[kSums][kRowsEach];
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < kSums; ++k)
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kRowsEach; ++i) {
        const int r = r0 + i * kParts;  // L2, not L1: other SMs wrote them
        const float* at = epilogue.partials() + (int64_t(k) * rows + r) * n + n0 + 4 * quad;
        v[k][i] = r < rows ? __ldcg(reinterpret_cast<const float4*>(at)) : float4{0.f, 0.f, 0.f, 0.f};
      }
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < kSums; ++k)
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kRowsEach; ++i) {
        acc[k][0] += v[k][i].x;
        acc[k][1] += v[k][i].y;
        acc[k][2] += v[k][i].z;
        acc[k][3] += v[k][i].w;
      }
  }
  auto& scratch = *reinterpret_cast<Scratch*>(&ss.staged[0][0][0]);
  CUTLASS_PRAGMA_UNROLL
  for (int k = 0; k < kSums; ++k)
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < 4; ++j) scratch[k][part][4 * quad + j] = acc[k][j];
  cutlass::arch::NamedBarrier::sync(K::kConsumerThreads, K::kConsumersBarrier);
  if (t >= K::kTileN) return;
  double total[kSums] = {};
  CUTLASS_PRAGMA_UNROLL
  for (int k = 0; k < kSums; ++k)
    for (int q = 0; q < kParts; ++q) total[k] += scratch[k][q][t];
  epilogue.finalize_channel(in, total, n0 + t, n, M);
}

// The stage pipeline of a resident kernel, its barriers set up by their leaders: warp 0 loads,
// the consumer warpgroups read each stage (both, or ping-pong the one whose tile it is). The
// caller syncs the CTA before anyone waits on them.
template <class K>
__device__ typename K::Pipeline make_pipeline(typename K::SharedStorage& ss, const typename K::Params& p) {
  const int warp_group = threadIdx.x / cutlass::NumThreadsPerWarpGroup, warp = threadIdx.x / 32;
  typename K::Pipeline::Params pp;
  pp.role = warp == 0         ? K::Pipeline::ThreadCategory::Producer
            : warp_group == 0 ? K::Pipeline::ThreadCategory::NonParticipant
                              : K::Pipeline::ThreadCategory::Consumer;
  pp.is_leader = threadIdx.x % cutlass::NumThreadsPerWarpGroup == 0;
  pp.num_consumers = K::kTileThreads;  // the threads that read each stage
  pp.transaction_bytes = p.mainloop.tma_transaction_bytes;
  return typename K::Pipeline(ss.pipeline, pp, Shape<_1, _1, _1>{});
}

// The k-tiles of row of tiles mt: `k_tiles` (every tile's), or by its phase's taps.
template <class K>
__device__ int tile_k_tiles(const typename K::Params& p, int mt, int k_tiles) {
  if constexpr (K::kOperand == Operand::Phases)
    return K::Mainloop::k_tiles_of(p.mainloop, mt);
  else
    return k_tiles;
}

// The producer warp: the CTA's tiles of its column (every ctas_per_column-th row from `first`),
// each tile's k_tiles stages loaded in turn.
template <class K, class Inputs>
__device__ void produce_tiles(typename K::Mainloop& mainloop, typename K::Pipeline& pipeline,
                              const typename K::Params& p, const Inputs& inputs, typename K::SharedStorage& ss,
                              int first, int column, int k_tiles) {
  typename K::PipeState write = cutlass::make_producer_start_state<typename K::Pipeline>();
  for (int mt = first; mt < p.m_tiles; mt += p.ctas_per_column) {
    auto k_iter = make_coord_iterator(shape<3>(get<0>(inputs)));
    const int kt = tile_k_tiles<K>(p, mt, k_tiles);
    mainloop.load(p.mainloop, pipeline, write, inputs, make_coord(mt, column, _, 0), k_iter, kt,
                  threadIdx.x % 32, 0, ss.tensors);
    write.advance(kt);
  }
  mainloop.load_tail(pipeline, write);
}

// A tile out: its fp32 accumulators (wgmma's m64nNk16 layout, each one's (row, column) in cC) in
// fp16 through shared memory, the neighbouring columns as one half2, the epilogue seeing the fp32
// values on the way; then the epilogue writes the staged tile in whole rows. The tile's threads.
template <class K, class Accum, class Coords, class Run>
__device__ void write_tile(Accum& accum, const Coords& cC, __half (*staged)[K::kRowPitch],
                           __half (*side)[K::kSideRows][K::kTileN], Run& epilogue, int64_t row0, int n0, int n,
                           int tt, int group) {
  static_assert(decltype(size<0>(accum))::value == K::kTileN / 2 && decltype(size<2>(accum))::value == 1,
                "not wgmma's m64nNk16 accumulator layout");
  cutlass::arch::NamedBarrier::sync(K::kTileThreads, K::kTileBarrier + group);  // the last tile's read
  CUTLASS_PRAGMA_UNROLL
  for (int m = 0; m < size<1>(accum); ++m)
    CUTLASS_PRAGMA_UNROLL
    for (int v2 = 0; v2 < K::kTileN / 8; ++v2)
      CUTLASS_PRAGMA_UNROLL
      for (int v1 = 0; v1 < 2; ++v1) {
        const float a = accum(make_coord(make_coord(0, v1, v2), m, 0)), b = accum(make_coord(make_coord(1, v1, v2), m, 0));
        const auto rc = cC(make_coord(make_coord(0, v1, v2), m, 0));
        *reinterpret_cast<__half2*>(&staged[get<0>(rc)][get<1>(rc)]) = __floats2half2_rn(a, b);
        epilogue.values(v2, a, b);
      }
  cutlass::arch::NamedBarrier::sync(K::kTileThreads, K::kTileBarrier + group);
  epilogue.rows(staged, side, row0, n0, n, tt);
}

template <class K>
__global__ void __launch_bounds__(K::kThreads, 1) resident_conv(const __grid_constant__ typename K::Params p) {
  static_assert(K::kOperand != Operand::JoinGrad, "dy from the join is made by resident_dgrad_wgrad's consumer");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900
  extern __shared__ char smem_raw[];
  auto& ss = *reinterpret_cast<typename K::SharedStorage*>(smem_raw);
  constexpr int TileM = K::kTileM, TileN = K::kTileN;
  const int warp_group = threadIdx.x / cutlass::NumThreadsPerWarpGroup;
  const int warp = threadIdx.x / 32;
  if (threadIdx.x == 0) K::Mainloop::prefetch_tma_descriptors(p.mainloop);

  typename K::Pipeline pipeline = make_pipeline<K>(ss, p);
  typename K::TurnBarrier::Params tp;
  tp.group_id = warp_group == 2 ? 1 : 0;
  tp.group_size = cutlass::NumThreadsPerWarpGroup;
  typename K::TurnBarrier turns(ss.turns, tp);
  __syncthreads();  // the barriers initialised before anyone waits on them
  chain_wait();  // launched chained (kernels/conv1x1_launch.cuh): the kernel before it done

  typename K::Mainloop mainloop;
  auto inputs = mainloop.load_init(make_shape(p.m, p.n, p.k, 1), p.mainloop);
  const int column = blockIdx.x % p.n_tiles;  // this CTA's column of tiles
  const int first = blockIdx.x / p.n_tiles;   // its first row of tiles, then every ctas_per_column-th
  const int k_tiles = p.k / size<2>(typename K::Tile{}) / K::kTapsPerStage;  // the pipeline's stages a tile

  if (warp_group == 0) {
    cutlass::arch::warpgroup_reg_dealloc<40>();
    if (warp == 0) produce_tiles<K>(mainloop, pipeline, p, inputs, ss, first, column, k_tiles);
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
  auto slot_column = [&](int v0, int v2) { return get<1>(cC(make_coord(make_coord(v0, 0, v2), 0, 0))); };
  const int n0 = column * TileN;
  typename K::Epi::template Run<K> epilogue(p.epilogue);
  epilogue.begin(tt, n0);
  __half(*staged)[K::kRowPitch] = ss.staged[group];
  __half(*side)[K::kSideRows][TileN] = ss.side[group];

  typename K::PipeState read;
  read.advance(group * k_tiles);  // ping-pong: the second warpgroup starts at the CTA's second tile
  for (int mt = first + group * p.ctas_per_column; mt < p.m_tiles; mt += p.ctas_per_column * (2 / K::kGroupsPerTile)) {
    epilogue.load(side, int64_t(mt) * TileM, n0, p.n, tt);  // what the epilogue reads beside the tile, in flight meanwhile
    const int kt = tile_k_tiles<K>(p, mt, k_tiles);
    if constexpr (K::kGroupsPerTile == 1) turns.wait();
    if constexpr (K::kOperand == Operand::Join || K::kOperand == Operand::JoinBn)  // the first column's CTAs store it
      mainloop.mma(pipeline, read, accum, kt, tt, ss.tensors, p.mainloop, mt, column == 0);
    else
      mainloop.mma(pipeline, read, accum, kt, tt, ss.tensors, p.mainloop);
    if constexpr (K::kGroupsPerTile == 1) turns.arrive();
    mainloop.mma_tail(pipeline, read, kt);  // the wgmmas done, the last stages given back
    read.advance(kt * (2 / K::kGroupsPerTile));  // its own tile, and ping-pong: the other's
    write_tile<K>(accum, cC, staged, side, epilogue, int64_t(mt) * TileM, n0, p.n, tt, group);
  }
  epilogue.finish(t, ss.stats, slot_column, first, p.ctas_per_column, n0, p.n);
  if constexpr (K::Epi::kFinalizes)
    if (epilogue.arrivals()) finalize_column<K>(t, ss, epilogue, column, p.ctas_per_column, n0, p.n, double(p.m));
#endif
}

}  // namespace trainer_kernels
