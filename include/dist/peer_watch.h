// The ranks watch each other over the rendezvous connections (a star around rank 0), so that a rank
// that dies or hangs stops the others within --dist-timeout with one line naming it, instead of
// leaving them blocked in a collective for ever:
//   - every rank sends a heartbeat with its step count every second (rank 0 to each rank, each rank
//     to rank 0); a connection that closes without a goodbye is a rank that died, a peer silent for
//     the timeout is one that hangs (stopped, or its machine unreachable);
//   - rank 0 also watches progress: when no step has been made for the timeout, the rank furthest
//     behind is the one the others wait for (a hung loader, GPU or collective);
//   - a rank that stops with an error says so first, and rank 0 passes it on.
// Rank 0 decides for everyone: it tells every rank why the run stops, then stops itself. The stop
// handler runs on the watch thread and is expected to end the process (data_parallel.cpp aborts the
// NCCL communicator and exits); tests give one that records the reason.
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dist/socket.h"

struct WatchConfig {
  int rank = 0, world = 1;
  double timeout_s = 300;
  double heartbeat_s = 1;
};

class PeerWatch {
 public:
  using StopHandler = std::function<void(const std::string& reason)>;
  // A look at this rank's own health from the watch thread: a reason to stop, or "".
  using LocalCheck = std::function<std::string()>;
  // `peers` as the rendezvous left them (rendezvous.h).
  PeerWatch(std::vector<Socket> peers, const WatchConfig& cfg, StopHandler on_stop, LocalCheck check = {});
  // Says goodbye unless this rank failed, and ends the watch.
  ~PeerWatch();
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;

  // The trainer made progress (a step, an evaluation batch, a save); `steps` done in all. Rank 0's
  // hang detection starts with the first call.
  void progress(long steps);
  // This rank stops with an error: the others learn why (rank 0 tells every rank, others tell 0).
  void fail(const std::string& why);
  // This rank finished cleanly (also done by the destructor).
  void finish();

 private:
  struct Peer {
    int rank;
    Socket socket;
    Deadline heard;       // when it was last heard from
    long steps = -1;      // its last reported step count
    bool done = false;    // said goodbye, or its connection is gone
  };
  void run();
  void heartbeat();
  void receive(Peer& p);
  void check_silence_and_progress();
  std::string stall_reason() const;
  void stop(const std::string& reason);
  void send_to_all(uint32_t type, const std::string& payload);

  WatchConfig cfg_;
  StopHandler on_stop_;
  LocalCheck local_check_;
  std::vector<Peer> peers_;
  std::mutex send_mutex_;
  std::atomic<long> steps_{-1};
  std::atomic<long long> progressed_ns_{0};  // steady-clock time of the last progress() call
  std::atomic<bool> quit_{false}, said_goodbye_{false}, failed_{false};
  std::thread thread_;
};
