// The network's tensor layout known without a GPU, checkpoints checked against it, filters
// rearranged between the layouts of NCHW and NHWC builds, and the export as a PyTorch state_dict
// (names, module order, KCRS filters, BN statistics), all against independently computed values.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/errors.h"
#include "model/network.h"
#include "support/sample_checkpoint.h"
#include "predict/weights.h"
#include "support/test_files.h"

namespace {

using predict_test::sample_checkpoint;
using predict_test::sample_running;
using predict_test::sample_value;
using test_files::input_error_of;

const ParamTensor* find(const TensorLayout& l, const std::string& name) {
  for (const ParamTensor& t : l.params)
    if (t.name == name) return &t;
  return nullptr;
}

TEST(TensorLayout, TheCifarResNet50) {
  const TensorLayout l = Network::tensor_layout(10);
  size_t total = 0, running = 0;
  std::set<std::string> names;
  for (const ParamTensor& t : l.params) {
    total += t.count;
    EXPECT_TRUE(names.insert(t.name).second) << t.name << " twice";
  }
  for (const auto& bn : l.bns) running += 2 * size_t(bn.second);
  EXPECT_EQ(total, 23520842u) << "the README's parameter count";
  EXPECT_EQ(l.bns.size(), 53u) << "stem + 16 blocks x 3 + 4 projection shortcuts";
  EXPECT_EQ(running, 2u * 26560u);  // 2 x (channels of the 53 BNs)
  ASSERT_NE(find(l, "conv1.weight"), nullptr);
  EXPECT_EQ(find(l, "conv1.weight")->shape, (std::vector<int>{64, 3, 3, 3}));
  EXPECT_EQ(find(l, "layer1.0.downsample.0.weight")->shape, (std::vector<int>{256, 64, 1, 1}));
  EXPECT_EQ(find(l, "layer2.0.conv2.weight")->shape, (std::vector<int>{128, 128, 3, 3}));
  EXPECT_EQ(find(l, "layer2.0.downsample.0.weight")->shape, (std::vector<int>{512, 256, 1, 1}));
  EXPECT_EQ(find(l, "layer2.1.downsample.0.weight"), nullptr);
  EXPECT_EQ(find(l, "layer4.2.bn3.bias")->shape, (std::vector<int>{2048}));
  EXPECT_EQ(find(l, "fc.weight")->shape, (std::vector<int>{10, 2048}));
  EXPECT_EQ(l.params.back().name, "fc.bias");
  // Offsets as the flat buffer holds them: every weight before every vector, each tensor contiguous.
  size_t weights_end = 0;
  for (const ParamTensor& t : l.params)
    if (t.is_weight()) weights_end = std::max(weights_end, t.offset + t.count);
  std::vector<bool> covered(total, false);
  for (const ParamTensor& t : l.params) {
    EXPECT_EQ(t.is_weight(), t.offset < weights_end) << t.name;
    for (size_t e = 0; e < t.count; ++e) {
      ASSERT_FALSE(covered[t.offset + e]) << t.name << " overlaps another tensor";
      covered[t.offset + e] = true;
    }
  }
  EXPECT_EQ(find(l, "conv1.weight")->offset, 0u);
  EXPECT_EQ(Network::tensor_layout(100).params.back().shape, std::vector<int>{100});
}

TEST(Weights, FiltersRearrangeBetweenLayoutsAndBack) {
  const TensorLayout l = Network::tensor_layout(10);
  const Checkpoint nchw = sample_checkpoint(l, Layout::NCHW), nhwc = sample_checkpoint(l, Layout::NHWC);
  EXPECT_NE(nchw.master, nhwc.master);
  EXPECT_EQ(convert_filters(nchw.master, l, Layout::NCHW, Layout::NHWC), nhwc.master);
  EXPECT_EQ(convert_filters(nhwc.master, l, Layout::NHWC, Layout::NCHW), nchw.master);
  EXPECT_EQ(convert_filters(nhwc.master, l, Layout::NHWC, Layout::NHWC), nhwc.master);
  // One element by hand: layer1.0.conv2.weight[k=5][c=7][r=2][s=1] of a 64 x 64 x 3 x 3 filter.
  const ParamTensor& t = *find(l, "layer1.0.conv2.weight");
  const size_t e = ((5 * 64 + 7) * 3 + 2) * 3 + 1, krsc = ((5 * 3 + 2) * 3 + 1) * 64 + 7;
  EXPECT_EQ(nhwc.master[t.offset + krsc], nchw.master[t.offset + e]);
}

TEST(Weights, CheckpointsOfOtherModelsAreRefusedNamingTheFile) {
  const TensorLayout l = Network::tensor_layout(10);
  const Checkpoint c = sample_checkpoint(l, Layout::NHWC);
  check_checkpoint_model(c.meta, l, "ok.ckpt");
  std::string m = input_error_of([&] { check_checkpoint_model(c.meta, Network::tensor_layout(100), "ten.ckpt"); });
  EXPECT_HAS(m, "ten.ckpt");
  EXPECT_HAS(m, "another model");
  EXPECT_HAS(m, "for 100 classes");
  CheckpointMeta other = c.meta;
  other.model = "resnet18";
  EXPECT_HAS(input_error_of([&] { check_checkpoint_model(other, l, "r18.ckpt"); }), "resnet18");
  other = c.meta;
  other.running += 2;
  EXPECT_HAS(input_error_of([&] { check_checkpoint_model(other, l, "bn.ckpt"); }), "bn.ckpt");
  other = c.meta;
  other.layout = "CHWN";
  EXPECT_HAS(input_error_of([&] { checkpoint_layout(other, "odd.ckpt"); }), "unknown filter layout 'CHWN'");
  EXPECT_EQ(checkpoint_layout(c.meta, "x"), Layout::NHWC);
}

TEST(Weights, AnotherSignatureAloneShowsBothSignatures) {
  // Same model name and counts, other tensors: "resnet50-cifar, 23,520,842 parameters" on both sides said
  // nothing. The message names what differs and the two signatures.
  const TensorLayout l = Network::tensor_layout(10);
  CheckpointMeta other = sample_checkpoint(l, Layout::NHWC).meta;
  const uint64_t here = other.model_signature;
  other.model_signature = here ^ 1;
  const std::string m = input_error_of([&] { check_checkpoint_model(other, l, "sig.ckpt"); });
  EXPECT_HAS(m, "sig.ckpt: checkpoint of another model than this program builds for 10 classes: the same "
                "resnet50-cifar with 23,520,842 parameters, but other tensor names or shapes (model signature " +
                    std::to_string(here ^ 1) + " in the checkpoint, " + std::to_string(here) + " here)");
  other = sample_checkpoint(l, Layout::NHWC).meta;
  other.params += 10;
  EXPECT_HAS(input_error_of([&] { check_checkpoint_model(other, l, "p.ckpt"); }),
             "23,520,852 parameters in the checkpoint, 23,520,842 here");
}

TEST(Weights, OtherClassesAreNamedOnEachSide) {
  check_checkpoint_classes({"a", "b"}, {"a", "b"}, "dir", "c.ckpt");
  check_checkpoint_classes({}, {"a", "b"}, "dir", "c.ckpt");  // a checkpoint that does not name them
  // The newcomer's case: the first names agree, so "the checkpoint's first: a; the data set's: a" said nothing.
  std::string m = input_error_of([&] { check_checkpoint_classes({"a", "b", "c"}, {"a", "b", "d"}, "imgs", "c.ckpt"); });
  EXPECT_EQ(m, "c.ckpt: trained on other classes than those of imgs (3 in the checkpoint, 3 in the data set): only in "
               "the checkpoint: c; only in the data set: d");
  m = input_error_of([&] { check_checkpoint_classes({"a", "b"}, {"a", "b", "c"}, "imgs", "c.ckpt"); });
  EXPECT_HAS(m, "(2 in the checkpoint, 3 in the data set): only in the data set: c");
  EXPECT_EQ(m.find("only in the checkpoint"), std::string::npos);
  m = input_error_of([&] { check_checkpoint_classes({"a", "b", "c"}, {"a", "c", "b"}, "imgs", "c.ckpt"); });
  EXPECT_HAS(m, "the same names in another order; class 1 is b in the checkpoint, c in the data set");
  std::vector<std::string> seven, none;
  for (int k = 0; k < 7; ++k) seven.push_back("k" + std::to_string(k));
  m = input_error_of([&] { check_checkpoint_classes(seven, none, "imgs", "c.ckpt"); });
  EXPECT_HAS(m, "only in the checkpoint: k0, k1, k2, k3, k4 and 2 more");
}

TEST(Weights, ExportIsAPyTorchStateDictInModuleOrder) {
  const TensorLayout l = Network::tensor_layout(10);
  for (Layout stored : {Layout::NCHW, Layout::NHWC}) {
    SCOPED_TRACE(layout_name(stored));
    const Checkpoint c = sample_checkpoint(l, stored);
    const std::vector<SafeTensor> out = export_tensors(c, l);
    ASSERT_EQ(out.size(), l.params.size() + 3 * l.bns.size());
    std::map<std::string, const SafeTensor*> by_name;
    for (const SafeTensor& t : out) by_name[t.name] = &t;
    EXPECT_EQ(out[0].name, "conv1.weight");
    EXPECT_EQ(out[1].name, "bn1.weight");
    EXPECT_EQ(out[2].name, "bn1.bias");
    EXPECT_EQ(out[3].name, "bn1.running_mean");
    EXPECT_EQ(out[4].name, "bn1.running_var");
    EXPECT_EQ(out[5].name, "bn1.num_batches_tracked");
    EXPECT_EQ(out[6].name, "layer1.0.conv1.weight");
    EXPECT_EQ(out.back().name, "fc.bias");
    // Every parameter, in PyTorch's element order whatever the checkpoint's layout.
    for (size_t i = 0; i < l.params.size(); ++i) {
      const ParamTensor& p = l.params[i];
      const SafeTensor& t = *by_name.at(p.name);
      ASSERT_EQ(t.dtype, "F32");
      ASSERT_EQ(t.shape, std::vector<int64_t>(p.shape.begin(), p.shape.end()));
      ASSERT_EQ(t.data.size(), p.count * 4);
      for (size_t e = 0; e < p.count; e += 1 + p.count / 97) {
        float v;
        std::memcpy(&v, t.data.data() + 4 * e, 4);
        ASSERT_EQ(v, sample_value(i, e)) << p.name << " element " << e;
      }
    }
    // BN statistics: the n-th BN's mean and variance follow each other in the running buffer.
    size_t off = 0;
    for (const auto& [name, channels] : l.bns) {
      const SafeTensor& mean = *by_name.at(name + ".running_mean");
      const SafeTensor& var = *by_name.at(name + ".running_var");
      float m0, v0;
      std::memcpy(&m0, mean.data.data(), 4);
      std::memcpy(&v0, var.data.data(), 4);
      EXPECT_EQ(m0, sample_running(off)) << name;
      EXPECT_EQ(v0, sample_running(off + channels)) << name;
      EXPECT_EQ(mean.shape, std::vector<int64_t>{channels});
      off += 2 * size_t(channels);
      const SafeTensor& steps = *by_name.at(name + ".num_batches_tracked");
      EXPECT_EQ(steps.dtype, "I64");
      EXPECT_TRUE(steps.shape.empty());
      int64_t n;
      std::memcpy(&n, steps.data.data(), 8);
      EXPECT_EQ(n, 1234);
    }
  }
}

}  // namespace
