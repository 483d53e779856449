// Test data on the GPU without GoogleTest: device tensors that upload and download double vectors
// in the element type and layout under test, NaN poisoning, seeded random data and the error bounds.
// Shared by the GPU tests (through support/gpu_test_util.h) and bin/kernel_lab (lab/).
//
// Every value given to a kernel is first rounded to the element type (quantize), and the CPU
// reference is fed those rounded values: the measured error is then the kernel's own, not the
// input's rounding.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/memory.h"
#include "core/types.h"
#include "support/reference.h"

namespace gpu_test {

// Relative-error bounds: fp32 with TF32 off, fp32 with TF32 tensor cores, fp16 (fp32 accumulation).
constexpr double kTolF32 = 1e-4;
constexpr double kTolTf32 = 5e-3;
constexpr double kTolF16 = 1e-2;
inline double tol(DType t) { return t == DType::F32 ? kTolF32 : kTolF16; }

// ---- element conversion ------------------------------------------------------------------------
inline uint16_t half_bits(__half h) {
  uint16_t b;
  std::memcpy(&b, &h, sizeof b);
  return b;
}
inline __half half_from_bits(uint16_t b) {
  __half_raw r;
  r.x = b;
  return __half(r);
}
inline uint32_t float_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

// v as the element type stores it (fp16: through fp32, as the upload converts it).
inline double quantize(DType t, double v) {
  const float f = static_cast<float>(v);
  return t == DType::F32 ? double(f) : double(__half2float(__float2half(f)));
}
inline ref::Vec quantize(DType t, ref::Vec v) {
  for (double& e : v) e = quantize(t, e);
  return v;
}

// ---- random data ---------------------------------------------------------------------------------
// A generator seeded from a name (FNV-1a): the same name draws the same data on every run.
inline std::mt19937_64 named_rng(const std::string& name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : name) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return std::mt19937_64(h);
}

inline ref::Vec random_normal(std::mt19937_64& rng, size_t n, double mean = 0.0, double stddev = 1.0) {
  std::normal_distribution<double> d(mean, stddev);
  ref::Vec v(n);
  for (double& e : v) e = d(rng);
  return v;
}

inline ref::Vec random_uniform(std::mt19937_64& rng, size_t n, double lo, double hi) {
  std::uniform_real_distribution<double> d(lo, hi);
  ref::Vec v(n);
  for (double& e : v) e = d(rng);
  return v;
}

// ---- layouts -----------------------------------------------------------------------------------
inline ref::Vec to_layout(Layout l, const ref::Dims& d, const ref::Vec& nchw) {
  return l == Layout::NCHW ? nchw : ref::nchw_to_nhwc(d, nchw);
}
inline ref::Vec from_layout(Layout l, const ref::Dims& d, const ref::Vec& data) {
  return l == Layout::NCHW ? data : ref::nhwc_to_nchw(d, data);
}

// ---- device tensors ----------------------------------------------------------------------------
// `count` elements of type t in device memory. download() waits for all device work first, so a
// test can launch on any stream and read back without its own synchronisation.
class DeviceTensor {
 public:
  DeviceTensor(size_t count, DType t, const std::string& what = "test tensor")
      : buf_(count * dtype_size(t), what), count_(count), t_(t) {}
  DeviceTensor(const ref::Vec& values, DType t, const std::string& what = "test tensor")
      : DeviceTensor(values.size(), t, what) {
    upload(values);
  }

  void upload(const ref::Vec& v) {
    if (v.size() != count_) throw std::invalid_argument("DeviceTensor::upload: wrong element count");
    if (count_ == 0) return;
    if (t_ == DType::F32) {
      std::vector<float> h(v.begin(), v.end());
      CUDA_CHECK(cudaMemcpy(buf_.get(), h.data(), buf_.bytes(), cudaMemcpyHostToDevice));
    } else {
      std::vector<__half> h(count_);
      for (size_t i = 0; i < count_; ++i) h[i] = __float2half(static_cast<float>(v[i]));
      CUDA_CHECK(cudaMemcpy(buf_.get(), h.data(), buf_.bytes(), cudaMemcpyHostToDevice));
    }
  }

  ref::Vec download() const {
    const std::vector<uint8_t> raw = bytes();
    ref::Vec v(count_);
    for (size_t i = 0; i < count_; ++i) {
      if (t_ == DType::F32) {
        float f;
        std::memcpy(&f, raw.data() + 4 * i, 4);
        v[i] = f;
      } else {
        uint16_t b;
        std::memcpy(&b, raw.data() + 2 * i, 2);
        v[i] = __half2float(half_from_bits(b));
      }
    }
    return v;
  }

  std::vector<uint8_t> bytes() const {
    std::vector<uint8_t> raw(buf_.bytes());
    CUDA_CHECK(cudaDeviceSynchronize());
    if (!raw.empty()) CUDA_CHECK(cudaMemcpy(raw.data(), buf_.get(), raw.size(), cudaMemcpyDeviceToHost));
    return raw;
  }

  // All bytes 0xFF: NaN in fp32 and in fp16, so an element a kernel fails to write shows up.
  void poison() {
    if (buf_.bytes()) CUDA_CHECK(cudaMemset(buf_.get(), 0xFF, buf_.bytes()));
  }

  void* get() const { return buf_.get(); }
  float* f32() const { return buf_.as<float>(); }
  size_t count() const { return count_; }
  DType dtype() const { return t_; }

 private:
  DeviceBuffer buf_;
  size_t count_;
  DType t_;
};

// An activation tensor given in NCHW order, stored in layout l.
inline DeviceTensor upload_activation(const ref::Vec& nchw, const ref::Dims& d, DType t, Layout l) {
  return DeviceTensor(to_layout(l, d, nchw), t, "test activation");
}
inline ref::Vec download_activation(const DeviceTensor& x, const ref::Dims& d, Layout l) {
  return from_layout(l, d, x.download());
}

}  // namespace gpu_test
