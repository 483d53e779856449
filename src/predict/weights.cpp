// Checking, converting and exporting a checkpoint's weights (predict/weights.h).
#include "predict/weights.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "core/errors.h"

namespace {

size_t parameter_count(const TensorLayout& layout) {
  size_t n = 0;
  for (const ParamTensor& t : layout.params) n += t.count;
  return n;
}

size_t running_count(const TensorLayout& layout) {
  size_t n = 0;
  for (const auto& bn : layout.bns) n += 2 * size_t(bn.second);
  return n;
}

template <class T>
SafeTensor tensor(const std::string& name, const char* dtype, std::vector<int64_t> shape, const T* values, size_t count) {
  SafeTensor t{name, dtype, std::move(shape), std::vector<uint8_t>(count * sizeof(T))};
  std::memcpy(t.data.data(), values, t.data.size());
  return t;
}

}  // namespace

void check_checkpoint_model(const CheckpointMeta& m, const TensorLayout& layout, const std::string& file) {
  std::vector<std::pair<std::string, std::vector<int>>> sig;
  for (const ParamTensor& t : layout.params) sig.emplace_back(t.name, t.shape);
  const int classes = layout.params.back().shape[0];
  CheckpointMeta here;
  here.model_signature = model_signature(sig);
  here.params = parameter_count(layout);
  here.running = running_count(layout);
  const std::string difference = model_difference(m, here);
  if (!difference.empty())
    throw InputError(file + ": checkpoint of another model than this program builds for " + std::to_string(classes) +
                     " classes: " + difference);
}

void check_checkpoint_classes(const std::vector<std::string>& trained, const std::vector<std::string>& served,
                              const std::string& dir, const std::string& file) {
  if (trained.empty() || trained == served) return;  // older checkpoints do not name their classes
  const auto missing_from = [](const std::vector<std::string>& names, const std::vector<std::string>& other) {
    std::vector<std::string> out;
    for (const std::string& n : names)
      if (std::find(other.begin(), other.end(), n) == other.end()) out.push_back(n);
    return out;
  };
  const auto listed = [](const std::vector<std::string>& names) {  // the first five, then how many more
    std::string s;
    for (size_t i = 0; i < names.size() && i < 5; ++i) s += (i ? ", " : "") + names[i];
    return names.size() > 5 ? s + " and " + std::to_string(names.size() - 5) + " more" : s;
  };
  const std::string head = file + ": trained on other classes than those of " + dir + " (" +
                           std::to_string(trained.size()) + " in the checkpoint, " + std::to_string(served.size()) +
                           " in the data set)";
  const std::vector<std::string> only_trained = missing_from(trained, served), only_served = missing_from(served, trained);
  if (only_trained.empty() && only_served.empty()) {  // the same names in another order: other class indices
    size_t i = 0;
    while (i < std::min(trained.size(), served.size()) && trained[i] == served[i]) ++i;
    if (i == std::min(trained.size(), served.size()))
      throw InputError(head + ": the same names, some of them repeated");
    throw InputError(head + ": the same names in another order; class " + std::to_string(i) + " is " + trained[i] +
                     " in the checkpoint, " + served[i] + " in the data set");
  }
  std::string which;
  if (!only_trained.empty()) which += "only in the checkpoint: " + listed(only_trained);
  if (!only_served.empty()) which += (which.empty() ? "" : "; ") + std::string("only in the data set: ") + listed(only_served);
  throw InputError(head + ": " + which);
}

Layout checkpoint_layout(const CheckpointMeta& m, const std::string& file) {
  for (Layout l : {Layout::NCHW, Layout::NHWC})
    if (m.layout == layout_name(l)) return l;
  throw InputError(file + ": unknown filter layout '" + m.layout + "' (expected NCHW or NHWC)");
}

std::vector<float> convert_filters(const std::vector<float>& master, const TensorLayout& layout, Layout from, Layout to) {
  std::vector<float> out = master;
  if (from == to) return out;
  for (const ParamTensor& t : layout.params) {
    if (t.kind != ParamKind::ConvWeight) continue;
    for (size_t e = 0; e < t.count; ++e)
      out[t.offset + filter_storage_index(t, e, to)] = master[t.offset + filter_storage_index(t, e, from)];
  }
  return out;
}

std::vector<SafeTensor> export_tensors(const Checkpoint& c, const TensorLayout& layout) {
  const std::vector<float> master = convert_filters(c.master, layout, checkpoint_layout(c.meta, "checkpoint"), Layout::NCHW);
  std::map<std::string, size_t> running_at;  // BN name -> offset of its running mean
  size_t off = 0;
  for (const auto& [name, channels] : layout.bns) {
    running_at[name] = off;
    off += 2 * size_t(channels);
  }
  const int64_t steps = c.meta.step;
  std::vector<SafeTensor> out;
  for (const ParamTensor& t : layout.params) {
    out.push_back(tensor(t.name, "F32", std::vector<int64_t>(t.shape.begin(), t.shape.end()), master.data() + t.offset, t.count));
    if (t.kind != ParamKind::BnBeta) continue;
    const std::string bn = t.name.substr(0, t.name.size() - std::strlen(".bias"));
    const float* mean = c.running.data() + running_at.at(bn);
    out.push_back(tensor(bn + ".running_mean", "F32", {int64_t(t.count)}, mean, t.count));
    out.push_back(tensor(bn + ".running_var", "F32", {int64_t(t.count)}, mean + t.count, t.count));
    out.push_back(tensor(bn + ".num_batches_tracked", "I64", {}, &steps, 1));
  }
  return out;
}
