// A whole convolution (any filter size, the 3x3 convs of the blocks included) as CUTLASS's Hopper
// implicit GEMM (TMA im2col loads, warp-specialized wgmma), fp16 NHWC in and out, fp32
// accumulators, for the kernel lab only: how close CUTLASS comes to cuDNN's conv at the network's
// shapes, forward and data gradient, before a kernel of ours for the 3x3 convs goes near the trainer
// (issue 36: after the 1x1 convs, the 3x3 ones are the compute-bound part of the step that cuDNN runs).
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "model/conv.h"

namespace lab {

enum class ImplicitOp { Fprop, Dgrad };

// One build: the direction and the tile (pixels x channels out, 64 channels in a step), a CTA a
// tile (CUTLASS's one schedule for Hopper convs), no cluster.
struct ImplicitConvBuild {
  ImplicitOp op;
  int tile_m, tile_n;
};
const std::vector<ImplicitConvBuild>& implicit_conv_builds();
std::string implicit_conv_text(const ImplicitConvBuild& b);  // "CUTLASS implicit GEMM (ours; ...)"

// A build set up for one conv and its tensors: Fprop y = conv(x, w), x [n,h,w,c], y [n,p,q,k];
// Dgrad dx = conv_backward_data(dy, w), dy [n,p,q,k], dx [n,h,w,c]; w KRSC [k,r,s,c]. run(stream)
// launches it alone (its arguments built once, here).
struct ImplicitConvRun {
  std::string refused;  // "" where it runs: else why not (no sm_90, CUTLASS's can_implement)
  size_t workspace = 0;
  std::function<void(cudaStream_t)> run;
};
// The tensors must outlive the run; `workspace` bytes at ws, which the caller provides after asking
// with ws = nullptr (only the size is then filled in).
ImplicitConvRun implicit_conv(const ImplicitConvBuild& b, const ConvGeometry& g, const void* in, const void* w,
                              void* out, void* ws);

// What the dispatcher (cutlass_implicit_conv.cu) calls in the files that build them
// (cutlass_implicit_fprop.cu, cutlass_implicit_dgrad.cu, with CUTLASS): the build of a tile, or
// nullptr where there is none.
namespace implicit_builds {
using Maker = ImplicitConvRun (*)(const ConvGeometry&, const void*, const void*, void*, void*);
Maker fprop(int tile_m, int tile_n);
Maker dgrad(int tile_m, int tile_n);
}  // namespace implicit_builds

}  // namespace lab
