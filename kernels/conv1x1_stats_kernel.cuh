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
// the epilogue, which writes it out in whole rows:
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
#include "cutlass/fast_math.h"
#include "cutlass/pipeline/pipeline.hpp"
#include "kernels/batchnorm_channel.cuh"
#include "kernels/chained_launch.cuh"
#include "kernels/conv1x1_finalize.h"
#include "kernels/cutlass_halo_mainloop.cuh"
#include "kernels/cutlass_join_mainloop.cuh"
#include "kernels/cutlass_paired_mainloop.cuh"
#include "kernels/cutlass_prologue_mainloop.cuh"
#include "kernels/cutlass_taps_mainloop.cuh"

namespace trainer_kernels {

// Row `row` of the partial sums, from each consumer warp's sums in `stats`: each sum's column added
// over the warps in a fixed order, times scale_k[column] where given (the epilogues' common end).
template <class K, int Sums>
__device__ void write_partials(int t, float (*stats)[K::kConsumerWarps][K::kTileN], float* partials, int row, int rows,
                               int n0, int n, const float* scale0 = nullptr, const float* scale1 = nullptr,
                               const float* scale2 = nullptr) {
  static_assert(Sums * K::kTileN <= K::kConsumerThreads, "a consumer thread for each column of each sum");
  if (t >= Sums * K::kTileN) return;
  const int which = t / K::kTileN, col = t % K::kTileN;
  float total = 0.f;
  for (int w = 0; w < K::kConsumerWarps; ++w) total += stats[which][w][col];
  const float* scale = which == 0 ? scale0 : which == 1 ? scale1 : scale2;
  if (scale) total *= scale[n0 + col];
  partials[(int64_t(which) * rows + row) * n + n0 + col] = total;
}

// y[m, n] = sum over k of x[m, k] w[n, k] (the forward: w is KRSC, K-major), and per column of y
// its sum and sum of squares, added from the fp32 accumulators.
struct StatsEpilogue {
  static constexpr int kSums = 2;
  static constexpr bool kFinalizes = true;  // can finalize the BN itself (finalize_column)
  static constexpr int kSideTensors = 0;  // tiles it reads beside its own
  using LayoutB = cutlass::layout::ColumnMajor;  // w[n, k]
  struct Params {
    cutlass::half_t* y;  // [m, n]
    float* partials;     // [2][ctas_per_column][n], or nullptr: y alone
    Conv1x1Finalize finalize;  // with partials and finalize.arrivals: the BN finalized in the kernel
  };

  template <class K>
  struct Run {
    // wgmma's accumulators: values (2 neighbouring columns, 2 rows 8 apart, TileN / 8 groups of 8
    // columns) by row blocks: a thread holds 2 * TileN / 8 columns, its statistics one slot each.
    static constexpr int kSlots = 2 * K::kTileN / 8;
    const Params& p;
    float sum[kSlots], sqsum[kSlots];
    __device__ explicit Run(const Params& params) : p(params) {}
    __device__ const float* partials() const { return p.partials; }
    __device__ unsigned* arrivals() const { return p.partials ? p.finalize.arrivals : nullptr; }
    // Channel c's statistics from its sums of y and y^2 over M values (finalize_column), and what
    // they read of the BN, loaded first.
    using ChannelInputs = ForwardInputs;
    __device__ ChannelInputs channel_inputs(int c) const { return load_forward_inputs(p.finalize.bn, c); }
    __device__ void finalize_channel(const ChannelInputs& in, const double* total, int c, int, double M) const {
      const Conv1x1Finalize& f = p.finalize;
      finalize_channel_from_sums(f.bn, c, in, total[0], total[1], M, static_cast<__half*>(f.scale_h),
                                 static_cast<__half*>(f.shift_h));
    }
    __device__ void begin(int, int) {
      CUTLASS_PRAGMA_UNROLL
      for (int s = 0; s < kSlots; ++s) sum[s] = sqsum[s] = 0.f;
    }
    // The accumulators of a pair of neighbouring columns, slot pair v2.
    __device__ void values(int v2, float a, float b) {
      if (!p.partials) return;
      sum[2 * v2] += a;
      sum[2 * v2 + 1] += b;
      sqsum[2 * v2] += a * a;
      sqsum[2 * v2 + 1] += b * b;
    }
    __device__ void load(__half (*)[K::kSideRows][K::kTileN], int64_t, int, int, int) {}
    // The staged tile out in whole rows of 16-byte chunks (whole sectors, not the fragments'
    // 16-byte pieces).
    __device__ void rows(const __half (*staged)[K::kRowPitch], __half (*)[K::kSideRows][K::kTileN], int64_t row0, int n0,
                         int n, int tt) {
      constexpr int kChunks = K::kTileN / 8;  // 16-byte chunks a row
      cutlass::half_t* y = p.y + row0 * n + n0;
      CUTLASS_PRAGMA_UNROLL
      for (int c = tt; c < K::kTileM * kChunks; c += K::kTileThreads) {
        const int row = c / kChunks, col = c % kChunks * 8;
        *reinterpret_cast<uint4*>(y + int64_t(row) * n + col) = *reinterpret_cast<const uint4*>(&staged[row][col]);
      }
    }
    // Across the lanes that hold the same columns (those of one lane % 4), then across the warps
    // through `stats`: after the shuffles lanes 0-3 hold their warp's sums, each of its own columns.
    template <class SlotColumn>
    __device__ void finish(int t, float (*stats)[K::kConsumerWarps][K::kTileN], SlotColumn slot_column, int row,
                           int rows, int n0, int n) {
      if (!p.partials) return;
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
        for (int v2 = 0; v2 < K::kTileN / 8; ++v2)
          CUTLASS_PRAGMA_UNROLL
          for (int v0 = 0; v0 < 2; ++v0) {
            stats[0][cw][slot_column(v0, v2)] = sum[2 * v2 + v0];
            stats[1][cw][slot_column(v0, v2)] = sqsum[2 * v2 + v0];
          }
      }
      cutlass::arch::NamedBarrier::sync(K::kConsumerThreads, K::kConsumersBarrier);
      write_partials<K, kSums>(t, stats, p.partials, row, rows, n0, n);
    }
  };
};

// A 1x1 conv's data gradient, dx[m, n] = sum over k of dy[m, k] w[k, n] (w is KRSC, so N-major
// here), with the backward of the BN + ReLU it feeds: dz, what the BN backward starts from, in fp16,
// and per channel the sums of dz and dz * xhat (x the BN's input) that it needs. A thread keeps the
// same 8 channels of each row it handles, so its sums stay in registers. Two kinds:
//   - Join (kernels/conv1x1_dgrad_join.h): dx is the gradient of a block's output from the next
//     block's conv1; its join, out = relu(bn3(a3) + shortcut), needs dz = (dx + g) where the ReLU
//     passed (its bits), g the shortcut's part (read from dz, then overwritten, or from a stride-2
//     shortcut's compact gradient), and the sums also of dz * xhat2 for a projection shortcut's BN;
//   - Inner (kernels/conv1x1_dgrad_bn.h, kernels/conv3x3.h): dx is the gradient of relu(bn(x)),
//     conv3's input (layer1's conv2's for the 3x3): dz = dx where bn(x) passed the ReLU as the forward's
//     prologue computed it (fp16 x * scale + shift).
// B: the filter as the GEMM reads it, w[k, n] (RowMajor, the 1x1's KRSC filter read N-major) or a
// 3x3's filter turned for its data gradient, w'[n][r][s][k], read K-major (ColumnMajor).
enum class GradKind { Join, Inner };

template <GradKind kKind, class B = cutlass::layout::RowMajor, bool kShortcutBn = true>
struct BnGradEpilogue {
  static constexpr bool kJoin = kKind == GradKind::Join;
  // A join whose shortcut has a BN (x2) reads a third side tile. The others (12 of the network's 16
  // joins) keep two, and the shared memory that frees (32 KB on ping-pong, two staging slots; 16 on
  // cooperative) goes to the stages: ping-pong 5 against 3 (their warps had waited on the stages'
  // TMA loads), the step 1.00% faster at batch 256 and 1.17% at 128 (H200, 2026-12-02,
  // bench/results/levers-session45-nvidia-h200-2026-12-02.md).
  static constexpr bool kDual = kJoin && kShortcutBn;
  static constexpr int kSums = kJoin ? 3 : 2;
  // Inner can finalize the BN itself (finalize_column). At the joins it measured slower: each join
  // kernel took about 7 µs longer, with 4 rows of sums a column or 132, and the step 0.9% (H200,
  // 2026-11-29, bench/results/levers-session18-nvidia-h200-2026-11-29.md); they keep the finalize
  // kernel after them.
  static constexpr bool kFinalizes = !kJoin;
  static constexpr int kSideTensors = kDual ? 3 : kJoin ? 2 : 1;  // tiles read beside its own: g, x and x2, or x
  using LayoutB = B;
  struct Params {
    cutlass::half_t* dz;   // [m, n]: out, dz (Join: in, the shortcut's part of the gradient, unless g_even)
    const uint8_t* bits;   // Join: the ReLU bits, one byte per 8 channels, bit j channel j
    const __half* x;       // [m, n]: the BN's input (Join: bn3's, a3), its batch mean and 1/std
    const float *mean, *invstd;
    const __half* x2;      // Join: [m, n], the shortcut BN's input, or nullptr (identity shortcut)
    const float *mean2, *invstd2;
    // Join: where the shortcut's part is not in dz, a stride-2 shortcut's compact gradient
    // [img][half_h][half_w][n], the part at dz's even rows and columns (zero elsewhere); dz's pixels
    // are divided into images (img_hw) and rows (img_w). Null: in dz.
    const cutlass::half_t* g_even;
    const cutlass::half_t* g;  // Join: the shortcut's part in a buffer of its own, or nullptr (in dz)
    cutlass::FastDivmod img_hw, img_w;
    int half_h, half_w;
    const __half2 *scale, *shift;  // Inner: the BN's fp16 scale and shift, as pairs of channels
    float* partials;       // [kSums][ctas_per_column][n]: dz, dz * xhat (, dz * xhat2)
    Conv1x1Finalize finalize;  // Inner, with finalize.arrivals: the BN backward's finalize in the kernel
  };

  template <class K>
  struct Run {
    static constexpr int kChunks = K::kTileN / 8;  // 8 channels, 16 bytes, a chunk
    static_assert(K::kTileThreads % kChunks == 0, "a thread's chunks must stay in one column");
    using Side = __half (*)[K::kSideRows][K::kTileN];
    const Params& p;
    float s0[8], s1[8], s2[8], mean[8], mean2[8];
    __half2 scale[4], shift[4];
    int col = 0;  // the thread's first column in the tile
    __device__ explicit Run(const Params& params) : p(params) {}
    __device__ const float* partials() const { return p.partials; }
    __device__ unsigned* arrivals() const { return p.finalize.arrivals; }
    // Channel c's (of n) weight gradients and apply coefficients from its sums of dz and dz * xhat
    // over M values (finalize_column), and what they read of the BN, loaded first.
    using ChannelInputs = BackwardInputs;
    __device__ ChannelInputs channel_inputs(int c) const { return load_backward_inputs(p.finalize.bn, c); }
    __device__ void finalize_channel(const ChannelInputs& in, const double* total, int c, int n, double M) const {
      const Conv1x1Finalize& f = p.finalize;
      finalize_backward_channel(f.bn, in, f.dgamma, f.dbeta, n, c, total[1], total[0], M);
    }
    __device__ void begin(int tt, int n0) {
      col = tt % kChunks * 8;
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < 8; ++j) {
        s0[j] = s1[j] = s2[j] = 0.f;
        mean[j] = p.mean[n0 + col + j];
        mean2[j] = kJoin && p.x2 ? p.mean2[n0 + col + j] : 0.f;
      }
      if constexpr (!kJoin)
        CUTLASS_PRAGMA_UNROLL
        for (int j2 = 0; j2 < 4; ++j2) {
          scale[j2] = p.scale[(n0 + col) / 2 + j2];
          shift[j2] = p.shift[(n0 + col) / 2 + j2];
        }
    }
    __device__ void values(int, float, float) {}
    // Inner: what the forward's prologue multiplied, relu(fp16 x * scale + shift), for a pair of the
    // thread's channels (j2 of its 4): the weight gradient's input (kernels/conv1x1_dgrad_wgrad_kernel.cuh).
    __device__ __half2 input_of(__half2 x, int j2) const { return __hfma2_relu(x, scale[j2], shift[j2]); }
    // A thread's chunks of the tile (kPerThread rows, the same 8 columns) of what it reads beside
    // dx, copied to shared memory (cp.async) and the bits to registers before the tile's mainloop,
    // so that they arrive while it multiplies: loaded after it, a chunk at a time (each a round
    // trip to memory), the kernel took twice its bytes' time; held in registers they spilled. Each
    // thread reads back only the chunks it copied: no barrier.
    static constexpr int kPerThread = K::kTileM * kChunks / K::kTileThreads;
    static_assert(K::kTileM * kChunks % K::kTileThreads == 0, "every thread the same number of chunks");
    unsigned bits[kPerThread];
    // The "memory" clobbers keep the compiler from moving the last tile's reads of the side tiles
    // past the next tile's copies into them.
    __device__ static void copy_async(__half* to, const void* from) {
      const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(to));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(from) : "memory");
    }
    // The shortcut's part of pixel `pixel`'s chunk: from dz, or from the compact gradient at an
    // even row and column and zero at the others.
    // Multiply-and-shift divisions (CUTLASS's FastDivmod): with a 64-bit division per chunk,
    // layer2.0's join kernel took 127 µs, against 99 with these and 96 reading all of dz (H200
    // traces, 2026-11-29).
    __device__ void load_shortcut(__half* to, int pixel, int64_t at, int n0, int n) const {
      if (!p.g_even) return copy_async(to, (p.g ? p.g : p.dz) + at);
      int img, in_img, y, x;
      p.img_hw(img, in_img, pixel);
      p.img_w(y, x, in_img);
      if ((y | x) & 1) {
        *reinterpret_cast<uint4*>(to) = uint4{0u, 0u, 0u, 0u};
        return;
      }
      const int64_t even = (int64_t(img) * p.half_h + y / 2) * p.half_w + x / 2;
      copy_async(to, p.g_even + even * n + n0 + col);
    }
    __device__ void load(Side side, int64_t row0, int n0, int n, int tt) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kPerThread; ++i) {
        const int row = (tt + i * K::kTileThreads) / kChunks;
        const int64_t at = (row0 + row) * n + n0 + col;
        copy_async(&side[0][row][col], p.x + at);
        if constexpr (kJoin) {
          load_shortcut(&side[1][row][col], int(row0 + row), at, n0, n);
          if constexpr (kDual)
            if (p.x2) copy_async(&side[2][row][col], p.x2 + at);
          bits[i] = __ldg(p.bits + at / 8);
        }
      }
      asm volatile("cp.async.commit_group;\n" ::: "memory");
    }
    // dz and the sums from the staged dx and what load() brought; dz stored (Join: over g).
    __device__ void rows(const __half (*staged)[K::kRowPitch], Side side, int64_t row0, int n0, int n, int tt) {
      const bool dual = kDual && p.x2 != nullptr;
      asm volatile("cp.async.wait_all;\n" ::: "memory");
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kPerThread; ++i) {
        const int row = (tt + i * K::kTileThreads) / kChunks;
        const uint4 dx = *reinterpret_cast<const uint4*>(&staged[row][col]);
        const uint4 xv = *reinterpret_cast<const uint4*>(&side[0][row][col]);
        const uint4 gv = kJoin ? *reinterpret_cast<const uint4*>(&side[1][row][col]) : uint4{};
        uint4 x2v{};
        if constexpr (kDual)
          if (dual) x2v = *reinterpret_cast<const uint4*>(&side[2][row][col]);
        const __half2* dxh = reinterpret_cast<const __half2*>(&dx);
        const __half2* xh = reinterpret_cast<const __half2*>(&xv);
        const __half2* gh = reinterpret_cast<const __half2*>(&gv);
        const __half2* x2h = reinterpret_cast<const __half2*>(&x2v);
        uint4 out;
        __half2* oh = reinterpret_cast<__half2*>(&out);
        CUTLASS_PRAGMA_UNROLL
        for (int j2 = 0; j2 < 4; ++j2) {
          const int j = 2 * j2;
          const float2 d = __half22float2(dxh[j2]), xf = __half22float2(xh[j2]);
          __half2 zh;
          if constexpr (kJoin) {
            const float2 g = __half22float2(gh[j2]);
            zh = __floats2half2_rn((bits[i] >> j) & 1u ? d.x + g.x : 0.f, (bits[i] >> (j + 1)) & 1u ? d.y + g.y : 0.f);
          } else {  // where relu(x * scale + shift), one fp16 multiply-add as the prologue does it, passed;
                    // selected, not multiplied by the mask: an inf in dx must not become a NaN
            const __half2 y = __hfma2(xh[j2], scale[j2], shift[j2]);
            zh = __floats2half2_rn(__low2float(y) > 0.f ? d.x : 0.f, __high2float(y) > 0.f ? d.y : 0.f);
          }
          oh[j2] = zh;
          const float2 z = __half22float2(zh);  // the sums of what is written, as the BN apply reads it
          s0[j] += z.x;
          s0[j + 1] += z.y;
          s1[j] += z.x * (xf.x - mean[j]);
          s1[j + 1] += z.y * (xf.y - mean[j + 1]);
          if (dual) {
            const float2 x2f = __half22float2(x2h[j2]);
            s2[j] += z.x * (x2f.x - mean2[j]);
            s2[j + 1] += z.y * (x2f.y - mean2[j + 1]);
          }
        }
        *reinterpret_cast<uint4*>(p.dz + (row0 + row) * n + n0 + col) = out;
      }
    }
    // Across the lanes of the same columns (lane % kChunks), then the warps through `stats`; the
    // sums of dz * (x - mean) scaled by invstd as they are written.
    template <class SlotColumn>
    __device__ void finish(int t, float (*stats)[K::kConsumerWarps][K::kTileN], SlotColumn, int row, int rows, int n0,
                           int n) {
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < 8; ++j)
        CUTLASS_PRAGMA_UNROLL
        for (int lanes = kChunks; lanes < 32; lanes *= 2) {
          s0[j] += __shfl_xor_sync(0xFFFFFFFF, s0[j], lanes);
          s1[j] += __shfl_xor_sync(0xFFFFFFFF, s1[j], lanes);
          if constexpr (kJoin) s2[j] += __shfl_xor_sync(0xFFFFFFFF, s2[j], lanes);
        }
      const int cw = t / 32, lane = t % 32;
      if (lane < kChunks) {
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < 8; ++j) {
          stats[0][cw][col + j] = s0[j];
          stats[1][cw][col + j] = s1[j];
          if constexpr (kJoin) stats[2][cw][col + j] = s2[j];
        }
      }
      cutlass::arch::NamedBarrier::sync(K::kConsumerThreads, K::kConsumersBarrier);
      if (kJoin && p.x2)
        write_partials<K, 3>(t, stats, p.partials, row, rows, n0, n, nullptr, p.invstd, p.invstd2);
      else
        write_partials<K, 2>(t, stats, p.partials, row, rows, n0, n, nullptr, p.invstd);
    }
  };
};
using JoinGradEpilogue = BnGradEpilogue<GradKind::Join>;
using IdentityJoinGradEpilogue = BnGradEpilogue<GradKind::Join, cutlass::layout::RowMajor, false>;
using InnerGradEpilogue = BnGradEpilogue<GradKind::Inner>;
using TurnedInnerGradEpilogue = BnGradEpilogue<GradKind::Inner, cutlass::layout::ColumnMajor>;

// What the GEMM multiplies as its A operand: x as stored, relu(x * scale + shift) (the previous BN,
// kernels/cutlass_prologue_mainloop.cuh) or the previous block's join with an identity shortcut or a
// projection's (JoinBn: the shortcut through its BN; kernels/cutlass_join_mainloop.cuh), computed as x
// is read. The joins are two kernels: each a branch less inside its mainloop. Taps: a 3x3 stride-1
// conv's implicit GEMM, x loaded at each tap (kernels/cutlass_taps_mainloop.cuh; the kernel lab's);
// Halo: the same conv, x loaded once for 3 taps and the filter once a CTA (kernels/cutlass_halo_mainloop.cuh).
// JoinGrad: a data gradient's dy made from the join's dz and a3 as they are read (the join's BN
// backward apply), each stage holding both tiles (kernels/cutlass_paired_mainloop.cuh); only the
// consumer of kernels/conv1x1_dgrad_wgrad_kernel.cuh makes it.
enum class Operand { Stored, Bn, Join, JoinBn, Taps, Halo, JoinGrad };

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
                                                               OwnMainloop>>>>>;
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

// The producer warp: the CTA's tiles of its column (every ctas_per_column-th row from `first`),
// each tile's k_tiles stages loaded in turn.
template <class K, class Inputs>
__device__ void produce_tiles(typename K::Mainloop& mainloop, typename K::Pipeline& pipeline,
                              const typename K::Params& p, const Inputs& inputs, typename K::SharedStorage& ss,
                              int first, int column, int k_tiles) {
  typename K::PipeState write = cutlass::make_producer_start_state<typename K::Pipeline>();
  for (int mt = first; mt < p.m_tiles; mt += p.ctas_per_column) {
    auto k_iter = make_coord_iterator(shape<3>(get<0>(inputs)));
    mainloop.load(p.mainloop, pipeline, write, inputs, make_coord(mt, column, _, 0), k_iter, k_tiles,
                  threadIdx.x % 32, 0, ss.tensors);
    write.advance(k_tiles);
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
    if constexpr (K::kGroupsPerTile == 1) turns.wait();
    if constexpr (K::kOperand == Operand::Join || K::kOperand == Operand::JoinBn)  // the first column's CTAs store it
      mainloop.mma(pipeline, read, accum, k_tiles, tt, ss.tensors, p.mainloop, mt, column == 0);
    else
      mainloop.mma(pipeline, read, accum, k_tiles, tt, ss.tensors, p.mainloop);
    if constexpr (K::kGroupsPerTile == 1) turns.arrive();
    mainloop.mma_tail(pipeline, read, k_tiles);  // the wgmmas done, the last stages given back
    read.advance(k_tiles * (2 / K::kGroupsPerTile));  // its own tile, and ping-pong: the other's
    write_tile<K>(accum, cC, staged, side, epilogue, int64_t(mt) * TileM, n0, p.n, tt, group);
  }
  epilogue.finish(t, ss.stats, slot_column, first, p.ctas_per_column, n0, p.n);
  if constexpr (K::Epi::kFinalizes)
    if (epilogue.arrivals()) finalize_column<K>(t, ss, epilogue, column, p.ctas_per_column, n0, p.n, double(p.m));
#endif
}

}  // namespace trainer_kernels
