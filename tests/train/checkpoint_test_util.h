// What the checkpoint tests share: a checkpoint whose every field and value is distinct, a bit-exact
// comparison, parsing from bytes, and the file layout of checkpoint.h written independently.
// Header-only (inline), so each test file includes it and nothing changes in the Makefile.
#pragma once

#include <gtest/gtest.h>

#include <zlib.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "train/checkpoint.h"

namespace checkpoint_test {

// A checkpoint whose every field and array element differs from the defaults and from each other.
inline Checkpoint sample(size_t params = 1000, size_t running = 100, int version = 0) {
  Checkpoint c;
  CheckpointMeta& m = c.meta;
  m.precision = "fp16";
  m.layout = "NHWC";
  m.model = "resnet50-cifar";
  m.model_signature = 0xFEDCBA9876543210ull;
  m.params = params;
  m.running = running;
  m.image_side = 224;
  m.class_names = {"T-shirt/top", "a,b", "100%", "new\nline", "x=y", "tab\there"};  // what a header line must survive
  m.data = "fashion-mnist";
  m.batch = 256;
  m.epochs = 17;
  m.seed = 0xFFFFFFFFFFFFFFFFull;
  m.epoch = 9;
  m.step_in_epoch = 41 + version;
  m.step = 9 * 13717421001ll + m.step_in_epoch;  // 13,717,421,001 steps per epoch: a consistent position
  m.loss_scale = std::nextafter(12345.678f, 1e9f);  // no short decimal form: must survive exactly
  m.good_steps = 777;
  m.skipped_steps = 3;
  m.lr_recorded = true;
  m.lr_scaled = true;
  m.lr_reference_batch = 64;
  m.lr = 0.1 * 3;  // 0.30000000000000004: must survive exactly
  m.min_lr = 1e-300;
  m.warmup_epochs = 2.0 / 3;
  c.master.resize(params);
  c.momentum.resize(params);
  c.running.resize(running);
  for (size_t i = 0; i < params; ++i) {
    c.master[i] = std::ldexp(static_cast<float>(i) + 0.1f * version, -7) - 3.f;
    c.momentum[i] = -1.f / (1.f + i + version);
  }
  for (size_t i = 0; i < running; ++i) c.running[i] = std::sqrt(static_cast<float>(i + version));
  if (params > 2) c.master[1] = -0.f, c.master[2] = 1e-42f;  // signed zero and a denormal
  return c;
}

inline void expect_same(const Checkpoint& a, const Checkpoint& b) {
  EXPECT_EQ(a.meta.precision, b.meta.precision);
  EXPECT_EQ(a.meta.layout, b.meta.layout);
  EXPECT_EQ(a.meta.model, b.meta.model);
  EXPECT_EQ(a.meta.model_signature, b.meta.model_signature);
  EXPECT_EQ(a.meta.params, b.meta.params);
  EXPECT_EQ(a.meta.running, b.meta.running);
  EXPECT_EQ(a.meta.image_side, b.meta.image_side);
  EXPECT_EQ(a.meta.class_names, b.meta.class_names);
  EXPECT_EQ(a.meta.data, b.meta.data);
  EXPECT_EQ(a.meta.batch, b.meta.batch);
  EXPECT_EQ(a.meta.epochs, b.meta.epochs);
  EXPECT_EQ(a.meta.seed, b.meta.seed);
  EXPECT_EQ(a.meta.step, b.meta.step);
  EXPECT_EQ(a.meta.epoch, b.meta.epoch);
  EXPECT_EQ(a.meta.step_in_epoch, b.meta.step_in_epoch);
  EXPECT_EQ(std::memcmp(&a.meta.loss_scale, &b.meta.loss_scale, sizeof(float)), 0)
      << a.meta.loss_scale << " vs " << b.meta.loss_scale;
  EXPECT_EQ(a.meta.good_steps, b.meta.good_steps);
  EXPECT_EQ(a.meta.skipped_steps, b.meta.skipped_steps);
  EXPECT_EQ(a.meta.lr_recorded, b.meta.lr_recorded);
  EXPECT_EQ(a.meta.lr_scaled, b.meta.lr_scaled);
  EXPECT_EQ(a.meta.lr_reference_batch, b.meta.lr_reference_batch);
  EXPECT_EQ(a.meta.lr, b.meta.lr);
  EXPECT_EQ(a.meta.min_lr, b.meta.min_lr);
  EXPECT_EQ(a.meta.warmup_epochs, b.meta.warmup_epochs);
  auto bits_equal = [](const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
  };
  EXPECT_TRUE(bits_equal(a.master, b.master)) << "master weights differ";
  EXPECT_TRUE(bits_equal(a.momentum, b.momentum)) << "momentum differs";
  EXPECT_TRUE(bits_equal(a.running, b.running)) << "running statistics differ";
}

inline Checkpoint parse(const std::vector<uint8_t>& b, const std::string& file = "ck.bin") {
  return parse_checkpoint(b.data(), b.size(), file);
}

// The layout documented in checkpoint.h, written independently: magic, version, header length,
// header, three length-prefixed float arrays, CRC-32 of everything before it.
inline std::vector<uint8_t> build_file(const std::string& header, const std::vector<std::vector<float>>& arrays,
                                       uint32_t version = 1) {
  std::vector<uint8_t> out = {'R', 'N', '5', '0', 'C', 'K', 'P', 'T'};
  auto put = [&](const void* p, size_t n) { out.insert(out.end(), (const uint8_t*)p, (const uint8_t*)p + n); };
  const uint32_t hlen = static_cast<uint32_t>(header.size());
  put(&version, 4);
  put(&hlen, 4);
  put(header.data(), header.size());
  for (const auto& a : arrays) {
    const uint64_t n = a.size();
    put(&n, 8);
    put(a.data(), a.size() * sizeof(float));
  }
  const uint32_t crc = static_cast<uint32_t>(crc32(0L, out.data(), static_cast<uInt>(out.size())));
  put(&crc, 4);
  return out;
}

inline constexpr const char* kHeader =
    "precision=fp32\nlayout=NCHW\nmodel=resnet50-cifar\nmodel_signature=42\nparams=3\nrunning=2\n"
    "data=cifar10\nbatch=128\nepochs=15\nseed=7\nstep=100\nepoch=1\nstep_in_epoch=5\n"
    "loss_scale=0x1p+0\ngood_steps=0\nskipped_steps=0\n";

}  // namespace checkpoint_test
