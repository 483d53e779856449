// libFuzzer target: the CIFAR-10 batch parser. The first byte picks how many records the "file"
// must hold (1-4), so mutated inputs of the right size reach the per-record checks.
#include <cstdint>

#include "data/dataset.h"
#include "core/errors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int records = 1 + data[0] % 4;
  Dataset d;
  try {
    parse_cifar10_batch(data + 1, size - 1, "fuzz.bin", d, records);
    if (d.count != records || d.labels.size() != size_t(records)) __builtin_trap();
  } catch (const InputError&) {
  }
  return 0;
}
