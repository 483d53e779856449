// Bucket plans and readiness (buckets.h).
#include "dist/buckets.h"

#include <algorithm>
#include <limits>
#include <string>
#include <tuple>

#include "core/errors.h"

namespace {

// The contiguous range [offset, offset + count) the listed tensors cover in one buffer; a Fatal if
// they do not tile it (the store was laid out in another order than registration).
std::pair<size_t, size_t> covered_range(const std::vector<ParamTensor>& tensors, int first, int last, bool weights,
                                        size_t base) {
  size_t lo = std::numeric_limits<size_t>::max(), hi = 0, sum = 0;
  for (int i = first; i <= last; ++i) {
    const ParamTensor& t = tensors[i];
    if (t.is_weight() != weights) continue;
    lo = std::min(lo, t.offset);
    hi = std::max(hi, t.offset + t.count);
    sum += t.count;
  }
  if (sum == 0) return {0, 0};
  if (hi - lo != sum) throw Fatal("gradient buckets: parameters " + tensors[first].name + " .. " + tensors[last].name +
                                  " are not contiguous in the flat store");
  return {lo - base, sum};
}

}  // namespace

BucketPlan plan_buckets(const std::vector<ParamTensor>& tensors, size_t n_weights, size_t weight_elem_bytes,
                        size_t first_cap, size_t cap, size_t last_cap) {
  BucketPlan plan;
  plan.bucket_of.assign(tensors.size(), -1);
  const size_t no_cap = std::numeric_limits<size_t>::max();
  const auto bytes_of = [&](int i) { return tensors[i].count * (tensors[i].is_weight() ? weight_elem_bytes : sizeof(float)); };
  const auto close = [&](int first, int last, size_t bytes) {
    GradBucket b;
    b.first_tensor = first;
    b.last_tensor = last;
    std::tie(b.weight_offset, b.weight_count) = covered_range(tensors, first, last, true, 0);
    std::tie(b.vector_offset, b.vector_count) = covered_range(tensors, first, last, false, n_weights);
    b.bytes = bytes;
    for (int k = first; k <= last; ++k) plan.bucket_of[k] = static_cast<int>(plan.buckets.size());
    plan.buckets.push_back(b);
  };
  // The last bucket, cut first when capped: tensors [0, lo) from the first forwards.
  int lo = 0;
  size_t tail_bytes = 0;
  if (cap != 0 && last_cap != 0) {
    while (lo < static_cast<int>(tensors.size()) - 1 && tail_bytes < last_cap) tail_bytes += bytes_of(lo++);
  }
  size_t bytes = 0;
  int last = static_cast<int>(tensors.size()) - 1;
  for (int i = last; i >= lo; --i) {
    bytes += bytes_of(i);
    const size_t limit = cap == 0 ? no_cap : plan.buckets.empty() ? first_cap : cap;
    if (bytes < limit && i > lo) continue;
    close(i, last, bytes);
    bytes = 0;
    last = i - 1;
  }
  if (lo > 0) close(0, lo - 1, tail_bytes);
  return plan;
}

BucketTracker::BucketTracker(const BucketPlan& plan) : plan_(plan) { reset(); }

void BucketTracker::reset() {
  pending_.clear();
  for (const GradBucket& b : plan_.buckets) pending_.push_back(b.tensors());
  reported_.assign(plan_.bucket_of.size(), 0);
  next_ = 0;
  reported_count_ = 0;
}

std::pair<int, int> BucketTracker::ready(int t) {
  if (t < 0 || t >= static_cast<int>(reported_.size())) throw Fatal("gradient hook: no parameter " + std::to_string(t));
  if (reported_[t]) throw Fatal("gradient hook: parameter " + std::to_string(t) + " reported twice in one step");
  reported_[t] = 1;
  ++reported_count_;
  --pending_[plan_.bucket_of[t]];
  const int first = next_;
  while (next_ < static_cast<int>(pending_.size()) && pending_[next_] == 0) ++next_;
  return {first, next_};
}
