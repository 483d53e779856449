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
#include <algorithm>
#include <cstdint>

#include "batchnorm.h"
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

void check_supported(Shape4 s, DType t, Layout l) {
  const int V = static_cast<int>(16 / dtype_size(t));
  if (l == Layout::NHWC && s.c % V != 0)
    throw Fatal("batch norm: NHWC needs channels divisible by " + std::to_string(V) + ", got " + std::to_string(s.c));
  if (l == Layout::NCHW && (s.h * s.w) % V != 0)
    throw Fatal("batch norm: NCHW needs H*W divisible by " + std::to_string(V) + ", got " + std::to_string(s.h * s.w));
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

// ---- the reduction ops ---------------------------------------------------------------------------
// Each op loads U vectors (all loads first, so they are in flight together), then adds them into
// acc[sum][element].
template <class T, Layout L>
struct StatsOp {  // sums of (x - shift) and (x - shift)^2
  static constexpr int kSums = 2;
  static constexpr int kUnroll = 4;
  static constexpr int V = kVec<T>;
  const T* x;
  Shape4 s;
  float shift[V];
  __device__ void begin(int c0) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int c = L == Layout::NHWC ? c0 + j : c0;
      shift[j] = to_float(x[L == Layout::NHWC ? size_t(c) : size_t(c) * s.h * s.w]);
    }
  }
  template <int U>
  __device__ void accumulate(const size_t (&off)[U], float (&acc)[kSums][V]) {
    float v[U][V];
#pragma unroll
    for (int u = 0; u < U; ++u) load_vec(x + off[u], v[u]);
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float d = v[u][j] - shift[j];
        acc[0][j] += d;
        acc[1][j] += d * d;
      }
  }
};

template <class T, Layout L, ReluMask kMask, bool kDual>
struct BackwardOp {  // sums of dz, dz * xhat, and dz * xhat2 for the second BN
  static constexpr int kSums = kDual ? 3 : 2;
  static constexpr int kLoads = 2 + (kMask == ReluMask::FromOutput) + kDual;
  static constexpr int kUnroll = kLoads <= 2 ? 4 : 2;
  static constexpr int V = kVec<T>;
  const T *dy, *y, *x, *x2;
  const uint8_t* bits;
  const float *mean, *invstd, *mean2, *invstd2, *scale, *shift;
  float m[V], is[V], m2[V], is2[V], sc[V], sh[V];
  __device__ void begin(int c0) {
    load_channel_consts<T, L>(mean, c0, m);
    load_channel_consts<T, L>(invstd, c0, is);
    if (kDual) {
      load_channel_consts<T, L>(mean2, c0, m2);
      load_channel_consts<T, L>(invstd2, c0, is2);
    }
    if (kMask == ReluMask::FromInput) {
      load_channel_consts<T, L>(scale, c0, sc);
      load_channel_consts<T, L>(shift, c0, sh);
    }
  }
  template <int U>
  __device__ void accumulate(const size_t (&off)[U], float (&acc)[kSums][V]) {
    float g[U][V], xv[U][V], yv[U][V], x2v[U][V];
    unsigned bv[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      load_vec(dy + off[u], g[u]);
      load_vec(x + off[u], xv[u]);
      if (kMask == ReluMask::FromOutput) load_vec(y + off[u], yv[u]);
      if (kMask == ReluMask::FromBits) bv[u] = bits[off[u] / V];
      if (kDual) load_vec(x2 + off[u], x2v[u]);
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int j = 0; j < V; ++j) {
        bool pass = true;
        if (kMask == ReluMask::FromOutput) pass = yv[u][j] > 0.f;
        if (kMask == ReluMask::FromBits) pass = (bv[u] >> j) & 1u;
        if (kMask == ReluMask::FromInput) pass = relu_passes<T>(xv[u][j], sc[j], sh[j]);
        const float dz = pass ? g[u][j] : 0.f;
        acc[0][j] += dz;
        acc[1][j] += dz * (xv[u][j] - m[j]) * is[j];
        if (kDual) acc[2][j] += dz * (x2v[u][j] - m2[j]) * is2[j];
      }
  }
};

// partials layout: [sum][chunk][channel]
template <class T, class Op>
__global__ void __launch_bounds__(kThreads) reduce_nhwc(Op op, Shape4 s, int rows_per_chunk, float* partials) {
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
    reduce_nhwc<T, Op><<<grid, kThreads, 0, stream>>>(op, s, g.rows_per_chunk, partials);
  else
    reduce_nchw<T, Op><<<grid, kThreads, 0, stream>>>(op, s, g.rows_per_chunk, partials);
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

// The per-channel kernels below are all latency: a channel's few loads and stores, one thread each.
// Each reads its inputs before its first store. The compiler cannot move a load above a store
// through another pointer (they might alias), so a load written after a store is issued only
// there, and the loads and stores would alternate, each a round trip to memory (a 3.3 µs
// finalize_sums on an H100; 1.6 µs with the loads first).
struct ForwardInputs {
  float gamma, beta, running_mean, running_var;
};
struct Coefs {  // a channel's scale and shift
  float scale, shift;
};
__device__ __forceinline__ ForwardInputs load_forward_inputs(const BnChannelState& bn, int c) {
  return {bn.gamma[c], bn.beta[c], bn.running_mean[c], bn.running_var[c]};
}

// Channel c's batch mean and (biased) variance over M values -> save_mean, save_invstd, scale,
// shift and the running statistics (unbiased variance, PyTorch's momentum convention); returns
// scale and shift.
__device__ Coefs store_batch_stats(const BnChannelState& bn, int c, const ForwardInputs& in, double mean, double var,
                                  double M) {
  const float invstd = static_cast<float>(1.0 / sqrt(var + kBnEps));
  bn.save_mean[c] = static_cast<float>(mean);
  bn.save_invstd[c] = invstd;
  const float scale = in.gamma * invstd, shift = in.beta - static_cast<float>(mean) * scale;
  bn.scale[c] = scale;
  bn.shift[c] = shift;
  const double unbiased = M > 1 ? var * M / (M - 1) : var;
  bn.running_mean[c] = static_cast<float>((1.0 - kBnMomentum) * in.running_mean + kBnMomentum * mean);
  bn.running_var[c] = static_cast<float>((1.0 - kBnMomentum) * in.running_var + kBnMomentum * unbiased);
  return {scale, shift};
}

template <class T, Layout L>
__global__ void finalize_stats(const float* partials, int chunks, const T* x, Shape4 s, BnChannelState bn) {
  const int c = blockIdx.x * kFinalizeWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (c >= s.c) return;
  const ForwardInputs in = load_forward_inputs(bn, c);
  const double s1 = sum_chunks(partials, 0, chunks, s.c, c, lane);
  const double s2 = sum_chunks(partials, 1, chunks, s.c, c, lane);
  if (lane != 0) return;
  const double M = double(s.per_channel());
  const double shift = to_float(x[L == Layout::NHWC ? size_t(c) : size_t(c) * s.h * s.w]);
  const double dmean = s1 / M;
  double var = s2 / M - dmean * dmean;
  if (var < 0) var = 0;
  const double mean = shift + dmean;
  store_batch_stats(bn, c, in, mean, var, M);
}

// Training statistics from per-channel sums of x and x^2 over M values each (a fused conv's
// statistics, batchnorm.h bn_finalize_sums), in double: the variance as E[x^2] - E[x]^2. The sums are
// zeroed once read, ready for the conv's next accumulation.
__global__ void finalize_sums(float* sum, float* sqsum, double M, BnChannelState bn, int C, __half* scale_h,
                              __half* shift_h) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const double s1 = sum[c], s2 = sqsum[c];
  const ForwardInputs in = load_forward_inputs(bn, c);
  sum[c] = 0.f;
  sqsum[c] = 0.f;
  const double mean = s1 / M;
  double var = s2 / M - mean * mean;
  if (var < 0) var = 0;
  const Coefs k = store_batch_stats(bn, c, in, mean, var, M);
  if (scale_h) {  // the fp16 copies a fused conv's prologue reads
    scale_h[c] = __float2half_rn(k.scale);
    shift_h[c] = __float2half_rn(k.shift);
  }
}

// Channel c's evaluation scale and shift, stored and returned (every load before the stores).
__device__ __forceinline__ Coefs eval_coef(const BnChannelState& bn, int c) {
  const ForwardInputs in = load_forward_inputs(bn, c);
  const float scale = in.gamma * rsqrtf(in.running_var + kBnEps);
  const float shift = in.beta - in.running_mean * scale;
  bn.scale[c] = scale;
  bn.shift[c] = shift;
  return {scale, shift};
}

__global__ void eval_coefs(BnChannelState bn, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c < C) eval_coef(bn, c);
}

// grid.y: one BN each.
__global__ void eval_coefs_all(const BnEvalTarget* targets) {
  const BnEvalTarget& t = targets[blockIdx.y];
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= t.channels) return;
  const Coefs k = eval_coef(t.st, c);
  if (t.scale_h) {
    static_cast<__half*>(t.scale_h)[c] = __float2half_rn(k.scale);
    static_cast<__half*>(t.shift_h)[c] = __float2half_rn(k.shift);
  }
}

// grid.y: one filter each; grid-stride over its k * c values, 8 at a time (16-byte loads and stores)
// where c is a multiple of 8 and both filters are 16-byte aligned, as the network's are.
__global__ void fold_filters(const FilterFold* targets) {
  const FilterFold& t = targets[blockIdx.y];
  const size_t n = size_t(t.k) * t.c;
  const __half* w = static_cast<const __half*>(t.w);
  __half* out = static_cast<__half*>(t.w_folded);
  const size_t first = blockIdx.x * size_t(blockDim.x) + threadIdx.x, step = size_t(gridDim.x) * blockDim.x;
  if (t.c % 8 == 0 && (reinterpret_cast<uintptr_t>(w) | reinterpret_cast<uintptr_t>(out)) % 16 == 0) {
    for (size_t v = first; v < n / 8; v += step) {
      uint4 raw = reinterpret_cast<const uint4*>(w)[v];
      const float s = t.scale[v * 8 / t.c];
      __half2* h = reinterpret_cast<__half2*>(&raw);
      for (int j = 0; j < 4; ++j) h[j] = __floats2half2_rn(__low2float(h[j]) * s, __high2float(h[j]) * s);
      reinterpret_cast<uint4*>(out)[v] = raw;
    }
    return;
  }
  for (size_t i = first; i < n; i += step) out[i] = __float2half_rn(__half2float(w[i]) * t.scale[i / t.c]);
}

// What backward_coefs reads of channel c, loaded before the first store (see ForwardInputs).
struct BackwardInputs {
  float invstd, gamma, mean;
};
__device__ __forceinline__ BackwardInputs load_backward_inputs(const BnChannelState& bn, int c) {
  return {bn.save_invstd[c], bn.gamma[c], bn.save_mean[c]};
}

// dx = a*dz + k_x*x + k_c with a = gamma*invstd, k_x = -a*invstd*dgamma/M,
// k_c = -a*dbeta/M - k_x*mean: the usual formula, expanded so apply needs no xhat.
__device__ void backward_coefs(const BnChannelState& bn, const BackwardInputs& in, int C, int c, double dgamma,
                               double dbeta, double M) {
  const double invstd = in.invstd;
  const double a = double(in.gamma) * invstd;
  const double kx = -a * invstd * dgamma / M;
  const double kc = -a * dbeta / M - kx * in.mean;
  bn.bwd_coef[c] = static_cast<float>(a);
  bn.bwd_coef[C + c] = static_cast<float>(kx);
  bn.bwd_coef[2 * C + c] = static_cast<float>(kc);
}

__global__ void finalize_backward(const float* partials, int chunks, int C, size_t M, int sums,
                                  BnChannelState bn, float* dgamma, float* dbeta,
                                  BnChannelState bn2, float* dgamma2, float* dbeta2) {
  const int c = blockIdx.x * kFinalizeWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (c >= C) return;
  const BackwardInputs in = load_backward_inputs(bn, c);
  const BackwardInputs in2 = sums == 3 ? load_backward_inputs(bn2, c) : BackwardInputs{};
  const double t0 = sum_chunks(partials, 0, chunks, C, c, lane);
  const double t1 = sum_chunks(partials, 1, chunks, C, c, lane);
  const double t2 = sums == 3 ? sum_chunks(partials, 2, chunks, C, c, lane) : 0.0;
  if (lane != 0) return;
  dbeta[c] = static_cast<float>(t0);
  dgamma[c] = static_cast<float>(t1);
  backward_coefs(bn, in, C, c, t1, t0, double(M));
  if (sums == 3) {
    dbeta2[c] = static_cast<float>(t0);
    dgamma2[c] = static_cast<float>(t2);
    backward_coefs(bn2, in2, C, c, t2, t0, double(M));
  }
}

// ---- elementwise apply ---------------------------------------------------------------------------
// Grid-stride loops over 16-byte vectors. In NHWC the grid-stride step (a multiple of 256 vectors)
// is a multiple of the vectors per row whenever that is a power of two up to 256, so a thread's
// channels never change and its per-channel constants are loaded once; it then handles two vectors
// per iteration so that both sets of loads are in flight together. In NCHW the channel changes
// along the loop, and the constants are reloaded when it does.
template <Layout L>
constexpr int kApplyUnroll = L == Layout::NHWC ? 2 : 1;

template <class T, Layout L, bool kRelu, Residual kRes>
__global__ void __launch_bounds__(kThreads) apply_forward(ApplyArgs a, Shape4 s, unsigned vecs) {
  constexpr int V = kVec<T>, U = kApplyUnroll<L>;
  const T* x_in = static_cast<const T*>(a.x);
  const T* res_in = static_cast<const T*>(a.res);
  T* y_out = static_cast<T*>(a.y);
  const unsigned stride = gridDim.x * kThreads;
  float sc[V], sh[V], rs[V], rh[V];
  int loaded = -1;
  for (unsigned i0 = blockIdx.x * kThreads + threadIdx.x; i0 < vecs; i0 += U * stride) {
    float x[U][V], r[U][V];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const unsigned i = i0 + u * stride;
      if (u > 0 && i >= vecs) break;
      load_vec(x_in + size_t(i) * V, x[u]);
      if (kRes != Residual::None) load_vec(res_in + size_t(i) * V, r[u]);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const unsigned i = i0 + u * stride;
      if (u > 0 && i >= vecs) break;
      const int c0 = channel_of<T, L>(i, s);
      if (c0 != loaded) {
        load_channel_consts<T, L>(a.scale, c0, sc);
        load_channel_consts<T, L>(a.shift, c0, sh);
        if (kRes == Residual::BatchNorm) {
          load_channel_consts<T, L>(a.res_scale, c0, rs);
          load_channel_consts<T, L>(a.res_shift, c0, rh);
        }
        loaded = c0;
      }
      float y[V];
      unsigned bits = 0;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        float v = affine(x[u][j], sc[j], sh[j]);
        if (kRes == Residual::Tensor) v += r[u][j];
        if (kRes == Residual::BatchNorm) v += r[u][j] * rs[j] + rh[j];
        y[j] = kRelu ? fmaxf(v, 0.f) : v;
        bits |= unsigned(to_float(from_float<T>(y[j])) > 0.f) << j;  // y > 0 as stored
      }
      store_vec(y_out + size_t(i) * V, y);
      if (kRelu && a.relu_bits) a.relu_bits[i] = static_cast<uint8_t>(bits);
    }
  }
}

// Device-side arguments of the backward apply (the host struct holds host pointers to BN state).
struct BackwardApply {
  const void *dy, *y, *x, *x2;
  const uint8_t* bits;
  const float *coef, *coef2;    // 3*C each: k_dz, k_x, k_c
  const float *scale, *shift;   // the forward's, for a ReLU mask recomputed from x
  void *dx, *dx2, *dres;
};

template <class T, Layout L, ReluMask kMask, bool kDual, bool kDres>
__global__ void __launch_bounds__(kThreads) apply_backward(BackwardApply a, Shape4 s, unsigned vecs) {
  constexpr int V = kVec<T>, U = kApplyUnroll<L>;
  const int C = s.c;
  const T* dy_in = static_cast<const T*>(a.dy);
  const T* y_in = static_cast<const T*>(a.y);
  const T* x_in = static_cast<const T*>(a.x);
  const T* x2_in = static_cast<const T*>(a.x2);
  const unsigned stride = gridDim.x * kThreads;
  float ka[V], kx[V], kc[V], ka2[V], kx2[V], kc2[V], sc[V], sh[V];
  int loaded = -1;
  for (unsigned i0 = blockIdx.x * kThreads + threadIdx.x; i0 < vecs; i0 += U * stride) {
    float g[U][V], x[U][V], y[U][V], x2[U][V];
    unsigned bv[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const unsigned i = i0 + u * stride;
      if (u > 0 && i >= vecs) break;
      load_vec(dy_in + size_t(i) * V, g[u]);
      load_vec(x_in + size_t(i) * V, x[u]);
      if (kMask == ReluMask::FromOutput) load_vec(y_in + size_t(i) * V, y[u]);
      if (kMask == ReluMask::FromBits) bv[u] = a.bits[i];
      if (kDual) load_vec(x2_in + size_t(i) * V, x2[u]);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const unsigned i = i0 + u * stride;
      if (u > 0 && i >= vecs) break;
      const int c0 = channel_of<T, L>(i, s);
      if (c0 != loaded) {
        load_channel_consts<T, L>(a.coef, c0, ka);
        load_channel_consts<T, L>(a.coef + C, c0, kx);
        load_channel_consts<T, L>(a.coef + 2 * C, c0, kc);
        if (kDual) {
          load_channel_consts<T, L>(a.coef2, c0, ka2);
          load_channel_consts<T, L>(a.coef2 + C, c0, kx2);
          load_channel_consts<T, L>(a.coef2 + 2 * C, c0, kc2);
        }
        if (kMask == ReluMask::FromInput) {
          load_channel_consts<T, L>(a.scale, c0, sc);
          load_channel_consts<T, L>(a.shift, c0, sh);
        }
        loaded = c0;
      }
      float dz[V], dx[V];
#pragma unroll
      for (int j = 0; j < V; ++j) {
        bool pass = true;
        if (kMask == ReluMask::FromOutput) pass = y[u][j] > 0.f;
        if (kMask == ReluMask::FromBits) pass = (bv[u] >> j) & 1u;
        if (kMask == ReluMask::FromInput) pass = relu_passes<T>(x[u][j], sc[j], sh[j]);
        dz[j] = pass ? g[u][j] : 0.f;
        dx[j] = ka[j] * dz[j] + kx[j] * x[u][j] + kc[j];
      }
      if (kDual) {
        float dx2[V];
#pragma unroll
        for (int j = 0; j < V; ++j) dx2[j] = ka2[j] * dz[j] + kx2[j] * x2[u][j] + kc2[j];
        store_vec(static_cast<T*>(a.dx2) + size_t(i) * V, dx2);
      }
      if (kDres) store_vec(static_cast<T*>(a.dres) + size_t(i) * V, dz);
      store_vec(static_cast<T*>(a.dx) + size_t(i) * V, dx);
    }
  }
}

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

unsigned channel_blocks(int C) { return static_cast<unsigned>((C + 127) / 128); }
unsigned finalize_blocks(int C) { return static_cast<unsigned>((C + kFinalizeWarps - 1) / kFinalizeWarps); }

}  // namespace
}  // namespace trainer_kernels
using namespace trainer_kernels;

size_t bn_scratch_floats(Shape4 s, DType t, Layout l) {
  ReduceGrid g{};
  dispatch(t, l, [&]<class T, Layout L>() { g = reduce_grid<T>(s, L); });
  return size_t(kMaxSums) * g.chunks * s.c;
}

void bn_forward_train_stats(const void* x, Shape4 s, DType t, Layout l, const BnChannelState& bn,
                            float* scratch, cudaStream_t stream) {
  check_supported(s, t, l);
  dispatch(t, l, [&]<class T, Layout L>() {
    const ReduceGrid g = reduce_grid<T>(s, L);
    StatsOp<T, L> op{static_cast<const T*>(x), s, {}};
    launch_reduce<T, L>(op, s, g, scratch, stream);
    finalize_stats<T, L><<<finalize_blocks(s.c), 32 * kFinalizeWarps, 0, stream>>>(scratch, g.chunks, static_cast<const T*>(x), s, bn);
    CUDA_CHECK_LAUNCH();
  });
}

void bn_finalize_sums(float* sum, float* sqsum, size_t per_channel, const BnChannelState& bn, int channels,
                      void* scale_h, void* shift_h, cudaStream_t stream) {
  finalize_sums<<<channel_blocks(channels), 128, 0, stream>>>(sum, sqsum, double(per_channel), bn, channels,
                                                             static_cast<__half*>(scale_h), static_cast<__half*>(shift_h));
  CUDA_CHECK_LAUNCH();
}

void bn_forward_eval_coefs(const BnChannelState& bn, int channels, cudaStream_t stream) {
  eval_coefs<<<channel_blocks(channels), 128, 0, stream>>>(bn, channels);
  CUDA_CHECK_LAUNCH();
}

size_t relu_bits_bytes(Shape4 s, DType t) { return s.count() * dtype_size(t) / 16; }

void bn_forward_eval_coefs_all(const BnEvalTarget* targets, int count, int max_channels, cudaStream_t stream) {
  if (count == 0) return;
  eval_coefs_all<<<dim3(channel_blocks(max_channels), count), 128, 0, stream>>>(targets);
  CUDA_CHECK_LAUNCH();
}

void fold_bn_into_filters(const FilterFold* targets, int count, size_t max_elements, cudaStream_t stream) {
  if (count == 0) return;
  const unsigned blocks = std::min(grid_for((max_elements + 7) / 8, kThreads), 1024u);
  fold_filters<<<dim3(blocks, count), kThreads, 0, stream>>>(targets);
  CUDA_CHECK_LAUNCH();
}

void bn_apply(const ApplyArgs& a, Shape4 s, DType t, Layout l, cudaStream_t stream) {
  check_supported(s, t, l);
  if (a.relu_bits && !a.relu) throw Fatal("bn_apply: ReLU bits without a ReLU");
  dispatch(t, l, [&]<class T, Layout L>() {
    const unsigned vecs = static_cast<unsigned>(s.count() / kVec<T>);
    const unsigned grid = grid_for((vecs + kApplyUnroll<L> - 1) / kApplyUnroll<L>, kThreads);
    auto go = [&]<bool kRelu, Residual kRes>() {
      apply_forward<T, L, kRelu, kRes><<<grid, kThreads, 0, stream>>>(a, s, vecs);
    };
    switch (a.residual) {
      case Residual::None:
        a.relu ? go.template operator()<true, Residual::None>() : go.template operator()<false, Residual::None>();
        break;
      case Residual::Tensor:
        a.relu ? go.template operator()<true, Residual::Tensor>() : go.template operator()<false, Residual::Tensor>();
        break;
      case Residual::BatchNorm:
        a.relu ? go.template operator()<true, Residual::BatchNorm>() : go.template operator()<false, Residual::BatchNorm>();
        break;
    }
    CUDA_CHECK_LAUNCH();
  });
}

// Over 60 lines: reduce, finalize and apply of both BNs (and the identity shortcut) in the order
// the data flows, kept together so the three launches read as one backward pass.
void bn_backward(const BnBackwardArgs& a, Shape4 s, DType t, Layout l, float* scratch, cudaStream_t stream) {
  check_supported(s, t, l);
  const bool dual = a.x2 != nullptr, dres = a.dres != nullptr;
  if (a.relu == ReluMask::FromOutput && !a.y) throw Fatal("bn_backward: a ReLU mask from the output needs y");
  if (a.relu == ReluMask::FromBits && !a.relu_bits) throw Fatal("bn_backward: a ReLU mask from bits needs relu_bits");
  if ((dual || dres) && a.relu != ReluMask::FromOutput && a.relu != ReluMask::FromBits)
    throw Fatal("bn_backward: with a residual the ReLU mask must come from the stored output y or its bits");
  if (dual && dres) throw Fatal("bn_backward: a block has either a projection or an identity shortcut");
  dispatch(t, l, [&]<class T, Layout L>() {
    const ReduceGrid g = reduce_grid<T>(s, L);
    auto reduce = [&]<ReluMask kMask, bool kDual>() {
      BackwardOp<T, L, kMask, kDual> op{};
      op.dy = static_cast<const T*>(a.dy);
      op.y = static_cast<const T*>(a.y);
      op.bits = a.relu_bits;
      op.x = static_cast<const T*>(a.x);
      op.x2 = static_cast<const T*>(a.x2);
      op.mean = a.bn->save_mean;
      op.invstd = a.bn->save_invstd;
      op.scale = a.bn->scale;
      op.shift = a.bn->shift;
      if (kDual) {
        op.mean2 = a.bn2->save_mean;
        op.invstd2 = a.bn2->save_invstd;
      }
      launch_reduce<T, L>(op, s, g, scratch, stream);
    };
    // The combinations the network uses (and the tests): no ReLU; a ReLU without residual (mask
    // from x in the network, from y in the tests); a ReLU after a residual (mask from the bits in
    // the network, from y or the bits in the tests), with the identity shortcut's gradient (dres)
    // or the projection's second BN (dual).
    switch (a.relu) {
      case ReluMask::None: reduce.template operator()<ReluMask::None, false>(); break;
      case ReluMask::FromInput: reduce.template operator()<ReluMask::FromInput, false>(); break;
      case ReluMask::FromOutput:
        dual ? reduce.template operator()<ReluMask::FromOutput, true>()
             : reduce.template operator()<ReluMask::FromOutput, false>();
        break;
      case ReluMask::FromBits:
        dual ? reduce.template operator()<ReluMask::FromBits, true>()
             : reduce.template operator()<ReluMask::FromBits, false>();
        break;
    }

    const BnChannelState none{};
    finalize_backward<<<finalize_blocks(s.c), 32 * kFinalizeWarps, 0, stream>>>(
        scratch, g.chunks, s.c, s.per_channel(), dual ? 3 : 2, *a.bn, a.dgamma, a.dbeta,
        dual ? *a.bn2 : none, a.dgamma2, a.dbeta2);
    CUDA_CHECK_LAUNCH();

    const unsigned vecs = static_cast<unsigned>(s.count() / kVec<T>);
    const unsigned grid = grid_for((vecs + kApplyUnroll<L> - 1) / kApplyUnroll<L>, kThreads);
    const BackwardApply args{a.dy, a.y, a.x, a.x2, a.relu_bits, a.bn->bwd_coef, dual ? a.bn2->bwd_coef : nullptr,
                             a.bn->scale, a.bn->shift, a.dx, a.dx2, a.dres};
    auto apply = [&]<ReluMask kMask, bool kDual, bool kDres>() {
      apply_backward<T, L, kMask, kDual, kDres><<<grid, kThreads, 0, stream>>>(args, s, vecs);
    };
    switch (a.relu) {
      case ReluMask::None: apply.template operator()<ReluMask::None, false, false>(); break;
      case ReluMask::FromInput: apply.template operator()<ReluMask::FromInput, false, false>(); break;
      case ReluMask::FromOutput:
        if (dual) apply.template operator()<ReluMask::FromOutput, true, false>();
        else if (dres) apply.template operator()<ReluMask::FromOutput, false, true>();
        else apply.template operator()<ReluMask::FromOutput, false, false>();
        break;
      case ReluMask::FromBits:
        if (dual) apply.template operator()<ReluMask::FromBits, true, false>();
        else if (dres) apply.template operator()<ReluMask::FromBits, false, true>();
        else apply.template operator()<ReluMask::FromBits, false, false>();
        break;
    }
    CUDA_CHECK_LAUNCH();
  });
}
