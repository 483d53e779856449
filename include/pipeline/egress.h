// Getting results out: outputs copied from the GPU into host buffers, processed (formatted and
// written) by worker threads, and committed in batch order whatever the number of workers. Seed
// 001's second case study, GPU-to-CPU egress, made into one pipeline whose rungs are settings.
//
// Nothing here knows about CUDA: the copy engine is an interface (CUDA streams, events and pinned
// buffers in bin/predict, pipeline/egress_copy.h; plain memory and a thread in the tests), and
// processing is a callback. A batch's life:
//   submit(b), main thread:  take a free slot (wait if none) -> engine.start_copy(slot, b)
//   a worker (or, without workers, the main thread at once):
//     engine.wait_copy(slot) -> process(b, engine.host(slot)) -> engine.release(slot), the slot is free
//     -> the commit that process returned runs once every batch before b has committed.
#pragma once

#include <climits>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

// The rungs of the egress ladder, cumulative in the seed's order, as plain values. The defines are
// read in include/settings.h alone; src/programs/predict.cpp hands this to the predictor.
struct EgressSettings {
  bool workers;        // outputs processed by worker threads (else by the main thread, batch by batch)
  bool pool;           // pre-allocated pinned host buffers (else a fresh pageable buffer every batch)
  bool async_copy;     // cudaMemcpyAsync and a CUDA event per buffer (else a blocking cudaMemcpy)
  bool egress_stream;  // the copies on their own stream, overlapping the next batch's compute
  const char* variant;

  // The rungs that are on, in ladder order: "workers", "pool", "async", "stream".
  std::vector<std::string> rungs() const;
  // The line the binary prints at start and under --help.
  std::string describe() const;
};

class EgressEngine {
 public:
  virtual ~EgressEngine() = default;
  // Main thread: copy the outputs of `batch` (its compute already enqueued) into `slot`'s host
  // buffer. Returns once the copy has started (asynchronous engines) or ended (synchronous ones).
  virtual void start_copy(int slot, int batch) = 0;
  // Any thread: block until the copy into `slot` has landed in host memory.
  virtual void wait_copy(int slot) = 0;
  // The host memory of `slot`, valid from start_copy until release.
  virtual const void* host(int slot) const = 0;
  // The slot's batch has been processed: its buffer may be reused (or freed).
  virtual void release(int slot) = 0;
};

class EgressPipeline {
 public:
  using Commit = std::function<void()>;
  // Makes batch b's results from its host outputs; may run on any worker, batches in any order.
  // What it returns runs on one thread at a time, in batch order: that is where files are written.
  using Process = std::function<Commit(int batch, const void* host)>;

  // workers == 0: the main thread processes each batch inside submit(). `slots`: how many batches
  // may be copied or waiting at once (the engine's buffers); at least 1.
  EgressPipeline(int slots, int workers, EgressEngine& engine, Process process);
  ~EgressPipeline();  // stops the workers; batches not yet processed are dropped (after an error)
  EgressPipeline(const EgressPipeline&) = delete;
  EgressPipeline& operator=(const EgressPipeline&) = delete;

  // Main thread, batches 0, 1, 2, ... in order, each after its compute was enqueued. Rethrows the
  // error of the earliest batch that failed, once every batch before it has committed: the output
  // written is always a whole prefix of the batches, the failed one and everything after left out.
  void submit(int batch);
  // Waits until every submitted batch has been committed; rethrows an error as submit does.
  void finish();
  // Seconds the main thread spent waiting for a free slot since the last call.
  double take_wait_seconds();

 private:
  struct Job {
    int batch, slot;
  };
  void worker_loop(int index);
  void run_job(const Job& job);
  void hand_over(int batch, Commit commit);
  void fail(int batch, std::exception_ptr e);
  void rethrow_if_failed(std::unique_lock<std::mutex>& lock);

  EgressEngine& engine_;
  Process process_;
  std::deque<int> free_slots_;
  std::deque<Job> jobs_;
  std::map<int, Commit> ready_;   // processed batches waiting for the ones before them
  int submitted_ = 0, next_commit_ = 0;
  bool committing_ = false, stop_ = false;
  std::exception_ptr error_;       // the error of batch error_batch_, the earliest that failed
  int error_batch_ = INT_MAX;      // commits stop before it
  double wait_s_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::thread> workers_;
};
