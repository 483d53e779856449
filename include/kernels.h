// Launchers of the hand-written kernels (kernels/*.cu), one section per kernel family.
//
// Activations are passed as void* with their DType and Layout (from the tensor descriptors), so the
// same launchers serve every variant of the ladder and the tests can run any combination in one
// binary. Every launcher checks its launch and returns immediately (stream-ordered).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "core/types.h"

// ---- batch norm (kernels/batchnorm.cu) ------------------------------------------------------------
// Training-mode batch norm is split as: statistics (partial sums per chunk of rows), a per-channel
// finalize (deterministic, fixed summation order), then an elementwise apply that fuses the affine
// transform with the residual add and ReLU. Backward mirrors it: reduce, finalize, apply.
constexpr float kBnEps = 1e-5f;
constexpr float kBnMomentum = 0.1f;  // running = (1 - m) * running + m * batch (PyTorch's convention)

struct BnChannelState {     // per-channel fp32 vectors of one BN layer, each of length C
  const float* gamma;
  const float* beta;
  float* running_mean;
  float* running_var;
  float* save_mean;         // batch mean (training) for backward
  float* save_invstd;       // 1/sqrt(var + eps)
  float* scale;             // gamma * invstd     (what apply multiplies by)
  float* shift;             // beta - mean * scale
  float* bwd_coef;          // 3*C: dx = k_dz * dz + k_x * x + k_c
};

// Scratch for the partial sums: at least bn_scratch_floats(shape) floats.
size_t bn_scratch_floats(Shape4 s, DType t, Layout l);

// Statistics of x, then mean/invstd/scale/shift and the running statistics.
void bn_forward_train_stats(const void* x, Shape4 s, DType t, Layout l, const BnChannelState& bn,
                            float* scratch, cudaStream_t stream);
// The same from per-channel sums of x and x^2 over `per_channel` values each, as a fused conv
// produces them (model/fused_conv.h); also writes scale and shift in fp16 to scale_h/shift_h unless
// they are null. Leaves the sums zero: a step replayed as a CUDA graph then needs none of the
// memsets with which cuDNN zeroes them before each conv (core/graph_memsets.h).
void bn_finalize_sums(float* sum, float* sqsum, size_t per_channel, const BnChannelState& bn, int channels,
                      void* scale_h, void* shift_h, cudaStream_t stream);
// Evaluation: scale/shift from the running statistics.
void bn_forward_eval_coefs(const BnChannelState& bn, int channels, cudaStream_t stream);
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

// ---- pooling (kernels/pooling.cu) ----------------------------------------------------------------
// Global average pool: x [N,C,H,W] in layout -> y [N,C] row-major, both of type t.
void global_avgpool_forward(const void* x, Shape4 s, DType t, Layout l, void* y, cudaStream_t stream);
void global_avgpool_backward(const void* dy, Shape4 s, DType t, Layout l, void* dx, cudaStream_t stream);

// ---- loss (kernels/loss.cu) ----------------------------------------------------------------------
// Running totals kept on the GPU (on-device loss accumulation reads them rarely).
struct LossTotals {
  double loss_sum;
  unsigned long long correct;
  unsigned long long count;
  float last_loss;           // mean loss of the latest batch
  float last_good_loss;      // the latest finite one
  long long first_bad_step;  // first step whose loss was NaN/Inf, -1 if none
};

// Softmax cross-entropy, mean over the valid samples (label >= 0), in one single-block kernel:
// adds the bias to logits in place, accumulates loss/accuracy into totals and, when dlogits is not
// null, writes dlogits = (softmax - onehot) * loss_scale / valid and dbias (fp32, overwritten).
// loss_scale and step (the step index a non-finite loss is recorded as the first bad step) are read
// from device memory, so that a step replayed as a CUDA graph uses its own; nullptr: a scale of 1,
// and no step recorded (evaluation). At most kSoftmaxMaxClasses classes.
constexpr int kSoftmaxMaxClasses = 16;
void softmax_xent(float* logits, const float* bias, const int32_t* labels, int n, int classes,
                  void* dlogits, DType dlogits_type, float* dbias, const float* loss_scale,
                  LossTotals* totals, const long long* step, cudaStream_t stream);
// history[*slot] = totals->last_loss: keeps each step's loss for --loss-log without a sync, at a
// slot read from device memory (a replayed graph writes where its own step belongs).
void record_loss(const LossTotals* totals, const int* slot, float* history, cudaStream_t stream);

// ---- optimizer (kernels/optimizer.cu) ------------------------------------------------------------
// Dynamic loss scaling decided on the GPU: no host sync, an overflow skips the step.
struct ScalerState {
  float scale;              // the loss is multiplied by this before backward
  int good_steps;           // finite steps since the last change
  int found_inf;            // set by the gradient check of this step
  int skipped_steps;        // total skipped
  int diverged;             // fp32: a non-finite step stops training; fp16: scale collapsed
};

struct SgdArgs {
  float* w;                 // fp32 master weights, n
  float* momentum;          // n
  const void* grad_act;     // grads of the first n_act params (conv/linear weights), type act
  const float* grad_f32;    // grads of the remaining n - n_act params (BN, bias)
  void* w_act;              // fp16 copy of the first n_act weights, or nullptr
  size_t n, n_act;
  DType act;
  const float* lr;          // device memory: the step's learning rate (a replayed graph reads each step's)
  float mom, weight_decay;  // decay applies to the first n_act params only
  bool nesterov;
};
// Sets state->found_inf when any gradient is NaN/Inf.
void check_grads_finite(const SgdArgs& a, ScalerState* state, cudaStream_t stream);
// Unscales and applies Nesterov SGD unless found_inf; writes the fp16 copy.
void sgd_update(const SgdArgs& a, const ScalerState* state, cudaStream_t stream);
// Applies the scaling rule (loss_scale.h) and clears found_inf for the next step.
void loss_scale_update(ScalerState* state, bool dynamic, int window, cudaStream_t stream);

// ---- input normalization (kernels/normalize.cu) --------------------------------------------------
// uint8 batch [N, in_channels, side, side] in layout -> (x/255 - mean)/std as type t with 3
// channels; grey input is replicated to all three.
struct NormalizeParams {
  float scale[3];   // 1 / (255 * std)
  float shift[3];   // -mean / std
};
void normalize_u8(const uint8_t* in, int n, int in_channels, int side, Layout l, const NormalizeParams& p,
                  void* out, DType t, cudaStream_t stream);

// ---- casts (kernels/cast.cu) ---------------------------------------------------------------------
void cast_f32_to_f16(const float* in, void* out, size_t n, cudaStream_t stream);
void cast_f16_to_f32(const void* in, float* out, size_t n, cudaStream_t stream);

// ---- memsets as a kernel (kernels/fill.cu) -------------------------------------------------------
// What up to kFillRegions memset nodes of a CUDA graph do, as one kernel node (core/graph_memsets.h):
// each region as cudaMemset2D fills it (value truncated to element_size bytes; height rows of width
// elements, pitch bytes apart), in order.
constexpr int kFillRegions = 8;
struct FillRegion {
  void* dst;
  size_t pitch;         // bytes between rows (unused when height is 1)
  size_t width;         // elements a row
  size_t height;        // rows
  unsigned value;
  unsigned element_size;  // 1, 2 or 4 bytes
};
struct FillRegions {
  FillRegion region[kFillRegions];
  int count = 0;
};
// A kernel node's parameters that fill f; args is the one argument pointer's storage and, with f,
// must outlive the call that creates or updates the node (which copies the argument).
cudaKernelNodeParams fill_regions_node(const FillRegions& f, void* args[1]);
void fill_regions(const FillRegions& f, cudaStream_t stream);
