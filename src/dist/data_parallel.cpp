// Data-parallel training over NCCL (data_parallel.h): set-up, gradient buckets on the communication
// stream, the collectives outside the step, the stop vote, and the all-reduce's clock.
#include "dist/data_parallel.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "core/check.h"
#include "dist/grad_compression.h"
#include "dist/nccl_comm.h"
#include "dist/peer_watch.h"
#include "dist/rendezvous.h"
#include "kernels/cast.h"
#include "kernels/comm_clock.h"

namespace {

constexpr long kVoteEvery = 16;            // steps between stop votes: a signal stops every rank within 32 steps
constexpr double kAbortSeconds = 10;

// ncclCommAbort itself has been seen to hang: the process ends after kAbortSeconds whatever happens.
void exit_if_abort_hangs() {
  std::thread([] {
    std::this_thread::sleep_for(std::chrono::duration<double>(kAbortSeconds));
    _exit(1);
  }).detach();
}

ncclDataType_t nccl_type(DType t) { return t == DType::F16 ? ncclHalf : ncclFloat; }

char* at(void* base, size_t elements, DType t) { return static_cast<char*>(base) + elements * dtype_size(t); }

// Converts n gradients between their type and the reduce type on `stream`.
void cast(const void* in, DType from, void* out, size_t n, cudaStream_t stream) {
  if (from == DType::F32) cast_f32_to_f16(static_cast<const float*>(in), out, n, stream);
  else cast_f16_to_f32(in, static_cast<float*>(out), n, stream);
}

bool capturing(cudaStream_t s) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(s, &status));
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace

int device_for_local_rank(int local_rank) {
  require_cuda_device();
  int n = 0;
  CUDA_CHECK(cudaGetDeviceCount(&n));
  if (n == 1) return 0;  // the launcher shows each process its own GPU only
  if (local_rank >= n)
    throw InputError("local rank " + std::to_string(local_rank) + " needs CUDA device " + std::to_string(local_rank) +
                     ", but this machine shows " + std::to_string(n) + " (start at most " + std::to_string(n) +
                     " ranks on it, or check CUDA_VISIBLE_DEVICES)");
  return local_rank;
}

DataParallel::DataParallel(const LaunchInfo& launch, const Fingerprint& fingerprint, const DataParallelConfig& cfg)
    : launch_(launch), cfg_(cfg) {
  RendezvousConfig rc;
  rc.master = master_address([](const char* name) { return static_cast<const char*>(std::getenv(name)); });
  const int device = device_for_local_rank(launch.local_rank);
  rc.rank = launch.rank;
  rc.world = launch.world;
  rc.fingerprint = fingerprint;
  rc.timeout_s = cfg.timeout_s;
  if (launch.is_root()) rc.shared = nccl_unique_id();
  RendezvousResult met = rendezvous(rc);
  // Watching starts before NCCL set-up, so that a rank dying during it stops the others at once.
  watch_ = std::make_unique<PeerWatch>(
      std::move(met.peers), WatchConfig{launch.rank, launch.world, cfg.timeout_s},
      [this](const std::string& reason) { stop_now(reason); },
      [this]() -> std::string {
        NcclComm* c = comm_for_watch_.load();
        return c ? c->async_error() : "";
      });
  try {
    CUDA_CHECK(cudaSetDevice(device));
    comm_ = std::make_unique<NcclComm>(met.shared, launch.rank, launch.world);  // attach() waits for it
  } catch (const std::exception& e) {
    watch_->fail(e.what());  // not a goodbye: the others must not wait for this rank
    throw;
  }
  // comm_for_watch_ stays null until attach() finds the set-up done: the watch thread must not poll
  // or abort a communicator that wait_ready() may still abort and drop on this thread.
}

DataParallel::~DataParallel() {
  if (comm_stream_ && comm_for_watch_.load()) cudaStreamSynchronize(*comm_stream_);  // the last stop vote
  if (comm_ && !comm_->ready()) exit_if_abort_hangs();  // ~NcclComm aborts a set-up still running
  watch_.reset();  // goodbye first, so that no rank mistakes this one's exit for a death
  comm_for_watch_ = nullptr;
}

// Runs on the watch thread: the run cannot go on. One line, the communicator aborted, and the
// process ends (its peers are gone or stuck, so nothing can be saved consistently).
void DataParallel::stop_now(const std::string& reason) {
  std::fflush(stdout);
  std::fprintf(stderr, "error: rank %d: stopping: %s\n", launch_.rank, reason.c_str());
  exit_if_abort_hangs();
  if (NcclComm* c = comm_for_watch_.exchange(nullptr)) c->abort();
  _exit(1);
}

void DataParallel::attach(ParamStore& params, cudaStream_t compute, GradAccumulation* sums) {
  // NCCL's set-up ran beside the network's build; everything from here on calls it.
  try {
    comm_->wait_ready(cfg_.timeout_s);
  } catch (const std::exception& e) {
    watch_->fail(e.what());  // as a failed set-up in the constructor: the others must not wait
    throw;
  }
  comm_for_watch_ = comm_.get();
  params_ = &params;
  compute_ = compute;
  sums_ = sums;
  // As urgent as the compute stream (GpuContext): the all-reduces must not wait behind the backward.
  comm_stream_ = std::make_unique<Stream>(/*blocking=*/false, StreamPriority::First);
  grad_type_ = params.act();
  const bool int8 = cfg_.compression == "int8";
  // Compressed, the buckets are cut by the gradients' own size, as PyTorch DDP's compression hooks
  // see them: by the int8 size, half the buckets would close and go at half the pace.
  reduce_type_ = int8 || cfg_.reduce_type.empty() ? grad_type_ : cfg_.reduce_type == "fp16" ? DType::F16 : DType::F32;
  const double mb = 1 << 20;
  const size_t cap = cfg_.overlap ? static_cast<size_t>(cfg_.bucket_mb * mb) : 0;
  const size_t first = std::min(cap, static_cast<size_t>(cfg_.first_bucket_mb * mb));
  const size_t last = static_cast<size_t>(cfg_.last_bucket_mb * mb);
  plan_ = plan_buckets(params.tensors(), params.weight_count(), dtype_size(reduce_type_), first, cap, last);
  tracker_ = std::make_unique<BucketTracker>(plan_);
  if (int8) int8_ = std::make_unique<Int8Compression>(plan_, params.weight_count(), world());
  fork_.emplace(false);
  join_.emplace(false);
  done_.emplace(false);
  bucket_ready_.clear();
  for (size_t b = 0; b < plan_.buckets.size(); ++b) bucket_ready_.emplace_back(false);
  if (reduce_type_ != grad_type_)
    staging_ = DeviceBuffer(params.weight_count() * dtype_size(reduce_type_), "weight gradients in the all-reduce type");
  vote_host_ = PinnedBuffer(4 * sizeof(int32_t), "stop vote");
  vote_dev_ = DeviceBuffer(2 * sizeof(int32_t), "stop vote");
  vote_landed_.clear();
  vote_landed_.emplace_back(false);
  vote_landed_.emplace_back(false);
  stamps_ = DeviceBuffer((1 + 2 * plan_.buckets.size()) * sizeof(unsigned long long), "all-reduce clock stamps");
  tally_ = DeviceBuffer(sizeof(CommTally), "all-reduce clock tally");
  measuring_ = DeviceBuffer(sizeof(int), "all-reduce clock switch");
  CUDA_CHECK(cudaMemsetAsync(tally_.get(), 0, tally_.bytes(), compute_));
  CUDA_CHECK(cudaMemsetAsync(measuring_.get(), 0, measuring_.bytes(), compute_));
}

void DataParallel::set_loss_scale(const float* scale) {
  if (int8_) int8_->set_loss_scale(scale);
}

// The last gradient of the step completes it: the naive form launches its one bucket now, and the
// compute stream is made to wait for the last bucket, so the optimizer step that follows sees the
// averaged gradients. The step's code needs no call of its own for it (eager and captured alike).
void DataParallel::on_grad_ready(int t) {
  if (accumulating_) return;  // a micro-batch before the step's last: its gradients are summed, not sent
  if (tracker_->reported() == 0) {
    step_in_capture_ = capturing(compute_);
  } else if (tracker_->was_reported(t) && step_in_capture_ && !capturing(compute_)) {
    // The step's CUDA graph capture failed part way (train/step_graph.h): nothing of it ran, and
    // the step is enqueued again eagerly, from its first gradient.
    tracker_->reset();
    step_in_capture_ = false;
  }
  const auto [first, end] = tracker_->ready(t);
  if (cfg_.overlap)
    for (int b = first; b < end; ++b) launch_bucket(b);
  if (tracker_->all_launched()) join_gradients();
}

void DataParallel::launch_bucket(int b) {
  const GradBucket& g = plan_.buckets[b];
  cudaStream_t comm = *comm_stream_;
  unsigned long long* stamps = stamps_.as<unsigned long long>();
  bucket_ready_[b].record(compute_);
  CUDA_CHECK(cudaStreamWaitEvent(comm, bucket_ready_[b], 0));
  stamp_time(stamps + 1 + 2 * b, comm);
  if (sums_) sums_->finish(g.weight_offset, g.weight_count, g.vector_offset, g.vector_count, comm);
  void* grads = at(params_->weight_grads_all(), g.weight_offset, grad_type_);
  float* vectors = params_->vector_grads_all() + g.vector_offset;
  if (int8_) {
    int8_->all_reduce(g, b, grads, grad_type_, vectors, *comm_, comm);
  } else {
    void* reduced = staging_.get() ? at(staging_.get(), g.weight_offset, reduce_type_) : grads;
    if (staging_.get() && g.weight_count) cast(grads, grad_type_, reduced, g.weight_count, comm);
    NCCL_COMM_CHECK(*comm_, ncclGroupStart());
    if (g.weight_count)
      NCCL_COMM_CHECK(*comm_, ncclAllReduce(reduced, reduced, g.weight_count, nccl_type(reduce_type_), ncclAvg,
                                            comm_->get(), comm));
    if (g.vector_count)
      NCCL_COMM_CHECK(*comm_, ncclAllReduce(vectors, vectors, g.vector_count, ncclFloat, ncclAvg, comm_->get(), comm));
    NCCL_COMM_CHECK(*comm_, ncclGroupEnd());
    if (staging_.get() && g.weight_count) cast(reduced, reduce_type_, grads, g.weight_count, comm);
  }
  stamp_time(stamps + 2 + 2 * b, comm);
}

void DataParallel::join_gradients() {
  stamp_time(stamps_.as<unsigned long long>(), compute_);  // the end of backward
  if (!cfg_.overlap)
    for (int b = 0; b < static_cast<int>(plan_.buckets.size()); ++b) launch_bucket(b);
  tracker_->reset();
  ++joined_steps_;
  done_->record(*comm_stream_);
  CUDA_CHECK(cudaStreamWaitEvent(compute_, *done_, 0));
  tally_comm_step(stamps_.as<unsigned long long>(), static_cast<int>(plan_.buckets.size()), measuring_.as<int>(),
                  tally_.as<CommTally>(), compute_);
}

void DataParallel::check_step() const {
  if (tracker_->reported() == 0 && joined_steps_ > 0) return;  // a replayed graph: no hook runs
  throw Fatal("gradient buckets: only " + std::to_string(tracker_->reported()) + " of " +
              std::to_string(plan_.bucket_of.size()) + " parameter gradients were reported in a step "
              "(TrainingNetwork::on_grad_ready is not called after every gradient): they would not be averaged");
}

template <class Fn>
void DataParallel::on_comm_stream(Fn&& enqueue) {
  fork_->record(compute_);
  CUDA_CHECK(cudaStreamWaitEvent(*comm_stream_, *fork_, 0));
  enqueue(static_cast<cudaStream_t>(*comm_stream_));
  join_->record(*comm_stream_);
  CUDA_CHECK(cudaStreamWaitEvent(compute_, *join_, 0));
}

void DataParallel::broadcast_from_root(void* data, size_t bytes) {
  on_comm_stream([&](cudaStream_t s) {
    NCCL_COMM_CHECK(*comm_, ncclBroadcast(data, data, bytes, ncclUint8, 0, comm_->get(), s));
  });
}

void DataParallel::average(float* data, size_t n) {
  on_comm_stream([&](cudaStream_t s) {
    NCCL_COMM_CHECK(*comm_, ncclAllReduce(data, data, n, ncclFloat, ncclAvg, comm_->get(), s));
  });
}

void DataParallel::sum_totals(LossTotals* t) {
  static_assert(offsetof(LossTotals, count) == offsetof(LossTotals, correct) + sizeof(unsigned long long));
  on_comm_stream([&](cudaStream_t s) {
    NCCL_COMM_CHECK(*comm_, ncclGroupStart());
    NCCL_COMM_CHECK(*comm_, ncclAllReduce(&t->loss_sum, &t->loss_sum, 1, ncclFloat64, ncclSum, comm_->get(), s));
    NCCL_COMM_CHECK(*comm_, ncclAllReduce(&t->correct, &t->correct, 2, ncclUint64, ncclSum, comm_->get(), s));
    NCCL_COMM_CHECK(*comm_, ncclGroupEnd());
  });
}

// Vote k is enqueued at step k * kVoteEvery and read at step (k + 1) * kVoteEvery: by then it has
// long landed, and every rank reads the same result at the same step.
bool DataParallel::agree_to_stop(long step, bool requested_here) {
  if (stop_agreed_) return true;
  if (step % kVoteEvery != 0 || step == decided_at_) return false;
  decided_at_ = step;
  int32_t* host = vote_host_.as<int32_t>();  // [0..1] this rank's votes, [2..3] the results
  if (voted_at_ >= 0) {
    const int previous = vote_round_ ^ 1;
    CUDA_CHECK(cudaEventSynchronize(vote_landed_[previous]));
    if (host[2 + previous] != 0) return stop_agreed_ = true;
  }
  const int slot = vote_round_;
  vote_round_ ^= 1;
  host[slot] = requested_here ? 1 : 0;
  int32_t* dev = vote_dev_.as<int32_t>() + slot;
  // In stream order with the steps: a step replayed as a graph runs its all-reduces on the compute
  // stream, and two collectives of one communicator must not run side by side.
  on_comm_stream([&](cudaStream_t s) {
    CUDA_CHECK(cudaMemcpyAsync(dev, host + slot, sizeof(int32_t), cudaMemcpyHostToDevice, s));
    NCCL_COMM_CHECK(*comm_, ncclAllReduce(dev, dev, 1, ncclInt32, ncclMax, comm_->get(), s));
    CUDA_CHECK(cudaMemcpyAsync(host + 2 + slot, dev, sizeof(int32_t), cudaMemcpyDeviceToHost, s));
    vote_landed_[slot].record(s);
  });
  voted_at_ = step;
  return false;
}

void DataParallel::progress(long steps) { watch_->progress(steps); }

// The process is about to exit with an error. Its peers are told, and the communicator is aborted at
// once: an all-reduce still queued would never finish without the others, and every cudaFree on the
// way out waits for the GPU.
void DataParallel::fail(const std::string& why) {
  watch_->fail(why);
  exit_if_abort_hangs();
  comm_for_watch_ = nullptr;
  if (comm_) comm_->abort();
}

void DataParallel::measure_exposure(bool on) {
  CUDA_CHECK(cudaMemsetAsync(measuring_.get(), on ? 1 : 0, measuring_.bytes(), compute_));
}

// The tallies of every rank side by side (an all-gather of three numbers), then zeroed.
CommReport DataParallel::comm_report() {
  constexpr int kFields = sizeof(CommTally) / sizeof(unsigned long long);
  DeviceBuffer all(size_t(world()) * sizeof(CommTally), "all-reduce clock tallies of every rank");
  on_comm_stream([&](cudaStream_t s) {
    NCCL_COMM_CHECK(*comm_, ncclAllGather(tally_.get(), all.get(), kFields, ncclUint64, comm_->get(), s));
  });
  std::vector<CommTally> tallies(world());
  CUDA_CHECK(cudaMemcpyAsync(tallies.data(), all.get(), all.bytes(), cudaMemcpyDeviceToHost, compute_));
  CUDA_CHECK(cudaMemsetAsync(tally_.get(), 0, tally_.bytes(), compute_));
  CUDA_CHECK(cudaStreamSynchronize(compute_));
  CommReport r = comm_plan();
  for (const CommTally& t : tallies) {
    RankComm c;
    c.steps = static_cast<long>(t.steps);
    if (t.steps > 0) {
      c.busy_ms = double(t.busy_ns) / double(t.steps) / 1e6;
      c.exposed_ms = double(t.exposed_ns) / double(t.steps) / 1e6;
    }
    r.ranks.push_back(c);
  }
  return r;
}

CommReport DataParallel::comm_plan() const {
  CommReport r;
  r.world = world();
  r.bytes_per_step = bytes_per_step();
  r.buckets = static_cast<int>(plan_.buckets.size());
  r.reduced_as = reduced_as();
  r.nccl = nccl_settings([](const char* name) { return static_cast<const char*>(std::getenv(name)); });
  return r;
}

double DataParallel::bytes_per_step() const {
  double bytes = 0;
  for (size_t b = 0; b < plan_.buckets.size(); ++b)
    bytes += int8_ ? double(int8_->plan().bytes(plan_.buckets[b], static_cast<int>(b))) : double(plan_.buckets[b].bytes);
  return bytes;
}

std::string DataParallel::reduced_as() const {
  return int8_ ? "int8 with error feedback (+ fp32 scales per " + std::to_string(int8_->plan().chunk) + ")"
               : std::string(dtype_name(reduce_type_));
}

std::string DataParallel::describe() const {
  std::string sizes;
  char buf[32];
  for (const GradBucket& b : plan_.buckets) {
    std::snprintf(buf, sizeof(buf), "%s%.1f", sizes.empty() ? "" : "/", double(b.bytes) / (1 << 20));
    sizes += buf;
  }
  return std::to_string(world()) + " ranks (" + launch_.launcher + "), NCCL " + nccl_version_text() + ", gradients " +
         "averaged in " + std::to_string(plan_.buckets.size()) + " bucket" + (plan_.buckets.size() == 1 ? "" : "s") +
         " of " + sizes + " MB in " + reduced_as() +
         (cfg_.overlap ? ", overlapped with backward" : ", after the whole backward (naive)") +
         (sums_ ? ", once every " + std::to_string(sums_->micro_batches()) + " micro-batches" : "");
}
