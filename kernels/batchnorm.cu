// Batch norm in training and evaluation mode, fused with the residual add and ReLU.
//
// Forward:  stats (partial sums per chunk of rows) -> finalize (per channel) -> apply (elementwise).
// Backward: reduce (partial sums of dz, dz*xhat)   -> finalize (per channel) -> apply (elementwise).
// Partial sums go to scratch in a fixed grid and are added in a fixed order, so results are
// bit-identical from run to run (no float atomics). Sums are taken of x - x[first element of the
// channel], which keeps E[x^2] - E[x]^2 accurate when the mean is large against the spread.
#include "common.cuh"
#include "kernels.h"

namespace {

constexpr int kThreads = 256;
constexpr int kTargetBlocks = 1024;  // a few waves of 256-thread blocks on any current GPU
constexpr int kMaxSums = 3;

// ---- reduction geometry ------------------------------------------------------------------------
// NHWC: the tensor is M = N*H*W rows of C channels. A block covers a tile of L vectors (kVec
// channels each) across and R = 256 / L rows at a time, over one chunk of rows.
// NCHW: a block covers one channel over one chunk of images.
struct ReduceGrid {
  int tiles_or_channels;  // grid.x
  int chunks;             // grid.y
};

template <class T>
ReduceGrid reduce_grid(Shape4 s, Layout l) {
  const int V = kVec<T>;
  if (l == Layout::NHWC) {
    const int CV = s.c / V, L = CV < 32 ? CV : 32, R = kThreads / L;
    const int tiles = (CV + L - 1) / L;
    const size_t rows = s.per_channel();
    size_t chunks = kTargetBlocks / tiles;
    const size_t max_chunks = rows / (size_t(R) * 4) > 0 ? rows / (size_t(R) * 4) : 1;
    if (chunks > max_chunks) chunks = max_chunks;
    if (chunks < 1) chunks = 1;
    return {tiles, static_cast<int>(chunks)};
  }
  int chunks = kTargetBlocks / s.c;
  if (chunks > s.n) chunks = s.n;
  if (chunks < 1) chunks = 1;
  return {s.c, chunks};
}

void check_reducible(Shape4 s, DType t, Layout l) {
  const int V = static_cast<int>(16 / dtype_size(t));
  if (l == Layout::NHWC && s.c % V != 0)
    throw Fatal("batch norm: NHWC needs channels divisible by " + std::to_string(V) + ", got " + std::to_string(s.c));
  if (l == Layout::NCHW && (s.h * s.w) % V != 0)
    throw Fatal("batch norm: NCHW needs H*W divisible by " + std::to_string(V) + ", got " + std::to_string(s.h * s.w));
}

// Per-channel constants for the kVec elements of one vector: in NHWC they are consecutive channels,
// in NCHW all the same channel.
template <class T, Layout L>
__device__ __forceinline__ void load_channel_consts(const float* src, int c0, float (&out)[kVec<T>]) {
#pragma unroll
  for (int j = 0; j < kVec<T>; ++j) out[j] = src[L == Layout::NHWC ? c0 + j : c0];
}

// ---- the reduction ops ---------------------------------------------------------------------------
template <class T, Layout L>
struct StatsOp {  // sums of (x - shift) and (x - shift)^2
  static constexpr int kSums = 2;
  const T* x;
  Shape4 s;
  float shift[kVec<T>];
  __device__ void begin(int c0) {
#pragma unroll
    for (int j = 0; j < kVec<T>; ++j) {
      const int c = L == Layout::NHWC ? c0 + j : c0;
      shift[j] = to_float(x[L == Layout::NHWC ? size_t(c) : size_t(c) * s.h * s.w]);
    }
  }
  __device__ void accumulate(size_t off, float (&acc)[kMaxSums][kVec<T>]) {
    float v[kVec<T>];
    load_vec(x + off, v);
#pragma unroll
    for (int j = 0; j < kVec<T>; ++j) {
      const float d = v[j] - shift[j];
      acc[0][j] += d;
      acc[1][j] += d * d;
    }
  }
};

template <class T, Layout L, bool kRelu, bool kDual>
struct BackwardOp {  // sums of dz, dz * xhat, and dz * xhat2 for the second BN
  static constexpr int kSums = kDual ? 3 : 2;
  const T *dy, *y, *x, *x2;
  const float *mean, *invstd, *mean2, *invstd2;
  float m[kVec<T>], is[kVec<T>], m2[kVec<T>], is2[kVec<T>];
  __device__ void begin(int c0) {
    load_channel_consts<T, L>(mean, c0, m);
    load_channel_consts<T, L>(invstd, c0, is);
    if (kDual) {
      load_channel_consts<T, L>(mean2, c0, m2);
      load_channel_consts<T, L>(invstd2, c0, is2);
    }
  }
  __device__ void accumulate(size_t off, float (&acc)[kMaxSums][kVec<T>]) {
    float g[kVec<T>], xv[kVec<T>], yv[kVec<T>], x2v[kVec<T>];
    load_vec(dy + off, g);
    load_vec(x + off, xv);
    if (kRelu) load_vec(y + off, yv);
    if (kDual) load_vec(x2 + off, x2v);
#pragma unroll
    for (int j = 0; j < kVec<T>; ++j) {
      const float dz = (!kRelu || yv[j] > 0.f) ? g[j] : 0.f;
      acc[0][j] += dz;
      acc[1][j] += dz * (xv[j] - m[j]) * is[j];
      if (kDual) acc[2][j] += dz * (x2v[j] - m2[j]) * is2[j];
    }
  }
};

// partials layout: [sum][chunk][channel]
template <class T, class Op>
__global__ void __launch_bounds__(kThreads) reduce_nhwc(Op op, Shape4 s, int chunks, float* partials) {
  constexpr int V = kVec<T>;
  __shared__ float red[Op::kSums][V][kThreads];
  const int CV = s.c / V, L = CV < 32 ? CV : 32, R = kThreads / L;
  const int lane = threadIdx.x % L, r0 = threadIdx.x / L;
  const int cv = blockIdx.x * L + lane;
  const bool active = r0 < R && cv < CV;
  const size_t M = s.per_channel();
  const size_t per_chunk = (M + chunks - 1) / chunks;
  const size_t rb = blockIdx.y * per_chunk, re = rb + per_chunk < M ? rb + per_chunk : M;
  float acc[kMaxSums][V] = {};
  if (active) {
    op.begin(cv * V);
    for (size_t r = rb + r0; r < re; r += R) op.accumulate(r * s.c + size_t(cv) * V, acc);
  }
#pragma unroll
  for (int k = 0; k < Op::kSums; ++k)
#pragma unroll
    for (int j = 0; j < V; ++j) red[k][j][threadIdx.x] = acc[k][j];
  __syncthreads();
  if (active && r0 == 0) {
#pragma unroll
    for (int k = 0; k < Op::kSums; ++k)
#pragma unroll
      for (int j = 0; j < V; ++j) {
        float t = 0.f;
        for (int rr = 0; rr < R; ++rr) t += red[k][j][rr * L + lane];
        partials[(size_t(k) * chunks + blockIdx.y) * s.c + cv * V + j] = t;
      }
  }
}

template <class T, class Op>
__global__ void __launch_bounds__(kThreads) reduce_nchw(Op op, Shape4 s, int chunks, float* partials) {
  constexpr int V = kVec<T>;
  __shared__ float red[Op::kSums][kThreads / 32];
  const int c = blockIdx.x;
  const int HW = s.h * s.w, HWV = HW / V;
  const int per_chunk = (s.n + chunks - 1) / chunks;
  const int nb = blockIdx.y * per_chunk, ne = nb + per_chunk < s.n ? nb + per_chunk : s.n;
  float acc[kMaxSums][V] = {};
  op.begin(c);
  const size_t total = ne > nb ? size_t(ne - nb) * HWV : 0;
  for (size_t v = threadIdx.x; v < total; v += kThreads) {
    const size_t n = nb + v / HWV, p = v % HWV;
    op.accumulate((n * s.c + c) * HW + p * V, acc);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int k = 0; k < Op::kSums; ++k) {
    float t = 0.f;
#pragma unroll
    for (int j = 0; j < V; ++j) t += acc[k][j];
    t = warp_sum(t);
    if (lane == 0) red[k][warp] = t;
  }
  __syncthreads();
  if (threadIdx.x < Op::kSums) {
    float t = 0.f;
    for (int w = 0; w < kThreads / 32; ++w) t += red[threadIdx.x][w];
    partials[(size_t(threadIdx.x) * chunks + blockIdx.y) * s.c + c] = t;
  }
}

template <class T, Layout L, class Op>
void launch_reduce(const Op& op, Shape4 s, ReduceGrid g, float* partials, cudaStream_t stream) {
  const dim3 grid(g.tiles_or_channels, g.chunks);
  if (L == Layout::NHWC)
    reduce_nhwc<T, Op><<<grid, kThreads, 0, stream>>>(op, s, g.chunks, partials);
  else
    reduce_nchw<T, Op><<<grid, kThreads, 0, stream>>>(op, s, g.chunks, partials);
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

template <class T, Layout L>
__global__ void finalize_stats(const float* partials, int chunks, const T* x, Shape4 s, BnChannelState bn) {
  const int c = blockIdx.x * kFinalizeWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (c >= s.c) return;
  const double s1 = sum_chunks(partials, 0, chunks, s.c, c, lane);
  const double s2 = sum_chunks(partials, 1, chunks, s.c, c, lane);
  if (lane != 0) return;
  const double M = double(s.per_channel());
  const double shift = to_float(x[L == Layout::NHWC ? size_t(c) : size_t(c) * s.h * s.w]);
  const double dmean = s1 / M;
  double var = s2 / M - dmean * dmean;
  if (var < 0) var = 0;
  const double mean = shift + dmean;
  const float invstd = static_cast<float>(1.0 / sqrt(var + kBnEps));
  bn.save_mean[c] = static_cast<float>(mean);
  bn.save_invstd[c] = invstd;
  const float scale = bn.gamma[c] * invstd;
  bn.scale[c] = scale;
  bn.shift[c] = bn.beta[c] - static_cast<float>(mean) * scale;
  const double unbiased = M > 1 ? var * M / (M - 1) : var;
  bn.running_mean[c] = static_cast<float>((1.0 - kBnMomentum) * bn.running_mean[c] + kBnMomentum * mean);
  bn.running_var[c] = static_cast<float>((1.0 - kBnMomentum) * bn.running_var[c] + kBnMomentum * unbiased);
}

__global__ void eval_coefs(BnChannelState bn, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const float scale = bn.gamma[c] * rsqrtf(bn.running_var[c] + kBnEps);
  bn.scale[c] = scale;
  bn.shift[c] = bn.beta[c] - bn.running_mean[c] * scale;
}

// dx = a*dz + k_x*x + k_c with a = gamma*invstd, k_x = -a*invstd*dgamma/M,
// k_c = -a*dbeta/M - k_x*mean: the usual formula, expanded so apply needs no xhat.
__device__ void backward_coefs(const BnChannelState& bn, int C, int c, double dgamma, double dbeta, double M) {
  const double invstd = bn.save_invstd[c];
  const double a = double(bn.gamma[c]) * invstd;
  const double kx = -a * invstd * dgamma / M;
  const double kc = -a * dbeta / M - kx * bn.save_mean[c];
  bn.bwd_coef[c] = static_cast<float>(a);
  bn.bwd_coef[C + c] = static_cast<float>(kx);
  bn.bwd_coef[2 * C + c] = static_cast<float>(kc);
}

__global__ void finalize_backward(const float* partials, int chunks, int C, size_t M, int sums,
                                  BnChannelState bn, float* dgamma, float* dbeta,
                                  BnChannelState bn2, float* dgamma2, float* dbeta2) {
  const int c = blockIdx.x * kFinalizeWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (c >= C) return;
  const double t0 = sum_chunks(partials, 0, chunks, C, c, lane);
  const double t1 = sum_chunks(partials, 1, chunks, C, c, lane);
  const double t2 = sums == 3 ? sum_chunks(partials, 2, chunks, C, c, lane) : 0.0;
  if (lane != 0) return;
  dbeta[c] = static_cast<float>(t0);
  dgamma[c] = static_cast<float>(t1);
  backward_coefs(bn, C, c, t1, t0, double(M));
  if (sums == 3) {
    dbeta2[c] = static_cast<float>(t0);
    dgamma2[c] = static_cast<float>(t2);
    backward_coefs(bn2, C, c, t2, t0, double(M));
  }
}

// ---- elementwise apply ---------------------------------------------------------------------------
template <Layout L>
__device__ __forceinline__ int channel_of(size_t off, Shape4 s) {
  return L == Layout::NHWC ? static_cast<int>(off % s.c) : static_cast<int>((off / (size_t(s.h) * s.w)) % s.c);
}

template <class T, Layout L, bool kRelu, Residual kRes>
__global__ void apply_forward(ApplyArgs a, Shape4 s) {
  constexpr int V = kVec<T>;
  const size_t vecs = s.count() / V;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < vecs; i += size_t(gridDim.x) * blockDim.x) {
    const size_t off = i * V;
    const int c0 = channel_of<L>(off, s);
    float x[V], sc[V], sh[V], r[V];
    load_vec(static_cast<const T*>(a.x) + off, x);
    load_channel_consts<T, L>(a.scale, c0, sc);
    load_channel_consts<T, L>(a.shift, c0, sh);
    if (kRes != Residual::None) load_vec(static_cast<const T*>(a.res) + off, r);
    if (kRes == Residual::BatchNorm) {
      float rs[V], rh[V];
      load_channel_consts<T, L>(a.res_scale, c0, rs);
      load_channel_consts<T, L>(a.res_shift, c0, rh);
#pragma unroll
      for (int j = 0; j < V; ++j) r[j] = r[j] * rs[j] + rh[j];
    }
#pragma unroll
    for (int j = 0; j < V; ++j) {
      float v = x[j] * sc[j] + sh[j];
      if (kRes != Residual::None) v += r[j];
      x[j] = kRelu ? fmaxf(v, 0.f) : v;
    }
    store_vec(static_cast<T*>(a.y) + off, x);
  }
}

// Device-side arguments of the backward apply (the host struct holds host pointers to BN state).
struct BackwardApply {
  const void *dy, *y, *x, *x2;
  const float *coef, *coef2;  // 3*C each: k_dz, k_x, k_c
  void *dx, *dx2, *dres;
};

template <class T, Layout L, bool kRelu, bool kDual, bool kDres>
__global__ void apply_backward(BackwardApply a, Shape4 s) {
  constexpr int V = kVec<T>;
  const size_t vecs = s.count() / V;
  const int C = s.c;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < vecs; i += size_t(gridDim.x) * blockDim.x) {
    const size_t off = i * V;
    const int c0 = channel_of<L>(off, s);
    float g[V], x[V], y[V], x2[V], ka[V], kx[V], kc[V];
    load_vec(static_cast<const T*>(a.dy) + off, g);
    load_vec(static_cast<const T*>(a.x) + off, x);
    if (kRelu) load_vec(static_cast<const T*>(a.y) + off, y);
    if (kDual) load_vec(static_cast<const T*>(a.x2) + off, x2);
    load_channel_consts<T, L>(a.coef, c0, ka);
    load_channel_consts<T, L>(a.coef + C, c0, kx);
    load_channel_consts<T, L>(a.coef + 2 * C, c0, kc);
#pragma unroll
    for (int j = 0; j < V; ++j) g[j] = (!kRelu || y[j] > 0.f) ? g[j] : 0.f;  // g is now dz
    float dx[V];
#pragma unroll
    for (int j = 0; j < V; ++j) dx[j] = ka[j] * g[j] + kx[j] * x[j] + kc[j];
    if (kDual) {
      load_channel_consts<T, L>(a.coef2, c0, ka);
      load_channel_consts<T, L>(a.coef2 + C, c0, kx);
      load_channel_consts<T, L>(a.coef2 + 2 * C, c0, kc);
#pragma unroll
      for (int j = 0; j < V; ++j) x2[j] = ka[j] * g[j] + kx[j] * x2[j] + kc[j];
      store_vec(static_cast<T*>(a.dx2) + off, x2);
    }
    if (kDres) store_vec(static_cast<T*>(a.dres) + off, g);
    store_vec(static_cast<T*>(a.dx) + off, dx);
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

size_t bn_scratch_floats(Shape4 s, DType t, Layout l) {
  ReduceGrid g{};
  dispatch(t, l, [&]<class T, Layout L>() { g = reduce_grid<T>(s, L); });
  return size_t(kMaxSums) * g.chunks * s.c;
}

void bn_forward_train_stats(const void* x, Shape4 s, DType t, Layout l, const BnChannelState& bn,
                            float* scratch, cudaStream_t stream) {
  check_reducible(s, t, l);
  dispatch(t, l, [&]<class T, Layout L>() {
    const ReduceGrid g = reduce_grid<T>(s, L);
    StatsOp<T, L> op{static_cast<const T*>(x), s, {}};
    launch_reduce<T, L>(op, s, g, scratch, stream);
    finalize_stats<T, L><<<finalize_blocks(s.c), 32 * kFinalizeWarps, 0, stream>>>(scratch, g.chunks, static_cast<const T*>(x), s, bn);
    CUDA_CHECK_LAUNCH();
  });
}

void bn_forward_eval_coefs(const BnChannelState& bn, int channels, cudaStream_t stream) {
  eval_coefs<<<channel_blocks(channels), 128, 0, stream>>>(bn, channels);
  CUDA_CHECK_LAUNCH();
}

void bn_apply(const ApplyArgs& a, Shape4 s, DType t, Layout l, cudaStream_t stream) {
  check_reducible(s, t, l);
  dispatch(t, l, [&]<class T, Layout L>() {
    const unsigned grid = grid_for(s.count() / kVec<T>, kThreads);
    auto go = [&]<bool kRelu, Residual kRes>() {
      apply_forward<T, L, kRelu, kRes><<<grid, kThreads, 0, stream>>>(a, s);
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

void bn_backward(const BnBackwardArgs& a, Shape4 s, DType t, Layout l, float* scratch, cudaStream_t stream) {
  check_reducible(s, t, l);
  const bool relu = a.y != nullptr, dual = a.x2 != nullptr, dres = a.dres != nullptr;
  if (!relu && (dual || dres)) throw Fatal("bn_backward: a residual gradient needs the ReLU output y");
  if (dual && dres) throw Fatal("bn_backward: a block has either a projection or an identity shortcut");
  dispatch(t, l, [&]<class T, Layout L>() {
    const ReduceGrid g = reduce_grid<T>(s, L);
    auto reduce = [&]<bool kRelu, bool kDual>() {
      BackwardOp<T, L, kRelu, kDual> op{};
      op.dy = static_cast<const T*>(a.dy);
      op.y = static_cast<const T*>(a.y);
      op.x = static_cast<const T*>(a.x);
      op.x2 = static_cast<const T*>(a.x2);
      op.mean = a.bn->save_mean;
      op.invstd = a.bn->save_invstd;
      if (kDual) {
        op.mean2 = a.bn2->save_mean;
        op.invstd2 = a.bn2->save_invstd;
      }
      launch_reduce<T, L>(op, s, g, scratch, stream);
    };
    if (relu) dual ? reduce.template operator()<true, true>() : reduce.template operator()<true, false>();
    else dual ? reduce.template operator()<false, true>() : reduce.template operator()<false, false>();

    const BnChannelState none{};
    finalize_backward<<<finalize_blocks(s.c), 32 * kFinalizeWarps, 0, stream>>>(
        scratch, g.chunks, s.c, s.per_channel(), dual ? 3 : 2, *a.bn, a.dgamma, a.dbeta,
        dual ? *a.bn2 : none, a.dgamma2, a.dbeta2);
    CUDA_CHECK_LAUNCH();

    const unsigned grid = grid_for(s.count() / kVec<T>, kThreads);
    const BackwardApply args{a.dy, a.y, a.x, a.x2, a.bn->bwd_coef, dual ? a.bn2->bwd_coef : nullptr,
                             a.dx, a.dx2, a.dres};
    auto apply = [&]<bool kRelu, bool kDual, bool kDres>() {
      apply_backward<T, L, kRelu, kDual, kDres><<<grid, kThreads, 0, stream>>>(args, s);
    };
    // The combinations the network uses: every BN has its ReLU except the projection's, which is
    // always the second BN of a dual backward.
    if (relu && dual) apply.template operator()<true, true, false>();
    else if (relu && dres) apply.template operator()<true, false, true>();
    else if (relu) apply.template operator()<true, false, false>();
    else apply.template operator()<false, false, false>();
    CUDA_CHECK_LAUNCH();
  });
}
