// What the GPU counts during training (loss, accuracy, the loss scaler), how the host reads it, and
// how a read shows that the run diverged.
//
// The counters live in one device allocation, so one copy reads them all. The baseline reads them
// with a synchronising copy every step (the seed's `loss.item()`); with on-device loss accumulation
// they are read asynchronously every --progress-every steps, never waiting for the GPU.
#pragma once

#include <optional>

#include "core/errors.h"
#include "core/handles.h"
#include "core/memory.h"
#include "kernels/loss.h"
#include "kernels/optimizer.h"

struct DeviceCounters {
  LossTotals train;  // since the start of the epoch
  LossTotals eval;
  ScalerState scaler;
};

// Fresh counters: no bad step yet, no finite loss yet, the loss scaler at `loss_scale`.
DeviceCounters initial_counters(float loss_scale);
// Fresh loss totals that keep the latest finite loss (the sums are per epoch, that loss is not).
LossTotals fresh_totals(float last_good_loss);

// What a read of the counters found, and how many steps in all had been enqueued when it was made.
struct CounterRead {
  DeviceCounters counters;
  long steps;
};

class CounterReader {
 public:
  explicit CounterReader(cudaStream_t stream);
  DeviceCounters* device() const { return dev_.as<DeviceCounters>(); }
  // Host -> device, synchronously (start of a run or an epoch).
  void set(const DeviceCounters& c);
  void set_train(const LossTotals& t);
  // The baseline's read: a blocking cudaMemcpy.
  CounterRead read_blocking(long steps);
  // Waits for the stream, then reads.
  CounterRead read_now(long steps);
  // Returns the asynchronous read started earlier once it has landed, and starts a new one covering
  // `steps`; returns nothing (and starts nothing) while the earlier read is still in flight.
  std::optional<CounterRead> poll(long steps);

 private:
  void enqueue_copy();
  cudaStream_t stream_;
  DeviceBuffer dev_;
  PinnedBuffer host_;
  Event landed_{false};
  bool in_flight_ = false;
  long in_flight_steps_ = 0;
};

struct Diverged : Fatal {
  using Fatal::Fatal;
};

// Decides from each read whether training diverged; steps are named 0-based, as --loss-log numbers
// them. In fp32 a NaN/Inf loss or non-finite gradients stop the run; in fp16 an overflow only makes
// the scaler skip that step, and the run diverged only when the scale collapsed.
class DivergenceWatch {
 public:
  explicit DivergenceWatch(bool fp16) : fp16_(fp16) {}
  // The first step of this process: no read has found a divergence before it.
  void start_at(long step) { clean_steps_ = step; }
  // Throws Diverged when counters read after `steps` steps show a divergence.
  void check(const CounterRead& r);

 private:
  bool fp16_;
  long clean_steps_ = 0;  // the most steps a read has covered without finding a divergence
};
