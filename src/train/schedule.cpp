// The learning rate at each step: linear warm-up, then cosine decay.
#include "train/schedule.h"

#include <cmath>

double LrSchedule::at(long step) const {
  if (step < warmup_steps) return peak * double(step + 1) / double(warmup_steps);
  const long span = total_steps - warmup_steps;
  if (span <= 0 || step >= total_steps) return min;
  const double progress = double(step - warmup_steps) / double(span);
  return min + (peak - min) * 0.5 * (1.0 + std::cos(M_PI * progress));
}
