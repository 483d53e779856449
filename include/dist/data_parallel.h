// Data-parallel training over NCCL, as the trainer sees it: one object it calls at a few points.
//
//   DataParallel dp(launch, fingerprint, config);   // rendezvous, this rank's GPU, NCCL, the watch
//   ... build the network on that GPU ...
//   dp.attach(params, compute_stream, sums);         // gradient buckets over the flat store
//   net.on_grad_ready = [&](int t) { dp.on_grad_ready(t); };
//   per step: backward (each bucket's all-reduce starts on the communication stream as soon as
//             backward has produced it; after the last gradient the compute stream waits for the
//             last bucket only), optimizer step, dp.check_step()
//   with --accumulate N: dp.begin_micro_batch(m) before each of the step's N micro-batches; only
//             the last one's backward reduces, each bucket's accumulated sums folded in first
//             (grad_accumulation.h)
//   outside the step: broadcast_from_root (start), average (BN running statistics before an
//             evaluation or a save), sum_totals (loss counters), agree_to_stop (signals)
//
// Gradients are averaged (ncclAvg) in buckets (buckets.h): the weight gradients in the reduce type
// (--allreduce-dtype: their own type, or a cast to fp16/fp32 and back on the communication stream)
// or as int8 with error feedback (--grad-compression int8: grad_compression.h), the BN/bias
// gradients in fp32. With overlap off (OPT_DDP_OVERLAP=0, bin/train-ddp-naive) there is one bucket,
// all-reduced after the whole backward. Nothing here synchronises the host inside a step, so a step
// can be captured as a CUDA graph (the NCCL calls, the events and the clock's kernels are capturable).
//
// The clock (kernels/comm_clock.h): every reducing step stamps the end of backward and the start
// and end of each bucket on the GPU, and a tally adds them up while measure_exposure(true) is on;
// comm_report() then says, for every rank, what the all-reduce cost a step (comm_stats.h).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/handles.h"
#include "core/memory.h"
#include "core/types.h"
#include "dist/buckets.h"
#include "dist/comm_stats.h"
#include "dist/fingerprint.h"
#include "dist/grad_accumulation.h"
#include "dist/launch_env.h"
#include "kernels/loss.h"
#include "model/params.h"

class Int8Compression;
class NcclComm;
class PeerWatch;

struct DataParallelConfig {
  double bucket_mb = 25;        // --bucket-mb
  double first_bucket_mb = 1;   // the first bucket, small so that communication starts early
  std::string reduce_type;      // --allreduce-dtype: "fp16", "fp32", or "" for the gradients' own type
  bool overlap = true;          // OPT_DDP_OVERLAP: buckets during backward, or one after it
  double timeout_s = 300;       // --dist-timeout
  std::string compression = "none";  // --grad-compression: "none" or "int8" (then reduce_type is unused)
  double last_bucket_mb = 0;    // --last-bucket-mb: the last bucket's cap (0: what is left over)
};

// The CUDA device a local rank uses: local_rank, or 0 when the launcher shows each process only its
// own GPU. Throws InputError when there is no such device.
int device_for_local_rank(int local_rank);

class DataParallel {
 public:
  // Meets the other ranks (rendezvous.h), makes this rank's GPU current, begins joining the NCCL
  // communicator (its set-up goes on beside the caller's until attach) and starts the watch
  // (peer_watch.h).
  DataParallel(const LaunchInfo& launch, const Fingerprint& fingerprint, const DataParallelConfig& cfg);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  int rank() const { return launch_.rank; }
  int world() const { return launch_.world; }

  // Waits for NCCL's set-up (InputError when a rank never joins within the timeout), then takes
  // the parameters whose gradients it averages, the stream backward runs on, and with --accumulate
  // the micro-batches' sums (folded into each bucket before its all-reduce; nullptr: none).
  void attach(ParamStore& params, cudaStream_t compute, GradAccumulation* sums = nullptr);
  // The loss scale the gradients carry (device memory): int8 compression keeps its residuals
  // unscaled with it. Unset: 1.
  void set_loss_scale(const float* scale);
  // The micro-batch whose backward comes next: all but the last of a step only accumulate, and
  // their gradient hooks do nothing. Without --accumulate every step is its own last micro-batch.
  void begin_micro_batch(const MicroBatch& m) { accumulating_ = !m.last(); }
  // The network's hook: tensor t's gradient has been enqueued on the compute stream. The last one
  // of a step has the compute stream wait for the last bucket (the naive form's only one, launched
  // then), so the optimizer step enqueued after backward reads averaged gradients.
  void on_grad_ready(int t);
  // After a step was enqueued: a Fatal when backward reported some gradients but not all (they would
  // go unaveraged), or none in a step that was not a graph replay.
  void check_step() const;

  // Collectives outside the step, ordered with the compute stream (no host wait).
  void broadcast_from_root(void* data, size_t bytes);
  void average(float* data, size_t n);
  // Sums loss_sum, correct and count over the ranks (the other fields stay this rank's).
  void sum_totals(LossTotals* totals);

  // Every rank stops at the same step when any of them was asked to (a signal): the ranks vote every
  // few steps on the communication stream and act on the previous vote, which has long landed, so
  // the host never waits for the GPU. Returns true at the step where all ranks stop.
  bool agree_to_stop(long step, bool requested_here);

  // The watch: a step (or an evaluation batch, a save) was made; this rank stops with an error.
  void progress(long steps);
  void fail(const std::string& why);

  // While on, each reducing step's all-reduce is tallied on the GPU (eager and replayed steps alike):
  // how long the communication stream spent on its buckets, and how much of that was exposed, from
  // the end of backward to the end of the last bucket. Switched in stream order with the steps.
  void measure_exposure(bool on);
  // Every rank calls it at the same step (a collective): each rank's tally since the last call,
  // the bytes a step and the NCCL settings; the tallies start again from zero.
  CommReport comm_report();
  // The same without the tallies (no collective): what a step sends, and the NCCL settings.
  CommReport comm_plan() const;
  // What one rank hands NCCL per optimizer step: every bucket, as reduced.
  double bytes_per_step() const;

  // "2 ranks (torchrun), NCCL 2.28.9, 3 buckets of 1.0/25.0/21.0 MB, fp16, overlapped with backward".
  std::string describe() const;

 private:
  void launch_bucket(int b);
  std::string reduced_as() const;
  void join_gradients();
  template <class Fn> void on_comm_stream(Fn&& enqueue);
  [[noreturn]] void stop_now(const std::string& reason);

  LaunchInfo launch_;
  DataParallelConfig cfg_;
  std::unique_ptr<NcclComm> comm_;
  std::atomic<NcclComm*> comm_for_watch_{nullptr};  // what the watch thread may abort
  std::unique_ptr<PeerWatch> watch_;
  // attached
  ParamStore* params_ = nullptr;
  cudaStream_t compute_ = nullptr;
  std::unique_ptr<Stream> comm_stream_;
  DType grad_type_ = DType::F32, reduce_type_ = DType::F32;
  BucketPlan plan_;
  std::unique_ptr<BucketTracker> tracker_;
  std::vector<Event> bucket_ready_;
  std::optional<Event> fork_, join_, done_;  // made in attach(), on this rank's GPU
  DeviceBuffer staging_;  // the weight gradients in the reduce type, when it differs from theirs
  std::unique_ptr<Int8Compression> int8_;  // --grad-compression int8
  GradAccumulation* sums_ = nullptr;       // --accumulate: folded into each bucket before it goes
  bool accumulating_ = false;              // this micro-batch is not its step's last
  // the stop vote: two rounds in flight at most
  PinnedBuffer vote_host_;  // int32 [2 in][2 out]
  DeviceBuffer vote_dev_;   // int32 [2]
  std::vector<Event> vote_landed_;
  long voted_at_ = -1, decided_at_ = -1;
  int vote_round_ = 0;
  bool stop_agreed_ = false;
  long joined_steps_ = 0;   // steps whose gradients were averaged by hooks (eager or captured)
  bool step_in_capture_ = false;  // the current step's hooks run inside a CUDA graph capture
  // the clock: stamps [end of backward, (start, end) per bucket], the tally, and whether it counts
  DeviceBuffer stamps_, tally_, measuring_;
};
