// Softmax cross-entropy, fused: bias, loss, accuracy, gradient and the running totals in one launch.
//
// One block handles the whole batch (a few hundred rows of 10 logits), which makes the batch sums
// deterministic and lets a single thread fold them into the epoch totals without atomics.
#include <cfloat>

#include "loss.h"
#include "common.cuh"

namespace trainer_kernels {  // why: kernels/common.cuh
namespace {

constexpr int kThreads = 256;
constexpr int kMaxClasses = kSoftmaxMaxClasses;  // per-thread arrays of logits and bias gradients

template <class T>
__global__ void __launch_bounds__(kThreads)
softmax_xent_kernel(float* logits, const float* bias, const int32_t* labels, int n, int classes,
                    T* dlogits, float* dbias, const float* loss_scale, float smoothing, LossTotals* totals,
                    const long long* step) {
  chain_wait();  // launched chained (kernels/chained_launch.h)
  constexpr int kWarps = kThreads / 32;
  // Sums go lane to lane in each warp, then warp by warp in warp order (the same order every run):
  // a shared-memory tree of 8 barriers took 10.1 us of the kernel at batch 256, this 8.8 (H200).
  __shared__ float s_valid[kWarps], s_loss[kWarps], s_correct[kWarps], s_dbias[kMaxClasses][kWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Pass 1: how many samples count (label >= 0); the mean is over them.
  float valid = 0;
  for (int i = threadIdx.x; i < n; i += kThreads) valid += labels[i] >= 0 ? 1.f : 0.f;
  valid = warp_sum(valid);
  if (lane == 0) s_valid[warp] = valid;
  __syncthreads();
  float n_valid = 0;
  for (int w = 0; w < kWarps; ++w) n_valid += s_valid[w];
  const float grad_scale = (loss_scale ? *loss_scale : 1.f) / (n_valid > 0 ? n_valid : 1.f);
  // The target: `on` at the label, `off` at every other class (one-hot without smoothing).
  const float off = smoothing / classes, on = 1.f - smoothing + off;

  float loss = 0, correct = 0, db[kMaxClasses] = {};
  for (int i = threadIdx.x; i < n; i += kThreads) {
    float z[kMaxClasses];
    float zmax = -FLT_MAX;
    int arg = 0;
    for (int j = 0; j < classes; ++j) {
      z[j] = logits[size_t(i) * classes + j] + bias[j];
      logits[size_t(i) * classes + j] = z[j];
      if (z[j] > zmax) { zmax = z[j]; arg = j; }
    }
    const int y = labels[i];
    float sum = 0;
    for (int j = 0; j < classes; ++j) sum += expf(z[j] - zmax);
    if (y >= 0) {
      // -sum_j target_j * log softmax_j, log softmax_j = z_j - lse: the label's term, and with smoothing
      // every class's share (without, the plain loss stays bit for bit what it was).
      const float lse = logf(sum) + zmax;
      if (smoothing > 0) {
        float every = 0;
        for (int j = 0; j < classes; ++j) every += lse - z[j];
        loss += (1.f - smoothing) * (lse - z[y]) + off * every;
      } else {
        loss += lse - z[y];
      }
      correct += arg == y ? 1.f : 0.f;
    }
    if (dlogits) {
      for (int j = 0; j < classes; ++j) {
        const float g = y >= 0 ? (expf(z[j] - zmax) / sum - (j == y ? on : off)) * grad_scale : 0.f;
        dlogits[size_t(i) * classes + j] = from_float<T>(g);
        db[j] += g;
      }
    }
  }
  loss = warp_sum(loss);
  correct = warp_sum(correct);
  for (int j = 0; j < classes; ++j) db[j] = warp_sum(db[j]);
  if (lane == 0) {
    s_loss[warp] = loss;
    s_correct[warp] = correct;
    for (int j = 0; j < classes; ++j) s_dbias[j][warp] = db[j];
  }
  __syncthreads();
  if (threadIdx.x < classes) {
    float t = 0;
    for (int w = 0; w < kWarps; ++w) t += s_dbias[threadIdx.x][w];
    if (dbias) dbias[threadIdx.x] = t;
  }
  if (threadIdx.x == 0 && n_valid > 0) {
    float loss_sum = 0, correct_sum = 0;
    for (int w = 0; w < kWarps; ++w) loss_sum += s_loss[w], correct_sum += s_correct[w];
    const float mean = loss_sum / n_valid;
    totals->loss_sum += loss_sum;
    totals->correct += static_cast<unsigned long long>(correct_sum);
    totals->count += static_cast<unsigned long long>(n_valid);
    totals->last_loss = mean;
    if (isfinite(mean)) totals->last_good_loss = mean;
    else if (step && totals->first_bad_step < 0) totals->first_bad_step = *step;
  }
}

__global__ void record_loss_kernel(const LossTotals* totals, const int* slot, float* history) {
  chain_wait();  // launched chained (kernels/chained_launch.h)
  history[*slot] = totals->last_loss;
}

}  // namespace
}  // namespace trainer_kernels
using namespace trainer_kernels;

void softmax_xent(float* logits, const float* bias, const int32_t* labels, int n, int classes,
                  void* dlogits, DType dlogits_type, float* dbias, const float* loss_scale, float label_smoothing,
                  LossTotals* totals, const long long* step, cudaStream_t stream) {
  if (classes > kMaxClasses) throw Fatal("softmax_xent: at most 16 classes");
  if (!(label_smoothing >= 0.f && label_smoothing < 1.f)) throw Fatal("softmax_xent: label smoothing outside [0, 1)");
  dispatch_dtype(dlogits_type, [&]<class T>() {
    launch_chained(softmax_xent_kernel<T>, 1, kThreads, 0, stream, logits, bias, labels, n, classes,
                   static_cast<T*>(dlogits), dbias, loss_scale, label_smoothing, totals, step);
  });
  CUDA_CHECK_LAUNCH();
}

void record_loss(const LossTotals* totals, const int* slot, float* history, cudaStream_t stream) {
  launch_chained(record_loss_kernel, 1, 1, 0, stream, totals, slot, history);
  CUDA_CHECK_LAUNCH();
}
