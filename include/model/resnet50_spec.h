// ResNet-50's architecture as data, computed on the CPU from a NetConfig: every layer that has
// parameters, with its name and shape, in the order the network registers them. Both networks build
// their layers from this description (build_layers), and the trainer computes a checkpoint's model signature
// from it before any GPU is touched, so the two cannot drift apart.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "model/params.h"
#include "model/network.h"

struct ConvSpec {
  std::string name;   // "layer1.0.conv1": its weight is name + ".weight"
  ConvGeometry g;
};
struct BnSpec {
  std::string name;   // "layer1.0.bn1": gamma name + ".weight", beta name + ".bias"
  int channels = 0;
};
// A bottleneck block: 1x1 conv, 3x3 conv (the stride), 1x1 conv, each with its BN, and the projection
// shortcut where the shape changes. Of specs here, of built layers in src/model/resnet50_layers.h.
template <class Conv, class Norm>
struct Bottleneck {
  Conv c1, c2, c3;
  Norm b1, b2, b3;
  std::optional<Conv> down;
  std::optional<Norm> bdown;
  Shape4 in, mid1, mid2, out;
};
struct BlockSpec : Bottleneck<ConvSpec, BnSpec> {};

// Calls conv() and bn() on a block's layers in the order they are registered: c1, b1, c2, b2, c3,
// b3, then the shortcut's down and bdown.
template <class B, class ConvFn, class BnFn>
void for_each_layer(B& b, ConvFn&& conv, BnFn&& bn) {
  conv(b.c1);
  bn(b.b1);
  conv(b.c2);
  bn(b.b2);
  conv(b.c3);
  bn(b.b3);
  if (b.down) {
    conv(*b.down);
    bn(*b.bdown);
  }
}
struct NetSpec {
  ConvSpec stem;
  BnSpec stem_bn;
  std::vector<BlockSpec> blocks;
  int features = 0;   // the pooled features the classifier takes
  int classes = 0;
};

NetSpec resnet50_spec(const NetConfig& cfg);

// One parameter tensor: its name, kind and shape (PyTorch order: conv K, C, R, S).
struct ParamSpec {
  std::string name;
  ParamKind kind;
  std::vector<int> shape;
};
// Every parameter of the network in registration order (the networks register these, in this
// order: build_layers()), and the count of BN running statistics (mean and variance of every BN).
struct ParamListing {
  std::vector<ParamSpec> tensors;
  size_t total = 0;     // parameter values in all
  size_t running = 0;
  // Index in `tensors` (its parameter id) of each block's last BN gamma, the b3 before the residual
  // add, in block order: the gammas --zero-init-residual starts at 0.
  std::vector<int> block_last_gammas;
};
ParamListing resnet50_params(const NetConfig& cfg);
