// libFuzzer target: command-line parsing; NUL bytes split the input into arguments.
#include <cstdint>
#include <string>
#include <vector>

#include "train/options.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> args{"train"};
  std::string cur;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      args.push_back(cur);
      cur.clear();
    } else {
      cur += static_cast<char>(data[i]);
    }
  }
  args.push_back(cur);
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  try {
    parse_options(static_cast<int>(argv.size()), argv.data());
  } catch (const UsageError&) {
  }
  return 0;
}
