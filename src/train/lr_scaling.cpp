// The learning rate of several GPUs: the linear rule, which runs it applies to, and its start line.
#include "train/lr_scaling.h"

#include <algorithm>
#include <cstdio>

namespace {

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

std::string epochs_text(double e) { return number(e) + (e == 1 ? " epoch" : " epochs"); }

std::string plan_text(const LrPlan& p) {
  return "lr " + number(p.peak) + (p.min > 0 ? " (min " + number(p.min) + ")" : "") + " and warm-up " +
         epochs_text(p.warmup_epochs);
}

}  // namespace

LrPlan linear_lr_scaling(const LrPlan& base, int reference_batch, int global_batch, double warmup_cap) {
  const double k = double(global_batch) / reference_batch;
  const double warmup = std::max(base.warmup_epochs, std::min(base.warmup_epochs * k, warmup_cap));
  return {base.peak * k, base.min * k, warmup};
}

LrChoice choose_lr(const LrPlan& flags, int global_batch, int parts, bool scaling_on, double warmup_cap,
                   const ResumedLrRule* resumed) {
  const bool rule_applies = resumed ? resumed->scaled : parts > 1;  // this run is (or was) one the rule scales
  LrChoice c;
  c.base = c.used = flags;
  c.global_batch = global_batch;
  // A resume of a scaled run keeps its reference; elsewhere the rule's reference is one part's batch.
  c.reference_batch = resumed && resumed->scaled ? resumed->reference_batch : global_batch / parts;
  if (!scaling_on) c.how = parts > 1 || rule_applies ? LrScaling::Off : LrScaling::OneGpu;
  else if (rule_applies) c.how = LrScaling::Scaled;
  else c.how = parts > 1 ? LrScaling::AsCheckpointed : LrScaling::OneGpu;
  if (c.scaled()) c.used = linear_lr_scaling(flags, c.reference_batch, global_batch, warmup_cap);
  return c;
}

std::string lr_line(const LrChoice& c) {
  std::string why;
  switch (c.how) {
    case LrScaling::Scaled:
      why = number(c.base.peak) + " x " + std::to_string(c.global_batch) + "/" + std::to_string(c.reference_batch);
      break;
    case LrScaling::OneGpu: why = "one GPU: --lr as given"; break;
    case LrScaling::Off: why = "--no-lr-scaling: --lr as given"; break;
    case LrScaling::AsCheckpointed: why = "--lr as given: the checkpoint's run was not scaled"; break;
  }
  return "lr: " + number(c.used.peak) + " for global batch " + std::to_string(c.global_batch) + " (" + why +
         "), warm-up " + epochs_text(c.used.warmup_epochs);
}

bool lr_line_shown(const LrChoice& c, int parts) { return parts > 1 || c.scaled(); }

std::string lr_resume_difference(const LrPlan& recorded, const LrPlan& used) {
  if (recorded.peak == used.peak && recorded.min == used.min && recorded.warmup_epochs == used.warmup_epochs) return "";
  return "the checkpoint was trained with " + plan_text(recorded) + "; continuing with " + plan_text(used) +
         " changes the learning rate";
}
