// ResNet-50 with the CIFAR stem (../shared/anchors.md): 3x3 conv 3->64 + BN + ReLU, no max-pool,
// bottleneck stages [3, 4, 6, 3] of widths 64/128/256/512 (x4 expansion), stride 2 on the 3x3 conv
// of the first block of stages 2-4, projection shortcut (1x1 conv + BN) where the shape changes,
// global average pool, linear 2048 -> classes (23,520,842 parameters with 10). Any image side that is
// a multiple of 8 (32 for CIFAR-10; the global pool makes the parameters independent of it).
//
// The network owns its activations (what backward needs), four gradient buffers it rotates through
// (training only), the cuDNN workspace (a second one for the weight gradients' stream) and the
// parameters. Precision and layout come from NetConfig and reach the layers as descriptors; nothing
// here reads the build settings.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "model/conv.h"
#include "model/fused_conv.h"
#include "core/graph_memsets.h"
#include "core/handles.h"
#include "kernels/batchnorm.h"
#include "kernels/loss.h"
#include "core/memory.h"
#include "model/params.h"

struct NetConfig {
  int batch = 128;
  DType dtype = DType::F32;
  Layout layout = Layout::NCHW;
  bool tf32 = true;
  ConvPolicy conv;
  ConvApi conv_api = ConvApi::Legacy;
  int classes = 10;
  int image_side = 32;  // a multiple of 8: the stages run at side, side/2, side/4, side/8
  // Batch norm fused into the convolutions where cuDNN accepts the patterns (model/fused_conv.h):
  // statistics from the conv that writes a tensor, scale/bias + ReLU applied as the next conv reads it;
  // with `inference`, each BN (running statistics), the residual add and the ReLU in the epilogue of
  // the conv before it.
  bool fused_bn = false;
  // Patterns that run plain even where cuDNN takes them (fused_pattern_bit; --no-fuse), to measure
  // what each kind of pattern buys.
  unsigned unfused_patterns = 0;
  // Forward with running statistics only (bin/predict): no gradient, momentum or backward buffers
  // are allocated, and training calls (forward(x, true), a loss with gradients, backward) throw.
  bool inference = false;
  // Training: each conv's weight gradient runs on a second stream beside its data gradient (both
  // read the same output gradient and write different buffers), with its own cuDNN workspace.
  bool wgrad_beside = false;
};

// The network's tensors as its flat buffers hold them, known without building it (no GPU): what
// converting and exporting a checkpoint read.
struct TensorLayout {
  std::vector<ParamTensor> params;               // registration order, offsets as ParamStore assigns them
  std::vector<std::pair<std::string, int>> bns;  // BN name and channels, in running_stats() order
};

// What choosing conv algorithms did, for the start-up report.
struct AlgoReport {
  int shapes = 0;             // distinct conv shapes
  int searched = 0;           // measured now
  double search_s = 0;
  size_t workspace = 0;       // bytes of the shared cuDNN workspace
  size_t lane_workspace = 0;  // bytes of the weight gradients' stream's own (0 without it)
};

class ResNet50 {
 public:
  // Builds the layers and allocates everything; chooses conv algorithms through `cache` (which may
  // be an empty in-memory cache: repeated shapes are then chosen once).
  ResNet50(const NetConfig& cfg, GpuContext& ctx, AutotuneCache& cache);
  ~ResNet50();

  const NetConfig& config() const { return cfg_; }
  ParamStore& params() { return params_; }
  const ParamStore& params() const { return params_; }
  const AlgoReport& algo_report() const { return algo_report_; }
  // Fused builds: which patterns cuDNN accepted (empty otherwise).
  const FusionReport& fusion_report() const { return fusion_report_; }
  // The parameters and BN layers of the network with `classes` outputs (the same names, shapes and
  // order the constructor registers; a GPU test holds the two together).
  static TensorLayout tensor_layout(int classes);

  // Kaiming-normal (fan_out) convs, BN gamma 1 / beta 0, linear as PyTorch's default.
  void init_params(uint64_t seed);
  // A deterministic pseudo-random init that a PyTorch script can reproduce (tests/parity).
  void init_params_for_parity(uint64_t seed);

  // BN running statistics: [mean, var] of every BN in order, fp32 (for checkpoints).
  float* running_stats() const { return running_.as<float>(); }
  size_t running_stats_count() const { return running_count_; }
  std::vector<std::string> running_stats_names() const;

  // images: batch x 3 x side x side in the configured type and layout. train=false uses running stats.
  void forward(const void* images, bool train);
  // Softmax cross-entropy on the logits; with loss_scale != nullptr also the gradients of the logits
  // and the bias (training). Accumulates into totals. loss_scale and step are device memory
  // (softmax_xent in kernels.h); step nullptr: no step index (evaluation).
  void loss(const int32_t* labels, LossTotals* totals, const float* loss_scale, const long long* step);
  void backward();
  // Called during backward once the work that writes a parameter's gradient is ordered on the main
  // stream (with wgrad_beside, after the lane's join; its id in params()), in the order they are
  // produced: data-parallel training starts averaging a bucket of gradients as soon as all of it is
  // there (dist/data_parallel.h). Unset: nothing.
  std::function<void(int param_id)> on_grad_ready;

  float* logits() const { return logits_.as<float>(); }  // batch x classes, fp32, without the fc bias
  // The global-average-pooled features the classifier reads: batch x feature_count(), in the
  // activation type.
  const void* features() const { return feat_.get(); }
  int feature_count() const { return features_; }
  size_t activation_bytes() const { return activation_bytes_; }
  // Fused training builds: the per-BN sums the fused convs accumulate into, which bn_finalize_sums
  // (and an evaluation forward) leave zero; a step's CUDA graph needs none of cuDNN's memsets into
  // them (core/graph_memsets.h). Empty otherwise.
  ZeroedRange statistics_kept_zero() const;

 private:
  struct Bn;
  struct ConvUnit;
  struct Block;
  void build();
  std::vector<Bn*> all_bns() const;
  void allocate();
  void choose_algorithms(AutotuneCache& cache);
  void for_each_conv(const std::function<void(ConvUnit&)>& f) const;  // the stem's, then each block's
  size_t wgrad_workspace_bytes() const;  // the most any chosen weight gradient (plain or fused) needs
  void block_forward(Block& b, const void* in, bool train);
  void block_backward(Block& b, const void* in);
  // A plain conv's backward: dw (beside, on the lane) and dx = dgrad(dy) (+= dx with `accumulate`).
  void conv_backward(ConvUnit& c, const void* x, const void* dy, void* dx, bool accumulate);
  // out = relu(bn3(a3) + shortcut), the shortcut bn_down(ad) or the block input; training also
  // writes the ReLU's bits for join_backward.
  void join_forward(Block& b, const void* in, bool train);
  void join_backward(Block& b);
  void conv_forward(ConvUnit& c, const void* x, void* y);
  void bn_forward(Bn& bn, const void* x, Shape4 s, bool train);
  void grad_ready(int param_id) const {
    if (on_grad_ready) on_grad_ready(param_id);
  }
  void bn_grads_ready(const Bn& bn) const;
  // Enqueues `work`, a weight gradient, on the lane (NetConfig::wgrad_beside) after everything on the
  // main stream so far, with cuDNN's handle pointed at the lane meanwhile; without a lane, on the main
  // stream. work(stream, workspace, bytes) gets the stream and workspace it must use. Then
  // lane_join() before anything writes what `work` reads, or reads what it writes.
  void wgrad_beside(const std::function<void(cudaStream_t, void*, size_t)>& work);
  void lane_join();
  // Batch norm fused into the convolutions (src/model/resnet50_fused.cpp). Measured on the H100
  // (cuDNN 9.14): two runs of the fused build differ in their first loss even with engines cuDNN
  // does not mark non-deterministic, so --deterministic keeps every conv unfused.
  bool fused() const { return cfg_.fused_bn && !cfg_.conv.deterministic; }
  bool fused_inference() const { return fused() && cfg_.inference; }
  size_t build_fusion(AutotuneCache& cache);
  void allocate_fused_state();
  void fused_block_forward(Block& b, const void* in, bool train);
  void fused_block_backward(Block& b, const void* in);
  void fused_conv_stats(ConvUnit& c, const void* x, void* y, Bn& bn, Shape4 s, bool train, const Bn* prologue,
                        void* y_prev, Shape4 s_prev);
  void fused_inner_backward(ConvUnit& c, const void* x, Bn& bn, void* y_in, Shape4 s_in, void* dy, void* dx);
  // Inference: y = relu?(bn(conv(x)) + z?), with the BN in the conv's epilogue where it was chosen.
  void inference_conv(ConvUnit& c, const void* x, void* y, Bn& bn, Shape4 s, bool relu, const void* z);
  void inference_block_forward(Block& b, const void* in);

  NetConfig cfg_;
  GpuContext& ctx_;
  ParamStore params_;
  AlgoReport algo_report_;
  FusionReport fusion_report_;

  std::unique_ptr<ConvUnit> stem_conv_;
  std::unique_ptr<Bn> stem_bn_;
  std::vector<std::unique_ptr<Block>> blocks_;
  int fc_weight_ = -1, fc_bias_ = -1;
  int features_ = 0;

  // buffers
  DeviceBuffer stem_a_, stem_y_;          // stem conv output, stem BN+ReLU output
  DeviceBuffer feat_, logits_, dlogits_, dfeat_;
  DeviceBuffer grad_[4];                  // activation gradients, each of the largest activation's size
  DeviceBuffer workspace_;
  struct WgradLane;
  std::unique_ptr<WgradLane> lane_;       // training with wgrad_beside: the weight gradients' stream
  DeviceBuffer running_, bn_state_, bn_scratch_;
  size_t running_count_ = 0, bn_state_floats_ = 0, bn_scratch_floats_ = 0;
  size_t activation_bytes_ = 0;
  DeviceBuffer fused_sums_, fused_half_;  // fused builds: per-BN sums (sum, sum of squares); fp16 scale/shift
  DeviceBuffer zeros_;                    // fused builds: a zero vector
  DeviceBuffer eval_targets_;             // fused inference: every BN, for one launch of their coefficients
  int eval_target_count_ = 0, widest_bn_ = 0;
  DeviceBuffer gemm_filters_, fold_targets_;  // fused inference: the GEMM convs' folded filters, what folds them
  int fold_count_ = 0;
  size_t largest_fold_ = 0;
  const void* images_ = nullptr;          // the batch of the last forward (backward's stem input)
};
