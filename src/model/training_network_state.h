// What the training network's source files share (model/training_network.h; construction and
// planning in training_network.cpp, the forward and loss in training_forward.cpp, the weight
// gradients' lane and the backward in training_backward.cpp): a conv's fused call, each block's table
// of decisions and buffers (BlockRun), the lane. Private to the model.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "core/handles.h"
#include "core/memory.h"
#include "kernels/conv3x3.h"
#include "model/fused_conv.h"
#include "model/resnet50_layers.h"
#include "model/training_network.h"

// A fused pattern as one conv runs it: the plan (one per pattern and shape, shared by the convs of
// that shape) and a workspace of this conv's own. cuDNN zeroes counters in the workspace before
// every run; in a workspace no other conv touches, the step's graph zeroes them once at its start
// instead (zeroed_at_step_start), a node less in the chain for each.
struct FusedCall {
  const FusedConv* plan = nullptr;
  void* ws = nullptr;
  size_t ws_bytes = 0;
  explicit operator bool() const { return plan != nullptr; }
  void run(cudnnHandle_t h, const FusedArgs& a) const { plan->run(h, a, ws, ws_bytes); }
};

// One block: the fused pattern each of its convs runs (empty: the plain conv and our BN kernels),
// and what its forward stores for backward. y1 and y2, the inner BN outputs, are stored only where
// conv2 or conv3 or its weight gradient reads them plain. relu_bits: where the join's ReLU (after the add) passed; its
// backward reads these bits, not the output (1/16 of the bytes).
struct TrainingNetwork::BlockRun {
  FusedCall c1_stats;           // ConvStats
  struct Inner {
    FusedCall fwd, wgrad, dgrad;  // SbrConvStats (conv2 reading y1: ConvStats), SbrWgrad, DgradDreluDbn
    // Training's forward reads relu(bn(x)), stored by a BN pass before it, instead of applying the
    // previous BN as it reads x: conv2 by cuDNN's ConvStats (StoredConvStats, plan_blocks), conv3 by
    // our kernel (OwnPrologue, plan_own_convs). Its weight gradient reads that as stored.
    bool reads_stored = false;
    // The plain weight gradient recomputes relu(bn(x)): the forward applied bn fused and stored nothing.
    bool recomputes_input() const { return fwd && !reads_stored; }
  } c2, c3;
  FusedCall down_stats;         // ConvStats
  // Training's forward with statistics by our kernel instead (kernels/conv1x1_stats.h: OwnConvStats).
  bool c1_own = false, c3_own = false, down_own = false;
  // conv1's data gradient by our kernel that takes the previous block's join backward (dz and its
  // sums; kernels/conv1x1_dgrad_join.h: OwnJoinDgrad), instead of writing its part of the gradient;
  // the first block's takes the stem's BN + ReLU backward so (OwnStemJoin).
  bool c1_joins = false;
  // Training's forward: conv1, ours, applies the previous block's join as it reads the join's inputs
  // and stores it with its ReLU bits (kernels/conv1x1_stats.h, Conv1x1Join: OwnJoinPrologue), and
  // the previous block runs no join pass. Every block's but the first (the stem's BN is no join).
  bool c1_applies_join = false;
  // conv3's data gradient with bn2's ReLU and backward sums by our kernel (kernels/conv1x1_dgrad_bn.h:
  // OwnDgradDbn), where its forward was ours (c3_own: the ReLU mask is the prologue's test, fp16
  // x * scale + shift > 0, also where the forward read a stored y2).
  bool c3_dgrad_own = false;
  // That kernel also takes conv3's weight gradient from the same loads of dy, with relu(bn2(a2))
  // made from the a2 it reads anyway (Conv1x1DgradBn::dw_partials: OwnDgradWgrad), where the forward
  // applied bn2 in its prologue (the same fp16 y) and the kernel holds dw's k (layer1's 256). It does
  // where dw_parts, its CTAs' parts of dw, is allocated: a buffer a block, so that the chain never
  // waits for the lane's sum.
  DeviceBuffer dw_parts;
  bool c3_dgrad_dw() const { return dw_parts.get() != nullptr; }
  // The same for a stride-1 1x1 projection shortcut (layer1.0's, whose input is the stem's output):
  // its data gradient, written as it is, and its weight gradient from x as stored, by one kernel
  // (Conv1x1DgradDw), where down_dw_parts is allocated.
  DeviceBuffer down_dw_parts;
  bool down_dgrad_dw() const { return down_dw_parts.get() != nullptr; }
  // That conv3 kernel also makes dy, the join's gradient of a3, as it reads the join's dz and a3
  // (Conv1x1DgradBn::dy_x: OwnJoinApply), where the next block's conv1 left dz (its c1_joins): the
  // join's backward runs its finalize alone, and a3's gradient is stored nowhere. In a projection
  // block the shortcut's data gradient, which takes its weight gradient too (down_dgrad_dw), makes
  // its dy from the join's dz and ad so as well (or neither does: plan_own_convs), and writes its
  // data gradient to g[2], where this block's conv1 join reads it (Conv1x1DgradJoin::g), as g[0]
  // still holds dz for conv3.
  bool c3_applies_join = false;
  // Layer1's 3x3 conv2 by our kernel (kernels/conv3x3.h): training's forward with its statistics,
  // where conv2 reads y1 stored (Inner::reads_stored: OwnConv3x3), and the data gradient with bn1's
  // ReLU and backward sums (OwnDgrad3x3), by conv2's filter turned into c2_turned in each training
  // forward (the weights change at each step).
  bool c2_own = false, c2_dgrad_own = false;
  DeviceBuffer c2_turned;
  // A stride-2 projection shortcut's data gradient at its output pixels alone, as a stride-1 1x1
  // conv's over them (CompactShortcutDgrad), into g[2]; this block's conv1 (c1_joins) reads it as
  // the shortcut's part at the even pixels. Null: cuDNN's strided data gradient, zeros included.
  std::unique_ptr<ConvLayer> down_compact;
  DeviceBuffer a1, y1, a2, y2, a3, ad, out, relu_bits;
  bool stores_y1() const { return !c2.fwd || !c2.wgrad; }
  bool stores_y2() const { return !c3.fwd || !c3.wgrad; }
  std::vector<FusedCall*> fused_calls() { return {&c1_stats, &c2.fwd, &c2.wgrad, &c2.dgrad, &c3.fwd, &c3.wgrad, &c3.dgrad, &down_stats}; }
};

// A conv's weight gradient and its data gradient read the same output gradient and write different
// buffers: on two streams they run side by side, and in the step's CUDA graph they become two
// branches. The small convs of the later stages fill the GPU only in part, and one branch's launch
// gaps are the other's running time. The lane runs at the normal priority, below the compute
// stream's (core/handles.h, GpuContext): where both wait for SMs, the chain goes first.
struct TrainingNetwork::Lane {
  Stream stream{false};
  Event forked{false}, done{false};
  Event turned{false};  // layer1's conv2 filters turned for this step's data gradients (turn_filters)
  DeviceBuffer workspace;  // the main stream's convs keep workspace_: both run at once
};

// The shape of block b's conv2 as kernels/conv3x3.h takes it.
inline Conv3x3Shape conv2_shape(const Block& b) {
  const ConvGeometry& g = b.c2.geometry();
  return {b.mid1.n, b.mid1.h, b.mid1.w, g.c, g.k};
}
