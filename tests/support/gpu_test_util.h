// Helpers of the GPU layer tests: the data helpers of support/device_data.h, skipping without a
// GPU, random data seeded from the test's name, and the error measure as a GoogleTest assertion.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <sstream>
#include <string>

#include "core/handles.h"
#include "support/device_data.h"

// Skips the current test, with the reason, when no CUDA device can be used.
#define SKIP_WITHOUT_GPU(what)                                                            \
  do {                                                                                    \
    if (!cuda_device_available())                                                         \
      GTEST_SKIP() << "no CUDA device: " << what << " runs on the GPU";                   \
  } while (0)

namespace gpu_test {

// Random data seeded from the test's full name (and `salt`).
inline std::mt19937_64 test_rng(const std::string& salt = "") {
  const testing::TestInfo* info = testing::UnitTest::GetInstance()->current_test_info();
  std::string key = salt;
  if (info) key += std::string(info->test_suite_name()) + "." + info->name();
  return named_rng(key);
}

// ---- comparison --------------------------------------------------------------------------------
// ||got - want|| / ||want|| <= bound, with the non-finite count and the worst element on failure.
inline testing::AssertionResult AssertClose(const char* got_expr, const char* want_expr, const char*,
                                            const ref::Vec& got, const ref::Vec& want, double bound) {
  const double err = ref::rel_error(got, want);
  if (err <= bound) return testing::AssertionSuccess();
  std::ostringstream msg;
  msg << got_expr << " vs " << want_expr << ": relative error " << err << " > " << bound;
  if (got.size() != want.size()) {
    msg << " (" << got.size() << " elements vs " << want.size() << ")";
    return testing::AssertionFailure() << msg.str();
  }
  size_t bad = 0, worst = 0;
  double worst_diff = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) {
      if (bad++ == 0) worst = i, worst_diff = INFINITY;
      continue;
    }
    const double d = std::abs(got[i] - want[i]);
    if (worst_diff != INFINITY && d > worst_diff) worst = i, worst_diff = d;
  }
  if (bad) msg << "; " << bad << " of " << got.size() << " elements not finite (unwritten?)";
  if (!got.empty())
    msg << "; element " << worst << ": got " << got[worst] << ", want " << want[worst];
  return testing::AssertionFailure() << msg.str();
}

#define EXPECT_CLOSE(got, want, bound) EXPECT_PRED_FORMAT3(gpu_test::AssertClose, got, want, bound)

}  // namespace gpu_test
