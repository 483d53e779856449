// The pinned loader's ring on the CPU: plain memory for the slots and a stand-in copy engine that
// "copies" each released slot on its own thread after a random 0-2 ms, re-checking the slot's bytes
// as it reads them. Checked: batch order and content over several passes, that no slot is written
// while its copy is in flight, several worker counts (also more workers than samples), a shutdown in
// the middle of a pass, a pass abandoned halfway, and a fill that throws. Every scenario runs under a
// watchdog, so a deadlock fails the test instead of hanging the suite.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <initializer_list>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "pipeline/batch_ring.h"
#include "core/errors.h"
#include "support/watchdog.h"

namespace {

constexpr int kSampleBytes = 24;

// The byte j of sample i of batch b in pass p: every (p, b, i, j) gives its own value, so a sample
// from another batch, pass or position is caught.
uint8_t pattern(int p, int b, int i, int j) {
  uint64_t x = (uint64_t(p) << 48) ^ (uint64_t(b) << 24) ^ (uint64_t(i) << 8) ^ uint64_t(j);
  x = (x ^ (x >> 31)) * 0x9E3779B97F4A7C15ull;
  return static_cast<uint8_t>((x ^ (x >> 29)) >> 7);
}

using test_threads::run_with_watchdog;

// Runs scenario(workers) under the watchdog for each worker count, traced with it.
void for_each_worker_count(std::initializer_list<int> counts, const std::function<void(int)>& scenario) {
  for (int workers : counts) {
    const std::string config = "workers " + std::to_string(workers);
    SCOPED_TRACE(config);
    run_with_watchdog([&] {
      SCOPED_TRACE(config);  // traces are per thread
      scenario(workers);
    });
  }
}

struct Delivery {
  int pass, batch;
  bool content_ok;
};

// The stand-in copy engine: a FIFO of copies served by one thread, like a CUDA stream.
class ThreadCopyEngine : public CopyEngine {
 public:
  // `read(slot, pass, batch)` is the copy: it reads the slot and says whether the bytes were right.
  ThreadCopyEngine(int slots, const std::atomic<int>& pass, std::function<bool(int, int, int)> read)
      : pass_(pass), read_(std::move(read)), in_flight_(slots), started_(slots, 0), finished_(slots, 0),
        thread_([this] { run(); }) {}
  ~ThreadCopyEngine() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;  // after the queue has drained
    }
    cv_.notify_all();
    thread_.join();
  }

  void start_copy(int slot, int batch) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (in_flight_[slot].exchange(true)) double_starts_++;  // released again before being refilled
    started_[slot]++;
    queue_.push_back({slot, batch, pass_.load()});
    cv_.notify_all();
  }
  void wait_copy(int slot) override {
    std::unique_lock<std::mutex> lock(mu_);
    const long target = started_[slot];
    cv_.wait(lock, [&] { return finished_[slot] >= target; });
  }

  bool in_flight(int slot) const { return in_flight_[slot].load(); }
  // Waits for every started copy to end; returns what was delivered, in order.
  std::vector<Delivery> drain() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
    return delivered_;
  }
  int double_starts() const { return double_starts_.load(); }

 private:
  struct Copy {
    int slot, batch, pass;
  };
  void run() {
    std::mt19937 rng(99);
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      const Copy c = queue_.front();
      queue_.pop_front();
      busy_ = true;
      const int delay_us = std::uniform_int_distribution<int>(0, 2000)(rng);
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(delay_us));  // the transfer takes a while
      const bool ok = read_(c.slot, c.pass, c.batch);
      lock.lock();
      delivered_.push_back({c.pass, c.batch, ok});
      in_flight_[c.slot] = false;
      finished_[c.slot]++;
      busy_ = false;
      cv_.notify_all();
    }
  }

  const std::atomic<int>& pass_;
  std::function<bool(int, int, int)> read_;
  std::vector<std::atomic<bool>> in_flight_;
  std::vector<long> started_, finished_;
  std::deque<Copy> queue_;
  std::vector<Delivery> delivered_;
  std::atomic<int> double_starts_{0};
  bool busy_ = false, stop_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread thread_;
};

// Slots of plain memory, the fill callback with its checks, and the engine. Declared before the
// ring that uses them, so they outlive it.
struct Harness {
  const int slots, batch;
  std::vector<std::vector<uint8_t>> memory;
  std::atomic<int> pass{0};
  std::atomic<int> writes_during_copy{0}, overlapping_fills{0}, fills{0};
  std::mutex fills_mu;
  std::vector<std::multiset<int>> filling;  // batches being filled into each slot right now
  int max_fill_delay_us;
  ThreadCopyEngine engine;

  Harness(int slots_, int batch_, int max_fill_delay_us_ = 200)
      : slots(slots_), batch(batch_), memory(slots_, std::vector<uint8_t>(size_t(batch_) * kSampleBytes, 0)),
        filling(slots_), max_fill_delay_us(max_fill_delay_us_),
        engine(slots_, pass, [this](int slot, int p, int b) { return content_ok(slot, p, b); }) {}

  bool content_ok(int slot, int p, int b) const {
    for (int i = 0; i < batch; ++i)
      for (int j = 0; j < kSampleBytes; ++j)
        if (memory[slot][size_t(i) * kSampleBytes + j] != pattern(p, b, i, j)) return false;
    return true;
  }

  BatchRing::FillFn fill_fn() {
    return [this](int slot, int b, int first, int end) {
      fills++;
      if (engine.in_flight(slot)) writes_during_copy++;
      {  // parts of one batch may be filled at once; two batches in one slot at once may not
        std::lock_guard<std::mutex> lock(fills_mu);
        for (int other : filling[slot]) overlapping_fills += other != b;
        filling[slot].insert(b);
      }
      thread_local std::mt19937 rng(std::hash<std::thread::id>()(std::this_thread::get_id()));
      const int p = pass.load();
      for (int i = first; i < end; ++i) {
        for (int j = 0; j < kSampleBytes; ++j) memory[slot][size_t(i) * kSampleBytes + j] = pattern(p, b, i, j);
        if (max_fill_delay_us > 0)
          std::this_thread::sleep_for(std::chrono::microseconds(
              std::uniform_int_distribution<int>(0, max_fill_delay_us)(rng)));
      }
      if (engine.in_flight(slot)) writes_during_copy++;
      std::lock_guard<std::mutex> lock(fills_mu);
      filling[slot].erase(filling[slot].find(b));
    };
  }

  // The consumer's side of batch k: acquire, check the slot holds batch k of this pass, release.
  void consume(BatchRing& ring, int k) {
    const int slot = ring.acquire(k);
    ASSERT_GE(slot, 0);
    ASSERT_LT(slot, slots);
    ASSERT_TRUE(content_ok(slot, pass.load(), k)) << "pass " << pass.load() << " batch " << k << " in slot " << slot;
    ring.release(k);
  }

  void expect_clean() {
    EXPECT_EQ(writes_during_copy.load(), 0) << "a slot was written while its copy was in flight";
    EXPECT_EQ(overlapping_fills.load(), 0) << "two batches were filled into one slot at once";
    EXPECT_EQ(engine.double_starts(), 0) << "a slot was released again while its copy was in flight";
  }
};

// The copies delivered for pass p, in order.
std::vector<int> batches_of_pass(const std::vector<Delivery>& d, int p, bool* all_ok) {
  std::vector<int> out;
  for (const Delivery& x : d)
    if (x.pass == p) {
      out.push_back(x.batch);
      if (!x.content_ok) *all_ok = false;
    }
  return out;
}

std::vector<int> iota(int n) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

// Once the ring is gone: pass p delivered exactly batches[p], in order, all with the right bytes,
// and nothing was written or released out of turn.
void expect_deliveries(Harness& h, const std::vector<std::vector<int>>& batches) {
  const std::vector<Delivery> d = h.engine.drain();
  bool ok = true;
  for (size_t p = 0; p < batches.size(); ++p)
    EXPECT_EQ(batches_of_pass(d, static_cast<int>(p), &ok), batches[p]) << "pass " << p;
  EXPECT_TRUE(ok) << "a copy read wrong bytes";
  h.expect_clean();
}

TEST(BatchRing, OrderAndContentOverSeveralPasses) {
  for (int workers : {1, 2, 3, 8})
    for (int batch : {1, 2, 5, 16})
      for (int slots : {2, 3}) {
        const std::string config = "workers " + std::to_string(workers) + ", batch " + std::to_string(batch) +
                                   ", slots " + std::to_string(slots);
        SCOPED_TRACE(config);
        run_with_watchdog([&] {
          SCOPED_TRACE(config);  // traces are per thread
          Harness h(slots, batch);
          const std::vector<int> pass_lengths = {9, 1, 14};
          {
            BatchRing ring(slots, workers, batch, h.fill_fn(), h.engine);
            for (size_t p = 0; p < pass_lengths.size(); ++p) {
              h.pass = static_cast<int>(p);
              ring.begin_pass(0, pass_lengths[p]);
              for (int k = 0; k < pass_lengths[p]; ++k) {
                h.consume(ring, k);
                if (testing::Test::HasFatalFailure()) return;
              }
            }
          }
          const std::vector<Delivery> d = h.engine.drain();
          for (size_t p = 0; p < pass_lengths.size(); ++p) {
            bool ok = true;
            EXPECT_EQ(batches_of_pass(d, static_cast<int>(p), &ok), iota(pass_lengths[p])) << "pass " << p;
            EXPECT_TRUE(ok) << "a copy of pass " << p << " read wrong bytes";
          }
          h.expect_clean();
        });
        if (HasFatalFailure()) return;
      }
}

// A run resumed inside an epoch starts its first pass at a later batch: the ring must fill that
// batch first (filling from 0 would leave every slot holding a batch nobody asks for: a deadlock),
// then later passes start at 0 again.
TEST(BatchRing, PassStartingInsideTheEpoch) {
  for (int workers : {1, 3})
    for (int first : {1, 2, 3, 7}) {
      const std::string config = "workers " + std::to_string(workers) + ", first " + std::to_string(first);
      SCOPED_TRACE(config);
      run_with_watchdog([&] {
        SCOPED_TRACE(config);
        Harness h(3, 4);
        {
          BatchRing ring(3, workers, 4, h.fill_fn(), h.engine);
          ring.begin_pass(first, 10);
          for (int k = first; k < 10; ++k) h.consume(ring, k);
          EXPECT_THROW(ring.acquire(first - 1), Fatal) << "a batch before the pass was handed out";
          h.pass = 1;
          ring.begin_pass(0, 4);
          for (int k = 0; k < 4; ++k) h.consume(ring, k);
        }
        std::vector<int> expected;
        for (int k = first; k < 10; ++k) expected.push_back(k);
        expect_deliveries(h, {expected, iota(4)});
      });
    }
}

TEST(BatchRing, SlowConsumerNeverSeesASlotOverwritten) {
  // Workers are fast and the consumer slow, so workers always wait on copies: the case where a
  // refill racing a copy would show.
  run_with_watchdog([] {
    Harness h(3, 8, 0);
    {
      BatchRing ring(3, 4, 8, h.fill_fn(), h.engine);
      ring.begin_pass(0, 40);
      for (int k = 0; k < 40; ++k) {
        h.consume(ring, k);
        std::this_thread::sleep_for(std::chrono::microseconds(300));
      }
    }
    bool ok = true;
    EXPECT_EQ(batches_of_pass(h.engine.drain(), 0, &ok), iota(40));
    EXPECT_TRUE(ok);
    h.expect_clean();
  });
}

TEST(BatchRing, ShutdownInTheMiddleOfAPass) {
  for (int workers : {1, 3, 8})
    for (int consumed : {0, 1, 3}) {
      const std::string config = "workers " + std::to_string(workers) + ", consumed " + std::to_string(consumed);
      SCOPED_TRACE(config);
      run_with_watchdog([&] {
        SCOPED_TRACE(config);
        Harness h(3, 16, 1000);  // slow fills: workers are busy when the ring goes
        {
          BatchRing ring(3, workers, 16, h.fill_fn(), h.engine);
          ring.begin_pass(0, 1000);
          for (int k = 0; k < consumed; ++k) h.consume(ring, k);
          // Copies of the released batches are still in flight here.
        }
        bool ok = true;
        EXPECT_EQ(batches_of_pass(h.engine.drain(), 0, &ok), iota(consumed));
        EXPECT_TRUE(ok);
        h.expect_clean();
      });
    }
}

TEST(BatchRing, ShutdownBeforeAnyPassAndAfterAFullOne) {
  run_with_watchdog([] {
    Harness h(2, 4);
    { BatchRing ring(2, 4, 4, h.fill_fn(), h.engine); }
    EXPECT_EQ(h.fills.load(), 0);
    {
      BatchRing ring(2, 4, 4, h.fill_fn(), h.engine);
      ring.begin_pass(0, 5);
      for (int k = 0; k < 5; ++k) h.consume(ring, k);
    }
    h.engine.drain();
    h.expect_clean();
  });
}

TEST(BatchRing, BeginPassMidwayDropsTheRestAndRestartsAtBatchZero) {
  for_each_worker_count({1, 3, 8}, [](int workers) {
    Harness h(3, 6);
    {
      BatchRing ring(3, workers, 6, h.fill_fn(), h.engine);
      h.pass = 0;
      ring.begin_pass(0, 20);
      for (int k = 0; k < 5; ++k) h.consume(ring, k);
      h.pass = 1;  // the new pass fills different bytes, so a stale batch would be caught
      ring.begin_pass(0, 20);
      for (int k = 0; k < 20; ++k) {
        h.consume(ring, k);
        if (testing::Test::HasFatalFailure()) return;
      }
      // Abandon again without consuming anything, then a short pass.
      h.pass = 2;
      ring.begin_pass(0, 50);
      h.pass = 3;
      ring.begin_pass(0, 4);
      for (int k = 0; k < 4; ++k) h.consume(ring, k);
    }
    expect_deliveries(h, {iota(5), iota(20), {}, iota(4)});
  });
}

// A fill that throws (an image that does not decode) reaches the consumer as that exception from
// acquire() of its batch; the batches before it come as usual, nothing hangs, and the next pass
// runs normally.
TEST(BatchRing, AFillThatThrowsReachesTheConsumerOfItsBatch) {
  for_each_worker_count({1, 3, 8}, [](int workers) {
    Harness h(3, 6);
    const BatchRing::FillFn fill = h.fill_fn();
    auto failing = [&](int slot, int b, int first, int end) {
      if (h.pass == 0 && b == 5 && first <= 2 && 2 < end) throw InputError("cls/5-2.png: cannot decode");
      fill(slot, b, first, end);
    };
    {
      BatchRing ring(3, workers, 6, failing, h.engine);
      ring.begin_pass(0, 20);
      for (int k = 0; k < 5; ++k) h.consume(ring, k);
      try {
        ring.acquire(5);
        ADD_FAILURE() << "batch 5 was handed out";
      } catch (const InputError& e) {
        EXPECT_STREQ(e.what(), "cls/5-2.png: cannot decode");
      }
      EXPECT_THROW(ring.acquire(6), InputError) << "the workers stopped at the failure";
      h.pass = 1;
      ring.begin_pass(0, 7);
      for (int k = 0; k < 7; ++k) h.consume(ring, k);
    }
    expect_deliveries(h, {iota(5), iota(7)});
  });
}

// The ring goes away while a failed batch is unclaimed and other fills may be waiting: no hang.
TEST(BatchRing, ShutdownAfterAFailedFill) {
  run_with_watchdog([] {
    Harness h(3, 4, 1000);
    const BatchRing::FillFn fill = h.fill_fn();
    {
      BatchRing ring(3, 4, 4, [&](int slot, int b, int first, int end) {
        if (b == 1) throw InputError("bad");
        fill(slot, b, first, end);
      }, h.engine);
      ring.begin_pass(0, 100);
      h.consume(ring, 0);
    }
    h.engine.drain();
    h.expect_clean();
  });
}

TEST(BatchRing, MisuseIsFatal) {
  run_with_watchdog([] {
    Harness h(2, 4);
    EXPECT_THROW(BatchRing(1, 2, 4, h.fill_fn(), h.engine), Fatal);
    EXPECT_THROW(BatchRing(2, 0, 4, h.fill_fn(), h.engine), Fatal);
    EXPECT_THROW(BatchRing(2, 2, 0, h.fill_fn(), h.engine), Fatal);
    BatchRing ring(2, 2, 4, h.fill_fn(), h.engine);
    ring.begin_pass(0, 2);
    EXPECT_THROW(ring.acquire(2), Fatal);
  });
}

}  // namespace
