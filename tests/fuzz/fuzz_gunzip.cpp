// libFuzzer target: gzip inflation of (possibly truncated or corrupt) .gz files.
#include <cstdint>

#include "core/errors.h"
#include "core/file_io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const std::vector<uint8_t> out = gunzip(data, size, "fuzz.gz", size_t(1) << 20);
    if (out.size() > (size_t(1) << 20)) __builtin_trap();
  } catch (const InputError&) {
  }
  return 0;
}
