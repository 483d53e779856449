// The convolutions with the batch norms around them, fp16 NHWC (the format of the fused patterns),
// at every distinct conv of the network's blocks: the plain graph-API conv with our BN kernels
// against cuDNN's fused patterns (model/fused_conv.h), as the training network runs them
// (src/model/training_forward.cpp, training_backward.cpp).
//   conv-forward  the conv and the statistics of its output's BN; where the next conv reads that BN's
//                 output (conv1, conv2), unfused versions also apply it, fused ones leave it to the
//                 next conv, which applies it as it reads (so the rows of a block add up)
//   conv-dgrad    conv2 and conv3, whose input was relu(bn(x)) of the previous BN: dx of x through
//                 the conv, the ReLU and that BN, with the BN's gamma and beta gradients
//   conv-wgrad    conv2 and conv3: the weight gradient, from relu(bn(x)) stored, recomputed, or
//                 recomputed as the fused pattern reads x
// A pattern cuDNN refuses shows as refused, with its reason. To try a variant: add a LabVersion to
// its operation's list below.
#include <future>

#include "kernel_lab/cutlass_conv_stats.h"
#include "kernel_lab/cutlass_taps_conv.h"
#include "kernels/conv3x3.h"
#include "kernels/conv3x3_stride2.h"
#include "kernel_lab/lab.h"
#include "kernels/conv1x1_dgrad_bn.h"
#include "kernels/conv1x1_stats.h"

namespace lab {

namespace {

using gpu_test::DeviceBn;
using gpu_test::kTolF16;
constexpr DType kT = DType::F16;
constexpr Layout kL = Layout::NHWC;

bool has_prologue(ConvRole r) { return r == ConvRole::Spatial || r == ConvRole::Expand; }
// Whether the network stores relu(bn(y)) of this conv's output y for the next conv (unfused).
bool feeds_a_conv(ConvRole r) { return r == ConvRole::Reduce || r == ConvRole::Spatial; }

// One conv and the BNs around it at the check batch, as the CPU reference sees them. For conv2 and
// conv3 the conv's input is relu(x * s + b), x the previous BN's input and s, b its scale and shift;
// for conv1 and the shortcut it is x itself.
struct ConvInputs {
  const LabConv* conv;
  bool prologue;
  ref::ConvDims cd;
  ref::Dims din, dout;
  std::mt19937_64 rng;
  Vec x, s, b;             // s and b fp16 values: the fused pattern reads them exactly in either type
  ref::BnStats stp;        // the previous BN's statistics of x, as saved
  gpu_test::HostBn hp, h;  // the previous BN (gamma, beta such that its scale, shift are s, b) and this one's
  Vec stored;              // what the conv reads: relu(x * s + b) as bn_apply stores it, or x
  Vec w;                   // KCRS
  Vec dy;                  // the gradient of the conv's output

  ConvInputs(const LabConv& c, int n)
      : conv(&c),
        prologue(has_prologue(c.role)),
        cd(gpu_test::conv_dims({n, c.g.c, c.g.h, c.g.w, c.g.k, c.g.r, c.g.stride, c.g.pad})),
        din(cd.input()),
        dout(cd.output()),
        rng(gpu_test::named_rng("conv " + c.text())),
        x(gpu_test::quantize(kT, gpu_test::channel_data(rng, din, -1.0, 1.0))),
        s(gpu_test::quantize(kT, gpu_test::random_uniform(rng, c.g.c, 0.5, 1.5))),
        b(gpu_test::quantize(kT, gpu_test::random_normal(rng, c.g.c, 0.0, 0.5))),
        stp(gpu_test::saved_stats(din, x)),
        hp(previous_bn()),
        h(gpu_test::random_bn(rng, c.g.k)),
        stored(prologue ? gpu_test::bn_apply_as_gpu(din, x, s, b, kT) : x),
        w(gpu_test::random_filter(rng, c.g)),
        dy(gpu_test::quantize(kT, gpu_test::random_normal(rng, dout.count()))) {}

  // The previous BN's parameters: gamma = s / std and beta = b + mean * s, so that what the fused
  // dgrad recomputes from the statistics, (x - mean) * invstd * gamma + beta, is x * s + b.
  gpu_test::HostBn previous_bn() {
    gpu_test::HostBn p = gpu_test::random_bn(rng, din.c);
    for (int c = 0; c < din.c; ++c) {
      p.gamma[c] = gpu_test::quantize(DType::F32, s[c] / stp.invstd[c]);
      p.beta[c] = gpu_test::quantize(DType::F32, b[c] + stp.mean[c] * s[c]);
    }
    return p;
  }
};

// What the CPU reference computes for one operation (each fills its own fields).
struct ConvRefs {
  Vec y, ybn;             // conv-forward: the conv's output and relu(bn(y))
  ref::BnStats st;        //               y's batch statistics
  Vec dconv;              // conv-dgrad: the conv's data gradient, and through the ReLU and the previous BN
  ref::BnGrads grads;
  Vec dw;                 // conv-wgrad, KRSC
};
enum ConvOp { kForward, kDgrad, kWgrad };

ConvRefs references(const ConvInputs& in, ConvOp op) {
  ConvRefs r;
  if (op == kForward) {
    r.y = ref::conv2d_forward(in.cd, in.stored, in.w);
    r.st = ref::bn_batch_stats(in.dout, r.y, double(kBnEps));
    r.ybn = ref::relu(ref::bn_affine(in.dout, r.y, ref::bn_train_coefs(r.st, in.h.gamma, in.h.beta)));
  } else if (op == kDgrad) {
    r.dconv = ref::conv2d_backward_data(in.cd, in.dy, in.w);
    r.grads = ref::bn_backward(in.din, ref::relu_backward(r.dconv, in.stored), in.x, in.hp.gamma, in.stp);
  } else {
    const ConvGeometry& g = in.conv->g;
    r.dw = ref::kcrs_to_krsc(g.k, g.c, g.r, g.r, ref::conv2d_backward_filter(in.cd, in.stored, in.dy));
  }
  return r;
}

// The same conv on the device at the timed batch (its inputs repeated), with the outputs the versions
// write, and the references of the operation, computed on another thread meanwhile.
struct ConvCase {
  const ConvInputs& in;
  std::shared_future<ConvRefs> refs;
  ConvGeometry G;
  Shape4 sin, sout;
  DeviceTensor X, STORED, DY, W, Y, YBN, DX, TMP, DW, sum, sqsum, s_h, b_h, scale_h_out, shift_h_out, dgamma, dbeta;
  DeviceBn bn, bnp;
  DeviceTensor scratch_in, scratch_out;

  ConvCase(const Lab& lab, const ConvInputs& inputs, std::shared_future<ConvRefs> r)
      : in(inputs),
        refs(std::move(r)),
        G(inputs.conv->g),
        sin(G.input()),
        sout(G.output()),
        X(repeated(in.x, in.din, lab.repeats(), kT, kL)),
        STORED(repeated(in.stored, in.din, lab.repeats(), kT, kL)),
        DY(repeated(in.dy, in.dout, lab.repeats(), kT, kL)),
        W(gpu_test::device_filter(G, in.w)),
        Y(sout.count(), kT, "conv output"),
        YBN(sout.count(), kT, "BN output"),
        DX(sin.count(), kT, "conv input gradient"),
        TMP(sin.count(), kT, "recomputed BN output"),
        DW(G.filter_count(), kT, "filter gradient"),
        sum(G.k, DType::F32),
        sqsum(G.k, DType::F32),
        s_h(in.s, DType::F16, "fp16 scale"),
        b_h(in.b, DType::F16, "fp16 shift"),
        scale_h_out(G.k, DType::F16, "fp16 scale"),
        shift_h_out(G.k, DType::F16, "fp16 shift"),
        dgamma(G.c, DType::F32),
        dbeta(G.c, DType::F32),
        bn(in.h),
        bnp(in.hp),
        scratch_in(gpu_test::bn_scratch(sin, kT, kL)),
        scratch_out(gpu_test::bn_scratch(sout, kT, kL)) {
    bnp.save_mean.upload(in.stp.mean);
    bnp.save_invstd.upload(in.stp.invstd);
    bnp.scale.upload(in.s);
    bnp.shift.upload(in.b);
  }

  const ConvRefs& want() const { return refs.get(); }
  // The graph-API conv of this shape, the workspace reserved for it.
  ConvLayer& plain_conv(Lab& lab) const {
    ConvLayer& conv = lab.conv(G);
    lab.reserve_workspace(conv.workspace_bytes());
    return conv;
  }
  int repeats() const { return sin.n / in.din.n; }
  std::string shape() const { return in.conv->text(); }
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

// A version that runs a fused pattern: refused where cuDNN refused it. `kept_zero`: what the run
// leaves zero (the statistics, after bn_finalize_sums).
Prepared fused_version(Lab& lab, const FusedConv& f, bool prologue, std::function<void()> run,
                       std::function<std::vector<LabCheck>()> check, std::vector<ZeroedRange> kept_zero = {}) {
  if (!f.ok()) return {.refused = f.why()};
  lab.reserve_workspace(f.workspace());
  return {.run = std::move(run), .check = std::move(check), .note = note_of(f, prologue),
          .kept_zero = std::move(kept_zero)};
}

// The BN finalize after one of our convs with statistics: `rows` rows of `row_len` partial sums
// into conv c's batch statistics and the fp16 scale and shift of its output's BN.
void finalize_partials(Lab& lab, ConvCase& c, const float* partials, int rows, int row_len) {
  bn_finalize_partials(partials, rows, row_len, c.sout.per_channel(), c.bn.state(), c.G.k, c.scale_h_out.get(),
                       c.shift_h_out.get(), lab.stream());
}

// A CUTLASS GEMM of ours (kernel_lab/cutlass_conv_stats.h), then, with the statistics, the BN's
// finalize from the rows of per-tile partials (bn_finalize_partials), as bn_finalize_sums follows
// ConvStats. A build with the prologue reads x and the previous BN's fp16 scale and shift, as
// SbrConvStats does; one without reads what the network stores for a conv without it.
LabVersion cutlass_version(Lab& lab, ConvCase& c, CutlassKernel kernel, std::function<void()> poison,
                           std::function<std::vector<LabCheck>(bool, bool)> checks) {
  const std::string build = cutlass_kernel_text(kernel);
  const std::string name = kernel.stats
                               ? "CUTLASS GEMM + statistics per tile (ours; " + build + "), then bn_finalize_partials"
                               : "CUTLASS GEMM alone (ours, no statistics; " + build + ")";
  return {name, [&lab, &c, kernel, poison, checks] {
            poison();
            const int m = c.sout.n * c.sout.h * c.sout.w;
            const bool one_gemm = c.G.r == 1 && c.G.stride == 1 && c.G.pad == 0;
            const std::string why = !one_gemm ? "not a 1x1 stride-1 conv (not one GEMM)"
                                              : cutlass_conv_stats_refusal(kernel, m, c.G.k, c.G.c);
            if (!why.empty()) return Prepared{.refused = why};
            const size_t ws = cutlass_conv_stats_workspace(kernel, m, c.G.k, c.G.c);
            lab.reserve_workspace(ws);
            return Prepared{.run =
                                [&lab, &c, kernel, m, ws] {
                                  const bool pro = kernel.prologue;
                                  const CutlassConvStats a{pro ? c.X.get() : c.STORED.get(),
                                                           c.W.get(),
                                                           c.Y.get(),
                                                           m,
                                                           c.G.k,
                                                           c.G.c,
                                                           lab.workspace(),
                                                           ws,
                                                           pro ? c.s_h.get() : nullptr,
                                                           pro ? c.b_h.get() : nullptr};
                                  cutlass_conv_stats(kernel, a, lab.stream());
                                  if (!kernel.stats) return;
                                  const CutlassPartials p = cutlass_partials_layout(kernel, m, c.G.k);
                                  finalize_partials(lab, c, static_cast<const float*>(lab.workspace()), p.rows,
                                                    p.row_len);
                                },
                            .check = [checks, kernel] { return checks(kernel.stats, false); }};
          }};
}

// Our resident kernel as a 3x3 conv, x's taps loaded by TMA (kernel_lab/cutlass_taps_conv.h), as the
// graph-API conv alone reads it; with the statistics, then bn_finalize_partials (as cutlass_version).
LabVersion taps_version(Lab& lab, ConvCase& c, bool stats, std::function<void()> poison,
                        std::function<std::vector<LabCheck>(bool, bool)> checks) {
  const std::string name = std::string("our resident conv, x's 9 taps by TMA (lab only; cooperative, 128x64 tiles)") +
                           (stats ? " + statistics, then bn_finalize_partials" : " alone");
  return {name, [&lab, &c, stats, poison, checks] {
            poison();
            if (const std::string why = taps_conv_refusal(c.G); !why.empty()) return Prepared{.refused = why};
            const int m = c.sout.n * c.sout.h * c.sout.w;
            const size_t ws = stats ? conv1x1_partials_bytes(m, c.G.k) : 0;
            lab.reserve_workspace(ws);
            return Prepared{.run =
                                [&lab, &c, stats, m] {
                                  float* partials = stats ? static_cast<float*>(lab.workspace()) : nullptr;
                                  taps_conv(c.G, c.STORED.get(), c.W.get(), c.Y.get(), partials, lab.stream());
                                  if (!stats) return;
                                  finalize_partials(lab, c, partials, conv1x1_partial_rows(m, c.G.k), c.G.k);
                                },
                            .check = [checks, stats] { return checks(stats, false); }};
          }};
}

// Conv c as kernels/conv3x3.h takes it into `s`, and "" where it runs it here, else why not.
std::string halo_refusal(const ConvCase& c, Conv3x3Shape& s) {
  if (c.G.r != 3 || c.G.stride != 1 || c.G.pad != 1) return "not a 3x3 stride-1 conv with a pad of 1";
  s = {c.G.n, c.G.h, c.G.w, c.G.c, c.G.k};
  return conv3x3_refusal(s);
}

// The trainer's 3x3 conv of layer1 (kernels/conv3x3.h: x loaded once for 3 taps with a row above and
// below, the filter held in shared memory), alone or with the statistics, then bn_finalize_partials.
LabVersion halo_version(Lab& lab, ConvCase& c, bool stats, std::function<void()> poison,
                        std::function<std::vector<LabCheck>(bool, bool)> checks) {
  const std::string name = std::string("our 3x3 conv (kernels/conv3x3.h: x once for 3 taps, the filter held)") +
                           (stats ? " + statistics, then bn_finalize_partials" : " alone");
  return {name, [&lab, &c, stats, poison, checks] {
            poison();
            Conv3x3Shape s{};
            if (const std::string why = halo_refusal(c, s); !why.empty()) return Prepared{.refused = why};
            lab.reserve_workspace(stats ? conv3x3_partials_bytes(s) : 0);
            return Prepared{.run =
                                [&lab, &c, stats, s] {
                                  float* partials = stats ? static_cast<float*>(lab.workspace()) : nullptr;
                                  conv3x3_stats({.x = c.STORED.get(), .w = c.W.get(), .y = c.Y.get(), .s = s,
                                                 .partials = partials},
                                                lab.stream());
                                  if (!stats) return;
                                  finalize_partials(lab, c, partials, conv3x3_partial_rows(s), c.G.k);
                                },
                            .check = [checks, stats] { return checks(stats, false); }};
          }};
}

void conv_forward(Lab& lab, ConvCase& c) {
  const bool applies = feeds_a_conv(c.in.conv->role);
  auto checks = [&](bool with_stats, bool with_apply) {
    const ConvRefs& want = c.want();
    std::vector<LabCheck> out{c.check("y", c.Y, want.y, c.in.dout)};
    if (with_stats) {
      out.push_back(check_vector("mean", c.bn.save_mean, want.st.mean, kTolF16));
      out.push_back(check_vector("invstd", c.bn.save_invstd, want.st.invstd, kTolF16));
    }
    if (with_apply) out.push_back(c.check("y_bn", c.YBN, want.ybn, c.in.dout));
    return out;
  };
  ConvLayer* conv = nullptr;
  auto plain = [&] {
    conv->forward(lab.cudnn(), c.STORED.get(), c.W.get(), c.Y.get(), lab.workspace(), lab.workspace_bytes());
  };
  auto poison = [&] {
    // The sums too: a version that left them unwritten would otherwise pass on another's.
    for (DeviceTensor* t : {&c.Y, &c.YBN, &c.bn.save_mean, &c.bn.save_invstd, &c.sum, &c.sqsum}) t->poison();
  };
  auto setup = [&] {
    conv = &c.plain_conv(lab);
    poison();
  };
  const FusedPattern pattern = c.in.prologue ? FusedPattern::SbrConvStats : FusedPattern::ConvStats;
  std::vector<LabVersion> versions{
      {c.in.prologue ? "conv (graph API), reading the stored relu(bn(x)) of the previous BN" : "conv (graph API)",
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
                                bn_forward_train_stats(c.Y.get(), c.sout, kT, kL, c.bn.state(), c.scratch_out.f32(),
                                                       lab.stream());
                                if (applies)
                                  bn_apply({c.Y.get(), c.bn.scale.f32(), c.bn.shift.f32(), Residual::None, nullptr,
                                            nullptr, nullptr, true, c.YBN.get()},
                                           c.sout, kT, kL, lab.stream());
                              },
                          .check = [&] { return checks(true, applies); }};
        }},
       {c.in.prologue ? "SbrConvStats (the previous BN applied as x is read), then bn_finalize_sums (fused)"
                   : "ConvStats, then bn_finalize_sums (fused)",
        [&] {
          poison();
          const FusedConv* f = &lab.fused(pattern, c.G);
          return fused_version(
              lab, *f, c.in.prologue,
              [&, f] {
                const FusedArgs a{.x = c.in.prologue ? c.X.get() : c.STORED.get(),
                                  .w = c.W.get(),
                                  .y = c.Y.get(),
                                  .scale = c.in.prologue ? c.scale_for(*f) : nullptr,
                                  .bias = c.in.prologue ? c.bias_for(*f) : nullptr,
                                  .sum = c.sum.f32(),
                                  .sqsum = c.sqsum.f32()};
                f->run(lab.cudnn(), a, lab.workspace(), lab.workspace_bytes());
                // Also this BN's scale and shift in fp16, as the network does for a next pattern that reads them so.
                bn_finalize_sums(c.sum.f32(), c.sqsum.f32(), c.sout.per_channel(), c.bn.state(), c.G.k,
                                 c.scale_h_out.get(), c.shift_h_out.get(), lab.stream());
              },
              [&] { return checks(true, false); },
              {{c.sum.get(), c.sum.count() * sizeof(float)}, {c.sqsum.get(), c.sqsum.count() * sizeof(float)}});
        }}};
  // Kernels of our own for the convs that are one GEMM (1x1, stride 1): CUTLASS's Hopper GEMM, the
  // statistics reduced in its epilogue (kernel_lab/cutlass_conv_stats.h); the builds with the
  // previous BN's prologue where the fused pattern is SbrConvStats, the others where it is ConvStats.
  for (const CutlassKernel& k : cutlass_kernels())
    if (k.prologue == c.in.prologue) versions.push_back(cutlass_version(lab, c, k, poison, checks));
  // Our kernel as a 3x3 conv, where the conv is one (3x3, stride 1, pad 1).
  if (c.G.r == 3 && c.G.stride == 1)
    for (bool stats : {false, true}) versions.push_back(taps_version(lab, c, stats, poison, checks));
  for (bool stats : {false, true}) versions.push_back(halo_version(lab, c, stats, poison, checks));
  lab.measure("conv-forward", c.shape(), "fp16 NHWC", 0, versions);
}

// The data gradient of a 3x3 stride-1 conv with a pad of 1 is itself such a conv: of dy, by the
// filter turned (taps 2 - r, 2 - s) with its channels swapped, w'[c][r][s][k] = w[k][2-r][2-s][c].
// Our taps kernel runs it (kernel_lab/cutlass_taps_conv.h), the turned filter made once here (the
// trainer would make it after each step's update: 73 KB at layer1).
LabVersion taps_dgrad_version(Lab& lab, ConvCase& c, std::function<void()> poison,
                              std::function<std::vector<LabCheck>()> check) {
  const std::string name =
      "our resident conv as the data gradient, dy's 9 taps by TMA, the filter turned (lab only; cooperative)";
  return {name, [&lab, &c, poison, check] {
            poison();
            const ConvGeometry& g = c.G;
            const ConvGeometry turned{g.n, g.k, g.out_h(), g.out_w(), g.c, g.r, g.stride, g.pad};
            // The turned conv has g's filter size, stride and pad: its refusal covers g's shape too.
            if (const std::string why = taps_conv_refusal(turned); !why.empty()) return Prepared{.refused = why};
            Vec w(c.in.w.size());  // KCRS, turned: [c][k][r][s] = w[k][c][2-r][2-s]
            for (int k = 0; k < g.k; ++k)
              for (int ch = 0; ch < g.c; ++ch)
                for (int r = 0; r < 3; ++r)
                  for (int s = 0; s < 3; ++s)
                    w[((size_t(ch) * g.k + k) * 3 + r) * 3 + s] = c.in.w[((size_t(k) * g.c + ch) * 3 + (2 - r)) * 3 + (2 - s)];
            auto turned_w = std::make_shared<DeviceTensor>(gpu_test::device_filter(turned, w));
            return Prepared{.run =
                                [&lab, &c, turned, turned_w] {
                                  taps_conv(turned, c.DY.get(), turned_w->get(), c.DX.get(), nullptr, lab.stream());
                                },
                            .check = check};
          }};
}

// The trainer's data gradient of layer1's 3x3 conv with the previous BN + ReLU's backward sums
// (kernels/conv3x3.h: dy once for 3 taps, the turned filter held; the mask fp16 x * scale + shift > 0),
// or with `stride2` that of layers 2-4's stride-2 3x3 by the parity of dx's pixels
// (kernels/conv3x3_stride2.h), then bn_backward_from_sums: what DgradDreluDbn and bn_apply do. The
// filter is turned (or put in the phases' order) once here.
LabVersion our_3x3_dgrad_version(Lab& lab, ConvCase& c, bool stride2, std::function<void()> poison,
                                 std::function<std::vector<LabCheck>()> check) {
  const std::string name =
      stride2 ? "our stride-2 3x3 data gradient by parity + ReLU and BN backward sums (kernels/conv3x3_stride2.h), "
                "then bn_backward_from_sums"
              : "our 3x3 data gradient + ReLU and BN backward sums (kernels/conv3x3.h), then bn_backward_from_sums";
  return {name, [&lab, &c, stride2, poison, check] {
            poison();
            Conv3x3Shape s{};
            if (stride2) {
              if (c.G.r != 3 || c.G.stride != 2 || c.G.pad != 1) return Prepared{.refused = "not a 3x3 stride-2 conv with a pad of 1"};
              s = {c.G.n, c.G.h, c.G.w, c.G.c, c.G.k};
              if (const std::string why = conv3x3_stride2_dgrad_refusal(s); !why.empty()) return Prepared{.refused = why};
            } else if (const std::string why = halo_refusal(c, s); !why.empty()) {
              return Prepared{.refused = why};
            }
            auto turned = std::make_shared<DeviceTensor>(c.W.count(), DType::F16, "the data gradient's filter");
            if (stride2)
              conv3x3_stride2_phase_filter(c.W.get(), turned->get(), s, lab.stream());
            else
              conv3x3_turn_filter(c.W.get(), turned->get(), s, lab.stream());
            lab.reserve_workspace(stride2 ? conv3x3_stride2_dgrad_partials_bytes(s) : conv3x3_partials_bytes(s));
            return Prepared{.run =
                                [&lab, &c, s, turned, stride2] {
                                  float* partials = static_cast<float*>(lab.workspace());
                                  const Conv3x3DgradBn a{.dy = c.DY.get(), .turned = turned->get(), .dz = c.DX.get(),
                                                         .x = c.X.get(), .mean = c.bnp.save_mean.f32(),
                                                         .invstd = c.bnp.save_invstd.f32(), .scale = c.s_h.get(),
                                                         .shift = c.b_h.get(), .partials = partials, .s = s};
                                  if (stride2)
                                    conv3x3_stride2_dgrad_bn(a, lab.stream());
                                  else
                                    conv3x3_dgrad_bn(a, lab.stream());
                                  const BnChannelState st = c.bnp.state();
                                  bn_backward_from_sums({.dy = c.DX.get(), .x = c.X.get(), .bn = &st,
                                                         .dgamma = c.dgamma.f32(), .dbeta = c.dbeta.f32(),
                                                         .dx = c.DX.get()},
                                                        partials,
                                                        stride2 ? conv3x3_stride2_dgrad_partial_rows(s)
                                                                : conv3x3_dgrad_partial_rows(s),
                                                        c.sin, kT, kL, lab.stream());
                                },
                            .check = check};
          }};
}

// The trainer's data gradient of a 1x1 conv whose input was relu(bn(x)), with the ReLU and BN backward
// sums (kernels/conv1x1_dgrad_bn.h), then bn_backward_from_sums: dy as stored, on the trainer's
// cooperative schedule and on ping-pong (Conv1x1DgradBn::schedule); with the weight gradient's parts
// beside (layer1's conv3, 256 output channels); and with dy made from the join as it is read
// (own-join-apply), here dz = dy, a3 = 0 and the coefficients (1, 0, 0), so that dy is the same and
// the reference holds, while the kernel loads both tiles and makes dy in each stage.
enum class Own1x1 { Stored, StoredPingPong, WithDw, FromJoin };
LabVersion own1x1_dgrad_version(Lab& lab, ConvCase& c, Own1x1 mode, std::function<void()> poison,
                                std::function<std::vector<LabCheck>()> check) {
  const char* how = mode == Own1x1::Stored           ? "dy stored"
                    : mode == Own1x1::StoredPingPong ? "dy stored, the ping-pong schedule"
                    : mode == Own1x1::WithDw         ? "dy stored, dw's parts beside"
                                              : "dy made from the join's dz and a3 as read, dw's parts beside";
  const std::string name = std::string("our 1x1 data gradient + ReLU and BN backward sums (") + how +
                           "), then bn_backward_from_sums";
  return {name, [&lab, &c, mode, poison, check] {
            poison();
            const ConvGeometry& g = c.G;
            const int m = g.n * g.h * g.w;
            if (g.r != 1 || g.stride != 1 || g.pad != 0) return Prepared{.refused = "not a 1x1 stride-1 conv"};
            const bool dw = mode == Own1x1::WithDw || mode == Own1x1::FromJoin;
            if (const std::string why = dw ? conv1x1_dgrad_bn_dw_refusal(m, g.k, g.c) : conv1x1_dgrad_bn_refusal(m, g.k, g.c);
                !why.empty())
              return Prepared{.refused = why};
            auto parts = std::make_shared<DeviceTensor>(dw ? conv1x1_dw_partials_bytes(m, g.k, g.c) / 4 : 1, DType::F32,
                                                        "dw parts");
            auto a3 = std::make_shared<DeviceTensor>(mode == Own1x1::FromJoin ? size_t(m) * g.k : 8, kT, "a3 (zeros)");
            Vec identity(3 * size_t(g.k), 0.0);  // dy = 1 * dz + 0 * a3 + 0
            for (int j = 0; j < g.k; ++j) identity[j] = 1.0;
            auto coef = std::make_shared<DeviceTensor>(identity, DType::F32);
            CUDA_CHECK(cudaMemset(a3->get(), 0, a3->count() * dtype_size(kT)));
            lab.reserve_workspace(conv1x1_dgrad_bn_partials_bytes(m, g.c));
            return Prepared{.run =
                                [&lab, &c, mode, dw, m, parts, a3, coef] {
                                  const ConvGeometry& g = c.G;
                                  float* partials = static_cast<float*>(lab.workspace());
                                  Conv1x1DgradBn a{.dy = c.DY.get(), .w = c.W.get(), .dz = c.DX.get(), .x = c.X.get(),
                                                   .mean = c.bnp.save_mean.f32(), .invstd = c.bnp.save_invstd.f32(),
                                                   .scale = c.s_h.get(), .shift = c.b_h.get(), .partials = partials,
                                                   .m = m, .k = g.k, .c = g.c};
                                  if (dw) a.dw_partials = parts->f32();
                                  if (mode == Own1x1::StoredPingPong) a.schedule = Conv1x1Schedule::PingPong;
                                  if (mode == Own1x1::FromJoin) a.dy_x = a3->get(), a.dy_coef = coef->f32();
                                  conv1x1_dgrad_bn(a, lab.stream());
                                  const BnChannelState st = c.bnp.state();
                                  bn_backward_from_sums({.dy = c.DX.get(), .x = c.X.get(), .bn = &st,
                                                         .dgamma = c.dgamma.f32(), .dbeta = c.dbeta.f32(),
                                                         .dx = c.DX.get()},
                                                        partials, conv1x1_dgrad_bn_rows(m, g.c), c.sin, kT, kL,
                                                        lab.stream());
                                },
                            .check = check};
          }};
}

void conv_dgrad(Lab& lab, ConvCase& c) {
  auto checks = [&](bool through_bn) {
    const ConvRefs& want = c.want();
    if (!through_bn) return std::vector<LabCheck>{c.check("dx", c.DX, want.dconv, c.in.din)};
    return std::vector<LabCheck>{c.check("dx", c.DX, want.grads.dx, c.in.din),
                                 check_vector("dgamma", c.dgamma, want.grads.dgamma, kTolF16, c.repeats()),
                                 check_vector("dbeta", c.dbeta, want.grads.dbeta, kTolF16, c.repeats())};
  };
  ConvLayer* conv = nullptr;
  auto dgrad = [&] {
    conv->backward_data(lab.cudnn(), c.DY.get(), c.W.get(), c.DX.get(), lab.workspace(), lab.workspace_bytes());
  };
  auto poison = [&] {
    for (DeviceTensor* t : {&c.DX, &c.dgamma, &c.dbeta}) t->poison();
  };
  auto setup = [&] {
    conv = &c.plain_conv(lab);
    poison();
  };
  float* coef = c.bnp.bwd_coef.f32();  // dx = coef[c] * g + coef[C + c] * x + coef[2C + c]
  const int C = c.G.c;
  std::vector<LabVersion> versions{
       {"dgrad (graph API)",
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
                                            c.sin, kT, kL, c.scratch_in.f32(), lab.stream());
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
                                  .w = c.W.get(),
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
                         c.sin, kT, kL, lab.stream());
              },
              [&] { return checks(true); });
        }}};
  // Our kernel as the data gradient of a 3x3 stride-1 conv.
  versions.push_back(taps_dgrad_version(lab, c, poison, [&] { return checks(false); }));
  for (bool stride2 : {false, true})
    versions.push_back(our_3x3_dgrad_version(lab, c, stride2, poison, [&] { return checks(true); }));
  // Our 1x1 kernel, with and without the weight gradient and dy from the join.
  for (Own1x1 mode : {Own1x1::Stored, Own1x1::StoredPingPong, Own1x1::WithDw, Own1x1::FromJoin})
    versions.push_back(own1x1_dgrad_version(lab, c, mode, poison, [&] { return checks(true); }));
  lab.measure("conv-dgrad", c.shape(), "fp16 NHWC", 0, versions);
}

void conv_wgrad(Lab& lab, ConvCase& c) {
  auto check = [&] { return std::vector<LabCheck>{check_vector("dw", c.DW, c.want().dw, kTolF16, c.repeats())}; };
  ConvLayer* conv = nullptr;
  auto wgrad = [&](const DeviceTensor& input) {
    conv->backward_filter(lab.cudnn(), input.get(), c.DY.get(), c.DW.get(), lab.workspace(), lab.workspace_bytes());
  };
  auto setup = [&] {
    conv = &c.plain_conv(lab);
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
                                         c.sin, kT, kL, lab.stream());
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
  const char* ops[] = {"conv-forward", "conv-dgrad", "conv-wgrad"};
  const char* what[] = {
      "a conv and its output's BN statistics; unfused, also the BN applied where the next conv reads it (conv1, conv2), "
      "which the fused patterns leave to the next conv's read",
      "dx of x through a conv whose input was relu(bn(x)), its ReLU and that BN, with the BN's gamma and beta gradients",
      "the weight gradient of a conv whose input was relu(bn(x))"};
  void (*measure[])(Lab&, ConvCase&) = {conv_forward, conv_dgrad, conv_wgrad};
  const std::vector<LabConv> convs = network_convs(lab.batch());
  for (int op = kForward; op <= kWgrad; ++op) {
    if (!operation_selected(lab.opt, ops[op])) continue;
    lab.section(ops[op], what[op], "- (compute-bound: the time says it)");
    // The inputs of every conv first, then their references on as many threads (a few hundred ms of
    // double arithmetic each, done while the GPU measures).
    std::vector<ConvInputs> inputs;
    for (const LabConv& c : convs)
      if (conv_selected(lab.opt, c) && (op == kForward || has_prologue(c.role)))
        inputs.emplace_back(c, lab.opt.check_batch);
    std::vector<std::shared_future<ConvRefs>> refs;
    for (const ConvInputs& in : inputs)
      refs.push_back(lab.opt.check ? std::async(std::launch::async, references, std::cref(in), ConvOp(op)).share()
                                   : std::shared_future<ConvRefs>());
    for (size_t i = 0; i < inputs.size(); ++i) {
      ConvCase c(lab, inputs[i], refs[i]);
      measure[op](lab, c);
    }
  }
}

}  // namespace lab
