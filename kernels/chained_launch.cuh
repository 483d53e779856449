// The device side and the launcher of chained kernels (kernels/chained_launch.h says what and why).
// Apart from kernels/common.cuh so that the CUTLASS kernels' headers can include it (core/types.h's
// Layout would meet cute's).
#pragma once

#include <cuda_runtime.h>

#include "core/check.h"
#include "kernels/chained_launch.h"

// A chained kernel calls this before its first read or write of global memory: it returns once the
// kernel before it on the stream has ended and its writes are visible (at once where the kernel was
// not launched chained, or on a GPU before Hopper).
__device__ __forceinline__ void chain_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Lets the next chained kernel launch once every CTA of this one has called it, rather than as this
// one ends; the next still waits in chain_wait() for this one's end and writes. Called by the BN
// finalizes, whose few CTAs leave the SMs to the next kernel's (kernels/chained_launch.h says what it
// was measured to buy there and to cost in the other kernels).
__device__ __forceinline__ void chain_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream>>>(args...), chained where chained_launches() says so. Every
// kernel launched through it calls chain_wait() first.
template <class... KernelArgs, class... Args>
void launch_chained(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                    const Args&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute chained{};
  chained.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  chained.val.programmaticStreamSerializationAllowed = chained_launches() ? 1 : 0;
  cfg.attrs = &chained;
  cfg.numAttrs = 1;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, static_cast<KernelArgs>(args)...));
}
