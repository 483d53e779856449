// A fresh start's parameters (Network::initial_params, network.h). On the CPU: --zero-init-residual
// zeroes exactly the 16 bottleneck blocks' last BN gammas (torchvision's zero_init_residual) and
// changes nothing else; on a GPU: init_params puts those values in the network.
#include <gtest/gtest.h>

#include <cmath>
#include <regex>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/rng.h"
#include "model/autotune_cache.h"
#include "model/resnet50_spec.h"
#include "model/training_network.h"
#include "support/gpu_test_util.h"

namespace {

// "layer<stage>.<block>.bn3.weight": the gamma of the BN before a block's residual add.
bool is_block_last_gamma(const std::string& name) {
  static const std::regex re(R"(layer[1-4]\.[0-9]+\.bn3\.weight)");
  return std::regex_match(name, re);
}

bool all_equal(const std::vector<float>& host, const ParamTensor& t, float v) {
  for (size_t e = 0; e < t.count; ++e)
    if (host[t.offset + e] != v) return false;
  return true;
}

TEST(InitialParams, ListsEachBlocksLastBnGamma) {
  const ParamListing l = resnet50_params(NetConfig{});
  ASSERT_EQ(l.block_last_gammas.size(), 16u) << "ResNet-50: 3 + 4 + 6 + 3 blocks";
  for (int id : l.block_last_gammas) {
    EXPECT_EQ(l.tensors[id].kind, ParamKind::BnGamma) << l.tensors[id].name;
    EXPECT_TRUE(is_block_last_gamma(l.tensors[id].name)) << l.tensors[id].name;
  }
  EXPECT_EQ(l.tensors[l.block_last_gammas.front()].name, "layer1.0.bn3.weight");
  EXPECT_EQ(l.tensors[l.block_last_gammas.back()].name, "layer4.2.bn3.weight");
}

TEST(InitialParams, ZeroInitResidualZeroesOnlyTheBlocksLastGammas) {
  const NetConfig cfg;
  const std::vector<float> plain = Network::initial_params(cfg, 7, false);
  const std::vector<float> zeroed = Network::initial_params(cfg, 7, true);
  const std::vector<ParamTensor> ts = Network::tensor_layout(cfg.classes).params;
  ASSERT_EQ(plain.size(), resnet50_params(cfg).total);
  ASSERT_EQ(zeroed.size(), plain.size());
  int gammas = 0, zero_gammas = 0;
  for (const ParamTensor& t : ts) {
    if (t.kind == ParamKind::BnGamma) {
      ++gammas;
      EXPECT_TRUE(all_equal(plain, t, 1.f)) << t.name << ": gamma 1 without the flag";
      const bool last = is_block_last_gamma(t.name);
      zero_gammas += last;
      EXPECT_TRUE(all_equal(zeroed, t, last ? 0.f : 1.f)) << t.name << ": gamma " << (last ? 0 : 1) << " with it";
      continue;
    }
    for (size_t e = 0; e < t.count; ++e)  // every other tensor bit for bit as without the flag
      ASSERT_EQ(zeroed[t.offset + e], plain[t.offset + e]) << t.name << "[" << e << "]";
  }
  EXPECT_EQ(gammas, 53);
  EXPECT_EQ(zero_gammas, 16);
}

// The tensors fill on threads, each from a generator of its own seeded by its index: whatever the
// threads' order, a conv's values are its own generator's draws, as when they filled one by one.
TEST(InitialParams, EachConvIsItsOwnGeneratorsDraws) {
  const NetConfig cfg;
  const std::vector<float> host = Network::initial_params(cfg, 11, false);
  const std::vector<ParamTensor> ts = Network::tensor_layout(cfg.classes).params;
  int convs = 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    const ParamTensor& t = ts[i];
    if (t.kind != ParamKind::ConvWeight) continue;
    ++convs;
    Rng rng(mix(11, 0x1417u, i));
    const double stdev = std::sqrt(2.0 / (double(t.shape[0]) * t.shape[2] * t.shape[3]));
    for (size_t e = 0; e < t.count; ++e)
      ASSERT_EQ(host[t.offset + e], static_cast<float>(rng.normal() * stdev)) << t.name << "[" << e << "]";
  }
  EXPECT_EQ(convs, 53);
  EXPECT_EQ(host, Network::initial_params(cfg, 11, false)) << "a second fill differs";
}

TEST(InitialParamsGpu, InitParamsPutsThemInTheNetwork) {
  SKIP_WITHOUT_GPU("building the network");
  NetConfig cfg;
  cfg.batch = 4;
  AutotuneCache cache("", "initial-params test");
  TrainingNetwork net(cfg, gpu_test::ctx(), cache);
  net.init_params(5, true);
  std::vector<float> master(net.params().total());
  CUDA_CHECK(cudaMemcpy(master.data(), net.params().master_all(), master.size() * sizeof(float), cudaMemcpyDeviceToHost));
  EXPECT_EQ(master, Network::initial_params(cfg, 5, true));
}

}  // namespace
