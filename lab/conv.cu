// The convolutions with the batch norms around them, fp16 NHWC (the format of the fused patterns),
// at every distinct conv of the network's blocks: the plain graph-API conv with our BN kernels
// against cuDNN's fused patterns (model/fused_conv.h), as src/model/resnet50_fused.cpp runs them.
//   conv-forward  the conv and the statistics of its output's BN; where the next conv reads that BN's
//                 output (conv1, conv2), unfused versions also apply it, fused ones leave it to the
//                 next conv, which applies it as it reads (so the rows of a block add up)
//   conv-dgrad    conv2 and conv3, whose input was relu(bn(x)) of the previous BN: dx of x through
//                 the conv, the ReLU and that BN, with the BN's gamma and beta gradients
//   conv-wgrad    conv2 and conv3: the weight gradient, from relu(bn(x)) stored, recomputed, or
//                 recomputed as the fused pattern reads x
// A pattern cuDNN refuses shows as refused, with its reason. To try a variant: add a LabVersion to
// its operation's list below.
#include "lab/lab.h"

namespace lab {

namespace {

using gpu_test::DeviceBn;
using gpu_test::kTolF16;
constexpr DType kT = DType::F16;
constexpr Layout kL = Layout::NHWC;

bool has_prologue(ConvRole r) { return r == ConvRole::Spatial || r == ConvRole::Expand; }
// Whether the network stores relu(bn(y)) of this conv's output y for the next conv (unfused).
bool feeds_a_conv(ConvRole r) { return r == ConvRole::Reduce || r == ConvRole::Spatial; }

// One conv and the BNs around it: at the check batch as the reference sees it, and on the device at
// the timed batch. For conv2 and conv3 the conv's input is relu(x * s + b), x the previous BN's input
// and s, b its scale and shift; for conv1 and the shortcut it is x itself.
struct ConvCase {
  const LabConv& conv;
  bool prologue;
  ConvGeometry G;          // the timed batch
  ref::ConvDims cd;        // the check batch
  ref::Dims din, dout;
  Shape4 in, out;          // the timed batch
  std::mt19937_64 rng;
  Vec x, s, b;             // s and b fp16 values: the fused pattern reads them exactly in either type
  ref::BnStats stp;        // the previous BN's statistics of x, as saved
  gpu_test::HostBn hp, h;  // the previous BN (gamma, beta such that its scale, shift are s, b) and this one's
  Vec stored;              // what the conv reads: relu(x * s + b) as bn_apply stores it, or x
  gpu_test::Filter w;
  Vec dy;                  // the gradient of the conv's output
  DeviceTensor X, STORED, DY, Y, YBN, DX, TMP, DW, sum, sqsum, s_h, b_h, scale_h_out, shift_h_out, dgamma, dbeta;
  DeviceBn bn, bnp;
  DeviceTensor scratch_in, scratch_out;

  ConvCase(const Lab& lab, const LabConv& c)
      : conv(c),
        prologue(has_prologue(c.role)),
        G(c.g),
        cd(gpu_test::conv_dims({lab.opt.check_batch, G.c, G.h, G.w, G.k, G.r, G.stride, G.pad})),
        din(cd.input()),
        dout(cd.output()),
        in(G.input()),
        out(G.output()),
        rng(gpu_test::named_rng("conv " + c.text())),
        x(gpu_test::quantize(kT, gpu_test::channel_data(rng, din, -1.0, 1.0))),
        s(gpu_test::quantize(kT, gpu_test::random_uniform(rng, G.c, 0.5, 1.5))),
        b(gpu_test::quantize(kT, gpu_test::random_normal(rng, G.c, 0.0, 0.5))),
        stp(gpu_test::saved_stats(din, x)),
        hp(gpu_test::random_bn(rng, G.c)),
        h(gpu_test::random_bn(rng, G.k)),
        stored(prologue ? gpu_test::bn_apply_as_gpu(din, x, s, b, kT) : x),
        w(rng, G),
        dy(gpu_test::quantize(kT, gpu_test::random_normal(rng, dout.count()))),
        X(repeated(x, din, lab.repeats(), kT, kL)),
        STORED(repeated(stored, din, lab.repeats(), kT, kL)),
        DY(repeated(dy, dout, lab.repeats(), kT, kL)),
        Y(out.count(), kT, "conv output"),
        YBN(out.count(), kT, "BN output"),
        DX(in.count(), kT, "conv input gradient"),
        TMP(in.count(), kT, "recomputed BN output"),
        DW(G.filter_count(), kT, "filter gradient"),
        sum(G.k, DType::F32),
        sqsum(G.k, DType::F32),
        s_h(s, DType::F16, "fp16 scale"),
        b_h(b, DType::F16, "fp16 shift"),
        scale_h_out(G.k, DType::F16, "fp16 scale"),
        shift_h_out(G.k, DType::F16, "fp16 shift"),
        dgamma(G.c, DType::F32),
        dbeta(G.c, DType::F32),
        bn(h),
        bnp(previous_bn()),
        scratch_in(gpu_test::bn_scratch(in, kT, kL)),
        scratch_out(gpu_test::bn_scratch(out, kT, kL)) {
    bnp.save_mean.upload(stp.mean);
    bnp.save_invstd.upload(stp.invstd);
    bnp.scale.upload(s);
    bnp.shift.upload(b);
  }

  // The previous BN's parameters: gamma = s / std and beta = b + mean * s, so that what the fused
  // dgrad recomputes from the statistics, (x - mean) * invstd * gamma + beta, is x * s + b.
  gpu_test::HostBn previous_bn() {
    for (int c = 0; c < G.c; ++c) {
      hp.gamma[c] = gpu_test::quantize(DType::F32, s[c] / stp.invstd[c]);
      hp.beta[c] = gpu_test::quantize(DType::F32, b[c] + stp.mean[c] * s[c]);
    }
    return hp;
  }

  int repeats() const { return in.n / din.n; }
  std::string shape() const { return conv.text(); }
  // The prologue's scale and bias in the type the pattern reads.
  const void* scale_for(const FusedConv& f) const { return f.scale_type() == DType::F16 ? s_h.get() : bnp.scale.get(); }
  const void* bias_for(const FusedConv& f) const { return f.scale_type() == DType::F16 ? b_h.get() : bnp.shift.get(); }
  LabCheck check(const std::string& output, const DeviceTensor& got, const Vec& want, const ref::Dims& d) const {
    return check_activation(output, got, want, d, kL, kTolF16);
  }
};

// What cuDNN chose for a pattern, shown beside the version.
std::string note_of(const FusedConv& f, bool prologue) {
  std::string n = prologue ? std::string(dtype_name(f.scale_type())) + " scale/bias" : "";
  if (f.runtime_compiled()) n += std::string(n.empty() ? "" : ", ") + "runtime-compiled engine";
  return n;
}

// A version that runs a fused pattern: refused where cuDNN refused it.
Prepared fused_version(Lab& lab, const FusedConv& f, bool prologue, std::function<void()> run,
                       std::function<std::vector<LabCheck>()> check) {
  if (!f.ok()) return {.refused = f.why()};
  lab.reserve_workspace(f.workspace());
  return {.run = std::move(run), .check = std::move(check), .note = note_of(f, prologue)};
}

void conv_forward(Lab& lab, const LabConv& lc) {
  ConvCase c(lab, lc);
  struct Refs {
    Vec y, ybn;
    ref::BnStats st;
  };
  Lazy<Refs> want([&] {
    Refs r;
    r.y = ref::conv2d_forward(c.cd, c.stored, c.w.v);
    r.st = ref::bn_batch_stats(c.dout, r.y, double(kBnEps));
    r.ybn = ref::relu(ref::bn_affine(c.dout, r.y, ref::bn_train_coefs(r.st, c.h.gamma, c.h.beta)));
    return r;
  });
  const bool applies = feeds_a_conv(lc.role);
  auto checks = [&](bool with_stats, bool with_apply) {
    std::vector<LabCheck> out{c.check("y", c.Y, want->y, c.dout)};
    if (with_stats) {
      out.push_back(check_vector("mean", c.bn.save_mean, want->st.mean, kTolF16));
      out.push_back(check_vector("invstd", c.bn.save_invstd, want->st.invstd, kTolF16));
    }
    if (with_apply) out.push_back(c.check("y_bn", c.YBN, want->ybn, c.dout));
    return out;
  };
  ConvLayer* conv = nullptr;
  auto plain = [&] {
    conv->forward(lab.cudnn(), c.STORED.get(), c.w.d.get(), c.Y.get(), lab.workspace(), lab.workspace_bytes());
  };
  auto poison = [&] {
    for (DeviceTensor* t : {&c.Y, &c.YBN, &c.bn.save_mean, &c.bn.save_invstd}) t->poison();
  };
  auto setup = [&] {
    conv = &lab.conv(c.G);
    lab.reserve_workspace(conv->workspace_bytes());
    poison();
  };
  const FusedPattern pattern = c.prologue ? FusedPattern::SbrConvStats : FusedPattern::ConvStats;
  lab.measure(
      "conv-forward", c.shape(), "fp16 NHWC", 0,
      {{c.prologue ? "conv (graph API), reading the stored relu(bn(x)) of the previous BN" : "conv (graph API)",
        [&] {
          setup();
          return Prepared{.run = plain, .check = [&] { return checks(false, false); }};
        }},
       {applies ? "conv, then bn_forward_train_stats and bn_apply + ReLU (unfused)"
                : "conv, then bn_forward_train_stats (unfused; the join applies the BN)",
        [&] {
          setup();
          return Prepared{.run =
                              [&] {
                                plain();
                                bn_forward_train_stats(c.Y.get(), c.out, kT, kL, c.bn.state(), c.scratch_out.f32(),
                                                       lab.stream());
                                if (applies)
                                  bn_apply({c.Y.get(), c.bn.scale.f32(), c.bn.shift.f32(), Residual::None, nullptr,
                                            nullptr, nullptr, true, c.YBN.get()},
                                           c.out, kT, kL, lab.stream());
                              },
                          .check = [&] { return checks(true, applies); }};
        }},
       {c.prologue ? "SbrConvStats (the previous BN applied as x is read), then bn_finalize_sums (fused)"
                   : "ConvStats, then bn_finalize_sums (fused)",
        [&] {
          poison();
          const FusedConv* f = &lab.fused(pattern, c.G);
          return fused_version(
              lab, *f, c.prologue,
              [&, f] {
                const FusedArgs a{.x = c.prologue ? c.X.get() : c.STORED.get(),
                                  .w = c.w.d.get(),
                                  .y = c.Y.get(),
                                  .scale = c.prologue ? c.scale_for(*f) : nullptr,
                                  .bias = c.prologue ? c.bias_for(*f) : nullptr,
                                  .sum = c.sum.f32(),
                                  .sqsum = c.sqsum.f32()};
                f->run(lab.cudnn(), a, lab.workspace(), lab.workspace_bytes());
                // Also this BN's scale and shift in fp16, as the network does for a next pattern that reads them so.
                bn_finalize_sums(c.sum.f32(), c.sqsum.f32(), c.out.per_channel(), c.bn.state(), c.G.k,
                                 c.scale_h_out.get(), c.shift_h_out.get(), lab.stream());
              },
              [&] { return checks(true, false); });
        }}});
}

void conv_dgrad(Lab& lab, const LabConv& lc) {
  ConvCase c(lab, lc);
  Lazy<Vec> dconv([&] { return ref::conv2d_backward_data(c.cd, c.dy, c.w.v); });
  Lazy<ref::BnGrads> want(
      [&] { return ref::bn_backward(c.din, ref::relu_backward(*dconv, c.stored), c.x, c.hp.gamma, c.stp); });
  auto checks = [&](bool through_bn) {
    if (!through_bn) return std::vector<LabCheck>{c.check("dx", c.DX, *dconv, c.din)};
    return std::vector<LabCheck>{c.check("dx", c.DX, want->dx, c.din),
                                 check_vector("dgamma", c.dgamma, want->dgamma, kTolF16, c.repeats()),
                                 check_vector("dbeta", c.dbeta, want->dbeta, kTolF16, c.repeats())};
  };
  ConvLayer* conv = nullptr;
  auto dgrad = [&] {
    conv->backward_data(lab.cudnn(), c.DY.get(), c.w.d.get(), c.DX.get(), false, lab.workspace(), lab.workspace_bytes());
  };
  auto poison = [&] {
    for (DeviceTensor* t : {&c.DX, &c.dgamma, &c.dbeta}) t->poison();
  };
  auto setup = [&] {
    conv = &lab.conv(c.G);
    lab.reserve_workspace(conv->workspace_bytes());
    poison();
  };
  float* coef = c.bnp.bwd_coef.f32();  // dx = coef[c] * g + coef[C + c] * x + coef[2C + c]
  const int C = c.G.c;
  lab.measure(
      "conv-dgrad", c.shape(), "fp16 NHWC", 0,
      {{"dgrad (graph API)",
        [&] {
          setup();
          return Prepared{.run = dgrad, .check = [&] { return checks(false); }};
        }},
       {"dgrad, then bn_backward with the ReLU mask recomputed from x (unfused)",
        [&] {
          setup();
          return Prepared{.run =
                              [&] {
                                dgrad();
                                const BnChannelState st = c.bnp.state();
                                bn_backward(backward_args(c.DX.get(), ReluMask::FromInput, nullptr, c.X.get(), &st,
                                                          c.dgamma.f32(), c.dbeta.f32(), c.DX.get()),
                                            c.in, kT, kL, c.scratch_in.f32(), lab.stream());
                              },
                          .check = [&] { return checks(true); }};
        }},
       {"DgradDreluDbn, then bn_apply for dx = eq_dy * g + eq_x * x + eq_b (fused)",
        [&] {
          poison();
          const FusedConv* f = &lab.fused(FusedPattern::DgradDreluDbn, c.G);
          return fused_version(
              lab, *f, false,
              [&, f] {
                const FusedArgs a{.x = c.X.get(),
                                  .w = c.w.d.get(),
                                  .dy = c.DY.get(),
                                  .mean = c.bnp.save_mean.f32(),
                                  .invstd = c.bnp.save_invstd.f32(),
                                  .gamma = c.bnp.gamma.f32(),
                                  .beta = c.bnp.beta.f32(),
                                  .g = c.DX.get(),
                                  .dgamma = c.dgamma.f32(),
                                  .dbeta = c.dbeta.f32(),
                                  .eq_dy = coef,
                                  .eq_x = coef + C,
                                  .eq_b = coef + 2 * C};
                f->run(lab.cudnn(), a, lab.workspace(), lab.workspace_bytes());
                bn_apply({c.DX.get(), coef, coef + 2 * C, Residual::BatchNorm, c.X.get(), coef + C, lab.zeros(), false,
                          c.DX.get()},
                         c.in, kT, kL, lab.stream());
              },
              [&] { return checks(true); });
        }}});
}

void conv_wgrad(Lab& lab, const LabConv& lc) {
  ConvCase c(lab, lc);
  Lazy<Vec> want(
      [&] { return ref::kcrs_to_krsc(c.G.k, c.G.c, c.G.r, c.G.r, ref::conv2d_backward_filter(c.cd, c.stored, c.dy)); });
  auto check = [&] { return std::vector<LabCheck>{check_vector("dw", c.DW, *want, kTolF16, c.repeats())}; };
  ConvLayer* conv = nullptr;
  auto wgrad = [&](const DeviceTensor& input) {
    conv->backward_filter(lab.cudnn(), input.get(), c.DY.get(), c.DW.get(), lab.workspace(), lab.workspace_bytes());
  };
  auto setup = [&] {
    conv = &lab.conv(c.G);
    lab.reserve_workspace(conv->workspace_bytes());
    c.DW.poison();
  };
  lab.measure(
      "conv-wgrad", c.shape(), "fp16 NHWC", 0,
      {{"wgrad (graph API) from the stored relu(bn(x))",
        [&] {
          setup();
          return Prepared{.run = [&] { wgrad(c.STORED); }, .check = check};
        }},
       {"bn_apply recomputing relu(bn(x)), then wgrad",
        [&] {
          setup();
          return Prepared{.run =
                              [&] {
                                bn_apply({c.X.get(), c.bnp.scale.f32(), c.bnp.shift.f32(), Residual::None, nullptr,
                                          nullptr, nullptr, true, c.TMP.get()},
                                         c.in, kT, kL, lab.stream());
                                wgrad(c.TMP);
                              },
                          .check = check};
        }},
       {"SbrWgrad (relu(bn(x)) recomputed as x is read; fused)", [&] {
          c.DW.poison();
          const FusedConv* f = &lab.fused(FusedPattern::SbrWgrad, c.G);
          return fused_version(
              lab, *f, true,
              [&, f] {
                const FusedArgs a{
                    .x = c.X.get(), .dy = c.DY.get(), .dw = c.DW.get(), .scale = c.scale_for(*f), .bias = c.bias_for(*f)};
                f->run(lab.cudnn(), a, lab.workspace(), lab.workspace_bytes());
              },
              check);
        }}});
}

}  // namespace

void measure_conv_operations(Lab& lab) {
  const std::vector<LabConv> convs = network_convs(lab.batch());
  const char* what[] = {
      "a conv and its output's BN statistics; unfused, also the BN applied where the next conv reads it (conv1, conv2), "
      "which the fused patterns leave to the next conv's read",
      "dx of x through a conv whose input was relu(bn(x)), its ReLU and that BN, with the BN's gamma and beta gradients",
      "the weight gradient of a conv whose input was relu(bn(x))"};
  void (*run_op[])(Lab&, const LabConv&) = {conv_forward, conv_dgrad, conv_wgrad};
  const char* ops[] = {"conv-forward", "conv-dgrad", "conv-wgrad"};
  for (int i = 0; i < 3; ++i) {
    if (!operation_selected(lab.opt, ops[i])) continue;
    lab.section(ops[i], what[i], "- (compute-bound: the time says it)");
    for (const LabConv& c : convs)
      if (conv_selected(lab.opt, c) && (i == 0 || has_prologue(c.role))) run_op[i](lab, c);
  }
}

}  // namespace lab
