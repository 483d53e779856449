// Memsets as one kernel (fill.h): each region is filled exactly as
// cudaMemset/cudaMemset2D would (value truncated to the element size, `height` rows of `width`
// elements, `pitch` bytes apart), one region after the other in the same grid-stride loop.
#include <algorithm>
#include <cstdint>

#include "fill.h"
#include "common.cuh"

namespace trainer_kernels {  // why: kernels/common.cuh
namespace {

constexpr int kThreads = 256;

// The region as 32-bit words where its start, rows and pitch allow: one store fills 4 bytes.
__device__ bool fills_as_words(const FillRegion& r) {
  const size_t row_bytes = r.width * r.element_size;
  return reinterpret_cast<uintptr_t>(r.dst) % 4 == 0 && row_bytes % 4 == 0 && (r.height == 1 || r.pitch % 4 == 0);
}

// The element's bit pattern repeated across a 32-bit word.
__device__ uint32_t word_of(const FillRegion& r) {
  switch (r.element_size) {
    case 1: return (r.value & 0xFFu) * 0x01010101u;
    case 2: return (r.value & 0xFFFFu) * 0x00010001u;
    default: return r.value;
  }
}

__device__ void fill(const FillRegion& r, size_t first, size_t stride) {
  char* base = static_cast<char*>(r.dst);
  if (fills_as_words(r)) {
    const size_t per_row = r.width * r.element_size / 4, n = per_row * r.height;
    const uint32_t w = word_of(r);
    for (size_t i = first; i < n; i += stride)
      reinterpret_cast<uint32_t*>(base + (i / per_row) * r.pitch)[i % per_row] = w;
    return;
  }
  const size_t n = r.width * r.height;
  for (size_t i = first; i < n; i += stride) {
    char* p = base + (i / r.width) * r.pitch + (i % r.width) * r.element_size;
    switch (r.element_size) {
      case 1: *reinterpret_cast<uint8_t*>(p) = static_cast<uint8_t>(r.value); break;
      case 2: *reinterpret_cast<uint16_t*>(p) = static_cast<uint16_t>(r.value); break;
      default: *reinterpret_cast<uint32_t*>(p) = r.value; break;
    }
  }
}

__global__ void __launch_bounds__(kThreads) fill_regions_kernel(FillRegions f) {
  const size_t first = blockIdx.x * size_t(blockDim.x) + threadIdx.x, stride = size_t(gridDim.x) * blockDim.x;
  for (int i = 0; i < f.count; ++i) fill(f.region[i], first, stride);
}

// Span blockIdx.y, by the x blocks in a grid-stride loop: 32-bit stores where it is aligned for them.
__global__ void __launch_bounds__(kThreads) zero_spans_kernel(ZeroSpans s) {
  char* base = static_cast<char*>(s.dst[blockIdx.y]);
  const size_t bytes = s.bytes[blockIdx.y];
  const size_t first = blockIdx.x * size_t(blockDim.x) + threadIdx.x, stride = size_t(gridDim.x) * blockDim.x;
  if (reinterpret_cast<uintptr_t>(base) % 4 == 0 && bytes % 4 == 0) {
    for (size_t i = first; i < bytes / 4; i += stride) reinterpret_cast<uint32_t*>(base)[i] = 0u;
    return;
  }
  for (size_t i = first; i < bytes; i += stride) base[i] = 0;
}

}  // namespace
}  // namespace trainer_kernels
using namespace trainer_kernels;

namespace {
unsigned fill_grid(const FillRegions& f) {
  size_t largest = 0;  // stores of the largest region: one per thread covers the small ones too
  for (int i = 0; i < f.count; ++i) largest = std::max(largest, f.region[i].width * f.region[i].height);
  return grid_for(largest, kThreads);
}
}  // namespace

namespace {
dim3 zero_spans_grid(const ZeroSpans& s) {
  size_t largest = 0;  // words of the largest span: one per thread, at most 64 blocks a span
  for (int i = 0; i < s.count; ++i) largest = std::max(largest, (size_t(s.bytes[i]) + 3) / 4);
  return dim3(std::min(grid_for(std::max<size_t>(largest, 1), kThreads), 64u), static_cast<unsigned>(s.count));
}
}  // namespace

cudaKernelNodeParams zero_spans_node(const ZeroSpans& s, void* args[1]) {
  args[0] = const_cast<ZeroSpans*>(&s);
  cudaKernelNodeParams p{};
  p.func = reinterpret_cast<void*>(zero_spans_kernel);
  p.gridDim = zero_spans_grid(s);
  p.blockDim = dim3(kThreads);
  p.kernelParams = args;
  return p;
}

void zero_spans(const ZeroSpans& s, cudaStream_t stream) {
  if (s.count == 0) return;
  zero_spans_kernel<<<zero_spans_grid(s), kThreads, 0, stream>>>(s);
  CUDA_CHECK_LAUNCH();
}

cudaKernelNodeParams fill_regions_node(const FillRegions& f, void* args[1]) {
  args[0] = const_cast<FillRegions*>(&f);
  cudaKernelNodeParams p{};
  p.func = reinterpret_cast<void*>(fill_regions_kernel);
  p.gridDim = dim3(fill_grid(f));
  p.blockDim = dim3(kThreads);
  p.kernelParams = args;
  return p;
}

void fill_regions(const FillRegions& f, cudaStream_t stream) {
  fill_regions_kernel<<<fill_grid(f), kThreads, 0, stream>>>(f);
  CUDA_CHECK_LAUNCH();
}
