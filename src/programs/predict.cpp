// bin/predict (and each rung of the egress ladder): parse flags, run, and turn every failure into
// one line and an exit code: 2 for a bad command line, 1 for anything else (a bad checkpoint or data
// file, an output path that cannot be written, no GPU, a CUDA error). This file is compiled once
// per rung: it alone reads the switchboard, and hands its settings to the predictor.
#include <cstdio>

#include "core/errors.h"
#include "predict/options.h"
#include "predict/predictor.h"
#include "settings.h"

int main(int argc, char** argv) {
  PredictOptions opt;
  try {
    opt = parse_predict_options(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  if (opt.help) {
    std::printf("%s\nthis build: %s\nnetwork: %s\n", predict_usage_text().c_str(), kEgress.describe().c_str(),
                network_description(kBuild).c_str());
    return 0;
  }
  try {
    return predict_main(kBuild, kEgress, opt);
  } catch (const UsageError& e) {  // what only the data set can tell (--top-k above its classes)
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
