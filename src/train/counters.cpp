// Reading the GPU's counters and telling a diverged run from a healthy one.
#include "train/counters.h"

#include <cmath>
#include <cstdio>

#include "core/check.h"

DeviceCounters initial_counters(float loss_scale) {
  DeviceCounters c{};
  c.train = fresh_totals(NAN);  // no finite loss yet: a run whose first step diverges must not report 0
  c.eval = fresh_totals(NAN);
  c.scaler.scale = loss_scale;
  return c;
}

LossTotals fresh_totals(float last_good_loss) {
  LossTotals t{};
  t.first_bad_step = -1;
  t.last_good_loss = last_good_loss;
  return t;
}

CounterReader::CounterReader(cudaStream_t stream)
    : stream_(stream), dev_(sizeof(DeviceCounters), "counters"), host_(sizeof(DeviceCounters), "counters") {}

void CounterReader::set(const DeviceCounters& c) {
  CUDA_CHECK(cudaMemcpy(device(), &c, sizeof(c), cudaMemcpyHostToDevice));
}

void CounterReader::set_train(const LossTotals& t) {
  CUDA_CHECK(cudaMemcpy(&device()->train, &t, sizeof(t), cudaMemcpyHostToDevice));
}

CounterRead CounterReader::read_blocking(long steps) {
  CounterRead r{{}, steps};
  CUDA_CHECK(cudaMemcpy(&r.counters, device(), sizeof(DeviceCounters), cudaMemcpyDeviceToHost));
  return r;
}

void CounterReader::enqueue_copy() {
  CUDA_CHECK(cudaMemcpyAsync(host_.get(), device(), sizeof(DeviceCounters), cudaMemcpyDeviceToHost, stream_));
}

CounterRead CounterReader::read_now(long steps) {
  enqueue_copy();
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  in_flight_ = false;
  return {*host_.as<DeviceCounters>(), steps};
}

std::optional<CounterRead> CounterReader::poll(long steps) {
  std::optional<CounterRead> landed;
  if (in_flight_) {
    const cudaError_t q = cudaEventQuery(landed_);
    if (q == cudaErrorNotReady) return std::nullopt;  // never wait here
    CUDA_CHECK(q);
    landed = CounterRead{*host_.as<DeviceCounters>(), in_flight_steps_};
  }
  enqueue_copy();
  landed_.record(stream_);
  in_flight_ = true;
  in_flight_steps_ = steps;
  return landed;
}

// The GPU records the first step whose loss was not finite; a gradient divergence is only known to
// lie after the last read that found none.
void DivergenceWatch::check(const CounterRead& r) {
  const DeviceCounters& c = r.counters;
  const long steps = r.steps;
  const bool bad = c.train.first_bad_step >= 0 || c.scaler.diverged;
  if (!bad || (fp16_ && !c.scaler.diverged)) {  // fp16: an overflow only skipped that step
    clean_steps_ = std::max(clean_steps_, steps);
    return;
  }
  char last[64] = "no finite loss in this run";
  if (!std::isnan(c.train.last_good_loss))
    std::snprintf(last, sizeof(last), "last finite loss %.6g", c.train.last_good_loss);
  char at[64];
  if (c.train.first_bad_step >= 0) std::snprintf(at, sizeof(at), "step %lld", c.train.first_bad_step);
  else if (steps - 1 == clean_steps_) std::snprintf(at, sizeof(at), "step %ld", steps - 1);
  else std::snprintf(at, sizeof(at), "one of steps %ld to %ld", clean_steps_, steps - 1);
  char msg[512];
  if (c.train.first_bad_step >= 0)
    std::snprintf(msg, sizeof(msg), "training diverged: the loss became NaN/Inf at %s (%s); stopping without saving",
                  at, last);
  else
    std::snprintf(msg, sizeof(msg), "training diverged at %s: non-finite gradients%s (%s); stopping without saving",
                  at, fp16_ ? " even at a tiny loss scale" : "", last);
  throw Diverged(msg);
}
