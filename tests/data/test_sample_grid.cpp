// The --sample-png grid: written, read back with stb_image, and compared pixel by pixel with the
// images it was given (grey and colour, NCHW and NHWC, 32x32 and other sides).
#include <gtest/gtest.h>

#include <stb_image.h>

#include <memory>
#include <string>
#include <vector>

#include "core/errors.h"
#include "data/sample_grid.h"
#include "support/test_files.h"

namespace {

using test_files::TempDir;

constexpr int kCols = 8, kGap = 2;

// Value of image i, channel c, pixel (x, y): distinct across images, channels and positions.
uint8_t value(int i, int c, int y, int x) { return static_cast<uint8_t>(i * 37 + c * 80 + y * 5 + x * 3); }

std::vector<uint8_t> images(int count, int channels, Layout layout, int S = 32) {
  std::vector<uint8_t> b(size_t(count) * channels * S * S);
  for (int i = 0; i < count; ++i)
    for (int c = 0; c < channels; ++c)
      for (int y = 0; y < S; ++y)
        for (int x = 0; x < S; ++x) {
          const size_t o = layout == Layout::NCHW ? ((size_t(i) * channels + c) * S + y) * S + x
                                                  : ((size_t(i) * S + y) * S + x) * channels + c;
          b[o] = value(i, c, y, x);
        }
  return b;
}

struct Png {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;
  uint8_t at(int x, int y, int c) const { return rgb[(size_t(y) * width + x) * 3 + c]; }
};

Png read_png(const std::string& path) {
  Png p;
  int comp = 0;
  std::unique_ptr<stbi_uc, void (*)(void*)> data(stbi_load(path.c_str(), &p.width, &p.height, &comp, 3), stbi_image_free);
  EXPECT_NE(data, nullptr) << path << ": " << stbi_failure_reason();
  if (data) p.rgb.assign(data.get(), data.get() + size_t(p.width) * p.height * 3);
  return p;
}

// Tile i sits at column i % 8, row i / 8, after a 2-pixel gap; gaps and unused tiles are white.
void expect_grid(const Png& png, int count, int channels, int S) {
  const int rows = (count + kCols - 1) / kCols;
  ASSERT_EQ(png.width, kCols * (S + kGap) + kGap);
  ASSERT_EQ(png.height, rows * (S + kGap) + kGap);
  std::vector<bool> in_tile(size_t(png.width) * png.height, false);
  for (int i = 0; i < count; ++i) {
    const int x0 = kGap + (i % kCols) * (S + kGap), y0 = kGap + (i / kCols) * (S + kGap);
    for (int y = 0; y < S; ++y)
      for (int x = 0; x < S; ++x) {
        in_tile[size_t(y0 + y) * png.width + x0 + x] = true;
        for (int c = 0; c < 3; ++c)
          ASSERT_EQ(png.at(x0 + x, y0 + y, c), value(i, channels == 1 ? 0 : c, y, x))
              << "image " << i << " pixel (" << x << ", " << y << ") channel " << c;
      }
  }
  for (int y = 0; y < png.height; ++y)
    for (int x = 0; x < png.width; ++x) {
      if (in_tile[size_t(y) * png.width + x]) continue;
      for (int c = 0; c < 3; ++c) ASSERT_EQ(png.at(x, y, c), 255) << "background at (" << x << ", " << y << ")";
    }
}

TEST(SampleGrid, ColourAndGreyInBothLayouts) {
  TempDir dir;
  for (int side : {32, 24, 64})
  for (int channels : {1, 3})
    for (Layout layout : {Layout::NCHW, Layout::NHWC})
      for (int count : {1, 8, 11}) {
        SCOPED_TRACE(std::to_string(side) + "x" + std::to_string(side) + ", " + std::to_string(channels) +
                     " channels, " + layout_name(layout) + ", " + std::to_string(count) + " images");
        const std::string path = dir / "grid.png";
        const std::vector<uint8_t> imgs = images(count, channels, layout, side);
        write_sample_grid(path, imgs.data(), count, channels, side, layout);
        expect_grid(read_png(path), count, channels, side);
        if (HasFatalFailure()) return;
      }
}

TEST(SampleGrid, UnwritablePathIsFatalNamingIt) {
  TempDir dir;
  const std::string path = dir / "missing-dir/grid.png";
  const std::vector<uint8_t> imgs = images(2, 3, Layout::NCHW);
  try {
    write_sample_grid(path, imgs.data(), 2, 3, 32, Layout::NCHW);
    ADD_FAILURE() << "writing into a missing directory succeeded";
  } catch (const Fatal& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

}  // namespace
