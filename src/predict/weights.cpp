// Checking, converting and exporting a checkpoint's weights (predict/weights.h).
#include "predict/weights.h"

#include <cstring>
#include <map>

#include "core/errors.h"
#include "core/format.h"

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
  const std::string here = CheckpointMeta{}.model;
  if (m.model != here || m.model_signature != model_signature(sig) || m.params != parameter_count(layout) ||
      m.running != running_count(layout))
    throw InputError(file + ": checkpoint of another model (" + m.model + ", " +
                     with_commas(static_cast<long long>(m.params)) + " parameters); for " + std::to_string(classes) +
                     " classes this program builds " + here + " with " +
                     with_commas(static_cast<long long>(parameter_count(layout))) + " parameters");
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
