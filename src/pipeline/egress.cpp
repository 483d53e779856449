// The egress pipeline's slots, workers and in-order commits (no CUDA here), and the ladder's names.
#include "pipeline/egress.h"

#include <chrono>

#include "core/elapsed.h"
#include "core/errors.h"
#include "measure/profiling.h"

std::vector<std::string> EgressSettings::rungs() const {
  std::vector<std::string> on;
  if (workers) on.push_back("workers");
  if (pool) on.push_back("pool");
  if (async_copy) on.push_back("async");
  if (egress_stream) on.push_back("stream");
  return on;
}

std::string EgressSettings::describe() const {
  std::string names;
  for (const std::string& r : rungs()) names += (names.empty() ? "" : " ") + r;
  return std::string(variant) + ": egress [" + (names.empty() ? "none: the baseline" : names) + "] -> outputs processed by " +
         (workers ? "worker threads" : "the main thread") + ", copied into " +
         (pool ? "a pool of pinned buffers" : "a new pageable buffer each batch") + " by " +
         (async_copy ? "cudaMemcpyAsync with an event per buffer" : "a blocking cudaMemcpy") + " on " +
         (egress_stream ? "their own stream, overlapping the next batch's compute" : "the compute stream");
}

EgressPipeline::EgressPipeline(int slots, int workers, EgressEngine& engine, Process process)
    : engine_(engine), process_(std::move(process)) {
  if (slots < 1 || workers < 0) throw Fatal("EgressPipeline: needs >= 1 slot and >= 0 workers");
  for (int s = 0; s < slots; ++s) free_slots_.push_back(s);
  for (int i = 0; i < workers; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

EgressPipeline::~EgressPipeline() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void EgressPipeline::submit(int batch) {
  int slot;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (batch != submitted_) throw Fatal("EgressPipeline: batch " + std::to_string(batch) + " submitted out of order");
    const auto t0 = std::chrono::steady_clock::now();
    cv_.wait(lock, [&] { return !free_slots_.empty() || error_; });
    wait_s_ += seconds_since(t0);
    rethrow_if_failed(lock);
    slot = free_slots_.front();
    free_slots_.pop_front();
    ++submitted_;
  }
  {
    NvtxRange r("copy to CPU", phase_color::kYellow);
    engine_.start_copy(slot, batch);
  }
  if (workers_.empty()) {
    run_job({batch, slot});
    std::unique_lock<std::mutex> lock(mu_);
    rethrow_if_failed(lock);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back({batch, slot});
  }
  cv_.notify_all();
}

void EgressPipeline::worker_loop(int index) {
  name_this_thread(("output " + std::to_string(index)).c_str());
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
    if (stop_) return;
    const Job job = jobs_.front();
    jobs_.pop_front();
    lock.unlock();
    run_job(job);
    lock.lock();
  }
}

// The batch's copy, its processing and the slot's release; its commit goes to hand_over. Errors are
// kept for the main thread, which rethrows them at its next call.
void EgressPipeline::run_job(const Job& job) {
  Commit commit;
  try {
    NvtxRange r("process output", phase_color::kCyan);
    engine_.wait_copy(job.slot);
    commit = process_(job.batch, engine_.host(job.slot));
    engine_.release(job.slot);
  } catch (...) {
    fail(job.batch, std::current_exception());
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    free_slots_.push_back(job.slot);
  }
  cv_.notify_all();
  hand_over(job.batch, std::move(commit));
}

// Queues batch b's commit and runs every commit that is due, in order, on this thread; a thread that
// finds another one committing leaves its commit to it. After an error at batch f the batches before
// f still commit (a worker may finish batch f-1 after f failed); none from f on.
void EgressPipeline::hand_over(int batch, Commit commit) {
  std::unique_lock<std::mutex> lock(mu_);
  ready_.emplace(batch, std::move(commit));
  if (committing_) return;
  committing_ = true;
  for (auto it = ready_.find(next_commit_); it != ready_.end() && next_commit_ < error_batch_;
       it = ready_.find(next_commit_)) {
    Commit due = std::move(it->second);
    ready_.erase(it);
    lock.unlock();
    try {
      if (due) due();
    } catch (...) {
      lock.lock();
      committing_ = false;
      const int failed = next_commit_;
      lock.unlock();
      fail(failed, std::current_exception());
      return;
    }
    lock.lock();
    ++next_commit_;
  }
  committing_ = false;
  cv_.notify_all();
}

// Keeps the error of the earliest failed batch: a worker may fail at batch 7 before another fails at 5.
void EgressPipeline::fail(int batch, std::exception_ptr e) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (batch < error_batch_) {
      error_batch_ = batch;
      error_ = e;
    }
  }
  cv_.notify_all();
}

// Every batch before the failed one was submitted, so each either commits or fails itself (which
// lowers error_batch_): the wait ends.
void EgressPipeline::rethrow_if_failed(std::unique_lock<std::mutex>& lock) {
  if (!error_) return;
  cv_.wait(lock, [&] { return next_commit_ >= error_batch_ && !committing_; });
  std::rethrow_exception(error_);
}

void EgressPipeline::finish() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return (next_commit_ == submitted_ && !committing_) || error_; });
  rethrow_if_failed(lock);
}

double EgressPipeline::take_wait_seconds() {
  std::lock_guard<std::mutex> lock(mu_);
  const double w = wait_s_;
  wait_s_ = 0;
  return w;
}
