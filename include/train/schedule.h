// Learning rate per step: linear warm-up to the peak, then cosine decay to the minimum.
#pragma once

struct LrSchedule {
  double peak = 0.1;
  double min = 0.0;
  long warmup_steps = 0;   // lr rises linearly over these: peak * (step + 1) / warmup_steps
  long total_steps = 1;    // cosine from the end of warm-up to here; min afterwards

  double at(long step) const;
};
