// The pieces ResNet50 is made of, shared by src/model/resnet50.cpp (the network, unfused) and
// src/model/resnet50_fused.cpp (the same blocks with batch norm fused into the convolutions).
// Internal to the model: nothing outside src/model/ includes it.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "model/fused_conv.h"
#include "model/gemm_conv.h"
#include "model/resnet50.h"

struct ResNet50::Bn {
  std::string name;
  int channels = 0;
  int gamma = -1, beta = -1;
  size_t running_off = 0, state_off = 0;
  BnChannelState st{};
  // Fused builds: the statistics the conv that writes this BN's input produces (fp32 sum, sum of
  // squares), and scale/shift in fp16 for patterns whose engines take them so.
  float* sum = nullptr;
  float* sqsum = nullptr;
  void* scale_h = nullptr;
  void* shift_h = nullptr;
  bool wants_half = false;  // a fused pattern reads scale_h/shift_h: refresh them with scale/shift
};

struct ResNet50::ConvUnit {
  std::unique_ptr<ConvLayer> conv;
  int weight = -1;
  std::string name;  // "layer1.0.conv2"
  // Fused builds: the patterns this conv runs, where cuDNN accepted them (model/fused_conv.h).
  // One object serves every conv of the same shape and pattern.
  std::shared_ptr<FusedConv> fused_fwd, fused_wgrad, fused_dgrad;
  // Fused inference: a 1x1 conv that runs as one cuBLASLt GEMM instead (model/gemm_conv.h), shared
  // like the patterns, reading its filter with the BN's scale folded in from gemm_filter.
  std::shared_ptr<GemmConv> gemm;
  void* gemm_filter = nullptr;
};

struct ResNet50::Block {
  ConvUnit c1, c2, c3;
  std::optional<ConvUnit> down;
  Bn b1, b2, b3;
  std::optional<Bn> bdown;
  Shape4 in, mid1, mid2, out;
  // What backward needs: conv outputs (BN inputs) and BN+ReLU outputs (the next conv's input), and
  // relu_bits, where the join's ReLU (after the add) passed: its backward reads these bits, not
  // out_buf (1/16 of the bytes). Fused builds never store y1 and y2 unless a pattern the block
  // needs was refused.
  DeviceBuffer a1, y1, a2, y2, a3, ad, out_buf, relu_bits;
};
