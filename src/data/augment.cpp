// Batch plans, random crop and flip, and batch assembly on the CPU (augment.h).
#include "data/augment.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <cuda_fp16.h>

#include "core/rng.h"

EpochPlan train_plan(const Dataset& d, int batch, uint64_t seed, int epoch, int crop_pad) {
  EpochPlan p;
  p.batch = batch;
  p.steps = d.count / batch;
  p.valid_last = batch;
  p.augment = true;
  p.aug_seed = mix(seed, 0xA06u, static_cast<uint64_t>(epoch));
  p.crop_pad = crop_pad < 0 ? crop_pad_for(d.side) : crop_pad;
  p.order.resize(d.count);
  for (int i = 0; i < d.count; ++i) p.order[i] = static_cast<uint32_t>(i);
  Rng rng(mix(seed, 0x5EEDu, static_cast<uint64_t>(epoch)));
  for (int i = d.count - 1; i > 0; --i) std::swap(p.order[i], p.order[rng.below(i + 1)]);
  return p;
}

EpochPlan eval_plan(const Dataset& d, int batch) {
  EpochPlan p;
  p.batch = batch;
  p.steps = (d.count + batch - 1) / batch;
  p.valid_last = d.count - (p.steps - 1) * batch;
  p.augment = false;
  p.order.resize(d.count);
  for (int i = 0; i < d.count; ++i) p.order[i] = static_cast<uint32_t>(i);
  return p;
}

EpochPlan shard_plan(EpochPlan p, int shard, int shards) {
  if (shards < 1 || shard < 0 || shard >= shards || p.shards != 1 || p.batch % shards != 0)
    throw std::invalid_argument("shard_plan: shard " + std::to_string(shard) + " of " + std::to_string(shards) +
                                " of a plan of batch " + std::to_string(p.batch));
  const int global = p.batch;
  p.batch = global / shards;
  p.shards = shards;
  p.shard = shard;
  const long last_start = long(p.steps - 1) * global + long(shard) * p.batch;  // this rank's last batch
  p.valid_last = static_cast<int>(std::clamp<long>(long(p.order.size()) - last_start, 0, p.batch));
  return p;
}

CropFlip crop_flip_for(uint64_t aug_seed, uint64_t sample_slot, int pad) {
  const uint64_t h = mix(aug_seed, sample_slot);
  const int span = 2 * pad + 1;
  return {static_cast<int>(h % span) - pad, static_cast<int>((h >> 16) % span) - pad, ((h >> 32) & 1) != 0};
}

void assemble_batch_u8(const Dataset& d, const EpochPlan& plan, int k, Layout layout,
                       uint8_t* images, int32_t* labels, int first, int end) {
  const int C = d.channels, S = d.side;
  const size_t img_bytes = d.image_bytes();
  std::vector<uint8_t> scratch(d.decoded_on_demand ? img_bytes : 0);
  if (end < 0) end = plan.batch;
  for (int i = first; i < end; ++i) {
    const size_t slot = plan.slot(k, i);
    uint8_t* out = images + img_bytes * i;
    if (slot >= plan.order.size()) {  // evaluation padding
      std::memset(out, 0, img_bytes);
      labels[i] = -1;
      continue;
    }
    const uint32_t idx = plan.order[slot];
    labels[i] = d.labels[idx];
    const uint8_t* src = image_pixels(d, static_cast<int>(idx), scratch.data());
    const CropFlip cf = plan.augment ? crop_flip_for(plan.aug_seed, slot, plan.crop_pad) : CropFlip{0, 0, false};
    for (int c = 0; c < C; ++c) {
      const uint8_t* plane = src + size_t(c) * S * S;
      for (int y = 0; y < S; ++y) {
        const int sy = y + cf.dy;
        for (int x = 0; x < S; ++x) {
          const int sx = (cf.flip ? S - 1 - x : x) + cf.dx;
          const uint8_t v = (sy >= 0 && sy < S && sx >= 0 && sx < S) ? plane[sy * S + sx] : 0;
          const size_t o = layout == Layout::NCHW ? (size_t(c) * S + y) * S + x
                                                  : (size_t(y) * S + x) * C + c;
          out[o] = v;
        }
      }
    }
  }
}

void normalize_batch_cpu(const uint8_t* images, int batch, int channels, int side, Layout layout,
                         const Normalization& norm, DType dtype, void* out) {
  const int S = side, M = kModelChannels;
  const size_t in_img = size_t(channels) * S * S, out_img = size_t(M) * S * S;
  float scale[M], shift[M];
  for (int c = 0; c < M; ++c) {
    scale[c] = 1.0f / (255.0f * norm.stdev[c]);
    shift[c] = -norm.mean[c] / norm.stdev[c];
  }
  for (int n = 0; n < batch; ++n)
    for (int c = 0; c < M; ++c) {
      const int sc = channels == 1 ? 0 : c;
      for (int p = 0; p < S * S; ++p) {
        const size_t src = layout == Layout::NCHW ? size_t(sc) * S * S + p : size_t(p) * channels + sc;
        const size_t dst = layout == Layout::NCHW ? size_t(c) * S * S + p : size_t(p) * M + c;
        const float v = images[in_img * n + src] * scale[c] + shift[c];
        if (dtype == DType::F32)
          static_cast<float*>(out)[out_img * n + dst] = v;
        else
          static_cast<__half*>(out)[out_img * n + dst] = __float2half(v);
      }
    }
}
