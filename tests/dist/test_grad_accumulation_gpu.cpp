// Gradient accumulation on the GPU (dist/grad_accumulation.h): on one GPU, micro-batches sum as NCCL
// averages ranks, bit for bit; on two GPUs, in fp32, two ranks' averaged gradients are exactly what
// one process accumulating the two halves holds, with or without accumulation on the ranks too.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/check.h"
#include "dist/data_parallel.h"
#include "dist/grad_accumulation.h"
#include "support/gpu_test_util.h"
#include "data_parallel_test_util.h"

using namespace data_parallel_test;  // kHalf, the configurations, Batch, Replica, on_two_ranks

namespace {

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

}  // namespace

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
