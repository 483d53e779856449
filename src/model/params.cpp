// The flat parameter store: offsets (weights first), allocation (for training or inference), the fp16 working copy.
#include "model/params.h"

#include <cuda_runtime.h>

#include "core/check.h"
#include "kernels/cast.h"

size_t filter_storage_index(const ParamTensor& t, size_t e, Layout l) {
  if (t.kind != ParamKind::ConvWeight || l == Layout::NCHW) return e;
  const size_t C = t.shape[1], R = t.shape[2], S = t.shape[3];
  const size_t s = e % S, r = (e / S) % R, c = (e / (S * R)) % C, k = e / (S * R * C);
  return ((k * R + r) * S + s) * C + c;
}

int ParamStore::add(const std::string& name, ParamKind kind, std::vector<int> shape) {
  if (master_.get()) throw Fatal("ParamStore::add after allocate: " + name);
  ParamTensor t{name, kind, std::move(shape)};
  t.count = 1;
  for (int d : t.shape) t.count *= static_cast<size_t>(d);
  tensors_.push_back(std::move(t));
  return static_cast<int>(tensors_.size()) - 1;
}

void ParamStore::assign_offsets() {
  size_t off = 0;
  for (auto& t : tensors_)
    if (t.is_weight()) { t.offset = off; off += t.count; }
  n_weights_ = off;
  for (auto& t : tensors_)
    if (!t.is_weight()) { t.offset = off; off += t.count; }
  total_ = off;
}

void ParamStore::allocate(DType act, bool training) {
  act_ = act;
  assign_offsets();
  master_ = DeviceBuffer(total_ * sizeof(float), "fp32 master weights");
  if (act == DType::F16) working_ = DeviceBuffer(n_weights_ * 2, "fp16 working weights");
  if (!training) return;
  momentum_ = DeviceBuffer(total_ * sizeof(float), "SGD momentum");
  grad_weights_ = DeviceBuffer(n_weights_ * dtype_size(act), "weight gradients");
  grad_vectors_ = DeviceBuffer((total_ - n_weights_) * sizeof(float), "BN/bias gradients");
  CUDA_CHECK(cudaMemset(momentum_.get(), 0, momentum_.bytes()));
  CUDA_CHECK(cudaMemset(grad_weights_.get(), 0, grad_weights_.bytes()));
  CUDA_CHECK(cudaMemset(grad_vectors_.get(), 0, grad_vectors_.bytes()));
}

void* ParamStore::working(int id) const {
  const ParamTensor& t = tensors_[id];
  if (act_ == DType::F16) return static_cast<char*>(working_.get()) + t.offset * 2;
  return master(id);
}

void* ParamStore::weight_grad(int id) const {
  const ParamTensor& t = tensors_[id];
  if (!t.is_weight()) throw Fatal("weight_grad of a vector parameter: " + t.name);
  if (!grad_weights_.get()) throw Fatal("weight_grad of a store allocated for inference: " + t.name);
  return static_cast<char*>(grad_weights_.get()) + t.offset * dtype_size(act_);
}

float* ParamStore::vector_grad(int id) const {
  const ParamTensor& t = tensors_[id];
  if (t.is_weight()) throw Fatal("vector_grad of a weight parameter: " + t.name);
  if (!grad_vectors_.get()) throw Fatal("vector_grad of a store allocated for inference: " + t.name);
  return grad_vectors_.as<float>() + (t.offset - n_weights_);
}

void ParamStore::refresh_working_copy(cudaStream_t stream) const {
  if (act_ == DType::F16) cast_f32_to_f16(master_all(), working_.get(), n_weights_, stream);
}
