// What the gradient all-reduce costs a step, as bin/train reports it at the end of a run on several
// ranks: the bytes each rank hands NCCL, how long its communication stream spent on the buckets and
// the bus bandwidth that makes, how much of it was left exposed after backward, and the NCCL
// settings that decide the transport. Pure (no GPU, no NCCL): DataParallel fills it in.
#pragma once

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "core/json_line.h"
#include "dist/launch_env.h"

// One rank's measurement over the steady-state window (device timestamps: kernels/comm_clock.h).
struct RankComm {
  long steps = 0;            // optimizer steps measured
  double busy_ms = NAN;      // per step: its communication stream on buckets, first start to last end of each
  double exposed_ms = NAN;   // per step: from the end of backward to the end of the last bucket
};

using NcclSettings = std::vector<std::pair<std::string, std::string>>;  // name, value ("" when unset)

struct CommReport {
  int world = 1;
  double bytes_per_step = 0;  // what one rank hands NCCL per optimizer step, every bucket
  int buckets = 0;
  std::string reduced_as;     // "fp16", "fp32", "int8 with fp32 chunk scales"
  std::vector<RankComm> ranks;  // by rank
  NcclSettings nccl;
};

// NCCL's bus bandwidth of an all-reduce (as nccl-tests reports it): bytes x 2 (world - 1) / world,
// the bytes each rank sends and receives in a ring, over the time; NaN without a time.
double bus_bandwidth_gbs(double bytes, int world, double ms);
// Rank `rank`'s exposed milliseconds a step; NaN when not measured.
double exposed_ms(const CommReport& r, int rank);
// The report as text lines (one for the bytes, one per rank) and as the summary's JSON object.
std::vector<std::string> comm_report_lines(const CommReport& r);
JsonLine comm_report_json(const CommReport& r);

// The NCCL variables that choose and tune the transport between ranks (peer-to-peer, shared
// memory, InfiniBand, the socket transport's interface, threads and sockets per thread; NVLink
// multicast), as this process's environment sets them.
NcclSettings nccl_settings(const EnvLookup& env);
// "NCCL_SOCKET_IFNAME=lo NCCL_SOCKET_NTHREADS=4 ...; unset: NCCL_IB_DISABLE ..." (NCCL's defaults).
std::string nccl_settings_text(const NcclSettings& s);
