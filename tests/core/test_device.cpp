// What the trainer says when it cannot use a GPU: no driver, no device, a driver too old, GPUs hidden
// by CUDA_VISIBLE_DEVICES, and a GPU whose compute capability the build holds no code for. The
// decisions are functions of what CUDA reports, tested here without a GPU.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/device.h"
#include "support/test_files.h"  // EXPECT_HAS

namespace {

TEST(NoDeviceMessage, WithoutADriverSaysSoAndPointsAtMakeTest) {
  const std::string m = no_device_message(
      "cudaGetDeviceCount: CUDA driver version is insufficient for CUDA runtime version", true, false, std::nullopt);
  EXPECT_EQ(m.rfind("no CUDA device: no NVIDIA driver or GPU was found on this machine", 0), 0u) << m;
  EXPECT_HAS(m, "`make test`");
  EXPECT_EQ(m.find("insufficient"), std::string::npos) << "CUDA's words blame a driver that is not there: " << m;
  EXPECT_HAS(no_device_message("", false, false, std::string("")), "no NVIDIA driver or GPU");
}

TEST(NoDeviceMessage, AnOldDriverIsToldToUpdate) {
  const std::string m = no_device_message("cudaGetDeviceCount: CUDA driver version is insufficient", true, true,
                                          std::nullopt);
  EXPECT_EQ(m.rfind("no CUDA device", 0), 0u) << m;
  EXPECT_HAS(m, "update the driver");
  EXPECT_HAS(m, "CUDA 1");  // the runtime's version, e.g. "CUDA 13.0"
}

TEST(NoDeviceMessage, HiddenGpusNameTheVariable) {
  const std::string m = no_device_message("cudaGetDeviceCount: no CUDA-capable device is detected", false, true,
                                          std::string(""));
  EXPECT_EQ(m.rfind("no CUDA device", 0), 0u) << m;
  EXPECT_HAS(m, "CUDA_VISIBLE_DEVICES=''");
  EXPECT_HAS(no_device_message("", false, true, std::nullopt), "no CUDA device found");
}

TEST(ArchList, ParsesTheMakefilesList) {
  EXPECT_EQ(parse_arch_list("80 86 89 90"), (std::vector<int>{80, 86, 89, 90}));
  EXPECT_EQ(parse_arch_list("90"), (std::vector<int>{90}));
  EXPECT_EQ(parse_arch_list(" 80,  90 "), (std::vector<int>{80, 90}));
  EXPECT_TRUE(parse_arch_list("").empty());
}

TEST(ArchMismatch, TheDefaultBuildRunsOnEveryAmpereAdaAndHopperGpuAndLaterOnes) {
  const std::vector<int> sass = {80, 86, 89, 90}, ptx = {90};
  for (int cc : {80, 86, 87, 89, 90, 100, 103, 120}) EXPECT_FALSE(arch_mismatch(cc, "gpu", sass, ptx)) << cc;
  const auto turing = arch_mismatch(75, "Tesla T4", sass, ptx);
  ASSERT_TRUE(turing);
  EXPECT_HAS(*turing, "Tesla T4 has compute capability 7.5");
  EXPECT_HAS(*turing, "make clean && make CUDA_ARCH=75");
}

TEST(ArchMismatch, ACubinRunsOnItsOwnMajorVersionOnly) {
  const std::vector<int> hopper = {90}, none = {};
  // An sm_90-only build (what `make` gave on a machine without a GPU before) on an A100, an L4, an RTX 3090:
  for (const auto& [cc, name] : std::vector<std::pair<int, std::string>>{{80, "NVIDIA A100-SXM4-80GB"},
                                                                        {89, "NVIDIA L4"},
                                                                        {86, "NVIDIA GeForce RTX 3090"}}) {
    const auto m = arch_mismatch(cc, name, hopper, none);
    ASSERT_TRUE(m) << cc;
    EXPECT_HAS(*m, name + " has compute capability " + std::to_string(cc / 10) + "." + std::to_string(cc % 10));
    EXPECT_HAS(*m, "this build holds code for sm_90 only");
    EXPECT_HAS(*m, "make clean && make CUDA_ARCH=" + std::to_string(cc));
  }
  EXPECT_FALSE(arch_mismatch(89, "L4", {80}, none)) << "an sm_80 cubin runs on 8.9";
  EXPECT_TRUE(arch_mismatch(80, "A100", {86}, none)) << "an sm_86 cubin does not run on 8.0";
  EXPECT_TRUE(arch_mismatch(100, "B200", hopper, none)) << "without PTX nothing runs on the next major version";
  EXPECT_FALSE(arch_mismatch(100, "B200", hopper, hopper)) << "compute_90 PTX is compiled for it by the driver";
  EXPECT_TRUE(arch_mismatch(86, "RTX 3090", none, hopper)) << "PTX runs on its own or later GPUs only";
  const auto m = arch_mismatch(80, "A100", {86, 90}, {90});
  ASSERT_TRUE(m);
  EXPECT_HAS(*m, "sm_86, sm_90 and PTX compute_90 only");
}

}  // namespace
