// Helpers shared by the kernel families: fp32/fp16 conversion, 16-byte vector access, and the
// grid of a grid-stride kernel.
//
// Each family's launchers are declared in its header beside its .cu (kernels/pooling.h for
// kernels/pooling.cu, ...). Activations are passed to them as void* with their DType and Layout
// (from the tensor descriptors), so the same launchers serve every variant of the ladder and the
// tests can run any combination in one binary. Every launcher checks its launch and returns
// immediately (stream-ordered).
//
// Every kernel of this project is defined in namespace trainer_kernels (inside an anonymous one, so
// helpers stay private to their file), which puts "trainer_kernels" in each kernel's mangled name:
// that is how a tool tells our kernels from cuDNN's and cuBLAS's. `make sanitize-gpu` runs racecheck
// on these alone (--kernel-name kns=trainer_kernels; tests/sanitize_gpu.sh says why).
#pragma once

#include <cuda_fp16.h>

#include "core/check.h"
#include "core/types.h"
#include "kernels/chained_launch.cuh"

template <class T> __device__ __forceinline__ float to_float(T v);
template <> __device__ __forceinline__ float to_float<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }

template <class T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

// Elements of T in one 16-byte access: the unit every elementwise kernel works in.
template <class T> constexpr int kVec = 16 / sizeof(T);

template <class T>
__device__ __forceinline__ void load_vec(const T* p, float (&out)[kVec<T>]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int j = 0; j < kVec<T>; ++j) out[j] = to_float(e[j]);
}

template <class T>
__device__ __forceinline__ void store_vec(T* p, const float (&in)[kVec<T>]) {
  uint4 raw;
  T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
  for (int j = 0; j < kVec<T>; ++j) e[j] = from_float<T>(in[j]);
  *reinterpret_cast<uint4*>(p) = raw;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The blocks that cover `work` items at `threads` a block: at least one, at most `cap`.
inline unsigned blocks_for(size_t work, int threads, size_t cap) {
  const size_t blocks = (work + threads - 1) / threads;
  return static_cast<unsigned>(blocks < cap ? (blocks > 0 ? blocks : 1) : cap);
}

// Blocks for a grid-stride loop over `work` items, at most 2,112, for the kernels that do not launch
// as one wave (below): the fills made into graph nodes and bin/predict's filter fold, both short.
inline unsigned grid_for(size_t work, int threads) { return blocks_for(work, threads, 132 * 16); }

// The blocks of `threads` threads of `kernel` the GPU holds at once: its SMs times what fits on one.
inline unsigned resident_blocks(const void* kernel, int threads) {
  int device = 0, sms = 0, per_sm = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
  return static_cast<unsigned>(sms * per_sm > 0 ? sms * per_sm : 1);
}

// Blocks for a grid-stride loop of Kernel over `work` items, kThreadsPerBlock a block: one wave, at
// most what the GPU holds at once. More blocks than that run in rounds, and a last round with fewer
// blocks per SM leaves memory bandwidth unused: grid_for's 2,112 blocks of a kernel that fits 3 to
// an SM of 132 take 6 rounds for 5.33 rounds of work. One wave of blocks that each loop further ends
// within one loop's work of together. (Measured once per kernel, on the first GPU it launches on.)
template <auto Kernel, int kThreadsPerBlock>
unsigned one_wave_grid(size_t work) {
  static const unsigned resident = resident_blocks(reinterpret_cast<const void*>(Kernel), kThreadsPerBlock);
  return blocks_for(work, kThreadsPerBlock, resident);
}

// Launches a grid-stride Kernel over `work` items in one wave of kThreadsPerBlock-thread blocks.
template <auto Kernel, int kThreadsPerBlock, class... Args>
void launch_one_wave(size_t work, cudaStream_t stream, const Args&... args) {
  Kernel<<<one_wave_grid<Kernel, kThreadsPerBlock>(work), kThreadsPerBlock, 0, stream>>>(args...);
}
// The same, chained (launch_chained): Kernel calls chain_wait() first.
template <auto Kernel, int kThreadsPerBlock, class... Args>
void launch_one_wave_chained(size_t work, cudaStream_t stream, const Args&... args) {
  launch_chained(Kernel, one_wave_grid<Kernel, kThreadsPerBlock>(work), kThreadsPerBlock, 0, stream, args...);
}

// Calls f.template operator()<T>() with T = float or __half.
template <class F>
void dispatch_dtype(DType t, F&& f) {
  if (t == DType::F32) f.template operator()<float>();
  else f.template operator()<__half>();
}
