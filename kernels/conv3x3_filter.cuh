// A 3x3 filter rearranged for a data gradient of ours (kernels/conv3x3.h turns it, kernels/conv3x3_stride2.h
// puts its taps in the phases' order): out[c][t][k] = w[k][from[t]][c], fp16, w KRSC [k, 3, 3, c].
// Each tap is a transpose of [k][c] to [c][k]: tiles of 32 x 32 through shared memory, so that both
// the reads (along c) and the writes (along k) are whole rows. Why: read along k, 9 c apart, layer4's
// 512 x 512 filter took 41.6 µs at batch 256 (H200, 2026-12-03, in the step with the stride-2 data
// gradient of ours; bench/results/levers-session54-nvidia-h200-2026-12-03.md).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "core/errors.h"
#include "kernels/chained_launch.cuh"

namespace trainer_kernels {

struct FilterTaps {
  int8_t from[9];  // out's tap t is the filter's tap from[t] (r * 3 + s)
};

constexpr int kFilterTile = 32;

// Grid (c / Tile, k / Tile, 9), blocks of Tile x 8 threads; c and k multiples of Tile. (A template:
// the two files that launch it each hold their own.)
template <int Tile>
__global__ void __launch_bounds__(Tile * 8) rearrange_filter_kernel(const __half* w, __half* out, int k, int c, FilterTaps taps) {
  __shared__ __half tile[Tile][Tile + 1];  // +1: the column reads fall on different banks
  chain_wait();  // launched chained (kernels/chained_launch.h)
  const int t = blockIdx.z, from = taps.from[t];
  const int c0 = blockIdx.x * Tile, k0 = blockIdx.y * Tile;
  for (int r = threadIdx.y; r < Tile; r += blockDim.y)
    tile[r][threadIdx.x] = w[(int64_t(k0 + r) * 9 + from) * c + c0 + threadIdx.x];
  __syncthreads();
  for (int r = threadIdx.y; r < Tile; r += blockDim.y)
    out[(int64_t(c0 + r) * 9 + t) * k + k0 + threadIdx.x] = tile[threadIdx.x][r];
}

// out as above, on `stream`. c and k must be multiples of 32 (whole tiles; the callers' refusals ask
// 64): else it throws (Fatal).
inline void rearrange_filter(const void* w, void* out, int k, int c, const FilterTaps& taps, cudaStream_t stream) {
  if (c % kFilterTile || k % kFilterTile) throw Fatal("a 3x3 filter rearranged: channels not multiples of 32");
  launch_chained(rearrange_filter_kernel<kFilterTile>, dim3(c / kFilterTile, k / kFilterTile, 9), dim3(kFilterTile, 8), 0, stream,
                 static_cast<const __half*>(w), static_cast<__half*>(out), k, c, taps);
}

}  // namespace trainer_kernels
