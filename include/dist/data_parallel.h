// Data-parallel training over NCCL, as the trainer sees it: one object it calls at a few points.
//
//   DataParallel dp(launch, fingerprint, config);   // rendezvous, this rank's GPU, NCCL, the watch
//   ... build the network on that GPU ...
//   dp.attach(params, compute_stream);              // gradient buckets over the flat store
//   net.on_grad_ready = [&](int t) { dp.on_grad_ready(t); };
//   per step: backward (each bucket's all-reduce starts on the communication stream as soon as
//             backward has produced it; after the last gradient the compute stream waits for the
//             last bucket only), optimizer step, dp.check_step()
//   outside the step: broadcast_from_root (start), average (BN running statistics before an
//             evaluation or a save), sum_totals (loss counters), agree_to_stop (signals)
//
// Gradients are averaged (ncclAvg) in buckets (buckets.h): the weight gradients in the reduce type
// (--allreduce-dtype: their own type, or a cast to fp16/fp32 and back on the communication stream),
// the BN/bias gradients in fp32. With overlap off (OPT_DDP_OVERLAP=0, bin/train-ddp-naive) there is
// one bucket, all-reduced after the whole backward. Nothing here synchronises the host inside a
// step, so a step can be captured as a CUDA graph (the NCCL calls and the events are capturable).
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
#include "dist/fingerprint.h"
#include "dist/launch_env.h"
#include "kernels/loss.h"
#include "model/params.h"

class NcclComm;
class PeerWatch;

struct DataParallelConfig {
  double bucket_mb = 25;        // --bucket-mb
  double first_bucket_mb = 1;   // the first bucket, small so that communication starts early
  std::string reduce_type;      // --allreduce-dtype: "fp16", "fp32", or "" for the gradients' own type
  bool overlap = true;          // OPT_DDP_OVERLAP: buckets during backward, or one after it
  double timeout_s = 300;       // --dist-timeout
};

// The CUDA device a local rank uses: local_rank, or 0 when the launcher shows each process only its
// own GPU. Throws InputError when there is no such device.
int device_for_local_rank(int local_rank);

class DataParallel {
 public:
  // Meets the other ranks (rendezvous.h), makes this rank's GPU current, joins the NCCL
  // communicator and starts the watch (peer_watch.h).
  DataParallel(const LaunchInfo& launch, const Fingerprint& fingerprint, const DataParallelConfig& cfg);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  int rank() const { return launch_.rank; }
  int world() const { return launch_.world; }
  bool is_root() const { return launch_.rank == 0; }

  // The parameters whose gradients it averages, and the stream backward runs on.
  void attach(ParamStore& params, cudaStream_t compute);
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

  // While on, each step's exposed all-reduce time (from the end of backward on the compute stream to
  // the end of the last bucket) is measured with events; steps replayed as a CUDA graph are not.
  void measure_exposure(bool on) { measuring_ = on; }
  // Mean exposed milliseconds per measured step (waits for them), NaN when none was measured.
  double exposed_ms_per_step();

  // "2 ranks (torchrun), NCCL 2.28.9, 3 buckets of 1.0/25.0/21.0 MB, fp16, overlapped with backward".
  std::string describe() const;

 private:
  void launch_bucket(int b);
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
  // the stop vote: two rounds in flight at most
  PinnedBuffer vote_host_;  // int32 [2 in][2 out]
  DeviceBuffer vote_dev_;   // int32 [2]
  std::vector<Event> vote_landed_;
  long voted_at_ = -1, decided_at_ = -1;
  int vote_round_ = 0;
  bool stop_agreed_ = false;
  long joined_steps_ = 0;   // steps whose gradients were averaged by hooks (eager or captured)
  bool step_in_capture_ = false;  // the current step's hooks run inside a CUDA graph capture
  // exposure measurement
  bool measuring_ = false;
  std::vector<std::pair<Event, Event>> exposure_;  // (end of backward, end of the last bucket)
};
