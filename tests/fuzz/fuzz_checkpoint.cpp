// libFuzzer target: the checkpoint parser (header, arrays, checksum).
#include <cstdint>

#include "train/checkpoint.h"
#include "core/errors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const Checkpoint c = parse_checkpoint(data, size, "fuzz.ckpt");
    if (c.master.size() != c.meta.params) __builtin_trap();
  } catch (const InputError&) {
  }
  return 0;
}
