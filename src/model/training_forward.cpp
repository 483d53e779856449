// The training network's forward, in training or evaluation mode, and its loss
// (model/training_network.h; the table of decisions it follows: training_network.cpp).
#include "model/training_network.h"

#include <algorithm>

#include "core/check.h"
#include "kernels/chained_launch.h"
#include "kernels/conv1x1_stats.h"
#include "kernels/conv3x3.h"
#include "kernels/loss.h"
#include "kernels/stem_conv.h"
#include "model/training_network_state.h"

void TrainingNetwork::bn_forward(const Bn& bn, const void* x, Shape4 s, bool train) {
  // With the fp16 copies the next conv's prologue may read.
  if (train)
    bn_forward_train_stats(x, s, cfg_.dtype, cfg_.layout, bn.st, bn_scratch_.as<float>(), ctx_.stream, bn.scale_h,
                           bn.shift_h);
  else
    bn_forward_eval_coefs(bn.st, bn.channels, ctx_.stream, bn.scale_h, bn.shift_h);
}

void TrainingNetwork::forward(const void* images, bool train) {
  set_chained_launches(chained_);  // this network's, for the thread that runs it
  images_ = images;
  if (train) turn_filters();  // beside the stem's forward
  const Shape4 stem = layers_->stem_out;
  const Bn& bn = layers_->stem_bn;
  // Our kernel sums the statistics as it writes (training); evaluation reads the running ones.
  const bool sums_taken = stem_conv_own_ && train;
  int rows = 0;
  if (stem_conv_own_)
    rows = stem_conv_forward({images, params_.working(layers_->stem.weight), stem_a_.get(),
                              sums_taken ? stem_partials_.as<float>() : nullptr, stem_shape()},
                             ctx_.stream);
  else
    conv_forward(layers_->stem, images, stem_a_.get());
  if (sums_taken)
    bn_finalize_partials(stem_partials_.as<float>(), rows, bn.channels, stem.per_channel(), bn.st, bn.channels,
                         bn.scale_h, bn.shift_h, ctx_.stream);
  else
    bn_forward(bn, stem_a_.get(), stem, train);
  // Training, the ReLU's bits too where the first block's conv1 data gradient takes the stem's BN backward.
  uint8_t* bits = train && stem_relu_bits_.get() ? stem_relu_bits_.as<uint8_t>() : nullptr;
  store_relu_bn(bn, stem_a_.get(), stem_y_.get(), stem, ctx_.stream, bits);
  const void* cur = stem_y_.get();
  ApplyArgs join{};
  const ApplyArgs* deferred = nullptr;  // the previous block's join, where this block's conv1 applies it
  for (size_t i = 0; i < runs_.size(); ++i) {
    const Block& b = layers_->blocks[i];
    BlockRun& r = runs_[i];
    block_forward(b, r, cur, train, deferred);
    join = join_args(b, r, cur, train);
    deferred = train && i + 1 < runs_.size() && runs_[i + 1].c1_applies_join ? &join : nullptr;
    if (!deferred) bn_apply(join, b.out, cfg_.dtype, cfg_.layout, ctx_.stream);
    cur = r.out.get();
  }
  classify(cur);
}

// Layer1's conv2 filters turned for their data gradients by our kernel (BlockRun::c2_dgrad_own), from
// this step's weights, as the forward uses them. On the lane, beside the forward, where there is one;
// backward() waits for them. Why: on the chain, between conv2's finalize and conv3, they took 3.3 µs
// each of the step (H200, batch 256, 2026-12-01).
void TrainingNetwork::turn_filters() {
  const bool any = std::any_of(runs_.begin(), runs_.end(), [](const BlockRun& r) { return r.c2_dgrad_own; });
  turns_on_lane_ = any && lane_;
  if (turns_on_lane_) lane_fork();
  const cudaStream_t stream = turns_on_lane_ ? lane_->stream : ctx_.stream;
  for (size_t i = 0; i < runs_.size(); ++i) {
    if (!runs_[i].c2_dgrad_own) continue;
    const Block& b = layers_->blocks[i];
    conv3x3_turn_filter(params_.working(b.c2.weight), runs_[i].c2_turned.get(), conv2_shape(b), stream);
  }
  if (turns_on_lane_) lane_->turned.record(lane_->stream);
}

void TrainingNetwork::store_relu_bn(const Bn& bn, const void* x, void* y, Shape4 s, cudaStream_t stream,
                                    uint8_t* bits) const {
  bn_apply({.x = x, .scale = bn.st.scale, .shift = bn.st.shift, .y = y, .relu_bits = bits}, s, cfg_.dtype,
           cfg_.layout, stream);
}

void TrainingNetwork::conv_stats(const ConvUnit& c, const FusedCall& fused, const void* x, void* y, const Bn& bn,
                                 Shape4 s, bool train, const Bn* prologue, void* stored, Shape4 s_prev, bool own,
                                 bool reads_stored, const Conv1x1Join* join) {
  const cudaStream_t stream = ctx_.stream;
  if (join && !(own && train && !prologue))
    throw Fatal("conv_stats: " + bn.name + "'s conv applies the previous join only by our kernel, in training, "
                "without a BN prologue");
  if (prologue && reads_stored) {  // relu(bn_prev(x)) stored by a BN pass, then read as it is
    if (!stored) throw Fatal("conv_stats: " + bn.name + "'s conv reads its stored input, and none is allocated");
    store_relu_bn(*prologue, x, stored, s_prev, stream);
    x = stored;
    prologue = nullptr;
  }
  if (own && train) {
    const ConvGeometry& g = c.geometry();
    const int m = s.n * s.h * s.w;
    float* partials = own_partials_.as<float>();
    const Conv1x1Finalize finalize = finalize_in_kernel(bn, g.k, false);
    int rows = 0;
    if (g.r == 3) {  // layer1's conv2 (BlockRun::c2_own), reading y1 stored: no prologue left
      if (prologue || join) throw Fatal("conv_stats: " + bn.name + "'s 3x3 conv of ours reads its input as stored");
      const Conv3x3Shape s3{s.n, s.h, s.w, g.c, g.k};
      conv3x3_stats({.x = x, .w = params_.working(c.weight), .y = y, .s = s3, .partials = partials, .finalize = finalize},
                    stream);
      rows = conv3x3_partial_rows(s3);
    } else {
      conv1x1_stats({x, params_.working(c.weight), y, m, g.k, g.c, prologue ? prologue->scale_h : nullptr,
                     prologue ? prologue->shift_h : nullptr, partials, Conv1x1Schedule::PingPong, finalize,
                     join ? *join : Conv1x1Join{}},
                    stream);
      rows = conv1x1_partial_rows(m, g.k);
    }
    if (!finalize.arrivals)
      bn_finalize_partials(partials, rows, g.k, s.per_channel(), bn.st, bn.channels, bn.scale_h, bn.shift_h, stream);
    return;
  }
  if (fused) {
    FusedArgs a{.x = x, .w = params_.working(c.weight), .y = y, .sum = bn.sum, .sqsum = bn.sqsum};
    if (prologue) prologue->set_coefficients(a, *fused.plan);  // the previous BN, applied as x is read
    fused.run(ctx_.cudnn, a);
    if (train) {  // the fp16 copies are written with the rest
      bn_finalize_sums(bn.sum, bn.sqsum, s.per_channel(), bn.st, bn.channels, bn.scale_h, bn.shift_h, stream);
      return;
    }
    // The sums are not read in evaluation; zeroed as bn_finalize_sums leaves them (statistics_kept_zero).
    CUDA_CHECK(cudaMemsetAsync(bn.sum, 0, 2 * size_t(bn.channels) * sizeof(float), stream));
    bn_forward(bn, y, s, false);
  } else {
    const void* in = x;
    if (prologue) {
      store_relu_bn(*prologue, x, stored, s_prev, stream);
      in = stored;
    }
    conv_forward(c, in, y);
    bn_forward(bn, y, s, train);
  }
}

void TrainingNetwork::block_forward(const Block& b, BlockRun& r, const void* in, bool train, const ApplyArgs* join) {
  if (join) {  // in (the join's output) is written by conv1, from the join's inputs
    const Conv1x1Join j{.res = join->res, .scale = join->scale, .shift = join->shift,
                        .res_scale = join->residual == Residual::BatchNorm ? join->res_scale : nullptr,
                        .res_shift = join->residual == Residual::BatchNorm ? join->res_shift : nullptr,
                        .out = join->y, .bits = join->relu_bits};
    if (join->y != in) throw Fatal("block_forward: the join conv1 applies must write the block's input");
    conv_stats(b.c1, r.c1_stats, join->x, r.a1.get(), b.b1, b.mid1, train, nullptr, nullptr, {}, r.c1_own, false, &j);
  } else {
    conv_stats(b.c1, r.c1_stats, in, r.a1.get(), b.b1, b.mid1, train, nullptr, nullptr, {}, r.c1_own);
  }
  conv_stats(b.c2, r.c2.fwd, r.a1.get(), r.a2.get(), b.b2, b.mid2, train, &b.b1, r.y1.get(), b.mid1, r.c2_own,
             r.c2.reads_stored);
  // Our conv3 kernel runs in training only: evaluation runs cuDNN's SbrConvStats, bn2 in its prologue.
  conv_stats(b.c3, r.c3.fwd, r.a2.get(), r.a3.get(), b.b3, b.out, train, &b.b2, r.y2.get(), b.mid2, r.c3_own,
             r.c3.reads_stored && train);
  if (b.down)
    conv_stats(*b.down, r.down_stats, in, r.ad.get(), *b.bdown, b.out, train, nullptr, nullptr, {}, r.down_own);
}

ApplyArgs TrainingNetwork::join_args(const Block& b, BlockRun& r, const void* in, bool train) const {
  ApplyArgs a{r.a3.get(), b.b3.st.scale, b.b3.st.shift, Residual::Tensor, in, nullptr, nullptr, true, r.out.get()};
  if (b.down) {
    a.residual = Residual::BatchNorm;
    a.res = r.ad.get();
    a.res_scale = b.bdown->st.scale;
    a.res_shift = b.bdown->st.shift;
  }
  if (train) a.relu_bits = r.relu_bits.as<uint8_t>();
  return a;
}

void TrainingNetwork::loss(const int32_t* labels, LossTotals* totals, const float* loss_scale, const long long* step,
                           float label_smoothing) {
  const bool train = loss_scale != nullptr;
  softmax_xent(logits_.as<float>(), params_.master(layers_->fc_bias), labels, cfg_.batch, cfg_.classes,
               train ? dlogits_.get() : nullptr, cfg_.dtype, train ? params_.vector_grad(layers_->fc_bias) : nullptr,
               loss_scale, label_smoothing, totals, step, ctx_.stream);
}

