// When a periodic save (--save-every) may become the --save file: the rule SaveKeeper (checkpointing.h) applies, here so
// that the CPU tests can check it.
//
// A state saved in the middle of a run has not been through a forward pass yet: its weights come
// from the latest update. If that update already broke them, the step run from them diverges (fp32:
// a NaN/Inf loss; fp16: overflows that skip step after step until the loss scale collapses), and so
// would every resume of a checkpoint holding them. So a periodic save is written to FILE.pending and
// becomes FILE only once the run has shown it good: a step run from it had its update applied, and
// the counters that show it show no divergence.
#pragma once

struct PendingSave {
  long step = -1;    // steps done when it was saved (the checkpoint's step); -1: none pending
  long skipped = 0;  // the loss scaler's skipped_steps then
};

// Whether counters read after `steps` steps in all, with `skipped` steps skipped in all, prove the
// pending save good. A skipped step does not change the weights, so only a step that was not
// skipped tests them: at least one of the steps run since the save must be such a step.
inline bool pending_save_proven(const PendingSave& p, long steps, long skipped, bool diverged) {
  return p.step >= 0 && !diverged && steps > p.step && steps - p.step > skipped - p.skipped;
}
