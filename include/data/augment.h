// What goes into each batch, and the CPU side of augmentation.
//
// A batch is a pure function of (data set, plan, batch index), so that any worker thread can build
// any batch, and a resumed run rebuilds exactly the batches an uninterrupted one would have seen.
#pragma once

#include <cstdint>
#include <vector>

#include "data/dataset.h"
#include "core/types.h"

// The random crop pads by side / 8 on each side unless --crop-pad says: 4 at 32x32 (the CIFAR
// recipe's pad-4 crop), and the same shift relative to the image at any other size.
inline int crop_pad_for(int side) { return side / 8; }

struct EpochPlan {
  std::vector<uint32_t> order;  // sample indices; batch k is order[k*batch .. (k+1)*batch)
  int batch = 0;
  int steps = 0;                // batches in this pass
  int valid_last = 0;           // real samples in the last batch (the rest are padding, label -1)
  bool augment = false;         // random crop + flip (training) or the image as is (evaluation)
  uint64_t aug_seed = 0;
  int crop_pad = 0;             // crop offsets lie in [-crop_pad, crop_pad]
  // Data-parallel runs: every rank holds the same order, cut into global batches of shards * batch
  // samples; this rank's batch k is its slice `shard` of global batch k (shard_plan).
  int shards = 1, shard = 0;
  // Position of sample i of batch k in the epoch: it indexes `order` and seeds the crop and flip, so
  // a sample is augmented the same way whichever rank, and however many ranks, take it.
  size_t slot(int k, int i) const { return (size_t(k) * shards + shard) * batch + i; }
};

// Training pass: a fresh permutation from (seed, epoch); the last partial batch is dropped. The crop
// pads by `crop_pad`, or by crop_pad_for(d.side) where it is negative.
EpochPlan train_plan(const Dataset& d, int batch, uint64_t seed, int epoch, int crop_pad = -1);
// Evaluation pass: samples in order; the last batch is padded to full size with label -1.
EpochPlan eval_plan(const Dataset& d, int batch);
// Rank `shard` of `shards`' part of a plan made for the global batch (plan.batch, a multiple of
// `shards`): the same order and steps, batches of plan.batch / shards. The ranks' parts of a pass
// are disjoint and together hold every sample of the pass exactly once.
EpochPlan shard_plan(EpochPlan plan, int shard, int shards);

struct CropFlip {
  int dx, dy;   // crop offset in [-pad, pad]
  bool flip;    // horizontal flip after the crop
};
CropFlip crop_flip_for(uint64_t aug_seed, uint64_t sample_slot, int pad);

// Writes samples [first, end) of batch k (end = -1: to the end of the batch) as uint8 in `layout`
// (NCHW: [B][C][S][S], NHWC: [B][S][S][C], C = the data set's stored channels, S its side) and their
// labels; `images` and `labels` point at the start of the whole batch. Padding samples are zero
// images with label -1. Parts written by different threads make the same batch as one call. Images
// decoded on demand are decoded here, on the calling thread: ImageDecodeError naming a file that
// does not decode.
void assemble_batch_u8(const Dataset& d, const EpochPlan& plan, int k, Layout layout,
                       uint8_t* images, int32_t* labels, int first = 0, int end = -1);

// The baseline loader's normalization on the CPU: uint8 batch (as assembled, side x side) to `dtype`
// values (x/255 - mean) / std with kModelChannels channels in `layout`; grey is replicated.
void normalize_batch_cpu(const uint8_t* images, int batch, int channels, int side, Layout layout,
                         const Normalization& norm, DType dtype, void* out);
