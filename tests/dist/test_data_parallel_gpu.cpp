// Data parallelism on the GPU (dist/data_parallel.h). On one GPU: the real backward reports every
// parameter's gradient exactly once, and all buckets but the last go before backward ends. On two
// GPUs (two ranks as two threads of this process, each with its own device and NCCL rank): a step
// gives, on both ranks and bit for bit the same, the average of the gradients one process computes
// for the two half-batches separately; overlapped, naive and fp16-reduced; and the collectives
// outside the step (broadcast, averages, summed counters, the stop vote) do what they say.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <functional>
#include <future>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/handles.h"
#include "dist/buckets.h"
#include "dist/data_parallel.h"
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
  // fp32 reduce: the averaging's own rounding; fp16: each gradient rounded to fp16 on the way.
  EXPECT_CLOSE(got[0], want, cfg.reduce_type == "fp16" ? 2e-3 : 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Modes, TwoRankStep,
                         testing::Values(StepMode{"overlapped, small buckets", DataParallelConfig{0.5, 0.1, "", true, 60}},
                                         StepMode{"overlapped, default buckets", DataParallelConfig{25, 1, "", true, 60}},
                                         StepMode{"naive, one bucket", DataParallelConfig{25, 1, "", false, 60}},
                                         StepMode{"fp16 reduce", DataParallelConfig{25, 1, "fp16", true, 60}},
                                         StepMode{"overlapped, small buckets, weight gradients on their own stream",
                                                  DataParallelConfig{0.5, 0.1, "", true, 60}, true}),
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
