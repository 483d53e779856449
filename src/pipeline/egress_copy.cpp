// Device-to-host copies of each rung of the egress ladder (pipeline/egress_copy.h).
#include "pipeline/egress_copy.h"

#include "core/check.h"

CudaEgressEngine::CudaEgressEngine(const EgressSettings& s, int slots, std::vector<EgressRegion> regions,
                                   cudaStream_t compute)
    : s_(s), regions_(std::move(regions)), compute_(compute), pageable_(slots) {
  for (const EgressRegion& r : regions_) bytes_ += r.bytes;
  for (int i = 0; i < slots; ++i) {
    if (s_.pool) pinned_.emplace_back(bytes_, "output buffer pool");
    if (s_.egress_stream) staging_.emplace_back(bytes_, "output staging");
    computed_.emplace_back(false);
    copied_.emplace_back(false);
  }
}

CudaEgressEngine::~CudaEgressEngine() {
  // A copy may still be landing in a buffer about to be freed (a run stopped by an error).
  for (Event& e : copied_) cudaEventSynchronize(e);
  cudaStreamSynchronize(egress_);
}

void* CudaEgressEngine::host_buffer(int slot) {
  if (s_.pool) return pinned_[slot].get();
  pageable_[slot].resize(bytes_);  // the per-batch allocation the pool removes
  return pageable_[slot].data();
}

const void* CudaEgressEngine::host(int slot) const {
  return s_.pool ? pinned_[slot].get() : static_cast<const void*>(pageable_[slot].data());
}

void CudaEgressEngine::release(int slot) {
  if (!s_.pool) std::vector<uint8_t>().swap(pageable_[slot]);  // freed, as a tensor of `.cpu()` would be
}

void CudaEgressEngine::copy_on_egress_stream(int slot, void* dst) {
  char* stage = staging_[slot].as<char>();
  size_t off = 0;
  for (const EgressRegion& r : regions_) {
    CUDA_CHECK(cudaMemcpyAsync(stage + off, r.device, r.bytes, cudaMemcpyDeviceToDevice, compute_));
    off += r.bytes;
  }
  computed_[slot].record(compute_);
  CUDA_CHECK(cudaStreamWaitEvent(egress_, computed_[slot], 0));
  CUDA_CHECK(cudaMemcpyAsync(dst, stage, bytes_, cudaMemcpyDeviceToHost, egress_));
  copied_[slot].record(egress_);
}

void CudaEgressEngine::start_copy(int slot, int) {
  char* dst = static_cast<char*>(host_buffer(slot));
  if (s_.egress_stream) {
    copy_on_egress_stream(slot, dst);
    if (!s_.async_copy) CUDA_CHECK(cudaEventSynchronize(copied_[slot]));
    return;
  }
  size_t off = 0;
  for (const EgressRegion& r : regions_) {
    if (s_.async_copy)
      CUDA_CHECK(cudaMemcpyAsync(dst + off, r.device, r.bytes, cudaMemcpyDeviceToHost, compute_));
    else  // the legacy default stream: waits for the compute stream's work, and the host waits for the copy
      CUDA_CHECK(cudaMemcpy(dst + off, r.device, r.bytes, cudaMemcpyDeviceToHost));
    off += r.bytes;
  }
  if (s_.async_copy) copied_[slot].record(compute_);
}

void CudaEgressEngine::wait_copy(int slot) {
  if (s_.async_copy) CUDA_CHECK(cudaEventSynchronize(copied_[slot]));
}
