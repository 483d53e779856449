// The forward's elementwise batch-norm apply: y = relu?(x * scale + shift + residual), with the
// ReLU bits for backward.
#include "batchnorm_common.cuh"

namespace trainer_kernels {  // why: kernels/common.cuh
namespace {

template <class T, Layout L, bool kRelu, Residual kRes>
__global__ void __launch_bounds__(kThreads) apply_forward(ApplyArgs a, Shape4 s, unsigned vecs) {
  chain_wait();  // launched chained (kernels/chained_launch.h)
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

}  // namespace
}  // namespace trainer_kernels
using namespace trainer_kernels;

size_t relu_bits_bytes(Shape4 s, DType t) { return s.count() * dtype_size(t) / 16; }

void bn_apply(const ApplyArgs& a, Shape4 s, DType t, Layout l, cudaStream_t stream) {
  check_supported(s, t, l);
  if (a.relu_bits && !a.relu) throw Fatal("bn_apply: ReLU bits without a ReLU");
  dispatch(t, l, [&]<class T, Layout L>() {
    const unsigned vecs = static_cast<unsigned>(s.count() / kVec<T>);
    const size_t work = (vecs + kApplyUnroll<L> - 1) / kApplyUnroll<L>;
    auto go = [&]<bool kRelu, Residual kRes>() {
      launch_one_wave_chained<apply_forward<T, L, kRelu, kRes>, kThreads>(work, stream, a, s, vecs);
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
