// cuDNN's graph (backend) API in small pieces: descriptors, tensors, graphs, engines, plans, packs.
#include "model/cudnn_backend.h"

#include "core/check.h"
#include "core/errors.h"

void backend_failure(cudnnStatus_t st, const char* what, int attribute) {
  const std::string call = std::string(what) + (attribute >= 0 ? " of attribute " + std::to_string(attribute) : "");
  throw_cudnn_error(st, call.c_str(), __FILE__, __LINE__);
}

Backend::Backend(cudnnBackendDescriptorType_t type) {
  const cudnnStatus_t st = cudnnBackendCreateDescriptor(type, &d_);
  if (st != CUDNN_STATUS_SUCCESS) backend_failure(st, "cudnnBackendCreateDescriptor", -1);
}

Backend::~Backend() {
  if (d_) cudnnBackendDestroyDescriptor(d_);
}

void Backend::set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, const void* values, int64_t n) {
  const cudnnStatus_t st = cudnnBackendSetAttribute(d_, name, type, n, values);
  if (st != CUDNN_STATUS_SUCCESS) backend_failure(st, "cudnnBackendSetAttribute", name);
}

void Backend::set(cudnnBackendAttributeName_t name, const Backend& other) {
  cudnnBackendDescriptor_t o = other.get();
  set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, &o);
}

void Backend::set(cudnnBackendAttributeName_t name, const std::vector<const Backend*>& others) {
  std::vector<cudnnBackendDescriptor_t> raw;
  for (const Backend* b : others) raw.push_back(b->get());
  set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, raw.data(), static_cast<int64_t>(raw.size()));
}

void Backend::finalize() {
  const cudnnStatus_t st = cudnnBackendFinalize(d_);
  if (st != CUDNN_STATUS_SUCCESS) backend_failure(st, "cudnnBackendFinalize", -1);
}

cudnnDataType_t cudnn_type(DType t) { return t == DType::F32 ? CUDNN_DATA_FLOAT : CUDNN_DATA_HALF; }

Backend backend_tensor(const TensorSpec& s) {
  Backend d(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const auto [n, c, h, w] = s.dims;
  const int64_t nchw[4] = {c * h * w, h * w, w, 1}, nhwc[4] = {h * w * c, 1, w * c, c};
  d.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, &s.type);
  d.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, s.dims.data(), 4);
  d.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, s.layout == Layout::NCHW ? nchw : nhwc, 4);
  d.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &s.uid);
  d.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &kCudnnAlignment);
  if (s.is_virtual) {
    const bool v = true;
    d.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, &v);
  }
  d.finalize();
  return d;
}

Backend convolution_descriptor(int64_t stride, int64_t pad) {
  Backend conv(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  const cudnnDataType_t accumulate = CUDNN_DATA_FLOAT;  // fp32 accumulation for both precisions
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const int64_t dims = 2, ones[2] = {1, 1}, strides[2] = {stride, stride}, pads[2] = {pad, pad};
  conv.set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &accumulate);
  conv.set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, &mode);
  conv.set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, &dims);
  conv.set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, ones, 2);
  conv.set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, strides, 2);
  conv.set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, pads, 2);
  conv.set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, pads, 2);
  conv.finalize();
  return conv;
}

Backend convolution_op(ConvDirection dir, const Backend& x, const Backend& w, const Backend& y, const Backend& conv,
                       float beta) {
  // The operation's attribute names: its conv input, filter and output tensors, then the rest.
  struct OpAttributes {
    cudnnBackendDescriptorType_t type;
    cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
  };
  static const OpAttributes kForwardOp{
      CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
      CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
      CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
      CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA};
  static const OpAttributes kBackwardDataOp{
      CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA};
  static const OpAttributes kBackwardFilterOp{
      CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA};
  const OpAttributes& a = dir == ConvDirection::Forward          ? kForwardOp
                          : dir == ConvDirection::BackwardFilter ? kBackwardFilterOp
                                                                 : kBackwardDataOp;
  const float alpha = 1.f;
  Backend op(a.type);
  op.set(a.x, x);
  op.set(a.w, w);
  op.set(a.y, y);
  op.set(a.conv, conv);
  op.set(a.alpha, CUDNN_TYPE_FLOAT, &alpha);
  op.set(a.beta, CUDNN_TYPE_FLOAT, &beta);
  op.finalize();
  return op;
}

Backend operation_graph(cudnnHandle_t h, const std::vector<const Backend*>& ops) {
  Backend graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, ops);
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, &h);
  graph.finalize();
  return graph;
}

std::vector<Backend> engine_configs(const Backend& graph, cudnnBackendHeurMode_t mode) {
  Backend heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  heur.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
  heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &mode);
  heur.finalize();
  int64_t count = 0;
  cudnnStatus_t st = cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr);
  if (st != CUDNN_STATUS_SUCCESS) backend_failure(st, "cudnnBackendGetAttribute", CUDNN_ATTR_ENGINEHEUR_RESULTS);
  std::vector<Backend> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    raw.push_back(configs.back().get());
  }
  int64_t got = 0;
  st = cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                                raw.data());
  if (st != CUDNN_STATUS_SUCCESS) backend_failure(st, "cudnnBackendGetAttribute", CUDNN_ATTR_ENGINEHEUR_RESULTS);
  configs.resize(static_cast<size_t>(got));
  return configs;
}

namespace {
// A heuristics mode that fails or lists nothing for a graph contributes nothing; why it failed is
// kept in `error` (when given) for the message of a caller left with no engine at all.
std::vector<Backend> listed(const Backend& graph, cudnnBackendHeurMode_t mode, std::string* error = nullptr) {
  try {
    return engine_configs(graph, mode);
  } catch (const Fatal& e) {
    if (error && error->empty()) *error = e.what();
    return {};
  }
}
}  // namespace

EngineLists engine_configs_first_list(const Backend& graph) {
  EngineLists l;
  l.configs = listed(graph, CUDNN_HEUR_MODE_A, &l.error);
  if (l.configs.empty()) l.configs = listed(graph, CUDNN_HEUR_MODE_FALLBACK, &l.error);
  l.second = l.configs.size();
  return l;
}

void add_mode_b_list(EngineLists& l, const Backend& graph) {
  for (Backend& c : listed(graph, CUDNN_HEUR_MODE_B)) l.configs.push_back(std::move(c));
}

EngineNotes notes_of(const Backend& config) {
  Backend engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  int64_t n = 0;
  cudnnStatus_t st = cudnnBackendGetAttribute(config.get(), CUDNN_ATTR_ENGINECFG_ENGINE,
                                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, engine.out());
  if (st != CUDNN_STATUS_SUCCESS) backend_failure(st, "cudnnBackendGetAttribute", CUDNN_ATTR_ENGINECFG_ENGINE);
  EngineNotes e;
  cudnnBackendNumericalNote_t numerical[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  st = cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, numerical);
  if (st != CUDNN_STATUS_SUCCESS) backend_failure(st, "cudnnBackendGetAttribute", CUDNN_ATTR_ENGINE_NUMERICAL_NOTE);
  for (int64_t i = 0; i < n; ++i) {
    e.tensor_core |= numerical[i] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE;
    e.down_convert |= numerical[i] == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS;
    e.reduced_precision |= numerical[i] == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION;
    e.nondeterministic |= numerical[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC;
  }
  cudnnBackendBehaviorNote_t behavior[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
  st = cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                                CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &n, behavior);
  if (st != CUDNN_STATUS_SUCCESS) backend_failure(st, "cudnnBackendGetAttribute", CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE);
  for (int64_t i = 0; i < n; ++i) e.runtime_compiled |= behavior[i] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION;
  return e;
}

Plan make_plan(cudnnHandle_t h, const Backend& config) {
  Plan p{Backend(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR), 0};
  p.desc.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, &h);
  p.desc.set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config);
  if (p.desc.try_finalize() != CUDNN_STATUS_SUCCESS) return {};
  int64_t n = 0, bytes = 0;
  const cudnnStatus_t st = cudnnBackendGetAttribute(p.desc.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                                    CUDNN_TYPE_INT64, 1, &n, &bytes);
  if (st != CUDNN_STATUS_SUCCESS) backend_failure(st, "cudnnBackendGetAttribute", CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE);
  p.workspace = static_cast<size_t>(bytes);
  return p;
}

Backend variant_pack(const std::vector<int64_t>& uids, const std::vector<const void*>& ptrs, void* workspace) {
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % kCudnnAlignment != 0)
      throw Fatal("a cuDNN graph tensor at " + std::to_string(reinterpret_cast<uintptr_t>(p)) + " is not " +
                  std::to_string(kCudnnAlignment) + "-byte aligned, as its graph promises");
  Backend d(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  std::vector<void*> data;
  for (const void* p : ptrs) data.push_back(const_cast<void*>(p));
  d.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, uids.data(), static_cast<int64_t>(uids.size()));
  d.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, data.data(), static_cast<int64_t>(data.size()));
  d.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, &workspace);
  d.finalize();
  return d;
}

void execute(cudnnHandle_t h, const Backend& plan, const Backend& pack) {
  const cudnnStatus_t st = cudnnBackendExecute(h, plan.get(), pack.get());
  if (st != CUDNN_STATUS_SUCCESS) backend_failure(st, "cudnnBackendExecute", -1);
}
