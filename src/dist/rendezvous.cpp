// The TCP rendezvous (rendezvous.h): rank 0 gathers every rank's hello, checks it, and answers all.
#include "dist/rendezvous.h"

#include <poll.h>

#include <cstdio>
#include <sstream>

#include "core/errors.h"

namespace {

constexpr double kFrameSeconds = 5;  // to finish reading a frame that has started to arrive

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g s", s);
  return buf;
}

std::string hello_payload(const RendezvousConfig& cfg) {
  return std::to_string(cfg.rank) + " " + std::to_string(cfg.world) + "\n" + cfg.fingerprint.encode();
}

struct Hello {
  int rank = -1, world = 0;
  Fingerprint fingerprint;
};

// A hello of ours, or nothing when the bytes are not one (a stranger on the port).
bool parse_hello(const std::string& payload, Hello* h) {
  const size_t nl = payload.find('\n');
  if (nl == std::string::npos) return false;
  std::istringstream head(payload.substr(0, nl));
  if (!(head >> h->rank >> h->world)) return false;
  try {
    h->fingerprint = Fingerprint::decode(payload.substr(nl + 1));
  } catch (const Fatal&) {
    return false;
  }
  return true;
}

// Rank 0's side: who has arrived, and the first reason to refuse the run.
class Gathering {
 public:
  explicit Gathering(const RendezvousConfig& cfg) : cfg_(cfg), peers_(cfg.world) {}

  // Reads the hello of a new connection; a stranger's connection is dropped.
  void take(Socket s) {
    Frame f;
    Hello h;
    if (recv_frame(s, deadline_in(kFrameSeconds), &f) != RecvStatus::Ok || f.type != kHello || !parse_hello(f.payload, &h))
      return;
    const std::string who = "rank " + std::to_string(h.rank);
    if (h.world != cfg_.world)
      refuse(who + " was started with a world size of " + std::to_string(h.world) + ", rank 0 with " +
             std::to_string(cfg_.world));
    else if (h.rank <= 0 || h.rank >= cfg_.world)
      refuse("a rank arrived claiming to be rank " + std::to_string(h.rank) + " of " + std::to_string(h.world));
    else if (peers_[h.rank].valid())
      refuse(who + " was started twice");
    else if (const std::string d = fingerprint_differences(cfg_.fingerprint, "rank 0", h.fingerprint, who); !d.empty())
      refuse(who + " was started with another build or other flags than rank 0: " + d);
    if (h.rank > 0 && h.rank < cfg_.world && !peers_[h.rank].valid()) {
      peers_[h.rank] = std::move(s);
      ++arrived_;
    } else {
      extra_.push_back(std::move(s));  // told why, then closed
    }
  }
  bool complete() const { return arrived_ == cfg_.world - 1; }
  std::string missing() const {
    std::string m;
    for (int r = 1; r < cfg_.world; ++r)
      if (!peers_[r].valid()) m += (m.empty() ? "" : ", ") + std::to_string(r);
    return m;
  }
  int arrived() const { return arrived_ + 1; }
  const std::string& refusal() const { return refusal_; }
  void refuse(const std::string& why) {
    if (refusal_.empty()) refusal_ = why;
  }
  // Answers every rank that came: the shared payload, or the refusal.
  std::vector<Socket> answer() {
    const uint32_t type = refusal_.empty() ? kWelcome : kRefuse;
    const std::string& payload = refusal_.empty() ? cfg_.shared : refusal_;
    for (auto* group : {&peers_, &extra_})
      for (Socket& s : *group)
        if (s.valid()) send_frame(s, type, payload, deadline_in(kFrameSeconds));
    return std::move(peers_);
  }

 private:
  const RendezvousConfig& cfg_;
  std::vector<Socket> peers_, extra_;
  int arrived_ = 0;
  std::string refusal_;
};

RendezvousResult host(const RendezvousConfig& cfg) {
  const Socket listener = listen_on(cfg.master.port);
  const Deadline deadline = deadline_in(cfg.timeout_s);
  Gathering g(cfg);
  while (!g.complete()) {
    Socket s = accept_until(listener, deadline);
    if (!s.valid()) {
      g.refuse("only " + std::to_string(g.arrived()) + " of " + std::to_string(cfg.world) + " ranks arrived at port " +
               std::to_string(cfg.master.port) + " within " + seconds_text(cfg.timeout_s) + " (missing: rank " +
               g.missing() + "); start every rank, or raise --dist-timeout");
      break;
    }
    g.take(std::move(s));
  }
  RendezvousResult r{cfg.shared, g.answer()};
  if (!g.refusal().empty()) throw InputError("rendezvous: " + g.refusal());
  return r;
}

RendezvousResult join(const RendezvousConfig& cfg) {
  const Deadline deadline = deadline_in(cfg.timeout_s);
  const std::string where = cfg.master.host + ":" + std::to_string(cfg.master.port);
  Socket s = connect_until(cfg.master.host, cfg.master.port, deadline);
  if (!s.valid())
    throw InputError("rendezvous: rank 0 did not come: nothing listened at " + where + " for " +
                     seconds_text(cfg.timeout_s) + " (start rank 0, check MASTER_ADDR and MASTER_PORT, or raise --dist-timeout)");
  if (!send_frame(s, kHello, hello_payload(cfg), deadline))
    throw InputError("rendezvous: the connection to " + where + " broke before this rank could say hello");
  Frame f;
  switch (recv_frame(s, deadline, &f)) {
    case RecvStatus::Ok:
      if (f.type == kWelcome) {
        RendezvousResult r{f.payload, {}};
        r.peers.push_back(std::move(s));
        return r;
      }
      if (f.type == kRefuse) throw InputError("rendezvous: refused by rank 0: " + f.payload);
      [[fallthrough]];
    case RecvStatus::Garbage:
      throw InputError("rendezvous: what listens at " + where + " is not rank 0 of this trainer");
    case RecvStatus::Closed:
      throw InputError("rendezvous: rank 0 at " + where + " closed the connection before answering (see its error)");
    case RecvStatus::Timeout:
      break;
  }
  throw InputError("rendezvous: rank 0 at " + where + " did not answer within " + seconds_text(cfg.timeout_s) +
                   " (are all " + std::to_string(cfg.world) + " ranks started?)");
}

}  // namespace

RendezvousResult rendezvous(const RendezvousConfig& cfg) { return cfg.rank == 0 ? host(cfg) : join(cfg); }
