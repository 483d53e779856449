// The builds of kernel_lab/cutlass_conv_stats.h: each schedule and tile in a file of its own
// (cutlass_gemm_<schedule>_<tile>.cu, compiled side by side: each takes a minute or more), and
// what the dispatcher (cutlass_conv_stats.cu) calls in them. Only in a build with CUTLASS.
#pragma once

#include <cstddef>
#include <string>

#include "kernel_lab/cutlass_conv_stats.h"

namespace lab::cutlass_builds {

// Where the partial sums of one statistic lie: a row of K rounded up to whole tiles for each row of
// tiles (the layout CUTLASS's row reduction writes them in).
inline CutlassPartials partials_layout(int tile_m, int tile_n, int m, int k) {
  return {(m + tile_m - 1) / tile_m, (k + tile_n - 1) / tile_n * tile_n};
}

struct Ops {
  std::string (*refusal)(int m, int k, int c);  // "" where CUTLASS can run the shape
  size_t (*workspace)(int m, int k, int c);
  void (*run)(const CutlassConvStats& a, cudaStream_t stream);
  CutlassPartials (*partials)(int m, int k);  // where the statistics are left
};

// Each file's build, with the statistics or without.
const Ops* cooperative_128x64(bool stats);
const Ops* pingpong_128x64(bool stats);
const Ops* cooperative_256x64(bool stats);
// With the previous BN's prologue.
const Ops* prologue_cooperative_256x64(bool stats);

}  // namespace lab::cutlass_builds
