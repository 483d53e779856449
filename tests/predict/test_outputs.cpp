// What bin/predict makes of a batch on the CPU, against references computed here: probabilities
// against a double-precision softmax, the top-k order and its ties, CSV rows and their ids, padding
// rows left out, features converted between float16 and float32, the confusion counts and report.
#include <gtest/gtest.h>

#include <cuda_fp16.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "predict/outputs.h"
#include "support/test_files.h"  // EXPECT_HAS

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out(1);
  for (char c : s) {
    if (c == sep) out.emplace_back();
    else out.back() += c;
  }
  return out;
}

TEST(PredictOutputs, ProbabilitiesAreTheSoftmaxOfLogitsPlusBias) {
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.f, 4.f);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<float> logits(10), bias(10);
    for (int c = 0; c < 10; ++c) logits[c] = d(rng), bias[c] = d(rng) * 0.1f;
    double sum = 0;
    std::vector<double> want(10);
    for (int c = 0; c < 10; ++c) sum += want[c] = std::exp(double(logits[c]) + double(bias[c]));
    const std::vector<double> got = class_probabilities(logits.data(), bias);
    double total = 0;
    for (int c = 0; c < 10; ++c) {
      EXPECT_NEAR(got[c], want[c] / sum, 1e-6 * (want[c] / sum) + 1e-12);
      total += got[c];
    }
    EXPECT_NEAR(total, 1.0, 1e-12);
  }
  // Large logits neither overflow nor lose the winner.
  const std::vector<float> big = {1000.f, 999.f, -1000.f};
  const std::vector<double> p = class_probabilities(big.data(), {0.f, 0.f, 0.f});
  EXPECT_NEAR(p[0], 1 / (1 + std::exp(-1.0)), 1e-12);
  EXPECT_EQ(p[2], 0.0);
}

TEST(PredictOutputs, TopClassesMostProbableFirstTiesToTheLowerClass) {
  EXPECT_EQ(top_classes({0.1, 0.5, 0.2, 0.2}, 3), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(top_classes({0.25, 0.25, 0.25, 0.25}, 2), (std::vector<int>{0, 1}));
  EXPECT_EQ(top_classes({0.3, 0.7}, 5), (std::vector<int>{1, 0})) << "k above the classes: all of them";
  EXPECT_EQ(top_classes({0.3, 0.7, 0.0}, 1), (std::vector<int>{1}));
}

struct Fixture {
  Dataset data;
  OutputFormat f;
  std::vector<uint8_t> host;
  std::vector<uint32_t> images;

  // `rows` real images of a 4-class set in a batch of `batch`; row r's logits put class (r % 4)
  // first and class ((r + 1) % 4) second; features r * 10 + j.
  Fixture(int batch, int rows, DType in, DType out, bool paths) {
    data.count = 100;
    data.labels.resize(100);
    for (int i = 0; i < 100; ++i) data.labels[i] = static_cast<uint8_t>(i % 4 == 3 ? 0 : i % 4);
    if (paths)
      for (int i = 0; i < 100; ++i) data.paths.push_back("img," + std::to_string(i) + ".png");
    f.batch = batch;
    f.classes = 4;
    f.top_k = 3;
    f.features = 5;
    f.features_in = in;
    f.features_out = out;
    f.bias = {0.f, 0.f, 0.f, 0.f};
    f.class_names = {"a", "b", "c", "d"};
    host.assign(f.logits_bytes() + f.features_bytes(), 0);
    auto* logits = reinterpret_cast<float*>(host.data());
    for (int r = 0; r < batch; ++r) {
      logits[r * 4 + r % 4] = 5.f;
      logits[r * 4 + (r + 1) % 4] = 3.f;
      for (int j = 0; j < 5; ++j) {
        const float v = float(r * 10 + j) + 0.25f;
        uint8_t* dst = host.data() + f.logits_bytes() + (size_t(r) * 5 + j) * dtype_size(in);
        if (in == DType::F32) std::memcpy(dst, &v, 4);
        else {
          const __half h = __float2half_rn(v);
          std::memcpy(dst, &h, 2);
        }
      }
    }
    for (int r = 0; r < rows; ++r) images.push_back(static_cast<uint32_t>(40 + r));
  }
  BatchResult run() const { return process_batch(f, data, images.data(), static_cast<int>(images.size()), host.data()); }
};

TEST(PredictOutputs, OneCsvRowPerRealImage) {
  const Fixture x(8, 6, DType::F32, DType::F32, false);  // a last batch: 2 padding rows
  const BatchResult b = x.run();
  const std::vector<std::string> lines = split(b.csv, '\n');
  ASSERT_EQ(lines.size(), 7u) << "6 rows and the empty string after the last newline";
  EXPECT_EQ(lines.back(), "");
  const std::vector<std::string> row = split(lines[1], ',');  // image 41: label 1, predicted 1
  ASSERT_EQ(row.size(), 5u + 2 * 3) << csv_header(x.f);
  EXPECT_EQ(row[0], "41");
  EXPECT_EQ(row[1], "1");
  EXPECT_EQ(row[2], "b");
  EXPECT_EQ(row[3], "1");
  EXPECT_EQ(row[4], "b");
  EXPECT_EQ(row[5], "1");
  EXPECT_EQ(row[7], "2");
  const double e5 = std::exp(5.0), e3 = std::exp(3.0);
  EXPECT_NEAR(std::stod(row[6]), e5 / (e5 + e3 + 2), 1e-6);
  EXPECT_NEAR(std::stod(row[8]), e3 / (e5 + e3 + 2), 1e-6);
  EXPECT_EQ(row[9], "0") << "the tie of classes 0 and 3 goes to 0";
  EXPECT_EQ(csv_header(x.f), "id,label,label_name,predicted,predicted_name,top1,p1,top2,p2,top3,p3\n");
}

TEST(PredictOutputs, ConfusionCountsTheRealRows) {
  const Fixture x(8, 6, DType::F32, DType::F32, false);
  const BatchResult b = x.run();
  // Images 40..45 have labels 0,1,2,0,0,1 and rows 0..5 predict 0,1,2,3,0,1.
  std::vector<long> want(16, 0);
  const int labels[6] = {0, 1, 2, 0, 0, 1}, predicted[6] = {0, 1, 2, 3, 0, 1};
  for (int r = 0; r < 6; ++r) want[labels[r] * 4 + predicted[r]]++;
  EXPECT_EQ(b.confusion, want);
}

TEST(PredictOutputs, FolderPathsAreTheIdsQuotedWhereNeeded) {
  const Fixture x(4, 4, DType::F32, DType::F32, true);
  const std::vector<std::string> lines = split(x.run().csv, '\n');
  EXPECT_EQ(lines[0].rfind("\"img,40.png\",0,a,0,a,", 0), 0u) << lines[0];
}

TEST(PredictOutputs, FeaturesInTheTypeAskedFor) {
  for (DType in : {DType::F32, DType::F16})
    for (DType out : {DType::F32, DType::F16}) {
      SCOPED_TRACE(std::string(dtype_name(in)) + " -> " + dtype_name(out));
      const Fixture x(4, 3, in, out, false);
      const BatchResult b = x.run();
      ASSERT_EQ(b.features.size(), 3u * 5 * dtype_size(out)) << "real rows only";
      for (int r = 0; r < 3; ++r)
        for (int j = 0; j < 5; ++j) {
          const size_t at = (size_t(r) * 5 + j) * dtype_size(out);
          float v;
          if (out == DType::F32) std::memcpy(&v, b.features.data() + at, 4);
          else {
            __half h;
            std::memcpy(&h, b.features.data() + at, 2);
            v = __half2float(h);
          }
          EXPECT_EQ(v, float(r * 10 + j) + 0.25f);  // exact in both types
        }
    }
  const Fixture none(4, 4, DType::F32, DType::F32, false);
  OutputFormat f = none.f;
  f.features = 0;
  EXPECT_TRUE(process_batch(f, none.data, none.images.data(), 4, none.host.data()).features.empty());
}

TEST(PredictOutputs, ConfusionReport) {
  const std::vector<long> c = {8, 2, 1, 9};
  const std::string r = confusion_report(c, {"cat", "dog"});
  EXPECT_HAS(r, "accuracy: 85.00% (17 of 20 images)");
  EXPECT_HAS(r, "\n            0     1\n  0 cat     8     2\n  1 dog     1     9\n");
  EXPECT_HAS(confusion_report({0, 0, 0, 0}, {"a", "b"}), "accuracy: 0.00% (0 of 0 images)");
}

}  // namespace
