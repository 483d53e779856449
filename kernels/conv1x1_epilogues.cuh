// The epilogues of our resident 1x1 (and 3x3) conv kernels (kernels/conv1x1_stats_kernel.cuh): what
// a tile's threads do with its output on the way out, beside the GEMM.
//
// An epilogue is a type with:
//   - kSums: the kinds of per-channel sums it adds up (rows of partial sums, one row a CTA);
//   - kFinalizes: whether it can finalize the BN itself in the column's last CTA (finalize_column);
//   - kSideTensors: the tiles it reads beside its own, copied to shared memory while the tile's
//     mainloop runs (the kernel reserves that many slots a tile);
//   - LayoutB: the filter's layout as the GEMM reads it;
//   - Params, and Run<K>, one per consumer thread: begin() before the CTA's first tile, values()
//     with each pair of fp32 accumulators, load() of the side tiles before a tile's mainloop,
//     rows() of the staged fp16 tile, finish() with the CTA's sums at its end; and for
//     finalize_column, partials(), arrivals(), channel_inputs() and finalize_channel().
// StatsEpilogue is the forward's (kernels/conv1x1_stats.h), BnGradEpilogue the data gradients'
// (kernels/conv1x1_dgrad_join.h, conv1x1_dgrad_bn.h, conv3x3.h, conv3x3_stride2.h).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "cutlass/arch/barrier.h"
#include "cutlass/fast_math.h"
#include "cutlass/layout/matrix.h"
#include "kernels/batchnorm_channel.cuh"
#include "kernels/conv1x1_finalize.h"

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

// kPhases (Inner): the GEMM's rows are a stride-2 3x3 data gradient's four phases, each of dy's
// pixels (kernels/cutlass_phases_mainloop.cuh); row -> dz's (and x's) pixel by pixel_of().
template <GradKind kKind, class B = cutlass::layout::RowMajor, bool kShortcutBn = true, bool kPhases = false>
struct BnGradEpilogue {
  static constexpr bool kJoin = kKind == GradKind::Join;
  static_assert(!kPhases || !kJoin, "the phases are an inner BN's data gradient");
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
    // kPhases: a phase's rows (phase_rows: dy's pixels, divided into images by img_hw and rows by
    // img_w, dy being half_h x half_w), the phases one after another.
    cutlass::FastDivmod phase_rows;
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
    // The pixel of dz (and x) that GEMM row `row` makes: the row itself, or with the phases dx's
    // [img][2 i + a][2 j + b] for phase a * 2 + b's dy pixel [img][i][j].
    __device__ int64_t pixel_of(int64_t row) const {
      if constexpr (!kPhases) {
        return row;
      } else {
        int phase, m, img, in_img, i, j;
        p.phase_rows(phase, m, int(row));
        p.img_hw(img, in_img, m);
        p.img_w(i, j, in_img);
        return (int64_t(img) * 2 * p.half_h + 2 * i + (phase >> 1)) * (2 * p.half_w) + 2 * j + (phase & 1);
      }
    }
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
        const int64_t at = pixel_of(row0 + row) * n + n0 + col;
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
        *reinterpret_cast<uint4*>(p.dz + pixel_of(row0 + row) * n + n0 + col) = out;
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
using PhasesInnerGradEpilogue = BnGradEpilogue<GradKind::Inner, cutlass::layout::ColumnMajor, true, true>;

}  // namespace trainer_kernels
