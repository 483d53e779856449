// The files a run writes besides its checkpoints (outputs.h).
#include "train/outputs.h"

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "data/sample_grid.h"

RunOutputs::RunOutputs(const BuildSettings& b, const Options& o, int workers, bool tty, int ranks)
    : build_(b), opt_(o), report_(b, o, workers, tty, ranks), saves_(o) {}

void RunOutputs::write_loss_log(long first_step, const std::vector<float>& losses) {
  std::ofstream out(opt_.loss_log, loss_log_started_ ? std::ios::app : std::ios::trunc);
  loss_log_started_ = true;
  if (!out) throw OutputFailed(opt_.loss_log + ": cannot write the loss log");
  char line[64];
  for (size_t i = 0; i < losses.size(); ++i) {
    std::snprintf(line, sizeof(line), "%ld %.9g\n", first_step + long(i), losses[i]);  // %.9g: exact for floats
    out << line;
  }
  if (!out.flush()) throw OutputFailed(opt_.loss_log + ": writing the loss log failed (disk full?)");
}

void RunOutputs::write_sample_png(const Dataset& train, const EpochPlan& plan, int first) const {
  std::vector<uint8_t> u8(train.image_bytes() * opt_.batch);
  std::vector<int32_t> labels(opt_.batch);
  assemble_batch_u8(train, plan, first, build_.layout, u8.data(), labels.data());
  write_sample_grid(opt_.sample_png, u8.data(), std::min(opt_.batch, 64), train.channels, train.side, build_.layout);
  std::printf("wrote the first augmented batch to %s\n", opt_.sample_png.c_str());
}
