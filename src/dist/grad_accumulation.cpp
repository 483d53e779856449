// Gradient accumulation over micro-batches (grad_accumulation.h).
#include "dist/grad_accumulation.h"

#include <string>

#include "core/errors.h"
#include "kernels/accumulate.h"

EpochPlan micro_batch_plan(EpochPlan p, int steps, int count) {
  if (count < 1 || long(steps) * count > p.steps)
    throw Fatal("micro-batch plan: " + std::to_string(steps) + " steps of " + std::to_string(count) +
                " micro-batches from a plan of " + std::to_string(p.steps) + " batches");
  if (count == 1) return p;
  p.steps = steps * count;
  p.valid_last = p.batch;  // a training pass has no padded batch: a partial one was dropped
  return p;
}

GradAccumulation::GradAccumulation(const ParamStore& params, int micro_batches)
    : params_(params),
      count_(micro_batches),
      scale_(1.f / static_cast<float>(micro_batches)),
      weight_sums_(params.weight_count() * sizeof(float), "accumulated weight gradients (--accumulate)"),
      vector_sums_((params.total() - params.weight_count()) * sizeof(float), "accumulated BN/bias gradients (--accumulate)") {
  if (micro_batches < 2) throw Fatal("gradient accumulation over " + std::to_string(micro_batches) + " micro-batches");
}

void GradAccumulation::add(const MicroBatch& m, cudaStream_t stream) {
  const size_t n_vectors = params_.total() - params_.weight_count();
  accumulate_grads(params_.weight_grads_all(), params_.act(), weight_sums_.as<float>(), params_.weight_count(), scale_,
                   m.first(), stream);
  accumulate_grads(params_.vector_grads_all(), DType::F32, vector_sums_.as<float>(), n_vectors, scale_, m.first(),
                   stream);
}

void GradAccumulation::finish(size_t w_offset, size_t w_count, size_t v_offset, size_t v_count, cudaStream_t stream) {
  void* w = static_cast<char*>(params_.weight_grads_all()) + w_offset * dtype_size(params_.act());
  finish_accumulation(w, params_.act(), weight_sums_.as<float>() + w_offset, w_count, scale_, stream);
  finish_accumulation(params_.vector_grads_all() + v_offset, DType::F32, vector_sums_.as<float>() + v_offset, v_count,
                      scale_, stream);
}

void GradAccumulation::finish_all(cudaStream_t stream) {
  finish(0, params_.weight_count(), 0, params_.total() - params_.weight_count(), stream);
}
