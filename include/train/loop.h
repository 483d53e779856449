// The loop of a training run: epochs of steps, each
//   get batch -> copy batch -> forward (+ loss) -> backward -> optimizer step -> loss stats
// (with --accumulate N, the first five N times, one micro-batch each, the optimizer step after the last)
// inside its NVTX range "step N" (with CUDA graphs, forward to optimizer step are one launch in a
// range "step graph"); around them the learning-rate schedule, the steady-state window, the counters
// (read every step in the baseline, every --progress-every steps with on-device loss accumulation),
// evaluation after each epoch, the state saved at any step, and the stop on a signal. On several
// GPUs it calls data parallelism (dist/data_parallel.h) at a few points.
#pragma once

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/memory.h"
#include "dist/comm_stats.h"
#include "dist/grad_accumulation.h"
#include "train/build.h"
#include "train/counters.h"
#include "train/ending.h"
#include "train/options.h"
#include "train/outputs.h"
#include "train/ranks.h"
#include "train/reports.h"
#include "train/schedule.h"
#include "train/setup.h"
#include "train/step.h"
#include "train/window.h"

class TrainLoop {
 public:
  TrainLoop(const BuildSettings& b, const Options& o, const Ranks& ranks, TrainingSession& s, RunOutputs& out);
  // From the session's start point to the last epoch (or --steps, or a signal): Finished or Signal.
  // Throws Diverged, OutputFailed (the loss log) and ImageDecodeError (an image of a batch).
  Ending run();
  // Saves the state after the current step to `path`: every rank takes part, rank 0 writes.
  // `periodic`: a --save-every save, kept pending until a later read proves it good
  // (checkpointing.h). Throws Diverged when the counters read first show a divergence.
  void save(const std::string& path, bool periodic);
  long step() const { return step_; }
  long first_step() const { return first_step_; }
  RunSummary summary() const;

 private:
  bool train_epoch(int epoch);
  EpochResult epoch_result(int epoch) const;
  std::vector<float> losses(long first_step, long count) const;
  EpochPlan micro_batch_plan(const Dataset& train, int epoch) const;
  void train_step(int k);
  void first_step_done();
  void micro_batch(int k, const MicroBatch& m);
  StepGraph& graph_for(const MicroBatch& m) const;
  void open_window();
  void close_window();
  StepTargets step_targets() const;
  StepSettings step_settings() const;
  void loss_stats();
  void take(const CounterRead& r);
  void read_counters_now();
  void evaluate();
  bool stop_requested();
  bool out_of_steps() const { return opt_.steps > 0 && step_ >= opt_.steps; }

  const BuildSettings& build_;
  const Options& opt_;
  const Ranks& ranks_;
  TrainingSession& s_;
  RunOutputs& out_;
  DivergenceWatch divergence_;
  LrSchedule schedule_;
  std::unique_ptr<SteadyStateWindow> window_;
  DeviceBuffer loss_history_;  // one loss per step of the epoch (--loss-log)
  // where the loop is
  long step_;               // steps done in all
  const long first_step_;   // step_ when this process started
  int epoch_now_ = 0, k_now_ = 0;
  bool stopping_ = false;   // a signal stops the run (on every rank at the same step)
  // what it found
  DeviceCounters last_;     // the latest counters the host has seen
  double peak_mem_mb_ = 0;
  double final_test_loss_ = NAN, final_test_acc_ = NAN, final_train_loss_ = NAN, final_train_acc_ = NAN;
  long evaluated_at_ = -1;  // step_ at the last evaluation
  CommReport allreduce_;  // the window's all-reduce, several ranks only
};
