// The ranks meet at MASTER_ADDR:MASTER_PORT (torchrun's convention) before anything touches the GPU
// link: rank 0 listens, every other rank connects (retrying until the timeout) and sends its rank,
// the world size and its fingerprint; rank 0 checks them all against its own and answers each with
// the payload the ranks need to share (the NCCL unique id), or with one line saying why the run is
// refused (a rank started with other flags, a rank given twice, a rank that never came). The
// connections stay open afterwards: the ranks watch each other through them (peer_watch.h).
#pragma once

#include <string>
#include <vector>

#include "dist/fingerprint.h"
#include "dist/launch_env.h"
#include "dist/socket.h"

struct RendezvousConfig {
  MasterAddress master;
  int rank = 0, world = 1;
  Fingerprint fingerprint;
  double timeout_s = 300;  // for the whole meeting
  std::string shared;      // rank 0: what every rank receives
};

struct RendezvousResult {
  std::string shared;
  // Rank 0: the connection to each rank (index = rank; [0] unused). Others: [0] is rank 0.
  std::vector<Socket> peers;
};

// Throws InputError with one line when the run cannot start: the port is taken (rank 0), rank 0
// never answers (others), not every rank arrives in time (rank 0), or a rank differs.
RendezvousResult rendezvous(const RendezvousConfig& cfg);

// Frame types of the rendezvous and of the watch that follows it.
enum FrameType : uint32_t {
  kHello = 1,      // rank -> 0: "rank world\n" + fingerprint
  kWelcome = 2,    // 0 -> rank: the shared payload
  kRefuse = 3,     // 0 -> rank: why the run cannot start
  kHeartbeat = 4,  // both ways: "steps" of the sender
  kBye = 5,        // the sender finished cleanly
  kFailed = 6,     // rank -> 0: the sender stops with this error
  kAbort = 7,      // 0 -> rank: every rank stops, for this reason
};
