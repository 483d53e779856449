// The step graph on the GPU: CudaGraph's capture, in-place update, re-instantiation and failure
// (core/cuda_graph.h); the ring of per-step parameter blocks; and the whole training step replayed
// as a CUDA graph, bit for bit what the same steps give run eagerly with deterministic algorithms
// (train/step_graph.h, train/step.h). Every test skips without a GPU.
#include <gtest/gtest.h>

#include <cuda_fp16.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/cuda_graph.h"
#include "model/autotune_cache.h"
#include "model/training_network.h"
#include "support/gpu_test_util.h"
#include "train/counters.h"
#include "train/step.h"
#include "train/step_graph.h"
#include "train/weight_average.h"

namespace {

using ref::Vec;

std::vector<uint8_t> bytes_of(const void* device, size_t n) {
  std::vector<uint8_t> host(n);
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemcpy(host.data(), device, n, cudaMemcpyDeviceToHost));
  return host;
}

// ---- CudaGraph -----------------------------------------------------------------------------------

TEST(GpuCudaGraph, CapturesWithoutRunningThenReplaysAndUpdatesInPlace) {
  SKIP_WITHOUT_GPU("CUDA graph capture");
  Stream stream;
  constexpr size_t n = 4096;
  DeviceBuffer a(n, "graph test a"), b(n, "graph test b");
  CUDA_CHECK(cudaMemset(a.get(), 0, n));
  CUDA_CHECK(cudaMemset(b.get(), 0, n));
  int value = 1;
  auto two_nodes = [&] {
    CUDA_CHECK(cudaMemsetAsync(a.get(), value, n, stream));
    CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), n, cudaMemcpyDeviceToDevice, stream));
  };
  CudaGraph g;
  EXPECT_FALSE(g.ready());
  EXPECT_EQ(g.capture(stream, two_nodes), CudaGraph::Instantiation::New);
  EXPECT_TRUE(g.ready());
  EXPECT_EQ(g.nodes(), 2u);
  EXPECT_EQ(bytes_of(b.get(), n), std::vector<uint8_t>(n, 0)) << "capturing ran the work";

  g.launch(stream);
  EXPECT_EQ(bytes_of(b.get(), n), std::vector<uint8_t>(n, 1));
  g.launch(stream);  // a replay runs it again, with what was captured
  value = 7;
  EXPECT_EQ(bytes_of(b.get(), n), std::vector<uint8_t>(n, 1));

  EXPECT_EQ(g.capture(stream, two_nodes), CudaGraph::Instantiation::Updated) << "same nodes, another value";
  g.launch(stream);
  EXPECT_EQ(bytes_of(b.get(), n), std::vector<uint8_t>(n, 7));

  auto three_nodes = [&] {
    two_nodes();
    CUDA_CHECK(cudaMemsetAsync(a.get(), 9, n, stream));
  };
  EXPECT_EQ(g.capture(stream, three_nodes), CudaGraph::Instantiation::New) << "another topology";
  EXPECT_EQ(g.nodes(), 3u);
  value = 3;
  g.launch(stream);
  EXPECT_EQ(bytes_of(b.get(), n), std::vector<uint8_t>(n, 7)) << "the graph holds the value it was captured with";
  EXPECT_EQ(bytes_of(a.get(), n), std::vector<uint8_t>(n, 9));
}

TEST(GpuCudaGraph, AForbiddenCallFailsTheCaptureAndLeavesTheStreamUsable) {
  SKIP_WITHOUT_GPU("CUDA graph capture");
  Stream stream;
  constexpr size_t n = 256;
  DeviceBuffer a(n, "graph test a");
  CUDA_CHECK(cudaMemset(a.get(), 0, n));
  CudaGraph g;
  g.capture(stream, [&] { CUDA_CHECK(cudaMemsetAsync(a.get(), 1, n, stream)); });
  ASSERT_TRUE(g.ready());
  // A synchronisation inside a capture is what a library call that is not capture-safe would do.
  EXPECT_THROW(g.capture(stream,
                         [&] {
                           CUDA_CHECK(cudaMemsetAsync(a.get(), 2, n, stream));
                           CUDA_CHECK(cudaStreamSynchronize(stream));
                         }),
               GraphCaptureError);
  EXPECT_FALSE(g.ready()) << "the graph captured before must not be launched after a failed capture";
  cudaStreamCaptureStatus status;
  CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  EXPECT_EQ(status, cudaStreamCaptureStatusNone);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the failure's error was left for the next launch check";
  EXPECT_EQ(bytes_of(a.get(), n), std::vector<uint8_t>(n, 0)) << "work of the failed capture ran";
  CUDA_CHECK(cudaMemsetAsync(a.get(), 5, n, stream));
  EXPECT_EQ(bytes_of(a.get(), n), std::vector<uint8_t>(n, 5));
  EXPECT_THROW(g.launch(stream), Fatal);
}

// bin/train's step forks its weight gradients onto a second stream (OPT_WGRAD_STREAM). A capture
// that fails between a fork and its join must release that stream too: the step is then enqueued
// again eagerly, on both streams.
TEST(GpuCudaGraph, AFailedCaptureReleasesAStreamForkedFromIt) {
  SKIP_WITHOUT_GPU("CUDA graph capture");
  Stream stream, side(false);
  Event forked(false);
  constexpr size_t n = 256;
  DeviceBuffer a(n, "graph test a"), b(n, "graph test b");
  CUDA_CHECK(cudaMemset(b.get(), 0, n));
  CudaGraph g;
  for (const bool forbidden : {true, false}) {
    SCOPED_TRACE(forbidden ? "a forbidden call on the main stream" : "an exception before the join");
    auto fork_then_fail = [&] {
      CUDA_CHECK(cudaMemsetAsync(a.get(), 1, n, stream));
      forked.record(stream);
      CUDA_CHECK(cudaStreamWaitEvent(side, forked, 0));
      CUDA_CHECK(cudaMemsetAsync(b.get(), 3, n, side));
      if (forbidden) CUDA_CHECK(cudaStreamSynchronize(stream));
      throw InputError("not a capture problem");
    };
    if (forbidden) EXPECT_THROW(g.capture(stream, fork_then_fail), GraphCaptureError);
    else EXPECT_THROW(g.capture(stream, fork_then_fail), InputError);
    for (cudaStream_t s : {stream.get(), side.get()}) {
      cudaStreamCaptureStatus status;
      CUDA_CHECK(cudaStreamIsCapturing(s, &status));
      EXPECT_EQ(status, cudaStreamCaptureStatusNone) << (s == side.get() ? "the forked stream" : "the origin");
    }
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    // Both usable eagerly, with a fork and a join as the step makes them.
    CUDA_CHECK(cudaMemsetAsync(a.get(), 4, n, stream));
    forked.record(stream);
    CUDA_CHECK(cudaStreamWaitEvent(side, forked, 0));
    CUDA_CHECK(cudaMemsetAsync(b.get(), 6, n, side));
    Event joined(false);
    joined.record(side);
    CUDA_CHECK(cudaStreamWaitEvent(stream, joined, 0));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    EXPECT_EQ(bytes_of(b.get(), n), std::vector<uint8_t>(n, 6));
    CUDA_CHECK(cudaMemset(b.get(), 0, n));
  }
}

TEST(GpuCudaGraph, OtherExceptionsPassThroughAndEndTheCapture) {
  SKIP_WITHOUT_GPU("CUDA graph capture");
  Stream stream;
  DeviceBuffer a(64, "graph test a");
  CudaGraph g;
  EXPECT_THROW(g.capture(stream,
                         [&] {
                           CUDA_CHECK(cudaMemsetAsync(a.get(), 1, 64, stream));
                           throw InputError("not a capture problem");
                         }),
               InputError);
  cudaStreamCaptureStatus status;
  CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  EXPECT_EQ(status, cudaStreamCaptureStatusNone);
  CUDA_CHECK(cudaStreamSynchronize(stream));
}

// ---- the per-step parameter block ------------------------------------------------------------------

// The host enqueues steps ahead of the GPU: every step must still read its own parameters, also
// when the host has gone round the ring of pinned slots.
TEST(GpuStepParams, EveryStepReadsItsOwnBlockWhileTheHostRunsAhead) {
  SKIP_WITHOUT_GPU("the step parameter upload");
  Stream stream;
  StepParamsOnDevice params(stream);
  constexpr int kSteps = 20;  // more than the ring's slots
  DeviceBuffer seen(kSteps * sizeof(StepParams), "what each step saw");
  // Hold the stream back, so that the first uploads are all enqueued before any of them runs.
  CUDA_CHECK(cudaLaunchHostFunc(
      stream, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(200)); }, nullptr));
  const LrSchedule schedule{0.1, 0.0, 5, 50};
  for (int i = 0; i < kSteps; ++i) {
    params.upload(make_step_params(1000 + i, i % 7, schedule));
    CUDA_CHECK(cudaMemcpyAsync(seen.as<StepParams>() + i, params.device(), sizeof(StepParams),
                               cudaMemcpyDeviceToDevice, stream));
  }
  const std::vector<uint8_t> raw = bytes_of(seen.get(), seen.bytes());
  for (int i = 0; i < kSteps; ++i) {
    StepParams got;
    std::memcpy(&got, raw.data() + i * sizeof(StepParams), sizeof got);
    const StepParams want = make_step_params(1000 + i, i % 7, schedule);
    EXPECT_EQ(got.step, want.step) << "step " << i;
    EXPECT_EQ(got.lr, want.lr) << "step " << i;
    EXPECT_EQ(got.loss_slot, want.loss_slot) << "step " << i;
  }
}

// ---- the whole step: graph replay against eager execution ------------------------------------------

constexpr int kBatch = 8;
constexpr int kSteps = 7;
constexpr int kEvalAfter = 4;  // an evaluation pass after this many steps

// One training run on a network of its own, stepping through StepGraph exactly as the trainer does.
// With `ema` > 0 it keeps a weight average (--ema) and evaluates it, and `smoothing` is the loss's
// label smoothing.
struct TrainingRun {
  GpuContext ctx;
  AutotuneCache cache{"", "step graph test"};
  std::unique_ptr<TrainingNetwork> net;
  std::unique_ptr<WeightAverage> average;
  float smoothing;
  StepGraph graph;
  StepParamsOnDevice params{ctx.stream};
  DeviceBuffer images, labels, counters, history;

  TrainingRun(const NetConfig& cfg, bool graphs_on, float ema = 0.f, float smoothing = 0.f)
      : smoothing(smoothing), graph(ctx, cfg.batch, true, graphs_on) {
    net = std::make_unique<TrainingNetwork>(cfg, ctx, cache);
    net->init_params(11);
    if (ema > 0) {
      average = std::make_unique<WeightAverage>(net->params(), ema);
      average->start_from(net->params(), ctx.stream);
    }
    graph.drop_memsets_into(net->statistics_kept_zero());  // as the trainer does
    graph.hoist_memsets_from(net->zeroed_at_step_start());
    images = DeviceBuffer(size_t(cfg.batch) * 3 * cfg.image_side * cfg.image_side * dtype_size(cfg.dtype), "test images");
    labels = DeviceBuffer(size_t(cfg.batch) * sizeof(int32_t), "test labels");
    counters = DeviceBuffer(sizeof(DeviceCounters), "test counters");
    history = DeviceBuffer(kSteps * sizeof(float), "test loss history");
    const DeviceCounters init = initial_counters(cfg.dtype == DType::F16 ? 1024.f : 1.f);
    CUDA_CHECK(cudaMemcpy(counters.get(), &init, sizeof init, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(history.get(), 0xFF, history.bytes()));
  }

  DeviceCounters* c() const { return counters.as<DeviceCounters>(); }

  // Step i on batch i: the batch goes into the same buffers every step, as the loaders do.
  void step(int i, const std::vector<uint8_t>& image_bytes, const std::vector<int32_t>& y, const LrSchedule& s) {
    CUDA_CHECK(cudaMemcpy(images.get(), image_bytes.data(), image_bytes.size(), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(labels.get(), y.data(), y.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    params.upload(make_step_params(i, i, s));
    const DeviceBatch batch{images.get(), labels.as<int32_t>()};
    const StepTargets targets{&c()->train, &c()->scaler, params.device(), history.as<float>(),
                              average ? average->device() : nullptr};
    const StepSettings sgd{0.9f, 5e-4f, true, net->config().dtype == DType::F16, 1000, smoothing,
                           average ? static_cast<float>(average->decay()) : 0.f};
    graph.run(i, {kBatch, images.get(), labels.get()},
              [&] { enqueue_train_step(*net, batch, targets, sgd, ctx.stream); });
  }

  void evaluate() {
    const AveragedWeightsIn averaged(average.get(), net->params(), ctx.stream);
    net->forward(images.get(), false);
    net->loss(labels.as<int32_t>(), &c()->eval, nullptr, nullptr);
    graph.after_evaluation();
  }
};

// A random batch of normalized side x side pixels in the network's element type, and labels.
void make_batch(int i, DType t, int side, std::vector<uint8_t>& image_bytes, std::vector<int32_t>& y) {
  std::mt19937_64 rng(1234 + i);
  std::normal_distribution<float> pixel(0.f, 1.f);
  const size_t n = size_t(kBatch) * 3 * side * side;
  image_bytes.resize(n * dtype_size(t));
  for (size_t e = 0; e < n; ++e) {
    const float v = pixel(rng);
    if (t == DType::F32) {
      std::memcpy(image_bytes.data() + 4 * e, &v, 4);
    } else {
      const uint16_t h = gpu_test::half_bits(__float2half(v));
      std::memcpy(image_bytes.data() + 2 * e, &h, 2);
    }
  }
  y.resize(kBatch);
  for (int32_t& label : y) label = static_cast<int32_t>(rng() % 10);
}

struct GraphCase {
  const char* name;
  DType t;
  Layout l;
  ConvApi api;
  bool fused_bn = false;
  bool wgrad_beside = false;
};

// kSteps steps of both runs on the same batches at the learning rate `peak`, with an evaluation
// after kEvalAfter.
void train_side_by_side(TrainingRun& a, TrainingRun& b, DType t, double peak) {
  const LrSchedule schedule{peak, 0.0, kSteps, 2 * kSteps};
  std::vector<uint8_t> image_bytes;
  std::vector<int32_t> y;
  for (int i = 0; i < kSteps; ++i) {
    make_batch(i, t, a.net->config().image_side, image_bytes, y);
    a.step(i, image_bytes, y, schedule);
    b.step(i, image_bytes, y, schedule);
    if (i + 1 == kEvalAfter) {
      a.evaluate();
      b.evaluate();
    }
  }
}

// Every byte two runs leave (losses, weights, momentum, BN running statistics, loss totals and
// scaler) is the same.
void expect_same_bytes(const TrainingRun& eager, const TrainingRun& replayed) {
  const std::vector<uint8_t> losses = bytes_of(replayed.history.get(), replayed.history.bytes());
  EXPECT_EQ(losses, bytes_of(eager.history.get(), eager.history.bytes())) << "per-step losses";
  std::vector<float> l(kSteps);
  std::memcpy(l.data(), losses.data(), losses.size());
  for (int i = 0; i < kSteps; ++i) EXPECT_TRUE(std::isfinite(l[i])) << "step " << i << " logged no loss";
  EXPECT_NE(l[0], l[kSteps - 1]) << "the loss history does not follow the steps";

  ParamStore &pe = eager.net->params(), &pr = replayed.net->params();
  const size_t param_bytes = pe.total() * sizeof(float);
  EXPECT_TRUE(bytes_of(pr.master_all(), param_bytes) == bytes_of(pe.master_all(), param_bytes)) << "master weights";
  EXPECT_TRUE(bytes_of(pr.momentum_all(), param_bytes) == bytes_of(pe.momentum_all(), param_bytes)) << "momentum";
  const size_t running_bytes = eager.net->running_stats_count() * sizeof(float);
  EXPECT_TRUE(bytes_of(replayed.net->running_stats(), running_bytes) == bytes_of(eager.net->running_stats(), running_bytes))
      << "BN running statistics";
  EXPECT_TRUE(bytes_of(replayed.counters.get(), sizeof(DeviceCounters)) ==
              bytes_of(eager.counters.get(), sizeof(DeviceCounters)))
      << "loss totals and the loss scaler";
}

NetConfig deterministic_config(const GraphCase& gc) {
  NetConfig cfg;
  cfg.batch = kBatch;
  cfg.dtype = gc.t;
  cfg.layout = gc.l;
  cfg.tf32 = false;
  cfg.conv = {AlgoPolicy::Heuristic, true, size_t(256) << 20};  // deterministic algorithms, as --deterministic
  cfg.conv_api = gc.api;
  cfg.fused_bn = gc.fused_bn;
  cfg.wgrad_beside = gc.wgrad_beside;
  return cfg;
}

class GpuStepGraphReplay : public testing::TestWithParam<GraphCase> {};

TEST_P(GpuStepGraphReplay, EqualsEagerExecutionBitForBit) {
  SKIP_WITHOUT_GPU("the training step as a CUDA graph");
  const GraphCase gc = GetParam();
  const NetConfig cfg = deterministic_config(gc);
  TrainingRun eager(cfg, false), replayed(cfg, true);
  // A learning rate that changes every step: a graph that kept the captured one would drift.
  train_side_by_side(eager, replayed, gc.t, 0.05);
  EXPECT_EQ(eager.graph.plan().captures(), 0);
  EXPECT_EQ(replayed.graph.plan().captures(), 2) << "once after the warm-up, once after the evaluation";
  ASSERT_TRUE(replayed.graph.plan().enabled()) << "the capture failed (a warning says why)";
  expect_same_bytes(eager, replayed);
}

// The weight gradients on their own stream (OPT_WGRAD_STREAM) compute what one stream computes, bit
// for bit, eagerly and replayed as a graph of two branches, joined after each conv and running up to
// three blocks behind (LaggingWgrad, on by default): a weight gradient that read its output gradient
// after a data gradient had overwritten it, or a shared workspace, would not. The
// lane's own workspace is sized to the weight gradients' needs alone: one too small for any of them
// throws (ConvGraph::run and FusedConv::run check each call's need against what it is given), here
// for the plain weight gradients, in GpuStepGraphFused.ReplayOnTwoStreamsTracksEagerExecution for the
// fused ones.
TEST(GpuWgradStream, TrainsBitForBitAsOneStream) {
  SKIP_WITHOUT_GPU("the training step on two streams");
  for (const bool graphs : {false, true}) {
    SCOPED_TRACE(graphs ? "replayed as a CUDA graph" : "eager");
    GraphCase gc{"", DType::F16, Layout::NHWC, ConvApi::Graph};
    for (const bool lagging : {true, false}) {
      SCOPED_TRACE(lagging ? "the lane behind" : "the lane joined after each conv");
      TrainingRun one_stream(deterministic_config(gc), false);
      NetConfig two = deterministic_config(gc);
      two.wgrad_beside = true;
      if (!lagging) two.unfused_patterns = fused_pattern_bit(FusedPattern::LaggingWgrad);
      TrainingRun two_streams(two, graphs);
      EXPECT_EQ(two_streams.net->fusion_report().lagging_wgrad, lagging);
      train_side_by_side(one_stream, two_streams, gc.t, 0.05);
      if (graphs) {
        ASSERT_TRUE(two_streams.graph.plan().enabled()) << "the capture failed (a warning says why)";
      }
      expect_same_bytes(one_stream, two_streams);
    }
  }
}

// The recipe's ingredients in the step (--ema, --label-smoothing): the weight average is updated
// inside the captured graph, and a replayed run leaves every byte an eager one leaves, the average's
// included; the evaluation of the average gives the trained weights back; and each step's update is
// the CPU reference's, from the weights that step left.
TEST(GpuStepGraphRecipe, WeightAverageAndLabelSmoothingReplayBitForBit) {
  SKIP_WITHOUT_GPU("the training step with a weight average as a CUDA graph");
  const NetConfig cfg = deterministic_config({"", DType::F16, Layout::NHWC, ConvApi::Graph});
  TrainingRun eager(cfg, false, 0.9f, 0.1f), replayed(cfg, true, 0.9f, 0.1f);
  train_side_by_side(eager, replayed, cfg.dtype, 0.05);
  ASSERT_TRUE(replayed.graph.plan().enabled()) << "the capture failed (a warning says why)";
  expect_same_bytes(eager, replayed);
  const size_t n = eager.net->params().total();
  EXPECT_TRUE(bytes_of(replayed.average->device(), n * 4) == bytes_of(eager.average->device(), n * 4))
      << "the weight average";
  EXPECT_FALSE(bytes_of(replayed.average->device(), n * 4) == bytes_of(replayed.net->params().master_all(), n * 4))
      << "the average is the weights: it was not averaging";

  // One more step, replayed: average after = d * average before + (1 - d) * the weights after.
  std::vector<uint8_t> image_bytes;
  std::vector<int32_t> y;
  make_batch(kSteps, cfg.dtype, cfg.image_side, image_bytes, y);
  const std::vector<float> b = replayed.average->download();
  const Vec before(b.begin(), b.end());
  replayed.step(kSteps, image_bytes, y, {0.05, 0.0, kSteps, 2 * kSteps});
  std::vector<float> w(n);
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemcpy(w.data(), replayed.net->params().master_all(), n * 4, cudaMemcpyDeviceToHost));
  Vec want = before;
  ref::ema_update(want, Vec(w.begin(), w.end()), ema_decay_at(0.9f, kSteps));
  const std::vector<float> got = replayed.average->download();
  EXPECT_CLOSE(Vec(got.begin(), got.end()), want, 1e-6) << "the update of a replayed step";
}

// The fused network of bin/train, at batch 8.
NetConfig fused_config(int side = 32) {
  NetConfig cfg;
  cfg.batch = kBatch;
  cfg.image_side = side;
  cfg.dtype = DType::F16;
  cfg.layout = Layout::NHWC;
  cfg.tf32 = false;
  cfg.conv = {AlgoPolicy::Heuristic, false, size_t(256) << 20};
  cfg.conv_api = ConvApi::Graph;
  cfg.fused_bn = true;
  return cfg;
}

// bin/train's network (batch norm fused, which --deterministic turns off): its replayed graph lacks
// cuDNN's memsets of the fused convs' statistics, which bn_finalize_sums and the evaluation leave
// zero, and zeroes the fused patterns' workspaces and the BN gradients they accumulate at its start.
// Fused runs differ in their last bits from run to run, so the replay is held to the eager run's
// losses within rounding; with a learning rate of 0 the weights stay put (at 0.05 this tiny
// batch diverges within a few steps, and the two runs' rounding differences with it), so every
// step's loss and BN statistics depend on its batch alone: statistics accumulated over two steps, or
// not zeroed after the evaluation, would move them far more.
// The same with the weight gradients on their own stream in the replayed run (bin/train's step): the
// fused weight-gradient patterns then run beside the fused data-gradient patterns; and that step at
// --image-size 28, whose stages (28, 14, 7, 4) do not all halve evenly; and bin/train's own patterns
// (`unfused`: its default --no-fuse, where conv2 and conv3 read the stored relu(bn(x)) and the
// evaluation runs conv2's stored path too).
void fused_replay_tracks_eager(bool wgrad_beside, int side = 32, unsigned unfused = 0) {
  NetConfig cfg = fused_config(side);
  cfg.unfused_patterns = unfused;
  TrainingRun eager(cfg, false);
  cfg.wgrad_beside = wgrad_beside;
  TrainingRun replayed(cfg, true);
  if (eager.net->fusion_report().fused == 0) GTEST_SKIP() << "cuDNN fused no conv here: no statistics to keep zero";
  train_side_by_side(eager, replayed, cfg.dtype, 0.0);  // the evaluation's forward writes the sums too
  ASSERT_TRUE(replayed.graph.plan().enabled()) << "the capture failed (a warning says why)";
  EXPECT_GT(replayed.graph.memsets_dropped(), 0u) << "cuDNN's memsets of the statistics were not found";
  EXPECT_GT(replayed.graph.memsets_hoisted(), 0u) << "no memset into the fused patterns' workspaces was moved";
  std::vector<float> le(kSteps), lr(kSteps);
  CUDA_CHECK(cudaMemcpy(le.data(), eager.history.get(), kSteps * sizeof(float), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(lr.data(), replayed.history.get(), kSteps * sizeof(float), cudaMemcpyDeviceToHost));
  for (int i = 0; i < kSteps; ++i) {
    ASSERT_TRUE(std::isfinite(le[i]) && std::isfinite(lr[i])) << "step " << i;
    EXPECT_NEAR(lr[i], le[i], 1e-2 * std::fabs(le[i])) << "step " << i;
  }
  EXPECT_NE(le[0], le[1]) << "the steps should see different batches";
  const size_t n = eager.net->running_stats_count();
  std::vector<float> re(n), rr(n);
  CUDA_CHECK(cudaMemcpy(re.data(), eager.net->running_stats(), n * sizeof(float), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(rr.data(), replayed.net->running_stats(), n * sizeof(float), cudaMemcpyDeviceToHost));
  EXPECT_CLOSE(ref::Vec(rr.begin(), rr.end()), ref::Vec(re.begin(), re.end()), 1e-2) << "BN running statistics";
}

// What a poisoning test fills before a replay: the BN weight gradients the fused data gradients
// accumulate into, or the arena of the fused patterns' cuDNN workspaces.
enum class Poisoned { AccumulatedGradients, Workspaces };

// The memsets the replayed graph runs at its start still zero what the fused patterns then read
// back: with that memory filled with 0x7F bytes (3.4e38 as floats) before a replay, the replay of the
// same batch on the same weights (learning rate 0) gives gradients finite and of the size they were,
// and, where the workspaces were filled, the loss it gave before. Sizes, not values: fused runs
// differ from run to run in their rounding, and this network at its initial weights moves its
// gradients by about half under rounding-sized changes; garbage added in would move them by orders
// of magnitude, or to infinity.
void replay_after_poisoning(Poisoned what) {
  const NetConfig cfg = fused_config();
  TrainingRun run(cfg, true);
  if (run.net->fusion_report().fused == 0) GTEST_SKIP() << "cuDNN fused no conv here";
  const LrSchedule schedule{0.0, 0.0, kSteps, 2 * kSteps};
  std::vector<uint8_t> image_bytes;
  std::vector<int32_t> y;
  make_batch(0, cfg.dtype, cfg.image_side, image_bytes, y);
  for (int i = 0; i < 4; ++i) run.step(i, image_bytes, y, schedule);  // eager, eager, captured, replayed
  ASSERT_TRUE(run.graph.plan().enabled()) << "the capture failed (a warning says why)";
  ASSERT_GT(run.graph.memsets_hoisted(), 0u);
  const ParamStore& p = run.net->params();
  const size_t nv = p.total() - p.weight_count();
  const auto* first = reinterpret_cast<const char*>(p.vector_grads_all());
  auto largest_gradient = [&] {
    std::vector<float> g(nv);
    CUDA_CHECK(cudaMemcpy(g.data(), p.vector_grads_all(), nv * sizeof(float), cudaMemcpyDeviceToHost));
    float m = 0;
    for (float v : g) m = std::isfinite(v) ? std::max(m, std::fabs(v)) : INFINITY;
    return m;
  };
  auto loss_of_step = [&](int i) {
    float l = 0;
    CUDA_CHECK(cudaMemcpy(&l, run.history.as<float>() + i, sizeof l, cudaMemcpyDeviceToHost));
    return l;
  };
  CUDA_CHECK(cudaDeviceSynchronize());
  const float before = largest_gradient();
  int poisoned = 0;
  for (const ZeroedRange& r : run.net->zeroed_at_step_start()) {
    const auto* b = static_cast<const char*>(r.begin);
    const bool gradient = b >= first && b + r.bytes <= first + nv * sizeof(float);
    if (gradient != (what == Poisoned::AccumulatedGradients)) continue;
    CUDA_CHECK(cudaMemset(const_cast<void*>(r.begin), 0x7F, r.bytes));
    ++poisoned;
  }
  ASSERT_GT(poisoned, 0) << (what == Poisoned::Workspaces ? "no workspace" : "no BN gradient")
                         << " is zeroed at the step's start";
  run.step(4, image_bytes, y, schedule);  // replayed, the same batch and weights
  CUDA_CHECK(cudaDeviceSynchronize());
  const float after = largest_gradient();
  EXPECT_GT(before, 0.f);
  EXPECT_TRUE(std::isfinite(after)) << "a gradient is not finite after the replay";
  EXPECT_LT(after, 4 * before) << "the replay added to what was there (largest gradient before: " << before << ")";
  EXPECT_GT(after, before / 4) << "the gradients shrank (largest before: " << before << ")";
  if (what != Poisoned::Workspaces) return;  // the forward reads no gradient: its loss cannot move
  const float l3 = loss_of_step(3), l4 = loss_of_step(4);
  ASSERT_TRUE(std::isfinite(l3) && std::isfinite(l4)) << l3 << " " << l4;
  EXPECT_NEAR(l4, l3, 1e-2 * std::fabs(l3)) << "the replay's loss moved";
}

TEST(GpuStepGraphFused, AReplayZeroesTheGradientsItsPatternsAccumulate) {
  SKIP_WITHOUT_GPU("the training step as a CUDA graph");
  replay_after_poisoning(Poisoned::AccumulatedGradients);
}

TEST(GpuStepGraphFused, AReplayZeroesWhatItsPatternsReadBackFromTheirWorkspaces) {
  SKIP_WITHOUT_GPU("the training step as a CUDA graph");
  replay_after_poisoning(Poisoned::Workspaces);
}

TEST(GpuStepGraphFused, ReplayWithoutTheStatisticsMemsetsTracksEagerExecution) {
  SKIP_WITHOUT_GPU("the training step as a CUDA graph");
  fused_replay_tracks_eager(false);
}

TEST(GpuStepGraphFused, ReplayOnTwoStreamsTracksEagerExecution) {
  SKIP_WITHOUT_GPU("the training step as a CUDA graph on two streams");
  fused_replay_tracks_eager(true);
}

TEST(GpuStepGraphFused, ReplayAtSide28TracksEagerExecution) {
  SKIP_WITHOUT_GPU("the training step at 28x28 as a CUDA graph on two streams");
  fused_replay_tracks_eager(true, 28);
}

TEST(GpuStepGraphFused, ReplayWithBinTrainsDefaultPatternsTracksEagerExecution) {
  SKIP_WITHOUT_GPU("bin/train's training step as a CUDA graph on two streams");
  fused_replay_tracks_eager(true, 32, default_unfused_patterns(true));
}

INSTANTIATE_TEST_SUITE_P(Builds, GpuStepGraphReplay,
                         testing::Values(GraphCase{"fp16_NHWC_graph_api", DType::F16, Layout::NHWC, ConvApi::Graph},
                                         GraphCase{"fp16_NHWC_fused_bn", DType::F16, Layout::NHWC, ConvApi::Graph, true},
                                         GraphCase{"fp32_NCHW_legacy_api", DType::F32, Layout::NCHW, ConvApi::Legacy}),
                         [](const testing::TestParamInfo<GraphCase>& i) { return std::string(i.param.name); });

}  // namespace
