// The inference network (bin/predict): a forward with the BN running statistics, no gradient,
// momentum or backward buffers, over the layers every network shares (model/network.h).
//
// A BN's coefficients come from its running statistics, known before the conv runs: each conv (the
// stem's too) applies its BN, the ReLU and at conv3 the residual as it writes its output, decided at
// construction: in cuDNN's epilogue pattern (model/fused_conv.h), or for a 1x1 conv measured faster
// so, in a cuBLASLt GEMM with the BN folded into its filter (model/gemm_conv.h), or, where neither
// was taken (refused, switched off, a build that does not fuse), by our apply pass in place over the
// plain conv's output. Every BN's coefficients are computed in one launch at the start of each
// forward, so that weights restored from a checkpoint take effect.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "model/network.h"

class FusedConv;
class GemmConv;

class InferenceNetwork : public Network {
 public:
  InferenceNetwork(const NetConfig& cfg, GpuContext& ctx, AutotuneCache& cache);
  ~InferenceNetwork() override;

  // images: batch x 3 x side x side in the configured type and layout.
  void forward(const void* images);

  struct ConvRun;  // one conv: its decision, the BN it applies, what it reads and writes

 private:
  void plan_convs(AutotuneCache& cache);
  void allocate_coefficients();
  // r's output, relu?(bn(conv(x)) + z?), as its decision has it.
  void conv_bn(const ConvRun& r, const void* images);

  std::vector<ConvRun> runs_;  // in the order forward runs them: the stem's, then each block's c1, c2, down, c3
  std::map<std::string, std::shared_ptr<FusedConv>> fused_plans_;
  std::map<std::string, std::shared_ptr<GemmConv>> gemm_plans_;
  DeviceBuffer coefficients_half_;        // fp16 scale/shift of the BNs whose conv's engine reads them so
  DeviceBuffer eval_targets_;             // every BN (one per conv), for one launch of their coefficients
  int widest_bn_ = 0;
  DeviceBuffer gemm_filters_, fold_targets_;  // the GEMM convs' folded filters, what folds them
  size_t largest_fold_ = 0;
};
