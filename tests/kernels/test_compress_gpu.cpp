// int8 gradient compression with error feedback (kernels/compress.cu) against a CPU reference written
// here from compress.h's description, bit for bit: the chunk maxima, the int8 values, the residuals
// and the dequantized average, for 2 and 4 ranks simulated on one GPU (the host plays NCCL: ncclMax
// of the maxima, ncclSum of the int8 values), in fp32 and fp16, over several steps that carry the
// residuals. Then what error feedback is for: the same gradient sent 40 times arrives 40 times,
// short by at most one quantization step (without the residuals the shortfall grows with the
// steps); an overflow on one rank skips its chunk on every rank and keeps the residuals; and the
// residuals do not depend on the loss scale. GPU tests skip without a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/compress.h"
#include "support/gpu_test_util.h"

namespace {

using namespace gpu_test;

constexpr int kChunk = 1024;
constexpr float kInf = std::numeric_limits<float>::infinity();

// ---- the CPU reference: every operation one float operation, in compress.h's order --------------
float ref_e(float g, float r, float s) {
  const float rs = r * s;
  return g + rs;
}

std::vector<float> ref_absmax(const std::vector<float>& g, const std::vector<float>& r, float s, int chunk) {
  std::vector<float> m((g.size() + chunk - 1) / chunk, 0.f);
  for (size_t i = 0; i < g.size(); ++i) {
    const float e = ref_e(g[i], r[i], s);
    const float a = std::isnan(e) ? kInf : std::fabs(e);
    if (a > m[i / chunk]) m[i / chunk] = a;
  }
  return m;
}

// Returns the int8 values; updates the residuals.
std::vector<int> ref_quantize(const std::vector<float>& g, std::vector<float>& r, float s, const std::vector<float>& max,
                              int levels, int chunk) {
  const float l = static_cast<float>(levels);
  std::vector<int> q(g.size(), 0);
  for (size_t i = 0; i < g.size(); ++i) {
    const float m = max[i / chunk];
    if (!std::isfinite(m)) continue;  // nothing sent, the residual stays
    const float step = m / l;
    const float e = ref_e(g[i], r[i], s);
    float v = 0.f;
    if (step > 0.f) v = std::min(std::max(std::nearbyint(e / step), -l), l);
    q[i] = static_cast<int>(v);
    const float back = v * step;
    const float diff = e - back;
    r[i] = diff / s;
  }
  return q;
}

std::vector<float> ref_dequantize(const std::vector<int>& sum, const std::vector<float>& max, int levels, int world,
                                  int chunk) {
  std::vector<float> out(sum.size());
  for (size_t i = 0; i < sum.size(); ++i) {
    const float m = max[i / chunk];
    if (!std::isfinite(m)) {
      out[i] = std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    const float step = m / static_cast<float>(levels);
    const float scaled = static_cast<float>(sum[i]) * step;
    out[i] = step > 0.f ? scaled / static_cast<float>(world) : 0.f;
  }
  return out;
}

// A float as type t stores it.
float stored(DType t, float v) { return t == DType::F32 ? v : __half2float(__float2half(v)); }

bool same_bits(float a, float b) {
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y || (std::isnan(a) && std::isnan(b));
}

// Counts (and reports the first few) elements whose bits differ.
size_t bit_mismatches(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (!same_bits(got[i], want[i]) && bad++ < 3)
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i];
  return bad;
}

std::vector<float> to_floats(const ref::Vec& v) { return std::vector<float>(v.begin(), v.end()); }
ref::Vec to_doubles(const std::vector<float>& v) { return ref::Vec(v.begin(), v.end()); }

std::vector<float> download_floats(const DeviceBuffer& b, size_t n) {
  std::vector<float> h(n);
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemcpy(h.data(), b.get(), n * 4, cudaMemcpyDeviceToHost));
  return h;
}
void upload_floats(DeviceBuffer& b, const std::vector<float>& h) {
  CUDA_CHECK(cudaMemcpy(b.get(), h.data(), h.size() * 4, cudaMemcpyHostToDevice));
}

// One rank's state on the GPU: its gradients (type t), its residuals, its int8 values.
struct RankOnGpu {
  DeviceTensor grads;
  DeviceBuffer residual, q;
  RankOnGpu(size_t n, DType t) : grads(n, t), residual(n * 4, "residuals"), q(n, "int8 values") {}
};

// The ranks' step as DataParallel enqueues it, with the host in NCCL's place. Returns the averaged
// gradients as rank 0 holds them (every rank computes the same).
struct Simulated {
  DType t;
  int world, levels;
  size_t n;
  std::vector<RankOnGpu> ranks;
  DeviceBuffer maxima, scale;
  Simulated(DType t_, int world_, size_t n_, float loss_scale)
      : t(t_), world(world_), levels(int8_levels(world_)), n(n_),
        maxima(((n_ + kChunk - 1) / kChunk) * 4, "chunk maxima"), scale(4, "loss scale") {
    for (int r = 0; r < world; ++r) ranks.emplace_back(n, t);
    CUDA_CHECK(cudaMemcpy(scale.get(), &loss_scale, 4, cudaMemcpyHostToDevice));
  }
  size_t chunks() const { return (n + kChunk - 1) / kChunk; }
};

struct Case {
  DType t;
  int world;
};
void PrintTo(const Case& c, std::ostream* os) { *os << dtype_name(c.t) << "_" << c.world << "_ranks"; }
class Int8RoundTrip : public testing::TestWithParam<Case> {};

TEST_P(Int8RoundTrip, EveryStageMatchesTheCpuBitForBitOverSteps) {
  SKIP_WITHOUT_GPU("the int8 compression kernels");
  const auto [t, world] = GetParam();
  cudaStream_t stream = ctx().stream;
  const size_t n = 5 * kChunk + 77;  // a short last chunk
  const float s = t == DType::F16 ? 16.f : 1.f;  // fp16 gradients carry a loss scale
  Simulated sim(t, world, n, s);
  std::mt19937_64 rng = test_rng();
  std::vector<std::vector<float>> res(world, std::vector<float>(n));
  for (auto& r : res) r = to_floats(random_normal(rng, n, 0.0, 1e-3));
  std::vector<std::vector<float>> res_before = res;
  for (int step = 0; step < 3; ++step) {
    // Chunks of very different magnitudes, an all-zero chunk (with zero residuals: it sends zeros),
    // and one large outlier.
    std::vector<std::vector<float>> g(world);
    for (int r = 0; r < world; ++r) {
      g[r] = to_floats(random_normal(rng, n, 0.0, 1.0));
      for (size_t i = 0; i < n; ++i) {
        const size_t c = i / kChunk;
        g[r][i] = c == 3 ? 0.f : stored(t, g[r][i] * s * std::pow(4.f, float(c) - 2.f));
        if (c == 3) res[r][i] = res_before[r][i] = 0.f;
      }
      g[r][kChunk + 5] = stored(t, 30.f * s);
      sim.ranks[r].grads.upload(to_doubles(g[r]));
      upload_floats(sim.ranks[r].residual, res[r]);
    }
    // 1. each rank's chunk maxima, 2. their ncclMax
    std::vector<float> agreed(sim.chunks(), 0.f);
    for (int r = 0; r < world; ++r) {
      int8_absmax(sim.ranks[r].grads.get(), t, sim.ranks[r].residual.as<float>(), n, kChunk, sim.scale.as<float>(),
                  sim.maxima.as<float>(), stream);
      const std::vector<float> want = ref_absmax(g[r], res[r], s, kChunk);
      EXPECT_EQ(bit_mismatches(download_floats(sim.maxima, sim.chunks()), want, "chunk max"), 0u) << "rank " << r;
      for (size_t c = 0; c < want.size(); ++c) agreed[c] = std::max(agreed[c], want[c]);
    }
    EXPECT_EQ(agreed[3], 0.f);
    upload_floats(sim.maxima, agreed);
    // 3. each rank's int8 values and new residuals, 4. their ncclSum
    std::vector<int> sum(n, 0);
    for (int r = 0; r < world; ++r) {
      int8_quantize(sim.ranks[r].grads.get(), t, sim.ranks[r].residual.as<float>(), n, kChunk, sim.scale.as<float>(),
                    sim.maxima.as<float>(), sim.levels, sim.ranks[r].q.as<int8_t>(), stream);
      const std::vector<int> want_q = ref_quantize(g[r], res[r], s, agreed, sim.levels, kChunk);
      std::vector<int8_t> got_q(n);
      CUDA_CHECK(cudaDeviceSynchronize());
      CUDA_CHECK(cudaMemcpy(got_q.data(), sim.ranks[r].q.get(), n, cudaMemcpyDeviceToHost));
      size_t bad = 0;
      for (size_t i = 0; i < n; ++i) {
        if (got_q[i] != want_q[i] && bad++ < 3) ADD_FAILURE() << "q[" << i << "]: " << int(got_q[i]) << " vs " << want_q[i];
        EXPECT_LE(std::abs(want_q[i]), sim.levels);
        sum[i] += want_q[i];
      }
      EXPECT_EQ(bad, 0u) << "rank " << r;
      EXPECT_EQ(bit_mismatches(download_floats(sim.ranks[r].residual, n), res[r], "residual"), 0u) << "rank " << r;
    }
    std::vector<int8_t> sum8(n);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_LE(std::abs(sum[i]), 127) << "the ranks' sum overflows int8 at " << i;
      sum8[i] = static_cast<int8_t>(sum[i]);
    }
    CUDA_CHECK(cudaMemcpy(sim.ranks[0].q.get(), sum8.data(), n, cudaMemcpyHostToDevice));
    // 5. the average, in the gradients' type
    sim.ranks[0].grads.poison();
    int8_dequantize(sim.ranks[0].q.as<int8_t>(), n, kChunk, sim.maxima.as<float>(), sim.levels, world,
                    sim.ranks[0].grads.get(), t, stream);
    const std::vector<float> avg = ref_dequantize(sum, agreed, sim.levels, world, kChunk);
    std::vector<float> want(n);
    for (size_t i = 0; i < n; ++i) want[i] = stored(t, avg[i]);
    EXPECT_EQ(bit_mismatches(to_floats(sim.ranks[0].grads.download()), want, "average"), 0u) << "step " << step;
    // Error feedback's bookkeeping: what was sent plus what is kept is what there was to send (the
    // gradients plus what was kept before), and no rank keeps more than half a step of it.
    for (size_t i = 0; i < n; ++i) {
      double there = 0, kept = 0;
      const double step_size = double(agreed[i / kChunk]) / sim.levels;
      for (int r = 0; r < world; ++r) {
        there += double(g[r][i]) + double(res_before[r][i]) * s;
        kept += double(res[r][i]) * s;
        ASSERT_LE(std::abs(double(res[r][i]) * s), step_size / 2 * (1 + 1e-5)) << "rank " << r << " element " << i;
      }
      // to the fp32 rounding of the few operations per element, on the scale of the chunk's values
      const double scale = std::abs(there) + world * double(agreed[i / kChunk]);
      ASSERT_NEAR(double(avg[i]) * world + kept, there, 1e-6 * scale) << "element " << i;
    }
    res_before = res;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, Int8RoundTrip,
                         testing::Values(Case{DType::F32, 2}, Case{DType::F32, 4}, Case{DType::F16, 2},
                                         Case{DType::F16, 4}),
                         [](const auto& info) {
                           return std::string(dtype_name(info.param.t)) + "_" + std::to_string(info.param.world) +
                                  "_ranks";
                         });

// The step of `sim` on the GPU with the host as NCCL: returns the averaged gradients (rank 0's).
std::vector<float> run_step(Simulated& sim, const std::vector<std::vector<float>>& g) {
  cudaStream_t stream = ctx().stream;
  std::vector<float> agreed(sim.chunks(), 0.f);
  for (int r = 0; r < sim.world; ++r) {
    sim.ranks[r].grads.upload(to_doubles(g[r]));
    int8_absmax(sim.ranks[r].grads.get(), sim.t, sim.ranks[r].residual.as<float>(), sim.n, kChunk,
                sim.scale.as<float>(), sim.maxima.as<float>(), stream);
    const std::vector<float> m = download_floats(sim.maxima, sim.chunks());
    for (size_t c = 0; c < m.size(); ++c) agreed[c] = std::max(agreed[c], m[c]);
  }
  upload_floats(sim.maxima, agreed);
  std::vector<int> sum(sim.n, 0);
  for (int r = 0; r < sim.world; ++r) {
    int8_quantize(sim.ranks[r].grads.get(), sim.t, sim.ranks[r].residual.as<float>(), sim.n, kChunk,
                  sim.scale.as<float>(), sim.maxima.as<float>(), sim.levels, sim.ranks[r].q.as<int8_t>(), stream);
    std::vector<int8_t> q(sim.n);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(q.data(), sim.ranks[r].q.get(), sim.n, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < sim.n; ++i) sum[i] += q[i];
  }
  std::vector<int8_t> sum8(sum.begin(), sum.end());
  CUDA_CHECK(cudaMemcpy(sim.ranks[0].q.get(), sum8.data(), sim.n, cudaMemcpyHostToDevice));
  int8_dequantize(sim.ranks[0].q.as<int8_t>(), sim.n, kChunk, sim.maxima.as<float>(), sim.levels, sim.world,
                  sim.ranks[0].grads.get(), sim.t, stream);
  return to_floats(sim.ranks[0].grads.download());
}

void zero_residuals(Simulated& sim) {
  for (RankOnGpu& r : sim.ranks) CUDA_CHECK(cudaMemset(r.residual.get(), 0, r.residual.bytes()));
}

// The same gradients sent 40 times: with the residuals, what arrives in all is 40 times their
// average, short by at most one quantization step (what the residuals hold at the end); without
// them (zeroed every step) the same rounding error is made 40 times over.
TEST(Int8ErrorFeedback, NothingIsLostOverStepsOnlyDelayed) {
  SKIP_WITHOUT_GPU("the int8 compression kernels");
  constexpr int kSteps = 40;
  const size_t n = 3 * kChunk;
  Simulated with(DType::F32, 2, n, 1.f), without(DType::F32, 2, n, 1.f);
  zero_residuals(with);
  std::mt19937_64 rng = test_rng();
  std::vector<std::vector<float>> g = {to_floats(random_normal(rng, n)), to_floats(random_normal(rng, n))};
  std::vector<double> arrived_with(n, 0), arrived_without(n, 0), truth(n), step_size(n);
  for (size_t i = 0; i < n; ++i) truth[i] = (double(g[0][i]) + double(g[1][i])) / 2 * kSteps;
  const std::vector<float> m0 = ref_absmax(g[0], std::vector<float>(n, 0.f), 1.f, kChunk);
  const std::vector<float> m1 = ref_absmax(g[1], std::vector<float>(n, 0.f), 1.f, kChunk);
  for (int k = 0; k < kSteps; ++k) {
    zero_residuals(without);
    const std::vector<float> a = run_step(with, g), b = run_step(without, g);
    for (size_t i = 0; i < n; ++i) arrived_with[i] += a[i], arrived_without[i] += b[i];
  }
  double worst_with = 0, worst_without = 0;
  for (size_t i = 0; i < n; ++i) {
    // the chunk's step grows with the residuals it carries: bound it by twice the plain one
    const double step = 2.0 * std::max(m0[i / kChunk], m1[i / kChunk]) / int8_levels(2);
    worst_with = std::max(worst_with, std::abs(arrived_with[i] - truth[i]) / step);
    worst_without = std::max(worst_without, std::abs(arrived_without[i] - truth[i]) / step);
  }
  EXPECT_LE(worst_with, 1.0) << "with error feedback, more than a step of the gradients never arrived";
  EXPECT_GT(worst_without, 5.0) << "without the residuals the rounding error should have grown with the steps";
}

// An fp16 overflow on one rank (an infinity in one chunk): every rank's copy of that chunk comes back
// NaN (the loss scaler skips the step on every rank), its residuals are kept as they were, and the
// other chunks go through as usual.
TEST(Int8ErrorFeedback, AnOverflowOnOneRankSkipsItsChunkEverywhereAndKeepsTheResiduals) {
  SKIP_WITHOUT_GPU("the int8 compression kernels");
  const size_t n = 3 * kChunk;
  Simulated sim(DType::F16, 2, n, 8.f);
  std::mt19937_64 rng = test_rng();
  std::vector<std::vector<float>> res(2);
  for (int r = 0; r < 2; ++r) {
    res[r] = to_floats(random_normal(rng, n, 0.0, 0.01));
    upload_floats(sim.ranks[r].residual, res[r]);
  }
  std::vector<std::vector<float>> g(2);
  for (int r = 0; r < 2; ++r)
    for (double v : random_normal(rng, n)) g[r].push_back(stored(DType::F16, float(v)));
  g[1][kChunk + 17] = kInf;
  const std::vector<float> avg = run_step(sim, g);
  for (size_t i = 0; i < n; ++i) {
    if (i / kChunk == 1) ASSERT_TRUE(std::isnan(avg[i])) << "element " << i << " of the overflowed chunk";
    else ASSERT_TRUE(std::isfinite(avg[i])) << "element " << i;
  }
  for (int r = 0; r < 2; ++r) {
    const std::vector<float> kept = download_floats(sim.ranks[r].residual, n);
    for (size_t i = kChunk; i < 2 * kChunk; ++i) ASSERT_TRUE(same_bits(kept[i], res[r][i])) << "rank " << r << " " << i;
  }
}

// The residuals are kept unscaled: the same true gradients at loss scale 1 and 256 (powers of two:
// every product exact) send the same int8 values and keep the same residuals; the average comes
// back scaled.
TEST(Int8ErrorFeedback, ResidualsDoNotDependOnTheLossScale) {
  SKIP_WITHOUT_GPU("the int8 compression kernels");
  const size_t n = 2 * kChunk + 3;
  Simulated one(DType::F32, 2, n, 1.f), scaled(DType::F32, 2, n, 256.f);
  zero_residuals(one);
  zero_residuals(scaled);
  std::mt19937_64 rng = test_rng();
  for (int k = 0; k < 3; ++k) {
    std::vector<std::vector<float>> g(2), gs(2);
    for (int r = 0; r < 2; ++r) {
      g[r] = to_floats(random_normal(rng, n));
      for (float v : g[r]) gs[r].push_back(v * 256.f);
    }
    const std::vector<float> a = run_step(one, g), b = run_step(scaled, gs);
    for (size_t i = 0; i < n; ++i) ASSERT_TRUE(same_bits(a[i] * 256.f, b[i])) << "step " << k << " element " << i;
    for (int r = 0; r < 2; ++r)
      EXPECT_EQ(bit_mismatches(download_floats(scaled.ranks[r].residual, n), download_floats(one.ranks[r].residual, n),
                               "residual"),
                0u);
  }
}

}  // namespace
