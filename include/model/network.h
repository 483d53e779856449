// ResNet-50 with the CIFAR stem (../shared/anchors.md): 3x3 conv 3->64 + BN + ReLU, no max-pool,
// bottleneck stages [3, 4, 6, 3] of widths 64/128/256/512 (x4 expansion), stride 2 on the 3x3 conv
// of the first block of stages 2-4, projection shortcut (1x1 conv + BN) where the shape changes,
// global average pool, linear 2048 -> classes (23,520,842 parameters with 10). Any image side from 8
// (32 for CIFAR-10; the global pool makes the parameters independent of it): each stride-2 stage runs
// at ceil(side / 2) of the one before (28: 28, 14, 7, 4). The NCHW builds take only the sides whose
// every stage suits their batch-norm kernels (kernels/batchnorm.h; the constructor says which).
//
// Two networks share this description: the training network (model/training_network.h), which
// also runs the evaluation forward, and the inference network of bin/predict
// (model/inference_network.h), which keeps no training state. What both hold is here: the layers
// (built from model/resnet50_spec.h), the parameters, the BN running statistics, the conv layers
// with their chosen algorithms, the cuDNN workspace and the classifier's buffers. Precision and
// layout come from NetConfig and reach the layers as descriptors; nothing here reads the build
// settings.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/handles.h"
#include "core/memory.h"
#include "model/conv.h"
#include "model/fused_patterns.h"
#include "model/params.h"

struct NetConfig {
  int batch = 128;
  DType dtype = DType::F32;
  Layout layout = Layout::NCHW;
  bool tf32 = true;
  ConvPolicy conv;
  ConvApi conv_api = ConvApi::Legacy;
  int classes = 10;
  int image_side = 32;  // at least 8: the stages run at side and three times ceil(half) of it (resnet50_spec.h)
  // Batch norm fused into the convolutions where cuDNN accepts the patterns (model/fused_conv.h; how
  // each network fuses: model/training_network.h, model/inference_network.h).
  bool fused_bn = false;
  // Patterns that run plain even where cuDNN takes them (fused_pattern_bit; --no-fuse), to measure
  // what each kind of pattern buys.
  unsigned unfused_patterns = 0;
  bool unfused_by_default = false;  // unfused_patterns is the build's default, not --no-fuse's
  // Training: each conv's weight gradient runs on a second stream beside its data gradient (both
  // read the same output gradient and write different buffers), with its own cuDNN workspace.
  bool wgrad_beside = false;
  // Training on several GPUs: each weight's gradient is reported as soon as it is written
  // (TrainingNetwork::on_grad_ready), so the weight gradients' lane is joined after each conv and
  // never runs behind (FusedPattern::LaggingWgrad, one GPU only).
  bool data_parallel = false;
  // Measured on the H100 (cuDNN 9.14): two runs of the fused build differ in their first loss even
  // with engines cuDNN does not mark non-deterministic, so --deterministic keeps every conv unfused.
  bool fuses() const { return fused_bn && !conv.deterministic; }
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
  size_t fused_workspace = 0; // bytes of the fused patterns' own workspaces, one for each conv (0: none fused)
};

// The layers themselves (src/model/resnet50_layers.h, private to the model).
struct ResNetLayers;
struct ConvUnit;

class Network {
 public:
  virtual ~Network();
  Network(const Network&) = delete;
  Network& operator=(const Network&) = delete;

  const NetConfig& config() const { return cfg_; }
  ParamStore& params() { return params_; }
  const ParamStore& params() const { return params_; }
  const AlgoReport& algo_report() const { return algo_report_; }
  // Which patterns cuDNN (or cuBLASLt) took; nothing tried where the build does not fuse.
  const FusionReport& fusion_report() const { return fusion_report_; }
  // The parameters and BN layers of the network with `classes` outputs (the same names, shapes and
  // order the constructor registers; a GPU test holds the two together).
  static TensorLayout tensor_layout(int classes);

  // Throws Fatal where the network cannot run at cfg.image_side in cfg's precision and layout: below
  // 8, or (NCHW) a stage whose H*W its batch-norm kernels cannot take, naming it. No GPU needed; the
  // constructor checks it first.
  static void check_image_side(const NetConfig& cfg);
  // A fresh start: the parameters initial_params(config(), seed, zero_init_residual) computes,
  // momentum 0, BN running means 0 and variances 1.
  void init_params(uint64_t seed, bool zero_init_residual = false);
  // The parameters of `cfg`'s network at a fresh start, in the flat layout its ParamStore assigns,
  // computed on the CPU: Kaiming-normal (fan_out) convs, BN gamma 1 / beta 0, linear as PyTorch's
  // default. zero_init_residual (--zero-init-residual; torchvision's zero_init_residual, Goyal et al.
  // 2017): each block's last BN gamma 0, so that every block starts as its shortcut.
  static std::vector<float> initial_params(const NetConfig& cfg, uint64_t seed, bool zero_init_residual);

  // BN running statistics: [mean, var] of every BN in order, fp32 (for checkpoints).
  float* running_stats() const { return running_.as<float>(); }
  size_t running_stats_count() const { return running_.bytes() / sizeof(float); }
  std::vector<std::string> running_stats_names() const;

  float* logits() const { return logits_.as<float>(); }  // batch x classes, fp32, without the fc bias
  // The global-average-pooled features the classifier reads: batch x feature_count(), in the
  // activation type.
  const void* features() const { return feat_.get(); }
  int feature_count() const;
  size_t activation_bytes() const { return activation_bytes_; }

 protected:
  // Registers the layers' parameters and allocates them (with momentum and gradients when
  // `training`) and the BN state; then configures every conv through `cache`.
  Network(const NetConfig& cfg, GpuContext& ctx, AutotuneCache& cache, bool training);
  // Throws the one clear message of a batch too large for the GPU, before anything large is allocated.
  void check_memory(size_t need, const std::string& what = "activations and gradients") const;
  // The pooled features and the logits of the last block's output.
  void classify(const void* last_out);
  void conv_forward(const ConvUnit& c, const void* x, void* y);

  NetConfig cfg_;
  GpuContext& ctx_;
  ParamStore params_;
  std::unique_ptr<ResNetLayers> layers_;
  AlgoReport algo_report_;
  FusionReport fusion_report_;
  DeviceBuffer workspace_;  // cuDNN's and cuBLASLt's, sized for every plan chosen
  DeviceBuffer running_, bn_state_;
  DeviceBuffer feat_, logits_;
  size_t activation_bytes_ = 0;
  size_t conv_workspace_ = 0;  // the most any plain conv's chosen algorithms need
};
