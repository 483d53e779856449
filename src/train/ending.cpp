// What each ending of a run saves (ending.h).
#include "train/ending.h"

std::string ending_save_path(Ending e, const std::string& save_flag, bool several_ranks) {
  const std::string stopped_early = save_flag.empty() ? "interrupted.ckpt" : save_flag;
  switch (e) {
    case Ending::Finished: return save_flag;
    case Ending::Signal:
    case Ending::OutputFailed: return stopped_early;
    case Ending::BadImage: return several_ranks ? "" : stopped_early;
    case Ending::Diverged: return "";
  }
  return "";
}
