// cudnn-frontend (NVIDIA's header-only C++ graph API over cuDNN), for the files of src/model/cudnn/
// alone: every cuDNN graph of the project is built there. The library is slow to compile, so no
// public header includes it; the Makefile fetches it (PyPI's nvidia-cudnn-frontend, pinned) into
// build/deps/ and gives its include path to these files only.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include <cudnn_frontend.h>

#include "core/types.h"
#include "model/conv.h"

namespace fe = cudnn_frontend;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

// Every pointer handed to a plan must be aligned as its tensors promise (cuDNN's default, 16 bytes).
constexpr int64_t kCudnnAlignment = 16;

fe::DataType_t fe_type(DType t);

// A 4-d tensor given as N, C, H, W, whose strides follow the layout (filters K, C, R, S: KCRS or KRSC,
// as the activations). Per-channel vectors are [1, C, 1, 1].
TensorPtr graph_tensor(fe::graph::Graph& g, int64_t uid, DType t, const std::array<int64_t, 4>& dims, Layout l);
// A node's output that is stored: given its uid, type, shape and strides.
void set_stored(const TensorPtr& t, int64_t uid, DType type, const std::array<int64_t, 4>& dims, Layout l);
// Marks a node's output as living only inside the fused kernel, of the given shape.
void set_virtual(const TensorPtr& t, const std::array<int64_t, 4>& dims, Layout l);

// A conv operation's attributes for geometry g: forward, data gradient, weight gradient.
template <class Attributes>
Attributes conv_attributes(const ConvGeometry& g) {
  return Attributes().set_padding({g.pad, g.pad}).set_stride({g.stride, g.stride}).set_dilation({1, 1});
}
inline auto fprop_attributes(const ConvGeometry& g) { return conv_attributes<fe::graph::Conv_fprop_attributes>(g); }
inline auto dgrad_attributes(const ConvGeometry& g) { return conv_attributes<fe::graph::Conv_dgrad_attributes>(g); }
inline auto wgrad_attributes(const ConvGeometry& g) { return conv_attributes<fe::graph::Conv_wgrad_attributes>(g); }

// Throws Fatal naming `what` where a frontend call failed.
void fe_check(fe::error_t e, const std::string& what);
