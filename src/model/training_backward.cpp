// The training network's backward and the weight gradients' lane beside it
// (model/training_network.h; the table of decisions it follows: training_network.cpp).
#include "model/training_network.h"

#include <functional>

#include "core/check.h"
#include "core/stream_reads.h"
#include "kernels/chained_launch.h"
#include "kernels/conv1x1_dgrad_bn.h"
#include "kernels/conv1x1_dgrad_join.h"
#include "kernels/conv3x3.h"
#include "kernels/pooling.h"
#include "kernels/stem_conv.h"
#include "model/gemm_wgrad.h"
#include "model/linear.h"
#include "model/training_network_state.h"

// ---- the weight gradients' lane ------------------------------------------------------------------
void TrainingNetwork::lane_fork() {
  lane_->forked.record(ctx_.stream);
  CUDA_CHECK(cudaStreamWaitEvent(lane_->stream, lane_->forked, 0));
}

void TrainingNetwork::wgrad_beside(const std::function<void(cudaStream_t, void*, size_t)>& work) {
  if (!lane_) return work(ctx_.stream, workspace_.get(), workspace_.bytes());
  lane_fork();
  CUDNN_CHECK(cudnnSetStream(ctx_.cudnn, lane_->stream));
  try {
    work(lane_->stream, lane_->workspace.get(), lane_->workspace.bytes());
  } catch (...) {
    cudnnSetStream(ctx_.cudnn, ctx_.stream);
    throw;
  }
  CUDNN_CHECK(cudnnSetStream(ctx_.cudnn, ctx_.stream));
  lane_->done.record(lane_->stream);
}

void TrainingNetwork::weight_grad_from_parts(const ConvUnit& c, const float* parts, int rows) {
  const ConvGeometry& g = c.geometry();
  wgrad_beside([&](cudaStream_t lane, void*, size_t) {
    conv1x1_dw_from_partials(parts, rows, g.k, g.c, params_.weight_grad(c.weight), lane);
  });
}

void TrainingNetwork::weight_grad(const ConvUnit& c, const void* x, const void* dy, cudaStream_t stream, void* ws,
                                  size_t ws_bytes) const {
  const auto lt = lane_gemms_.find(c.weight);
  if (lt != lane_gemms_.end())
    lt->second->run(ctx_.cublas_lt, x, dy, params_.weight_grad(c.weight), ws, ws_bytes, stream);
  else
    c.conv->backward_filter(ctx_.cudnn, x, dy, params_.weight_grad(c.weight), ws, ws_bytes);
}

void TrainingNetwork::lane_join() {
  if (lane_) CUDA_CHECK(cudaStreamWaitEvent(ctx_.stream, lane_->done, 0));
  if (lane_reads_) lane_reads_->reset();
}

void TrainingNetwork::lane_read(const void* dy) {
  if (lagging_) lane_reads_->read(dy, lane_->stream);
}

void TrainingNetwork::before_write(const void* g) {
  if (lagging_) lane_reads_->before_write(g, ctx_.stream);
}

void TrainingNetwork::conv_done(int weight) {
  if (!lagging_) lane_join();
  grad_ready(weight);
}

// ---- backward -----------------------------------------------------------------------------------
void TrainingNetwork::bn_grads_ready(const Bn& bn) const {
  grad_ready(bn.gamma);
  grad_ready(bn.beta);
}

// Gradient buffers: a block's output gradient arrives in g[0], and, but for the last block, with a
// second part in g[2]; a block leaves its input's gradient in the same two parts: the shortcut's in
// g[0] and the main path's (conv1's data gradient) in g[2]. Whoever reads a block's input gradient
// next (the previous block's join, the stem's BN) sums the two as it reads them. (cuDNN's graph API
// through cudnn-frontend cannot accumulate a data gradient into its output, as the legacy calls
// could with beta = 1.) Where conv1 joins (BlockRun::c1_joins), our kernel adds its part to g[0]
// itself and leaves the previous join's dz there; g[2] then holds only a shortcut's data gradient
// on its way to conv1's join: a stride-2 one's compact (BlockRun::down_compact), or one that read
// the join's dz from g[0] (BlockRun::c3_applies_join). g[1] and g[3] hold the
// gradients inside a block, or, where the weight gradients' lane runs behind (lagging_), one of
// kLaggingSets sets of four by turns from block to block (inner_grads).
void TrainingNetwork::backward() {
  set_chained_launches(chained_);
  const DType t = cfg_.dtype;
  const Layout l = cfg_.layout;
  // A gradient reported as written must be written: data-parallel training joins the lane after
  // each conv. The lane's reads pending from an earlier backward were joined at its end.
  lagging_ = lane_reads_ && !on_grad_ready;
  if (lane_reads_) lane_reads_->reset();
  if (turns_on_lane_) CUDA_CHECK(cudaStreamWaitEvent(ctx_.stream, lane_->turned, 0));
  turns_on_lane_ = false;
  linear_backward(ctx_.cublas, {cfg_.batch, layers_->features, cfg_.classes}, t, cfg_.tf32, feat_.get(),
                  params_.working(layers_->fc_weight), dlogits_.get(), params_.weight_grad(layers_->fc_weight),
                  dfeat_.get());
  grad_ready(layers_->fc_weight);
  grad_ready(layers_->fc_bias);  // written by loss(), before backward
  global_avgpool_backward(dfeat_.get(), layers_->blocks.back().out, t, l, grad_[0].get(), ctx_.stream);
  for (size_t i = runs_.size(); i-- > 0;) block_backward(i);
  const Bn& bn = layers_->stem_bn;
  const Shape4 s = layers_->stem_out;
  void* g0 = grad_[0].get();
  const BnBackwardArgs stem{.dy = g0, .dy2 = grad_[2].get(), .relu = ReluMask::FromInput, .x = stem_a_.get(),
                            .bn = &bn.st, .dgamma = params_.vector_grad(bn.gamma),
                            .dbeta = params_.vector_grad(bn.beta), .dx = g0};
  // Where the first block's conv1 joined the stem, dz (masked) is in g[0], its sums in own_partials_; our
  // weight gradient then applies the BN backward as it reads dz, and dx is never stored.
  const bool joined = !runs_.empty() && runs_[0].c1_joins;
  const bool applied_in_wgrad = joined && stem_wgrad_own_;
  if (joined) {
    BnBackwardArgs dz = stem;
    dz.dy2 = nullptr;
    dz.relu = ReluMask::None;
    const int rows = conv1x1_dgrad_join_rows(s.n * s.h * s.w, s.c);
    if (applied_in_wgrad)
      bn_backward_finalize(dz, own_partials_.as<float>(), rows, s, ctx_.stream);
    else
      bn_backward_from_sums(dz, own_partials_.as<float>(), rows, s, t, l, ctx_.stream);
  } else {
    bn_backward(stem, s, t, l, bn_scratch_.as<float>(), ctx_.stream);
  }
  bn_grads_ready(bn);
  // The images need no gradient: only the stem's filter gradient.
  const ConvUnit& c = layers_->stem;
  if (stem_wgrad_own_) {
    StemWgrad w{images_, g0, params_.weight_grad(c.weight), stem_partials_.as<float>(), stem_shape()};
    if (applied_in_wgrad) {
      w.bn_x = stem_a_.get();
      w.coef = bn.st.bwd_coef;
    }
    stem_wgrad(w, ctx_.stream);
  } else {
    c.conv->backward_filter(ctx_.cudnn, images_, g0, params_.weight_grad(c.weight), workspace_.get(),
                            workspace_.bytes());
  }
  grad_ready(c.weight);
  if (runs_.empty()) return;
  lane_join();  // the first block's conv1 weight gradient (block_backward); with the lane behind, all of it
  grad_ready(layers_->blocks[0].c1.weight);
}

// Block i's output gradient arrives from the head (g[0] alone, the last block), in two parts (g[0]
// and the next block's conv1's in g[2]), or, where the next block's conv1 joins (BlockRun::c1_joins),
// already as dz in g[0] with its sums in own_partials_.
void TrainingNetwork::block_backward(size_t i) {
  const Block& b = layers_->blocks[i];
  BlockRun& r = runs_[i];
  const void* in = i == 0 ? stem_y_.get() : runs_[i - 1].out.get();
  void *g0 = grad_[0].get(), *g2 = grad_[2].get();
  const InnerGrads grads = inner_grads(i);
  const bool last = i + 1 == runs_.size(), joined = !last && runs_[i + 1].c1_joins;
  join_backward(b, r, last || joined ? nullptr : g2, joined, grads);
  // The shortcut's part of the input's gradient: in g[0], or compact in g[2] (down_compact: g[2] is
  // free once join_backward has read it, and this block's conv1 joins, writing g[0]). After conv3's
  // where conv3 reads the join's dz from g[0]; in g[2] where the shortcut reads dz there too.
  const bool compact = bool(r.down_compact);
  auto shortcut = [&] {
    if (!b.down) return;
    if (r.c3_applies_join) {  // the shortcut's dy made from the join too
      const DyFromJoin from{.a3 = r.ad.get(), .coef = b.bdown->st.bwd_coef};
      return conv_backward(*b.down, in, g0, g2, nullptr, false, nullptr, r.down_dw_parts.as<float>(), &from);
    }
    conv_backward(*b.down, in, grads.shortcut, compact ? g2 : g0, nullptr, false, r.down_compact.get(),
                  r.down_dw_parts.as<float>());
  };
  if (!r.c3_applies_join) shortcut();
  const DyFromJoin from_join{.a3 = r.a3.get(), .coef = b.b3.st.bwd_coef};
  inner_backward(b.c3, r.c3.wgrad, r.c3.dgrad, r.c3.recomputes_input(), r.a2.get(), b.b2, r.y2.get(), b.mid2,
                 r.c3_applies_join ? g0 : grads.a3, grads.mid2, r.c3_dgrad_own, nullptr, r.dw_parts.as<float>(),
                 r.c3_applies_join ? &from_join : nullptr);
  if (r.c3_applies_join) shortcut();
  inner_backward(b.c2, r.c2.wgrad, r.c2.dgrad, r.c2.recomputes_input(), r.a1.get(), b.b1, r.y1.get(), b.mid1, grads.mid2,
                 grads.mid1, r.c2_dgrad_own, r.c2_turned.get());
  // The first block's conv1: its weight gradient may run on beside the stem's backward, which
  // touches neither its input nor its gradient; backward() joins the lane after the stem.
  const bool lane_after_stem = i == 0;
  if (!r.c1_joins) return conv_backward(b.c1, in, grads.mid1, g2, nullptr, lane_after_stem);
  // g[0] holds this block's shortcut gradient, the previous block output's first part: dz over it
  // (a compact one is in g[2], and dz is only written). Before the first block, the stem's BN +
  // ReLU: a join with no shortcut of its own.
  const Block* prev = i > 0 ? &layers_->blocks[i - 1] : nullptr;
  const BlockRun* pr = i > 0 ? &runs_[i - 1] : nullptr;
  const BnChannelState& st = prev ? prev->b3.st : layers_->stem_bn.st;
  const ConvGeometry& g = b.c1.geometry();
  Conv1x1DgradJoin joins{.dy = grads.mid1, .w = params_.working(b.c1.weight), .dz = g0,
                         .relu_bits = (pr ? pr->relu_bits : stem_relu_bits_).as<uint8_t>(),
                         .x = pr ? pr->a3.get() : stem_a_.get(), .mean = st.save_mean, .invstd = st.save_invstd,
                         .partials = own_partials_.as<float>(), .m = b.in.n * b.in.h * b.in.w, .k = g.k, .c = g.c};
  if (prev && prev->down) {
    joins.x2 = pr->ad.get();
    joins.mean2 = prev->bdown->st.save_mean;
    joins.invstd2 = prev->bdown->st.save_invstd;
  }
  if (compact) {  // dz is only written: the shortcut's part comes from g[2]
    joins.g_even = g2;
    joins.img_h = b.in.h;
    joins.img_w = b.in.w;
  }
  if (b.down && r.c3_applies_join) joins.g = g2;  // the shortcut's data gradient, at every pixel
  conv_backward(b.c1, in, grads.mid1, nullptr, &joins, lane_after_stem);
}

// Without the lane behind, g[1] and g[3] by turns (each conv's data gradient waits for the previous
// conv's weight gradient, which reads the buffer it overwrites). Behind, kLaggingSets sets of four
// buffers, by turns from block to block (the first set's a3 and shortcut gradients in g[1] and
// g[3]): the lane may finish a block's weight gradients while the data gradients go on through the
// next blocks on the other sets; a block's writes wait only for the lane's reads of the same set
// kLaggingSets blocks before (before_write, lane_reads_). Measured on an H200 (2026-11-29,
// bench/ab.py, 3 rounds): two sets against --no-fuse ...,lagging-wgrad, batch 128 5.109 -> 4.962 ms
// a step, batch 256 8.953 -> 8.766 ms; three against two, 4.917 -> 4.887 ms and 8.864 -> 8.856 ms
// (bench/results/levers-session25-nvidia-h200-2026-11-29.md and levers-session26-...-29.md).
TrainingNetwork::InnerGrads TrainingNetwork::inner_grads(size_t block) const {
  void *g1 = grad_[1].get(), *g3 = grad_[3].get();
  if (!lagging_) return {.a3 = g1, .shortcut = g3, .mid2 = g3, .mid1 = g1};
  const size_t k = block % kLaggingSets;
  const DeviceBuffer* l = &lagging_grads_[4 * k];
  return {.a3 = k ? l[0].get() : g1, .shortcut = k ? l[1].get() : g3, .mid2 = l[2].get(), .mid1 = l[3].get()};
}

// The join: out = relu(bn3(a3) + shortcut). From its output's gradient (g[0] + dy2, or, joined, dz
// already in g[0]): g[1] = the gradient of a3, and g[3] = that of the shortcut conv's output, or
// g[0] = the identity shortcut's.
void TrainingNetwork::join_backward(const Block& b, BlockRun& r, const void* dy2, bool joined, const InnerGrads& g) {
  if (!r.c3_applies_join) {
    before_write(g.a3);
    if (b.down) before_write(g.shortcut);
  }
  // The ReLU came after the residual add: the forward's bits (join_args).
  BnBackwardArgs last{.dy = grad_[0].get(), .dy2 = dy2, .relu = ReluMask::FromBits,
                      .relu_bits = r.relu_bits.as<uint8_t>(), .x = r.a3.get(), .bn = &b.b3.st,
                      .dgamma = params_.vector_grad(b.b3.gamma), .dbeta = params_.vector_grad(b.b3.beta),
                      .dx = g.a3};
  if (b.down) {
    last.x2 = r.ad.get();
    last.bn2 = &b.bdown->st;
    last.dgamma2 = params_.vector_grad(b.bdown->gamma);
    last.dbeta2 = params_.vector_grad(b.bdown->beta);
    last.dx2 = g.shortcut;
  } else {
    last.dres = grad_[0].get();  // identity shortcut: the input's gradient starts as dz
  }
  if (joined) {  // dz, masked, is in g[0] already (the identity shortcut's gradient too), its sums beside
    last.relu = ReluMask::None;
    last.relu_bits = nullptr;
    last.dres = nullptr;
    const int m = b.out.n * b.out.h * b.out.w;
    const int rows = conv1x1_dgrad_join_rows(m, b.out.c);
    if (r.c3_applies_join) {  // the data gradients apply as they read dz (the shortcut's too)
      bn_backward_finalize(last, own_partials_.as<float>(), rows, b.out, ctx_.stream);
    } else {
      bn_backward_from_sums(last, own_partials_.as<float>(), rows, b.out, cfg_.dtype, cfg_.layout, ctx_.stream);
    }
  } else {
    bn_backward(last, b.out, cfg_.dtype, cfg_.layout, bn_scratch_.as<float>(), ctx_.stream);
  }
  bn_grads_ready(b.b3);
  if (b.down) bn_grads_ready(*b.bdown);
}

void TrainingNetwork::conv_backward(const ConvUnit& c, const void* x, const void* dy, void* dx,
                                    const Conv1x1DgradJoin* joined, bool lane_joined_later, const ConvLayer* dgrad,
                                    float* dw_parts, const DyFromJoin* from_join) {
  if (dgrad && dw_parts) throw Fatal("conv_backward: a compact data gradient cannot take the weight gradient too");
  if (from_join && !dw_parts) throw Fatal("conv_backward: dy is made from the join only where dw is taken too");
  if (!dw_parts) {
    wgrad_beside([&](cudaStream_t s, void* ws, size_t wsb) { weight_grad(c, x, dy, s, ws, wsb); });
    lane_read(dy);
  }
  const ConvLayer& data_grad = dgrad ? *dgrad : *c.conv;
  before_write(joined ? joined->dz : dx);  // g[0] or g[2] today, which the lane never reads: no wait
  if (joined) {
    conv1x1_dgrad_join(*joined, ctx_.stream);
  } else if (dw_parts) {  // dw's parts beside dx; their sum on the lane, which reads nothing else
    const ConvGeometry& g = c.geometry();
    const int m = g.n * g.h * g.w;
    conv1x1_dgrad_dw({.dy = dy, .w = params_.working(c.weight), .dx = dx, .x = x, .dw_partials = dw_parts, .m = m,
                      .k = g.k, .c = g.c, .dy_x = from_join ? from_join->a3 : nullptr,
                      .dy_coef = from_join ? from_join->coef : nullptr},
                     ctx_.stream);
    weight_grad_from_parts(c, dw_parts, conv1x1_dgrad_bn_rows(m, g.c));
  } else {
    data_grad.backward_data(ctx_.cudnn, dy, params_.working(c.weight), dx, workspace_.get(), workspace_.bytes());
  }
  if (!lane_joined_later) conv_done(c.weight);
}

void TrainingNetwork::inner_backward(const ConvUnit& c, const FusedCall& wgrad, const FusedCall& dgrad,
                                     bool recompute_input, const void* x, const Bn& bn, void* stored, Shape4 s_in,
                                     void* dy, void* dx, bool own_dgrad, const void* turned, float* dw_parts,
                                     const DyFromJoin* from_join) {
  const bool dw_in_dgrad = dw_parts != nullptr;
  if (from_join && !(own_dgrad && dw_in_dgrad))
    throw Fatal("inner_backward: dy is made from the join only by our data gradient that takes dw too");
  const DType t = cfg_.dtype;
  const Layout l = cfg_.layout;
  const cudaStream_t stream = ctx_.stream;
  if (!dw_in_dgrad) wgrad_beside([&](cudaStream_t lane, void* lane_ws, size_t lane_wsb) {
    if (wgrad) {
      FusedArgs a{.x = x, .dy = dy, .dw = params_.weight_grad(c.weight)};
      bn.set_coefficients(a, *wgrad.plan);
      wgrad.run(ctx_.cudnn, a);
      return;
    }
    if (recompute_input)  // the forward read relu(bn(x)) fused and did not store it
      store_relu_bn(bn, x, stored, s_in, lane);
    weight_grad(c, stored, dy, lane, lane_ws, lane_wsb);
  });
  if (!dw_in_dgrad) lane_read(dy);
  before_write(dx);
  float* coef = bn.st.bwd_coef;  // dx = coef[c] * g + coef[C + c] * x + coef[2C + c]
  const int C = bn.channels;
  if (own_dgrad) {  // dz over dx, its sums beside; then the BN backward's apply
    const ConvGeometry& g = c.geometry();
    const int m = s_in.n * s_in.h * s_in.w;
    float* partials = own_partials_.as<float>();
    const Conv1x1Finalize finalize = finalize_in_kernel(bn, g.c, true);
    int rows = 0;
    if (g.r == 3) {  // layer1's conv2 (BlockRun::c2_dgrad_own), by its filter turned in the forward
      const Conv3x3Shape s3{s_in.n, s_in.h, s_in.w, g.c, g.k};
      conv3x3_dgrad_bn({.dy = dy, .turned = turned, .dz = dx, .x = x, .mean = bn.st.save_mean,
                        .invstd = bn.st.save_invstd, .scale = bn.scale_h, .shift = bn.shift_h, .partials = partials,
                        .s = s3, .finalize = finalize},
                       stream);
      rows = conv3x3_dgrad_partial_rows(s3);
    } else {
      conv1x1_dgrad_bn({.dy = dy, .w = params_.working(c.weight), .dz = dx, .x = x, .mean = bn.st.save_mean,
                        .invstd = bn.st.save_invstd, .scale = bn.scale_h, .shift = bn.shift_h, .partials = partials,
                        .m = m, .k = g.k, .c = g.c, .finalize = finalize, .dw_partials = dw_parts,
                        .dy_x = from_join ? from_join->a3 : nullptr, .dy_coef = from_join ? from_join->coef : nullptr},
                       stream);
      rows = conv1x1_dgrad_bn_rows(m, g.c);
      if (dw_parts) weight_grad_from_parts(c, dw_parts, rows);  // beside the BN backward's apply
    }
    const BnBackwardArgs mid{.dy = dx, .x = x, .bn = &bn.st, .dgamma = params_.vector_grad(bn.gamma),
                             .dbeta = params_.vector_grad(bn.beta), .dx = dx};
    if (finalize.arrivals)  // finalized by the kernel
      bn_backward_apply(mid, s_in, t, l, stream);
    else
      bn_backward_from_sums(mid, partials, rows, s_in, t, l, stream);
  } else if (dgrad) {
    const FusedArgs a{.x = x, .w = params_.working(c.weight), .dy = dy, .mean = bn.st.save_mean,
                      .invstd = bn.st.save_invstd, .gamma = bn.st.gamma, .beta = bn.st.beta, .g = dx,
                      .dgamma = params_.vector_grad(bn.gamma), .dbeta = params_.vector_grad(bn.beta),
                      .eq_dy = coef, .eq_x = coef + C, .eq_b = coef + 2 * C};
    dgrad.run(ctx_.cudnn, a);
    // dx = eq_dy * g + eq_b + eq_x * x: the join kernel with x as the "second BN" and no ReLU, in place.
    bn_apply({dx, coef, coef + 2 * C, Residual::BatchNorm, x, coef + C, zeros_.as<float>(), false, dx}, s_in, t, l,
             stream);
  } else {
    c.conv->backward_data(ctx_.cudnn, dy, params_.working(c.weight), dx, workspace_.get(), workspace_.bytes());
    const BnBackwardArgs mid{.dy = dx, .relu = ReluMask::FromInput, .x = x, .bn = &bn.st,
                             .dgamma = params_.vector_grad(bn.gamma), .dbeta = params_.vector_grad(bn.beta),
                             .dx = dx};
    bn_backward(mid, s_in, t, l, bn_scratch_.as<float>(), stream);
  }
  conv_done(c.weight);
  bn_grads_ready(bn);
}
