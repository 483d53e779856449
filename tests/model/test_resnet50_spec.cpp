// The CPU description of ResNet-50 (resnet50_spec.h): the parameter listing a resume is checked
// against before the GPU is touched. On the CPU: its count is the documented one and it follows
// NetConfig; its stages run at the sides the strided convs give, each conv's output the tensor the
// next layer reads, at sides that halve evenly and at those that do not (28, 12); the sides a build
// refuses (Network::check_image_side). On a GPU: it is exactly what the network registers (names,
// shapes, order, running stats).
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "core/errors.h"

#include "core/handles.h"
#include "model/autotune_cache.h"
#include "model/training_network.h"
#include "model/resnet50_spec.h"
#include "support/gpu_test_util.h"

namespace {

TEST(Resnet50Spec, ListsTheDocumentedParameterCount) {
  const ParamListing l = resnet50_params(NetConfig{});
  EXPECT_EQ(l.total, 23520842u) << "README: 23,520,842 parameters";
  // 53 BNs: stem, 16 blocks x 3, 4 projections; each keeps a mean and a variance per channel.
  size_t bn_channels = 0, bns = 0;
  for (const ParamSpec& p : l.tensors)
    if (p.kind == ParamKind::BnGamma) bn_channels += p.shape[0], ++bns;
  EXPECT_EQ(bns, 53u);
  EXPECT_EQ(l.running, 2 * bn_channels);
  EXPECT_EQ(l.tensors.front().name, "conv1.weight");
  EXPECT_EQ(l.tensors.front().shape, (std::vector<int>{64, 3, 3, 3}));
  EXPECT_EQ(l.tensors.back().name, "fc.bias");
  std::set<std::string> names;
  for (const ParamSpec& p : l.tensors) EXPECT_TRUE(names.insert(p.name).second) << "twice: " << p.name;
  EXPECT_TRUE(names.count("layer4.0.downsample.0.weight"));
}

TEST(Resnet50Spec, FollowsTheConfigsClassesButNotItsBatchOrPrecision) {
  NetConfig c;
  const ParamListing ten = resnet50_params(c);
  c.classes = 100;
  const ParamListing hundred = resnet50_params(c);
  EXPECT_EQ(hundred.total - ten.total, 90u * 2048 + 90);
  EXPECT_EQ(hundred.tensors.back().shape, (std::vector<int>{100}));
  c = NetConfig{};
  c.batch = 7;
  c.dtype = DType::F16;
  c.layout = Layout::NHWC;
  const ParamListing other = resnet50_params(c);
  ASSERT_EQ(other.tensors.size(), ten.tensors.size());
  for (size_t i = 0; i < ten.tensors.size(); ++i) EXPECT_EQ(other.tensors[i].shape, ten.tensors[i].shape);
  EXPECT_EQ(resnet50_spec(c).blocks.front().in.n, 7);
}

NetConfig at_side(int side, DType t = DType::F32, Layout l = Layout::NCHW) {
  NetConfig c;
  c.batch = 2;
  c.image_side = side;
  c.dtype = t;
  c.layout = l;
  return c;
}

// The side of each stage: of the first block's output, then of each stride-2 block's.
std::vector<int> stage_sides(int side) {
  std::vector<int> sides;
  for (const BlockSpec& b : resnet50_spec(at_side(side)).blocks)
    if (sides.empty() || b.out.h != b.in.h) sides.push_back(b.out.h);
  return sides;
}

// A 3x3 stride-2 pad-1 conv and a 1x1 stride-2 pad-0 one both give ceil(side / 2).
TEST(Resnet50Spec, StagesRunAtWhatTheStridedConvsGive) {
  EXPECT_EQ(stage_sides(32), (std::vector<int>{32, 16, 8, 4}));
  EXPECT_EQ(stage_sides(28), (std::vector<int>{28, 14, 7, 4}));
  EXPECT_EQ(stage_sides(12), (std::vector<int>{12, 6, 3, 2}));
  EXPECT_EQ(stage_sides(8), (std::vector<int>{8, 4, 2, 1}));
  EXPECT_EQ(stage_sides(9), (std::vector<int>{9, 5, 3, 2}));
}

TEST(Resnet50Spec, EveryConvGivesTheTensorTheNextLayerReads) {
  for (const int side : {32, 28, 12, 9}) {
    SCOPED_TRACE("side " + std::to_string(side));
    const NetSpec n = resnet50_spec(at_side(side));
    EXPECT_EQ(n.stem.g.output(), (Shape4{2, 64, side, side}));
    Shape4 in = n.stem.g.output();
    for (const BlockSpec& b : n.blocks) {
      SCOPED_TRACE(b.c1.name);
      EXPECT_EQ(b.in, in);
      EXPECT_EQ(b.c1.g.input(), b.in);
      EXPECT_EQ(b.c1.g.output(), b.mid1);
      EXPECT_EQ(b.c2.g.input(), b.mid1);
      EXPECT_EQ(b.c2.g.output(), b.mid2);
      EXPECT_EQ(b.c3.g.input(), b.mid2);
      EXPECT_EQ(b.c3.g.output(), b.out);
      if (b.down) {
        EXPECT_EQ(b.down->g.input(), b.in);
        EXPECT_EQ(b.down->g.output(), b.out) << "the shortcut's output is added to the main path's";
      } else {
        EXPECT_EQ(b.in, b.out) << "an identity shortcut adds the block's input";
      }
      in = b.out;
    }
    EXPECT_EQ(in.c, n.features);
  }
}

TEST(Resnet50Spec, TheParametersDoNotDependOnTheSide) {
  const ParamListing at32 = resnet50_params(at_side(32)), at28 = resnet50_params(at_side(28));
  ASSERT_EQ(at28.tensors.size(), at32.tensors.size());
  for (size_t i = 0; i < at32.tensors.size(); ++i) EXPECT_EQ(at28.tensors[i].shape, at32.tensors[i].shape);
  EXPECT_EQ(at28.total, at32.total);
}

// The NHWC builds run any side from 8; the NCHW ones the sides whose every stage's H*W is a multiple
// of their batch-norm kernels' vector width (4 in fp32, 8 in fp16): not 28, whose third stage is 7x7.
TEST(Resnet50Spec, TheBuildsRefuseTheSidesTheirKernelsCannotRun) {
  for (const int side : {8, 9, 12, 28, 32, 64})
    for (const DType t : {DType::F32, DType::F16}) EXPECT_NO_THROW(Network::check_image_side(at_side(side, t, Layout::NHWC)));
  EXPECT_NO_THROW(Network::check_image_side(at_side(32, DType::F32, Layout::NCHW)));
  EXPECT_NO_THROW(Network::check_image_side(at_side(32, DType::F16, Layout::NCHW)));
  EXPECT_NO_THROW(Network::check_image_side(at_side(16, DType::F32, Layout::NCHW)));
  auto refusal = [](int side, DType t, Layout l) -> std::string {
    try {
      Network::check_image_side(at_side(side, t, l));
    } catch (const Fatal& e) {
      return e.what();
    }
    return "";
  };
  const std::string m = refusal(28, DType::F32, Layout::NCHW);
  EXPECT_NE(m.find("ResNet-50 at image side 28 (stages at 28, 14, 7, 4): layer3.0.bn2: batch norm: NCHW needs H*W "
                   "divisible by 4, got 49 (7x7)"), std::string::npos) << m;
  EXPECT_NE(m.find("the NHWC builds (bin/train) any side"), std::string::npos) << m;
  EXPECT_NE(refusal(28, DType::F16, Layout::NCHW).find("layer2.0.bn2"), std::string::npos) << "14x14: 196 is not a multiple of 8";
  EXPECT_NE(refusal(16, DType::F16, Layout::NCHW).find("got 4 (2x2)"), std::string::npos);
  EXPECT_NE(refusal(7, DType::F16, Layout::NHWC).find("image side 7 is below 8"), std::string::npos);
}

TEST(Resnet50SpecGpu, IsExactlyWhatTheNetworkRegisters) {
  SKIP_WITHOUT_GPU("building the network");
  GpuContext ctx;
  AutotuneCache cache("", "spec-test");
  NetConfig cfg;
  cfg.batch = 4;
  const TrainingNetwork net(cfg, ctx, cache);
  const ParamListing l = resnet50_params(cfg);
  const std::vector<ParamTensor>& t = net.params().tensors();
  ASSERT_EQ(t.size(), l.tensors.size());
  for (size_t i = 0; i < t.size(); ++i) {
    EXPECT_EQ(t[i].name, l.tensors[i].name) << i;
    EXPECT_EQ(t[i].shape, l.tensors[i].shape) << t[i].name;
    EXPECT_EQ(t[i].kind, l.tensors[i].kind) << t[i].name;
  }
  EXPECT_EQ(net.params().total(), l.total);
  EXPECT_EQ(net.running_stats_count(), l.running);
}

}  // namespace
