// Data parallelism on the GPU (dist/data_parallel.h). On one GPU: the real backward reports every
// parameter's gradient exactly once, and all buckets but the last go before backward ends; gradient
// accumulation (dist/grad_accumulation.h) sums micro-batches as NCCL averages ranks, bit for bit. On
// two GPUs (two ranks as two threads of this process, each with its own device and NCCL rank): a
// step gives, on both ranks and bit for bit the same, the average of the gradients one process
// computes for the two half-batches separately; overlapped, naive, fp16-reduced and int8-compressed;
// in fp32 exactly what one process accumulating the two halves holds, with or without accumulation
// on the ranks too; the all-reduce's clock counts every measured step; and the collectives outside
// the step (broadcast, averages, summed counters, the stop vote) do what they say.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/handles.h"
#include "dist/buckets.h"
#include "dist/data_parallel.h"
#include "dist/grad_accumulation.h"
#include "dist/socket.h"
#include "kernels/cast.h"
#include "model/autotune_cache.h"
#include "model/training_network.h"
#include "support/gpu_test_util.h"

namespace {

constexpr int kHalf = 4;          // images per rank
constexpr uint64_t kSeed = 77;

NetConfig net_config(int batch) {
  NetConfig cfg;
  cfg.batch = batch;
  cfg.dtype = DType::F32;
  cfg.layout = Layout::NCHW;
  cfg.tf32 = false;
  cfg.conv = {AlgoPolicy::Heuristic, /*deterministic=*/true, size_t(256) << 20};
  cfg.conv_api = ConvApi::Legacy;
  return cfg;
}

// bin/train's network: fp16, NHWC, the graph API, batch norm fused into the convolutions (its
// backward reports gradients from other places than the unfused one).
NetConfig fused_config(int batch) {
  NetConfig cfg = net_config(batch);
  cfg.dtype = DType::F16;
  cfg.layout = Layout::NHWC;
  cfg.conv = {AlgoPolicy::Heuristic, /*deterministic=*/false, size_t(256) << 20};
  cfg.conv_api = ConvApi::Graph;
  cfg.fused_bn = true;
  return cfg;
}

// The same with the weight gradients on their own stream: bin/train's step (OPT_WGRAD_STREAM).
NetConfig with_wgrad_stream(NetConfig cfg) {
  cfg.wgrad_beside = true;
  return cfg;
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

#define SKIP_WITHOUT_TWO_GPUS()                                                                         \
  do {                                                                                                  \
    SKIP_WITHOUT_GPU("data-parallel training");                                                         \
    if (device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices: two ranks run on two GPUs (found 1)"; \
  } while (0)

// The two half-batches: random images, labels 0..9.
struct Batch {
  std::vector<float> images;
  std::vector<int32_t> labels;
};
Batch make_batch(int n) {
  auto rng = gpu_test::test_rng("batch");
  Batch b;
  for (double v : gpu_test::random_normal(rng, size_t(n) * 3 * 32 * 32)) b.images.push_back(static_cast<float>(v));
  for (int i = 0; i < n; ++i) b.labels.push_back(i % 10);
  return b;
}

struct Counters {
  LossTotals totals;
  float scale;
};

// One network on the current device, with a half-batch of its own and a forward-loss-backward.
struct Replica {
  GpuContext ctx;
  AutotuneCache cache{"", "data-parallel test"};
  TrainingNetwork net;
  DeviceBuffer images{size_t(kHalf) * 3 * 32 * 32 * 4, "test images"}, labels{size_t(kHalf) * 4, "test labels"};
  DeviceBuffer counters{sizeof(Counters), "test counters"};

  explicit Replica(const NetConfig& cfg = net_config(kHalf)) : net(cfg, ctx, cache) { net.init_params(kSeed); }
  // Images in the network's type and layout (NCHW given; the NHWC test feeds them as they are: only
  // the gradient hook is tested there, not values).
  void load_half(const Batch& b, int half) {
    const size_t per = size_t(kHalf) * 3 * 32 * 32;
    if (net.config().dtype == DType::F16) {
      std::vector<float> h(b.images.begin() + per * half, b.images.begin() + per * (half + 1));
      DeviceBuffer f32(per * 4, "fp32 images");
      CUDA_CHECK(cudaMemcpy(f32.get(), h.data(), per * 4, cudaMemcpyHostToDevice));
      cast_f32_to_f16(f32.as<float>(), images.get(), per, ctx.stream);
      CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
    } else {
      CUDA_CHECK(cudaMemcpy(images.get(), b.images.data() + per * half, per * 4, cudaMemcpyHostToDevice));
    }
    CUDA_CHECK(cudaMemcpy(labels.get(), b.labels.data() + kHalf * half, kHalf * 4, cudaMemcpyHostToDevice));
    Counters c{};
    c.totals.first_bad_step = -1;
    c.scale = 1.f;
    CUDA_CHECK(cudaMemcpy(counters.get(), &c, sizeof(c), cudaMemcpyHostToDevice));
  }
  void forward_backward() {
    Counters* c = counters.as<Counters>();
    net.forward(images.get(), true);
    net.loss(labels.as<int32_t>(), &c->totals, &c->scale, 0);
    net.backward();
  }
  // Weight gradients then vector gradients, exactly as they are stored (fp16 weight gradients widened).
  std::vector<double> gradients_exact() {
    CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
    const ParamStore& p = net.params();
    std::vector<double> out;
    if (p.act() == DType::F16) {
      std::vector<__half> w(p.weight_count());
      CUDA_CHECK(cudaMemcpy(w.data(), p.weight_grads_all(), w.size() * 2, cudaMemcpyDeviceToHost));
      for (const __half& h : w) out.push_back(__half2float(h));
    } else {
      std::vector<float> w(p.weight_count());
      CUDA_CHECK(cudaMemcpy(w.data(), p.weight_grads_all(), w.size() * 4, cudaMemcpyDeviceToHost));
      out.assign(w.begin(), w.end());
    }
    std::vector<float> v(p.total() - p.weight_count());
    CUDA_CHECK(cudaMemcpy(v.data(), p.vector_grads_all(), v.size() * 4, cudaMemcpyDeviceToHost));
    out.insert(out.end(), v.begin(), v.end());
    return out;
  }
  // Weight gradients then vector gradients, as doubles.
  std::vector<double> gradients() {
    CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
    const ParamStore& p = net.params();
    std::vector<float> g(p.total());
    CUDA_CHECK(cudaMemcpy(g.data(), p.weight_grads_all(), p.weight_count() * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(g.data() + p.weight_count(), p.vector_grads_all(), (p.total() - p.weight_count()) * 4,
                          cudaMemcpyDeviceToHost));
    return std::vector<double>(g.begin(), g.end());
  }
};

void meet_on_a_free_port() {
  const int port = local_port(listen_on(0));
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
}

Fingerprint test_fingerprint() {
  Fingerprint f;
  f.add("test", "data parallel");
  return f;
}

// Runs `body` as ranks 0 and 1, each on its own thread and GPU; returns what each returned, or
// fails the test with the exception a rank threw.
template <class T>
std::vector<T> on_two_ranks(const DataParallelConfig& cfg, std::function<T(DataParallel&, Replica&)> body,
                            const NetConfig& net = net_config(kHalf)) {
  meet_on_a_free_port();
  std::vector<std::future<T>> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.push_back(std::async(std::launch::async, [r, &cfg, &body, &net] {
      DataParallel dp(LaunchInfo{r, 2, r, "test"}, test_fingerprint(), cfg);
      Replica rep(net);
      dp.attach(rep.net.params(), rep.ctx.stream);
      rep.net.on_grad_ready = [&dp](int t) { dp.on_grad_ready(t); };
      return body(dp, rep);
    }));
  std::vector<T> out;
  for (auto& f : ranks) out.push_back(f.get());
  return out;
}

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

// ---- gradient accumulation ----------------------------------------------------------------------

// Weight then vector gradients as the floats they are (fp16 weights widened exactly).
std::vector<float> float_gradients(Replica& rep) {
  const std::vector<double> g = rep.gradients_exact();
  return std::vector<float>(g.begin(), g.end());
}

// sums = g0 / n + g1 / n + ... in this order, each product and sum rounded once in fp32, then
// rounded to the weights' type: what GradAccumulation computes, written out on the host.
std::vector<float> premul_sum(const std::vector<std::vector<float>>& parts, size_t n_weights, DType weights) {
  const float s = 1.f / static_cast<float>(parts.size());
  std::vector<float> out(parts[0].size());
  for (size_t i = 0; i < out.size(); ++i) {
    float acc = parts[0][i] * s;
    for (size_t k = 1; k < parts.size(); ++k) {
      const float term = parts[k][i] * s;
      acc = acc + term;
    }
    out[i] = i < n_weights && weights == DType::F16 ? __half2float(__float2half(acc)) : acc;
  }
  return out;
}

struct AccumulationCase {
  const char* name;
  NetConfig cfg;
  int micro_batches;
};
void PrintTo(const AccumulationCase& c, std::ostream* os) { *os << c.name; }
class Accumulation : public testing::TestWithParam<AccumulationCase> {};

// One GPU: N micro-batches through forward and backward, each one's gradients read back as backward
// left them, then added (or, the last, folded): the result is their 1/N-scaled sum in micro-batch
// order, bit for bit, in fp32 and with bin/train's fp16 fused network (rounded to fp16 once at the
// end). With N = 2 in fp32 that is NCCL's ncclAvg of two ranks (a premultiplied sum of two terms).
TEST_P(Accumulation, MicroBatchesSumAsNcclAveragesRanks) {
  SKIP_WITHOUT_GPU("gradient accumulation");
  const AccumulationCase c = GetParam();
  Replica rep(c.cfg);
  GradAccumulation sums(rep.net.params(), c.micro_batches);
  const Batch batch = make_batch(c.micro_batches * kHalf);
  std::vector<std::vector<float>> parts;
  for (int j = 0; j < c.micro_batches; ++j) {
    const MicroBatch m{j, c.micro_batches};
    rep.load_half(batch, j);
    rep.forward_backward();
    parts.push_back(float_gradients(rep));
    if (!m.last()) sums.add(m, rep.ctx.stream);
    else sums.finish_all(rep.ctx.stream);
  }
  const ParamStore& p = rep.net.params();
  const std::vector<float> got = float_gradients(rep);
  const std::vector<float> want = premul_sum(parts, p.weight_count(), p.act());
  size_t differ = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (std::memcmp(&got[i], &want[i], 4) != 0 && differ++ < 3)
      ADD_FAILURE() << "gradient " << i << ": " << got[i] << ", want " << want[i];
  EXPECT_EQ(differ, 0u);
}

INSTANTIATE_TEST_SUITE_P(OneGpu, Accumulation,
                         testing::Values(AccumulationCase{"fp32_2", net_config(kHalf), 2},
                                         AccumulationCase{"fp32_4", net_config(kHalf), 4},
                                         AccumulationCase{"fused_fp16_3", fused_config(kHalf), 3}),
                         [](const auto& info) { return std::string(info.param.name); });

// The equality `--accumulate 2` on one GPU and `--gpus 2` rest on: in fp32, two ranks' averaged
// gradients are bit for bit those of one process accumulating the same two halves. And with each of
// the two ranks accumulating two micro-batches (its sums folded into each bucket before the
// all-reduce), the ranks hold (q00/2 + q01/2)/2 + (q10/2 + q11/2)/2, bit for bit.
TEST(AccumulationGpu, EqualsTwoRanksBitForBitInFp32) {
  SKIP_WITHOUT_TWO_GPUS();
  const Batch batch = make_batch(4 * kHalf);
  // slice k of the 4 x kHalf images: rank r's micro-batch j is slice j * 2 + r (grad_accumulation.h)
  std::vector<std::vector<float>> slice(4);
  size_t n_weights = 0;
  CUDA_CHECK(cudaSetDevice(0));
  {
    Replica one;
    n_weights = one.net.params().weight_count();
    for (int k = 0; k < 4; ++k) {
      one.load_half(batch, k);
      one.forward_backward();
      slice[k] = float_gradients(one);
    }
  }
  // plain two-rank step on slices 0 and 1, against one process accumulating them
  const std::vector<std::vector<double>> plain = on_two_ranks<std::vector<double>>(
      DataParallelConfig{0.5, 0.1, "", true, 60}, [&batch](DataParallel& dp, Replica& rep) {
        rep.load_half(batch, dp.rank());
        rep.forward_backward();
        dp.check_step();
        return rep.gradients_exact();
      });
  const std::vector<float> two = premul_sum({slice[0], slice[1]}, n_weights, DType::F32);
  EXPECT_EQ(plain[0], std::vector<double>(two.begin(), two.end())) << "two ranks vs one process accumulating";
  // each rank accumulating two micro-batches
  const std::vector<std::vector<double>> accumulated = on_two_ranks<std::vector<double>>(
      DataParallelConfig{0.5, 0.1, "", true, 60}, [&batch](DataParallel& dp, Replica& rep) {
        GradAccumulation sums(rep.net.params(), 2);
        dp.attach(rep.net.params(), rep.ctx.stream, &sums);
        for (int j = 0; j < 2; ++j) {
          const MicroBatch m{j, 2};
          dp.begin_micro_batch(m);
          rep.load_half(batch, j * 2 + dp.rank());
          rep.forward_backward();
          if (!m.last()) sums.add(m, rep.ctx.stream);
        }
        dp.check_step();
        return rep.gradients_exact();
      });
  EXPECT_EQ(accumulated[0], accumulated[1]) << "the ranks hold different averaged gradients";
  const std::vector<float> rank0 = premul_sum({slice[0], slice[2]}, n_weights, DType::F32);
  const std::vector<float> rank1 = premul_sum({slice[1], slice[3]}, n_weights, DType::F32);
  const std::vector<float> want = premul_sum({rank0, rank1}, n_weights, DType::F32);
  EXPECT_EQ(accumulated[0], std::vector<double>(want.begin(), want.end()));
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
