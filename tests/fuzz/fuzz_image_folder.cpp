// libFuzzer target: the image folder's decode path as a loader thread runs it on a user's file: the
// header check (also on a short head and tail, as the header pass reads them), then the decoder
// (libjpeg-turbo for JPEG, stb_image for the other formats) and the resize and centre crop. The first
// byte picks the side (8 to 64) and the channels (1 or 3). libjpeg-turbo is the system's library,
// not built with the sanitizers here (it is fuzzed upstream): what this target checks of JPEG is our
// side of it, the header check, the error handling and the buffers we give it.
#include <cstdint>
#include <vector>

#include "data/image_decode.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int side = 8 * (1 + data[0] % 8), channels = data[0] & 0x80 ? 1 : 3;
  const uint8_t* file = data + 1;
  const size_t n = size - 1;
  const size_t head = n < 64 ? n : 64, tail = n < 16 ? n : 16;
  check_image(file, head, file + n - tail, tail, n);
  const ImageCheck c = check_image_bytes(file, n);
  // Large images pass the check and decode fine, only slowly: leave them out so the fuzzer explores.
  if (!c.ok() || int64_t(c.header.width) * c.header.height > (int64_t(1) << 20)) return 0;
  try {
    const DecodedImage img = decode_image(file, n, channels, "fuzz");
    if (img.pixels.size() != size_t(img.width) * img.height * channels) __builtin_trap();
    std::vector<uint8_t> out(size_t(channels) * side * side);
    resize_shorter_and_crop(img.pixels.data(), img.width, img.height, channels, side, out.data());
  } catch (const ImageDecodeError&) {
  }
  return 0;
}
