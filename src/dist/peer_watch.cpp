// The ranks' watch over each other (peer_watch.h).
#include "dist/peer_watch.h"

#include <poll.h>

#include <algorithm>
#include <cstdio>

#include "dist/rendezvous.h"

namespace {

constexpr int kPollMs = 100;
constexpr double kSendSeconds = 2;  // a peer whose socket buffer stays full this long is not listening

long long now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(SteadyClock::now().time_since_epoch()).count();
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g s", s);
  return buf;
}

}  // namespace

PeerWatch::PeerWatch(std::vector<Socket> peers, const WatchConfig& cfg, StopHandler on_stop, LocalCheck check)
    : cfg_(cfg), on_stop_(std::move(on_stop)), local_check_(std::move(check)) {
  for (size_t i = 0; i < peers.size(); ++i) {
    if (!peers[i].valid()) continue;
    const int rank = cfg_.rank == 0 ? static_cast<int>(i) : 0;
    peers_.push_back(Peer{rank, std::move(peers[i]), SteadyClock::now()});
  }
  thread_ = std::thread([this] { run(); });
}

PeerWatch::~PeerWatch() {
  if (!failed_) finish();
  quit_ = true;
  if (thread_.joinable()) thread_.join();
}

void PeerWatch::progress(long steps) {
  steps_ = steps;
  progressed_ns_ = now_ns();
}

void PeerWatch::fail(const std::string& why) {
  if (failed_.exchange(true)) return;
  send_to_all(cfg_.rank == 0 ? kAbort : kFailed, cfg_.rank == 0 ? "rank 0 failed: " + why : why);
}

void PeerWatch::finish() {
  if (!said_goodbye_.exchange(true)) send_to_all(kBye, "");
}

void PeerWatch::send_to_all(uint32_t type, const std::string& payload) {
  std::lock_guard<std::mutex> lock(send_mutex_);
  for (const Peer& p : peers_) send_frame(p.socket, type, payload, deadline_in(kSendSeconds));
}

void PeerWatch::run() {
  Deadline next_beat = SteadyClock::now();
  while (!quit_) {
    if (SteadyClock::now() >= next_beat) {
      heartbeat();
      next_beat = deadline_in(cfg_.heartbeat_s);
    }
    std::vector<pollfd> fds;
    std::vector<Peer*> polled;
    for (Peer& p : peers_)
      if (!p.done) {
        fds.push_back({p.socket.fd(), POLLIN, 0});
        polled.push_back(&p);
      }
    if (fds.empty()) return;  // every peer finished: nothing left to watch
    if (::poll(fds.data(), fds.size(), kPollMs) > 0)
      for (size_t i = 0; i < fds.size() && !quit_; ++i)
        if (fds[i].revents) receive(*polled[i]);
    if (!quit_) check_silence_and_progress();
  }
}

void PeerWatch::heartbeat() {
  if (said_goodbye_ || failed_) return;
  std::lock_guard<std::mutex> lock(send_mutex_);
  for (const Peer& p : peers_)
    if (!p.done) send_frame(p.socket, kHeartbeat, std::to_string(steps_.load()), deadline_in(kSendSeconds));
}

void PeerWatch::receive(Peer& p) {
  Frame f;
  const RecvStatus st = recv_frame(p.socket, deadline_in(kSendSeconds), &f);
  const std::string who = "rank " + std::to_string(p.rank);
  if (st != RecvStatus::Ok) {
    p.done = true;
    if (!failed_) stop(who + " exited or lost its connection without a word (killed, crashed, or its machine went down)");
    return;
  }
  p.heard = SteadyClock::now();
  switch (f.type) {
    case kHeartbeat: p.steps = std::atol(f.payload.c_str()); break;
    case kBye: p.done = true; break;
    case kFailed: p.done = true; stop(who + " failed: " + f.payload); break;
    case kAbort: p.done = true; stop(f.payload); break;
    default: break;
  }
}

void PeerWatch::check_silence_and_progress() {
  if (failed_) return;
  if (local_check_)
    if (const std::string why = local_check_(); !why.empty()) return stop("rank " + std::to_string(cfg_.rank) + ": " + why);
  const Deadline now = SteadyClock::now();
  const auto timeout = std::chrono::duration<double>(cfg_.timeout_s);
  for (const Peer& p : peers_)
    if (!p.done && now - p.heard > timeout) {
      stop("rank " + std::to_string(p.rank) + " sent nothing for " + seconds_text(cfg_.timeout_s) +
           " (stopped, hung, or its machine is unreachable)");
      return;
    }
  const long long last = progressed_ns_;
  if (cfg_.rank == 0 && last > 0 && !said_goodbye_ && (now_ns() - last) * 1e-9 > cfg_.timeout_s) stop(stall_reason());
}

// The rank furthest behind is the one the others wait for.
std::string PeerWatch::stall_reason() const {
  long least = steps_, most = steps_;
  int behind = 0;
  for (const Peer& p : peers_) {
    if (p.steps < least) least = p.steps, behind = p.rank;
    most = std::max(most, p.steps);
  }
  const std::string prefix = "no step was made for " + seconds_text(cfg_.timeout_s) + ": ";
  if (least == most)
    return prefix + "every rank is at step " + std::to_string(least) + " (a hung collective or GPU?)";
  return prefix + "rank " + std::to_string(behind) + " is stuck at step " + std::to_string(least) +
         " while others reached step " + std::to_string(most) + " (a hung loader, GPU or collective there?)";
}

void PeerWatch::stop(const std::string& reason) {
  if (failed_.exchange(true)) return;
  {  // rank 0 tells every rank; another rank tells rank 0, which passes it on
    std::lock_guard<std::mutex> lock(send_mutex_);
    for (const Peer& p : peers_)
      if (!p.done) send_frame(p.socket, cfg_.rank == 0 ? kAbort : kFailed, reason, deadline_in(kSendSeconds));
  }
  quit_ = true;
  on_stop_(reason);
}
