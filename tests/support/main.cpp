// The unit-test binary's entry point. GPU tests call GTEST_SKIP() with a reason when no device is
// present, so the same binary runs everywhere.
#include <gtest/gtest.h>

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
