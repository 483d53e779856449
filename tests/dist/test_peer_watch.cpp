// The ranks' watch over each other (dist/peer_watch.h), on real connections from a rendezvous on
// 127.0.0.1: a rank that dies, falls silent or stops making progress is named on every rank within
// the timeout; an error is passed on; a clean finish is not mistaken for a death.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/elapsed.h"
#include "dist/peer_watch.h"
#include "dist/rendezvous.h"
#include "dist/socket.h"

namespace {

// The connections of a world of ranks, as the rendezvous leaves them: [rank] -> its peers.
std::vector<std::vector<Socket>> connect_world(int world) {
  Socket probe = listen_on(0);
  const int port = local_port(probe);
  probe.close();
  std::vector<std::future<RendezvousResult>> others;
  for (int r = 1; r < world; ++r)
    others.push_back(std::async(std::launch::async, [=] {
      RendezvousConfig c;
      c.master = {"127.0.0.1", port};
      c.rank = r;
      c.world = world;
      c.timeout_s = 10;
      return rendezvous(c);
    }));
  RendezvousConfig c0;
  c0.master = {"127.0.0.1", port};
  c0.world = world;
  c0.timeout_s = 10;
  std::vector<std::vector<Socket>> peers;
  peers.push_back(rendezvous(c0).peers);
  for (auto& f : others) peers.push_back(f.get().peers);
  return peers;
}

// Records each rank's stop reason; wait() returns it, or "" when none came in time.
class Stops {
 public:
  PeerWatch::StopHandler handler(int rank) {
    return [this, rank](const std::string& reason) {
      std::lock_guard<std::mutex> lock(m_);
      reasons_[rank] = reason;
      cv_.notify_all();
    };
  }
  std::string wait(int rank, double seconds) {
    std::unique_lock<std::mutex> lock(m_);
    cv_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return reasons_.count(rank) > 0; });
    return reasons_.count(rank) ? reasons_[rank] : "";
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  std::map<int, std::string> reasons_;
};

WatchConfig cfg(int rank, int world, double timeout_s) { return WatchConfig{rank, world, timeout_s, 0.05}; }

// A watch on every rank of the world, all with the same timeout.
std::vector<std::unique_ptr<PeerWatch>> watch_all(std::vector<std::vector<Socket>>& peers, double timeout_s,
                                                  Stops& stops) {
  std::vector<std::unique_ptr<PeerWatch>> w;
  const int world = static_cast<int>(peers.size());
  for (int r = 0; r < world; ++r)
    w.push_back(std::make_unique<PeerWatch>(std::move(peers[r]), cfg(r, world, timeout_s), stops.handler(r)));
  return w;
}

}  // namespace

TEST(PeerWatch, ADeadRankIsNamedOnEveryRank) {
  auto peers = connect_world(3);
  Stops stops;
  PeerWatch w0(std::move(peers[0]), cfg(0, 3, 30), stops.handler(0));
  PeerWatch w1(std::move(peers[1]), cfg(1, 3, 30), stops.handler(1));
  const auto t0 = SteadyClock::now();
  peers[2].clear();  // rank 2 dies: its connection closes without a goodbye
  const std::string r0 = stops.wait(0, 5), r1 = stops.wait(1, 5);
  EXPECT_LT(seconds_since(t0), 3);
  EXPECT_NE(r0.find("rank 2 exited or lost its connection"), std::string::npos) << r0;
  EXPECT_EQ(r1, r0);  // rank 0 told rank 1 why
}

TEST(PeerWatch, RankZerosDeathIsNamed) {
  auto peers = connect_world(2);
  Stops stops;
  PeerWatch w1(std::move(peers[1]), cfg(1, 2, 30), stops.handler(1));
  peers[0].clear();
  const std::string r1 = stops.wait(1, 5);
  EXPECT_NE(r1.find("rank 0 exited or lost its connection"), std::string::npos) << r1;
}

TEST(PeerWatch, ACleanFinishIsNotADeath) {
  auto peers = connect_world(3);
  Stops stops;
  auto w = watch_all(peers, 30, stops);
  w[0]->progress(10);
  w[2].reset();  // says goodbye, then its connection closes
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  w[1].reset();
  w[0].reset();
  EXPECT_EQ(stops.wait(0, 0.2), "");
  EXPECT_EQ(stops.wait(1, 0.2), "");
}

TEST(PeerWatch, ASilentRankIsNamedWithinTheTimeout) {
  auto peers = connect_world(2);
  Stops stops;
  // Rank 1's process is stopped: its connection stays open, nothing comes.
  const auto t0 = SteadyClock::now();
  PeerWatch w0(std::move(peers[0]), cfg(0, 2, 0.5), stops.handler(0));
  const std::string r0 = stops.wait(0, 5);
  EXPECT_GE(seconds_since(t0), 0.5);
  EXPECT_LT(seconds_since(t0), 3);
  EXPECT_NE(r0.find("rank 1 sent nothing for 0.5 s"), std::string::npos) << r0;
}

TEST(PeerWatch, TheRankBehindIsNamedWhenNoStepIsMade) {
  auto peers = connect_world(3);
  Stops stops;
  auto w = watch_all(peers, 0.6, stops);
  w[0]->progress(42);
  w[1]->progress(41);  // rank 1 hangs in its data loader; the others wait for it in a collective
  w[2]->progress(42);
  const std::string r0 = stops.wait(0, 5);
  EXPECT_NE(r0.find("no step was made for 0.6 s"), std::string::npos) << r0;
  EXPECT_NE(r0.find("rank 1 is stuck at step 41 while others reached step 42"), std::string::npos) << r0;
  EXPECT_EQ(stops.wait(2, 5), r0);
}

TEST(PeerWatch, EveryRankStuckAtOneStep) {
  auto peers = connect_world(2);
  Stops stops;
  auto w = watch_all(peers, 0.5, stops);
  w[0]->progress(7);
  w[1]->progress(7);
  const std::string r0 = stops.wait(0, 5);
  EXPECT_NE(r0.find("every rank is at step 7"), std::string::npos) << r0;
}

TEST(PeerWatch, NoStallBeforeTrainingStarts) {
  auto peers = connect_world(2);
  Stops stops;
  auto w = watch_all(peers, 0.3, stops);
  EXPECT_EQ(stops.wait(0, 1), "");  // set-up (autotuning, ...) makes no steps, yet the ranks are alive
}

TEST(PeerWatch, AnErrorIsPassedOnToEveryRank) {
  auto peers = connect_world(3);
  Stops stops;
  PeerWatch w0(std::move(peers[0]), cfg(0, 3, 30), stops.handler(0));
  PeerWatch w1(std::move(peers[1]), cfg(1, 3, 30), stops.handler(1));
  {
    PeerWatch w2(std::move(peers[2]), cfg(2, 3, 30), stops.handler(2));
    w2.fail("training diverged at step 9");
  }
  EXPECT_EQ(stops.wait(0, 5), "rank 2 failed: training diverged at step 9");
  EXPECT_EQ(stops.wait(1, 5), "rank 2 failed: training diverged at step 9");
  EXPECT_EQ(stops.wait(2, 0.2), "");  // the failing rank reports its own error itself
}

TEST(PeerWatch, ALocalProblemStopsEveryRank) {
  auto peers = connect_world(2);
  Stops stops;
  PeerWatch w1(std::move(peers[1]), cfg(1, 2, 30), stops.handler(1),
               [] { return std::string("NCCL reported an error: remote process exited"); });
  PeerWatch w0(std::move(peers[0]), cfg(0, 2, 30), stops.handler(0));
  const std::string r1 = stops.wait(1, 5);
  EXPECT_EQ(r1, "rank 1: NCCL reported an error: remote process exited");
  EXPECT_NE(stops.wait(0, 5).find("NCCL reported an error"), std::string::npos);
}
