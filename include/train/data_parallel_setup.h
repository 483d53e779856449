// What the trainer hands to data-parallel training (dist/data_parallel.h): the fingerprint every
// rank must share (its build, the flags that shape the computation, the data, the checkpoint it
// resumes), the settings from the flags, the batch rule of a resume on another number of GPUs, and
// the network's state that every rank must hold alike.
#pragma once

#include <string>

#include "data/dataset.h"
#include "dist/data_parallel.h"
#include "dist/fingerprint.h"
#include "model/training_network.h"
#include "train/build.h"
#include "train/checkpoint.h"
#include "train/options.h"

// Every flag but those naming this rank's own files and threads (--data-dir, --workers,
// --autotune-cache, --trace, --json, --loss-log, --sample-png, --save, --resume, --gpus): the data
// and the checkpoint are compared by content instead. A new flag that changes what is computed
// belongs here.
Fingerprint run_fingerprint(const BuildSettings& b, const Options& o, int world, const DataSplit& data,
                            const Normalization& norm, const Checkpoint* resume);

DataParallelConfig data_parallel_config(const BuildSettings& b, const Options& o);

// A checkpoint records the global batch (images per step over all GPUs and micro-batches): a run
// resumes it on any number of GPUs whose --batch (per GPU) times that number times --accumulate
// equals it, and then continues with the same steps, learning rates and data order. InputError
// naming the --batch to use otherwise.
void check_global_batch(const CheckpointMeta& saved, int batch, int world, int accumulate, const std::string& file);

// At the start, every rank takes rank 0's weights, momentum and BN running statistics, bit for bit.
void share_start_state(DataParallel& dp, TrainingNetwork& net, cudaStream_t stream);
// Before an evaluation or a save: each rank's batches gave it its own BN running statistics; all
// ranks then hold their average.
void average_running_stats(DataParallel& dp, TrainingNetwork& net);
