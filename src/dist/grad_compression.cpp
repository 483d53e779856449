// int8 gradient compression with error feedback (grad_compression.h).
#include "dist/grad_compression.h"

#include "core/check.h"
#include "core/errors.h"
#include "dist/nccl_comm.h"
#include "kernels/compress.h"

size_t CompressionPlan::bytes(const GradBucket& b, int bucket) const {
  return b.weight_count + chunks[bucket] * sizeof(float) + b.vector_count * sizeof(float);
}

void check_int8_world(int world) {
  if (world > kInt8MaxWorld)
    throw InputError("--grad-compression int8 sums the ranks' int8 values, which holds at most " +
                     std::to_string(kInt8MaxWorld) + " ranks (this run has " + std::to_string(world) + ")");
}

CompressionPlan plan_compression(const BucketPlan& buckets, int world, int chunk) {
  check_int8_world(world);
  if (chunk < 1) throw Fatal("int8 compression: a chunk of " + std::to_string(chunk) + " gradients");
  CompressionPlan p;
  p.world = world;
  p.levels = int8_levels(world);
  p.chunk = chunk;
  for (const GradBucket& b : buckets.buckets) {
    p.first_chunk.push_back(p.total_chunks);
    p.chunks.push_back((b.weight_count + chunk - 1) / chunk);
    p.total_chunks += p.chunks.back();
  }
  return p;
}

Int8Compression::Int8Compression(const BucketPlan& buckets, size_t n_weights, int world)
    : plan_(plan_compression(buckets, world)),
      residual_(n_weights * sizeof(float), "int8 compression: residuals (error feedback)"),
      values_(n_weights, "int8 compression: quantized gradients"),
      maxima_(plan_.total_chunks * sizeof(float), "int8 compression: chunk maxima") {
  CUDA_CHECK(cudaMemset(residual_.get(), 0, residual_.bytes()));
  CUDA_CHECK(cudaDeviceSynchronize());  // the communication stream does not wait for the legacy stream
}

void Int8Compression::all_reduce(const GradBucket& g, int b, void* grads, DType t, float* vectors,
                                 const NcclComm& comm, cudaStream_t stream) {
  const size_t n = g.weight_count;
  float* residual = residual_.as<float>() + g.weight_offset;
  int8_t* q = values_.as<int8_t>() + g.weight_offset;
  float* maxima = maxima_.as<float>() + plan_.first_chunk[b];
  if (n) {
    int8_absmax(grads, t, residual, n, plan_.chunk, loss_scale_, maxima, stream);
    NCCL_COMM_CHECK(comm, ncclAllReduce(maxima, maxima, plan_.chunks[b], ncclFloat, ncclMax, comm.get(), stream));
    int8_quantize(grads, t, residual, n, plan_.chunk, loss_scale_, maxima, plan_.levels, q, stream);
  }
  NCCL_COMM_CHECK(comm, ncclGroupStart());
  if (n) NCCL_COMM_CHECK(comm, ncclAllReduce(q, q, n, ncclInt8, ncclSum, comm.get(), stream));
  if (g.vector_count)
    NCCL_COMM_CHECK(comm, ncclAllReduce(vectors, vectors, g.vector_count, ncclFloat, ncclAvg, comm.get(), stream));
  NCCL_COMM_CHECK(comm, ncclGroupEnd());
  if (n) int8_dequantize(q, n, plan_.chunk, maxima, plan_.levels, plan_.world, grads, t, stream);
}
