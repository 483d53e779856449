// What the image-folder tests share: files and PNGs written into a scratch folder, the fixture
// images, a train/ and test/ folder of classes, and the loader's options and InputError.
// Header-only (inline), so each test file includes it and nothing changes in the Makefile.
#pragma once

#include <gtest/gtest.h>

#include <stb_image_write.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/file_io.h"
#include "data/image_folder.h"
#include "support/test_files.h"

namespace image_folder_test {

namespace fs = std::filesystem;

inline void write(const std::string& path, const std::vector<uint8_t>& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

inline std::vector<uint8_t> fixture(const std::string& name) {
  return read_file(test_files::repo_path("tests/fixtures/images/" + name));
}

// A w x h PNG of `channels` whose pixels are `value` plus a gradient.
inline void write_png(const std::string& path, int w, int h, int channels, int value) {
  fs::create_directories(fs::path(path).parent_path());
  std::vector<uint8_t> px(size_t(w) * h * channels);
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>(value + i * 7);
  ASSERT_TRUE(stbi_write_png(path.c_str(), w, h, channels, px.data(), w * channels)) << path;
}

// train/ and test/ with the same classes, two colour images each in several formats and sizes.
inline void write_folder(const std::string& root, const std::vector<std::string>& classes) {
  for (const char* split : {"train", "test"})
    for (size_t k = 0; k < classes.size(); ++k) {
      const std::string dir = root + "/" + split + "/" + classes[k];
      write_png(dir + "/a.png", 20 + int(k), 12, 3, 10 * int(k));
      write(dir + "/b.jpg", fixture("rgb.jpg"));
    }
}

inline std::string error_of_loading(const std::string& root, const ImageOptions& o = {}) {
  return test_files::input_error_of([&] { load_image_folder(root, o); });
}

inline ImageOptions at_side(int side, bool cache = false) {
  ImageOptions o;
  o.side = side;
  o.cache_decoded = cache;
  o.threads = 2;
  return o;
}

}  // namespace image_folder_test
