// What the batch-norm kernels share (batchnorm_stats.cu, batchnorm_apply.cu, batchnorm_backward.cu,
// batchnorm_eval.cu): launch geometry, the reductions over the batch (the per-channel finalize is
// batchnorm_channel.cuh), and the per-channel constants the elementwise passes load.
//
// Batch norm in training and evaluation mode, fused with the residual add and ReLU.
//
// Forward:  stats (partial sums per chunk of rows) -> finalize (per channel) -> apply (elementwise).
// Backward: reduce (partial sums of dz, dz*xhat)   -> finalize (per channel) -> apply (elementwise).
// Partial sums go to scratch in a fixed grid and are added in a fixed order, so results are
// bit-identical from run to run (no float atomics). Sums are taken of x - x[first element of the
// channel], which keeps E[x^2] - E[x]^2 accurate when the mean is large against the spread.
//
// These passes move most of a training step's bytes (the conv outputs are read and written about
// ten times per step), so they are written for memory bandwidth: 16-byte accesses, several loads in
// flight per thread, per-channel constants loaded once per thread in NHWC, 32-bit index arithmetic
// (no 64-bit division per element), and block reductions through warp shuffles.
#pragma once

#include <algorithm>
#include <cstdint>

#include "batchnorm.h"
#include "batchnorm_channel.cuh"
#include "common.cuh"

namespace trainer_kernels {  // why: kernels/common.cuh
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxSums = 3;
// NHWC reductions: about 4 blocks per SM of a 132-SM H100/H200; with 2-4 loads in flight per thread
// that keeps enough bytes in flight to reach memory bandwidth, and keeps finalize's work small.
constexpr int kNhwcTargetBlocks = 528;
constexpr int kRowsPerThread = 4;       // at least this many rows per thread before adding chunks
constexpr int kNchwTargetBlocks = 1024;

// ---- reduction geometry ------------------------------------------------------------------------
// NHWC: the tensor is M = N*H*W rows of C channels, CV = C / kVec vectors per row. A block covers a
// tile of L vectors across (L a power of two, at most 32, so that the rows of one warp can be added
// with shuffles) and R = 256 / L rows at a time, over one chunk of rows.
// NCHW: a block covers one channel over one chunk of images.
struct NhwcTile {
  int lanes;  // L
  int rows;   // R
  int tiles;  // tiles across the channels
};

template <class T>
HOST_DEVICE NhwcTile nhwc_tile(int channels) {
  const int CV = channels / kVec<T>;
  int L = 1;
  while (L < 32 && 2 * L <= CV) L *= 2;
  return {L, kThreads / L, (CV + L - 1) / L};
}

struct ReduceGrid {
  int tiles_or_channels;  // grid.x
  int chunks;             // grid.y
  int rows_per_chunk;     // NHWC rows (a multiple of R) or NCHW images
};

template <class T>
ReduceGrid reduce_grid(Shape4 s, Layout l) {
  if (l == Layout::NHWC) {
    const NhwcTile t = nhwc_tile<T>(s.c);
    const size_t rows = s.per_channel();
    size_t chunks = std::max(1, kNhwcTargetBlocks / t.tiles);
    chunks = std::min(chunks, std::max<size_t>(1, rows / (size_t(t.rows) * kRowsPerThread)));
    // Whole multiples of R per chunk, so every thread of a chunk gets the same number of rows.
    const size_t per_chunk = (rows + chunks - 1) / chunks;
    const size_t aligned = (per_chunk + t.rows - 1) / t.rows * t.rows;
    return {t.tiles, static_cast<int>((rows + aligned - 1) / aligned), static_cast<int>(aligned)};
  }
  const int chunks = std::clamp(kNchwTargetBlocks / s.c, 1, s.n);
  return {s.c, chunks, (s.n + chunks - 1) / chunks};
}

inline void check_supported(Shape4 s, DType t, Layout l) {
  const int V = static_cast<int>(16 / dtype_size(t));
  if (const std::string why = bn_layout_refusal(s, t, l); !why.empty()) throw Fatal(why);
  // The elementwise kernels index vectors with 32 bits (a grid-stride step added on top must fit).
  if (s.count() / V >= (size_t(1) << 31))
    throw Fatal("batch norm: a tensor of " + std::to_string(s.count()) + " elements is too large (at most 2^31 " +
                "16-byte vectors); use a smaller --batch");
}

// Per-channel constants for the kVec elements starting at channel c0: in NHWC they are consecutive
// channels, in NCHW all the same channel.
template <class T, Layout L>
__device__ __forceinline__ void load_channel_consts(const float* src, int c0, float (&out)[kVec<T>]) {
#pragma unroll
  for (int j = 0; j < kVec<T>; ++j) out[j] = src[L == Layout::NHWC ? c0 + j : c0];
}

// The first channel of vector i (of kVec elements).
template <class T, Layout L>
__device__ __forceinline__ int channel_of(unsigned i, Shape4 s) {
  if (L == Layout::NHWC) return static_cast<int>(i % unsigned(s.c / kVec<T>)) * kVec<T>;
  return static_cast<int>((i / unsigned(s.h * s.w / kVec<T>)) % unsigned(s.c));
}

// The forward's pre-activation of a BN without residual, as apply_forward computes and rounds it.
// Backward recomputes the ReLU mask from x with it instead of reading the stored output: the same
// fmaf and the same rounding to T, so the mask is the stored output's, bit for bit.
__device__ __forceinline__ float affine(float x, float scale, float shift) { return fmaf(x, scale, shift); }
template <class T>
__device__ __forceinline__ bool relu_passes(float x, float scale, float shift) {
  return to_float(from_float<T>(affine(x, scale, shift))) > 0.f;
}

// ---- the reductions ----------------------------------------------------------------------------
// A reduction op (StatsOp in batchnorm_stats.cu, BackwardOp in batchnorm_backward.cu) loads U
// vectors (all loads first, so they are in flight together), then adds them into acc[sum][element].

// partials layout: [sum][chunk][channel]
// Op::kMinBlocks: the blocks of 256 threads each SM must hold at once, a register cap for the
// compiler (0: none). At 4, the kNhwcTargetBlocks of a large tensor run as one wave.
template <class T, class Op>
__global__ void __launch_bounds__(kThreads, Op::kMinBlocks)
    reduce_nhwc(Op op, Shape4 s, int rows_per_chunk, float* partials) {
  chain_wait();  // launched chained (kernels/chained_launch.h)
  constexpr int V = kVec<T>, S = Op::kSums, U = Op::kUnroll;
  __shared__ float red[kWarps][S * V * 32];
  const NhwcTile tile = nhwc_tile<T>(s.c);
  const int L = tile.lanes, R = tile.rows, CV = s.c / V;
  const int lane = threadIdx.x % L, r0 = threadIdx.x / L;
  const int cv = blockIdx.x * L + lane;
  const size_t M = s.per_channel();
  const size_t rb = size_t(blockIdx.y) * rows_per_chunk;
  const size_t re = rb + rows_per_chunk < M ? rb + rows_per_chunk : M;
  float acc[S][V] = {};
  if (cv < CV) {
    op.begin(cv * V);
    const size_t col = size_t(cv) * V;
    size_t r = rb + r0;
    for (; r + size_t(U - 1) * R < re; r += size_t(U) * R) {
      size_t off[U];
#pragma unroll
      for (int u = 0; u < U; ++u) off[u] = (r + size_t(u) * R) * s.c + col;
      op.accumulate(off, acc);
    }
    for (; r < re; r += R) {
      const size_t off[1] = {r * s.c + col};
      op.accumulate(off, acc);
    }
  }
  // The rows of one warp that share a lane hold the same channels: add them with shuffles (every
  // thread takes part, those past the last channel with zeros), then the warps through shared memory.
#pragma unroll
  for (int k = 0; k < S; ++k)
#pragma unroll
    for (int j = 0; j < V; ++j)
      for (int o = L; o < 32; o <<= 1) acc[k][j] += __shfl_xor_sync(0xffffffffu, acc[k][j], o);
  const int warp = threadIdx.x / 32, wl = threadIdx.x % 32;
  if (wl < L) {
#pragma unroll
    for (int k = 0; k < S; ++k)
#pragma unroll
      for (int j = 0; j < V; ++j) red[warp][(k * V + j) * L + wl] = acc[k][j];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < S * V * L; idx += kThreads) {
    float t = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) t += red[w][idx];
    const int l = idx % L, j = (idx / L) % V, k = idx / (L * V);
    const int c_vec = blockIdx.x * L + l;
    if (c_vec < CV) partials[(size_t(k) * gridDim.y + blockIdx.y) * s.c + c_vec * V + j] = t;
  }
}

template <class T, class Op>
__global__ void __launch_bounds__(kThreads) reduce_nchw(Op op, Shape4 s, int images_per_chunk, float* partials) {
  chain_wait();  // launched chained (kernels/chained_launch.h)
  constexpr int V = kVec<T>, S = Op::kSums;
  __shared__ float red[S][kWarps];
  const int c = blockIdx.x;
  const unsigned HWV = unsigned(s.h * s.w / V);
  const int nb = blockIdx.y * images_per_chunk;
  const int ne = nb + images_per_chunk < s.n ? nb + images_per_chunk : s.n;
  float acc[S][V] = {};
  op.begin(c);
  const unsigned total = ne > nb ? unsigned(ne - nb) * HWV : 0;
  for (unsigned v = threadIdx.x; v < total; v += kThreads) {
    const unsigned n = nb + v / HWV, p = v % HWV;
    const size_t off[1] = {(size_t(n) * s.c + c) * (size_t(HWV) * V) + size_t(p) * V};
    op.accumulate(off, acc);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int k = 0; k < S; ++k) {
    float t = 0.f;
#pragma unroll
    for (int j = 0; j < V; ++j) t += acc[k][j];
    t = warp_sum(t);
    if (lane == 0) red[k][warp] = t;
  }
  __syncthreads();
  if (threadIdx.x < S) {
    float t = 0.f;
    for (int w = 0; w < kWarps; ++w) t += red[threadIdx.x][w];
    partials[(size_t(threadIdx.x) * gridDim.y + blockIdx.y) * s.c + c] = t;
  }
}

template <class T, Layout L, class Op>
void launch_reduce(const Op& op, Shape4 s, ReduceGrid g, float* partials, cudaStream_t stream) {
  const dim3 grid(g.tiles_or_channels, g.chunks);
  if (L == Layout::NHWC)
    launch_chained(reduce_nhwc<T, Op>, grid, kThreads, 0, stream, op, s, g.rows_per_chunk, partials);
  else
    launch_chained(reduce_nchw<T, Op>, grid, kThreads, 0, stream, op, s, g.rows_per_chunk, partials);
  CUDA_CHECK_LAUNCH();
}

// ---- per-channel finalize ----------------------------------------------------------------------
// One warp per channel: lane l adds chunks l, l+32, ... in order, then a fixed shuffle tree adds the
// lanes, so the result is the same bit for bit on every run.
constexpr int kFinalizeWarps = 4;

__device__ __forceinline__ double warp_sum_double(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over chunks of partials[(k * chunks + chunk) * C + c], in double.
__device__ __forceinline__ double sum_chunks(const float* partials, int k, int chunks, int C, int c, int lane) {
  double t = 0;
  for (int ch = lane; ch < chunks; ch += 32) t += partials[(size_t(k) * chunks + ch) * C + c];
  return warp_sum_double(t);
}

// The same for many rows: a block of 32 x 32 threads per 32 channels, where thread (x, y) adds
// column c = 32 * blockIdx.x + x of rows y, y + 32, ... (a row's 32 channels one 128-byte load, not
// a warp per channel whose lanes read one float from each of 32 rows), in double; then each column's
// 32 threads are added in a fixed order. On an H200 (2026-11-29) layer1's conv3 data-gradient
// finalize (132 rows of 64 channels, beside the weight gradients' GEMMs) went from 10-11 to 7-8.5 us,
// the step 0.29% faster; blocks of 8 or 16 channels (more of them, for narrow BNs) made the step
// 0.67% slower. Sum k's row r is at partials + k * k_stride + r * ld. Returns whether this thread
// holds the totals (y == 0 and c < C); launch with dim3(32, 32) and column_finalize_blocks(C) blocks.
constexpr int kColumnsPerFinalize = 32;
template <int K>
__device__ bool sum_rows_of_column(const float* partials, size_t k_stride, int rows, int ld, int C, double (&t)[K]) {
  __shared__ double acc[K][32][33];
  const int c = blockIdx.x * kColumnsPerFinalize + threadIdx.x;
#pragma unroll
  for (int k = 0; k < K; ++k) t[k] = 0;
  if (c < C) {
#pragma unroll 4
    for (int r = threadIdx.y; r < rows; r += 32)
#pragma unroll
      for (int k = 0; k < K; ++k) t[k] += partials[k * k_stride + size_t(r) * ld + c];
  }
#pragma unroll
  for (int k = 0; k < K; ++k) acc[k][threadIdx.y][threadIdx.x] = t[k];
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return false;
  for (int r = 1; r < 32; ++r)
#pragma unroll
    for (int k = 0; k < K; ++k) t[k] += acc[k][r][threadIdx.x];
  return true;
}
inline unsigned column_finalize_blocks(int C) {
  return static_cast<unsigned>((C + kColumnsPerFinalize - 1) / kColumnsPerFinalize);
}

// ---- elementwise apply ---------------------------------------------------------------------------
// Grid-stride loops over 16-byte vectors. In NHWC the grid-stride step (a multiple of 256 vectors)
// is a multiple of the vectors per row whenever that is a power of two up to 256, so a thread's
// channels never change and its per-channel constants are loaded once; it then handles two vectors
// per iteration so that both sets of loads are in flight together. In NCHW the channel changes
// along the loop, and the constants are reloaded when it does.
template <Layout L>
constexpr int kApplyUnroll = L == Layout::NHWC ? 2 : 1;

// Picks the template instance for runtime flags: f.template operator()<T, L>().
template <class F>
void dispatch(DType t, Layout l, F&& f) {
  if (t == DType::F32) {
    if (l == Layout::NCHW) f.template operator()<float, Layout::NCHW>();
    else f.template operator()<float, Layout::NHWC>();
  } else {
    if (l == Layout::NCHW) f.template operator()<__half, Layout::NCHW>();
    else f.template operator()<__half, Layout::NHWC>();
  }
}

inline unsigned channel_blocks(int C) { return static_cast<unsigned>((C + 127) / 128); }
inline unsigned finalize_blocks(int C) { return static_cast<unsigned>((C + kFinalizeWarps - 1) / kFinalizeWarps); }

}  // namespace
}  // namespace trainer_kernels
