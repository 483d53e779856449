// ResNet-50's layers as both networks hold them: conv units, BN layers and bottleneck blocks, built
// from the shared description (model/resnet50_spec.h) and registered in its order. Private to the
// model: how each network runs them is in training_network.cpp (with training_forward.cpp and
// training_backward.cpp) and inference_network.cpp.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kernels/batchnorm.h"
#include "model/conv.h"
#include "model/fused_conv.h"
#include "model/params.h"
#include "model/resnet50_spec.h"

struct NetConfig;

struct Bn {
  std::string name;
  int channels = 0;
  int gamma = -1, beta = -1;     // parameter ids
  size_t running_off = 0, state_off = 0;
  BnChannelState st{};           // set once the buffers exist (the Network constructor)
  // Fused: the fp16 copies of scale and shift where a pattern's engine reads them so (else null),
  // and, training, the per-channel sum and sum of squares its conv accumulates (fp32).
  void* scale_h = nullptr;
  void* shift_h = nullptr;
  float* sum = nullptr;
  float* sqsum = nullptr;
  // Sets a's scale and bias to this BN's coefficients in the type f's engine reads.
  void set_coefficients(FusedArgs& a, const FusedConv& f) const {
    const bool half = f.scale_type() == DType::F16;
    a.scale = half ? scale_h : st.scale;
    a.bias = half ? shift_h : st.shift;
  }
};

struct ConvUnit {
  std::unique_ptr<ConvLayer> conv;
  int weight = -1;               // parameter id
  std::string name;              // "layer1.0.conv2"
  const ConvGeometry& geometry() const { return conv->geometry(); }
};

struct Block : Bottleneck<ConvUnit, Bn> {};

struct ResNetLayers {
  ConvUnit stem;
  Bn stem_bn;
  Shape4 stem_out;
  std::vector<Block> blocks;
  int fc_weight = -1, fc_bias = -1;
  int features = 0;
  size_t running_count = 0;      // floats of the BN running statistics (mean, var of each BN)
  size_t state_floats = 0;       // floats of the BN per-channel state

  std::vector<Bn*> bns();        // the stem's, then each block's (b1, b2, b3, bdown): running_stats() order
  std::vector<ConvUnit*> convs();  // the stem's, then each block's (c1, c2, c3, down)
};

// The layers of `cfg`'s network, their parameters registered in `params`.
ResNetLayers build_layers(const NetConfig& cfg, ParamStore& params);
