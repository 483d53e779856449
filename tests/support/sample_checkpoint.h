// A checkpoint of the real network's shape with values anyone can recompute: element e (in PyTorch
// order) of parameter i is sample_value(i, e), stored where a build of layout `stored` keeps it. The
// export and conversion tests check against the formula rather than against the code under test,
// and tests/python/test_predict_files.py recomputes the same formula in Python.
#pragma once

#include <string>
#include <vector>

#include "model/network.h"
#include "train/checkpoint.h"

namespace predict_test {

inline float sample_value(size_t tensor, size_t e) {
  return static_cast<float>(double((tensor * 7919 + e * 31) % 10007) / 10007.0 - 0.5);
}
inline float sample_running(size_t i) { return static_cast<float>(0.25 + double(i % 1009) / 1009.0); }

inline Checkpoint sample_checkpoint(const TensorLayout& layout, Layout stored, const std::string& data = "synthetic") {
  Checkpoint c;
  std::vector<std::pair<std::string, std::vector<int>>> sig;
  size_t params = 0, running = 0;
  for (const ParamTensor& t : layout.params) {
    sig.emplace_back(t.name, t.shape);
    params += t.count;
  }
  for (const auto& bn : layout.bns) running += 2 * size_t(bn.second);
  c.meta.precision = "fp16";
  c.meta.layout = layout_name(stored);
  c.meta.model_signature = model_signature(sig);
  c.meta.params = params;
  c.meta.running = running;
  c.meta.data = data;
  c.meta.batch = 64;
  c.meta.epochs = 3;
  c.meta.step = 1234;  // epoch 2 (0-based) of 600 steps, 34 steps into it: a consistent header
  c.meta.epoch = 2;
  c.meta.step_in_epoch = 34;
  c.master.resize(params);
  c.momentum.assign(params, 0.f);
  c.running.resize(running);
  for (size_t i = 0; i < layout.params.size(); ++i) {
    const ParamTensor& t = layout.params[i];
    for (size_t e = 0; e < t.count; ++e) c.master[t.offset + filter_storage_index(t, e, stored)] = sample_value(i, e);
  }
  for (size_t i = 0; i < running; ++i) c.running[i] = sample_running(i);
  return c;
}

}  // namespace predict_test
