// The BN finalize that two of our 1x1 convs, the forward with statistics (kernels/conv1x1_stats.h)
// and conv3's data gradient (kernels/conv1x1_dgrad_bn.h), can do themselves, in place of the
// finalize kernel that otherwise reads their rows of partial sums after them (bn_finalize_partials,
// bn_backward_from_sums). Not the join's (kernels/conv1x1_dgrad_join.h): there it measured slower.
//
// Each CTA of a column of tiles writes its row of partial sums, then counts itself in the column's
// counter; the last to arrive, every row then written, adds the rows up in a fixed order (the same
// result whichever CTA is last) and finalizes the column's channels. Why: the finalize kernels are
// a few µs of latency each on the step's critical path, and the one after conv3's data gradient
// took 8-10 µs there (H200, 2026-11-29), waiting for SMs behind the weight gradients' GEMMs on the
// other stream; the last CTA already holds its SM. The step measured 1.1-2.1% faster against a
// baseline that also re-fused sbr-wgrad (bench/results/levers-session18-nvidia-h200-2026-11-29.md);
// measured alone it is 0.5% slower, and bin/train runs the finalize kernel after them by default
// (--no-fuse sbr-wgrad brings this back; bench/results/levers-session20-nvidia-h200-2026-11-29.md).
#pragma once

#include "kernels/batchnorm_state.h"

struct Conv1x1Finalize {
  // The BN whose sums the conv takes. Forward (conv1x1_stats): its batch and running statistics,
  // scale and shift, and their fp16 copies to scale_h/shift_h where not null: what
  // bn_finalize_partials writes. Backward (conv1x1_dgrad_bn): its weight gradients to dgamma/dbeta
  // and the apply's coefficients to bn.bwd_coef: what bn_backward_from_sums finalizes, so that
  // bn_backward_apply is left.
  BnChannelState bn{};
  void* scale_h = nullptr;
  void* shift_h = nullptr;
  float* dgamma = nullptr;
  float* dbeta = nullptr;
  // conv1x1_finalize_counters(n) counters, one a column of tiles (n the GEMM's columns: the
  // forward's output channels k, the data gradient's input channels c), zero before the launch; the
  // kernel leaves them zero. No other kernel may use them while it runs.
  unsigned* arrivals = nullptr;
};

int conv1x1_finalize_counters(int n);
