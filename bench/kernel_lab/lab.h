// The kernel lab's workbench (bin/kernel_lab; docs/kernel-lab.md), in the spirit of llm.c's
// dev/cuda: every version of an operation side by side, each checked against the CPU reference in
// double and timed with the L2 cache flushed before every run.
//
// An operation (say "bn-backward": dx from dy and x through a BN and its ReLU) is measured at one
// shape by a list of versions, each a name and a prepare() that sets up what it needs (cuDNN plans,
// state its run reads), poisons its outputs and returns a Prepared: the run, launched on the lab's
// stream, and the check of what it wrote. The lab runs it once and checks it, then times it.
// The operations live in lab/*.cu, one family per file, each listing its versions where it calls
// Lab::measure: to try a variant, write it (a kernel in that file, another cuDNN pattern, another
// order of launches) as one more entry of that list.
//
// Checks cost little however large the batch: the data at the timed batch is the check batch's
// images repeated, so the CPU reference computes only those (a whole output is compared with the
// reference repeated; per-channel sums over the batch with the reference's times the repeats).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/graph_memsets.h"
#include "core/handles.h"
#include "kernels/batchnorm.h"
#include "measure/kernel_lab.h"
#include "model/conv.h"
#include "model/fused_conv.h"
#include "support/bn_data.h"

namespace lab {

using gpu_test::DeviceTensor;
using ref::Vec;

struct Prepared {
  std::string refused;                           // the version cannot run here (cuDNN refused it, ...): why
  std::function<void()> run;                     // one run, launched on the lab's stream
  std::function<std::vector<LabCheck>()> check;  // after a run: its outputs against the reference
  std::string note;                              // what cuDNN chose, shown beside the version's name
  // Device memory the run leaves zero (the sums bn_finalize_sums reads): timed as a graph
  // (--as-graph), the memsets cuDNN issues into it are dropped, as the training step drops them.
  std::vector<ZeroedRange> kept_zero;
};

struct LabVersion {
  std::string name;
  std::function<Prepared()> prepare;
};

class Lab {
 public:
  explicit Lab(const LabOptions& o);
  const LabOptions& opt;

  cudaStream_t stream() const { return gpu_.stream; }
  cudnnHandle_t cudnn() const { return gpu_.cudnn; }
  // The batch the versions run at, and how often it repeats the checked images.
  int batch() const { return opt.batch; }
  int repeats() const { return opt.batch / opt.check_batch; }

  // The graph-API conv of g in fp16 NHWC, its plans chosen once (heuristics, or measured with
  // --autotune), shared by every version that runs it.
  ConvLayer& conv(const ConvGeometry& g);
  // The fused pattern p for g, built once; a refused one has ok() false and why().
  const FusedConv& fused(FusedPattern p, const ConvGeometry& g);
  // The shared cuDNN workspace, grown to `bytes` if needed: call it in prepare(), not in run().
  void reserve_workspace(size_t bytes);
  void* workspace() const { return ws_.get(); }
  size_t workspace_bytes() const { return ws_.bytes(); }
  const float* zeros() const { return zeros_.as<float>(); }  // 2048 zeros

  // Prints the operation's heading and the table's: what it computes and what its GB/s counts.
  void section(const std::string& op, const std::string& what, const std::string& bytes_rule);
  // Each version of `op` at one shape: prepared, run once and checked, timed; one row each, printed
  // as it is done. `bytes`: what the operation must move (0: compute-bound, no GB/s).
  void measure(const std::string& op, const std::string& shape, const std::string& format, size_t bytes,
               const std::vector<LabVersion>& versions);

  const std::vector<LabRow>& rows() const { return rows_; }
  double plan_seconds() const { return plan_s_; }
  std::string header() const;  // the GPU, cuDNN, the date and how the lab measures
  std::string json_start(const std::string& command) const;  // the same as the first JSON line

 private:
  GpuContext gpu_;
  cudaDeviceProp prop_{};
  DeviceBuffer flush_, ws_, zeros_;
  std::map<std::string, std::unique_ptr<ConvLayer>> convs_;
  std::map<std::string, std::unique_ptr<FusedConv>> fused_;
  std::vector<LabRow> rows_;
  double plan_s_ = 0;
};

// ---- data at the timed batch ---------------------------------------------------------------------
// `small` (NCHW values at the check batch, dims `d`) in type t and layout l, repeated `repeats`
// times along the batch: both layouts keep an image's values together, so repeating the images is
// repeating the buffer.
DeviceTensor repeated(const Vec& small, const ref::Dims& d, int repeats, DType t, Layout l);

// The arguments of one bn_backward; those of a second BN and of the shortcut's gradient left unset.
BnBackwardArgs backward_args(const void* dy, ReluMask mask, const void* y, const void* x, const BnChannelState* bn,
                             float* dgamma, float* dbeta, void* dx);

// ---- checks --------------------------------------------------------------------------------------
// An activation `got` (repeats of the check batch, in layout l) against `want` (NCHW at the check
// batch, dims d): the relative error over the whole tensor, NaN where an element is not finite.
LabCheck check_activation(const std::string& output, const DeviceTensor& got, const Vec& want, const ref::Dims& d,
                          Layout l, double bound);
// A per-channel (or filter) vector against `want` times `scale` (sums over the batch: the repeats).
LabCheck check_vector(const std::string& output, const DeviceTensor& got, const Vec& want, double bound,
                      double scale = 1.0);

// The operation families, in the order bin/kernel_lab measures them.
void measure_bn_operations(Lab& lab);    // lab/bn.cu
void measure_join_operations(Lab& lab);  // lab/join.cu
void measure_conv_operations(Lab& lab);  // lab/conv.cu

}  // namespace lab
