// The residual join of a bottleneck block (kernels/batchnorm_apply.cu and batchnorm_backward.cu),
// at the block outputs, in every format the ladder runs. x is conv3's output with its BN (bn); x2
// is either the projection shortcut's conv output with its own BN (bn2) or, at an identity join,
// the block input itself:
//   join-projection-forward   y = relu(bn(x) + bn2(x2))
//   join-identity-forward     y = relu(bn(x) + x2)
//   join-projection-backward  dx, dx2 and both BNs' gamma/beta gradients from dy and the stored y
//   join-identity-backward    dx, bn's gamma/beta gradients and dres = dy * (y > 0), the gradient
//                             that flows down the identity shortcut
// To try a variant: write it in this file and add a LabVersion to its operation's list below.
#include "kernel_lab/bn_case.h"

namespace lab {

namespace {

void for_each_join(Lab& lab, const std::function<void(BnCase&)>& f) {
  const std::vector<ChwShape> joins = network_join_shapes();
  for (const ChwShape& shape : lab.opt.shapes) {
    if (std::find(joins.begin(), joins.end(), shape) == joins.end()) continue;  // no join has it
    for (const LabFormat& format : lab.opt.formats) {
      BnCase c(lab, shape, format);
      f(c);
    }
  }
}

ApplyArgs apply(const BnCase& c, Residual r, const void* res, void* y) {
  return {c.X.get(), c.bn.scale.f32(), c.bn.shift.f32(), r, res, c.bn2.scale.f32(), c.bn2.shift.f32(), true, y};
}

void join_forward(Lab& lab, bool projection) {
  const std::string op = projection ? "join-projection-forward" : "join-identity-forward";
  lab.section(op, projection ? "y = relu(bn(x) + bn2(x2)), both BNs' scale and shift given"
                             : "y = relu(bn(x) + x2), the BN's scale and shift given",
              "x and x2 read, y written");
  for_each_join(lab, [&](BnCase& c) {
    const Vec branch = projection ? ref::bn_affine(c.d, c.x2, c.k2) : c.x2;
    const Vec want = ref::relu(ref::add(ref::bn_affine(c.d, c.x, c.k), branch));
    auto prepared = [&](std::function<void()> run) {
      c.load_forward_state();
      BnCase::poison({&c.Y, &c.Y2});
      return Prepared{.run = std::move(run), .check = [&] { return std::vector<LabCheck>{c.check("y", c.Y, want)}; }};
    };
    std::vector<LabVersion> versions;
    if (projection) {
      versions = {
          {"bn_apply, the shortcut's BN applied as x2 is read (Residual::BatchNorm): one pass",
           [&] {
             return prepared([&] {
               bn_apply(apply(c, Residual::BatchNorm, c.X2.get(), c.Y.get()), c.s, c.t, c.l, lab.stream());
             });
           }},
          {"bn_apply of the shortcut's BN stored, then bn_apply + tensor residual: two passes",
           [&] {
             return prepared([&] {
               bn_apply({c.X2.get(), c.bn2.scale.f32(), c.bn2.shift.f32(), Residual::None, nullptr, nullptr, nullptr,
                         false, c.Y2.get()},
                        c.s, c.t, c.l, lab.stream());
               bn_apply(apply(c, Residual::Tensor, c.Y2.get(), c.Y.get()), c.s, c.t, c.l, lab.stream());
             });
           }}};
    } else {
      versions = {{"bn_apply + tensor residual (Residual::Tensor)", [&] {
                     return prepared([&] {
                       bn_apply(apply(c, Residual::Tensor, c.X2.get(), c.Y.get()), c.s, c.t, c.l, lab.stream());
                     });
                   }}};
    }
    lab.measure(op, c.shape_text(), c.format_text(), 3 * c.tensor_bytes(), versions);
  });
}

// The backward of bn at the join: from dy, its ReLU mask from the stored y.
BnBackwardArgs join_args(BnCase& c, const BnChannelState* st) {
  return backward_args(c.DY.get(), ReluMask::FromOutput, c.Y.get(), c.X.get(), st, c.dgamma.f32(), c.dbeta.f32(),
                       c.DX.get());
}

// The projection shortcut's BN (bn2, fed x2) as the second BN of a join's backward.
void add_second_bn(BnBackwardArgs& a, BnCase& c, const BnChannelState* st2) {
  a.x2 = c.X2.get();
  a.bn2 = st2;
  a.dgamma2 = c.dgamma2.f32();
  a.dbeta2 = c.dbeta2.f32();
  a.dx2 = c.DX2.get();
}

// The join's backward as the network runs it (model/training_backward.cpp): the ReLU mask from the
// bits the forward kernel wrote, and dy in two parts, summed as they are read, dz left in dy's
// buffer (the identity shortcut's gradient). Here the second part is zero and dy's buffer is DRES,
// a copy of dy: a run leaves dz there, and the next run, masking dz again, computes the same.
struct NetworkForm {
  DeviceBuffer bits;
  NetworkForm(BnCase& c, bool projection, cudaStream_t stream) : bits(relu_bits_bytes(c.s, c.t), "lab ReLU bits") {
    ApplyArgs a = apply(c, projection ? Residual::BatchNorm : Residual::Tensor, c.X2.get(), c.Y2.get());
    a.relu_bits = bits.as<uint8_t>();
    bn_apply(a, c.s, c.t, c.l, stream);
    CUDA_CHECK(cudaMemcpyAsync(c.DRES.get(), c.DY.get(), c.tensor_bytes(), cudaMemcpyDeviceToDevice, stream));
    CUDA_CHECK(cudaMemsetAsync(c.Y2.get(), 0, c.tensor_bytes(), stream));  // the second part
    CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  BnBackwardArgs args(BnCase& c, const BnChannelState* st) const {
    BnBackwardArgs a = backward_args(c.DRES.get(), ReluMask::FromBits, nullptr, c.X.get(), st, c.dgamma.f32(),
                                     c.dbeta.f32(), c.DX.get());
    a.dy2 = c.Y2.get();
    a.relu_bits = bits.as<uint8_t>();
    return a;
  }
};

void join_backward(Lab& lab, bool projection) {
  const std::string op = projection ? "join-projection-backward" : "join-identity-backward";
  lab.section(op,
              projection ? "dx, dx2 and both BNs' gamma and beta gradients from dy through relu(bn(x) + bn2(x2))"
                         : "dx, the BN's gamma and beta gradients and dres = dy * (y > 0) through relu(bn(x) + x2)",
              projection ? "dy, y (the ReLU mask), x and x2 read, dx and dx2 written"
                         : "dy, y (the ReLU mask) and x read, dx and dres written");
  for_each_join(lab, [&](BnCase& c) {
    const Vec branch = projection ? ref::bn_affine(c.d, c.x2, c.k2) : c.x2;
    const Vec y = gpu_test::quantize(c.t, ref::relu(ref::add(ref::bn_affine(c.d, c.x, c.k), branch)));
    const Vec dz = ref::relu_backward(c.dy, y);
    const ref::BnGrads want = ref::bn_backward(c.d, dz, c.x, c.h.gamma, c.st);
    const ref::BnGrads want2 = projection ? ref::bn_backward(c.d, dz, c.x2, c.h2.gamma, c.st2) : ref::BnGrads{};
    auto prepared = [&](std::function<void()> run) {
      c.load_forward_state();
      c.Y = c.device(y);
      BnCase::poison({&c.DX, &c.DX2, &c.DRES, &c.dgamma, &c.dbeta, &c.dgamma2, &c.dbeta2});
      return Prepared{.run = std::move(run), .check = [&] {
                        std::vector<LabCheck> out;
                        c.check_grads(out, "", c.DX, c.dgamma, c.dbeta, want);
                        if (projection) c.check_grads(out, "2", c.DX2, c.dgamma2, c.dbeta2, want2);
                        else out.push_back(c.check("dres", c.DRES, dz));
                        return out;
                      }};
    };
    std::shared_ptr<NetworkForm> form;  // the network's inputs, made after the outputs are poisoned
    const LabVersion network_form{
        "as the network runs it: the mask from the forward's ReLU bits, dy in two parts", [&] {
          Prepared p = prepared([&] {
            const BnChannelState st = c.bn.state(), st2 = c.bn2.state();
            BnBackwardArgs a = form->args(c, &st);
            if (projection) add_second_bn(a, c, &st2);
            else a.dres = c.DRES.get();
            bn_backward(a, c.s, c.t, c.l, c.scratch.f32(), lab.stream());
          });
          form = std::make_shared<NetworkForm>(c, projection, lab.stream());
          return p;
        }};
    std::vector<LabVersion> versions;
    if (projection) {
      versions = {
          {"bn_backward dual: both BNs in one reduction and one apply", [&] {
             return prepared([&] {
               const BnChannelState st = c.bn.state(), st2 = c.bn2.state();
               BnBackwardArgs a = join_args(c, &st);
               add_second_bn(a, c, &st2);
               bn_backward(a, c.s, c.t, c.l, c.scratch.f32(), lab.stream());
             });
           }},
          {"bn_backward of bn writing dz, then bn_backward of bn2 from dz: two passes", [&] {
             return prepared([&] {
               const BnChannelState st = c.bn.state(), st2 = c.bn2.state();
               BnBackwardArgs a = join_args(c, &st);
               a.dres = c.DRES.get();
               bn_backward(a, c.s, c.t, c.l, c.scratch.f32(), lab.stream());
               bn_backward(backward_args(c.DRES.get(), ReluMask::None, nullptr, c.X2.get(), &st2, c.dgamma2.f32(),
                                         c.dbeta2.f32(), c.DX2.get()),
                           c.s, c.t, c.l, c.scratch.f32(), lab.stream());
             });
           }},
          network_form};
    } else {
      versions = {{"bn_backward with the shortcut's gradient written to dres", [&] {
                     return prepared([&] {
                       const BnChannelState st = c.bn.state();
                       BnBackwardArgs a = join_args(c, &st);
                       a.dres = c.DRES.get();
                       bn_backward(a, c.s, c.t, c.l, c.scratch.f32(), lab.stream());
                     });
                   }},
                  network_form};
    }
    lab.measure(op, c.shape_text(), c.format_text(), (projection ? 6 : 5) * c.tensor_bytes(), versions);
  });
}

}  // namespace

void measure_join_operations(Lab& lab) {
  for (const bool projection : {true, false})
    if (operation_selected(lab.opt, projection ? "join-projection-forward" : "join-identity-forward"))
      join_forward(lab, projection);
  for (const bool projection : {true, false})
    if (operation_selected(lab.opt, projection ? "join-projection-backward" : "join-identity-backward"))
      join_backward(lab, projection);
}

}  // namespace lab
