// cuDNN's graph (backend) API in small pieces shared by the graph-API convolutions (conv_graph.h)
// and the fused batch-norm patterns (fused_conv.h): an RAII descriptor, tensors, operation graphs,
// the heuristics' engine configurations and what their notes say, execution plans, variant packs.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <cudnn.h>

#include "core/types.h"

// Every pointer handed to a plan is checked against the alignment its tensors promise.
constexpr int64_t kCudnnAlignment = 16;

[[noreturn]] void backend_failure(cudnnStatus_t st, const char* what, int attribute);

// One backend descriptor, destroyed with its owner.
class Backend {
 public:
  Backend() = default;
  explicit Backend(cudnnBackendDescriptorType_t type);
  ~Backend();
  Backend(Backend&& o) noexcept : d_(std::exchange(o.d_, nullptr)) {}
  Backend& operator=(Backend&& o) noexcept {
    std::swap(d_, o.d_);
    return *this;
  }
  explicit operator bool() const { return d_ != nullptr; }
  cudnnBackendDescriptor_t get() const { return d_; }
  cudnnBackendDescriptor_t* out() { return &d_; }

  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, const void* values, int64_t n = 1);
  void set(cudnnBackendAttributeName_t name, const Backend& other);
  void set(cudnnBackendAttributeName_t name, const std::vector<const Backend*>& others);
  void finalize();
  // Finalize that reports failure instead of throwing (support queries).
  cudnnStatus_t try_finalize() { return cudnnBackendFinalize(d_); }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

cudnnDataType_t cudnn_type(DType t);

// A 4-d tensor given as N, C, H, W, whose strides follow `layout`. Per-channel vectors are
// [1, C, 1, 1]. A virtual tensor lives only inside a fused kernel and has no pointer.
struct TensorSpec {
  int64_t uid;
  cudnnDataType_t type;
  std::array<int64_t, 4> dims;
  Layout layout = Layout::NHWC;
  bool is_virtual = false;
};
Backend backend_tensor(const TensorSpec& s);

// A 2-d cross-correlation with square stride and padding, fp32 accumulation.
Backend convolution_descriptor(int64_t stride, int64_t pad);
// One convolution operation. x, w, y are the conv's input, filter and output as the forward pass
// sees them (backward-data writes x from y, backward-filter writes w); the result is blended as
// alpha * result + beta * what the output held.
enum class ConvDirection { Forward, BackwardData, BackwardFilter };
Backend convolution_op(ConvDirection dir, const Backend& x, const Backend& w, const Backend& y, const Backend& conv,
                       float beta = 0.f);

// The operation graph of `ops`, finalized; throws when cuDNN refuses it.
Backend operation_graph(cudnnHandle_t h, const std::vector<const Backend*>& ops);
// The heuristics' engine configurations for a graph, best first.
std::vector<Backend> engine_configs(const Backend& graph, cudnnBackendHeurMode_t mode);
// Two heuristics lists one after the other: mode A's (or, where A offers nothing, the fallback
// list) then mode B's (empty where cuDNN gives none). The modes rank engines differently: timing
// every engine of both lists for ResNet-50's 69 plain conv directions at batch 128 on an H100 (cuDNN
// 9.14), the fastest was in B's list for 42 of them (bench/results/gpu-run-2026-11-24.md).
struct EngineLists {
  std::vector<Backend> configs;  // A's (or the fallback's), then B's
  size_t second = 0;             // where B's begin
  std::string error;             // why mode A (or the fallback) failed, where it did
  int list_of(size_t i) const { return i < second ? 0 : 1; }
};
// A's list (the fallback's where A offers nothing); B's is appended only by callers that measure:
// asking mode B for every layer and direction of bin/train added about 4 s of host time to its
// start on an H100.
EngineLists engine_configs_first_list(const Backend& graph);
void add_mode_b_list(EngineLists& lists, const Backend& graph);

// What cuDNN says about an engine configuration's kernels.
struct EngineNotes {
  bool tensor_core = false, down_convert = false, reduced_precision = false, nondeterministic = false;
  bool runtime_compiled = false;
};
EngineNotes notes_of(const Backend& config);

struct Plan {
  Backend desc;
  size_t workspace = 0;
};
// The execution plan of one configuration, or an empty Plan when cuDNN cannot run it for this graph.
Plan make_plan(cudnnHandle_t h, const Backend& config);

// The pointers of one call: uids[i] -> ptrs[i], and the workspace. Throws when a pointer is not
// aligned as promised.
Backend variant_pack(const std::vector<int64_t>& uids, const std::vector<const void*>& ptrs, void* workspace);
void execute(cudnnHandle_t h, const Backend& plan, const Backend& pack);
