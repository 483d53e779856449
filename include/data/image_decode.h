// One image file of an image folder: what its header says and whether that is acceptable (checked
// before anything is decoded, image_check.cpp), decoding (image_decode.cpp: JPEG with libjpeg-turbo,
// image_jpeg.h; PNG, BMP, GIF, TGA and PNM with stb_image), and the resize of the shorter side plus
// the centre crop to side x side (image_resize.cpp).
//
// stb_image trusts its input more than a reader of strangers' files should (its own README says it
// is not secure against hostile files), so every file goes through check_image() first: a format we
// accept, dimensions and channels within the limits below, what Debian's stb_image 2.27 is known to
// overrun on, and a file as long as its format says (which catches truncated files that would
// otherwise decode into partly black images). JPEG, where such a check would have to follow the
// decoder's parsing byte for byte, goes to a decoder that refuses bad input itself (image_jpeg.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/errors.h"

enum class ImageFormat { Png, Jpeg, Bmp, Gif, Tga, Pnm };
const char* image_format_name(ImageFormat f);

// Limits set before decoding: a side above kMaxImageSide or more than kMaxImagePixels pixels is
// refused (64 Mpx is 256 MiB decoded as RGBA, per loader thread), and so is a file above
// kMaxImageFileBytes.
constexpr int kMaxImageSide = 16384;
constexpr int64_t kMaxImagePixels = int64_t(1) << 26;
constexpr uint64_t kMaxImageFileBytes = uint64_t(1) << 28;
// The header pass reads a file's first kImageHeadBytes and last kImageTailBytes (a JPEG whose
// header lies deeper, behind large metadata, is read whole).
constexpr size_t kImageHeadBytes = size_t(1) << 16;
constexpr size_t kImageTailBytes = 1024;

struct ImageHeader {
  ImageFormat format = ImageFormat::Png;
  int width = 0, height = 0;
  int channels = 0;  // as stored: 1 grey, 2 grey + alpha, 3 colour, 4 colour + alpha
};

// What check_image found: the header, or the reason the file is refused ("" when it is not).
struct ImageCheck {
  ImageHeader header;
  std::string problem;
  bool ok() const { return problem.empty(); }
};

// Checks a file from its first bytes (`head`, the whole file when it is short), its last bytes
// (`tail`) and its size. The format is the file's signature, whatever its extension; TGA, the one
// format without a signature, is what stb_image's TGA reader accepts when no signature matches. The
// size limits are checked on the size the header declares, before any decoder's own limits, so that
// an oversized image of any format is refused as too large.
ImageCheck check_image(const uint8_t* head, size_t head_size, const uint8_t* tail, size_t tail_size,
                       uint64_t file_size);
// The same, on a whole file in memory.
ImageCheck check_image_bytes(const uint8_t* bytes, size_t size);

// A file that passed the header check but did not decode: the run stops naming it (after saving).
struct ImageDecodeError : InputError {
  using InputError::InputError;
};

// Decoded pixels, interleaved (HWC).
struct DecodedImage {
  int width = 0, height = 0, channels = 0;
  std::vector<uint8_t> pixels;
};
// Checks and decodes a whole file held in memory to `channels` (1: grey; 3: colour, grey replicated;
// alpha dropped). ImageDecodeError naming `file` when it fails either.
DecodedImage decode_image(const uint8_t* bytes, size_t size, int channels, const std::string& file);

// Resizes so that the shorter side is `side` (the longer one side * long / short, rounded down) and
// takes the centre side x side crop (offset (long' - side) / 2 rounded half to even), as
// torchvision's Resize(side) + CenterCrop(side) do on PIL images: bilinear, antialiased when
// shrinking (the triangle filter widened by the scale factor, weights renormalised at the borders).
// `hwc` is width x height x channels interleaved; `chw` receives channels x side x side planes.
void resize_shorter_and_crop(const uint8_t* hwc, int width, int height, int channels, int side, uint8_t* chw);

// The whole path of one file: read, check, decode, resize and crop into `chw` (channels x side x
// side). ImageDecodeError naming the file when any step fails.
void load_image_file(const std::string& path, int channels, int side, uint8_t* chw);
