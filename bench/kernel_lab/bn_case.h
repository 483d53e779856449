// The data of the batch-norm operations (lab/bn.cu, lab/join.cu) at one shape and format: two BN
// layers' inputs and parameters as the CPU reference sees them (the check batch, NCHW, rounded to
// the element type), the same on the device at the timed batch, and the outputs the versions write.
// x and bn are the BN on the main path (conv3's at a join); x2 and bn2 the second one (the
// projection shortcut's), or at an identity join x2 is the block input added to it.
#pragma once

#include <initializer_list>
#include <string>

#include "kernel_lab/lab.h"

namespace lab {

struct BnCase {
  ref::Dims d;         // the check batch
  Shape4 s;            // the timed batch
  DType t;
  Layout l;
  std::mt19937_64 rng;     // named by shape and format: the same data on every run
  Vec x, x2, dy;
  gpu_test::HostBn h, h2;
  ref::BnStats st, st2;    // as the forward saved them (fp32)
  ref::BnCoefs k, k2;      // scale and shift from them (fp32)
  DeviceTensor X, X2, DY;  // at the timed batch
  gpu_test::DeviceBn bn, bn2;
  DeviceTensor scratch;
  DeviceTensor Y, Y2, DX, DX2, DRES;          // activation outputs (Y2: an intermediate)
  DeviceTensor dgamma, dbeta, dgamma2, dbeta2;

  BnCase(const Lab& lab, ChwShape shape, LabFormat f);

  size_t tensor_bytes() const { return s.count() * dtype_size(t); }
  std::string shape_text() const;  // "128x64x32x32"
  std::string format_text() const { return LabFormat{t, l}.text(); }
  // Both BNs' state as a training forward left it: saved statistics, scale and shift.
  void load_forward_state();
  static void poison(std::initializer_list<DeviceTensor*> outputs);

  // An activation given at the check batch (NCHW), repeated to the timed batch.
  DeviceTensor device(const Vec& small) const;
  LabCheck check(const std::string& output, const DeviceTensor& got, const Vec& want) const;
  // A BN backward's outputs against the reference's: dx (the element type's bound) and the gamma and
  // beta gradients (fp32: they are sums over the batch, so the reference's times the repeats).
  void check_grads(std::vector<LabCheck>& out, const std::string& suffix, const DeviceTensor& dx_got,
                   const DeviceTensor& dgamma_got, const DeviceTensor& dbeta_got, const ref::BnGrads& want) const;
};

}  // namespace lab
