// Host memory checks: MemAvailable read from /proc/meminfo text, and the one-line error that says how
// much a data set needs when it would not fit.
#include <gtest/gtest.h>

#include <string>

#include "core/errors.h"
#include "core/host_memory.h"
#include "support/test_files.h"

namespace {

using test_files::input_error_of;

TEST(HostMemory, ReadsMemAvailable) {
  const std::string meminfo =
      "MemTotal:       24684092 kB\nMemFree:         1234567 kB\nMemAvailable:   23613132 kB\nBuffers: 1 kB\n";
  EXPECT_EQ(parse_mem_available(meminfo), size_t(23613132) * 1024);
  EXPECT_FALSE(parse_mem_available("MemTotal: 1 kB\n"));
  EXPECT_FALSE(parse_mem_available("MemAvailable: lots\n"));
  EXPECT_FALSE(parse_mem_available("MemAvailable: 12 MB\n"));
  EXPECT_TRUE(parse_mem_available("MemAvailable: 0 kB").has_value());
}

TEST(HostMemory, TooMuchSaysHowMuchItNeeds) {
  EXPECT_NO_THROW(require_host_memory(size_t(1) << 30, "x", size_t(1) << 30));
  const std::string m = input_error_of([] {
    require_host_memory(size_t(37) << 30, "--synthetic-size 10000000 (12,000,000 generated images)", size_t(22) << 30);
  });
  EXPECT_EQ(m, "--synthetic-size 10000000 (12,000,000 generated images) needs 37.00 GiB of host memory, but only "
               "22.00 GiB are available (MemAvailable in /proc/meminfo)");
}

TEST(HostMemory, ThisMachineHasSomeMemoryAvailable) {
  EXPECT_NO_THROW(require_host_memory(1 << 20, "a MiB"));
  EXPECT_HAS(input_error_of([] { require_host_memory(~size_t(0), "everything"); }), "everything needs");
}

}  // namespace
