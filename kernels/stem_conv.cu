// The stem's conv (kernels/stem_conv.h). With tap t = (r, s, c) and x_t(p) the input element that
// tap reads for output pixel p (zero outside the image), X the pixels x taps matrix of them (taps
// padded to 32 with zero columns), W the k x taps filter:
//   forward          y (pixels x k)  = X * W^T
//   filter gradient  dw^T (taps x k) = X^T * dy, a sum over the pixels
// Both gather X 16 pixels at a time into shared memory, row-major, which the forward reads as the
// row-major A and the filter gradient as the column-major A (X^T) of a 16x16x16 product.
#include "kernels/stem_conv.h"

#include <mma.h>

#include <algorithm>

#include "core/errors.h"
#include "kernels/common.cuh"

namespace trainer_kernels {  // why: kernels/common.cuh
namespace {

using namespace nvcuda;

constexpr int kTaps = 32;       // taps padded to two 16-row tiles
constexpr int kMaxK = 64;       // four 16-column tiles of output channels
// The shared tiles' row lengths, padded so that the rows a fragment load or store takes at once fall
// on different banks. Why: ncu (H200, 2026-12-01) found both kernels bound by the L1 and
// shared-memory pipe, half the forward's stalls waiting on shared memory
// (bench/results/levers-session38-nvidia-h200-2026-12-01.md). With them and the forward's filter
// fragments in registers, at batch 256 under ncu: the forward 47.1 -> 26.7 µs, the weight gradient
// 46.0 -> 37.4 (H200, 2026-12-01, bench/results/levers-session39-nvidia-h200-2026-12-01.md).
constexpr int kTapsLd = kTaps + 8;   // taps a pixel: rows 80 bytes apart
constexpr int kGradLd = kMaxK + 8;   // the weight gradient's dy tile, halves: rows 144 bytes apart
constexpr int kOutLd = kMaxK + 8;    // the forward's float tile: rows 288 bytes apart
constexpr int kPixels = 16;     // pixels a warp adds per product
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kMaxCtas = 4 * 132;  // four a SM of an H100/H200 (what the weight gradient's 47 KB fit)

struct Geometry {
  int h, w, c, k, r, pad, taps;
  long long pixels;
};

// Each tap t = (r, s, c) as the gather reads it: the row and column offsets from the output pixel,
// the element offset from the pixel's own input element, and whether it is a real tap (t < c*r*r:
// else a padding column of X, always zero). Built once a CTA (build_tap_table) in shared memory.
__device__ void build_tap_table(const Geometry& g, int4* table) {
  for (int t = threadIdx.x; t < kTaps; t += blockDim.x) {
    const int dr = t / (g.c * g.r) - g.pad, ds = (t / g.c) % g.r - g.pad;
    table[t] = make_int4(dr, ds, (dr * g.w + ds) * g.c + t % g.c, t < g.taps);
  }
}

// The gather of a slice's taps into X[pixel][tap], the row-major 16 x 32 tile: lane l takes pixel
// l % 16 of the slice, decoded once, and its taps from (l / 16) * 16 on, 16 loads in flight at once
// (zero outside the image and past the last pixel), stored as two 16-byte vectors.
struct TapGather {
  const int4* table;
  int q, first_tap;
  __device__ TapGather(int lane, const int4* tap_table)
      : table(tap_table), q(lane % kPixels), first_tap(lane / kPixels * 16) {}

  __device__ void taps(const __half* __restrict__ x, const Geometry& g, long long p0, __half* tile) const {
    const long long p = p0 + q;
    const bool inside = p < g.pixels;
    const unsigned pu = static_cast<unsigned>(p), plane = static_cast<unsigned>(g.h) * g.w;
    const int row = static_cast<int>(pu % plane / g.w), col = static_cast<int>(pu % g.w);
    const long long image = static_cast<long long>(pu / plane) * plane;
    const __half* pixel = x + (image + static_cast<long long>(row) * g.w + col) * g.c;
    __align__(16) __half v[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int4 t = table[first_tap + j];
      const int ih = row + t.x, iw = col + t.y;
      v[j] = inside && t.w && ih >= 0 && ih < g.h && iw >= 0 && iw < g.w ? pixel[t.z] : __float2half(0.f);
    }
    uint4* dst = reinterpret_cast<uint4*>(tile + q * kTapsLd + first_tap);
    dst[0] = reinterpret_cast<const uint4*>(v)[0];
    dst[1] = reinterpret_cast<const uint4*>(v)[1];
    __syncwarp();
  }
};

// The slices of CTA b: a contiguous run (its pixels' input rows stay in L1), [first, end), taken
// by its warps in turn.
struct CtaSlices {
  int first, end;
  __device__ explicit CtaSlices(long long pixels) {
    const int slices = static_cast<int>((pixels + kPixels - 1) / kPixels);
    const int per_cta = (slices + gridDim.x - 1) / gridDim.x;
    first = blockIdx.x * per_cta;
    end = min(slices, first + per_cta);
  }
};

// The forward: each warp's slice is X (16 x 32, gathered) times W^T (32 x k, built in shared memory
// by the CTA, its fragments then held in each warp's registers), through a float tile in shared
// memory to fp16 y, half a warp a pixel's row (4 channels, 8 bytes, a lane). With `partials`, each
// lane also sums its channels' values and squares, as y holds them, over the CTA's pixels; the
// warps' sums are added in warp order into the CTA's row.
// Four CTAs an SM (kMaxCtas): the 128 registers that leaves hold the filter's fragments without a
// spill (left to itself ptxas took 80 and spilled 8 bytes).
__global__ void __launch_bounds__(kThreads, 4) stem_forward_kernel(const __half* __restrict__ x,
                                                                   const __half* __restrict__ w, Geometry g,
                                                                   __half* __restrict__ y,
                                                                   float* __restrict__ partials) {
  __shared__ __align__(32) __half taps_tile[kWarps][kPixels * kTapsLd];
  __shared__ __align__(32) __half filter[kTaps * kMaxK];  // (tap, k), row-major; zero past the taps
  __shared__ __align__(32) float out_tile[kWarps][kPixels * kOutLd];
  __shared__ float warp_sums[kWarps][2][kMaxK];
  __shared__ int4 tap_table[kTaps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  build_tap_table(g, tap_table);
  chain_wait();  // launched chained (kernels/chained_launch.h)
  const TapGather gather(lane, tap_table);
  for (int e = threadIdx.x; e < kTaps * kMaxK; e += kThreads) {
    const int tap = e / kMaxK, k = e % kMaxK;
    filter[e] = tap < g.taps && k < g.k ? w[k * g.taps + tap] : __float2half(0.f);
  }
  __syncthreads();
  // The filter's fragments, the same for every slice, held in registers (zero past g.k).
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> w_frag[2][kMaxK / 16];
#pragma unroll
  for (int j = 0; j < kMaxK / 16; ++j) {
    wmma::load_matrix_sync(w_frag[0][j], filter + j * 16, kMaxK);
    wmma::load_matrix_sync(w_frag[1][j], filter + 16 * kMaxK + j * 16, kMaxK);
  }
  const int k_tiles = g.k / 16, ch = 4 * (lane % 16);  // this lane's channels: ch .. ch + 3
  const bool has_channels = ch < g.k;
  float sum[4] = {0.f, 0.f, 0.f, 0.f}, sq[4] = {0.f, 0.f, 0.f, 0.f};
  __half* tt = taps_tile[warp];
  float* out = out_tile[warp];
  const CtaSlices mine(g.pixels);
  for (int slice = mine.first + warp; slice < mine.end; slice += kWarps) {
    const long long p0 = static_cast<long long>(slice) * kPixels;
    gather.taps(x, g, p0, tt);
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a[2];
    wmma::load_matrix_sync(a[0], tt, kTapsLd);
    wmma::load_matrix_sync(a[1], tt + 16, kTapsLd);
#pragma unroll  // constant fragment indices: the filter's fragments stay in registers
    for (int j = 0; j < kMaxK / 16; ++j) {
      if (j < k_tiles) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
        wmma::fill_fragment(acc, 0.f);
        wmma::mma_sync(acc, a[0], w_frag[0][j], acc);
        wmma::mma_sync(acc, a[1], w_frag[1][j], acc);
        wmma::store_matrix_sync(out + j * 16, acc, kOutLd, wmma::mem_row_major);
      }
    }
    __syncwarp();
    // lanes 0-15 take the even pixels, 16-31 the odd ones: 4 channels, 8 bytes, each
    if (has_channels) {
#pragma unroll 2
      for (int q = lane / 16; q < kPixels; q += 2) {
        if (p0 + q >= g.pixels) break;
        const float4 f = *reinterpret_cast<const float4*>(out + q * kOutLd + ch);
        const __half2 lo = __floats2half2_rn(f.x, f.y), hi = __floats2half2_rn(f.z, f.w);
        uint2 packed;
        packed.x = *reinterpret_cast<const unsigned*>(&lo);
        packed.y = *reinterpret_cast<const unsigned*>(&hi);
        *reinterpret_cast<uint2*>(y + (p0 + q) * g.k + ch) = packed;
        const float2 a01 = __half22float2(lo), a23 = __half22float2(hi);
        const float v[4] = {a01.x, a01.y, a23.x, a23.y};
#pragma unroll
        for (int i = 0; i < 4; ++i) sum[i] += v[i], sq[i] += v[i] * v[i];
      }
    }
    __syncwarp();  // the next slice overwrites the tiles
  }
  if (!partials) return;
#pragma unroll
  for (int i = 0; i < 4; ++i) {  // the odd pixels' sums onto the even ones'
    sum[i] += __shfl_xor_sync(0xffffffffu, sum[i], 16);
    sq[i] += __shfl_xor_sync(0xffffffffu, sq[i], 16);
  }
  if (lane < 16 && has_channels)
    for (int i = 0; i < 4; ++i) warp_sums[warp][0][ch + i] = sum[i], warp_sums[warp][1][ch + i] = sq[i];
  __syncthreads();
  for (int e = threadIdx.x; e < 2 * g.k; e += kThreads) {
    const int which = e / g.k, k = e % g.k;
    float v = 0.f;
    for (int other = 0; other < kWarps; ++other) v += warp_sums[other][which][k];
    partials[(static_cast<size_t>(which) * gridDim.x + blockIdx.x) * g.k + k] = v;
  }
}

// The filter gradient's partial sums: each warp takes 16 pixels at a time (a slice; the CTA's slices
// in turn), gathers their taps, which it reads as the column-major 32 x 16 tile X^T, and their
// gradients as a row-major 16 x k tile, and adds the product into its accumulators (32 x k, fp32).
// The next slice's gradients are loaded while this one's taps are gathered and multiplied. At the
// end the warps' sums go through shared memory, in warp order, into the CTA's row of partial sums.
// kApply: dy holds the BN's dz, and each gradient vector is the BN backward's apply of it,
// coef[c] dz + coef[k + c] bn_x + coef[2k + c] in fp32, rounded to fp16 as the apply pass stores it.
template <bool kApply>
__global__ void __launch_bounds__(kThreads) stem_wgrad_partials(const __half* __restrict__ x,
                                                                const __half* __restrict__ dy,
                                                                const __half* __restrict__ bn_x,
                                                                const float* __restrict__ coef, Geometry g,
                                                                float* __restrict__ partials) {
  __shared__ __align__(32) __half taps_tile[kWarps][kPixels * kTapsLd];
  __shared__ __align__(32) __half grad_tile[kWarps][kPixels * kGradLd];
  __shared__ __align__(32) float sums[kWarps][kTaps * kMaxK];
  __shared__ int4 tap_table[kTaps];
  __shared__ float coef_s[kApply ? 3 * kMaxK : 1];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  build_tap_table(g, tap_table);
  chain_wait();  // launched chained (kernels/chained_launch.h)
  if constexpr (kApply)
    for (int i = threadIdx.x; i < 3 * g.k; i += kThreads) coef_s[i / g.k * kMaxK + i % g.k] = coef[i];
  __syncthreads();
  const TapGather gather(lane, tap_table);
  const int k_tiles = g.k / 16, row_vectors = g.k / 8;  // 16-byte vectors in a pixel's gradient row
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][kMaxK / 16];
  for (auto& row : acc)
    for (auto& f : row) wmma::fill_fragment(f, 0.f);
  __half* tt = taps_tile[warp];
  __half* gt = grad_tile[warp];
  // vector e of the slice's gradients -> (pixel e / row_vectors, column e % row_vectors * 8)
  constexpr int kLoads = kPixels * kMaxK / 8 / 32;
  // With kApply, xv[i] holds the BN input beside v[i] (else unused).
  auto load_gradients = [&](long long p0, uint4 (&v)[kLoads], uint4 (&xv)[kLoads]) {
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int e = lane + 32 * i, row = e / row_vectors;
      v[i] = xv[i] = make_uint4(0, 0, 0, 0);
      if (e < kPixels * row_vectors && p0 + row < g.pixels) {
        const long long at = (p0 + row) * g.k + e % row_vectors * 8;
        v[i] = *reinterpret_cast<const uint4*>(dy + at);
        if constexpr (kApply) xv[i] = *reinterpret_cast<const uint4*>(bn_x + at);
      }
    }
  };
  // Rows past the last pixel stay zero. Their taps are zero, so what they hold adds nothing, but kc
  // alone (their dz and bn_x were loaded as zeros) may round to an fp16 Inf, and 0 x Inf is NaN.
  auto applied = [&](uint4 dz, uint4 xv, int c0, bool real) {
    if (!real) return dz;
    const __half* d = reinterpret_cast<const __half*>(&dz);
    const __half* xs = reinterpret_cast<const __half*>(&xv);
    __align__(16) __half out[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int c = c0 + j;
      out[j] = __float2half_rn(coef_s[c] * __half2float(d[j]) + coef_s[kMaxK + c] * __half2float(xs[j]) +
                               coef_s[2 * kMaxK + c]);
    }
    return *reinterpret_cast<const uint4*>(out);
  };
  const CtaSlices mine(g.pixels);
  const int end = mine.end;
  uint4 next[kLoads], next_x[kLoads];
  int slice = mine.first + warp;
  if (slice < end) load_gradients(static_cast<long long>(slice) * kPixels, next, next_x);
  for (; slice < end; slice += kWarps) {
    const long long p0 = static_cast<long long>(slice) * kPixels;
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int e = lane + 32 * i, row = e / row_vectors, c0 = e % row_vectors * 8;
      if (e < kPixels * row_vectors) {
        uint4 v = next[i];
        if constexpr (kApply) v = applied(v, next_x[i], c0, p0 + row < g.pixels);
        *reinterpret_cast<uint4*>(gt + row * kGradLd + c0) = v;
      }
    }
    if (slice + kWarps < end) load_gradients(static_cast<long long>(slice + kWarps) * kPixels, next, next_x);
    gather.taps(x, g, p0, tt);
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::col_major> a[2];
    wmma::load_matrix_sync(a[0], tt, kTapsLd);
    wmma::load_matrix_sync(a[1], tt + 16, kTapsLd);
#pragma unroll  // constant fragment indices: the accumulators stay in registers
    for (int j = 0; j < kMaxK / 16; ++j) {
      if (j >= k_tiles) break;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> b;
      wmma::load_matrix_sync(b, gt + j * 16, kGradLd);
      wmma::mma_sync(acc[0][j], a[0], b, acc[0][j]);
      wmma::mma_sync(acc[1][j], a[1], b, acc[1][j]);
    }
    __syncwarp();  // the next slice overwrites the tiles
  }
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < kMaxK / 16; ++j)
      if (j < k_tiles)
        wmma::store_matrix_sync(sums[warp] + i * 16 * kMaxK + j * 16, acc[i][j], kMaxK, wmma::mem_row_major);
  __syncthreads();
  float* out = partials + static_cast<size_t>(blockIdx.x) * g.taps * g.k;
  for (int e = threadIdx.x; e < g.taps * g.k; e += kThreads) {
    const int tap = e / g.k, k = e % g.k;
    float s = 0.f;
    for (int w = 0; w < kWarps; ++w) s += sums[w][tap * kMaxK + k];
    out[e] = s;
  }
}

// dw[k][tap] (KRSC: tap = (r, s, c) in that order) = the sum of the CTAs' rows: a block per 32
// outputs (a lane each), its 8 warps each adding every 8th row, then the 8 sums in warp order; the
// same order every run.
constexpr int kReduceWarps = 8;
__global__ void __launch_bounds__(32 * kReduceWarps) stem_wgrad_reduce(const float* __restrict__ partials, int ctas,
                                                                      int taps, int k, __half* __restrict__ dw) {
  __shared__ float part[kReduceWarps][32];
  chain_wait();  // launched chained (kernels/chained_launch.h)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, e = blockIdx.x * 32 + lane, outputs = taps * k;
  float s = 0.f;
  if (e < outputs)
    for (int b = warp; b < ctas; b += kReduceWarps) s += partials[static_cast<size_t>(b) * outputs + e];
  part[warp][lane] = s;
  __syncthreads();
  if (warp != 0 || e >= outputs) return;
  float total = 0.f;
  for (int w = 0; w < kReduceWarps; ++w) total += part[w][lane];
  const int tap = e / k, ch = e % k;
  dw[ch * taps + tap] = __float2half_rn(total);
}

// CTAs for a kernel over `pixels`: at most one a warp's slice, what the GPU holds at once and
// kMaxCtas. With the slices split evenly (CtaSlices), the last few CTAs may get none: they write
// rows of zeros.
template <auto Kernel>
int ctas_for(long long pixels) {
  static const unsigned resident = resident_blocks(reinterpret_cast<const void*>(Kernel), kThreads);
  const long long slices = (pixels + kPixels - 1) / kPixels;
  const long long wanted = (slices + kWarps - 1) / kWarps;
  return static_cast<int>(std::max<long long>(1, std::min<long long>({wanted, resident, kMaxCtas})));
}

Geometry geometry_of(const StemShape& s, const char* who) {
  if (const std::string why = stem_conv_refusal(s.c, s.k, s.r, 1, (s.r - 1) / 2); !why.empty())
    throw Fatal(std::string(who) + ": " + why);
  if (s.n < 1 || s.h < 1 || s.w < 1) throw Fatal(std::string(who) + ": an empty batch");
  if (static_cast<long long>(s.n) * s.h * s.w > (1LL << 31) - kPixels)
    throw Fatal(std::string(who) + ": over 2^31 pixels in the batch");
  return {s.h, s.w, s.c, s.k, s.r, (s.r - 1) / 2, s.c * s.r * s.r, static_cast<long long>(s.n) * s.h * s.w};
}

}  // namespace
}  // namespace trainer_kernels
using namespace trainer_kernels;

std::string stem_conv_refusal(int c, int k, int r, int stride, int pad) {
  if (c < 1 || k < 1 || r < 1) return "an empty filter";
  if (stride != 1) return "stride " + std::to_string(stride) + ", not 1";
  if (r % 2 == 0 || pad != (r - 1) / 2) return "not 'same' padding of an odd filter";
  if (c * r * r > kTaps) return std::to_string(c * r * r) + " taps, over " + std::to_string(kTaps);
  if (k % 16 != 0 || k > kMaxK) return std::to_string(k) + " output channels, not a multiple of 16 up to 64";
  return "";
}

size_t stem_conv_partials_bytes(const StemShape& s) {
  return size_t(kMaxCtas) * std::max(s.c * s.r * s.r, 2) * s.k * sizeof(float);
}

int stem_conv_forward(const StemForward& a, cudaStream_t stream) {
  const Geometry g = geometry_of(a.s, "stem_conv_forward");
  if (!a.x || !a.w || !a.y) throw Fatal("stem_conv_forward: a tensor it reads or writes is missing");
  if (reinterpret_cast<uintptr_t>(a.y) % 8 != 0) throw Fatal("stem_conv_forward: the output is not 8-byte aligned");
  const int ctas = ctas_for<stem_forward_kernel>(g.pixels);
  const auto* x = static_cast<const __half*>(a.x);
  launch_chained(stem_forward_kernel, ctas, kThreads, 0, stream, x, static_cast<const __half*>(a.w), g,
                 static_cast<__half*>(a.y), a.partials);
  CUDA_CHECK_LAUNCH();
  return ctas;
}

void stem_wgrad(const StemWgrad& a, cudaStream_t stream) {
  const Geometry g = geometry_of(a.s, "stem_wgrad");
  if (!a.x || !a.dy || !a.dw || !a.partials) throw Fatal("stem_wgrad: a tensor it reads or writes is missing");
  if (!a.bn_x != !a.coef) throw Fatal("stem_wgrad: the BN's apply needs its input and its coefficients together");
  if (reinterpret_cast<uintptr_t>(a.dy) % 16 != 0 || reinterpret_cast<uintptr_t>(a.bn_x) % 16 != 0)
    throw Fatal("stem_wgrad: the gradient or the BN's input is not 16-byte aligned");
  auto run = [&]<bool kApply>() {
    const int ctas = ctas_for<stem_wgrad_partials<kApply>>(g.pixels);
    launch_chained(stem_wgrad_partials<kApply>, ctas, kThreads, 0, stream, static_cast<const __half*>(a.x),
                   static_cast<const __half*>(a.dy), static_cast<const __half*>(a.bn_x), a.coef, g, a.partials);
    return ctas;
  };
  const int ctas = a.coef ? run.template operator()<true>() : run.template operator()<false>();
  CUDA_CHECK_LAUNCH();
  const int outputs = g.taps * g.k;
  launch_chained(stem_wgrad_reduce, (outputs + 31) / 32, 32 * kReduceWarps, 0, stream, a.partials, ctas, g.taps,
                 g.k, static_cast<__half*>(a.dw));
  CUDA_CHECK_LAUNCH();
}
