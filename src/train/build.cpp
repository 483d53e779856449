// The build's settings as names and as the start-up line.
#include "train/build.h"

std::vector<std::string> BuildSettings::optimizations() const {
  std::vector<std::string> on;
  if (device_loss) on.push_back("devloss");
  if (loader == LoaderKind::PinnedRing) on.push_back("pinned");
  if (algo == AlgoPolicy::Autotune) on.push_back("autotune");
  if (precision == DType::F16) on.push_back("fp16");
  if (layout == Layout::NHWC) on.push_back("nhwc");
  if (conv_api == ConvApi::Graph) on.push_back("graph");
  if (fused_bn) on.push_back("fusedbn");
  if (cuda_graph) on.push_back("cudagraph");
  if (wgrad_stream) on.push_back("wgradstream");
  return on;
}

std::string BuildSettings::describe() const {
  std::string opts;
  for (const std::string& o : optimizations()) opts += (opts.empty() ? "" : " ") + o;
  return std::string(variant) + ": optimizations [" + (opts.empty() ? "none: the baseline" : opts) + "] -> " +
         dtype_name(precision) + ", " + layout_name(layout) + ", " + loader_name(loader) + " loader, " +
         algo_policy_name(algo) + " conv algorithms (cuDNN " + conv_api_name(conv_api) + " API), loss read " +
         (device_loss ? "asynchronously from the GPU" : "every step (synchronising)") +
         (fused_bn ? ", batch norm fused into the convolutions" : "") +
         (cuda_graph ? ", each step replayed as one CUDA graph" : "") +
         (wgrad_stream ? ", weight gradients on a second stream beside the data gradients" : "") +
         (ddp_overlap ? "" : ", gradients of several GPUs all-reduced after the whole backward (naive)");
}
