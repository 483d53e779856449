// Training-mode batch-norm statistics: partial sums of x and x^2 per chunk of rows, then a
// per-channel finalize to mean, invstd, scale, shift and the running statistics; and the same
// finalize from the per-channel sums a fused conv accumulates.
#include "batchnorm_common.cuh"

namespace trainer_kernels {  // why: kernels/common.cuh
namespace {

template <class T, Layout L>
struct StatsOp {  // sums of (x - shift) and (x - shift)^2
  static constexpr int kSums = 2;
  static constexpr int kUnroll = 4;
  static constexpr int kMinBlocks = 0;  // the compiler's choice (50 registers: 4 blocks an SM)
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

template <class T, Layout L>
__global__ void finalize_stats(const float* partials, int chunks, const T* x, Shape4 s, BnChannelState bn,
                               __half* scale_h, __half* shift_h) {
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
  const Coefs k = store_batch_stats(bn, c, in, mean, var, M);
  store_half_coefs(k, c, scale_h, shift_h);
}

// Training statistics from per-channel sums of x and x^2 over M values each (a fused conv's
// statistics, batchnorm.h bn_finalize_sums), in double: the variance as E[x^2] - E[x]^2. The sums are
// zeroed once read, ready for the conv's next accumulation.
__global__ void finalize_sums(float* sum, float* sqsum, double M, BnChannelState bn, int C, __half* scale_h,
                              __half* shift_h) {
  chain_wait();  // launched chained (kernels/chained_launch.h)
  chain_release();  // the next kernel launches as this one's CTAs run
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const double s1 = sum[c], s2 = sqsum[c];
  const ForwardInputs in = load_forward_inputs(bn, c);
  sum[c] = 0.f;
  sqsum[c] = 0.f;
  finalize_channel_from_sums(bn, c, in, s1, s2, M, scale_h, shift_h);
}

// The same from rows of per-channel partial sums (a conv of our own leaves one row per tile of
// pixels: bn_finalize_partials), a block per 32 channels (sum_rows_of_column).
__global__ void finalize_partials(const float* partials, int rows, int row_len, double M, BnChannelState bn, int C,
                                  __half* scale_h, __half* shift_h) {
  chain_wait();  // launched chained (kernels/chained_launch.h)
  chain_release();  // the next kernel launches as this one's CTAs run
  double t[2];
  if (!sum_rows_of_column<2>(partials, size_t(rows) * row_len, rows, row_len, C, t)) return;
  const int c = blockIdx.x * kColumnsPerFinalize + threadIdx.x;
  finalize_channel_from_sums(bn, c, load_forward_inputs(bn, c), t[0], t[1], M, scale_h, shift_h);
}

}  // namespace
}  // namespace trainer_kernels
using namespace trainer_kernels;

size_t bn_scratch_floats(Shape4 s, DType t, Layout l) {
  ReduceGrid g{};
  dispatch(t, l, [&]<class T, Layout L>() { g = reduce_grid<T>(s, L); });
  return size_t(kMaxSums) * g.chunks * s.c;
}

void bn_forward_train_stats(const void* x, Shape4 s, DType t, Layout l, const BnChannelState& bn,
                            float* scratch, cudaStream_t stream, void* scale_h, void* shift_h) {
  check_supported(s, t, l);
  dispatch(t, l, [&]<class T, Layout L>() {
    const ReduceGrid g = reduce_grid<T>(s, L);
    StatsOp<T, L> op{static_cast<const T*>(x), s, {}};
    launch_reduce<T, L>(op, s, g, scratch, stream);
    finalize_stats<T, L><<<finalize_blocks(s.c), 32 * kFinalizeWarps, 0, stream>>>(
        scratch, g.chunks, static_cast<const T*>(x), s, bn, static_cast<__half*>(scale_h), static_cast<__half*>(shift_h));
    CUDA_CHECK_LAUNCH();
  });
}

void bn_finalize_sums(float* sum, float* sqsum, size_t per_channel, const BnChannelState& bn, int channels,
                      void* scale_h, void* shift_h, cudaStream_t stream) {
  launch_chained(finalize_sums, channel_blocks(channels), 128, 0, stream, sum, sqsum, double(per_channel), bn, channels,
                 static_cast<__half*>(scale_h), static_cast<__half*>(shift_h));
  CUDA_CHECK_LAUNCH();
}

void bn_finalize_partials(const float* partials, int rows, int row_len, size_t per_channel, const BnChannelState& bn,
                          int channels, void* scale_h, void* shift_h, cudaStream_t stream) {
  if (rows < 1 || row_len < channels) throw Fatal("bn_finalize_partials: rows of partials shorter than the channels");
  launch_chained(finalize_partials, column_finalize_blocks(channels), dim3(32, 32), 0, stream, partials, rows, row_len,
                 double(per_channel), bn, channels, static_cast<__half*>(scale_h), static_cast<__half*>(shift_h));
  CUDA_CHECK_LAUNCH();
}
