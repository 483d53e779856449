// --data auto with --data-dir: a directory that is missing, not a directory, unreadable or holding
// neither data set is said to be so (with what was looked for), never blamed on a data set the user
// did not ask for; and a synthetic set too large for host memory says how much it needs.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "core/errors.h"
#include "data/data_choice.h"
#include "support/test_files.h"

namespace {

using namespace test_files;  // TempDir, input_error_of

std::string auto_error(const std::string& dir) {
  return input_error_of([&] { load_data_set("auto", dir, 1000, 32, 0); });
}

TEST(DataChoice, AutoWithAMissingDirectorySaysItDoesNotExist) {
  TempDir dir;
  const std::string m = auto_error(dir / "cifar-10-batchs-bin");  // mistyped
  EXPECT_EQ(m, "--data-dir " + (dir / "cifar-10-batchs-bin") + ": the directory does not exist");
}

TEST(DataChoice, AutoWithAFileForADirectorySaysSo) {
  TempDir dir;
  std::ofstream(dir / "file") << "x";
  EXPECT_HAS(auto_error(dir / "file"), "not a directory");
}

TEST(DataChoice, AutoWithADirectoryOfNeitherListsWhatWasLookedFor) {
  TempDir dir;
  const std::string m = auto_error(dir.path);
  EXPECT_HAS(m, "--data-dir " + dir.path + ": holds neither CIFAR-10 (data_batch_1.bin) nor Fashion-MNIST");
  EXPECT_HAS(m, "train-images-idx3-ubyte.gz");
  EXPECT_EQ(m.find("install"), std::string::npos) << m;
}

TEST(DataChoice, AutoWithAnUnreadableDirectorySaysSo) {
  TempDir dir;
  const std::string locked = dir / "locked";
  ASSERT_EQ(mkdir(locked.c_str(), 0), 0);
  // Root reads anything, so the choice runs in a child that first drops to user "nobody".
  chmod(dir.path.c_str(), 0755);
  EXPECT_EXIT(exit_with_input_error([&] { load_data_set("auto", locked, 1000, 32, 0); }, true),
      ::testing::ExitedWithCode(0), "locked: the directory is not readable");
  chmod(locked.c_str(), 0755);
}

TEST(DataChoice, SyntheticDataTooLargeForHostMemorySaysHowMuchItNeeds) {
  // 2^31 - 1 images of 3 KiB (plus a test set of a fifth): 7.5 TiB, more than any machine here has.
  const std::string m = input_error_of([] { load_data_set("synthetic", "", 2147483647, 32, 0); });
  EXPECT_HAS(m, "--synthetic-size 2147483647");
  EXPECT_HAS(m, "GiB of host memory, but only");
}

}  // namespace
