// What the batch-norm kernel tests share (tests/kernels/test_batchnorm_gpu.cpp and
// test_batchnorm_backward_gpu.cpp): the reference's constants, the shapes and which of them a type
// and layout can run, an apply's arguments, and the GpuBatchNorm fixture. Its TEST_Ps are in both
// files (one fixture type, so that GoogleTest keeps them one suite); the first instantiates it.
#pragma once

#include <gtest/gtest.h>

#include "kernels/batchnorm.h"
#include "support/bn_data.h"
#include "support/gpu_test_util.h"

namespace gpu_test {

const double kEps = double(kBnEps);
const double kMomentum = double(kBnMomentum);

inline bool bn_supported(const ref::Dims& d, DType t, Layout l) { return bn_layout_refusal(shape4(d), t, l).empty(); }

// Shapes of several reduction geometries: one chunk, many chunks (NHWC rows / NCHW images), a
// channel tile narrower than 32 vectors, several tiles, N not dividing the chunk count, rows that
// fill the unrolled loop exactly ({16, 64, 16, 16}), a last chunk shorter than the others and a
// partial last tile whose vectors per row are not a power of two ({6, 96, 10, 10}); and the odd
// sides of ResNet-50's stages at --image-size 28 (7x7) and 12 (3x3), which NHWC alone runs.
const ref::Dims kBnShapes[] = {{4, 16, 8, 8}, {8, 32, 16, 16}, {3, 24, 4, 4}, {2, 512, 2, 2}, {5, 2048, 2, 2},
                               {16, 64, 16, 16}, {6, 96, 10, 10}, {4, 64, 7, 7}, {3, 128, 3, 3}};

// Apply with bn's scale/shift, no residual, with ReLU (what the tests then change).
inline ApplyArgs apply_args(const void* x, const DeviceBn& bn, void* y) {
  ApplyArgs a{};
  a.x = x;
  a.scale = bn.scale.f32();
  a.shift = bn.shift.f32();
  a.y = y;
  return a;
}

inline const char* residual_name(Residual r) {
  return r == Residual::None ? "no residual" : r == Residual::Tensor ? "residual tensor" : "residual BN";
}

class GpuBatchNorm : public testing::TestWithParam<Variant> {};

}  // namespace gpu_test
