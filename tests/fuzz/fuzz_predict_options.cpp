// libFuzzer target: bin/predict's command-line parsing; NUL bytes split the input into arguments.
#include <cstdint>
#include <string>
#include <vector>

#include "predict/options.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> args{"predict"};
  args.emplace_back();
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0) args.emplace_back();
    else args.back() += static_cast<char>(data[i]);
  }
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  try {
    parse_predict_options(static_cast<int>(argv.size()), argv.data());
  } catch (const UsageError&) {
  }
  return 0;
}
