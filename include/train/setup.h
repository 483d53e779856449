// The set-up of a training run: options -> data, GPU, network, data parallelism, resume. Each part
// is checked before the next costs anything: the output paths before the data is read, the data and
// the checkpoint before the GPU is touched; but before images are decoded at start (an image folder
// into memory, or its normalisation sample), which takes minutes for a large folder, the GPU is
// looked for. It prints the start lines (data, gpu, convs, data parallel, step, resumed, model, lr).
#pragma once

#include <memory>
#include <string>

#include "core/handles.h"
#include "data/data_choice.h"
#include "dist/data_parallel.h"
#include "dist/grad_accumulation.h"
#include "measure/step_timing.h"
#include "model/autotune_cache.h"
#include "model/training_network.h"
#include "pipeline/loader.h"
#include "train/build.h"
#include "train/checkpoint.h"
#include "train/counters.h"
#include "train/lr_scaling.h"
#include "train/options.h"
#include "train/ranks.h"
#include "train/step.h"
#include "train/step_graph.h"
#include "train/weight_average.h"

// Where training starts: the steps done, the epoch and the step in it, and the counters then.
struct StartPoint {
  long step = 0;
  int epoch = 0, step_in_epoch = 0;
  DeviceCounters counters{};
};

// What the set-up made, for the loop and the outputs, in the order it is made. A part not made yet
// is empty: a set-up that fails after the ranks have met still tells the others through `dp`.
struct TrainingSession {
  ChosenData data;
  Normalization norm{};
  int steps_per_epoch = 0;
  LrChoice lr;          // the schedule's rates and warm-up: the flags', or scaled with the global batch
  CheckpointMeta meta;  // what this run's checkpoints record (the position is filled in at a save)
  // the GPU and the network on it
  std::unique_ptr<GpuContext> ctx;
  std::string gpu_name;
  size_t free_before = 0;  // free GPU memory before the network: peak use is measured from it
  std::unique_ptr<AutotuneCache> cache;
  std::unique_ptr<TrainingNetwork> net;
  unsigned long params = 0;  // the network's parameters
  double autotune_s = 0;     // seconds its conv algorithms were searched for
  std::unique_ptr<DataParallel> dp;  // several ranks only
  std::unique_ptr<WeightAverage> average;  // --ema only
  std::unique_ptr<FlipEvaluation> flip;    // --tta-flip only
  std::unique_ptr<GradAccumulation> sums;  // --accumulate N > 1 only
  // what each step uses
  std::unique_ptr<BatchLoader> loader;
  std::unique_ptr<StepParamsOnDevice> step_params;
  std::unique_ptr<StepGraph> step_graph;  // the step, or with --accumulate its last micro-batch
  // --accumulate: the graphs of the micro-batches before the last, which only accumulate: [0] the
  // first (it records the step's loss), [1] the others (N > 2)
  std::unique_ptr<StepGraph> micro_graphs[2];
  std::unique_ptr<StepTiming> timing;
  std::unique_ptr<CounterReader> counters;  // set to start.counters
  StartPoint start;
};

// Fills `s` (empty) in the order above. Throws InputError for bad data or a checkpoint that does not
// fit, UsageError for flags found clashing only now (the autotune cache), Fatal for the rest.
void set_up_training(TrainingSession& s, const BuildSettings& build, const Options& opt, const Ranks& ranks,
                     int workers);
