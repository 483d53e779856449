// Batch-norm backward: reduction of dz and dz * xhat (and of the projection shortcut's second BN),
// per-channel finalize to the gamma/beta gradients and the coefficients of dx, then the
// elementwise apply, with the ReLU mask from the output, its bits or the input.
#include "batchnorm_common.cuh"

namespace trainer_kernels {  // why: kernels/common.cuh
namespace {

// A gradient that arrives in two parts (a block's input gradient: its shortcut's and its main
// path's) is summed in fp32 as the reduction reads it: g[u] += dy2 at the same offsets.
template <class T, int U, int V>
__device__ __forceinline__ void add_second_part(const T* dy2, const size_t (&off)[U], float (&g)[U][V]) {
  float g2[U][V];
#pragma unroll
  for (int u = 0; u < U; ++u) load_vec(dy2 + off[u], g2[u]);
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int j = 0; j < V; ++j) g[u][j] += g2[u][j];
}

// kTwoParts: dy arrives in two parts (dy2 beside dy). A compile-time choice, so that the unroll
// counts the second part's loads: decided at run time, the loads of both kinds of call were
// unrolled for two tensors and the kernel took 140 registers, one block of 256 threads per SM.
template <class T, Layout L, ReluMask kMask, bool kDual, bool kTwoParts>
struct BackwardOp {  // sums of dz, dz * xhat, and dz * xhat2 for the second BN
  static constexpr int kSums = kDual ? 3 : 2;
  static constexpr int kLoads = 2 + (kMask == ReluMask::FromOutput) + kDual + kTwoParts;
  static constexpr int kUnroll = kLoads <= 2 ? 4 : 2;
  // Blocks of 256 threads an SM (a register cap for reduce_nhwc): its 528 blocks (kNhwcTargetBlocks,
  // for 132-SM parts) run as whole waves at 4 or 2 an SM, and at 3 leave a last wave a third full.
  // 4 for the identity joins with the gradient in two parts (every block's but the last's), the
  // most bytes of any reduction in a step, which 64 registers hold without spilling on sm_90 (an
  // sm_80 build spills 28 bytes); 2 for the others, which spill at 64 and, uncapped, some take
  // 68-80 registers, 3 blocks an SM. H200, 2026-11-28 (bin/kernel_lab): the identity join's
  // backward at 128x256x32x32 went from 150 to 136 µs; the inner BNs' (mask from x) at 2 blocks an
  // SM from 125 to 116 µs, where at 3 they took 132. bin/train's step at batch 128: 6.07 -> 5.94 ms
  // (bench/results/levers-session8-nvidia-h200-2026-11-28.md).
  static constexpr int kMinBlocks = kMask == ReluMask::FromBits && !kDual && kTwoParts ? 4 : 2;
  static constexpr int V = kVec<T>;
  const T *dy, *dy2, *y, *x, *x2;  // dy2: the second part of dy (kTwoParts)
  // With two parts: dz (the masked sum, rounded to T) is written here, dy's buffer, and the sums
  // are taken of what is written; the apply pass then reads one tensor, not two (the sum costs one
  // write where the two parts would cost a second read in each pass).
  T* dz_out;
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
    if (kTwoParts) add_second_part(dy2, off, g);
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int j = 0; j < V; ++j) {
        bool pass = true;
        if (kMask == ReluMask::FromOutput) pass = yv[u][j] > 0.f;
        if (kMask == ReluMask::FromBits) pass = (bv[u] >> j) & 1u;
        if (kMask == ReluMask::FromInput) pass = relu_passes<T>(xv[u][j], sc[j], sh[j]);
        float dz = pass ? g[u][j] : 0.f;
        if (kTwoParts) dz = to_float(from_float<T>(dz)), g[u][j] = dz;
        acc[0][j] += dz;
        acc[1][j] += dz * (xv[u][j] - m[j]) * is[j];
        if (kDual) acc[2][j] += dz * (x2v[u][j] - m2[j]) * is2[j];
      }
    if (kTwoParts)
#pragma unroll
      for (int u = 0; u < U; ++u) store_vec(dz_out + off[u], g[u]);
  }
};

// A block per 32 channels (sum_rows_of_column): the sums of dz, dz * xhat and, with a second BN
// (sums == 3), dz * xhat2 over the chunks' rows, then each BN's weight gradients and apply
// coefficients.
template <int kSums>
__global__ void finalize_backward(const float* partials, int chunks, int C, size_t M, BnChannelState bn,
                                  float* dgamma, float* dbeta, BnChannelState bn2, float* dgamma2, float* dbeta2) {
  chain_wait();  // launched chained (kernels/chained_launch.h)
  chain_release();  // the next kernel launches as this one's CTAs run
  double t[kSums];
  if (!sum_rows_of_column<kSums>(partials, size_t(chunks) * C, chunks, C, C, t)) return;
  const int c = blockIdx.x * kColumnsPerFinalize + threadIdx.x;
  finalize_backward_channel(bn, load_backward_inputs(bn, c), dgamma, dbeta, C, c, t[1], t[0], double(M));
  if constexpr (kSums == 3)
    finalize_backward_channel(bn2, load_backward_inputs(bn2, c), dgamma2, dbeta2, C, c, t[2], t[0], double(M));
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
  chain_wait();  // launched chained (kernels/chained_launch.h)
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

}  // namespace
}  // namespace trainer_kernels
using namespace trainer_kernels;

// The combinations of BnBackwardArgs the kernels implement; anything else is a caller's bug.
static void check_backward_args(const BnBackwardArgs& a) {
  const bool dual = a.x2 != nullptr, dres = a.dres != nullptr;
  if (a.relu == ReluMask::FromOutput && !a.y) throw Fatal("bn_backward: a ReLU mask from the output needs y");
  if (a.relu == ReluMask::FromBits && !a.relu_bits) throw Fatal("bn_backward: a ReLU mask from bits needs relu_bits");
  if ((dual || dres) && a.relu != ReluMask::FromOutput && a.relu != ReluMask::FromBits)
    throw Fatal("bn_backward: with a residual the ReLU mask must come from the stored output y or its bits");
  if (dual && dres) throw Fatal("bn_backward: a block has either a projection or an identity shortcut");
  if (a.dy2 && dres && a.dres != a.dy)
    throw Fatal("bn_backward: with dy in two parts, dres must be dy's buffer (the reduction writes dz there)");
}

namespace {
// The apply with the ReLU mask `applied` (None where dy already holds dz), from the coefficients in
// bn.bwd_coef (and bn2's).
template <class T, Layout L>
void apply(const BnBackwardArgs& a, Shape4 s, ReluMask applied, cudaStream_t stream) {
  const bool dual = a.x2 != nullptr, dres = a.dres != nullptr;
  const unsigned vecs = static_cast<unsigned>(s.count() / kVec<T>);
  const size_t work = (vecs + kApplyUnroll<L> - 1) / kApplyUnroll<L>;
  const BackwardApply args{a.dy, a.y, a.x, a.x2, a.relu_bits, a.bn->bwd_coef, dual ? a.bn2->bwd_coef : nullptr,
                           a.bn->scale, a.bn->shift, a.dx, a.dx2, a.dres};
  auto apply = [&]<ReluMask kMask, bool kDual, bool kDres>() {
    launch_one_wave_chained<apply_backward<T, L, kMask, kDual, kDres>, kThreads>(work, stream, args, s, vecs);
  };
  switch (applied) {
    case ReluMask::None:
      if (dual) apply.template operator()<ReluMask::None, true, false>();
      else apply.template operator()<ReluMask::None, false, false>();
      break;
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
}

// The finalize of the sums in `partials` (chunks rows of each): the weight gradients and the
// apply's coefficients.
void finalize(const BnBackwardArgs& a, Shape4 s, const float* partials, int chunks, cudaStream_t stream) {
  const bool dual = a.x2 != nullptr;
  const BnChannelState none{};
  auto kernel = dual ? finalize_backward<3> : finalize_backward<2>;
  launch_chained(kernel, column_finalize_blocks(s.c), dim3(32, 32), 0, stream, partials, chunks, s.c, s.per_channel(),
                 *a.bn, a.dgamma, a.dbeta, dual ? *a.bn2 : none, a.dgamma2, a.dbeta2);
  CUDA_CHECK_LAUNCH();
}

template <class T, Layout L>
void finalize_and_apply(const BnBackwardArgs& a, Shape4 s, const float* partials, int chunks, ReluMask applied,
                        cudaStream_t stream) {
  finalize(a, s, partials, chunks, stream);
  apply<T, L>(a, s, applied, stream);
}

// What the backward from a conv's sums needs of a (bn_backward_from_sums, bn_backward_apply).
void check_dz_args(const BnBackwardArgs& a, const char* who) {
  const std::string w = who;
  if (a.relu != ReluMask::None || a.dy2 || a.dres)
    throw Fatal(w + ": dy must hold dz, masked and summed (no ReLU mask, second part or dres)");
  if (a.x2 && (!a.bn2 || !a.dx2 || !a.dgamma2 || !a.dbeta2))
    throw Fatal(w + ": a second BN needs its state, dx2 and its weight gradients");
}
}  // namespace

// Reduce, then finalize and apply, of both BNs (and the identity shortcut) in the order the data
// flows.
void bn_backward(const BnBackwardArgs& a, Shape4 s, DType t, Layout l, float* scratch, cudaStream_t stream) {
  check_supported(s, t, l);
  check_backward_args(a);
  const bool dual = a.x2 != nullptr;
  dispatch(t, l, [&]<class T, Layout L>() {
    const ReduceGrid g = reduce_grid<T>(s, L);
    auto reduce_op = [&]<ReluMask kMask, bool kDual, bool kTwoParts>() {
      BackwardOp<T, L, kMask, kDual, kTwoParts> op{};
      op.dy = static_cast<const T*>(a.dy);
      op.dy2 = static_cast<const T*>(a.dy2);
      op.dz_out = kTwoParts ? static_cast<T*>(const_cast<void*>(a.dy)) : nullptr;
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
    auto reduce = [&]<ReluMask kMask, bool kDual>() {
      if (a.dy2) reduce_op.template operator()<kMask, kDual, true>();
      else reduce_op.template operator()<kMask, kDual, false>();
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

    // dy in two parts: the reduction left dz, masked, in dy's buffer (dres's, for the identity shortcut).
    finalize_and_apply<T, L>(a, s, scratch, g.chunks, a.dy2 ? ReluMask::None : a.relu, stream);
  });
}

void bn_backward_from_sums(const BnBackwardArgs& a, const float* partials, int rows, Shape4 s, DType t, Layout l,
                           cudaStream_t stream) {
  check_supported(s, t, l);
  check_dz_args(a, "bn_backward_from_sums");
  if (rows < 1) throw Fatal("bn_backward_from_sums: no rows of sums");
  dispatch(t, l, [&]<class T, Layout L>() { finalize_and_apply<T, L>(a, s, partials, rows, ReluMask::None, stream); });
}

void bn_backward_finalize(const BnBackwardArgs& a, const float* partials, int rows, Shape4 s, cudaStream_t stream) {
  check_dz_args(a, "bn_backward_finalize");
  if (rows < 1) throw Fatal("bn_backward_finalize: no rows of sums");
  finalize(a, s, partials, rows, stream);
}

void bn_backward_apply(const BnBackwardArgs& a, Shape4 s, DType t, Layout l, cudaStream_t stream) {
  check_supported(s, t, l);
  check_dz_args(a, "bn_backward_apply");
  dispatch(t, l, [&]<class T, Layout L>() { apply<T, L>(a, s, ReluMask::None, stream); });
}
