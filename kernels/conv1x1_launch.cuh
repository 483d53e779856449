// What the launchers of our resident 1x1 conv kernels share (kernels/conv1x1_stats.cu and
// kernels/conv1x1_dgrad.cu): the tile, the GPU's facts, the grid, which GEMMs they can tile, and
// the launch of kernels/conv1x1_stats_kernel.cuh.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include "core/check.h"
#include "core/errors.h"
#include "kernels/conv1x1_finalize.h"
#include "kernels/conv1x1_stats.h"

#if defined(CONV1X1_WITH_CUTLASS)
#include "kernels/conv1x1_stats_kernel.cuh"
#endif

namespace trainer_kernels::conv1x1 {

constexpr int kTileM = 128, kTileN = 64, kTileK = 64;

// What the kernels ask of the GPU: read once, on the first GPU they run on (as one_wave_grid in
// kernels/common.cuh), not at each of a step's launches.
struct Gpu {
  int sms, cc;  // cc: major * 10 + minor
};
inline const Gpu& gpu() {
  static const Gpu g = [] {
    int dev = 0, sms = 0, major = 0, minor = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    return Gpu{sms, 10 * major + minor};
  }();
  return g;
}

// The CTAs that share a column of tiles: as many as fill the SMs, one CTA an SM.
inline int ctas_per_column(int m, int n) { return std::max(1, std::min(m / kTileM, gpu().sms / std::max(1, n / kTileN))); }

// The bytes of `sums` kinds of partial sums: a row of n for each CTA of a column, each kind.
inline size_t partials_bytes(int sums, int m, int n) { return size_t(sums) * ctas_per_column(m, n) * n * sizeof(float); }

// Whether [a, a + a_bytes) and [b, b + b_bytes) share a byte: a tensor a kernel writes while other
// CTAs still read one it overlaps would be read half written.
inline bool overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

// Whether p is a multiple of `bytes` (TMA's tensors and 16-byte copies 16, the coefficients' pairs
// 8, the bits' rows 8).
inline bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// "" where this build and GPU tile the GEMM [m, k] by [k, n], else why not.
inline std::string gemm_refusal(int m, int n, int k) {
#if defined(CONV1X1_WITH_CUTLASS)
  if (std::string why = sm90a_gpu_refusal(); !why.empty()) return why;
  if (m <= 0 || m % kTileM) return "pixels not a positive multiple of the tile's 128 rows";
  if (n <= 0 || n % kTileN) return "output channels not a positive multiple of the tile's 64";
  if (k <= 0 || k % kTileK) return "input channels not a positive multiple of the k-tile's 64";
  if (n / kTileN > gpu().sms) return "more columns of tiles than SMs";
  return "";
#else
  (void)m, (void)n, (void)k;
  return "built without it (the build covers no sm_90)";
#endif
}

// "" where the kernel can finalize into f (or is not asked to: no counters), else what is missing.
// Forward: the statistics' state; backward: what the weight gradients and coefficients need.
inline std::string finalize_refusal(const Conv1x1Finalize& f, bool forward) {
  if (!f.arrivals) return "";
  const BnChannelState& b = f.bn;
  if (forward) {
    if (!b.gamma || !b.beta || !b.running_mean || !b.running_var || !b.save_mean || !b.save_invstd || !b.scale ||
        !b.shift || !f.scale_h != !f.shift_h)
      return "the BN to finalize lacks part of its state";
    return "";
  }
  if (!b.gamma || !b.save_mean || !b.save_invstd || !b.bwd_coef || !f.dgamma || !f.dbeta)
    return "the BN to finalize lacks part of its state or its weight gradients";
  return "";
}

// "" where the arguments of an Inner data gradient (Conv1x1DgradBn, Conv3x3DgradBn) are whole, else
// what is missing: the mask's fp16 coefficients, the tensors it reads and writes but the filter
// (each launcher checks its own), what its finalize needs.
template <class Args>
std::string inner_grad_args_refusal(const Args& a) {
  if (!a.scale || !a.shift) return "the ReLU mask needs the BN's fp16 scale and shift";
  if (!a.dy || !a.dz || !a.x || !a.mean || !a.invstd || !a.partials) return "a tensor it reads or writes is missing";
  return finalize_refusal(a.finalize, false);
}

#if defined(CONV1X1_WITH_CUTLASS)
// The 4-D TMA descriptor of an NHWC fp16 image batch x [n][h][w][c] read in boxes of 64 channels, whole
// rows (w columns) of `rows` rows and `images` images, 128-byte rows swizzled as CUTLASS's mainloops
// lay out a K-major tile: the 3x3 convs' (kernels/cutlass_taps_mainloop.cuh, cutlass_halo_mainloop.cuh).
// Coordinates outside the tensor read as zeros: the convs' padding.
inline cute::TmaDescriptor image_rows_descriptor(const void* x, int n, int h, int w, int c, int rows, int images) {
  cute::TmaDescriptor desc{};
  const cuuint64_t dims[4] = {cuuint64_t(c), cuuint64_t(w), cuuint64_t(h), cuuint64_t(n)};
  const cuuint64_t strides[3] = {cuuint64_t(c) * 2, cuuint64_t(w) * c * 2, cuuint64_t(h) * w * c * 2};
  const cuuint32_t box[4] = {64, cuuint32_t(w), cuuint32_t(rows), cuuint32_t(images)};
  const cuuint32_t steps[4] = {1, 1, 1, 1};
  const CUresult r = CUTLASS_CUDA_DRIVER_WRAPPER_CALL(cuTensorMapEncodeTiled)(
      &desc, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4, const_cast<void*>(x), dims, strides, box, steps,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) throw Fatal("cuTensorMapEncodeTiled failed for a 3x3 conv's input (" + std::to_string(int(r)) + ")");
  return desc;
}

// The Inner data gradient epilogue's parameters (BnGradEpilogue<GradKind::Inner, ...>) from the
// arguments its launchers share (Conv1x1DgradBn, Conv3x3DgradBn: dz, x, its BN, the mask's fp16
// coefficients, the partial sums, the finalize).
template <class Epilogue, class Args>
typename Epilogue::Params inner_grad_params(const Args& a) {
  typename Epilogue::Params e{};
  e.dz = static_cast<cutlass::half_t*>(a.dz);
  e.x = static_cast<const __half*>(a.x);
  e.mean = a.mean;
  e.invstd = a.invstd;
  e.scale = static_cast<const __half2*>(a.scale);
  e.shift = static_cast<const __half2*>(a.shift);
  e.partials = a.partials;
  e.finalize = a.finalize;
  return e;
}

// Kernel (K's, taking K::Params and then `extra`) on params whose mainloop, shape and epilogue are
// set: the grid and the rest filled in.
template <class K, auto kernel, class... Extra>
void launch_with(typename K::Params p, cudaStream_t stream, Extra... extra) {
  p.n_tiles = p.n / kTileN;
  p.m_tiles = p.m / kTileM;
  p.ctas_per_column = ctas_per_column(p.m, p.n);
  constexpr int smem = int(sizeof(typename K::SharedStorage));
  static const bool sized = [] {  // once a build: above 48 KiB a kernel must ask for its shared memory
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return true;
  }();
  (void)sized;
  launch_chained(kernel, p.n_tiles * p.ctas_per_column, K::kThreads, smem, stream, p, extra...);
  CUDA_CHECK(cudaGetLastError());
}

// kernels/conv1x1_stats_kernel.cuh's kernel for K.
template <class K>
void launch(typename K::Params p, cudaStream_t stream) {
  launch_with<K, resident_conv<K>>(p, stream);
}
#endif

}  // namespace trainer_kernels::conv1x1
