// The stem's filter gradient (kernels/stem_wgrad.h): dw[k][t] = sum over pixels p of dy[p][k] *
// x_t(p), where tap t = (r, s, c) and x_t(p) is the input element that tap reads for pixel p (zero
// outside the image). As a matrix product over the pixels: dw^T (taps x k) = X^T (taps x pixels) *
// dy (pixels x k), taps padded to 32 with zero columns of X.
#include "kernels/stem_wgrad.h"

#include <mma.h>

#include <algorithm>

#include "core/errors.h"
#include "kernels/common.cuh"

namespace trainer_kernels {  // why: kernels/common.cuh
namespace {

using namespace nvcuda;

constexpr int kTaps = 32;       // taps padded to two 16-row tiles
constexpr int kMaxK = 64;       // four 16-column tiles of output channels
constexpr int kPixels = 16;     // pixels a warp adds per product
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kMaxCtas = 4 * 132;  // four a SM of an H100/H200 (what fits): 16 warps' loads in flight

struct Geometry {
  int n, h, w, c, k, r, pad, taps;
  long long pixels;
};

// One CTA: each warp takes 16 pixels at a time (a slice; the CTA's slices in turn), gathers their taps into shared memory as a column-major 32 x 16 tile
// (taps x pixels) and their gradients as a row-major 16 x k tile, and adds the product into its
// accumulators (32 x k, fp32). The next slice's gradients are loaded while this one's taps are
// gathered and multiplied. At the end the warps' sums go through shared memory, in warp order, into
// the CTA's row of partial sums.
__global__ void __launch_bounds__(kThreads) stem_wgrad_partials(const __half* __restrict__ x,
                                                                const __half* __restrict__ dy, Geometry g,
                                                                float* __restrict__ partials) {
  __shared__ __align__(32) __half taps_tile[kWarps][kPixels * kTaps];
  __shared__ __align__(32) __half grad_tile[kWarps][kPixels * kMaxK];
  __shared__ __align__(32) float sums[kWarps][kTaps * kMaxK];
  __shared__ long long pixel_image[kWarps][kPixels];  // offset of the pixel's image in x; -1: past the end
  __shared__ int pixel_row[kWarps][kPixels], pixel_col[kWarps][kPixels];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // lane = tap (r, s, c) of the gather: its offsets from the pixel, decoded once
  const bool real_tap = lane < g.taps;
  const int c_of_tap = lane % g.c, s_off = (lane / g.c) % g.r - g.pad, r_off = lane / (g.c * g.r) - g.pad;
  const int k_tiles = g.k / 16, row_vectors = g.k / 8;  // 16-byte vectors in a pixel's gradient row
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][kMaxK / 16];
  for (auto& row : acc)
    for (auto& f : row) wmma::fill_fragment(f, 0.f);
  __half* tt = taps_tile[warp];
  __half* gt = grad_tile[warp];
  // vector e of the slice's gradients -> (pixel e / row_vectors, column e % row_vectors * 8)
  constexpr int kLoads = kPixels * kMaxK / 8 / 32;
  auto load_gradients = [&](long long p0, uint4 (&v)[kLoads]) {
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int e = lane + 32 * i, row = e / row_vectors;
      v[i] = make_uint4(0, 0, 0, 0);
      if (e < kPixels * row_vectors && p0 + row < g.pixels)
        v[i] = *reinterpret_cast<const uint4*>(dy + (p0 + row) * g.k + e % row_vectors * 8);
    }
  };
  // The CTA's slices are a contiguous run (its pixels' input rows stay in L1), taken by its warps in turn.
  const int slices = static_cast<int>((g.pixels + kPixels - 1) / kPixels);
  const int per_cta = (slices + gridDim.x - 1) / gridDim.x;
  const int end = min(slices, (blockIdx.x + 1) * per_cta);
  uint4 next[kLoads];
  int slice = blockIdx.x * per_cta + warp;
  if (slice < end) load_gradients(static_cast<long long>(slice) * kPixels, next);
  for (; slice < end; slice += kWarps) {
    const long long p0 = static_cast<long long>(slice) * kPixels;
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int e = lane + 32 * i;
      if (e < kPixels * row_vectors)
        *reinterpret_cast<uint4*>(gt + e / row_vectors * kMaxK + e % row_vectors * 8) = next[i];
    }
    if (slice + kWarps < end) load_gradients(static_cast<long long>(slice + kWarps) * kPixels, next);
    // the slice's pixels decoded once (lanes 0-15), then each lane gathers its tap of every pixel,
    // all 16 loads in flight at once: zero outside the image, past the last pixel and for the padded
    // taps
    if (lane < kPixels) {
      const long long p = p0 + lane;
      const unsigned q = static_cast<unsigned>(p), plane = static_cast<unsigned>(g.h) * g.w;
      pixel_image[warp][lane] = p < g.pixels ? static_cast<long long>(q / plane) * plane * g.c : -1;
      pixel_row[warp][lane] = static_cast<int>(q % plane / g.w);
      pixel_col[warp][lane] = static_cast<int>(q % g.w);
    }
    __syncwarp();
    __half v[kPixels];
#pragma unroll
    for (int q = 0; q < kPixels; ++q) {
      const long long image = pixel_image[warp][q];
      const int ih = pixel_row[warp][q] + r_off, iw = pixel_col[warp][q] + s_off;
      v[q] = __float2half(0.f);
      if (image >= 0 && real_tap && ih >= 0 && ih < g.h && iw >= 0 && iw < g.w)
        v[q] = x[image + (static_cast<long long>(ih) * g.w + iw) * g.c + c_of_tap];
    }
#pragma unroll
    for (int q = 0; q < kPixels; ++q) tt[q * kTaps + lane] = v[q];
    __syncwarp();
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::col_major> a[2];
    wmma::load_matrix_sync(a[0], tt, kTaps);
    wmma::load_matrix_sync(a[1], tt + 16, kTaps);
#pragma unroll  // constant fragment indices: the accumulators stay in registers
    for (int j = 0; j < kMaxK / 16; ++j) {
      if (j >= k_tiles) break;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> b;
      wmma::load_matrix_sync(b, gt + j * 16, kMaxK);
      wmma::mma_sync(acc[0][j], a[0], b, acc[0][j]);
      wmma::mma_sync(acc[1][j], a[1], b, acc[1][j]);
    }
    __syncwarp();  // the next slice overwrites the tiles
  }
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < kMaxK / 16; ++j)
      if (j < k_tiles) wmma::store_matrix_sync(sums[warp] + i * 16 * kMaxK + j * 16, acc[i][j], kMaxK, wmma::mem_row_major);
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

int ctas_for(long long pixels) {
  static const unsigned resident = resident_blocks(reinterpret_cast<const void*>(stem_wgrad_partials), kThreads);
  const long long slices = (pixels + kPixels - 1) / kPixels;
  const long long wanted = (slices + kWarps - 1) / kWarps;
  return static_cast<int>(std::max<long long>(1, std::min<long long>({wanted, resident, kMaxCtas})));
}

}  // namespace
}  // namespace trainer_kernels
using namespace trainer_kernels;

std::string stem_wgrad_refusal(int c, int k, int r, int stride, int pad) {
  if (stride != 1) return "stride " + std::to_string(stride) + ", not 1";
  if (r % 2 == 0 || pad != (r - 1) / 2) return "not 'same' padding of an odd filter";
  if (c * r * r > kTaps) return std::to_string(c * r * r) + " taps, over " + std::to_string(kTaps);
  if (k % 16 != 0 || k > kMaxK) return std::to_string(k) + " output channels, not a multiple of 16 up to 64";
  return "";
}

size_t stem_wgrad_partials_bytes(int k, int c, int r) { return size_t(kMaxCtas) * c * r * r * k * sizeof(float); }

void stem_wgrad(const StemWgrad& a, cudaStream_t stream) {
  if (const std::string why = stem_wgrad_refusal(a.c, a.k, a.r, 1, (a.r - 1) / 2); !why.empty())
    throw Fatal("stem_wgrad: " + why);
  if (!a.x || !a.dy || !a.dw || !a.partials || a.n < 1 || a.h < 1 || a.w < 1)
    throw Fatal("stem_wgrad: a tensor it reads or writes is missing, or the batch is empty");
  if (reinterpret_cast<uintptr_t>(a.dy) % 16 != 0) throw Fatal("stem_wgrad: the gradient is not 16-byte aligned");
  if (static_cast<long long>(a.n) * a.h * a.w > (1LL << 31) - kPixels)
    throw Fatal("stem_wgrad: over 2^31 pixels in the batch");
  const Geometry g{a.n, a.h, a.w, a.c, a.k, a.r, (a.r - 1) / 2, a.c * a.r * a.r, static_cast<long long>(a.n) * a.h * a.w};
  const int ctas = ctas_for(g.pixels);
  stem_wgrad_partials<<<ctas, kThreads, 0, stream>>>(static_cast<const __half*>(a.x), static_cast<const __half*>(a.dy),
                                                      g, a.partials);
  CUDA_CHECK_LAUNCH();
  const int outputs = g.taps * g.k;
  stem_wgrad_reduce<<<(outputs + 31) / 32, 32 * kReduceWarps, 0, stream>>>(a.partials, ctas, g.taps, g.k,
                                                                            static_cast<__half*>(a.dw));
  CUDA_CHECK_LAUNCH();
}
