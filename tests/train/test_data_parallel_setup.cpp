// What every rank must share (train/data_parallel_setup.h): a flag that changes the computation, the
// build, the data or the checkpoint makes the fingerprints differ, and says which; a flag naming
// this rank's own files or threads does not. And the batch rule of a resume on another GPU count.
#include <gtest/gtest.h>

#include <string>

#include "core/errors.h"
#include "train/data_parallel_setup.h"

namespace {

const BuildSettings kTrain{true, LoaderKind::PinnedRing, AlgoPolicy::Autotune, DType::F16, Layout::NHWC,
                           ConvApi::Graph, false, false, "train"};

DataSplit tiny_data() {
  DataSplit d;
  for (Dataset* s : {&d.train, &d.test}) {
    s->name = "synthetic";
    s->count = 4;
    s->channels = 3;
    s->labels = {1, 2, 3, 4};
    s->images.assign(s->image_bytes() * 4, 7);
  }
  return d;
}

Normalization norm() { return Normalization{{0.5f, 0.5f, 0.5f}, {0.25f, 0.25f, 0.25f}}; }

std::string differences(const Fingerprint& a, const Fingerprint& b) {
  return fingerprint_differences(a, "rank 0", b, "rank 1");
}

}  // namespace

TEST(DataParallelSetup, SameRunSameFingerprint) {
  const Options o;
  const DataSplit d = tiny_data();
  EXPECT_EQ(differences(run_fingerprint(kTrain, o, 2, d, norm(), nullptr), run_fingerprint(kTrain, o, 2, d, norm(), nullptr)),
            "");
}

TEST(DataParallelSetup, FlagsThatShapeTheComputationDiffer) {
  const DataSplit d = tiny_data();
  const Options base;
  const Fingerprint f0 = run_fingerprint(kTrain, base, 2, d, norm(), nullptr);
  Options o = base;
  o.lr = 0.1;
  EXPECT_EQ(differences(f0, run_fingerprint(kTrain, o, 2, d, norm(), nullptr)),
            "--lr is '0.02' on rank 0 but '0.1' on rank 1");
  o = base;
  o.nesterov = false;
  EXPECT_NE(differences(f0, run_fingerprint(kTrain, o, 2, d, norm(), nullptr)).find("--no-nesterov"), std::string::npos);
  o = base;
  o.allreduce_dtype = "fp32";
  EXPECT_NE(differences(f0, run_fingerprint(kTrain, o, 2, d, norm(), nullptr)).find("--allreduce-dtype"), std::string::npos);
  o = base;
  o.grad_compression = "int8";
  EXPECT_EQ(differences(f0, run_fingerprint(kTrain, o, 2, d, norm(), nullptr)),
            "--grad-compression is 'none' on rank 0 but 'int8' on rank 1");
  o = base;
  o.last_bucket_mb = 1;
  EXPECT_EQ(differences(f0, run_fingerprint(kTrain, o, 2, d, norm(), nullptr)),
            "--last-bucket-mb is '0' on rank 0 but '1' on rank 1");
  o = base;
  o.accumulate = 4;
  EXPECT_EQ(differences(f0, run_fingerprint(kTrain, o, 2, d, norm(), nullptr)),
            "--accumulate is '1' on rank 0 but '4' on rank 1");
  o = base;
  o.zero_init_residual = true;  // rank 0's start state is broadcast, but the ranks must agree on the recipe
  EXPECT_EQ(differences(f0, run_fingerprint(kTrain, o, 2, d, norm(), nullptr)),
            "--zero-init-residual is 'off' on rank 0 but 'on' on rank 1");
  o = base;
  o.batch = 64;
  EXPECT_NE(differences(f0, run_fingerprint(kTrain, o, 2, d, norm(), nullptr)).find("--batch"), std::string::npos);
  o = base;
  o.image_size = 64;
  EXPECT_EQ(differences(f0, run_fingerprint(kTrain, o, 2, d, norm(), nullptr)),
            "--image-size is '32' on rank 0 but '64' on rank 1");
}

TEST(DataParallelSetup, ThisRanksOwnFilesAndThreadsMayDiffer) {
  const DataSplit d = tiny_data();
  const Options base;
  Options o = base;
  o.workers = 3;
  o.data_dir = "/elsewhere";
  o.trace = "t.json";
  o.save = "x.ckpt";
  o.loss_log = "l.txt";
  o.autotune_cache = "other.txt";
  o.json = true;
  EXPECT_EQ(differences(run_fingerprint(kTrain, base, 2, d, norm(), nullptr), run_fingerprint(kTrain, o, 2, d, norm(), nullptr)),
            "");
}

TEST(DataParallelSetup, BuildDataAndCheckpointDiffer) {
  const Options o;
  const DataSplit d = tiny_data();
  const Fingerprint f0 = run_fingerprint(kTrain, o, 2, d, norm(), nullptr);
  BuildSettings naive = kTrain;
  naive.ddp_overlap = false;
  EXPECT_NE(differences(f0, run_fingerprint(naive, o, 2, d, norm(), nullptr)).find("build is"), std::string::npos);
  DataSplit other = d;
  other.train.labels[2] = 9;  // another copy of the data set on that machine
  EXPECT_NE(differences(f0, run_fingerprint(kTrain, o, 2, other, norm(), nullptr)).find("data is"), std::string::npos);
  Checkpoint c;
  c.meta.step = 100;
  c.master = {1, 2, 3};
  const Fingerprint with_ckpt = run_fingerprint(kTrain, o, 2, d, norm(), &c);
  EXPECT_NE(differences(f0, with_ckpt).find("checkpoint is 'none' on rank 0"), std::string::npos);
  Checkpoint c2 = c;
  c2.master[1] = 2.5f;
  EXPECT_NE(differences(with_ckpt, run_fingerprint(kTrain, o, 2, d, norm(), &c2)).find("checkpoint is"), std::string::npos);
}

TEST(DataParallelSetup, GlobalBatchRuleOfAResume) {
  CheckpointMeta saved;
  saved.batch = 256;  // 2 GPUs x 128
  EXPECT_NO_THROW(check_global_batch(saved, 128, 2, 1, "a.ckpt"));
  EXPECT_NO_THROW(check_global_batch(saved, 64, 4, 1, "a.ckpt"));
  EXPECT_NO_THROW(check_global_batch(saved, 256, 1, 1, "a.ckpt"));
  // micro-batches count as GPUs do: 2 GPUs x 2 micro-batches of 64 is a step of 256
  EXPECT_NO_THROW(check_global_batch(saved, 64, 2, 2, "a.ckpt"));
  EXPECT_NO_THROW(check_global_batch(saved, 128, 1, 2, "a.ckpt"));
  try {
    check_global_batch(saved, 128, 4, 1, "a.ckpt");
    FAIL() << "a global batch of 512 was accepted for a checkpoint of 256";
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("a.ckpt: trained with a global batch of 256"), std::string::npos) << m;
    EXPECT_NE(m.find("resume with --batch 64 on 4 GPUs"), std::string::npos) << m;
  }
  try {
    check_global_batch(saved, 100, 3, 1, "a.ckpt");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("number of GPUs (times --accumulate) that divides it"), std::string::npos)
        << e.what();
  }
  try {
    check_global_batch(saved, 128, 2, 2, "a.ckpt");
    FAIL() << "2 GPUs x 2 micro-batches of 128 were accepted for a checkpoint of 256 images a step";
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("this run has 128 x 2 x 2 = 512"), std::string::npos) << m;
    EXPECT_NE(m.find("resume with --batch 64 on 2 GPUs with --accumulate 2"), std::string::npos) << m;
  }
}

TEST(DataParallelSetup, ConfigFromFlagsAndBuild) {
  Options o;
  o.bucket_mb = 5;
  o.allreduce_dtype = "fp16";
  o.grad_compression = "int8";
  o.last_bucket_mb = 2;
  o.dist_timeout = 12;
  BuildSettings naive = kTrain;
  naive.ddp_overlap = false;
  const DataParallelConfig c = data_parallel_config(naive, o);
  EXPECT_EQ(c.bucket_mb, 5);
  EXPECT_EQ(c.reduce_type, "fp16");
  EXPECT_EQ(c.compression, "int8");
  EXPECT_EQ(c.last_bucket_mb, 2);
  EXPECT_EQ(c.timeout_s, 12);
  EXPECT_FALSE(c.overlap);
  EXPECT_TRUE(data_parallel_config(kTrain, o).overlap);
}
