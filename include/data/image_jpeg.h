// JPEG files through libjpeg-turbo (its libjpeg API; Debian's libjpeg62-turbo-dev): the header, then
// the pixels.
//
// Why not stb_image, which decodes the other formats: it trusts a JPEG's tables (Debian's 2.27 writes
// past its Huffman size list on a table of more than 256 codes), and a check of our own in front of
// it has to follow its marker parsing byte for byte to be safe, which the fuzzer showed ours did not.
// libjpeg-turbo is fuzzed continuously upstream, refuses bad tables itself, and decodes 1.5x (32 px)
// to 2x (224 px) faster on one core (bench/results/decode-amd-epyc-2026-11-26.md). It is also what
// Pillow, and so torchvision, decodes JPEG with.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

// A progressive JPEG may hold any number of scans, each a pass over the whole image: more than this
// many is refused (libjpeg-turbo's own fuzz targets stop at 500 too), so that a small file cannot
// hold a loader thread for minutes.
constexpr int kMaxJpegScans = 500;

// Where a JPEG's FF D8 (start of image) begins: after any number of extra 0xFF fill bytes, which
// stb_image took before it and so do we (libjpeg-turbo is handed the file from there on). kNotJpeg
// when the bytes do not start a JPEG.
constexpr size_t kNotJpeg = SIZE_MAX;
size_t jpeg_start(const uint8_t* bytes, size_t size);

struct JpegHeader {
  int width = 0, height = 0;
  int channels = 0;     // 1 grey; 3 colour (YCbCr, RGB, CMYK and YCCK are all decoded to colour)
  std::string problem;  // "" when the header was read
};
// Reads the markers up to the first scan from a file's first `size` bytes: when they end before it, that is a problem too (the caller may read more of the file). A frame
// larger than libjpeg-turbo takes (65,500 a side) is read, not refused: the caller's size limit says
// so in its own words.
JpegHeader read_jpeg_header(const uint8_t* bytes, size_t size);

// Decodes a whole file to `channels` (1 grey, 3 colour) interleaved pixels of width x height;
// `problem` says why when it returns false (libjpeg-turbo's message).
bool decode_jpeg(const uint8_t* bytes, size_t size, int channels, int& width, int& height,
                 std::vector<uint8_t>& pixels, std::string& problem);
