// Does a checkpoint fit this run (checkpoint.h)? Its position against the run's steps per epoch, the
// build, model, batch, data, classes and image size it was written by, and the model signature.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "train/checkpoint.h"
#include "support/test_files.h"
#include "checkpoint_test_util.h"

namespace {

using namespace test_files;       // input_error_of
using namespace checkpoint_test;  // sample

TEST(CheckpointPosition, MustFitThisRunsStepsPerEpoch) {
  CheckpointMeta m;
  m.step = 100;
  m.epoch = 1;
  m.step_in_epoch = 5;
  EXPECT_NO_THROW(check_checkpoint_position(m, 95, "ck.bin"));
  const std::string e = input_error_of([&] { check_checkpoint_position(m, 78, "ck.bin"); });
  EXPECT_HAS(e, "ck.bin: saved at step 100 (epoch 2, step 5 of it)");
  EXPECT_HAS(e, "78 steps per epoch");
  EXPECT_HAS(e, "--synthetic-size");
  m.step_in_epoch = 0;
  m.step = 0;
  m.epoch = 0;
  EXPECT_NO_THROW(check_checkpoint_position(m, 1, "ck.bin"));
  m.step_in_epoch = 3;  // step 3 of epoch 0 cannot be in a run of 3 steps per epoch
  m.step = 3;
  EXPECT_HAS(input_error_of([&] { check_checkpoint_position(m, 3, "ck.bin"); }), "3 steps per epoch");
}

TEST(CheckpointFits, SameBuildAndRunFits) {
  const CheckpointMeta m = sample(4, 2).meta;
  EXPECT_NO_THROW(check_checkpoint_fits(m, m, "ck.bin"));
  CheckpointMeta later = m;
  later.step += 1000;
  later.loss_scale = 2.f;
  EXPECT_NO_THROW(check_checkpoint_fits(m, later, "ck.bin")) << "only build, model, batch and data must agree";
}

TEST(CheckpointFits, AnotherModelIsRejected) {
  const CheckpointMeta here = sample(4, 2).meta;
  CheckpointMeta f = here;
  f.model_signature ^= 1;
  EXPECT_HAS(input_error_of([&] { check_checkpoint_fits(f, here, "ck.bin"); }), "another model");
  f = here;
  f.params += 1;
  const std::string m = input_error_of([&] { check_checkpoint_fits(f, here, "ck.bin"); });
  EXPECT_HAS(m, "ck.bin");
  EXPECT_HAS(m, "another model");
  EXPECT_HAS(m, "5 parameters in the checkpoint, 4 here");
}

TEST(CheckpointFits, AnotherSignatureAloneIsShownAsSuch) {
  // Both sides used to read "resnet50-cifar, 4 parameters": the message names the tensors and signatures.
  const CheckpointMeta here = sample(4, 2).meta;
  CheckpointMeta f = here;
  f.model_signature = here.model_signature + 1;
  EXPECT_HAS(input_error_of([&] { check_checkpoint_fits(f, here, "ck.bin"); }),
             "ck.bin: checkpoint of another model than this trainer builds: the same resnet50-cifar with 4 parameters, "
             "but other tensor names or shapes (model signature " + std::to_string(f.model_signature) +
                 " in the checkpoint, " + std::to_string(here.model_signature) + " here)");
  EXPECT_EQ(model_difference(here, here), "");
  f = here;
  f.model = "resnet18";
  f.running += 2;
  EXPECT_EQ(model_difference(f, here), "model resnet18 in the checkpoint, resnet50-cifar here; 4 BN running values in "
                                       "the checkpoint, 2 here");
}

TEST(CheckpointFits, PrecisionOrLayoutMismatchExplainsBothBuilds) {
  CheckpointMeta here = sample(4, 2).meta, f = here;
  here.precision = "fp32";
  here.layout = "NCHW";
  f.precision = "fp16";
  f.layout = "NHWC";
  std::string m = input_error_of([&] { check_checkpoint_fits(f, here, "ck.bin"); });
  EXPECT_HAS(m, "ck.bin");
  EXPECT_HAS(m, "fp16/NHWC");
  EXPECT_HAS(m, "fp32/NCHW");
  f.precision = "fp32";  // layout alone
  m = input_error_of([&] { check_checkpoint_fits(f, here, "ck.bin"); });
  EXPECT_HAS(m, "fp32/NHWC");
  EXPECT_HAS(m, "fp32/NCHW");
}

TEST(CheckpointFits, BatchAndDataMismatchAreNamed) {
  const CheckpointMeta here = sample(4, 2).meta;
  CheckpointMeta f = here;
  f.batch = 64;
  std::string m = input_error_of([&] { check_checkpoint_fits(f, here, "ck.bin"); });
  EXPECT_HAS(m, "--batch 64");
  f = here;
  f.data = "cifar10";
  m = input_error_of([&] { check_checkpoint_fits(f, here, "ck.bin"); });
  EXPECT_HAS(m, "cifar10");
  EXPECT_HAS(m, "--data");
}

TEST(CheckpointFits, OtherClassesOrImageSizeAreNamed) {
  const CheckpointMeta here = sample(4, 2).meta;
  CheckpointMeta f = here;
  f.class_names = {"cat", "dog"};
  std::string m = input_error_of([&] { check_checkpoint_fits(f, here, "ck.bin"); });
  EXPECT_HAS(m, "ck.bin: trained on 2 classes (cat,dog) but the data set has 6");
  f.params += 1;  // another class count is another model too: the classes are what the user must see
  EXPECT_HAS(input_error_of([&] { check_checkpoint_fits(f, here, "ck.bin"); }), "trained on 2 classes");
  f = here;
  f.image_side = 32;
  m = input_error_of([&] { check_checkpoint_fits(f, here, "ck.bin"); });
  EXPECT_HAS(m, "ck.bin: trained at --image-size 32; resume with --image-size 32");
  f = here;
  f.class_names.clear();  // an older file: its classes are not known, nothing to compare
  EXPECT_NO_THROW(check_checkpoint_fits(f, here, "ck.bin"));
}

TEST(ModelSignature, ChangesWithANameOrAShape) {
  using Tensors = std::vector<std::pair<std::string, std::vector<int>>>;
  const Tensors base = {{"conv1.w", {64, 3, 3, 3}}, {"bn1.gamma", {64}}, {"fc.w", {10, 2048}}};
  const uint64_t s = model_signature(base);
  EXPECT_EQ(model_signature(base), s);
  Tensors t = base;
  t[1].first = "bn1.beta";
  EXPECT_NE(model_signature(t), s);
  t = base;
  t[0].second[0] = 32;
  EXPECT_NE(model_signature(t), s);
  t = base;
  t[2].second = {2048, 10};
  EXPECT_NE(model_signature(t), s);
  t = base;
  t.pop_back();
  EXPECT_NE(model_signature(t), s);
  t = base;
  std::swap(t[0], t[1]);
  EXPECT_NE(model_signature(t), s);
}

}  // namespace
