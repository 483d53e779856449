// The CPU description of ResNet-50 (resnet50_spec.h): the parameter listing a resume is checked
// against before the GPU is touched. On the CPU: its count is the documented one and it follows
// NetConfig; on a GPU: it is exactly what the network registers (names, shapes, order, running stats).
#include <gtest/gtest.h>

#include <set>
#include <string>

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
