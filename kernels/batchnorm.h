// Launchers of the batch-norm kernels, by what they do:
//   kernels/batchnorm_stats.cu      training statistics: reduction over the batch, then finalize
//   kernels/batchnorm_apply.cu      the forward's elementwise apply (affine, residual, ReLU)
//   kernels/batchnorm_backward.cu   backward: reduction, finalize and elementwise apply
//   kernels/batchnorm_eval.cu       evaluation scale/shift, and BN scales folded into filters
// and what they share (geometry, the reductions, per-channel helpers) in batchnorm_common.cuh.
//
// Training-mode batch norm is split as: statistics (partial sums per chunk of rows), a per-channel
// finalize (deterministic, fixed summation order), then an elementwise apply that fuses the affine
// transform with the residual add and ReLU. Backward mirrors it: reduce, finalize, apply.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include "core/types.h"
#include "kernels/batchnorm_state.h"

// Why the batch-norm kernels cannot take a tensor of shape s in t and l, "" when they can. Each
// 16-byte vector they move holds values of one channel only: NHWC needs C, NCHW H*W, a multiple of
// 16 / sizeof(t). In NCHW that depends on the image side (ResNet-50 at 28 has a 7x7 stage), so the
// network asks before it is built (model/network.h); every launcher below throws it as Fatal.
inline std::string bn_layout_refusal(Shape4 s, DType t, Layout l) {
  const int v = static_cast<int>(16 / dtype_size(t));
  if (l == Layout::NHWC && s.c % v != 0)
    return "batch norm: NHWC needs channels divisible by " + std::to_string(v) + ", got " + std::to_string(s.c);
  if (l == Layout::NCHW && (s.h * s.w) % v != 0)
    return "batch norm: NCHW needs H*W divisible by " + std::to_string(v) + ", got " + std::to_string(s.h * s.w) +
           " (" + std::to_string(s.h) + "x" + std::to_string(s.w) + ")";
  return "";
}

// Scratch for the partial sums: at least bn_scratch_floats(shape) floats.
size_t bn_scratch_floats(Shape4 s, DType t, Layout l);

// Statistics of x, then mean/invstd/scale/shift and the running statistics; also scale and shift in
// fp16 to scale_h/shift_h unless they are null (what a fused conv's prologue reads).
void bn_forward_train_stats(const void* x, Shape4 s, DType t, Layout l, const BnChannelState& bn,
                            float* scratch, cudaStream_t stream, void* scale_h = nullptr, void* shift_h = nullptr);
// The same from per-channel sums of x and x^2 over `per_channel` values each, as a fused conv
// produces them (model/fused_conv.h); also writes scale and shift in fp16 to scale_h/shift_h unless
// they are null. Leaves the sums zero: a step replayed as a CUDA graph then needs none of the
// memsets with which cuDNN zeroes them before each conv (core/graph_memsets.h).
void bn_finalize_sums(float* sum, float* sqsum, size_t per_channel, const BnChannelState& bn, int channels,
                      void* scale_h, void* shift_h, cudaStream_t stream);
// The same from rows of partial sums, one row per tile of pixels as a conv of our own leaves them:
// partials[r * row_len + c] for the sums of x, then rows more of them for x^2. Each channel's rows
// are added in a fixed order (deterministic), in double. The partials are only read.
void bn_finalize_partials(const float* partials, int rows, int row_len, size_t per_channel, const BnChannelState& bn,
                          int channels, void* scale_h, void* shift_h, cudaStream_t stream);
// Evaluation: scale/shift from the running statistics; also in fp16 to scale_h/shift_h unless they
// are null.
void bn_forward_eval_coefs(const BnChannelState& bn, int channels, cudaStream_t stream, void* scale_h = nullptr,
                           void* shift_h = nullptr);
// The same for many BNs in one launch (bin/predict's network, whose every BN is in evaluation mode),
// with the fp16 copies of scale and shift where scale_h/shift_h are not null. `targets` is in
// device memory; bit for bit what bn_forward_eval_coefs computes.
struct BnEvalTarget {
  BnChannelState st;
  int channels;
  void* scale_h;
  void* shift_h;
};
void bn_forward_eval_coefs_all(const BnEvalTarget* targets, int count, int max_channels, cudaStream_t stream);
// bin/predict's 1x1 convs that run as one cuBLASLt GEMM (model/gemm_conv.h) read their BN's scale
// folded into the filter: w_folded[k][c] = fp16(w[k][c] * scale[k]), fp16, k-major (KRSC with r = 1),
// from the scale bn_forward_eval_coefs_all wrote for this forward. One launch for every such conv
// (`targets` in device memory); max_elements is the largest k * c among them.
struct FilterFold {
  const void* w;
  const float* scale;
  void* w_folded;
  int k, c;
};
void fold_bn_into_filters(const FilterFold* targets, int count, size_t max_elements, cudaStream_t stream);

// y = relu?(x * scale + shift + residual), residual = none, a raw tensor, or a second BN applied to
// its own input (the projection shortcut, fused so its output is never stored).
enum class Residual { None, Tensor, BatchNorm };
struct ApplyArgs {
  const void* x;
  const float* scale;
  const float* shift;
  Residual residual = Residual::None;
  const void* res = nullptr;          // the residual tensor, or the second BN's input
  const float* res_scale = nullptr;   // second BN only
  const float* res_shift = nullptr;
  bool relu = true;
  void* y;
  // With relu: where the ReLU passed, one byte per 16-byte vector of y (bit j: its element j > 0 as
  // stored), relu_bits_bytes(s, t) in all; backward reads it (ReluMask::FromBits) instead of y,
  // 1/16 of the bytes in fp16. nullptr: not written.
  uint8_t* relu_bits = nullptr;
};
void bn_apply(const ApplyArgs& a, Shape4 s, DType t, Layout l, cudaStream_t stream);
size_t relu_bits_bytes(Shape4 s, DType t);

// Backward. dz = dy * (ReLU passed) when the BN was followed by a ReLU; gamma/beta gradients of bn
// (and of bn2, the projection shortcut's BN fed by the same dz) are written to dgamma/dbeta (fp32,
// overwritten), and the coefficients for apply are stored in bn.bwd_coef.
// When a residual was added before the ReLU, the mask comes from the stored forward output y, or
// from the bits the forward wrote beside it (ApplyArgs::relu_bits; the same mask, 1/16 of the bytes
// of y in fp16, read in each of the two backward passes); without a residual it is recomputed from
// x with bn's scale/shift exactly as the forward rounded it (bit for bit the mask of y, one tensor
// read less in each backward pass). scale/shift must then still be the ones of this BN's training
// forward (an evaluation pass overwrites them).
enum class ReluMask { None, FromOutput, FromInput, FromBits };
struct BnBackwardArgs {
  const void* dy;
  // A second part of dy, or nullptr: a block's input gradient arrives from its shortcut and from
  // its main path (model/training_network.h). The two are summed as they are read, and dy's buffer
  // then holds dz (the masked sum): dy is overwritten, and dres, where given, must be dy.
  const void* dy2 = nullptr;
  ReluMask relu = ReluMask::None;
  const void* y = nullptr;        // the forward output, for ReluMask::FromOutput
  const uint8_t* relu_bits = nullptr;  // the forward's ReLU bits, for ReluMask::FromBits
  const void* x;                  // the BN input
  const BnChannelState* bn;
  float* dgamma;
  float* dbeta;
  const void* x2 = nullptr;       // second BN (projection shortcut) or nullptr
  const BnChannelState* bn2 = nullptr;
  float* dgamma2 = nullptr;
  float* dbeta2 = nullptr;
  void* dx;                       // gradient wrt x (may alias dy)
  void* dx2 = nullptr;            // gradient wrt x2
  void* dres = nullptr;           // identity shortcut: receives dz (may alias dy)
};
void bn_backward(const BnBackwardArgs& a, Shape4 s, DType t, Layout l, float* scratch,
                 cudaStream_t stream);
// The same backward from the sums a conv of ours took as it wrote dz (kernels/conv1x1_dgrad_join.h,
// kernels/conv1x1_dgrad_bn.h): partials[(k * rows + r) * s.c + c] for k = 0, 1, 2: dz, dz * xhat and,
// with a second BN, dz * xhat2; rows of each added in a fixed order (deterministic). a.dy holds dz
// (masked; at a join both parts summed); a.relu must be None, a.dy2 and a.dres unset (at a join dz
// is already the identity shortcut's gradient).
void bn_backward_from_sums(const BnBackwardArgs& a, const float* partials, int rows, Shape4 s, DType t, Layout l,
                           cudaStream_t stream);
// The finalize alone of bn_backward_from_sums: the weight gradients and the apply's coefficients
// (a.bn->bwd_coef: dx = coef[c] dz + coef[C + c] x + coef[2C + c]) written, for a kernel that
// applies them as it reads dz (the stem's weight gradient, kernels/stem_conv.h). dx is not written.
void bn_backward_finalize(const BnBackwardArgs& a, const float* partials, int rows, Shape4 s, cudaStream_t stream);
// The apply alone, where a conv of ours also finalized its sums (kernels/conv1x1_finalize.h): the
// coefficients in a.bn->bwd_coef (and a.bn2's) and the weight gradients already written. a as for
// bn_backward_from_sums; dgamma/dbeta are not touched.
void bn_backward_apply(const BnBackwardArgs& a, Shape4 s, DType t, Layout l, cudaStream_t stream);
