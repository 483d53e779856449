// The --sample-png grid of augmented training images.
#include "data/sample_grid.h"

#include <vector>

#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb_image_write.h>

#include "core/errors.h"

void write_sample_grid(const std::string& path, const uint8_t* images, int count, int channels, int side,
                       Layout layout) {
  constexpr int kCols = 8, kGap = 2;
  const int S = side;
  const int rows = (count + kCols - 1) / kCols;
  const int width = kCols * (S + kGap) + kGap, height = rows * (S + kGap) + kGap;
  std::vector<uint8_t> rgb(size_t(width) * height * 3, 255);
  const size_t img_bytes = size_t(channels) * S * S;
  for (int i = 0; i < count; ++i) {
    const int x0 = kGap + (i % kCols) * (S + kGap), y0 = kGap + (i / kCols) * (S + kGap);
    for (int y = 0; y < S; ++y)
      for (int x = 0; x < S; ++x)
        for (int c = 0; c < 3; ++c) {
          const int sc = channels == 1 ? 0 : c;
          const size_t src = layout == Layout::NCHW ? (size_t(sc) * S + y) * S + x : (size_t(y) * S + x) * channels + sc;
          rgb[(size_t(y0 + y) * width + x0 + x) * 3 + c] = images[img_bytes * i + src];
        }
  }
  if (!stbi_write_png(path.c_str(), width, height, 3, rgb.data(), width * 3))
    throw Fatal(path + ": could not write the PNG");
}
