// Files for the Python tests to read back with numpy (or their own parser) and to feed bin/predict:
// .npy arrays of both element types and several shapes, a safetensors file, a predictions CSV, and
// (only when they ask) an NHWC checkpoint of the real network with recomputable values
// (support/sample_checkpoint.h). They go to $PREDICT_SAMPLES_DIR when tests/python asks for them
// (it runs this test alone), else to a scratch directory, and the test checks that each one is there.
#include <gtest/gtest.h>

#include <cuda_fp16.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/file_io.h"
#include "export/npy.h"
#include "export/safetensors.h"
#include "predict/outputs.h"
#include "support/sample_checkpoint.h"
#include "support/test_files.h"

namespace {

// Element k of a sample array, in C order: exact in float16 too.
float array_value(size_t k) { return float(k) + 0.5f - 20.f; }

void write_npy(const std::string& path, DType t, const std::vector<size_t>& shape) {
  size_t count = 1;
  for (size_t d : shape) count *= d;
  NpyWriter w(path, t, shape);
  for (size_t k = 0; k < count; ++k) {
    const float v = array_value(k);
    const __half h = __float2half_rn(v);
    w.append(t == DType::F32 ? static_cast<const void*>(&v) : static_cast<const void*>(&h), dtype_size(t));
  }
  w.commit();
}

// Three images of a three-class data set whose ids and class names need CSV quoting, and a batch of
// four rows (the last one padding) whose logits make the predictions plain.
void write_predictions(const std::string& path) {
  Dataset d;
  d.count = 3;
  d.labels = {0, 2, 1};
  d.paths = {"a.png", "dir,with,commas/b.png", "say \"c\".png"};
  OutputFormat f;
  f.batch = 4;
  f.classes = 3;
  f.top_k = 2;
  f.features = 2;
  f.features_in = DType::F32;
  f.features_out = DType::F16;
  f.bias = {0.f, 0.f, 1.f};
  f.class_names = {"zero", "one, or two", "three"};
  std::vector<float> host(4 * 3 + 4 * 2, 0.f);
  const float logits[4][3] = {{3, 0, -1}, {0, 0, 2}, {0, 4, 0}, {9, 9, 9}};
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 3; ++c) host[r * 3 + c] = logits[r][c];
  const uint32_t images[3] = {0, 1, 2};
  const BatchResult b = process_batch(f, d, images, 3, host.data());
  const std::string text = csv_header(f) + b.csv;
  write_file_atomic(path, text.data(), text.size());
}

TEST(PredictSamples, FilesForThePythonReaders) {
  test_files::TempDir scratch;
  const char* env = std::getenv("PREDICT_SAMPLES_DIR");
  const std::string dir = env && *env ? env : scratch.path;
  if (env && *env) {  // 188 MB: only when the Python tests ask (the export and the command line use it)
    save_checkpoint(dir + "/sample.ckpt", predict_test::sample_checkpoint(Network::tensor_layout(10), Layout::NHWC));
    EXPECT_TRUE(std::filesystem::exists(dir + "/sample.ckpt"));
  }
  write_npy(dir + "/f32-5x7.npy", DType::F32, {5, 7});
  write_npy(dir + "/f16-5x7.npy", DType::F16, {5, 7});
  write_npy(dir + "/f32-6.npy", DType::F32, {6});
  std::vector<uint8_t> w(6 * 4), step(8, 0);
  for (int i = 0; i < 6; ++i) {
    const float v = array_value(i);
    std::memcpy(w.data() + 4 * i, &v, 4);
  }
  step[0] = 7;
  write_safetensors(dir + "/writer.safetensors",
                    {{"layer.weight", "F32", {2, 3}, w}, {"layer.steps", "I64", {}, step}, {"half", "F16", {2}, {0, 60, 0, 188}}},
                    {{"format", "pt"}, {"quoted", "a \"b\" \\ c"}});
  write_predictions(dir + "/predictions.csv");
  for (const char* name : {"f32-5x7.npy", "f16-5x7.npy",
                           "f32-6.npy", "writer.safetensors", "predictions.csv"})
    EXPECT_TRUE(std::filesystem::exists(dir + "/" + name)) << name;
}

}  // namespace
