// The trainer's output, as text for people and as JSON lines for bench/.
#include "train/reports.h"

#include <cmath>
#include <cstdio>

#include <cudnn.h>

#include "core/elapsed.h"
#include "core/format.h"
#include "core/json_line.h"

namespace {

JsonLine settings_json(const BuildSettings& b, const Options& o, int workers) {
  JsonLine s;
  s.add("precision", dtype_name(b.precision))
      .add("layout", layout_name(b.layout))
      .add("loader", loader_name(b.loader))
      .add("algo", algo_policy_name(b.algo))
      .add("conv_api", conv_api_name(b.conv_api))
      .add("device_loss", b.device_loss)
      .add("workers", workers)
      .add("deterministic", o.deterministic)
      .add("tf32", o.tf32);
  return s;
}

}  // namespace

Reporter::Reporter(const BuildSettings& build, const Options& o, int workers, bool tty, int ranks)
    : build_(build), opt_(o), workers_(workers), tty_(tty), ranks_(ranks), step_images_(o.batch * ranks * o.accumulate) {}

void Reporter::start() const {
  std::printf("%s\n", build_.describe().c_str());
  if (!opt_.json) return;
  JsonLine j;
  j.add("event", "start").add("variant", build_.variant).add("optimizations", build_.optimizations())
      .add("settings", settings_json(build_, opt_, workers_));
  std::printf("%s\n", j.str().c_str());
}

void Reporter::begin_progress(long step) {
  t0_ = std::chrono::steady_clock::now();
  step0_ = step;
}

void Reporter::progress(int epoch, int k, int steps_per_epoch, long step, double loss, bool final) const {
  if (!tty_) return;
  const double dt = seconds_since(t0_);
  const double ips = dt > 0 ? double(step - step0_) * step_images_ / dt : 0;
  const long total = long(opt_.epochs) * steps_per_epoch;
  const long left = (opt_.steps > 0 ? std::min(opt_.steps, total) : total) - step;
  const double eta = ips > 0 ? double(left) * step_images_ / ips : 0;
  std::printf("\r  epoch %d/%d  step %d/%d  %s img/s  loss %.4f  ETA %s   ", epoch + 1, opt_.epochs, k + 1,
              steps_per_epoch, with_commas(std::lround(ips)).c_str(), loss, clock_text(eta).c_str());
  if (final) std::printf("\r%*s\r", 90, "");
  std::fflush(stdout);
}

void Reporter::first_step(long step) const {
  if (!opt_.json) return;
  JsonLine j;
  j.add("event", "first_step").add("step", step);
  std::printf("%s\n", j.str().c_str());
  std::fflush(stdout);
}

void Reporter::epoch(const EpochResult& r) const {
  const double ips = r.train_ms > 0 ? double(r.images) / (r.train_ms / 1e3) : NAN;
  const double stall_pct = r.train_ms > 0 ? 100.0 * r.stall_ms / r.train_ms : NAN;
  if (opt_.json) {
    JsonLine j;
    j.add("event", "epoch").add("epoch", r.epoch + 1).add("epochs", opt_.epochs).add("step", r.step)
        .add("train_loss", r.train_loss).add("train_acc", r.train_acc);
    if (opt_.eval) j.add("test_loss", r.test_loss).add("test_acc", r.test_acc);
    else j.null("test_loss").null("test_acc");
    j.add("epoch_time_s", r.seconds).add("train_time_s", r.train_ms / 1e3).add("images_per_s", ips)
        .add("data_stall_pct", stall_pct).add("lr", r.lr)
        .add("loss_scale", static_cast<double>(r.loss_scale)).add("skipped_steps", r.skipped_steps);
    std::printf("%s\n", j.str().c_str());
  } else {
    std::printf("epoch %2d/%d  train loss %.4f acc %6.2f%%", r.epoch + 1, opt_.epochs, r.train_loss,
                100 * r.train_acc);
    if (opt_.eval) std::printf("  test loss %.4f acc %6.2f%%", r.test_loss, 100 * r.test_acc);
    std::printf("  %.1f s  %s img/s  stall %.1f%%  lr %.4f\n", r.seconds, with_commas(std::lround(ips)).c_str(),
                stall_pct, r.lr);
  }
  std::fflush(stdout);
}

void Reporter::summary(const RunSummary& s) const {
  const long timed = s.timed_steps;
  const double ips = timed > 0 ? double(timed) * step_images_ / (s.window_ms / 1e3) : NAN;
  const double ms_step = timed > 0 ? s.window_ms / double(timed) : NAN;
  const double stall = timed > 0 ? 100.0 * s.window_stall_ms / s.window_ms : NAN;
  if (opt_.json) {
    JsonLine j;
    j.add("event", "summary").add("variant", build_.variant).add("optimizations", build_.optimizations())
        .add("settings", settings_json(build_, opt_, workers_)).add("gpu", s.gpu)
        .add("cudnn", static_cast<unsigned long>(cudnnGetVersion())).add("batch", opt_.batch)
        .add("data", s.data).add("steps", s.steps).add("warmup_steps", opt_.warmup_steps)
        .add("timed_steps", timed).add("images_per_s", ips).add("ms_per_step", ms_step)
        .add("data_stall_pct", stall).add("gpu_busy_pct", s.gpu_busy_pct).add("peak_gpu_mem_mb", s.peak_gpu_mem_mb)
        .add("final_loss", s.final_train_loss).add("final_train_acc", s.final_train_acc)
        .add("final_test_loss", s.final_test_loss).add("final_test_acc", s.final_test_acc)
        .add("params", s.params).add("autotune_s", s.autotune_s)
        .add("skipped_steps", s.skipped_steps).add("date", today());
    if (timed > 0) j.add("window_start_unix_ms", s.window_start_unix_ms).add("window_end_unix_ms", s.window_end_unix_ms);
    if (opt_.accumulate > 1) j.add("accumulate", opt_.accumulate);
    if (ranks_ > 1) {
      j.add("gpus", ranks_).add("global_batch", step_images_)
          .add("allreduce_exposed_ms_per_step", exposed_ms(s.allreduce, 0)).add("allreduce", comm_report_json(s.allreduce));
    }
    std::printf("%s\n", j.str().c_str());
    return;
  }
  std::printf("summary: %ld steps", s.steps);
  if (timed > 0)
    std::printf("; steady state (%ld steps after %d warm-up): %s img/s, %.2f ms/step, data stall %.1f%%", timed,
                opt_.warmup_steps, with_commas(std::lround(ips)).c_str(), ms_step, stall);
  if (timed > 0 && ranks_ > 1) {
    if (std::isnan(exposed_ms(s.allreduce, 0)))
      std::printf(" (%d GPUs)", ranks_);
    else
      std::printf(" (%d GPUs, all-reduce exposed %.2f ms/step)", ranks_, exposed_ms(s.allreduce, 0));
  }
  if (!std::isnan(s.final_test_acc)) std::printf("; test accuracy %.2f%%", 100 * s.final_test_acc);
  std::printf("; peak GPU memory %.0f MiB\n", s.peak_gpu_mem_mb);
  if (ranks_ > 1)
    for (const std::string& line : comm_report_lines(s.allreduce)) std::printf("%s\n", line.c_str());
}
