// How a run ends, and what each ending keeps: decided here, in one place.
#pragma once

#include <string>

enum class Ending {
  Finished,      // every epoch ran, or --steps did
  Signal,        // SIGINT or SIGTERM: after the current step, on every rank at the same step
  Diverged,      // a counter read found a non-finite loss or a collapsed loss scale (counters.h)
  OutputFailed,  // a file of the run's output (the loss log) could not be written
  BadImage,      // an image that passed the header check did not decode
};

// Where the state of the last step is saved as the run ends so; "" for nowhere.
// - Finished: to --save, if given.
// - Signal, OutputFailed, BadImage: the weights are fine and the run can go on from them, so they go
//   to --save, or to interrupted.ckpt without it.
// - Diverged: never; that state is bad (what --save keeps then is SaveKeeper::after_divergence's).
// - BadImage on several ranks: nowhere. A save is collective and the other ranks are elsewhere;
//   they are told to stop, and the run resumes from the last --save-every checkpoint.
std::string ending_save_path(Ending e, const std::string& save_flag, bool several_ranks);
