// All trainable parameters in one flat fp32 buffer, with momentum and gradients beside it.
//
// The flat order puts conv and linear weights first ("weights": decayed, gradients produced by
// cuDNN/cuBLAS in the activation type, an fp16 working copy in fp16 builds) and BN gammas/betas and
// the linear bias after them ("vectors": not decayed, fp32 gradients from our own kernels). One
// fused kernel then updates everything (optimizer.cu).
#pragma once

#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "core/memory.h"
#include "core/types.h"

enum class ParamKind { ConvWeight, LinearWeight, BnGamma, BnBeta, LinearBias };

struct ParamTensor {
  std::string name;         // PyTorch-style, e.g. "layer1.0.conv2.weight"
  ParamKind kind;
  std::vector<int> shape;   // PyTorch order (conv: K, C, R, S)
  size_t offset = 0;        // into the flat buffer
  size_t count = 0;
  bool is_weight() const { return kind == ParamKind::ConvWeight || kind == ParamKind::LinearWeight; }
};

// Index of PyTorch-order (K, C, R, S) element e of a tensor as stored in layout l: conv filters are
// KCRS in NCHW builds and KRSC in NHWC builds; every other tensor is stored as PyTorch orders it.
size_t filter_storage_index(const ParamTensor& t, size_t e, Layout l);

class ParamStore {
 public:
  // Registers a tensor before allocate(); returns its id.
  int add(const std::string& name, ParamKind kind, std::vector<int> shape);
  // Assigns offsets (weights first): the flat layout, without allocating (no GPU needed).
  void assign_offsets();
  // Assigns offsets and allocates the device buffers. training = false (inference): the master
  // weights and their fp16 copy only; no momentum and no gradients.
  void allocate(DType act, bool training = true);

  const std::vector<ParamTensor>& tensors() const { return tensors_; }
  size_t total() const { return total_; }
  size_t weight_count() const { return n_weights_; }
  DType act() const { return act_; }

  float* master(int id) const { return master_.as<float>() + tensors_[id].offset; }
  // The weights the convs and the linear layer read: the fp16 copy, or the fp32 master itself.
  void* working(int id) const;
  // Gradient of a weight tensor (activation type) or of a vector tensor (fp32).
  void* weight_grad(int id) const;
  float* vector_grad(int id) const;

  float* master_all() const { return master_.as<float>(); }
  float* momentum_all() const { return momentum_.as<float>(); }  // nullptr in inference
  void* weight_grads_all() const { return grad_weights_.get(); }
  float* vector_grads_all() const { return grad_vectors_.as<float>(); }
  void* working_copy() const { return act_ == DType::F16 ? working_.get() : nullptr; }

  // After the master weights change from the host (init, resume): refresh the fp16 copy.
  void refresh_working_copy(cudaStream_t stream) const;

 private:
  std::vector<ParamTensor> tensors_;
  size_t total_ = 0, n_weights_ = 0;
  DType act_ = DType::F32;
  DeviceBuffer master_, momentum_, grad_weights_, grad_vectors_, working_;
};
