// Batch norm fused into convolutions through cuDNN's graph API: the patterns NVIDIA's MLPerf
// ResNet-50 is built from, one object per pattern and conv geometry.
//
//   ConvStats       y = conv(x);                   sum, sqsum = per-channel statistics of y
//   SbrConvStats    y = conv(relu(x * s + b));     sum, sqsum of y   (the previous BN applied on read)
//   SbrWgrad        dw = wgrad(dy, relu(x * s + b))                   (the BN output never stored)
//   DgradDreluDbn   g = dgrad(dy, w) * (bn(x) > 0); dgamma, dbeta and the coefficients of
//                   dx = eq_dy * g + eq_x * x + eq_b                   (ReLU and BN backward on write)
//
// and, for inference (bin/predict), where a BN's coefficients come from its running statistics and
// so are known before the conv runs, the BN applied in the conv's epilogue:
//   ConvBn          y = conv(x) * s + b                 (the projection shortcut)
//   ConvBnRelu      y = relu(conv(x) * s + b)
//   ConvBnAddRelu   y = relu(conv(x) * s + b + z)       (the residual join, z the shortcut)
//
// cuDNN decides at run time which of these it can run for a shape, type and GPU; a pattern it
// refuses is reported by ok()/why() and never throws, so the network falls back layer by layer to
// the plain convolution and our own batch-norm kernels (kernels/batchnorm.h). Finalizing the
// statistics and applying dx are our kernels too (bn_finalize_sums and bn_apply, kernels/batchnorm.h):
// they are per-channel or elementwise and cost one pass at most.
#pragma once

#include <memory>
#include <string>

#include <cudnn.h>

#include "model/autotune_cache.h"
#include "model/conv.h"
#include "model/fused_patterns.h"

struct PlannedGraph;

// The autotune cache's key of a pattern's plan for a conv shape ("fused.conv-bn-relu.n256.c64...").
std::string fused_cache_key(FusedPattern p, const ConvGeometry& g);
// Patterns that read a per-channel scale and bias: the prologue's (training) or the epilogue's (inference).
bool has_scale_bias(FusedPattern p);

struct FusedOptions {
  DType io = DType::F16;      // activations and filters
  Layout layout = Layout::NHWC;
  bool deterministic = false; // refuse engines cuDNN marks non-deterministic
  size_t workspace_limit = size_t(1) << 30;
  bool measure = false;       // time every engine configuration the rules allow and keep the fastest
};

// The pointers of one call, by role; a pattern reads the ones it has (see the table above).
struct FusedArgs {
  const void* x = nullptr;       // conv input (forward, wgrad) or the BN input (dgrad: the x of bn(x))
  const void* w = nullptr;       // filter
  void* y = nullptr;             // conv output (forward)
  const void* dy = nullptr;      // gradient of the conv output (wgrad, dgrad)
  void* dw = nullptr;            // filter gradient (wgrad)
  const void* scale = nullptr;   // per-channel s, b of the prologue or the epilogue, in scale_type()
  const void* bias = nullptr;
  const void* z = nullptr;       // ConvBnAddRelu: the residual added before the ReLU (io type, y's shape)
  float* sum = nullptr;          // per-channel statistics of y (forward), fp32
  float* sqsum = nullptr;
  const float* mean = nullptr;   // dgrad: the BN's batch mean, 1/std, gamma, beta
  const float* invstd = nullptr;
  const float* gamma = nullptr;
  const float* beta = nullptr;
  void* g = nullptr;             // dgrad: the gradient after the ReLU, written (io type)
  float* dgamma = nullptr;       // dgrad: gamma and beta gradients, fp32, overwritten
  float* dbeta = nullptr;
  float* eq_dy = nullptr;        // dgrad: dx = eq_dy * g + eq_x * x + eq_b, fp32 per channel
  float* eq_x = nullptr;
  float* eq_b = nullptr;
};

// What the fusion planner reads of a pattern's plan for a conv shape, cuDNN's (FusedConv) or a
// cuBLASLt GEMM's (GemmConv, model/gemm_conv.h).
class FusedPlan {
 public:
  FusedPlan(const FusedPlan&) = delete;
  FusedPlan& operator=(const FusedPlan&) = delete;

  FusedPattern pattern() const { return pattern_; }
  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }  // why it does not run
  size_t workspace() const { return choice_.workspace; }
  float ms() const { return choice_.ms; }  // measured time of one run; -1 when not measured
  const FusedChoice& choice() const { return choice_; }  // what the autotune cache keeps (measured, ok())
  bool from_cache() const { return from_cache_; }

 protected:
  FusedPlan(FusedPattern p, const ConvGeometry& g) : pattern_(p), g_(g) {}
  ~FusedPlan() = default;
  FusedPattern pattern_;
  ConvGeometry g_;
  bool ok_ = false, from_cache_ = false;
  std::string why_;
  FusedChoice choice_;
};

class FusedConv : public FusedPlan {
 public:
  // Builds the pattern for `g` and its execution plan (model/cudnn/plan_picker.h); on refusal ok()
  // is false. A `cached` plan (an earlier run's choice()) is rebuilt alone, without timing the
  // others; one that no longer builds here is picked again.
  FusedConv(cudnnHandle_t h, FusedPattern p, const ConvGeometry& g, const FusedOptions& o,
            const FusedChoice* cached = nullptr);

  DType scale_type() const { return scale_type_; }  // of the prologue's or epilogue's s and b
  bool runtime_compiled() const;
  void run(cudnnHandle_t h, const FusedArgs& a, void* ws, size_t ws_bytes) const;

 private:
  // One scale/intermediate type pair (index `types` of the tries): picked, or the cached engine alone.
  bool try_types(cudnnHandle_t h, int types, const FusedChoice* cached);
  FusedOptions o_;
  std::shared_ptr<const PlannedGraph> plan_;
  DType scale_type_ = DType::F32;
};
