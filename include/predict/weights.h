// A training checkpoint as bin/predict uses it: checked against the network it goes into, its
// filters rearranged for this build, and exported as a PyTorch state_dict in safetensors form.
//
// Any build's checkpoint loads into any build: the master weights are fp32 in every checkpoint
// (fp16 builds derive their fp16 copy from them), and the filters, stored KCRS by NCHW builds and
// KRSC by NHWC builds, are rearranged on the host. All of it runs without a GPU.
#pragma once

#include <string>
#include <vector>

#include "core/types.h"
#include "export/safetensors.h"
#include "model/network.h"
#include "train/checkpoint.h"

// InputError naming `file` unless the checkpoint holds the network `layout` describes (its model,
// parameter names and shapes, and BN statistics).
void check_checkpoint_model(const CheckpointMeta& m, const TensorLayout& layout, const std::string& file);
// InputError naming `file` and `dir` unless the data set serves the classes the checkpoint was trained on
// (`trained`, empty for a checkpoint that does not name them), in its order: which names only one side
// has, or the first index whose name differs.
void check_checkpoint_classes(const std::vector<std::string>& trained, const std::vector<std::string>& served,
                              const std::string& dir, const std::string& file);
// The layout the checkpoint's filters are stored in; InputError naming `file` for an unknown one.
Layout checkpoint_layout(const CheckpointMeta& m, const std::string& file);

// The master weights with every conv filter rearranged from layout `from` to `to`.
std::vector<float> convert_filters(const std::vector<float>& master, const TensorLayout& layout, Layout from, Layout to);

// What a PyTorch ResNet-50 state_dict holds, under the same (torchvision-style) names, in module
// order: each parameter (filters KCRS), and after each BN's bias its running_mean, running_var and
// num_batches_tracked (the checkpoint's step count, as int64). fp32.
std::vector<SafeTensor> export_tensors(const Checkpoint& c, const TensorLayout& layout);
