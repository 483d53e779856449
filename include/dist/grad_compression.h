// int8 gradient compression with error feedback (--grad-compression int8): the weight gradients
// of each bucket cross the network as one byte each instead of two (fp16) or four (fp32).
//
// Per bucket, on the communication stream (the arithmetic: kernels/compress.h):
//   1. each rank takes its gradients plus its residual (what it failed to send before) and the
//      largest magnitude of every chunk of kCompressionChunk of them;
//   2. ncclMax of those chunk maxima: a scale per chunk that every rank shares;
//   3. each rank rounds to int8 with floor(127 / ranks) levels a side, so that the ranks' sum cannot
//      overflow, and keeps the rounding error as its new residual (error feedback: what is not sent
//      now is sent later, so nothing is lost over the steps, only delayed);
//   4. ncclSum of the int8 values (with the bucket's BN/bias gradients, fp32 ncclAvg, in one group);
//   5. the sum times the chunk's step over the ranks: the averaged gradient, in the gradients' type.
// Two collectives a bucket instead of one; the chunk scales add 4 bytes per kCompressionChunk
// gradients (0.4%). The residuals (fp32, 4 bytes per weight) are not saved in checkpoints: a resumed
// run starts them at zero, which costs it at most one step's rounding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "core/memory.h"
#include "core/types.h"
#include "dist/buckets.h"

class NcclComm;

// Gradients per shared scale: small enough that one large gradient does not flatten its
// neighbours to zero, large enough that the scales cost little to send.
constexpr int kCompressionChunk = 1024;

// Where each bucket's chunk maxima live, and what a bucket sends (host-side bookkeeping, no GPU).
struct CompressionPlan {
  int world = 1, levels = 127, chunk = kCompressionChunk;
  std::vector<size_t> first_chunk;  // per bucket: the index of its first chunk in the maxima buffer
  std::vector<size_t> chunks;       // per bucket: its chunks (its weight gradients, rounded up)
  size_t total_chunks = 0;
  // Bytes one rank hands NCCL for bucket b: int8 weights, fp32 maxima, fp32 vectors.
  size_t bytes(const GradBucket& b, int bucket) const;
};

// InputError for more ranks than int8 can sum (kInt8MaxWorld): checked before the ranks meet.
void check_int8_world(int world);
// Throws as check_int8_world, and Fatal for a chunk below 1.
CompressionPlan plan_compression(const BucketPlan& buckets, int world, int chunk = kCompressionChunk);

class Int8Compression {
 public:
  // Buffers for `n_weights` weight gradients: residuals (zero), the int8 values, the chunk maxima.
  Int8Compression(const BucketPlan& buckets, size_t n_weights, int world);
  const CompressionPlan& plan() const { return plan_; }
  // The loss scale the gradients carry (device memory, read by the kernels at each step), so that
  // the residuals are kept unscaled; nullptr: none (fp32 builds).
  void set_loss_scale(const float* scale) { loss_scale_ = scale; }
  // Enqueues bucket b's reduction on `stream`: its weight gradients `grads` (type t, the bucket's
  // first) become the ranks' average as int8 carries it, its `vector_count` vector gradients the
  // fp32 average.
  void all_reduce(const GradBucket& bucket, int b, void* grads, DType t, float* vectors, const NcclComm& comm,
                  cudaStream_t stream);

 private:
  CompressionPlan plan_;
  DeviceBuffer residual_, values_, maxima_;
  const float* loss_scale_ = nullptr;
};
