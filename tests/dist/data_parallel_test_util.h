// What the data-parallel GPU tests share: bin/train's network configurations on a small batch, a
// Replica (one network with a half-batch of its own and a forward-loss-backward, its gradients read
// back), random half-batches, and a body run as ranks 0 and 1 on two threads and two GPUs.
// Header-only (inline), so each test file includes it and nothing changes in the Makefile.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <future>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/handles.h"
#include "dist/data_parallel.h"
#include "dist/socket.h"
#include "kernels/cast.h"
#include "model/autotune_cache.h"
#include "model/training_network.h"
#include "support/gpu_test_util.h"

namespace data_parallel_test {

constexpr int kHalf = 4;          // images per rank
constexpr uint64_t kSeed = 77;

inline NetConfig net_config(int batch) {
  NetConfig cfg;
  cfg.batch = batch;
  cfg.dtype = DType::F32;
  cfg.layout = Layout::NCHW;
  cfg.tf32 = false;
  cfg.conv = {AlgoPolicy::Heuristic, /*deterministic=*/true, size_t(256) << 20};
  cfg.conv_api = ConvApi::Legacy;
  cfg.data_parallel = true;  // the replicas report gradients as written: no lagging weight gradients
  return cfg;
}

// bin/train's network: fp16, NHWC, the graph API, batch norm fused into the convolutions (its
// backward reports gradients from other places than the unfused one).
inline NetConfig fused_config(int batch) {
  NetConfig cfg = net_config(batch);
  cfg.dtype = DType::F16;
  cfg.layout = Layout::NHWC;
  cfg.conv = {AlgoPolicy::Heuristic, /*deterministic=*/false, size_t(256) << 20};
  cfg.conv_api = ConvApi::Graph;
  cfg.fused_bn = true;
  return cfg;
}

// The same with the weight gradients on their own stream: bin/train's step (OPT_WGRAD_STREAM).
inline NetConfig with_wgrad_stream(NetConfig cfg) {
  cfg.wgrad_beside = true;
  return cfg;
}

inline int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

#define SKIP_WITHOUT_TWO_GPUS()                                                    \
  do {                                                                             \
    SKIP_WITHOUT_GPU("data-parallel training");                                    \
    if (data_parallel_test::device_count() < 2)                                    \
      GTEST_SKIP() << "needs 2 CUDA devices: two ranks run on two GPUs (found 1)"; \
  } while (0)

// The two half-batches: random images, labels 0..9.
struct Batch {
  std::vector<float> images;
  std::vector<int32_t> labels;
};
inline Batch make_batch(int n) {
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

inline void meet_on_a_free_port() {
  const int port = local_port(listen_on(0));
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
}

inline Fingerprint test_fingerprint() {
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

}  // namespace data_parallel_test
