// The batch-norm operations on their own (kernels/batchnorm_*.cu), in every format the ladder runs:
//   bn-stats     the batch statistics of x, and from them scale, shift and the running statistics
//   bn-apply     y = relu(x * scale + shift)
//   bn-backward  dx, dgamma and dbeta from dy and x through the BN and its ReLU (a block's inner BNs)
// To try a variant: write its kernel and launcher in this file, and add a LabVersion to the list of
// its operation below: a name and a prepare() returning its run and check (copy the one beside it).
#include "kernel_lab/bn_case.h"

namespace lab {

namespace {

using gpu_test::kTolF32;

void for_each_case(Lab& lab, const std::function<void(BnCase&)>& f) {
  for (const ChwShape& shape : lab.opt.shapes)
    for (const LabFormat& format : lab.opt.formats) {
      BnCase c(lab, shape, format);
      f(c);
    }
}

void bn_stats(Lab& lab) {
  lab.section("bn-stats", "batch mean and 1/std of each channel of x, with scale, shift and the running statistics",
              "x read once");
  for_each_case(lab, [&](BnCase& c) {
    const ref::BnStats want = ref::bn_batch_stats(c.d, c.x, double(kBnEps));
    const ref::BnCoefs coefs = ref::bn_train_coefs(want, c.h.gamma, c.h.beta);
    auto check = [&] {
      return std::vector<LabCheck>{check_vector("mean", c.bn.save_mean, want.mean, kTolF32),
                                   check_vector("invstd", c.bn.save_invstd, want.invstd, kTolF32),
                                   check_vector("scale", c.bn.scale, coefs.scale, kTolF32),
                                   check_vector("shift", c.bn.shift, coefs.shift, kTolF32)};
    };
    lab.measure("bn-stats", c.shape_text(), c.format_text(), c.tensor_bytes(),
                {{"bn_forward_train_stats: partial sums per chunk of rows, then finalize per channel", [&] {
                    BnCase::poison({&c.bn.save_mean, &c.bn.save_invstd, &c.bn.scale, &c.bn.shift});
                    return Prepared{.run = [&] {
                                      bn_forward_train_stats(c.X.get(), c.s, c.t, c.l, c.bn.state(), c.scratch.f32(),
                                                             lab.stream());
                                    },
                                    .check = check};
                  }}});
  });
}

void bn_apply_op(Lab& lab) {
  lab.section("bn-apply", "y = relu(x * scale + shift) with the scale and shift of a training forward",
              "x read, y written");
  for_each_case(lab, [&](BnCase& c) {
    const Vec want = ref::relu(ref::bn_affine(c.d, c.x, c.k));
    lab.measure("bn-apply", c.shape_text(), c.format_text(), 2 * c.tensor_bytes(),
                {{"bn_apply: one elementwise pass", [&] {
                    c.load_forward_state();
                    BnCase::poison({&c.Y});
                    return Prepared{.run = [&] {
                                      bn_apply({c.X.get(), c.bn.scale.f32(), c.bn.shift.f32(), Residual::None, nullptr,
                                                nullptr, nullptr, true, c.Y.get()},
                                               c.s, c.t, c.l, lab.stream());
                                    },
                                    .check = [&] { return std::vector<LabCheck>{c.check("y", c.Y, want)}; }};
                  }}});
  });
}

void bn_backward_op(Lab& lab) {
  lab.section("bn-backward",
              "dx, dgamma and dbeta from dy through relu(bn(x)) (the inner BNs of a block, without residual)",
              "dy and x read, dx written (the ReLU mask can be recomputed from x)");
  for_each_case(lab, [&](BnCase& c) {
    const Vec y_stored = gpu_test::bn_apply_as_gpu(c.d, c.x, c.k.scale, c.k.shift, c.t);  // the forward's output
    const ref::BnGrads want = ref::bn_backward(c.d, ref::relu_backward(c.dy, y_stored), c.x, c.h.gamma, c.st);
    auto version = [&](ReluMask mask) {
      return [&, mask] {
        c.load_forward_state();
        if (mask == ReluMask::FromOutput) c.Y = c.device(y_stored);
        BnCase::poison({&c.DX, &c.dgamma, &c.dbeta});
        return Prepared{.run = [&, mask] {
                          const BnChannelState st = c.bn.state();
                          const void* y = mask == ReluMask::FromOutput ? c.Y.get() : nullptr;
                          bn_backward(backward_args(c.DY.get(), mask, y, c.X.get(), &st, c.dgamma.f32(), c.dbeta.f32(),
                                                    c.DX.get()),
                                      c.s, c.t, c.l, c.scratch.f32(), lab.stream());
                        },
                        .check = [&] {
                          std::vector<LabCheck> out;
                          c.check_grads(out, "", c.DX, c.dgamma, c.dbeta, want);
                          return out;
                        }};
      };
    };
    lab.measure("bn-backward", c.shape_text(), c.format_text(), 3 * c.tensor_bytes(),
                {{"bn_backward, ReLU mask recomputed from x (ReluMask::FromInput)", version(ReluMask::FromInput)},
                 {"bn_backward, ReLU mask read from the stored y (ReluMask::FromOutput)",
                  version(ReluMask::FromOutput)}});
  });
}

}  // namespace

void measure_bn_operations(Lab& lab) {
  if (operation_selected(lab.opt, "bn-stats")) bn_stats(lab);
  if (operation_selected(lab.opt, "bn-apply")) bn_apply_op(lab);
  if (operation_selected(lab.opt, "bn-backward")) bn_backward_op(lab);
}

}  // namespace lab
