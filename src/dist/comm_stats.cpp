// The all-reduce's cost per step, as text and JSON, and the NCCL settings in effect (comm_stats.h).
#include "dist/comm_stats.h"

#include <cstdio>

namespace {

const char* const kNcclVariables[] = {"NCCL_P2P_DISABLE",     "NCCL_SHM_DISABLE",     "NCCL_IB_DISABLE",
                                      "NCCL_NET",              "NCCL_SOCKET_IFNAME",   "NCCL_SOCKET_NTHREADS",
                                      "NCCL_NSOCKS_PERTHREAD", "NCCL_NVLS_ENABLE"};

std::string fixed(double v, int digits) {
  if (!std::isfinite(v)) return "n/a";
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

}  // namespace

double bus_bandwidth_gbs(double bytes, int world, double ms) {
  if (!(ms > 0) || world < 2) return NAN;
  return bytes * 2.0 * (world - 1) / world / (ms * 1e-3) / 1e9;
}

double exposed_ms(const CommReport& r, int rank) {
  return rank >= 0 && rank < static_cast<int>(r.ranks.size()) ? r.ranks[rank].exposed_ms : NAN;
}

std::vector<std::string> comm_report_lines(const CommReport& r) {
  std::vector<std::string> lines;
  lines.push_back("all-reduce: " + fixed(r.bytes_per_step / 1e6, 1) + " MB a step per rank in " + r.reduced_as + " (" +
                  std::to_string(r.buckets) + " bucket" + (r.buckets == 1 ? "" : "s") + "); " +
                  nccl_settings_text(r.nccl));
  for (size_t k = 0; k < r.ranks.size(); ++k) {
    const RankComm& c = r.ranks[k];
    if (c.steps == 0) {
      lines.push_back("all-reduce, rank " + std::to_string(k) + ": not measured (no step in the steady-state window)");
      continue;
    }
    lines.push_back("all-reduce, rank " + std::to_string(k) + ": " + fixed(c.busy_ms, 2) +
                    " ms a step on the communication stream (" +
                    fixed(bus_bandwidth_gbs(r.bytes_per_step, r.world, c.busy_ms), 2) + " GB/s bus bandwidth), " +
                    fixed(c.exposed_ms, 2) + " ms of it exposed after backward (" + std::to_string(c.steps) +
                    " steps)");
  }
  return lines;
}

JsonLine comm_report_json(const CommReport& r) {
  JsonLine ranks;
  for (size_t k = 0; k < r.ranks.size(); ++k) {
    const RankComm& c = r.ranks[k];
    JsonLine one;
    one.add("steps", c.steps).add("busy_ms_per_step", c.busy_ms).add("exposed_ms_per_step", c.exposed_ms)
        .add("busbw_gbs", bus_bandwidth_gbs(r.bytes_per_step, r.world, c.busy_ms));
    ranks.add(std::to_string(k), one);
  }
  JsonLine nccl;
  for (const auto& [name, value] : r.nccl) {
    if (value.empty()) nccl.null(name);
    else nccl.add(name, value);
  }
  JsonLine j;
  j.add("bytes_per_step", r.bytes_per_step).add("reduced_as", r.reduced_as).add("buckets", r.buckets)
      .add("ranks", ranks).add("nccl", nccl);
  return j;
}

NcclSettings nccl_settings(const EnvLookup& env) {
  NcclSettings s;
  for (const char* name : kNcclVariables) {
    const char* v = env(name);
    s.emplace_back(name, v ? v : "");
  }
  return s;
}

std::string nccl_settings_text(const NcclSettings& s) {
  std::string set, unset;
  for (const auto& [name, value] : s) {
    if (value.empty()) unset += (unset.empty() ? "" : " ") + name;
    else set += (set.empty() ? "" : " ") + name + "=" + value;
  }
  std::string text = set.empty() ? "no NCCL transport variables set" : set;
  if (!unset.empty()) text += "; unset (NCCL's defaults): " + unset;
  return text;
}
