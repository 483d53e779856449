// Data parallelism on the GPU (dist/data_parallel.h). On one GPU: the real backward reports every
// parameter's gradient exactly once, and all buckets but the last go before backward ends. On two
// GPUs (two ranks as two threads of this process, each with its own device and NCCL rank): a step
// gives, on both ranks and bit for bit the same, the average of the gradients one process computes
// for the two half-batches separately; overlapped, naive, fp16-reduced and int8-compressed; the
// all-reduce's clock counts every measured step; and the collectives outside the step (broadcast,
// averages, summed counters, the stop vote) do what they say.
#include <gtest/gtest.h>

#include <cctype>
#include <string>
#include <vector>

#include "core/check.h"
#include "dist/buckets.h"
#include "dist/data_parallel.h"
#include "support/gpu_test_util.h"
#include "data_parallel_test_util.h"

using namespace data_parallel_test;  // kHalf, the configurations, Batch, Replica, on_two_ranks

namespace {

// What one process computes: the mean of the gradients of the two halves.
std::vector<double> reference_average(const Batch& b) {
  CUDA_CHECK(cudaSetDevice(0));
  Replica rep;
  std::vector<double> sum;
  for (int half = 0; half < 2; ++half) {
    rep.load_half(b, half);
    rep.forward_backward();
    const std::vector<double> g = rep.gradients();
    if (sum.empty()) sum.assign(g.size(), 0.0);
    for (size_t i = 0; i < g.size(); ++i) sum[i] += g[i] / 2;
  }
  return sum;
}

}  // namespace

struct HookCase {
  const char* name;
  NetConfig cfg;
};
void PrintTo(const HookCase& c, std::ostream* os) { *os << c.name; }
class GradientHook : public testing::TestWithParam<HookCase> {};

TEST_P(GradientHook, BackwardReportsEveryGradientOnceAndBucketsGoDuringIt) {
  SKIP_WITHOUT_GPU("the backward pass's gradient hook");
  Replica rep(GetParam().cfg);
  std::vector<int> order;
  rep.net.on_grad_ready = [&order](int t) { order.push_back(t); };
  rep.load_half(make_batch(kHalf), 0);
  rep.forward_backward();
  const ParamStore& p = rep.net.params();
  std::vector<int> seen(p.tensors().size(), 0);
  for (int t : order) ++seen[t];
  for (size_t t = 0; t < seen.size(); ++t) EXPECT_EQ(seen[t], 1) << p.tensors()[t].name;
  // With PyTorch DDP's sizes (1 MB first, then 25 MB) every bucket but the last is complete before
  // backward's last gradient: their all-reduces run while backward goes on.
  for (DType t : {DType::F16, DType::F32}) {
    const BucketPlan plan = plan_buckets(p.tensors(), p.weight_count(), dtype_size(t), 1 << 20, 25 << 20);
    BucketTracker tracker(plan);
    for (size_t i = 0; i + 1 < order.size(); ++i) tracker.ready(order[i]);
    EXPECT_EQ(tracker.launched(), int(plan.buckets.size()) - 1) << dtype_name(t);
    EXPECT_GE(plan.buckets.size(), 3u) << dtype_name(t);
  }
}

INSTANTIATE_TEST_SUITE_P(Backward, GradientHook,
                         testing::Values(HookCase{"fp32_nchw", net_config(kHalf)},
                                         HookCase{"fused_bn_fp16_nhwc", fused_config(kHalf)},
                                         HookCase{"fused_bn_fp16_nhwc_wgrad_stream", with_wgrad_stream(fused_config(kHalf))}),
                         [](const auto& info) { return std::string(info.param.name); });

struct StepMode {
  const char* name;
  DataParallelConfig dp;
  bool wgrad_stream = false;  // the ranks' weight gradients on their own stream (the reference's not)
};
void PrintTo(const StepMode& m, std::ostream* os) { *os << m.name; }
class TwoRankStep : public testing::TestWithParam<StepMode> {};

TEST_P(TwoRankStep, EqualsOneProcessAveragingTheTwoHalves) {
  SKIP_WITHOUT_TWO_GPUS();
  const DataParallelConfig cfg = GetParam().dp;
  const NetConfig net = GetParam().wgrad_stream ? with_wgrad_stream(net_config(kHalf)) : net_config(kHalf);
  const Batch batch = make_batch(2 * kHalf);
  const std::vector<std::vector<double>> got = on_two_ranks<std::vector<double>>(
      cfg,
      [&batch](DataParallel& dp, Replica& rep) {
        rep.load_half(batch, dp.rank());
        rep.forward_backward();  // the last gradient's hook has the stream wait for the last bucket
        dp.check_step();
        return rep.gradients();
      },
      net);
  const std::vector<double> want = reference_average(batch);
  EXPECT_EQ(got[0], got[1]) << "the ranks hold different averaged gradients";
  // fp32 reduce: the averaging's own rounding; fp16: each gradient rounded to fp16 on the way; int8:
  // at most half a step of 63 per chunk of 1024 from each rank, which is 15% of the chunk's norm
  // when one gradient dominates its chunk (error feedback sends the rest in later steps).
  const double bound = cfg.compression == "int8" ? 0.15 : cfg.reduce_type == "fp16" ? 2e-3 : 1e-5;
  EXPECT_CLOSE(got[0], want, bound);
}

INSTANTIATE_TEST_SUITE_P(Modes, TwoRankStep,
                         testing::Values(StepMode{"overlapped, small buckets", DataParallelConfig{0.5, 0.1, "", true, 60}},
                                         StepMode{"overlapped, default buckets", DataParallelConfig{25, 1, "", true, 60}},
                                         StepMode{"naive, one bucket", DataParallelConfig{25, 1, "", false, 60}},
                                         StepMode{"fp16 reduce", DataParallelConfig{25, 1, "fp16", true, 60}},
                                         StepMode{"overlapped, small buckets, weight gradients on their own stream",
                                                  DataParallelConfig{0.5, 0.1, "", true, 60}, true},
                                         StepMode{"int8 compression, small buckets",
                                                  DataParallelConfig{0.5, 0.1, "", true, 60, "int8"}},
                                         StepMode{"int8 compression, naive", DataParallelConfig{25, 1, "", false, 60, "int8"}}),
                         [](const auto& info) {
                           std::string n = info.param.name;
                           for (char& c : n) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return n;
                         });

TEST(DataParallelGpu, CollectivesOutsideTheStep) {
  SKIP_WITHOUT_TWO_GPUS();
  struct Seen {
    float master0, running0;
    LossTotals totals;
    long stopped_at;
  };
  const std::vector<Seen> seen = on_two_ranks<Seen>(DataParallelConfig{}, [](DataParallel& dp, Replica& rep) {
    const int r = dp.rank();
    ParamStore& p = rep.net.params();
    cudaStream_t s = rep.ctx.stream;
    const float mine = 10.f + r;  // rank 0's value must reach rank 1
    CUDA_CHECK(cudaMemcpy(p.master_all(), &mine, 4, cudaMemcpyHostToDevice));
    dp.broadcast_from_root(p.master_all(), p.total() * 4);
    std::vector<float> run(rep.net.running_stats_count(), float(r + 1));  // ranks hold 1 and 2
    CUDA_CHECK(cudaMemcpy(rep.net.running_stats(), run.data(), run.size() * 4, cudaMemcpyHostToDevice));
    dp.average(rep.net.running_stats(), run.size());
    LossTotals t{};
    t.loss_sum = r + 1.5;
    t.correct = 10ull * (r + 1);
    t.count = 100;
    t.last_loss = float(r);  // stays this rank's
    DeviceBuffer dt(sizeof(t), "totals");
    CUDA_CHECK(cudaMemcpy(dt.get(), &t, sizeof(t), cudaMemcpyHostToDevice));
    dp.sum_totals(dt.as<LossTotals>());
    Seen out{};
    CUDA_CHECK(cudaStreamSynchronize(s));
    CUDA_CHECK(cudaMemcpy(&out.master0, p.master_all(), 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(&out.running0, rep.net.running_stats(), 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(&out.totals, dt.get(), sizeof(t), cudaMemcpyDeviceToHost));
    out.stopped_at = -1;
    for (long step = 0; step <= 80 && out.stopped_at < 0; ++step)
      if (dp.agree_to_stop(step, r == 1 && step >= 20)) out.stopped_at = step;  // only rank 1 got a signal
    return out;
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(seen[r].master0, 10.f) << "rank " << r;
    EXPECT_EQ(seen[r].running0, 1.5f) << "rank " << r;
    EXPECT_EQ(seen[r].totals.loss_sum, 4.0) << "rank " << r;
    EXPECT_EQ(seen[r].totals.correct, 30u) << "rank " << r;
    EXPECT_EQ(seen[r].totals.count, 200u) << "rank " << r;
    EXPECT_EQ(seen[r].totals.last_loss, float(r)) << "rank " << r;
    // Voted at step 32 (the first vote after the signal), acted on at step 48, on both ranks.
    EXPECT_EQ(seen[r].stopped_at, 48) << "rank " << r;
  }
}

// The all-reduce's clock: every measured step of every rank is counted, the communication stream's
// time on the buckets is positive, exposure is never negative, and the bytes are the plan's; int8
// sends about half of what fp16 would and a quarter of fp32.
TEST(DataParallelGpu, TheClockCountsEveryMeasuredStepOfEveryRank) {
  SKIP_WITHOUT_TWO_GPUS();
  for (const char* compression : {"none", "int8"}) {
    const std::vector<CommReport> reports = on_two_ranks<CommReport>(
        DataParallelConfig{0.5, 0.1, "", true, 60, compression}, [](DataParallel& dp, Replica& rep) {
          const Batch batch = make_batch(2 * kHalf);
          rep.load_half(batch, dp.rank());
          rep.forward_backward();  // not measured
          dp.check_step();
          dp.measure_exposure(true);
          for (int k = 0; k < 3; ++k) {
            rep.forward_backward();
            dp.check_step();
          }
          dp.measure_exposure(false);
          rep.forward_backward();  // not measured
          dp.check_step();
          return dp.comm_report();
        });
    for (const CommReport& r : reports) {
      ASSERT_EQ(r.ranks.size(), 2u) << compression;
      EXPECT_EQ(r.world, 2);
      EXPECT_GE(r.buckets, 3);
      for (const RankComm& c : r.ranks) {
        EXPECT_EQ(c.steps, 3) << compression;
        EXPECT_GT(c.busy_ms, 0.0) << compression;
        EXPECT_GE(c.exposed_ms, 0.0) << compression;
        EXPECT_LT(c.exposed_ms, 10000.0) << compression;
      }
    }
    const double fp32_bytes = 4.0 * 23.5e6;  // this test's network is fp32
    if (std::string(compression) == "int8") {
      EXPECT_LT(reports[0].bytes_per_step, 0.26 * fp32_bytes);
      EXPECT_NE(reports[0].reduced_as.find("int8"), std::string::npos);
    } else {
      EXPECT_NEAR(reports[0].bytes_per_step, fp32_bytes, 0.02 * fp32_bytes);
    }
  }
}
