// ResNet-50 (CIFAR stem) as data: layer names, geometry and parameter shapes, without a GPU.
#include "model/resnet50_spec.h"

namespace {
constexpr int kStageWidths[4] = {64, 128, 256, 512};
constexpr int kStageBlocks[4] = {3, 4, 6, 3};
constexpr int kExpansion = 4;
constexpr int kStemChannels = 64;
}  // namespace

NetSpec resnet50_spec(const NetConfig& cfg) {
  const int N = cfg.batch, S = cfg.image_side;
  NetSpec n;
  n.stem = {"conv1", {N, 3, S, S, kStemChannels, 3, 1, 1}};
  n.stem_bn = {"bn1", kStemChannels};
  int in_c = kStemChannels, side = S;
  for (int s = 0; s < 4; ++s) {
    for (int i = 0; i < kStageBlocks[s]; ++i) {
      const int stride = (s > 0 && i == 0) ? 2 : 1, w = kStageWidths[s], out_c = w * kExpansion;
      const std::string p = "layer" + std::to_string(s + 1) + "." + std::to_string(i) + ".";
      BlockSpec b;
      b.c2 = {p + "conv2", {N, w, side, side, w, 3, stride, 1}};
      // The side the stride-2 conv gives, ceil(side / 2) (28 -> 14 -> 7 -> 4): its pad-1 3x3 windows
      // and the shortcut's pad-0 1x1 windows both start at every other pixel, so the two agree.
      const int out_side = b.c2.g.out_h();
      b.in = {N, in_c, side, side};
      b.mid1 = {N, w, side, side};
      b.mid2 = {N, w, out_side, out_side};
      b.out = {N, out_c, out_side, out_side};
      b.c1 = {p + "conv1", {N, in_c, side, side, w, 1, 1, 0}};
      b.b1 = {p + "bn1", w};
      b.b2 = {p + "bn2", w};
      b.c3 = {p + "conv3", {N, w, out_side, out_side, out_c, 1, 1, 0}};
      b.b3 = {p + "bn3", out_c};
      if (stride != 1 || in_c != out_c) {
        b.down = ConvSpec{p + "downsample.0", {N, in_c, side, side, out_c, 1, stride, 0}};
        b.bdown = BnSpec{p + "downsample.1", out_c};
      }
      n.blocks.push_back(std::move(b));
      in_c = out_c;
      side = out_side;
    }
  }
  n.features = in_c;
  n.classes = cfg.classes;
  return n;
}

ParamListing resnet50_params(const NetConfig& cfg) {
  const NetSpec n = resnet50_spec(cfg);
  ParamListing l;
  auto add = [&](std::string name, ParamKind kind, std::vector<int> shape) {
    size_t count = 1;
    for (int d : shape) count *= static_cast<size_t>(d);
    l.total += count;
    l.tensors.push_back({std::move(name), kind, std::move(shape)});
  };
  auto conv = [&](const ConvSpec& c) { add(c.name + ".weight", ParamKind::ConvWeight, {c.g.k, c.g.c, c.g.r, c.g.r}); };
  auto bn = [&](const BnSpec& b) {
    add(b.name + ".weight", ParamKind::BnGamma, {b.channels});
    add(b.name + ".bias", ParamKind::BnBeta, {b.channels});
    l.running += 2 * size_t(b.channels);
  };
  conv(n.stem);
  bn(n.stem_bn);
  for (const BlockSpec& b : n.blocks)
    for_each_layer(b, conv, [&](const BnSpec& s) {
      if (&s == &b.b3) l.block_last_gammas.push_back(static_cast<int>(l.tensors.size()));  // the gamma bn() adds next
      bn(s);
    });
  add("fc.weight", ParamKind::LinearWeight, {n.classes, n.features});
  add("fc.bias", ParamKind::LinearBias, {n.classes});
  return l;
}
