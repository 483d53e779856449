// The pinned loader's ring of three batch slots and its worker threads (no CUDA here).
#include "pipeline/batch_ring.h"

#include <string>

#include "core/errors.h"
#include "measure/profiling.h"

BatchRing::BatchRing(int slots, int workers, int batch_size, FillFn fill, CopyEngine& engine)
    : slots_(slots),
      parts_(workers < batch_size ? workers : batch_size),
      batch_size_(batch_size),
      fill_(std::move(fill)),
      engine_(engine),
      slot_(slots) {
  if (slots < 2 || workers < 1 || batch_size < 1) throw Fatal("BatchRing: needs >= 2 slots, >= 1 worker");
  for (int i = 0; i < workers; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

BatchRing::~BatchRing() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

// The next task's batch may start when its slot is free or its previous batch has been released,
// unless a fill has failed.
bool BatchRing::claimable() const {
  const long b = next_task_ / parts_;
  if (b >= batches_ || failed_batch_ >= 0) return false;
  if (next_task_ % parts_ != 0) return true;  // later parts follow the first
  const Slot& s = slot_[b % slots_];
  return s.owner == -1 || (s.owner == b - slots_ && s.released);
}

void BatchRing::worker_loop(int index) {
  name_this_thread(("loader " + std::to_string(index)).c_str());
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || claimable(); });
    if (stop_) return;
    const int b = static_cast<int>(next_task_ / parts_), part = static_cast<int>(next_task_ % parts_);
    ++next_task_;
    ++in_flight_;
    const int si = b % slots_;
    Slot& s = slot_[si];
    bool must_wait = false;
    if (part == 0) {
      s.owner = b;
      s.parts_done = 0;
      s.released = false;
      must_wait = s.copy_pending;
      s.ready = !must_wait;
    }
    cv_.notify_all();  // the next task may be claimable now
    std::exception_ptr error;  // handed to the consumer, never out of this thread
    if (must_wait) {
      lock.unlock();
      try {
        engine_.wait_copy(si);
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      s.copy_pending = false;
      s.ready = true;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return s.ready || stop_; });
      if (stop_) return;
    }
    const int first = static_cast<int>(int64_t(batch_size_) * part / parts_);
    const int end = static_cast<int>(int64_t(batch_size_) * (part + 1) / parts_);
    lock.unlock();
    if (!error) {
      NvtxRange r("fill batch " + std::to_string(b), phase_color::kGrey);
      try {
        fill_(si, b, first, end);
      } catch (...) {
        error = std::current_exception();
      }
    }
    lock.lock();
    if (error && (failed_batch_ < 0 || b < failed_batch_)) {
      failed_batch_ = b;
      failure_ = error;
    }
    ++s.parts_done;
    --in_flight_;
    cv_.notify_all();
  }
}

void BatchRing::begin_pass(int first, int end) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return in_flight_ == 0; });
  first_ = first;
  batches_ = end;
  next_task_ = long(first) * parts_;
  failed_batch_ = -1;
  failure_ = nullptr;
  for (Slot& s : slot_) {  // unconsumed batches are dropped; pending copies still block refills
    s.owner = -1;
    s.parts_done = 0;
    s.released = false;
  }
  cv_.notify_all();
}

int BatchRing::acquire(int k) {
  std::unique_lock<std::mutex> lock(mu_);
  if (k < first_ || k >= batches_) throw Fatal("BatchRing: batch " + std::to_string(k) + " is not in the pass");
  Slot& s = slot_[k % slots_];
  cv_.wait(lock, [&] { return failed_before(k) || (s.owner == k && s.parts_done == parts_); });
  if (failed_before(k)) std::rethrow_exception(failure_);
  return k % slots_;
}

void BatchRing::release(int k) {
  const int si = k % slots_;
  engine_.start_copy(si, k);
  {
    std::lock_guard<std::mutex> lock(mu_);
    slot_[si].released = true;
    slot_[si].copy_pending = true;
  }
  cv_.notify_all();
}
