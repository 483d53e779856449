// The 1x1 conv's data gradients with a BN backward's sums (kernels/conv1x1_dgrad_join.h,
// kernels/conv1x1_dgrad_bn.h): kernels/conv1x1_stats_kernel.cuh with BnGradEpilogue, B (the filter)
// read N-major, 128x64 tiles, on the schedule the caller asks (by default the joins' ping-pong and
// conv3's cooperative), a join without a shortcut BN with one side tile fewer (IdentityJoinGradEpilogue:
// more stages); with the weight gradient too, kernels/conv1x1_dgrad_wgrad_kernel.cuh
// (cooperative). Compiled only where CONV1X1_WITH_CUTLASS is set (sm_90a); elsewhere every shape
// is refused.
#include "kernels/conv1x1_dgrad_bn.h"
#include "kernels/conv1x1_dgrad_join.h"

#include <cstdint>
#include <initializer_list>

#include <cuda_fp16.h>

#include "core/errors.h"
#include "kernels/conv1x1_launch.cuh"
#if defined(CONV1X1_WITH_CUTLASS)
#include "kernels/conv1x1_dgrad_wgrad_kernel.cuh"
#endif

using namespace trainer_kernels::conv1x1;

namespace {
// A side's even rows (columns): the side of a stride-2 shortcut's compact gradient.
int evens(int side) { return (side + 1) / 2; }

// The data gradient that takes dw too: its k-tiles fixed (dw's accumulators stay in registers).
constexpr int kDwKTiles = 4;

#if defined(CONV1X1_WITH_CUTLASS)
// K's parameters for dx = dy w (w[k][c], read N-major) with the epilogue's set by the caller.
// dy_x: where dy is made from the join as it is read (Operand::JoinGrad), a3 beside the join's dz.
template <class K>
typename K::Params dgrad_params(const void* dy, const void* w, int m, int k, int c,
                                const typename K::Epi::Params& epilogue, const void* dy_x = nullptr) {
  typename K::Mainloop::Arguments args{};
  if constexpr (K::kOperand == trainer_kernels::Operand::JoinGrad) args.second = dy_x;
  args.ptr_A = static_cast<const cutlass::half_t*>(dy);
  args.dA = cute::make_stride(int64_t(k), cute::_1{}, int64_t(m) * k);
  args.ptr_B = static_cast<const cutlass::half_t*>(w);  // B(n, k) = w[k][n]: N-major
  args.dB = cute::make_stride(cute::_1{}, int64_t(c), int64_t(k) * c);
  typename K::Params p{};
  p.mainloop = K::Mainloop::to_underlying_arguments(cute::make_shape(m, c, k, 1), args, nullptr);
  p.m = m, p.n = c, p.k = k;
  p.epilogue = epilogue;
  return p;
}

// The resident kernel with Epilogue for dx = dy w on either schedule (kernels/conv1x1_schedule.h;
// each kernel's default and why: Conv1x1DgradJoin::schedule, Conv1x1DgradBn::schedule).
template <class Epilogue>
void launch_dgrad(const void* dy, const void* w, int m, int k, int c, const typename Epilogue::Params& epilogue,
                  Conv1x1Schedule schedule, cudaStream_t stream) {
  using trainer_kernels::Operand;
  if (schedule == Conv1x1Schedule::PingPong) {
    using K = trainer_kernels::ResidentConv<kTileM, kTileN, Operand::Stored, true, Epilogue>;
    return launch<K>(dgrad_params<K>(dy, w, m, k, c, epilogue), stream);
  }
  using K = trainer_kernels::ResidentConv<kTileM, kTileN, Operand::Stored, false, Epilogue>;
  launch<K>(dgrad_params<K>(dy, w, m, k, c, epilogue), stream);
}

// dx = dy w with Epilogue, and dw's parts, by the kernel that takes both from the same stages of dy;
// kDyFromJoin: dy made from the join's dz (dy) and a3 (dy_x) by its apply coefficients dy_coef.
template <class Epilogue, bool kDyFromJoin>
void launch_dgrad_wgrad_as(const void* dy, const void* w, int m, int k, int c, const typename Epilogue::Params& e,
                           float* dw_partials, cudaStream_t stream, const void* dy_x, const float* dy_coef) {
  using D = trainer_kernels::DgradWgrad<kDwKTiles, Epilogue, kDyFromJoin>;
  static const bool agree = trainer_kernels::dgrad_wgrad_layouts_agree<kDwKTiles, Epilogue, kDyFromJoin>();
  if (!agree) throw Fatal("conv1x1 dgrad + wgrad: dy's stage read MN-major is not the stage CUTLASS writes");
  const auto p = dgrad_params<typename D::K>(dy, w, m, k, c, e, dy_x);
  launch_with<typename D::K, trainer_kernels::resident_dgrad_wgrad<kDwKTiles, Epilogue, kDyFromJoin>>(
      p, stream, dw_partials, dy_coef);
}

// The same, dy made from the join where dy_x is given (dy_from_join_refusal has checked the rest).
template <class Epilogue>
void launch_dgrad_wgrad(const void* dy, const void* w, int m, int k, int c, const typename Epilogue::Params& e,
                        float* dw_partials, cudaStream_t stream, const void* dy_x, const float* dy_coef) {
  if (dy_x)
    launch_dgrad_wgrad_as<Epilogue, true>(dy, w, m, k, c, e, dw_partials, stream, dy_x, dy_coef);
  else
    launch_dgrad_wgrad_as<Epilogue, false>(dy, w, m, k, c, e, dw_partials, stream, nullptr, nullptr);
}

// The join epilogue's parameters from a's (checked by conv1x1_dgrad_join).
template <class E>
typename E::Params join_params(const Conv1x1DgradJoin& a) {
  typename E::Params e{};
  e.dz = static_cast<cutlass::half_t*>(a.dz);
  e.bits = a.relu_bits;
  e.x = static_cast<const __half*>(a.x);
  e.mean = a.mean;
  e.invstd = a.invstd;
  e.x2 = static_cast<const __half*>(a.x2);
  e.mean2 = a.mean2;
  e.invstd2 = a.invstd2;
  e.g_even = static_cast<const cutlass::half_t*>(a.g_even);
  e.g = static_cast<const cutlass::half_t*>(a.g);
  if (a.g_even) {
    e.img_hw = cutlass::FastDivmod(a.img_h * a.img_w);
    e.img_w = cutlass::FastDivmod(a.img_w);
    e.half_h = evens(a.img_h);
    e.half_w = evens(a.img_w);
  }
  e.partials = a.partials;
  return e;
}
#endif

// "" where dy is stored, or made from the join as it is read with all that needs (Conv1x1DgradBn's
// and Conv1x1DgradDw's dy_x), else what is wrong; out: the tensor the kernel writes, [m, c].
template <class Args>
std::string dy_from_join_refusal(const Args& a, const void* out, const float* dw_partials) {
  if (!a.dy_x && !a.dy_coef) return "";
  if (!a.dy_x || !a.dy_coef) return "dy made from the join needs both the BN's input and its coefficients";
  if (!dw_partials) return "dy is made from the join only by the kernel that takes the weight gradient too";
  if (!aligned(a.dy, 16) || !aligned(a.dy_x, 16) || !aligned(a.dy_coef, 16))
    return "the join's dz, the BN's input and coefficients must start 16-byte aligned (TMA, 16-byte loads)";
  const size_t dy_bytes = size_t(a.m) * a.k * 2, out_bytes = size_t(a.m) * a.c * 2;
  if (overlap(out, out_bytes, a.dy, dy_bytes) || overlap(out, out_bytes, a.dy_x, dy_bytes))
    return "the output overlaps the join's dz or the BN's input, which other CTAs still read";
  const size_t parts_bytes = conv1x1_dw_partials_bytes(a.m, a.k, a.c);
  if (overlap(dw_partials, parts_bytes, a.dy, dy_bytes) || overlap(dw_partials, parts_bytes, a.dy_x, dy_bytes))
    return "dw's parts overlap the join's dz or the BN's input";
  return "";
}

// dw[i] = the sum of the rows' i-th values, in row order: a thread per value.
__global__ void dw_from_partials_kernel(const float* partials, int rows, int count, __half* dw) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) return;
  float sum = 0.f;
  for (int r = 0; r < rows; ++r) sum += partials[int64_t(r) * count + i];
  dw[i] = __float2half_rn(sum);
}
}  // namespace

std::string conv1x1_dgrad_join_refusal(int m, int k, int c) { return gemm_refusal(m, c, k); }

int conv1x1_dgrad_join_rows(int m, int c) { return ctas_per_column(m, c); }

size_t conv1x1_dgrad_join_partials_bytes(int m, int c) { return partials_bytes(3, m, c); }

void conv1x1_dgrad_join(const Conv1x1DgradJoin& a, cudaStream_t stream) {
  if (const std::string why = conv1x1_dgrad_join_refusal(a.m, a.k, a.c); !why.empty())
    throw Fatal("conv1x1_dgrad_join: " + why);
  if (!a.dy || !a.w || !a.dz || !a.relu_bits || !a.x || !a.mean || !a.invstd || !a.partials)
    throw Fatal("conv1x1_dgrad_join: a tensor it reads or writes is missing");
  if (!a.x2 != !a.mean2 || !a.x2 != !a.invstd2)
    throw Fatal("conv1x1_dgrad_join: the shortcut's BN needs its input, mean and 1/std together");
  if (a.g_even) {
    if (a.img_h <= 0 || a.img_w <= 0)
      throw Fatal("conv1x1_dgrad_join: the compact shortcut gradient needs dz's image height and width");
    const int64_t image = int64_t(a.img_h) * a.img_w;
    if (a.m % image != 0)
      throw Fatal("conv1x1_dgrad_join: dz's pixels are not a whole number of img_h x img_w images");
    if (!aligned(a.g_even, 16))
      throw Fatal("conv1x1_dgrad_join: the compact shortcut gradient must start 16-byte aligned (16-byte copies)");
    const size_t compact_bytes = size_t(a.m / image) * evens(a.img_h) * evens(a.img_w) * a.c * 2;
    if (overlap(a.g_even, compact_bytes, a.dz, size_t(a.m) * a.c * 2))
      throw Fatal("conv1x1_dgrad_join: the compact shortcut gradient overlaps dz");
  } else if (a.img_h || a.img_w) {
    throw Fatal("conv1x1_dgrad_join: an image size without a compact gradient");
  }
  if (a.g) {
    if (a.g_even) throw Fatal("conv1x1_dgrad_join: the shortcut's part both compact and in a buffer of its own");
    if (!aligned(a.g, 16)) throw Fatal("conv1x1_dgrad_join: the shortcut's part must start 16-byte aligned (16-byte copies)");
    const size_t bytes = size_t(a.m) * a.c * 2;
    if (overlap(a.g, bytes, a.dz, bytes)) throw Fatal("conv1x1_dgrad_join: the shortcut's part overlaps dz");
    if (overlap(a.g, bytes, a.partials, conv1x1_dgrad_join_partials_bytes(a.m, a.c)))
      throw Fatal("conv1x1_dgrad_join: the shortcut's part overlaps the partial sums");
  }
#if defined(CONV1X1_WITH_CUTLASS)
  using trainer_kernels::IdentityJoinGradEpilogue, trainer_kernels::JoinGradEpilogue;
  if (!a.x2)  // no shortcut BN: two side tiles, and their third's shared memory to the stages
    return launch_dgrad<IdentityJoinGradEpilogue>(a.dy, a.w, a.m, a.k, a.c, join_params<IdentityJoinGradEpilogue>(a),
                                                  a.schedule, stream);
  launch_dgrad<JoinGradEpilogue>(a.dy, a.w, a.m, a.k, a.c, join_params<JoinGradEpilogue>(a), a.schedule, stream);
#else
  (void)stream;
#endif
}

std::string conv1x1_dgrad_bn_refusal(int m, int k, int c) { return gemm_refusal(m, c, k); }

int conv1x1_dgrad_bn_rows(int m, int c) { return ctas_per_column(m, c); }

size_t conv1x1_dgrad_bn_partials_bytes(int m, int c) { return partials_bytes(2, m, c); }

std::string conv1x1_dgrad_bn_dw_refusal(int m, int k, int c) {
  if (std::string why = conv1x1_dgrad_bn_refusal(m, k, c); !why.empty()) return why;
  if (k != kDwKTiles * kTileK)
    return "the weight gradient is taken beside the data gradient only at " + std::to_string(kDwKTiles * kTileK) +
           " output channels";
  return "";
}

size_t conv1x1_dw_partials_bytes(int m, int k, int c) {
  return size_t(conv1x1_dgrad_bn_rows(m, c)) * k * c * sizeof(float);
}

void conv1x1_dgrad_bn(const Conv1x1DgradBn& a, cudaStream_t stream) {
  if (const std::string why = a.dw_partials ? conv1x1_dgrad_bn_dw_refusal(a.m, a.k, a.c)
                                            : conv1x1_dgrad_bn_refusal(a.m, a.k, a.c);
      !why.empty())
    throw Fatal("conv1x1_dgrad_bn: " + why);
  if (const std::string why = inner_grad_args_refusal(a); !why.empty()) throw Fatal("conv1x1_dgrad_bn: " + why);
  if (a.dw_partials && a.schedule != Conv1x1Schedule::Cooperative)
    throw Fatal("conv1x1_dgrad_bn: the weight gradient is taken beside with the cooperative schedule only");
  if (!a.w) throw Fatal("conv1x1_dgrad_bn: a tensor it reads or writes is missing");
  if (const std::string why = dy_from_join_refusal(a, a.dz, a.dw_partials); !why.empty())
    throw Fatal("conv1x1_dgrad_bn: " + why);
#if defined(CONV1X1_WITH_CUTLASS)
  using E = trainer_kernels::InnerGradEpilogue;
  if (a.dw_partials)
    launch_dgrad_wgrad<E>(a.dy, a.w, a.m, a.k, a.c, inner_grad_params<E>(a), a.dw_partials, stream, a.dy_x,
                          a.dy_coef);
  else
    launch_dgrad<E>(a.dy, a.w, a.m, a.k, a.c, inner_grad_params<E>(a), a.schedule, stream);
#else
  (void)stream;
#endif
}

void conv1x1_dgrad_dw(const Conv1x1DgradDw& a, cudaStream_t stream) {
  if (const std::string why = conv1x1_dgrad_bn_dw_refusal(a.m, a.k, a.c); !why.empty())
    throw Fatal("conv1x1_dgrad_dw: " + why);
  if (!a.dy || !a.w || !a.dx || !a.x || !a.dw_partials)
    throw Fatal("conv1x1_dgrad_dw: a tensor it reads or writes is missing");
  for (const void* p : std::initializer_list<const void*>{a.dy, a.w, a.dx, a.x, a.dw_partials})
    if (!aligned(p, 16)) throw Fatal("conv1x1_dgrad_dw: every tensor must start 16-byte aligned (TMA and 16-byte copies)");
  const size_t dx_bytes = size_t(a.m) * a.c * 2, dy_bytes = size_t(a.m) * a.k * 2,
               parts_bytes = conv1x1_dw_partials_bytes(a.m, a.k, a.c);
  if (overlap(a.dx, dx_bytes, a.x, dx_bytes) || overlap(a.dx, dx_bytes, a.dy, dy_bytes))
    throw Fatal("conv1x1_dgrad_dw: dx overlaps a tensor the kernel reads");
  if (overlap(a.dw_partials, parts_bytes, a.x, dx_bytes) || overlap(a.dw_partials, parts_bytes, a.dy, dy_bytes) ||
      overlap(a.dw_partials, parts_bytes, a.dx, dx_bytes))
    throw Fatal("conv1x1_dgrad_dw: dw's parts overlap a tensor the kernel reads or writes");
  if (const std::string why = dy_from_join_refusal(a, a.dx, a.dw_partials); !why.empty())
    throw Fatal("conv1x1_dgrad_dw: " + why);
#if defined(CONV1X1_WITH_CUTLASS)
  using E = trainer_kernels::PlainGradEpilogue;
  const E::Params e{.dx = static_cast<cutlass::half_t*>(a.dx), .x = static_cast<const __half*>(a.x)};
  launch_dgrad_wgrad<E>(a.dy, a.w, a.m, a.k, a.c, e, a.dw_partials, stream, a.dy_x, a.dy_coef);
#else
  (void)stream;
#endif
}

void conv1x1_dw_from_partials(const float* partials, int rows, int k, int c, void* dw, cudaStream_t stream) {
  if (!partials || !dw || rows <= 0 || k <= 0 || c <= 0)
    throw Fatal("conv1x1_dw_from_partials: no parts, no output or an empty shape");
  const int count = k * c, threads = 256;
  dw_from_partials_kernel<<<(count + threads - 1) / threads, threads, 0, stream>>>(partials, rows, count,
                                                                                  static_cast<__half*>(dw));
  CUDA_CHECK(cudaGetLastError());
}
