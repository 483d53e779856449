// Processing a batch's outputs on the CPU (predict/outputs.h).
#include "predict/outputs.h"

#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>

#include "core/format.h"
#include "export/csv.h"

std::string csv_header(const OutputFormat& f) {
  std::vector<std::string> names = {"id", "label", "label_name", "predicted", "predicted_name"};
  for (int j = 1; j <= f.top_k; ++j) {
    names.push_back("top" + std::to_string(j));
    names.push_back("p" + std::to_string(j));
  }
  return csv_line(names);
}

std::vector<double> class_probabilities(const float* logits, const std::vector<float>& bias) {
  std::vector<double> p(bias.size());
  double top = -INFINITY, sum = 0;
  // The sum in float, as the loss kernel forms it, so that the top class is the one the trainer's
  // evaluation counts (the same float, the same ties); the rest in double.
  for (size_t c = 0; c < p.size(); ++c) top = std::max(top, p[c] = double(logits[c] + bias[c]));
  for (double& v : p) sum += v = std::exp(v - top);
  for (double& v : p) v /= sum;
  return p;
}

std::vector<int> top_classes(const std::vector<double>& p, int k) {
  std::vector<int> order(p.size());
  std::iota(order.begin(), order.end(), 0);
  k = std::min<int>(k, static_cast<int>(order.size()));
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int a, int b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  order.resize(k);
  return order;
}

namespace {

std::string probability_text(double p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", p);
  return buf;
}

// Row r's features, converted to the output type, appended to `out`.
void append_features(const OutputFormat& f, const uint8_t* in, int r, std::vector<uint8_t>& out) {
  const size_t n = size_t(f.features), in_size = dtype_size(f.features_in);
  const uint8_t* src = in + size_t(r) * n * in_size;
  const size_t at = out.size();
  out.resize(at + n * dtype_size(f.features_out));
  if (f.features_in == f.features_out) {
    std::memcpy(out.data() + at, src, n * in_size);
  } else if (f.features_in == DType::F16) {
    const auto* h = reinterpret_cast<const __half*>(src);
    auto* dst = reinterpret_cast<float*>(out.data() + at);
    for (size_t i = 0; i < n; ++i) dst[i] = __half2float(h[i]);
  } else {
    const auto* x = reinterpret_cast<const float*>(src);
    auto* dst = reinterpret_cast<__half*>(out.data() + at);
    for (size_t i = 0; i < n; ++i) dst[i] = __float2half_rn(x[i]);
  }
}

}  // namespace

BatchResult process_batch(const OutputFormat& f, const Dataset& data, const uint32_t* images, int rows, const void* host) {
  const auto* logits = static_cast<const float*>(host);
  const uint8_t* features = static_cast<const uint8_t*>(host) + f.logits_bytes();
  BatchResult out;
  out.confusion.assign(size_t(f.classes) * f.classes, 0);
  for (int r = 0; r < rows; ++r) {
    const uint32_t image = images[r];
    const int label = data.labels[image];
    const std::vector<double> p = class_probabilities(logits + size_t(r) * f.classes, f.bias);
    const std::vector<int> top = top_classes(p, f.top_k);
    std::vector<std::string> fields = {data.paths.empty() ? std::to_string(image) : data.paths[image],
                                       std::to_string(label), f.class_names[label], std::to_string(top[0]),
                                       f.class_names[top[0]]};
    for (int c : top) {
      fields.push_back(std::to_string(c));
      fields.push_back(probability_text(p[c]));
    }
    out.csv += csv_line(fields);
    out.confusion[size_t(label) * f.classes + top[0]]++;
    if (f.features) append_features(f, features, r, out.features);
  }
  return out;
}

std::string confusion_report(const std::vector<long>& confusion, const std::vector<std::string>& class_names) {
  const int k = static_cast<int>(class_names.size());
  long total = 0, correct = 0, widest = 1;
  for (int t = 0; t < k; ++t)
    for (int p = 0; p < k; ++p) {
      const long n = confusion[size_t(t) * k + p];
      total += n;
      if (t == p) correct += n;
      widest = std::max<long>(widest, static_cast<long>(std::to_string(n).size()));
    }
  char line[160];
  std::snprintf(line, sizeof(line), "accuracy: %.2f%% (%s of %s images)\n", total ? 100.0 * correct / total : 0.0,
                with_commas(correct).c_str(), with_commas(total).c_str());
  std::string s = line;
  size_t name_w = 0;
  for (int t = 0; t < k; ++t) name_w = std::max(name_w, std::to_string(t).size() + 1 + class_names[t].size());
  const int cell = static_cast<int>(std::max<long>({widest, long(std::to_string(k - 1).size()), 5})) + 1;
  s += "confusion matrix (rows: true class, columns: predicted class):\n" + std::string(name_w + 2, ' ');
  for (int p = 0; p < k; ++p) s += std::string(cell - std::to_string(p).size(), ' ') + std::to_string(p);
  s += "\n";
  for (int t = 0; t < k; ++t) {
    const std::string name = std::to_string(t) + " " + class_names[t];
    s += "  " + name + std::string(name_w - name.size(), ' ');
    for (int p = 0; p < k; ++p) {
      const std::string n = std::to_string(confusion[size_t(t) * k + p]);
      s += std::string(cell - n.size(), ' ') + n;
    }
    s += "\n";
  }
  return s;
}
