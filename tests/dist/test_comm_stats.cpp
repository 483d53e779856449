// What bin/train reports about the gradient all-reduce (dist/comm_stats.h): NCCL's bus bandwidth,
// the report's lines and JSON, and the NCCL transport settings read from the environment. CPU only.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>

#include "dist/comm_stats.h"

namespace {

EnvLookup env_of(const std::map<std::string, std::string>& vars) {
  return [vars](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

CommReport two_ranks() {
  CommReport r;
  r.world = 2;
  r.bytes_per_step = 47.2e6;
  r.buckets = 3;
  r.reduced_as = "fp16";
  RankComm a;
  a.steps = 100;
  a.busy_ms = 12.5;
  a.exposed_ms = 9.25;
  r.ranks = {a, RankComm{}};
  r.nccl = nccl_settings(env_of({{"NCCL_P2P_DISABLE", "1"}, {"NCCL_SOCKET_IFNAME", "lo"}}));
  return r;
}

}  // namespace

TEST(CommStats, BusBandwidthAsNcclTestsReportsIt) {
  // 2 ranks: each sends and receives the whole buffer once (2 x (2-1)/2 = 1)
  EXPECT_DOUBLE_EQ(bus_bandwidth_gbs(1e9, 2, 1000), 1.0);
  // 8 ranks: 2 x 7/8 of it
  EXPECT_DOUBLE_EQ(bus_bandwidth_gbs(8e9, 8, 2000), 7.0);
  EXPECT_TRUE(std::isnan(bus_bandwidth_gbs(1e9, 2, 0)));
  EXPECT_TRUE(std::isnan(bus_bandwidth_gbs(1e9, 1, 1)));
  EXPECT_TRUE(std::isnan(bus_bandwidth_gbs(1e9, 2, NAN)));
}

TEST(CommStats, NcclSettingsFromTheEnvironment) {
  const NcclSettings s = nccl_settings(env_of({{"NCCL_SOCKET_NTHREADS", "4"}, {"NCCL_NSOCKS_PERTHREAD", "4"},
                                               {"NCCL_P2P_DISABLE", "1"}, {"NCCL_SHM_DISABLE", "1"},
                                               {"NCCL_SOCKET_IFNAME", "lo"}, {"NCCL_NVLS_ENABLE", "0"}}));
  EXPECT_EQ(nccl_settings_text(s),
            "NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo NCCL_SOCKET_NTHREADS=4 "
            "NCCL_NSOCKS_PERTHREAD=4 NCCL_NVLS_ENABLE=0; unset (NCCL's defaults): NCCL_IB_DISABLE NCCL_NET");
  EXPECT_EQ(nccl_settings_text(nccl_settings(env_of({}))),
            "no NCCL transport variables set; unset (NCCL's defaults): NCCL_P2P_DISABLE NCCL_SHM_DISABLE "
            "NCCL_IB_DISABLE NCCL_NET NCCL_SOCKET_IFNAME NCCL_SOCKET_NTHREADS NCCL_NSOCKS_PERTHREAD NCCL_NVLS_ENABLE");
}

TEST(CommStats, LinesSayBytesBandwidthAndExposurePerRank) {
  const CommReport r = two_ranks();
  const std::vector<std::string> lines = comm_report_lines(r);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].substr(0, lines[0].find(';')), "all-reduce: 47.2 MB a step per rank in fp16 (3 buckets)");
  EXPECT_NE(lines[0].find("NCCL_P2P_DISABLE=1 NCCL_SOCKET_IFNAME=lo"), std::string::npos) << lines[0];
  // 47.2 MB in 12.5 ms on 2 ranks: 3.78 GB/s
  EXPECT_EQ(lines[1], "all-reduce, rank 0: 12.50 ms a step on the communication stream (3.78 GB/s bus bandwidth), "
                      "9.25 ms of it exposed after backward (100 steps)");
  EXPECT_EQ(lines[2], "all-reduce, rank 1: not measured (no step in the steady-state window)");
  EXPECT_DOUBLE_EQ(exposed_ms(r, 0), 9.25);
  EXPECT_TRUE(std::isnan(exposed_ms(r, 1)));
  EXPECT_TRUE(std::isnan(exposed_ms(r, 2)));
}

TEST(CommStats, JsonHoldsEveryRankAndTheSettings) {
  const std::string j = comm_report_json(two_ranks()).str();
  EXPECT_NE(j.find("\"bytes_per_step\":4.72e+07"), std::string::npos) << j;
  EXPECT_NE(j.find("\"reduced_as\":\"fp16\",\"buckets\":3"), std::string::npos) << j;
  EXPECT_NE(j.find("\"0\":{\"steps\":100,\"busy_ms_per_step\":12.5,\"exposed_ms_per_step\":9.25,\"busbw_gbs\":3.776}"),
            std::string::npos)
      << j;
  EXPECT_NE(j.find("\"1\":{\"steps\":0,\"busy_ms_per_step\":null"), std::string::npos) << j;
  EXPECT_NE(j.find("\"nccl\":{\"NCCL_P2P_DISABLE\":\"1\",\"NCCL_SHM_DISABLE\":null"), std::string::npos) << j;
}
