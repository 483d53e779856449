// The ring behind the pinned loader: worker threads fill batches into a few host slots, the
// consumer takes them in order and hands each to a copy engine, and no slot is refilled before its
// copy has ended.
//
// Nothing here knows about CUDA: the copy engine is an interface (CUDA streams and events in the
// trainer, plain memcpy on a thread in the tests), and filling is a callback. A batch is split into
// parts so that several workers fill one batch together.
//
// Slot life: free -> claimed by batch b (its first worker waits for the slot's previous copy) ->
// parts filled -> filled -> released by the consumer (copy started) -> claimed by batch b + slots.
//
// A fill that throws (an image that does not decode) does not end the worker thread: the workers
// stop claiming batches, and the consumer gets the exception, on its own thread, from acquire() of
// that batch (batches before it are served as usual). Nothing waits for a batch that will never
// come, so nothing hangs.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

class CopyEngine {
 public:
  virtual ~CopyEngine() = default;
  // Consumer thread: start copying `slot` (holding `batch`) out of host memory.
  virtual void start_copy(int slot, int batch) = 0;
  // Worker thread: block until the last copy started from `slot` has finished reading it.
  virtual void wait_copy(int slot) = 0;
};

class BatchRing {
 public:
  // fill(slot, batch, first_sample, end_sample) writes those samples of the batch into the slot.
  using FillFn = std::function<void(int slot, int batch, int first, int end)>;

  BatchRing(int slots, int workers, int batch_size, FillFn fill, CopyEngine& engine);
  ~BatchRing();  // stops the workers, also in the middle of a pass
  BatchRing(const BatchRing&) = delete;
  BatchRing& operator=(const BatchRing&) = delete;

  // Starts a pass over batches first, first + 1, ..., end - 1, requested in that order (first > 0:
  // a run resumed inside an epoch). Batches of an unfinished pass are dropped (after their workers
  // finish).
  void begin_pass(int first, int end);
  // Waits until batch k is filled; returns its slot. Rethrows the exception of a fill of batch k (or
  // of an earlier one, which stopped the workers before they reached k).
  int acquire(int k);
  // Starts the copy of batch k (acquired before); its slot may be refilled once the copy has ended.
  void release(int k);

 private:
  struct Slot {
    int owner = -1;          // batch it holds or is being filled with; -1 free
    int parts_done = 0;
    bool ready = true;       // the previous copy has ended; workers may write
    bool released = false;   // the consumer has started its copy
    bool copy_pending = false;
  };
  void worker_loop(int index);
  bool claimable() const;
  bool failed_before(int k) const { return failed_batch_ >= 0 && k >= failed_batch_; }

  const int slots_, parts_, batch_size_;
  FillFn fill_;
  CopyEngine& engine_;
  std::vector<Slot> slot_;
  int first_ = 0, batches_ = 0;  // the pass: batches first_ .. batches_ - 1
  long next_task_ = 0;       // task t = (batch t / parts, part t % parts)
  int in_flight_ = 0;        // parts claimed but not finished
  bool stop_ = false;
  int failed_batch_ = -1;            // the earliest batch of this pass whose fill threw; -1: none
  std::exception_ptr failure_;       // what it threw
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::thread> workers_;
};
