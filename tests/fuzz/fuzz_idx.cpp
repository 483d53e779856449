// libFuzzer target: the Fashion-MNIST idx parser. The first two bytes split the input into an
// image file and a label file.
#include <cstdint>

#include "data/dataset.h"
#include "core/errors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t split = std::min<size_t>(size - 2, (size_t(data[0]) << 8) | data[1]);
  const uint8_t* rest = data + 2;
  try {
    const Dataset d = parse_idx(rest, split, "images", rest + split, size - 2 - split, "labels");
    if (d.images.size() != d.image_bytes() * d.count) __builtin_trap();
  } catch (const InputError&) {
  }
  return 0;
}
