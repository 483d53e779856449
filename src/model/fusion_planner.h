// Deciding, conv by conv, which fused pattern runs: what both networks' tables of decisions are
// made with (training_network.cpp, inference_network.cpp). Private to the model.
//
// One plan per pattern and conv shape, shared by the convs of that shape, is built once (through
// the plan picker, or cuBLASLt's heuristics for a GEMM) and kept where cuDNN accepts it and, when
// autotuning, where it measures no slower than the plain conv with the passes of our BN kernels it
// saves. Autotuning, each plan's choice goes into the autotune cache with the alternative's time
// it was weighed against, and a plan found there is rebuilt alone and weighed against that same
// time: the choice stays as it was made (our BN passes, timed again, would turn near ties from start
// to start).
#pragma once

#include <map>
#include <memory>
#include <string>

#include "core/handles.h"
#include "model/autotune_cache.h"
#include "model/fused_conv.h"
#include "model/fused_patterns.h"
#include "model/gemm_conv.h"
#include "model/network.h"
#include "model/resnet50_layers.h"

// The passes of our BN kernels a pattern saves (or, for the data gradient, adds).
enum class BnPass { Apply, ApplyAdd, Stats, Backward, DxApply };

// The sum of measured times; -1 when any is not measured.
float total_ms(std::initializer_list<float> parts);

class FusionPlanner {
 public:
  // `bn_scratch`: the network's BN partial sums (training; the statistics passes need them).
  FusionPlanner(const NetConfig& cfg, GpuContext& ctx, AutotuneCache& cache, FusionReport& report,
                size_t largest_activation, float* bn_scratch);
  ~FusionPlanner();

  // The pattern for conv u where it runs fused, else null (a refusal in the report). unfused_ms is
  // the time of the alternative (the plain conv and our BN passes), -1 when not measured.
  const FusedConv* fuse(const ConvUnit& u, FusedPattern p, float unfused_ms);
  // The same for a first choice that another pattern follows where it is refused: refused, it
  // leaves nothing in the report (the conv's outcome is the other pattern's).
  const FusedConv* fuse_first_choice(const ConvUnit& u, FusedPattern p, float unfused_ms);
  // Inference: conv u as one cuBLASLt GEMM where measured faster than `alternative_ms` (what cuDNN
  // runs for it), else null.
  const GemmConv* gemm(const ConvUnit& u, FusedPattern p, float alternative_ms);
  // The time of one pass of our BN kernels at a shape, on scratch memory; -1 when not measuring.
  float pass_ms(BnPass p, Shape4 s);
  // The plans taken, kept alive by the network that runs them.
  std::map<std::string, std::shared_ptr<FusedConv>> take_fused() { return std::move(fused_); }
  std::map<std::string, std::shared_ptr<GemmConv>> take_gemms() { return std::move(gemms_); }

 private:
  // The pattern where it runs fused (counted as fused in the report), else null and why not.
  const FusedConv* plan_fused(const ConvUnit& u, FusedPattern p, float unfused_ms, std::string& why);
  template <class Plan, class Make>
  const Plan& plan_once(std::map<std::string, std::shared_ptr<Plan>>& made, const std::string& key,
                        const FusedChoice* cached, float& alternative_ms, Make make);
  class PassTimer;

  NetConfig cfg_;
  GpuContext& ctx_;
  AutotuneCache& cache_;
  FusionReport& report_;
  bool measure_;
  FusedOptions options_;
  std::unique_ptr<PassTimer> timer_;
  std::map<std::string, std::shared_ptr<FusedConv>> fused_;
  std::map<std::string, std::shared_ptr<GemmConv>> gemms_;
};
