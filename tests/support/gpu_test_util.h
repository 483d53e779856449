// Helpers of the GPU layer and kernel tests: the data helpers of support/device_data.h, skipping
// without a GPU, random data seeded from the test's name, the error measure as a GoogleTest
// assertion, one GPU context for the test binary, and the types and layouts the kernels run in.
//
// Each test draws fresh random inputs (seeded from its name), poisons every output with NaN bytes
// first (an element a kernel leaves unwritten fails the comparison), and compares with
// ||gpu - ref|| / ||ref||: fp32 with TF32 off <= 1e-4, TF32 <= 5e-3, fp16 <= 1e-2. Quantities the
// kernels compute in fp32 from exactly representable inputs (BN statistics and gamma/beta
// gradients, the loss, the optimizer step) are held to the fp32 bound in either precision.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
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

// One context for the whole binary: creating cuDNN/cuBLAS handles per test would dominate the run
// time. Never destroyed, so nothing is torn down after the CUDA runtime at exit.
inline GpuContext& ctx() {
  static GpuContext* c = new GpuContext;
  return *c;
}

// The activation types and layouts the kernels run in, as a test parameter.
struct Variant {
  DType t;
  Layout l;
};
inline const Variant kVariants[] = {{DType::F32, Layout::NCHW}, {DType::F32, Layout::NHWC},
                                    {DType::F16, Layout::NCHW}, {DType::F16, Layout::NHWC}};

inline std::string variant_name(const Variant& v) { return std::string(dtype_name(v.t)) + "_" + layout_name(v.l); }
inline void PrintTo(const Variant& v, std::ostream* os) { *os << variant_name(v); }
inline std::string variant_param_name(const testing::TestParamInfo<Variant>& info) { return variant_name(info.param); }

inline std::string dims_name(const ref::Dims& d) {
  return std::to_string(d.n) + "x" + std::to_string(d.c) + "x" + std::to_string(d.h) + "x" + std::to_string(d.w);
}

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
