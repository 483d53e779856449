// The positive control of `make sanitize-gpu` (tests/sanitize_gpu.sh): a kernel with a planted
// shared-memory race, named as the trainer's kernels are (namespace trainer_kernels, see
// kernels/common.cuh). racecheck must report it under the same kernel filter that the training runs
// are checked with; if it does not, that filter selects nothing and a clean result would mean nothing.
#include <cstdio>

namespace trainer_kernels {
namespace {

__global__ void planted_race(int* out) {
  __shared__ int slot[64];
  slot[threadIdx.x % 64] = threadIdx.x;               // threads i and i + 64 write the same word
  out[threadIdx.x] = slot[(threadIdx.x + 1) % 64];    // and others read it, with no barrier between
}

}  // namespace
}  // namespace trainer_kernels

int main() {
  int* out = nullptr;
  cudaError_t err = cudaMalloc(&out, 256 * sizeof(int));
  if (err == cudaSuccess) {
    trainer_kernels::planted_race<<<1, 256>>>(out);
    err = cudaDeviceSynchronize();
  }
  std::printf("racecheck probe: %s\n", cudaGetErrorString(err));
  return err == cudaSuccess ? 0 : 1;
}
