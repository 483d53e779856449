// conv3's data gradient (kernels/conv1x1_stats_kernel.cuh's resident kernel with the Inner
// BnGradEpilogue) that also takes the conv's weight gradient from the same stages of dy.
//
// Why: the weight gradient dw[k][c] = sum over m of dy[m, k] y[m, c], y = relu(bn2(x)), otherwise
// runs on the second stream as a GEMM that reads dy again (at layer1, 256 channels: 134 MB at
// batch 256, more than L2) and, where the forward applied bn2 in its prologue, after a pass that
// stores y again. Here each stage of dy, already in shared memory for dx = dy w, is also the A
// operand of dw's wgmma, read MN-major (the same bytes: a K-major tile of 128 rows of 64 k is an
// MN-major tile of 64 k by 128 rows, both in the 128-byte swizzle), and y is made from the x the
// epilogue loads beside each tile anyway (its fp16 x * scale + shift, the forward prologue's).
// dy is read once, y never stored.
//
// The schedule is cooperative: both consumer warpgroups on each tile, each 64 of its rows of dx
// (32 accumulators a thread) and half of dw's k-tiles (warpgroup g the k-tiles g, g + 2, ...: 32
// accumulators a k-tile a thread), held across the CTA's tiles; at the end each CTA writes its part
// of dw in fp32, a row of [k][c] for each CTA of its column, which conv1x1_dw_from_partials adds up.
// x beside each tile is loaded a tile ahead (two buffers), since y must be in shared memory before
// the tile's first wgmma; KTiles (k / 64) is fixed so that the accumulators stay in registers.
//
// The same kernel with PlainGradEpilogue writes dx as it is and takes y = x as stored: a conv whose
// input is no BN's to take backward here, layer1.0's projection shortcut, whose input is the stem's
// output (its BN backward is conv1's join kernel's, kernels/conv1x1_dgrad_join.h).
//
// With kDyFromJoin, dy itself is made as it is read: conv3's output gradient is the join's BN
// backward, dy = coef[k] dz + coef[K + k] a3 + coef[2K + k] (bn3's apply), and each stage holds dz's
// tile and a3's (PairedA), from which the consumers write dy over dz's before the stage's wgmmas.
// Why: as a pass of its own the apply reads dz and a3 and writes dy, which this kernel then reads
// back: at layer1 three passes of 134 MB at batch 256, against one more here.
#pragma once

#include "kernels/conv1x1_stats_kernel.cuh"

namespace trainer_kernels {

// y's tile (64 channels by 128 rows, MN-major) and the second buffer of x beside the tile.
constexpr int kDwExtraBytes = 2 * 128 * 64 * 2;

// dx written as the GEMM gives it, x (the conv's stored input) loaded beside each tile for dw.
struct PlainGradEpilogue {
  static constexpr int kSums = 1;  // none: ResidentConv sizes its (unused) statistics by this
  static constexpr bool kFinalizes = false;
  static constexpr int kSideTensors = 1;  // x
  using LayoutB = cutlass::layout::RowMajor;
  struct Params {
    cutlass::half_t* dx;  // [m, n]: out
    const __half* x;      // [m, n]: the conv's input
  };

  template <class K>
  struct Run {
    static constexpr int kChunks = K::kTileN / 8;  // 8 channels, 16 bytes, a chunk
    static constexpr int kPerThread = K::kTileM * kChunks / K::kTileThreads;
    static_assert(K::kTileThreads % kChunks == 0, "a thread's chunks must stay in one column");
    static_assert(K::kTileM * kChunks % K::kTileThreads == 0, "every thread the same number of chunks");
    using Side = __half (*)[K::kSideRows][K::kTileN];
    const Params& p;
    int col = 0;  // the thread's first column in the tile
    __device__ explicit Run(const Params& params) : p(params) {}
    __device__ void begin(int tt, int) { col = tt % kChunks * 8; }
    __device__ void values(int, float, float) {}
    __device__ __half2 input_of(__half2 x, int) const { return x; }
    // The thread's chunks of x beside the tile (as BnGradEpilogue's load: cp.async, read back by
    // the thread that copied them).
    __device__ void load(Side side, int64_t row0, int n0, int n, int tt) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kPerThread; ++i) {
        const int row = (tt + i * K::kTileThreads) / kChunks;
        const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(&side[0][row][col]));
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(p.x + (row0 + row) * n + n0 + col)
                     : "memory");
      }
      asm volatile("cp.async.commit_group;\n" ::: "memory");
    }
    // The staged tile out in whole rows of 16-byte chunks.
    __device__ void rows(const __half (*staged)[K::kRowPitch], Side, int64_t row0, int n0, int n, int tt) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kPerThread; ++i) {
        const int row = (tt + i * K::kTileThreads) / kChunks;
        *reinterpret_cast<uint4*>(p.dx + (row0 + row) * n + n0 + col) = *reinterpret_cast<const uint4*>(&staged[row][col]);
      }
    }
  };
};

template <int KTiles, class Epilogue = InnerGradEpilogue, bool kDyFromJoin = false>
struct DgradWgrad {
  using K = ResidentConv<128, 64, kDyFromJoin ? Operand::JoinGrad : Operand::Stored, false, Epilogue, kDwExtraBytes>;
  static_assert(KTiles % 2 == 0, "the two warpgroups take dw's k-tiles by turns");
  static constexpr int kSlots = KTiles / 2;  // dw's k-tiles a warpgroup
  using Half = cutlass::half_t;
  using Mainloop = typename K::Mainloop;
  static constexpr int kStages = size<2>(typename Mainloop::SmemLayoutA{});
  // dy's stages as dw's A operand: (64 k, 128 rows, stage), MN-major.
  using SmemLayoutDyT = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<Half>{},
                                               make_shape(Int<64>{}, Int<K::kTileM>{}, Int<kStages>{})));
  // y as dw's B operand: (64 channels, 128 rows), MN-major.
  using SmemLayoutY = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<Half>{},
                                             make_shape(Int<K::kTileN>{}, Int<K::kTileM>{})));
  using DwMma = decltype(make_tiled_mma(SM90_64x64x16_F32F16F16_SS<GMMA::Major::MN, GMMA::Major::MN>{}));
  static_assert(cute::cosize_v<SmemLayoutY> * 2 == kDwExtraBytes / 2, "y fills the first half of the extra bytes");
  using Side = __half (*)[K::kSideRows][K::kTileN];
};

// Host and device: whether dy's stage read MN-major for dw is the same bytes as the stage CUTLASS's
// mainloop writes K-major for dx (the launcher checks it once, before the first launch).
template <int KTiles, class Epilogue, bool kDyFromJoin>
CUTE_HOST_DEVICE bool dgrad_wgrad_layouts_agree() {
  using D = DgradWgrad<KTiles, Epilogue, kDyFromJoin>;
  const auto k_major = typename D::Mainloop::SmemLayoutA{};
  const auto mn_major = typename D::SmemLayoutDyT{};
  for (int s = 0; s < D::kStages; ++s)
    for (int m = 0; m < D::K::kTileM; ++m)
      for (int k = 0; k < 64; ++k)
        if (k_major(m, k, s) != mn_major(k, m, s)) return false;
  return true;
}

// dy of a stage, written over the join's dz (the stage's A tile) from a3 (its second tile), in fp32
// and rounded once to fp16 as bn_backward_apply's pass computes it: each consumer thread the same 8
// channels (16 bytes) of 4 of the 128 rows. Then the writes are made visible to wgmma (the async
// proxy), and every consumer waits for the whole stage: dw's wgmma reads all its rows.
template <class D>
__device__ void dy_from_join(typename D::K::SharedStorage& ss, int stage, int k0, int k, const float* coef, int t) {
  using K = typename D::K;
  using Half = cutlass::half_t;
  constexpr int kChunks = 64 / 8;  // 16-byte chunks a row of the k-tile
  constexpr int kRowsEach = K::kTileM * kChunks / K::kConsumerThreads;
  static_assert(K::kConsumerThreads % kChunks == 0, "a thread's chunks must be the same channels");
  Tensor sA = make_tensor(make_smem_ptr(ss.tensors.smem_A.data()), typename D::Mainloop::SmemLayoutA{});
  Tensor sR = make_tensor(make_smem_ptr(ss.tensors.smem_R.data()), typename D::Mainloop::SmemLayoutA{});
  const int chunk = t % kChunks, c = k0 + 8 * chunk;
  // The thread's 8 channels of each coefficient row, two 16-byte loads each.
  auto channels = [&](const float* row, float (&to)[8]) {
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h) reinterpret_cast<float4*>(to)[h] = __ldg(reinterpret_cast<const float4*>(row + c) + h);
  };
  alignas(16) float dz_k[8], x_k[8], one_k[8];
  channels(coef, dz_k);
  channels(coef + k, x_k);
  channels(coef + 2 * k, one_k);
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < kRowsEach; ++i) {
    const int row = t / kChunks + i * (K::kConsumerThreads / kChunks);
    Half* at = &sA(row, 8 * chunk, stage);
    const uint4 z = *reinterpret_cast<const uint4*>(at);
    const uint4 x = *reinterpret_cast<const uint4*>(&sR(row, 8 * chunk, stage));
    const __half2* zh = reinterpret_cast<const __half2*>(&z);
    const __half2* xh = reinterpret_cast<const __half2*>(&x);
    uint4 out;
    __half2* oh = reinterpret_cast<__half2*>(&out);
    CUTLASS_PRAGMA_UNROLL
    for (int j2 = 0; j2 < 4; ++j2) {
      const int j = 2 * j2;
      const float2 zf = __half22float2(zh[j2]), xf = __half22float2(xh[j2]);
      oh[j2] = __floats2half2_rn(dz_k[j] * zf.x + x_k[j] * xf.x + one_k[j],
                                 dz_k[j + 1] * zf.y + x_k[j + 1] * xf.y + one_k[j + 1]);
    }
    *reinterpret_cast<uint4*>(at) = out;
  }
  cutlass::arch::fence_view_async_shared();
  cutlass::arch::NamedBarrier::sync(K::kTileThreads, K::kTileBarrier);
}

// dy_coef: with kDyFromJoin, the join's apply coefficients ([3][k] fp32), else unused.
template <int KTiles, class Epilogue, bool kDyFromJoin>
__global__ void __launch_bounds__(384, 1)
    resident_dgrad_wgrad(const __grid_constant__ typename DgradWgrad<KTiles, Epilogue, kDyFromJoin>::K::Params p,
                         float* dw_partials, const float* dy_coef) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900
  using D = DgradWgrad<KTiles, Epilogue, kDyFromJoin>;
  using K = typename D::K;
  extern __shared__ char smem_raw[];
  auto& ss = *reinterpret_cast<typename K::SharedStorage*>(smem_raw);
  constexpr int TileM = K::kTileM, TileN = K::kTileN;
  const int warp_group = threadIdx.x / cutlass::NumThreadsPerWarpGroup;
  if (threadIdx.x == 0) K::Mainloop::prefetch_tma_descriptors(p.mainloop);
  typename K::Pipeline pipeline = make_pipeline<K>(ss, p);
  __syncthreads();  // the barriers initialised before anyone waits on them
  chain_wait();  // launched chained (kernels/conv1x1_launch.cuh): the kernel before it done

  typename K::Mainloop mainloop;
  auto inputs = mainloop.load_init(make_shape(p.m, p.n, p.k, 1), p.mainloop);
  const int column = blockIdx.x % p.n_tiles;
  const int first = blockIdx.x / p.n_tiles;
  if (warp_group == 0) {
    cutlass::arch::warpgroup_reg_dealloc<40>();
    if (threadIdx.x / 32 == 0) produce_tiles<K>(mainloop, pipeline, p, inputs, ss, first, column, KTiles);
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<232>();
  const int t = threadIdx.x - cutlass::NumThreadsPerWarpGroup;  // 0..255, the thread within the tile
  const int wg = __shfl_sync(0xFFFFFFFF, t / cutlass::NumThreadsPerWarpGroup, 0);
  // dx: CUTLASS's operands and accumulators, the warpgroup's 64 rows.
  typename K::TiledMma tiled_mma;
  auto thread_mma = tiled_mma.get_slice(wg * cutlass::NumThreadsPerWarpGroup);
  Tensor sA = make_tensor(make_smem_ptr(ss.tensors.smem_A.data()), typename K::Mainloop::SmemLayoutA{});
  Tensor sB = make_tensor(make_smem_ptr(ss.tensors.smem_B.data()), typename K::Mainloop::SmemLayoutB{});
  Tensor tCrA = thread_mma.make_fragment_A(thread_mma.partition_A(sA));  // (MMA, MMA_M, MMA_K, PIPE)
  Tensor tCrB = thread_mma.make_fragment_B(thread_mma.partition_B(sB));  // (MMA, MMA_N, MMA_K, PIPE)
  Tensor cC = tiled_mma.get_thread_slice(t).partition_C(make_identity_tensor(make_shape(Int<TileM>{}, Int<TileN>{})));
  Tensor accum = partition_fragment_C(tiled_mma, make_shape(Int<TileM>{}, Int<TileN>{}));
  // dw: dy's stage read MN-major by y, the warpgroup's k-tiles.
  typename D::DwMma dw_mma;
  auto dw_thread = dw_mma.get_slice(t % cutlass::NumThreadsPerWarpGroup);
  __half* y_tile = reinterpret_cast<__half*>(ss.extra);
  Tensor sDyT = make_tensor(make_smem_ptr(ss.tensors.smem_A.data()), typename D::SmemLayoutDyT{});
  Tensor sY = make_tensor(make_smem_ptr(reinterpret_cast<cutlass::half_t*>(y_tile)), typename D::SmemLayoutY{});
  Tensor tDrA = dw_thread.make_fragment_A(dw_thread.partition_A(sDyT));  // (MMA, 1, 8, PIPE)
  Tensor tDrB = dw_thread.make_fragment_B(dw_thread.partition_B(sY));    // (MMA, 1, 8)
  using DwAccum = decltype(partition_fragment_C(dw_mma, Shape<_64, _64>{}));
  DwAccum dw[D::kSlots];
  CUTLASS_PRAGMA_UNROLL
  for (int s = 0; s < D::kSlots; ++s) clear(dw[s]);
  dw_mma.accumulate_ = GMMA::ScaleOut::One;

  auto slot_column = [&](int v0, int v2) { return get<1>(cC(make_coord(make_coord(v0, 0, v2), 0, 0))); };
  const int n0 = column * TileN;
  typename K::Epi::template Run<K> epilogue(p.epilogue);
  epilogue.begin(t, n0);
  using Run = typename K::Epi::template Run<K>;
  const typename D::Side side0 = ss.side[0], side1 = reinterpret_cast<typename D::Side>(ss.extra + kDwExtraBytes / 2);
  if (first < p.m_tiles) epilogue.load(side0, int64_t(first) * TileM, n0, p.n, t);

  typename K::PipeState read;
  int turn = 0;
  for (int mt = first; mt < p.m_tiles; mt += p.ctas_per_column, turn ^= 1) {
    const typename D::Side side = turn ? side1 : side0;
    // y of the thread's chunks of x (those it loaded), into y's tile: relu(fp16 x * scale + shift),
    // or x itself (PlainGradEpilogue).
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < Run::kPerThread; ++i) {
      const int row = (t + i * K::kTileThreads) / Run::kChunks;
      uint4 v = *reinterpret_cast<const uint4*>(&side[0][row][epilogue.col]);
      __half2* h = reinterpret_cast<__half2*>(&v);
      CUTLASS_PRAGMA_UNROLL
      for (int j2 = 0; j2 < 4; ++j2) h[j2] = epilogue.input_of(h[j2], j2);
      *reinterpret_cast<uint4*>(&sY(epilogue.col, row)) = v;
    }
    cutlass::arch::fence_view_async_shared();  // y, written by threads, read by wgmma
    cutlass::arch::NamedBarrier::sync(K::kTileThreads, K::kTileBarrier);
    if (mt + p.ctas_per_column < p.m_tiles)  // the next tile's x, while this one multiplies
      epilogue.load(turn ? side0 : side1, int64_t(mt + p.ctas_per_column) * TileM, n0, p.n, t);

    // The tile's stages: dx's wgmmas from each, and the owner warpgroup's dw wgmmas; a stage goes
    // back once the next stage's batch is issued and its own is done.
    tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
    warpgroup_fence_operand(accum);
    typename K::PipeState release = read;
    CUTLASS_PRAGMA_UNROLL
    for (int step = 0; step < KTiles; ++step) {
      pipeline.consumer_wait(read);
      const int stage = read.index();
      if constexpr (kDyFromJoin) dy_from_join<D>(ss, stage, step * 64, p.k, dy_coef, t);
      warpgroup_fence_operand(accum);
      CUTLASS_PRAGMA_UNROLL
      for (int s = 0; s < D::kSlots; ++s) warpgroup_fence_operand(dw[s]);
      warpgroup_arrive();
      CUTLASS_PRAGMA_UNROLL
      for (int kb = 0; kb < size<2>(tCrA); ++kb) {
        cute::gemm(tiled_mma, tCrA(_, _, kb, stage), tCrB(_, _, kb, stage), accum);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      if (step % 2 == wg)
        CUTLASS_PRAGMA_UNROLL
        for (int kb = 0; kb < size<2>(tDrA); ++kb) cute::gemm(dw_mma, tDrA(_, _, kb, stage), tDrB(_, _, kb), dw[step / 2]);
      warpgroup_commit_batch();
      warpgroup_wait<1>();
      warpgroup_fence_operand(accum);
      CUTLASS_PRAGMA_UNROLL
      for (int s = 0; s < D::kSlots; ++s) warpgroup_fence_operand(dw[s]);
      if (step > 0) {
        pipeline.consumer_release(release);
        ++release;
      }
      ++read;
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(accum);
    CUTLASS_PRAGMA_UNROLL
    for (int s = 0; s < D::kSlots; ++s) warpgroup_fence_operand(dw[s]);
    pipeline.consumer_release(release);
    write_tile<K>(accum, cC, ss.staged[0], side, epilogue, int64_t(mt) * TileM, n0, p.n, t, 0);
  }
  if constexpr (!std::is_same_v<Epilogue, PlainGradEpilogue>) {  // the BN backward's sums (and finalize)
    epilogue.finish(t, ss.stats, slot_column, first, p.ctas_per_column, n0, p.n);
    if (epilogue.arrivals()) finalize_column<K>(t, ss, epilogue, column, p.ctas_per_column, n0, p.n, double(p.m));
  }

  // The CTA's part of dw: row `first` of [ctas_per_column][k][n], its column's channels.
  Tensor cD = dw_thread.partition_C(make_identity_tensor(Shape<_64, _64>{}));
  float* part = dw_partials + int64_t(first) * p.k * p.n;
  CUTLASS_PRAGMA_UNROLL
  for (int s = 0; s < D::kSlots; ++s) {
    const int k0 = (2 * s + wg) * 64;
    CUTLASS_PRAGMA_UNROLL
    for (int v = 0; v < size(dw[s]); v += 2) {  // neighbouring columns in pairs
      const auto kc = cD(v);
      *reinterpret_cast<float2*>(part + int64_t(k0 + get<0>(kc)) * p.n + n0 + get<1>(kc)) = make_float2(dw[s](v), dw[s](v + 1));
    }
  }
#endif
}

}  // namespace trainer_kernels
