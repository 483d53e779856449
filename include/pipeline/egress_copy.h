// The CUDA side of the egress pipeline (pipeline/egress.h): how a batch's outputs get from device
// memory into a host slot, one class for every rung of the ladder (EgressSettings says which).
//
//   no pool     each batch gets a freshly allocated pageable buffer, freed once processed (what
//               `output.cpu()` does in the seed's first loop)
//   pool        `slots` pinned buffers, allocated once and reused
//   sync        cudaMemcpy: the host waits for the GPU to finish the batch and the copy
//   async       cudaMemcpyAsync on the compute stream and an event per slot; the worker that
//               processes the slot waits for the event, the main thread goes on queuing compute
//   stream      the outputs are first copied device-to-device into the slot's own device buffer on
//               the compute stream (a few microseconds: the next batch may then overwrite the
//               network's outputs), and the egress stream, after an event, copies that buffer to
//               the host while the next batch computes
#pragma once

#include <cstddef>
#include <vector>

#include <cuda_runtime.h>

#include "core/handles.h"
#include "core/memory.h"
#include "pipeline/egress.h"

// One output of the network (the logits, the pooled features) copied every batch; a slot holds the
// regions back to back in this order.
struct EgressRegion {
  const void* device;
  size_t bytes;
};

class CudaEgressEngine : public EgressEngine {
 public:
  // `compute`: the stream the network runs on (a blocking stream, which the synchronous copy
  // relies on).
  CudaEgressEngine(const EgressSettings& s, int slots, std::vector<EgressRegion> regions, cudaStream_t compute);
  ~CudaEgressEngine() override;  // waits for copies still in flight into its buffers

  void start_copy(int slot, int batch) override;
  void wait_copy(int slot) override;
  const void* host(int slot) const override;
  void release(int slot) override;

 private:
  void* host_buffer(int slot);
  void copy_on_egress_stream(int slot, void* dst);

  EgressSettings s_;
  std::vector<EgressRegion> regions_;
  size_t bytes_ = 0;
  cudaStream_t compute_;
  Stream egress_{false};                       // non-blocking: it must not wait for the compute stream
  std::vector<PinnedBuffer> pinned_;           // pool
  std::vector<std::vector<uint8_t>> pageable_; // no pool: one allocation per batch
  std::vector<DeviceBuffer> staging_;          // egress stream: the outputs, per slot, on the device
  std::vector<Event> computed_, copied_;
};
