// The mainloop of a CUTLASS Hopper GEMM whose A operand is the previous block's join, computed as it
// is read: a = relu(x * scale[k] + shift[k] + shortcut), the shortcut r itself (identity) or
// r * res_scale[k] + res_shift[k] (a projection's BN), in fp16 (two multiply-adds, where bn_apply's
// join pass, kernels/batchnorm_apply.cu, computes in fp32 and rounds once). For a block's conv1 in
// training (kernels/conv1x1_stats.h, Conv1x1Join; --no-fuse lists own-join-prologue by default). The
// join's output is needed later too (the next join's shortcut, conv1's weight gradient), and its
// ReLU's bits (the join's backward): the CTAs of the GEMM's first column of tiles write the join back
// over x in the stage's shared memory and store it by TMA, a k-tile at a time, and each row's bits
// of the k-tile in 8 bytes; the other columns' CTAs compute the same values again (their x and r
// mostly from L2) and store nothing.
//
// Why: as a pass of its own the join reads x and r and writes its output, which conv1 then reads
// back: at layer1 the pass took 55 µs and conv1 26 (H200 trace, 2026-11-29). Here conv1 reads x and
// r instead and nothing is read back. Measured (H200, 2026-11-29,
// bench/results/levers-session23-nvidia-h200-2026-11-29.md): without the stores (a probe; its output
// unusable) layer1's kernel took 52 µs, with them 84 (the pass and conv1: 81). Where conv1 has more
// than one column of tiles (layers 2-4), each column computes the join again from x and r, twice
// the bytes of reading the stored output: 55-120 µs against 17-83. The step is 10% slower than
// with the join passes, hence off by default; by the bytes it could win only at layer1.
//
// Built as PrologueMainloop (kernels/cutlass_prologue_mainloop.cuh): the register-sourced mainloop's
// copy of each k-block of A from shared memory to registers is where the join goes. Each stage holds
// r's tile beside x's and w's (PairedA, kernels/cutlass_paired_mainloop.cuh), so it has fewer stages
// (4, against the prologue's 7).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cutlass_paired_mainloop.cuh"
#include "kernels/cutlass_prologue_mainloop.cuh"

namespace trainer_kernels {

using namespace cute;

// kDual: the shortcut through its BN (a projection), else added as it is (identity).
template <class KernelSchedule, class TileShape, int carveout, bool kDual>
struct JoinMainloop : PairedA<typename RegisterAMainloop<KernelSchedule, TileShape, carveout, 2>::Base> {
  using Base = PairedA<typename RegisterAMainloop<KernelSchedule, TileShape, carveout, 2>::Base>;
  using typename Base::MainloopPipeline;
  using typename Base::PipelineState;
  using typename Base::SmemLayoutA;
  using typename Base::SmemLayoutB;
  using typename Base::TensorStorage;
  using typename Base::TiledMma;
  static constexpr int kBlockK = size<2>(TileShape{});

  // The GEMM's arguments (x as A, the shortcut r as PairedA's second tensor) and the join's. fp32
  // [C] coefficients, C a multiple of 64.
  struct Arguments : Base::Arguments {
    const float* scale = nullptr;
    const float* shift = nullptr;
    const float* res_scale = nullptr;  // both, or neither: r added as it is
    const float* res_shift = nullptr;
    void* out = nullptr;               // fp16 [M, C]: the join
    uint8_t* bits = nullptr;           // [M * C / 8]: bit j of byte i, element 8i + j of out > 0
  };
  // out's TMA store: tiles of x's shape from x's shared memory layout.
  using StrideA = cute::Stride<int64_t, _1, int64_t>;
  using TmaStoreOut = decltype(make_tma_copy_A_sm90(
      SM90_TMA_STORE{},
      make_tensor(static_cast<cutlass::half_t*>(nullptr), repeat_like(StrideA{}, int32_t(0)), StrideA{}),
      SmemLayoutA{}(_, _, Int<0>{}), TileShape{}, Shape<_1, _1, _1>{}));
  struct Params : Base::Params {
    TmaStoreOut tma_store_out;
    const float2 *scale, *shift, *res_scale, *res_shift;  // pairs of channels, as the fragments hold them
    uint8_t* bits;
    int rows, channels;  // M, C
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& shape, Arguments const& args, void* workspace) {
    const int M = get<0>(shape), C = get<2>(shape);
    Tensor out = make_tensor(static_cast<cutlass::half_t*>(args.out), make_layout(make_shape(M, C, 1), args.dA));
    return {Base::to_underlying_arguments(shape, args, workspace),
            make_tma_copy_A_sm90(SM90_TMA_STORE{}, out, SmemLayoutA{}(_, _, Int<0>{}), TileShape{}, Shape<_1, _1, _1>{}),
            static_cast<const float2*>(static_cast<const void*>(args.scale)),
            static_cast<const float2*>(static_cast<const void*>(args.shift)),
            static_cast<const float2*>(static_cast<const void*>(args.res_scale)),
            static_cast<const float2*>(static_cast<const void*>(args.res_shift)),
            args.bits,
            M,
            C};
  }

  CUTLASS_DEVICE static void prefetch_tma_descriptors(Params const& p) {
    Base::prefetch_tma_descriptors(p);
    cute::prefetch_tma_descriptor(p.tma_store_out.get_tma_descriptor());
  }

  // A k-tile's coefficients in fp16, for each k-block and pair of the thread's fragment of A:
  // relu(x * scale + t), t = shift + r (identity) or r * res_scale + shift (shift here the sum of
  // both BNs' shifts, added in fp32 and rounded once). Loaded before the k-tile's stage is waited for.
  template <int kBlocks, int kPairs>
  struct Coefficients {
    __half2 scale[kBlocks][kPairs], shift[kBlocks][kPairs], res_scale[kDual ? kBlocks : 1][kPairs];
  };
  template <int kBlocks, int kPairs, class CoordsA>
  CUTLASS_DEVICE static Coefficients<kBlocks, kPairs> coefficients(CoordsA const& tCcA, int k0, Params const& p) {
    Coefficients<kBlocks, kPairs> c;
    CUTLASS_PRAGMA_UNROLL
    for (int kb = 0; kb < kBlocks; ++kb)
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kPairs; ++j) {
        const int pair = (k0 + get<1>(tCcA(2 * j, 0, kb))) / 2;
        c.scale[kb][j] = __float22half2_rn(__ldg(p.scale + pair));
        float2 h = __ldg(p.shift + pair);
        if constexpr (kDual) {
          const float2 hr = __ldg(p.res_shift + pair);
          h = make_float2(h.x + hr.x, h.y + hr.y);
          c.res_scale[kb][j] = __float22half2_rn(__ldg(p.res_scale + pair));
        }
        c.shift[kb][j] = __float22half2_rn(h);
      }
    return c;
  }

  // The join on one k-block of x's and r's fragments (each row block), into x's, in fp16 (two
  // multiply-adds a pair, as the BN prologue's one). kStores: where y > 0 added to `passed`, each
  // row's bits of the k-tile (64 channels) in 8 bytes, for the two rows 8 apart that the thread's
  // pairs of each row block fall on; each lane holds its own 2 bits of each byte (see mma()).
  // No branches: with any between the wgmmas that read these registers, ptxas serializes the wgmmas
  // (its warning C7513; layer1's kernel took 168 µs against 139 without).
  template <bool kStores, int kPairs, int kRowBlocks, class FragX, class FragR, class Coords>
  CUTLASS_DEVICE static void join(FragX&& x, FragR const& r, Coords const& rc, const __half2 (&scale)[kPairs],
                                  const __half2 (&shift)[kPairs], const __half2 (&res_scale)[kPairs],
                                  uint64_t (&passed)[kRowBlocks][2]) {
    static_assert(size<0>(FragX{}) == 2 * kPairs && size<1>(FragX{}) == kRowBlocks, "not the fragment's shape");
    CUTLASS_PRAGMA_UNROLL
    for (int m = 0; m < kRowBlocks; ++m)
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kPairs; ++j) {
        const __half2 xv = __halves2half2(x(2 * j, m).to_half(), x(2 * j + 1, m).to_half());
        const __half2 rv = __halves2half2(r(2 * j, m).to_half(), r(2 * j + 1, m).to_half());
        const __half2 t = kDual ? __hfma2(rv, res_scale[j], shift[j]) : __hadd2(rv, shift[j]);
        // max with 0, not __hfma2_relu: a NaN (an overflowing step) becomes 0 as in bn_apply's fmaxf.
        const __half2 y = __hmax2(__hfma2(xv, scale[j], t), __float2half2_rn(0.f));
        x(2 * j, m) = cutlass::half_t(__low2half(y));
        x(2 * j + 1, m) = cutlass::half_t(__high2half(y));
        if constexpr (kStores) {
          const int col = get<1>(rc(2 * j, m)) % kBlockK, lower = (get<0>(rc(2 * j, m)) - get<0>(rc(0, m))) / 8;
          const unsigned mask = __hgt2_mask(y, __float2half2_rn(0.f));  // 0xFFFF a half that passed
          passed[m][lower] |= uint64_t((mask & 1u) | (mask >> 15 & 2u)) << col;
        }
      }
  }

  // The consumer's loop: PrologueMainloop's (see there), x's and r's k-blocks copied to registers
  // and joined before each wgmma. m_tile: the tile's row; stores: this CTA stores the join. One loop
  // for each kind of join, each without a branch inside (see join()).
  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState read, FrgTensorC& accum, int k_tile_count,
                          int thread_idx, TensorStorage& shared_tensors, Params const& params, int m_tile,
                          bool stores) {
    if (stores)
      mma<true>(pipeline, read, accum, k_tile_count, thread_idx, shared_tensors, params, m_tile);
    else
      mma<false>(pipeline, read, accum, k_tile_count, thread_idx, shared_tensors, params, m_tile);
  }

  template <bool kStores, class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum, int k_tile_count,
                          int thread_idx, TensorStorage& shared_tensors, Params const& params, int m_tile) {
    Tensor sA = as_position_independent_swizzle_tensor(
        make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{}));  // (BLK_M, BLK_K, PIPE)
    Tensor sR = as_position_independent_swizzle_tensor(
        make_tensor(make_smem_ptr(shared_tensors.smem_R.data()), SmemLayoutA{}));
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});  // (BLK_N, BLK_K, PIPE)

    TiledMma tiled_mma;
    auto thread_mma = tiled_mma.get_thread_slice(thread_idx);

    Tensor tCrA = thread_mma.partition_fragment_A(sA(_, _, Int<0>{}));  // (MMA, MMA_M, MMA_K)
    Tensor tCrR = thread_mma.partition_fragment_A(sR(_, _, Int<0>{}));
    Tensor tCrB = warpgroup_fragment_B(tiled_mma, sB, thread_idx);       // (MMA, MMA_N, MMA_K, PIPE)
    Tensor tCcA = thread_mma.partition_A(make_identity_tensor(make_shape(size<0>(TileShape{}), Int<kBlockK>{})));

    auto copy_A = make_tiled_copy_A(typename Base::InternalSmemCopyAtomA{}, tiled_mma);
    auto thread_copy_A = copy_A.get_thread_slice(thread_idx);
    Tensor tCrA_copy = thread_copy_A.retile_D(tCrA);   // (CPY, CPY_M, CPY_K)
    Tensor tCrR_copy = thread_copy_A.retile_D(tCrR);
    Tensor tCsA_copy = thread_copy_A.partition_S(sA);  // (CPY, CPY_M, CPY_K, PIPE)
    Tensor tCsR_copy = thread_copy_A.partition_S(sR);
    constexpr int kBlocks = size<2>(tCrA);
    constexpr int kRowBlocks = size<1>(tCrA);
    // out written from the stage, the join written over x there: the tile's TMA store.
    Tensor mOut = params.tma_store_out.get_tma_tensor(make_shape(params.rows, params.channels, 1));
    Tensor gOut_mkl = local_tile(mOut, TileShape{}, make_coord(_, _, _), Step<_1, Underscore, _1>{});  // (BLK_M, BLK_K, m, k, l)
    Tensor gOut = gOut_mkl(_, _, m_tile, _, 0);  // (BLK_M, BLK_K, k)
    auto tma_out = params.tma_store_out.get_slice(0);
    Tensor tOsA = tma_out.partition_S(sA);    // (TMA, TMA_M, TMA_K, PIPE)
    Tensor tOgOut = tma_out.partition_D(gOut);  // (TMA, TMA_M, TMA_K, k)
    const bool issues = thread_idx % cutlass::NumThreadsPerWarpGroup == 0;  // the store's thread
    const int store_barrier = 4 + int(threadIdx.x) / cutlass::NumThreadsPerWarpGroup;  // the warpgroup's own
    // Each lane stores one row's 8 bytes of bits of each k-tile: row block lane / 2, row lane % 2 of
    // the two 8 apart. The 4 lanes of a quad (lane / 4 alike) hold the same rows.
    static_assert(kRowBlocks * 2 == 4, "a row's bits for each lane of a quad");
    const int lane = threadIdx.x % 4;
    const int64_t row = int64_t(m_tile) * size<0>(TileShape{}) + get<0>(tCcA(0, lane / 2, 0)) + 8 * (lane % 2);
    uint64_t* bits = reinterpret_cast<uint64_t*>(params.bits) + row * (params.channels / 64);

    tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
    warpgroup_fence_operand(accum);
    PipelineState release = smem_pipe_read;
    constexpr int kPairs = size<0>(tCrA) / 2;
    CUTLASS_PRAGMA_NO_UNROLL
    for (int k_tile = 0; k_tile < k_tile_count; ++k_tile) {
      const auto c = coefficients<kBlocks, kPairs>(tCcA, k_tile * kBlockK, params);
      uint64_t passed[kRowBlocks][2] = {};
      pipeline.consumer_wait(smem_pipe_read);
      const int stage = smem_pipe_read.index();
      CUTLASS_PRAGMA_UNROLL
      for (int kb = 0; kb < kBlocks; ++kb) {
        // As PrologueMainloop's, but with one wgmma fewer in flight: r's fragment and the join's
        // registers beside kBlocks - 1 of them made ptxas spill (100-170 bytes a thread).
        warpgroup_wait<kBlocks - 2>();
        copy(copy_A, tCsA_copy(_, _, kb, stage), tCrA_copy(_, _, kb));
        copy(copy_A, tCsR_copy(_, _, kb, stage), tCrR_copy(_, _, kb));
        join<kStores>(tCrA(_, _, kb), tCrR(_, _, kb), tCcA(_, _, kb), c.scale[kb], c.shift[kb],
                      c.res_scale[kDual ? kb : 0], passed);
        if constexpr (kStores) copy(tCrA_copy(_, _, kb), tCsA_copy(_, _, kb, stage));  // the join over x
        warpgroup_fence_operand(accum);
        warpgroup_arrive();
        cute::gemm(tiled_mma, tCrA(_, _, kb), tCrB(_, _, kb, stage), accum);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
        warpgroup_commit_batch();
        warpgroup_fence_operand(accum);
      }
      if constexpr (kStores) {
        // The stage's join out by one TMA store, once every thread's part is in shared memory and
        // visible to the TMA (the async proxy); the bits a row at a time, or-ed across the quad.
        tma_store_fence();
        cutlass::arch::NamedBarrier::sync(cutlass::NumThreadsPerWarpGroup, store_barrier);
        if (issues) {
          copy(params.tma_store_out, tOsA(_, _, _, stage), tOgOut(_, _, _, k_tile));
          tma_store_arrive();
          tma_store_wait<1>();  // the last k-tile's store has read its stage
        }
        CUTLASS_PRAGMA_UNROLL
        for (int m = 0; m < kRowBlocks; ++m)
          CUTLASS_PRAGMA_UNROLL
          for (int h = 0; h < 2; ++h)
            CUTLASS_PRAGMA_UNROLL
            for (int lanes = 1; lanes < 4; lanes *= 2) passed[m][h] |= __shfl_xor_sync(0xFFFFFFFF, passed[m][h], lanes);
        const uint64_t mine = lane == 0 ? passed[0][0] : lane == 1 ? passed[0][1] : lane == 2 ? passed[1][0] : passed[1][1];
        bits[k_tile] = mine;
      }
      // The last k-tile's stage back to the producer: its wgmmas are done (the wait before this
      // k-tile's last k-block), and so is its store's read (above). Only the storing thread waited
      // for that, and it suffices: without a cluster, CUTLASS's pipeline counts every consumer
      // thread's arrival on the stage's empty barrier (PipelineTmaAsync: num_consumers arrivals), so
      // the stage is free once that thread too has arrived. Here, not inside the k-blocks' loop as
      // PrologueMainloop does it: the store's wait there made ptxas serialize the wgmmas.
      if (k_tile > 0) {
        pipeline.consumer_release(release);
        ++release;
      }
      ++smem_pipe_read;
    }
    warpgroup_wait<0>();
    if constexpr (kStores)
      if (issues) tma_store_wait<0>();
    if (k_tile_count > 0) pipeline.consumer_release(release);
    warpgroup_fence_operand(accum);
  }

  CUTLASS_DEVICE void mma_tail(MainloopPipeline, PipelineState, int) {}
};

}  // namespace trainer_kernels
