// Decoding one image file (image_decode.h), once image_check.cpp has passed it: JPEG through
// libjpeg-turbo (image_jpeg.cpp), the other formats through stb_image; the resize is image_resize.cpp.
//
// This is the one translation unit that holds stb_image's implementation. It is built with only the
// five formats it decodes for us, so that no other decoder of stb_image (its JPEG one included) is
// reachable from a user's file.
#include "data/image_decode.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "core/file_io.h"
#include "data/image_jpeg.h"

#define STB_IMAGE_IMPLEMENTATION
#define STBI_ONLY_PNG
#define STBI_ONLY_BMP
#define STBI_ONLY_GIF
#define STBI_ONLY_TGA
#define STBI_ONLY_PNM
#include <stb_image.h>

namespace {

bool decode_stb(const uint8_t* bytes, size_t size, int channels, DecodedImage& img, std::string& problem) {
  int comp = 0;
  const std::unique_ptr<stbi_uc, void (*)(void*)> px(
      stbi_load_from_memory(bytes, static_cast<int>(size), &img.width, &img.height, &comp, channels), stbi_image_free);
  if (!px) {
    problem = stbi_failure_reason();
    return false;
  }
  img.pixels.assign(px.get(), px.get() + size_t(img.width) * img.height * channels);
  return true;
}

}  // namespace

DecodedImage decode_image(const uint8_t* bytes, size_t size, int channels, const std::string& file) {
  const ImageCheck c = check_image_bytes(bytes, size);
  if (!c.ok()) throw ImageDecodeError(file + ": " + c.problem);
  DecodedImage img;
  std::string problem;
  const bool decoded = c.header.format == ImageFormat::Jpeg
                           ? decode_jpeg(bytes, size, channels, img.width, img.height, img.pixels, problem)
                           : decode_stb(bytes, size, channels, img, problem);
  if (!decoded) throw ImageDecodeError(file + ": cannot decode the " + image_format_name(c.header.format) + " (" + problem + ")");
  if (img.width != c.header.width || img.height != c.header.height)
    throw ImageDecodeError(file + ": decoded as " + std::to_string(img.width) + "x" + std::to_string(img.height) +
                           " but its header says " + std::to_string(c.header.width) + "x" + std::to_string(c.header.height));
  img.channels = channels;
  return img;
}

void load_image_file(const std::string& path, int channels, int side, uint8_t* chw) {
  struct stat st{};
  if (stat(path.c_str(), &st) != 0) throw ImageDecodeError(path + ": cannot open: " + std::strerror(errno));
  if (uint64_t(st.st_size) > kMaxImageFileBytes)
    throw ImageDecodeError(path + ": " + std::to_string(st.st_size) + " bytes, above the limit of " +
                           std::to_string(kMaxImageFileBytes >> 20) + " MiB");
  std::vector<uint8_t> bytes;
  try {
    bytes = read_file(path);
  } catch (const InputError& e) {
    throw ImageDecodeError(e.what());
  }
  const DecodedImage img = decode_image(bytes.data(), bytes.size(), channels, path);
  resize_shorter_and_crop(img.pixels.data(), img.width, img.height, channels, side, chw);
}
