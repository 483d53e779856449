// The synchronous (baseline) and pinned-ring loaders.
#include "pipeline/loader.h"

#include <vector>

#include "pipeline/batch_ring.h"
#include "core/check.h"
#include "core/handles.h"
#include "kernels/normalize.h"
#include "core/memory.h"

namespace {

constexpr int kRingSlots = 3;      // triple buffering: fill one, copy one, one to spare
constexpr int kDeviceStaging = 2;  // device-side uint8 buffers: one being copied, one being normalized

size_t image_elems(const LoaderConfig& c) { return size_t(c.batch) * kModelChannels * c.side * c.side; }
size_t batch_u8_bytes(const LoaderConfig& c) { return size_t(c.batch) * c.channels * c.side * c.side; }

// ---- the baseline --------------------------------------------------------------------------------
class SynchronousLoader : public BatchLoader {
 public:
  explicit SynchronousLoader(const LoaderConfig& c)
      : c_(c),
        u8_(batch_u8_bytes(c)),
        host_images_(image_elems(c) * dtype_size(c.dtype)),
        host_labels_(c.batch),
        images_(image_elems(c) * dtype_size(c.dtype), "input batch"),
        labels_(c.batch * sizeof(int32_t), "input labels") {}

  void begin_pass(const Dataset& data, const EpochPlan& plan, int) override {
    data_ = &data;
    plan_ = &plan;
  }

  void get(int k) override {
    assemble_batch_u8(*data_, *plan_, k, c_.layout, u8_.data(), host_labels_.data());
    normalize_batch_cpu(u8_.data(), c_.batch, c_.channels, c_.side, c_.layout, c_.norm, c_.dtype, host_images_.data());
  }

  DeviceBatch copy(int) override {
    // Pageable memory and the legacy default stream: the copy waits for all earlier GPU work and
    // the host waits for the copy, the naive behaviour of the seed posts' first loop.
    CUDA_CHECK(cudaMemcpy(images_.get(), host_images_.data(), host_images_.size(), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(labels_.get(), host_labels_.data(), host_labels_.size() * sizeof(int32_t),
                          cudaMemcpyHostToDevice));
    return {images_.get(), labels_.as<int32_t>()};
  }

 private:
  LoaderConfig c_;
  const Dataset* data_ = nullptr;
  const EpochPlan* plan_ = nullptr;
  std::vector<uint8_t> u8_;
  std::vector<uint8_t> host_images_;
  std::vector<int32_t> host_labels_;
  DeviceBuffer images_, labels_;
};

// ---- the pinned ring -----------------------------------------------------------------------------
// Copies a filled pinned slot into one of two device staging buffers on the copy stream.
class CudaCopyEngine : public CopyEngine {
 public:
  CudaCopyEngine(const LoaderConfig& c, const std::vector<PinnedBuffer>& u8, const std::vector<PinnedBuffer>& labels)
      : c_(c), host_u8_(u8), host_labels_(labels), copy_(false) {
    for (int i = 0; i < kRingSlots; ++i) copied_.emplace_back(false);
    for (int j = 0; j < kDeviceStaging; ++j) {
      dev_u8_.emplace_back(batch_u8_bytes(c), "loader staging images");
      dev_labels_.emplace_back(c.batch * sizeof(int32_t), "loader staging labels");
      consumed_.emplace_back(false);
      consumed_[j].record(c.compute);  // nothing to wait for on the first use
    }
  }

  void start_copy(int slot, int) override {
    const int j = staging_for_slot_[slot] = next_staging_++ % kDeviceStaging;
    // The staging buffer is free once the compute stream has normalized what it held before.
    CUDA_CHECK(cudaStreamWaitEvent(copy_, consumed_[j], 0));
    CUDA_CHECK(cudaMemcpyAsync(dev_u8_[j].get(), host_u8_[slot].get(), dev_u8_[j].bytes(), cudaMemcpyHostToDevice, copy_));
    CUDA_CHECK(cudaMemcpyAsync(dev_labels_[j].get(), host_labels_[slot].get(), dev_labels_[j].bytes(),
                               cudaMemcpyHostToDevice, copy_));
    copied_[slot].record(copy_);
  }

  void wait_copy(int slot) override { CUDA_CHECK(cudaEventSynchronize(copied_[slot])); }

  // Compute-stream side of batch in `slot`: wait for its copy, normalize, take the labels.
  DeviceBatch consume(int slot, void* images, int32_t* labels) {
    const int j = staging_for_slot_[slot];
    CUDA_CHECK(cudaStreamWaitEvent(c_.compute, copied_[slot], 0));
    NormalizeParams p{};
    for (int ch = 0; ch < kModelChannels; ++ch) {
      p.scale[ch] = 1.f / (255.f * c_.norm.stdev[ch]);
      p.shift[ch] = -c_.norm.mean[ch] / c_.norm.stdev[ch];
    }
    normalize_u8(dev_u8_[j].as<uint8_t>(), c_.batch, c_.channels, c_.side, c_.layout, p, images, c_.dtype, c_.compute);
    CUDA_CHECK(cudaMemcpyAsync(labels, dev_labels_[j].get(), dev_labels_[j].bytes(), cudaMemcpyDeviceToDevice, c_.compute));
    consumed_[j].record(c_.compute);
    return {images, labels};
  }

 private:
  LoaderConfig c_;
  const std::vector<PinnedBuffer>& host_u8_;
  const std::vector<PinnedBuffer>& host_labels_;
  Stream copy_;
  std::vector<DeviceBuffer> dev_u8_, dev_labels_;
  std::vector<Event> copied_, consumed_;
  int staging_for_slot_[kRingSlots] = {};
  long next_staging_ = 0;
};

class PinnedRingLoader : public BatchLoader {
 public:
  explicit PinnedRingLoader(const LoaderConfig& c)
      : c_(c),
        images_(image_elems(c) * dtype_size(c.dtype), "input batch"),
        labels_(c.batch * sizeof(int32_t), "input labels") {
    for (int i = 0; i < kRingSlots; ++i) {
      host_u8_.emplace_back(batch_u8_bytes(c), "loader ring images");
      host_labels_.emplace_back(sizeof(int32_t) * c.batch, "loader ring labels");
    }
    engine_ = std::make_unique<CudaCopyEngine>(c, host_u8_, host_labels_);
    ring_ = std::make_unique<BatchRing>(
        kRingSlots, c.workers, c.batch, [this](int slot, int k, int first, int end) { fill(slot, k, first, end); },
        *engine_);
  }

  ~PinnedRingLoader() override { ring_.reset(); }  // workers stop before the engine goes

  void begin_pass(const Dataset& data, const EpochPlan& plan, int first) override {
    ring_->begin_pass(0, 0);  // waits for workers still filling batches of an unfinished pass
    data_ = &data;
    plan_ = &plan;
    ring_->begin_pass(first, plan.steps);
  }

  void get(int k) override { slot_ = ring_->acquire(k); }

  DeviceBatch copy(int k) override {
    ring_->release(k);
    return engine_->consume(slot_, images_.get(), labels_.as<int32_t>());
  }

 private:
  // Worker threads: decode (image folders), crop and flip samples [first, end) of batch k into the slot.
  void fill(int slot, int k, int first, int end) {
    assemble_batch_u8(*data_, *plan_, k, c_.layout, host_u8_[slot].as<uint8_t>(), host_labels_[slot].as<int32_t>(),
                      first, end);
  }

  LoaderConfig c_;
  const Dataset* data_ = nullptr;
  const EpochPlan* plan_ = nullptr;
  std::vector<PinnedBuffer> host_u8_, host_labels_;
  DeviceBuffer images_, labels_;
  std::unique_ptr<CudaCopyEngine> engine_;
  std::unique_ptr<BatchRing> ring_;
  int slot_ = 0;
};

}  // namespace

std::unique_ptr<BatchLoader> make_loader(const LoaderConfig& cfg) {
  if (cfg.kind == LoaderKind::Synchronous) return std::make_unique<SynchronousLoader>(cfg);
  return std::make_unique<PinnedRingLoader>(cfg);
}
