// The training program, phase by phase: the set-up (setup.h: options -> data, GPU, network, data
// parallelism, resume), the loop (loop.h: epochs, steps, schedule, window) and the outputs
// (outputs.h: progress, epoch lines, summary, saves, loss log, sample PNG). What each optimization of
// the ladder changes is asked of the BuildSettings in those phases and nowhere else but the loader
// and network configs. How the run ends, and what each ending saves, is decided here (ending.h).
#include "train/trainer.h"

#include <unistd.h>

#include <cstdio>
#include <string>

#include "data/image_decode.h"
#include "dist/launch_env.h"
#include "measure/profiling.h"
#include "train/ending.h"
#include "train/loop.h"
#include "train/outputs.h"
#include "train/ranks.h"
#include "train/setup.h"

namespace {

class Trainer {
 public:
  Trainer(const BuildSettings& b, const Options& o)
      : build_(b), opt_(o), ranks_(discover_launch()), workers_(o.workers > 0 ? o.workers : default_workers()),
        outputs_(b, opt_, workers_, isatty(STDOUT_FILENO) && !o.json, ranks_.launch().world) {}
  int run();
  // This rank stops with an error: the other ranks are told; returns the line to print.
  std::string failed(const std::string& why) {
    if (session_.dp) session_.dp->fail(why);
    return ranks_.prefix() + why;
  }

 private:
  int train(TrainLoop& loop);
  Ending loop_ending(TrainLoop& loop, std::string& why);
  int ended(Ending e, const std::string& why, const std::string& saved_to, const TrainLoop& loop);
  int error_exit(const std::string& why);

  const BuildSettings& build_;
  Options opt_;
  Ranks ranks_;
  int workers_;
  RunOutputs outputs_;
  TrainingSession session_;
};

int Trainer::run() {
  name_this_thread("main");
  ranks_.silence_stdout_unless_writing();
  outputs_.report().start();
  set_up_training(session_, build_, opt_, ranks_, workers_);
  TrainLoop loop(build_, opt_, ranks_, session_, outputs_);
  return train(loop);
}

// The loop, then what its ending keeps. A save that finds the run diverged (its counter read shows
// what the last read did not) ends it as diverged, whatever ended the loop.
int Trainer::train(TrainLoop& loop) {
  Ending ending = Ending::Finished;
  std::string why, saved_to;
  try {
    ending = loop_ending(loop, why);
    saved_to = ending_save_path(ending, opt_.save, ranks_.several());
    if (!saved_to.empty()) loop.save(saved_to, false);  // a save that fails too is rescued, and says so
  } catch (const Diverged& d) {
    ending = Ending::Diverged;
    why = d.what();
  }
  return ended(ending, why, saved_to, loop);
}

// How the loop ended: as it returned, or by the exception that stopped it (`why` says what it was).
Ending Trainer::loop_ending(TrainLoop& loop, std::string& why) {
  try {
    return loop.run();
  } catch (const OutputFailed& e) {
    why = e.what();
    return Ending::OutputFailed;
  } catch (const ImageDecodeError& e) {
    why = e.what();
    return Ending::BadImage;
  }
}

// What the user is told of each ending, and the exit code.
int Trainer::ended(Ending e, const std::string& why, const std::string& saved_to, const TrainLoop& loop) {
  const std::string step = std::to_string(loop.step());
  switch (e) {
    case Ending::Finished:
      if (!saved_to.empty()) std::printf("checkpoint saved to %s\n", saved_to.c_str());
      break;
    case Ending::Signal:
      std::printf("stopped by a signal after step %ld: checkpoint saved to %s (continue with --resume %s)\n",
                  loop.step(), saved_to.c_str(), saved_to.c_str());
      break;
    case Ending::Diverged:
      return error_exit(why + outputs_.saves().after_divergence(loop.first_step()));
    case Ending::OutputFailed:
      return error_exit(why + "; the state of step " + step + " was saved to " + saved_to + " (continue with --resume " +
                        saved_to + ")");
    case Ending::BadImage:  // an image that passed the header check did not decode: the file is named
      if (saved_to.empty())
        return error_exit(why + "; not saved (the other ranks stop too): fix or remove the file, then resume from "
                                "the last --save-every checkpoint");
      return error_exit(why + "; the state after step " + step + " is saved to " + saved_to +
                        " (fix or remove the file, then --resume " + saved_to + ")");
  }
  outputs_.report().summary(loop.summary());
  return 0;
}

int Trainer::error_exit(const std::string& why) {
  const std::string line = failed(why);
  std::fflush(stdout);
  std::fprintf(stderr, "error: %s\n", line.c_str());
  return 1;
}

}  // namespace

int train_main(const BuildSettings& build, const Options& opt) {
  Trainer t(build, opt);
  try {
    return t.run();
  } catch (const UsageError& e) {  // found once the build is known (--autotune-cache): still exit 2
    throw UsageError(t.failed(e.what()));
  } catch (const std::exception& e) {
    throw Fatal(t.failed(e.what()));
  }
}
