// The training network: forward (training, or evaluation with the running statistics), the loss
// and backward, over the layers every network shares (model/network.h).
//
// Each block runs from a table of decisions made once at construction (training_network.cpp):
// for each of its convs, the fused pattern cuDNN runs or, where none was taken (refused, measured
// slower, switched off, or a build that does not fuse), the plain conv and our BN kernels. Fused as
// NVIDIA's MLPerf ResNet-50 does it (docs/fused-bn.md): conv1 and the shortcut emit their output's
// BN statistics, conv2 and conv3 apply the previous BN + ReLU as they read their input and take
// their gradients through it (model/fused_conv.h's patterns); the join (both branches' BN, the add
// and the ReLU) and its backward are our kernels either way.
// The network owns what backward needs (each block's stored activations, only those its table
// requires), four gradient buffers it rotates through, and, with NetConfig::wgrad_beside, the
// weight gradients' stream; where that stream runs behind the data gradients (LaggingWgrad), three
// sets of inner-gradient buffers sized by role, so that the data gradients need not wait for it
// after each conv.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "core/graph_memsets.h"
#include "model/network.h"

struct LossTotals;
struct Block;
struct Bn;
class FusedConv;
struct FusedCall;

class TrainingNetwork : public Network {
 public:
  // Builds the layers and allocates everything; chooses conv algorithms and fused patterns through
  // `cache` (which may be an empty in-memory cache: repeated shapes are then chosen once).
  TrainingNetwork(const NetConfig& cfg, GpuContext& ctx, AutotuneCache& cache);
  ~TrainingNetwork() override;

  // The SMs the lane's cuDNN weight gradients (3x3 convs, stride-2 shortcuts) are planned for on one
  // GPU (LaneCudnnSms): three quarters of the current device's, 99 of an H200's 132. On H200s
  // (2026-11-30, bench/ab.py), as landed: 4.710 -> 4.696 ms a step at batch 128 (-0.29%, in every
  // round of 4), 8.364 -> 8.356 at 256 (-0.10%, 3 of 4); as a probe, 100 SMs gave -0.19% to -0.36%
  // at batch 128 in every round of three calls and -0.11% to +0.04% at 256, 88 -0.25% and -0.19%,
  // 66 +0.48% and +0.11% (bench/results/levers-session35-nvidia-h200-2026-11-30.md).
  static int lane_cudnn_sm_target();

  // images: batch x 3 x side x side in the configured type and layout. train=false uses the
  // running statistics (evaluation).
  void forward(const void* images, bool train);
  // Softmax cross-entropy on the logits; with loss_scale != nullptr also the gradients of the logits
  // and the bias (training). Accumulates into totals. loss_scale and step are device memory
  // (softmax_xent in kernels/loss.h); step nullptr: no step index (evaluation). label_smoothing: of
  // the target (0: one-hot).
  void loss(const int32_t* labels, LossTotals* totals, const float* loss_scale, const long long* step,
            float label_smoothing = 0.f);
  void backward();
  // Called during backward once the work that writes a parameter's gradient is ordered on the main
  // stream (with wgrad_beside, after the lane's join; its id in params()), in the order they are
  // produced: data-parallel training starts averaging a bucket of gradients as soon as all of it is
  // there (dist/data_parallel.h). Unset: nothing.
  std::function<void(int param_id)> on_grad_ready;
  // The per-BN sums the fused convs accumulate into, which bn_finalize_sums (and an evaluation
  // forward) leave zero: a step's CUDA graph needs none of cuDNN's memsets into them
  // (core/graph_memsets.h). Empty where nothing is fused (no buffer).
  ZeroedRange statistics_kept_zero() const { return {fused_sums_.get(), fused_sums_.bytes()}; }
  // What only the work right after cuDNN's memsets of it writes within a step: each fused pattern's
  // own workspace (its counters) and the BN weight gradients the fused data gradients accumulate. A
  // step's CUDA graph zeroes it once at its start instead (core/graph_memsets.h).
  std::vector<ZeroedRange> zeroed_at_step_start() const;

  struct BlockRun;  // one block's decisions and stored activations

 private:
  struct Lane;
  void plan_blocks(AutotuneCache& cache, size_t largest);  // largest: of the activations, in elements
  void allocate(size_t largest);
  void give_fused_workspaces();
  // Which 1x1 convs' training forward runs our kernel (BlockRun::c1_own, ...), which conv1s apply the
  // previous join as they read it (c1_applies_join), which conv1s' and conv3s' data gradient
  // (BlockRun::c1_joins, the first block's joining the stem's BN; c3_dgrad_own), which 3x3 conv2s'
  // forward and data gradient (c2_own, c2_dgrad_own: kernels/conv3x3.h), and whether the stem's
  // forward and weight gradient run ours (kernels/stem_conv.h).
  void plan_own_convs();
  // Whether our 3x3 kernel may run block b's conv2's data gradient (switched on, a shape it takes):
  // allocate() then gives bn1 the fp16 scale and shift its ReLU mask reads.
  bool conv2_dgrad_may_be_own(const Block& b) const;
  // Which stride-2 shortcuts' data gradients run at their output pixels alone
  // (BlockRun::down_compact), their algorithms chosen; the workspace they need.
  size_t plan_compact_shortcuts(AutotuneCache& cache);
  // Which 1x1 weight gradients run as cuBLASLt GEMMs on the lane (lane_gemms_); the workspace they need.
  size_t plan_lane_gemms();
  struct StemShape stem_shape() const;  // the stem conv's, as our kernels take it (kernels/stem_conv.h)
  // What our 1x1 kernel that takes bn's sums over `channels` columns needs to finalize it itself
  // (kernels/conv1x1_finalize.h): the forward's statistics, or backward the weight gradients and
  // apply coefficients; no counters (finalized after it) under --no-fuse own-finalize.
  struct Conv1x1Finalize finalize_in_kernel(const Bn& bn, int channels, bool backward) const;
  // The block's convs, not its join; `join`: the previous block's, which conv1 applies as it reads
  // its inputs, writing `in` (BlockRun::c1_applies_join).
  void block_forward(const Block& b, BlockRun& r, const void* in, bool train, const struct ApplyArgs* join);
  void block_backward(size_t i);
  // Layer1's conv2 filters turned for this step's data gradients (training's forward): on the lane
  // where there is one (turns_on_lane_: backward() waits for them there).
  void turn_filters();
  // y = relu(bn(x)) stored: the stem's output, and a conv's input where it reads it plain or the
  // weight gradient recomputes it; with `bits`, where the ReLU passed too (ApplyArgs::relu_bits).
  void store_relu_bn(const Bn& bn, const void* x, void* y, Shape4 s, cudaStream_t stream,
                     uint8_t* bits = nullptr) const;
  // y = conv(x), or conv(relu(bn_prev(x))) with `prologue`, then bn's coefficients from y's
  // statistics (training) or its running statistics (evaluation). `own`: in training by our kernel;
  // `reads_stored`: the conv reads relu(bn_prev(x)), stored into `stored` by a BN pass first.
  // `join`: our kernel applies the previous block's join as it reads x, the join's first input.
  void conv_stats(const struct ConvUnit& c, const FusedCall& fused, const void* x, void* y, const Bn& bn, Shape4 s,
                  bool train, const Bn* prologue, void* stored, Shape4 s_prev, bool own, bool reads_stored = false,
                  const struct Conv1x1Join* join = nullptr);
  // The backward of conv c whose input was relu(bn(x)): its weight gradient, and dx, the gradient of
  // bn's input x, from dy; own_dgrad: the data gradient by our kernel (BlockRun::c3_dgrad_own, or
  // for layer1's 3x3 conv2 c2_dgrad_own, with its filter turned in `turned`);
  // recompute_input: the plain weight gradient first writes relu(bn(x)) into `stored` (the forward
  // read it fused and did not store it); dw_parts: our data gradient takes the weight gradient too
  // (BlockRun::c3_dgrad_dw), its parts there, added up on the lane; with from_join, that kernel
  // makes dy as it reads it from the join's dz (in dy) and bn3's input and coefficients
  // (BlockRun::c3_applies_join).
  struct DyFromJoin {
    const void* a3;     // bn3's input
    const float* coef;  // bn3's backward apply coefficients (BnChannelState::bwd_coef)
  };
  void inner_backward(const struct ConvUnit& c, const FusedCall& wgrad, const FusedCall& dgrad,
                      bool recompute_input, const void* x, const Bn& bn, void* stored, Shape4 s_in, void* dy, void* dx,
                      bool own_dgrad, const void* turned = nullptr, float* dw_parts = nullptr,
                      const DyFromJoin* from_join = nullptr);
  // A conv's plain backward: dw (beside, on the lane) and dx = dgrad(dy); with `joined`, the data
  // gradient by our kernel that writes the previous block's dz instead (kernels/conv1x1_dgrad_join.h);
  // with `dgrad`, that conv's data gradient instead of c's (BlockRun::down_compact); with `dw_parts`,
  // both by our kernel from the same loads of dy, dw added up from its parts on the lane
  // (kernels/conv1x1_dgrad_bn.h, Conv1x1DgradDw: BlockRun::down_dw_parts), and with from_join dy
  // made by that kernel from the join's dz (in dy) and the shortcut BN's input (BlockRun::c3_applies_join).
  // lane_joined_later: the caller joins the lane and reports the weight's gradient ready itself.
  void conv_backward(const struct ConvUnit& c, const void* x, const void* dy, void* dx,
                     const struct Conv1x1DgradJoin* joined = nullptr, bool lane_joined_later = false,
                     const ConvLayer* dgrad = nullptr, float* dw_parts = nullptr,
                     const DyFromJoin* from_join = nullptr);
  // The join, out = relu(bn3(a3) + shortcut), the shortcut bn_down(ad) or the block's input `in`, as
  // bn_apply's arguments (training: with its ReLU bits): run as a pass of its own, or by the next
  // block's conv1 as it reads a3 and the shortcut (BlockRun::c1_applies_join).
  struct ApplyArgs join_args(const Block& b, BlockRun& r, const void* in, bool train) const;
  // The gradients inside a block: g[1] and g[3] by turns, or, with the lane behind (lagging_), one
  // of kLaggingSets sets of four by turns from block to block (training_backward.cpp says why).
  struct InnerGrads {
    void* a3;        // the join's gradient of a3, conv3's output gradient
    void* shortcut;  // of the shortcut conv's output
    void* mid2;      // conv3's data gradient, conv2's output gradient
    void* mid1;      // conv2's data gradient, conv1's output gradient
  };
  InnerGrads inner_grads(size_t block) const;
  // dy2: the second part of the output's gradient, or nullptr; joined: the next block's conv1 left
  // dz and its sums (BlockRun::c1_joins). Where conv3's data gradient makes its dy from dz
  // (BlockRun::c3_applies_join), only the finalize: the data gradients apply as they read dz.
  void join_backward(const Block& b, BlockRun& r, const void* dy2, bool joined, const InnerGrads& g);
  // bn's coefficients for y = bn(x): from x's statistics in training, else the running ones; with
  // their fp16 copies where the next conv's prologue reads them (bn.scale_h).
  void bn_forward(const Bn& bn, const void* x, Shape4 s, bool train);
  void grad_ready(int param_id) const {
    if (on_grad_ready) on_grad_ready(param_id);
  }
  void bn_grads_ready(const Bn& bn) const;
  // Enqueues `work`, a weight gradient, on the lane after everything on the main stream so far, with
  // cuDNN's handle pointed at the lane meanwhile; without a lane, on the main stream. work(stream,
  // workspace, bytes) gets the stream and workspace it must use. Then lane_join() before anything
  // writes what `work` reads, or reads what it writes.
  // With the lane behind (lagging_), lane_read(dy) after a weight gradient that reads the gradient
  // buffer dy is enqueued, instead of conv_done()'s join, and before_write(g) before the main stream
  // writes a gradient buffer g (core/stream_reads.h).
  void wgrad_beside(const std::function<void(cudaStream_t, void*, size_t)>& work);
  // The lane waits for everything on the main stream so far (with a lane).
  void lane_fork();
  void lane_join();
  void lane_read(const void* dy);
  void before_write(const void* g);
  // A conv's backward is enqueued: the lane is joined (unless it runs behind) and its weight's
  // gradient reported.
  void conv_done(int weight);
  // Conv c's weight gradient dw = dy^T x on `stream`: its cuBLASLt GEMM (lane_gemms_), else its
  // cuDNN plan.
  void weight_grad(const struct ConvUnit& c, const void* x, const void* dy, cudaStream_t stream, void* ws,
                   size_t ws_bytes) const;
  // Conv c's weight gradient from the `rows` parts our data gradient kernel left (BlockRun::dw_parts,
  // down_dw_parts), added up on the lane, beside what the chain does next.
  void weight_grad_from_parts(const struct ConvUnit& c, const float* parts, int rows);

  std::vector<BlockRun> runs_;
  std::map<std::string, std::shared_ptr<FusedConv>> plans_;  // the fused patterns taken
  DeviceBuffer stem_a_, stem_y_;          // stem conv output, stem BN+ReLU output
  DeviceBuffer dlogits_, dfeat_;
  DeviceBuffer grad_[4];                  // activation gradients, each of the largest activation's size
  // Where the lane may run behind the data gradients (LaggingWgrad: with the lane, not data-parallel,
  // not switched off): lagging_grads_, kLaggingSets sets of the inner gradients (inner_grads), and
  // lane_reads_, what the lane has yet to finish reading of them and of g[1] and g[3]. lagging_: it
  // does in this backward (no gradient is reported as it is written: on_grad_ready unset). Three
  // sets sized by role rather than two of the largest activation's size: -0.6% a step at batch 128
  // (H200, 2026-11-29) in about the same memory (419 MB at batch 128 by the shapes against 403; bench.py's
  // peak 2,618 -> 2,634 MB).
  static constexpr int kLaggingSets = 3;
  bool lagging_ = false;
  std::vector<DeviceBuffer> lagging_grads_;  // 4 a set; the first set's first two unused (g[1], g[3])
  std::unique_ptr<class StreamReads> lane_reads_;
  DeviceBuffer bn_scratch_;
  DeviceBuffer fused_sums_, fused_half_;  // per fused BN: sums (sum, sum of squares); fp16 scale/shift
  DeviceBuffer zeros_;                    // a zero vector (the dx pass after a fused data gradient)
  DeviceBuffer fused_workspaces_;         // each conv's fused patterns' own workspaces (FusedCall)
  DeviceBuffer own_partials_;             // our 1x1 convs' partial BN sums, forward and backward (plan_own_convs)
  DeviceBuffer own_arrivals_;             // their columns' counters where they finalize (empty: they do not)
  DeviceBuffer stem_partials_;            // our stem kernels' partial sums (empty: cuDNN runs the stem)
  DeviceBuffer stem_relu_bits_;           // the stem's ReLU bits, where the first block's conv1 joins it (else empty)
  bool stem_conv_own_ = false, stem_wgrad_own_ = false;  // the stem's forward, weight gradient: ours (plan_own_convs)
  bool chained_ = false;  // forward and backward launch the chain's kernels chained (ChainedLaunch)
  bool turns_on_lane_ = false;  // the last training forward turned layer1's conv2 filters on the lane
  std::unique_ptr<Lane> lane_;
  // The lane's 1x1 weight gradients as cuBLASLt GEMMs sized to leave SMs to the chain, by the
  // conv's weight id, one plan per shape (LaneGemmWgrad; empty: cuDNN's plans run them).
  std::map<int, std::shared_ptr<const class GemmWgrad>> lane_gemms_;
  const void* images_ = nullptr;          // the batch of the last forward (backward's stem input)
};
