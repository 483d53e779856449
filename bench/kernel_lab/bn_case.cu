// The batch-norm operations' data at one shape and format (lab/bn_case.h).
#include "kernel_lab/bn_case.h"

#include <tuple>

namespace lab {

BnCase::BnCase(const Lab& lab, ChwShape shape, LabFormat f)
    : d{lab.opt.check_batch, shape.c, shape.h, shape.w},
      s{lab.batch(), shape.c, shape.h, shape.w},
      t(f.t),
      l(f.l),
      rng(gpu_test::named_rng("bn " + shape.text() + " " + f.text())),
      x(gpu_test::quantize(t, gpu_test::channel_data(rng, d, -2.0, 2.0))),
      x2(gpu_test::quantize(t, gpu_test::channel_data(rng, d, -1.0, 1.0))),
      dy(gpu_test::quantize(t, gpu_test::random_normal(rng, d.count()))),
      h(gpu_test::random_bn(rng, d.c)),
      h2(gpu_test::random_bn(rng, d.c)),
      st(gpu_test::saved_stats(d, x)),
      st2(gpu_test::saved_stats(d, x2)),
      k(gpu_test::saved_coefs(st, h.gamma, h.beta)),
      k2(gpu_test::saved_coefs(st2, h2.gamma, h2.beta)),
      X(device(x)),
      X2(device(x2)),
      DY(device(dy)),
      bn(h),
      bn2(h2),
      scratch(gpu_test::bn_scratch(s, t, l)),
      Y(s.count(), t, "lab output"),
      Y2(s.count(), t, "lab intermediate"),
      DX(s.count(), t, "lab output"),
      DX2(s.count(), t, "lab output"),
      DRES(s.count(), t, "lab output"),
      dgamma(d.c, DType::F32),
      dbeta(d.c, DType::F32),
      dgamma2(d.c, DType::F32),
      dbeta2(d.c, DType::F32) {}

std::string BnCase::shape_text() const {
  return std::to_string(s.n) + "x" + std::to_string(s.c) + "x" + std::to_string(s.h) + "x" + std::to_string(s.w);
}

void BnCase::load_forward_state() {
  for (auto [dev, stats, coefs] : {std::tuple{&bn, &st, &k}, std::tuple{&bn2, &st2, &k2}}) {
    dev->save_mean.upload(stats->mean);
    dev->save_invstd.upload(stats->invstd);
    dev->scale.upload(coefs->scale);
    dev->shift.upload(coefs->shift);
  }
}

void BnCase::poison(std::initializer_list<DeviceTensor*> outputs) {
  for (DeviceTensor* o : outputs) o->poison();
}

DeviceTensor BnCase::device(const Vec& small) const { return repeated(small, d, s.n / d.n, t, l); }

LabCheck BnCase::check(const std::string& output, const DeviceTensor& got, const Vec& want) const {
  return check_activation(output, got, want, d, l, gpu_test::tol(t));
}

void BnCase::check_grads(std::vector<LabCheck>& out, const std::string& suffix, const DeviceTensor& dx_got,
                         const DeviceTensor& dgamma_got, const DeviceTensor& dbeta_got, const ref::BnGrads& want) const {
  const double repeats = double(s.n) / d.n;
  out.push_back(check("dx" + suffix, dx_got, want.dx));
  out.push_back(check_vector("dgamma" + suffix, dgamma_got, want.dgamma, gpu_test::kTolF32, repeats));
  out.push_back(check_vector("dbeta" + suffix, dbeta_got, want.dbeta, gpu_test::kTolF32, repeats));
}

}  // namespace lab
