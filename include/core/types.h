// The small vocabulary shared by layers, kernels, loaders and the settings switchboard.
#pragma once

#include <cstddef>

// Marks small functions that both host code and kernels call.
#ifdef __CUDACC__
#define HOST_DEVICE __host__ __device__
#else
#define HOST_DEVICE
#endif

enum class DType { F32, F16 };         // element type of activations and conv/linear weights
enum class Layout { NCHW, NHWC };      // memory order of activations (and of conv filters)
enum class LoaderKind { Synchronous, PinnedRing };
enum class AlgoPolicy { Heuristic, Autotune };  // how conv algorithms are chosen
enum class ConvApi { Legacy, Graph };  // cuDNN's cudnnConvolution* calls, or its graph (backend) API

inline const char* dtype_name(DType t) { return t == DType::F32 ? "fp32" : "fp16"; }
inline const char* layout_name(Layout l) { return l == Layout::NCHW ? "NCHW" : "NHWC"; }
inline const char* loader_name(LoaderKind k) {
  return k == LoaderKind::Synchronous ? "synchronous" : "pinned-ring";
}
inline const char* algo_policy_name(AlgoPolicy p) {
  return p == AlgoPolicy::Heuristic ? "heuristic" : "autotune";
}
inline const char* conv_api_name(ConvApi a) { return a == ConvApi::Legacy ? "legacy" : "graph"; }
inline size_t dtype_size(DType t) { return t == DType::F32 ? 4 : 2; }

// The N, C, H, W of an activation tensor.
struct Shape4 {
  int n = 0, c = 0, h = 0, w = 0;
  HOST_DEVICE size_t count() const { return size_t(n) * c * h * w; }
  HOST_DEVICE size_t per_channel() const { return size_t(n) * h * w; }
  bool operator==(const Shape4& o) const { return n == o.n && c == o.c && h == o.h && w == o.w; }
};
