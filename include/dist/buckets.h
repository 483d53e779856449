// Gradient buckets: which gradients are averaged together, and when a bucket may go.
//
// The flat parameter store (model/params.h) keeps two gradient buffers: conv/linear weights first,
// in the activation type, then the BN gammas/betas and the linear bias, fp32. Tensors are registered
// in forward order and laid out in that order within each buffer, so any run of consecutive tensors
// is one contiguous range in each buffer. A bucket is such a run, taken from the last tensor
// backwards (backward produces gradients in roughly reverse registration order, as PyTorch DDP
// assumes), closed once its gradients reach the size cap: a small first bucket so that
// communication starts early, then --bucket-mb. Reducing a bucket is then at most two collectives
// (its weight range and its vector range), with no packing.
//
// The last bucket holds the first-registered tensors, whose gradients backward produces last: its
// all-reduce starts when backward ends, so none of it can hide behind backward. As PyTorch DDP, it
// is what is left over (18 MB of ResNet-50's 47 MB in fp16 with 25 MB buckets); with a last cap
// (--last-bucket-mb) it is cut from the first tensors forwards instead, closed once it reaches that
// cap, and the rest is planned as before: over a slow link that moves most of those bytes into
// buckets that go while backward still runs.
//
// A bucket is ready when every one of its tensors has reported its gradient; buckets are launched in
// index order (the same order on every rank), each as soon as it and all before it are ready.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "model/params.h"

struct GradBucket {
  int first_tensor = 0, last_tensor = 0;  // registration indices, inclusive (first <= last)
  size_t weight_offset = 0, weight_count = 0;  // elements of the weight-gradient buffer
  size_t vector_offset = 0, vector_count = 0;  // elements of the vector-gradient buffer (from its start)
  size_t bytes = 0;                            // as reduced: weights at `weight_elem_bytes`, vectors fp32
  int tensors() const { return last_tensor - first_tensor + 1; }
};

struct BucketPlan {
  std::vector<GradBucket> buckets;  // in launch order: bucket 0 holds the last-registered tensors
  std::vector<int> bucket_of;       // tensor index -> bucket
};

// `tensors` with their offsets assigned (ParamStore::allocate); `n_weights` elements of weights come
// first. first_cap/cap/last_cap in bytes; cap 0 means one bucket for everything (the naive form);
// last_cap 0 leaves the last bucket what is left over.
BucketPlan plan_buckets(const std::vector<ParamTensor>& tensors, size_t n_weights, size_t weight_elem_bytes,
                        size_t first_cap, size_t cap, size_t last_cap = 0);

// Which buckets may go, step by step, as backward reports gradients (host-side bookkeeping, no GPU).
class BucketTracker {
 public:
  explicit BucketTracker(const BucketPlan& plan);
  // Tensor `t`'s gradient is ready: returns the buckets [first, end) that may be launched now.
  // A tensor reported twice in one step is a Fatal (a hook called twice).
  std::pair<int, int> ready(int t);
  bool all_launched() const { return next_ == static_cast<int>(pending_.size()); }
  int reported() const { return reported_count_; }  // tensors reported since the last reset
  bool was_reported(int t) const { return t >= 0 && t < static_cast<int>(reported_.size()) && reported_[t]; }
  int launched() const { return next_; }
  // The gradients of the next step.
  void reset();

 private:
  const BucketPlan& plan_;
  std::vector<int> pending_;      // per bucket: tensors not yet reported
  std::vector<char> reported_;    // per tensor
  int next_ = 0;                  // first bucket not launched
  int reported_count_ = 0;
};
