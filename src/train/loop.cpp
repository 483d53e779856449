// The loop of a training run (loop.h).
#include "train/loop.h"

#include <atomic>
#include <chrono>
#include <csignal>
#include <optional>

#include "core/check.h"
#include "core/elapsed.h"
#include "core/handles.h"
#include "data/augment.h"
#include "measure/profiling.h"
#include "train/checkpointing.h"
#include "train/data_parallel_setup.h"

namespace {

std::atomic<bool> g_stop_requested{false};
extern "C" void on_stop_signal(int) { g_stop_requested = true; }

double mean_loss(const LossTotals& t) { return t.count ? t.loss_sum / double(t.count) : NAN; }
double accuracy(const LossTotals& t) { return t.count ? double(t.correct) / double(t.count) : NAN; }

}  // namespace

TrainLoop::TrainLoop(const BuildSettings& b, const Options& o, const Ranks& ranks, TrainingSession& s, RunOutputs& out)
    : build_(b), opt_(o), ranks_(ranks), s_(s), out_(out), divergence_(b.precision == DType::F16),
      step_(s.start.step), first_step_(s.start.step), last_(s.start.counters) {
  divergence_.start_at(step_);
  const long total_steps = long(opt_.epochs) * s_.steps_per_epoch;
  const LrPlan& lr = s_.lr.used;  // the flags', or scaled with the global batch (train/lr_scaling.h)
  schedule_ = {lr.peak, lr.min, std::lround(lr.warmup_epochs * s_.steps_per_epoch), total_steps};
  window_ = std::make_unique<SteadyStateWindow>(s_.ctx->stream, first_step_ + opt_.warmup_steps, opt_.profile_steps,
                                                ranks_.writes() ? opt_.trace : "");
  loss_history_ = DeviceBuffer(size_t(s_.steps_per_epoch) * sizeof(float), "loss history");
}

Ending TrainLoop::run() {
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  // The starting state is a periodic save point too (step 0 of a fresh run): without it, a run
  // that diverges within its first N steps would have no state to keep.
  if (out_.saves().due(step_)) save(opt_.save, true);
  for (int epoch = s_.start.epoch; epoch < opt_.epochs && !out_of_steps(); ++epoch)
    if (!train_epoch(epoch)) break;
  if (window_->is_open()) close_window();  // the run ended inside the window
  if (stop_requested()) return Ending::Signal;
  if (opt_.eval && evaluated_at_ != step_) evaluate();  // stopped by --steps inside an epoch
  return Ending::Finished;
}

// Returns false when the run should stop (signal).
bool TrainLoop::train_epoch(int epoch) {
  epoch_now_ = epoch;
  const Dataset& train = s_.data.split.train;
  const int steps = s_.steps_per_epoch;
  const EpochPlan plan = micro_batch_plan(train, epoch);
  const int first = epoch == s_.start.epoch ? s_.start.step_in_epoch : 0;
  s_.loader->begin_pass(train, plan, static_cast<int>(micro_batch_index(first, 0, opt_.accumulate)));
  // last_ is current: the previous epoch ended with read_counters_now().
  s_.counters->set_train(fresh_totals(last_.train.last_good_loss));
  if (!opt_.sample_png.empty() && epoch == s_.start.epoch && ranks_.writes())
    out_.write_sample_png(train, plan, static_cast<int>(micro_batch_index(first, 0, opt_.accumulate)));

  Event start, end;
  const auto wall0 = std::chrono::steady_clock::now();
  start.record(s_.ctx->stream);
  out_.report().begin_progress(step_);
  const long epoch_first_step = step_;
  int k = first;
  for (; k < steps && !out_of_steps() && !stop_requested(); ++k) {
    k_now_ = k;
    train_step(k);
    if (out_.saves().due(step_)) save(opt_.save, true);
  }
  end.record(s_.ctx->stream);
  if (s_.dp) s_.dp->sum_totals(&s_.counters->device()->train);  // the epoch's loss and accuracy over every rank
  read_counters_now();
  const double train_ms = end.ms_since(start);
  const double stall_ms = s_.timing->stall_ms(epoch_first_step, step_ - 1, true);
  s_.timing->drop_before(window_->done() ? step_ : std::min(step_, window_->first()));
  if (!opt_.loss_log.empty() && ranks_.writes())
    out_.write_loss_log(epoch_first_step, losses(epoch_first_step, step_ - epoch_first_step));
  out_.report().progress(epoch_now_, k_now_, s_.steps_per_epoch, step_, mean_loss(last_.train), true);
  final_train_loss_ = mean_loss(last_.train);
  final_train_acc_ = accuracy(last_.train);
  if (stop_requested()) return false;
  if (k < steps) return true;  // --steps ended the run inside this epoch
  if (opt_.eval) evaluate();
  EpochResult r = epoch_result(epoch);
  r.train_ms = train_ms;
  r.stall_ms = stall_ms;
  r.seconds = seconds_since(wall0);
  out_.report().epoch(r);
  return true;
}

// An epoch's line, all but its times.
EpochResult TrainLoop::epoch_result(int epoch) const {
  EpochResult r;
  r.epoch = epoch;
  r.step = step_;
  r.images = static_cast<long>(last_.train.count / opt_.batch) * opt_.batch;
  r.train_loss = final_train_loss_;
  r.train_acc = final_train_acc_;
  r.test_loss = final_test_loss_;
  r.test_acc = final_test_acc_;
  r.lr = schedule_.at(step_ - 1);
  r.loss_scale = last_.scaler.scale;
  r.skipped_steps = last_.scaler.skipped_steps;
  return r;
}

// The losses of steps [first_step, first_step + count), all of one epoch.
std::vector<float> TrainLoop::losses(long first_step, long count) const {
  std::vector<float> l(count);
  const int k0 = static_cast<int>(first_step % s_.steps_per_epoch);
  CUDA_CHECK(cudaMemcpy(l.data(), loss_history_.as<float>() + k0, count * sizeof(float), cudaMemcpyDeviceToHost));
  return l;
}

// This rank's batches of an epoch, in micro-batches of --batch (dist/grad_accumulation.h says which
// slice of each step's images each micro-batch takes).
EpochPlan TrainLoop::micro_batch_plan(const Dataset& train, int epoch) const {
  const EpochPlan plan = ranks_.my_part(train_plan(train, ranks_.global_batch(opt_.batch), opt_.seed, epoch, opt_.crop_pad));
  return ::micro_batch_plan(plan, s_.steps_per_epoch, opt_.accumulate);
}

void TrainLoop::train_step(int k) {
  const long s = step_;
  if (window_->opens_at(s)) open_window();
  {
    NvtxRange step_range("step " + std::to_string(s), phase_color::kGrey);
    for (int j = 0; j < opt_.accumulate; ++j) micro_batch(k, MicroBatch{j, opt_.accumulate});
    if (s_.dp) s_.dp->check_step();  // its gradients were averaged in backward (dist/data_parallel.h)
    ++step_;
    if (step_ == first_step_ + 1) first_step_done();
    if (s_.dp) s_.dp->progress(step_);
    {
      NvtxRange r("loss stats", phase_color::kCyan);
      loss_stats();
    }
  }
  if (window_->closes_at(s)) close_window();
}

// With --json, a line once this process's first step has run on the GPU (a synchronize, once): the
// end of its start-up, which bench/time_to_accuracy.py reports apart from the training.
void TrainLoop::first_step_done() {
  if (!opt_.json) return;
  CUDA_CHECK(cudaStreamSynchronize(s_.ctx->stream));
  out_.report().first_step(step_);
}

// One micro-batch of step k of the epoch (the whole step without --accumulate): its batch, then
// forward (+ loss), backward and, for the last, the optimizer step, enqueued or replayed as a graph.
void TrainLoop::micro_batch(int k, const MicroBatch& m) {
  const int index = static_cast<int>(micro_batch_index(k, m.index, m.count));
  s_.timing->begin_step(step_);
  {
    NvtxRange r("get batch", phase_color::kRed);
    s_.loader->get(index);
  }
  DeviceBatch batch;
  {
    NvtxRange r("copy batch", phase_color::kYellow);
    batch = s_.loader->copy(index);
    s_.step_params->upload(make_step_params(step_, k, schedule_));  // learning rate, step index, loss slot
  }
  s_.timing->data_ready();
  if (s_.dp) s_.dp->begin_micro_batch(m);
  const Accumulation acc{m, s_.sums.get(), s_.dp != nullptr};
  graph_for(m).run(step_, {opt_.batch, batch.images, batch.labels}, [&] {
    enqueue_train_step(*s_.net, batch, step_targets(), step_settings(), s_.ctx->stream, acc);
  });
}

// The last micro-batch (every step without --accumulate) runs the step's graph; the others only
// accumulate, in a graph of their own: the first, which records the loss, and the middle ones.
StepGraph& TrainLoop::graph_for(const MicroBatch& m) const {
  if (m.last()) return *s_.step_graph;
  return m.first() ? *s_.micro_graphs[0] : *s_.micro_graphs[1];
}

void TrainLoop::open_window() {
  window_->open();
  if (s_.dp) s_.dp->measure_exposure(true);
}

void TrainLoop::close_window() {
  window_->close(step_, *s_.timing);
  if (!s_.dp) return;
  s_.dp->measure_exposure(false);
  allreduce_ = s_.dp->comm_report();  // every rank at this step: a collective
}

StepTargets TrainLoop::step_targets() const {
  DeviceCounters* c = s_.counters->device();
  return {&c->train, &c->scaler, s_.step_params->device(), loss_history_.as<float>(),
          s_.average ? s_.average->device() : nullptr};
}

StepSettings TrainLoop::step_settings() const {
  return {static_cast<float>(opt_.momentum), static_cast<float>(opt_.weight_decay), opt_.nesterov,
          build_.precision == DType::F16, opt_.loss_scale_window, static_cast<float>(opt_.label_smoothing),
          static_cast<float>(opt_.ema)};
}

// Baseline: a synchronising copy every step (the seed's `loss.item()`). On-device accumulation: the
// counters stay on the GPU and are read asynchronously every --progress-every steps.
void TrainLoop::loss_stats() {
  const bool progress_due = step_ % opt_.progress_every == 0;
  if (!build_.device_loss) {
    take(s_.counters->read_blocking(step_));
  } else {
    if (!progress_due) return;
    const std::optional<CounterRead> landed = s_.counters->poll(step_);
    if (!landed) return;
    take(*landed);
  }
  if (progress_due)
    out_.report().progress(epoch_now_, k_now_, s_.steps_per_epoch, step_, mean_loss(last_.train), false);
}

// Every read of the counters goes through here: it stops a diverged run, and it is what proves a
// pending periodic save good.
void TrainLoop::take(const CounterRead& r) {
  last_ = r.counters;
  divergence_.check(r);
  out_.saves().on_read(r.steps, r.counters.scaler.skipped_steps, r.counters.scaler.diverged != 0);
}

void TrainLoop::read_counters_now() {
  const CounterRead r = s_.counters->read_now(step_);
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  peak_mem_mb_ = std::max(peak_mem_mb_, double(s_.free_before - std::min(s_.free_before, free_b)) / (1 << 20));
  take(r);
}

// On several ranks each evaluates its part of the test set (padding counts nowhere) with the BN
// running statistics averaged over the ranks, and the counts are summed. With --ema the weights
// evaluated are the average's, for the pass alone; with --tta-flip each image's score is the mean
// logits of it and its mirror (step.h).
void TrainLoop::evaluate() {
  NvtxRange range("evaluation", phase_color::kGrey);
  const Dataset& test = s_.data.split.test;
  const EpochPlan plan = ranks_.my_part(eval_plan(test, ranks_.global_batch(opt_.batch)));
  s_.loader->begin_pass(test, plan, 0);
  if (s_.dp) average_running_stats(*s_.dp, *s_.net);
  const AveragedWeightsIn averaged(s_.average.get(), s_.net->params(), s_.ctx->stream);
  LossTotals* totals = &s_.counters->device()->eval;
  CUDA_CHECK(cudaMemsetAsync(totals, 0, sizeof(LossTotals), s_.ctx->stream));
  for (int k = 0; k < plan.steps; ++k) {
    s_.loader->get(k);
    enqueue_eval_step(*s_.net, s_.loader->copy(k), totals, s_.flip.get(), s_.ctx->stream);
    if (s_.dp) s_.dp->progress(step_);
  }
  if (s_.dp) s_.dp->sum_totals(totals);
  for (StepGraph* g : {s_.step_graph.get(), s_.micro_graphs[0].get(), s_.micro_graphs[1].get()})
    if (g) g->after_evaluation();
  read_counters_now();
  final_test_loss_ = mean_loss(last_.eval);
  final_test_acc_ = accuracy(last_.eval);
  evaluated_at_ = step_;
}

// On several ranks every rank comes here at the same step: the BN running statistics are averaged
// first, and once that all-reduce has finished every rank has finished the step; rank 0 writes.
void TrainLoop::save(const std::string& path, bool periodic) {
  NvtxRange range("save checkpoint", phase_color::kGrey);
  if (s_.dp) average_running_stats(*s_.dp, *s_.net);
  const CounterRead now = s_.counters->read_now(step_);
  take(now);  // a diverged state is never saved; an older pending save may be proven
  CheckpointMeta m = s_.meta;
  m.step = step_;
  m.epoch = static_cast<int>(step_ / s_.steps_per_epoch);
  m.step_in_epoch = static_cast<int>(step_ % s_.steps_per_epoch);
  m.loss_scale = now.counters.scaler.scale;
  m.good_steps = now.counters.scaler.good_steps;
  m.skipped_steps = now.counters.scaler.skipped_steps;
  if (ranks_.writes()) out_.saves().save(capture_checkpoint(*s_.net, m, s_.average.get()), path, periodic);
  if (s_.dp) s_.dp->progress(step_);
}

bool TrainLoop::stop_requested() {
  if (!stopping_) stopping_ = s_.dp ? s_.dp->agree_to_stop(step_, g_stop_requested) : g_stop_requested.load();
  return stopping_;
}

RunSummary TrainLoop::summary() const {
  RunSummary s;
  s.gpu = s_.gpu_name;
  s.data = s_.data.split.train.name;
  s.steps = step_ - first_step_;
  s.timed_steps = window_->timed_steps();
  s.window_ms = window_->ms();
  s.window_start_unix_ms = window_->unix_start_ms();
  s.window_end_unix_ms = window_->unix_end_ms();
  s.window_stall_ms = window_->stall_ms();
  s.gpu_busy_pct = window_->gpu_busy_pct();
  s.peak_gpu_mem_mb = peak_mem_mb_;
  s.final_train_loss = final_train_loss_;
  s.final_train_acc = final_train_acc_;
  s.final_test_loss = final_test_loss_;
  s.final_test_acc = final_test_acc_;
  s.params = s_.params;
  s.autotune_s = s_.autotune_s;
  s.skipped_steps = last_.scaler.skipped_steps;
  s.allreduce = allreduce_.ranks.empty() && s_.dp ? s_.dp->comm_plan() : allreduce_;  // no window: the plan alone
  return s;
}
