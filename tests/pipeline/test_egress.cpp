// The egress pipeline on the CPU: host slots of plain memory and a stand-in copy engine that
// "copies" a batch's outputs into its slot on its own thread after a random delay (as DMA lands
// while the host goes on), or at once (a blocking copy). Checked, for 0 to 16 workers and 1 to 8
// slots: commits come in batch order; every batch is processed from its own bytes, after its copy
// landed; no slot is copied into while it is still owned (copied or being processed); commits never
// overlap; errors in processing or committing reach the main thread; the pipeline can be torn down
// mid-run. Every scenario runs under a watchdog (a deadlock fails, never hangs).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/errors.h"
#include "pipeline/egress.h"
#include "support/watchdog.h"

namespace {

using test_threads::run_with_watchdog;

constexpr int kSlotBytes = 64;

uint8_t pattern(int batch, int j) { return static_cast<uint8_t>((batch * 131 + j * 7 + (batch >> 8)) ^ 0x5A); }

// Slots of plain memory; an asynchronous engine copies on its own thread (a FIFO, like a stream).
class StandInEngine : public EgressEngine {
 public:
  StandInEngine(int slots, bool async, int max_copy_us = 300)
      : async_(async), max_copy_us_(max_copy_us), memory_(slots, std::vector<uint8_t>(kSlotBytes)), landed_(slots, true),
        owned_(slots, false) {
    if (async_) thread_ = std::thread([this] { run(); });
  }
  ~StandInEngine() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  void start_copy(int slot, int batch) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (owned_[slot]) reused_while_owned_++;
    owned_[slot] = true;
    in_use_++;
    max_in_use_ = std::max(max_in_use_, in_use_);
    landed_[slot] = false;
    if (!async_) {
      copy(slot, batch);
      return;
    }
    queue_.push_back({slot, batch});
    cv_.notify_all();
  }
  void wait_copy(int slot) override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return bool(landed_[slot]); });
  }
  const void* host(int slot) const override { return memory_[slot].data(); }
  void release(int slot) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!owned_[slot] || !landed_[slot]) bad_releases_++;
    owned_[slot] = false;
    in_use_--;
    std::fill(memory_[slot].begin(), memory_[slot].end(), 0xEE);  // a processed slot's bytes are gone
  }

  int reused_while_owned() const { return reused_while_owned_; }
  int bad_releases() const { return bad_releases_; }
  int max_in_use() const { return max_in_use_; }

 private:
  void copy(int slot, int batch) {  // under mu_
    for (int j = 0; j < kSlotBytes; ++j) memory_[slot][j] = pattern(batch, j);
    landed_[slot] = true;
    cv_.notify_all();
  }
  void run() {
    std::mt19937 rng(7);
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      const auto [slot, batch] = queue_.front();
      queue_.pop_front();
      const int delay = std::uniform_int_distribution<int>(0, max_copy_us_)(rng);
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(delay));
      lock.lock();
      copy(slot, batch);
    }
  }

  bool async_;
  int max_copy_us_;
  std::vector<std::vector<uint8_t>> memory_;
  std::vector<char> landed_, owned_;
  std::deque<std::pair<int, int>> queue_;
  int reused_while_owned_ = 0, bad_releases_ = 0, in_use_ = 0, max_in_use_ = 0;
  bool stop_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread thread_;
};

// What the process and commit callbacks saw.
struct Recorder {
  std::vector<int> committed;     // written by commits only: they never overlap
  std::atomic<int> bad_content{0}, overlapping_commits{0}, in_commit{0};
  int max_process_us = 300;

  EgressPipeline::Process process() {
    return [this](int batch, const void* host) -> EgressPipeline::Commit {
      const auto* bytes = static_cast<const uint8_t*>(host);
      for (int j = 0; j < kSlotBytes; ++j)
        if (bytes[j] != pattern(batch, j)) {
          bad_content++;
          break;
        }
      thread_local std::mt19937 rng(std::hash<std::thread::id>()(std::this_thread::get_id()));
      std::this_thread::sleep_for(std::chrono::microseconds(std::uniform_int_distribution<int>(0, max_process_us)(rng)));
      return [this, batch] {
        if (in_commit++ != 0) overlapping_commits++;
        committed.push_back(batch);
        in_commit--;
      };
    };
  }
};

std::vector<int> iota(int n) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

// Submits batches 0..batches-1 and finishes; the message of the InputError that came out of it
// ("" and a test failure when none did).
std::string input_error_of_run(EgressPipeline& pipe, int batches) {
  try {
    for (int b = 0; b < batches; ++b) pipe.submit(b);
    pipe.finish();
  } catch (const InputError& e) {
    return e.what();
  }
  ADD_FAILURE() << "the error was lost";
  return "";
}

TEST(EgressPipeline, CommitsInBatchOrderWhateverTheWorkers) {
  for (bool async : {false, true})
    for (int workers : {0, 1, 2, 3, 8, 16})
      for (int slots : {1, 2, 3, 8}) {
        const std::string config = std::string(async ? "async" : "sync") + " copies, workers " +
                                   std::to_string(workers) + ", slots " + std::to_string(slots);
        SCOPED_TRACE(config);
        run_with_watchdog([&] {
          SCOPED_TRACE(config);
          StandInEngine engine(slots, async);
          Recorder rec;
          {
            EgressPipeline pipe(slots, workers, engine, rec.process());
            for (int b = 0; b < 40; ++b) pipe.submit(b);
            pipe.finish();
          }
          EXPECT_EQ(rec.committed, iota(40));
          EXPECT_EQ(rec.bad_content.load(), 0) << "a batch was processed from bytes that were not its own";
          EXPECT_EQ(rec.overlapping_commits.load(), 0);
          EXPECT_EQ(engine.reused_while_owned(), 0) << "a slot was copied into before its batch was processed";
          EXPECT_EQ(engine.bad_releases(), 0) << "a slot was released before its copy landed";
          EXPECT_LE(engine.max_in_use(), slots);
        });
        if (HasFatalFailure()) return;
      }
}

TEST(EgressPipeline, SlowWorkersHoldTheMainThreadAtTheSlotLimit) {
  run_with_watchdog([] {
    StandInEngine engine(2, true, 0);
    Recorder rec;
    rec.max_process_us = 3000;
    EgressPipeline pipe(2, 4, engine, rec.process());
    EXPECT_EQ(pipe.take_wait_seconds(), 0.0);
    for (int b = 0; b < 12; ++b) pipe.submit(b);
    pipe.finish();
    EXPECT_GT(pipe.take_wait_seconds(), 0.0) << "2 slots and slow processing: submit must have waited";
    EXPECT_EQ(pipe.take_wait_seconds(), 0.0) << "taking the wait resets it";
    EXPECT_EQ(rec.committed, iota(12));
    EXPECT_LE(engine.max_in_use(), 2);
  });
}

TEST(EgressPipeline, AnErrorInProcessingReachesTheMainThread) {
  for (int workers : {0, 1, 4}) {
    SCOPED_TRACE("workers " + std::to_string(workers));
    run_with_watchdog([&] {
      StandInEngine engine(3, true);
      std::vector<int> committed;
      // Batch 4 is slow, so with workers batch 5 fails while 4 is still being processed: 4 must
      // still be written (the output is a whole prefix), and the error reported after it.
      auto process = [&](int batch, const void*) -> EgressPipeline::Commit {
        if (batch == 4) std::this_thread::sleep_for(std::chrono::milliseconds(30));
        if (batch == 5) throw InputError("disk full at batch 5");
        return [&committed, batch] { committed.push_back(batch); };
      };
      EgressPipeline pipe(3, workers, engine, process);
      EXPECT_EQ(input_error_of_run(pipe, 50), "disk full at batch 5");
      EXPECT_EQ(committed, iota(5)) << "nothing after the failed batch is committed";
    });
  }
}

TEST(EgressPipeline, TheEarliestFailedBatchIsTheErrorReported) {
  run_with_watchdog([] {
    StandInEngine engine(4, true);
    std::vector<int> committed;
    // Batch 7 fails first in time, batch 5 later: the error of 5 is the one the user sees, and 0..4
    // are written.
    auto process = [&](int batch, const void*) -> EgressPipeline::Commit {
      if (batch == 5) {
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
        throw InputError("batch 5 failed");
      }
      if (batch == 7) throw InputError("batch 7 failed");
      return [&committed, batch] { committed.push_back(batch); };
    };
    EgressPipeline pipe(4, 4, engine, process);
    EXPECT_EQ(input_error_of_run(pipe, 30), "batch 5 failed");
    EXPECT_EQ(committed, iota(5));
  });
}

TEST(EgressPipeline, AnErrorInACommitReachesTheMainThread) {
  run_with_watchdog([] {
    StandInEngine engine(4, true);
    auto process = [](int batch, const void*) -> EgressPipeline::Commit {
      return [batch] {
        if (batch == 2) throw Fatal("write failed");
      };
    };
    EgressPipeline pipe(4, 3, engine, process);
    EXPECT_THROW(
        {
          for (int b = 0; b < 20; ++b) pipe.submit(b);
          pipe.finish();
        },
        Fatal);
  });
}

TEST(EgressPipeline, TornDownMidRunWithoutFinishing) {
  for (int workers : {0, 2, 8})
    run_with_watchdog([&] {
      StandInEngine engine(3, true, 2000);
      Recorder rec;
      rec.max_process_us = 2000;
      {
        EgressPipeline pipe(3, workers, engine, rec.process());
        for (int b = 0; b < 6; ++b) pipe.submit(b);
      }  // an early stop: the destructor must not wait for batches nobody will commit
      for (size_t i = 0; i < rec.committed.size(); ++i) EXPECT_EQ(rec.committed[i], int(i));
    });
}

TEST(EgressPipeline, MisuseIsFatal) {
  run_with_watchdog([] {
    StandInEngine engine(2, false);
    Recorder rec;
    EXPECT_THROW(EgressPipeline(0, 1, engine, rec.process()), Fatal);
    EXPECT_THROW(EgressPipeline(2, -1, engine, rec.process()), Fatal);
    EgressPipeline pipe(2, 1, engine, rec.process());
    EXPECT_THROW(pipe.submit(1), Fatal) << "batch 1 before batch 0";
    pipe.submit(0);
    pipe.finish();
    EXPECT_EQ(rec.committed, iota(1));
  });
}

TEST(EgressSettings, NamesTheRungsInLadderOrder) {
  const EgressSettings none{false, false, false, false, "predict-baseline"};
  EXPECT_TRUE(none.rungs().empty());
  EXPECT_EQ(none.describe().rfind("predict-baseline: egress [none: the baseline] -> ", 0), 0u) << none.describe();
  const EgressSettings all{true, true, true, true, "predict"};
  EXPECT_EQ(all.rungs(), (std::vector<std::string>{"workers", "pool", "async", "stream"}));
  EXPECT_NE(all.describe().find("own stream"), std::string::npos);
  const EgressSettings pool{true, true, false, false, "predict-pool"};
  EXPECT_NE(pool.describe().find("blocking cudaMemcpy"), std::string::npos);
  EXPECT_NE(pool.describe().find("pinned"), std::string::npos);
}

}  // namespace
