// How the learning rate follows the global batch on several GPUs: linear scaling with a longer
// warm-up (Goyal et al. 2017, "Accurate, Large Minibatch SGD"; ../shared/anchors.md).
//
// --lr, --min-lr and --warmup-epochs are the recipe of one GPU's step of --batch images (the
// reference batch B), as a one-GPU run takes them. A step of G images averages G/B times as many
// gradients, so linear scaling takes a G/B times larger step: both rates are multiplied by G/B. The
// warm-up, in epochs, grows in the same proportion (the same number of warm-up steps, now over more
// images each), up to --warmup-cap epochs and never below --warmup-epochs: a larger rate wants its ramp.
//
// The rule applies wherever a step is made of several batches: on several GPUs, or with --accumulate
// (N micro-batches a step, a global batch N times --batch x GPUs, trained as N GPUs train it), unless
// --no-lr-scaling; one GPU without accumulation takes the flags as given. A checkpoint records whether
// its run was scaled and from which reference batch, and a resume keeps both on any number of GPUs:
// the checkpoint fixes the global batch, so the rates go on as they were. (A file written before the
// rule was a run not scaled; one written before the reference was recorded was scaled from 128.)
#pragma once

#include <string>

// The reference batch of checkpoints that do not record one: the rule first scaled from 128 images.
constexpr int kLegacyReferenceBatch = 128;

// The rates and warm-up of the schedule (train/schedule.h) before its epochs become steps.
struct LrPlan {
  double peak = 0, min = 0, warmup_epochs = 0;
};

// The linear rule alone: `base` for `reference_batch` images a step, for `global_batch` instead.
LrPlan linear_lr_scaling(const LrPlan& base, int reference_batch, int global_batch, double warmup_cap);

// Why the schedule is what it is.
enum class LrScaling {
  Scaled,         // the linear rule (several GPUs or micro-batches, or the resume of a run that was)
  OneGpu,         // one GPU: the flags as given
  Off,            // --no-lr-scaling: the flags as given
  AsCheckpointed  // the resume of a run that was not scaled, now in several parts: as given, as it was
};

struct LrChoice {
  LrScaling how = LrScaling::OneGpu;
  LrPlan base, used;  // from the flags; what the schedule uses
  int global_batch = 0, reference_batch = 0;  // the step's images; those `base` is the recipe of
  bool scaled() const { return how == LrScaling::Scaled; }
};

// The rule a checkpoint was trained under.
struct ResumedLrRule {
  bool scaled = false;
  int reference_batch = kLegacyReferenceBatch;
};

// The schedule of a run with `flags` (--lr, --min-lr, --warmup-epochs), `global_batch` images a step
// made of `parts` batches of global_batch/parts (ranks x micro-batches). `resumed`: the rule of the
// checkpoint resumed (nullptr: a fresh run). The reference is one part's batch, but for the resume of
// a scaled run, which keeps its checkpoint's.
LrChoice choose_lr(const LrPlan& flags, int global_batch, int parts, bool scaling_on, double warmup_cap,
                   const ResumedLrRule* resumed);

// The start line, e.g. "lr: 0.08 for global batch 512 (0.02 x 512/128), warm-up 2 epochs".
std::string lr_line(const LrChoice& c);
// Whether the run prints that line: in several parts (GPUs, micro-batches), and wherever the rule scaled.
bool lr_line_shown(const LrChoice& c, int parts);
// "" when `used` is the schedule a checkpoint recorded; else what changes, for a warning on resume.
std::string lr_resume_difference(const LrPlan& recorded, const LrPlan& used);
