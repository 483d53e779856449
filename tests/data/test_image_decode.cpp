// The image folder's decode path (image_decode.h): every accepted format decoded against the known
// pixels of the committed fixtures (tests/fixtures/images/make_images.py writes them from the same
// formulas as below), the resize and centre crop against Pillow's output and against a direct
// double-precision evaluation of its definition, and bad files refused with their reason before
// stb_image decodes anything.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/file_io.h"
#include "data/image_decode.h"
#include "support/test_files.h"

namespace {

using namespace test_files;

constexpr int W = 5, H = 4;  // every format fixture is 5x4

// The fixtures' pixels (the same formulas as make_images.py).
std::array<int, 3> rgb(int x, int y) {
  return {(x * 53 + y * 17 + 10) % 256, (x * 29 + y * 71 + 40) % 256, (x * 97 + y * 13 + 200) % 256};
}
int grey(int x, int y) { return (x * 41 + y * 67 + 5) % 256; }

std::vector<uint8_t> fixture(const std::string& name) { return read_file(repo_path("tests/fixtures/images/" + name)); }

struct FormatFixture {
  const char* name;
  ImageFormat format;
  int channels;   // as the header says
  bool colour;    // rgb() or grey()
  int tolerance;  // JPEG is lossy even at quality 100
};
const FormatFixture kFixtures[] = {
    {"rgb.png", ImageFormat::Png, 3, true, 0},       {"rgba.png", ImageFormat::Png, 4, true, 0},
    {"grey.png", ImageFormat::Png, 1, false, 0},     {"grey_alpha.png", ImageFormat::Png, 2, false, 0},
    {"palette.png", ImageFormat::Png, 3, true, 0},   {"grey16.png", ImageFormat::Png, 1, false, 0},
    {"UPPER.PNG", ImageFormat::Png, 3, true, 0},     {"rgb.jpg", ImageFormat::Jpeg, 3, true, 4},
    {"grey.jpeg", ImageFormat::Jpeg, 1, false, 4},   {"rgb_progressive.jpg", ImageFormat::Jpeg, 3, true, 4},
    {"cmyk.jpg", ImageFormat::Jpeg, 3, true, 4},     {"rgb.bmp", ImageFormat::Bmp, 3, true, 0},
    {"grey.bmp", ImageFormat::Bmp, 3, false, 0},     {"rgb.tga", ImageFormat::Tga, 3, true, 0},
    {"rgb_rle.tga", ImageFormat::Tga, 3, true, 0},   {"palette.gif", ImageFormat::Gif, 4, true, 0},
    {"rgb.ppm", ImageFormat::Pnm, 3, true, 0},       {"grey.pgm", ImageFormat::Pnm, 1, false, 0},
};

TEST(ImageCheck, ReadsTheHeaderOfEveryFormat) {
  for (const FormatFixture& f : kFixtures) {
    SCOPED_TRACE(f.name);
    const std::vector<uint8_t> bytes = fixture(f.name);
    const ImageCheck c = check_image_bytes(bytes.data(), bytes.size());
    ASSERT_TRUE(c.ok()) << c.problem;
    EXPECT_EQ(image_format_name(c.header.format), std::string(image_format_name(f.format)));
    EXPECT_EQ(c.header.width, W);
    EXPECT_EQ(c.header.height, H);
    EXPECT_EQ(c.header.channels, f.channels);
  }
}

// Decoded to three channels (grey replicated, alpha dropped) and, for grey files, to one.
TEST(DecodeImage, EveryFormatGivesItsKnownPixels) {
  for (const FormatFixture& f : kFixtures) {
    const std::vector<uint8_t> bytes = fixture(f.name);
    for (int channels : {3, 1}) {
      if (f.colour && channels == 1) continue;  // colour to grey is stb_image's luma, not ours to test
      SCOPED_TRACE(std::string(f.name) + " to " + std::to_string(channels) + " channels");
      const DecodedImage img = decode_image(bytes.data(), bytes.size(), channels, f.name);
      ASSERT_EQ(img.width, W);
      ASSERT_EQ(img.height, H);
      ASSERT_EQ(img.channels, channels);
      ASSERT_EQ(img.pixels.size(), size_t(W) * H * channels);
      for (int y = 0; y < H; ++y)
        for (int x = 0; x < W; ++x)
          for (int c = 0; c < channels; ++c) {
            const int want = f.colour ? rgb(x, y)[c] : grey(x, y);
            ASSERT_NEAR(img.pixels[(size_t(y) * W + x) * channels + c], want, f.tolerance)
                << "pixel (" << x << ", " << y << ") channel " << c;
          }
    }
  }
}

// ---- resize and crop ----------------------------------------------------------------------------
struct Image {
  int width, height, channels;
  std::vector<uint8_t> pixels;  // interleaved
};

Image random_image(int width, int height, int channels, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Image im{width, height, channels, std::vector<uint8_t>(size_t(width) * height * channels)};
  for (uint8_t& v : im.pixels) v = static_cast<uint8_t>(rng() >> 56);
  return im;
}

std::vector<uint8_t> resized(const Image& im, int side) {
  std::vector<uint8_t> chw(size_t(im.channels) * side * side, 0xEE);
  resize_shorter_and_crop(im.pixels.data(), im.width, im.height, im.channels, side, chw.data());
  return chw;
}

// The definition, evaluated directly in 2D and in double: output pixel (x, y) of the crop is the
// triangle-weighted mean of all input pixels around its centre in input coordinates, the triangle
// widened by the scale factor when shrinking, its weights renormalised over the pixels that exist.
std::vector<double> reference(const Image& im, int side) {
  const bool wide = im.width > im.height;
  const int short_in = wide ? im.height : im.width, long_in = wide ? im.width : im.height;
  const int long_out = static_cast<int>(std::floor(double(side) * long_in / short_in));
  const int rw = wide ? long_out : side, rh = wide ? side : long_out;
  auto half_even = [](double v) { return static_cast<int>(std::nearbyint(v)); };
  const int ox = half_even((rw - side) / 2.0), oy = half_even((rh - side) / 2.0);
  const double sx = double(im.width) / rw, sy = double(im.height) / rh;
  const double fx = std::max(sx, 1.0), fy = std::max(sy, 1.0);
  auto tri = [](double d) { return std::abs(d) < 1 ? 1 - std::abs(d) : 0.0; };
  std::vector<double> out(size_t(im.channels) * side * side);
  for (int y = 0; y < side; ++y)
    for (int x = 0; x < side; ++x) {
      const double cx = (ox + x + 0.5) * sx, cy = (oy + y + 0.5) * sy;
      for (int c = 0; c < im.channels; ++c) {
        double sum = 0, total = 0;
        for (int j = 0; j < im.height; ++j)
          for (int i = 0; i < im.width; ++i) {
            const double w = tri((i + 0.5 - cx) / fx) * tri((j + 0.5 - cy) / fy);
            sum += w * im.pixels[(size_t(j) * im.width + i) * im.channels + c];
            total += w;
          }
        out[(size_t(c) * side + y) * side + x] = sum / total;
      }
    }
  return out;
}

TEST(ResizeCrop, MatchesADirectDoublePrecisionReference) {
  struct Case {
    int width, height, channels, side;
  };
  const Case cases[] = {{37, 23, 3, 8},  {23, 37, 1, 8},  {5, 7, 1, 16},   {100, 64, 3, 32}, {64, 100, 3, 24},
                        {1, 50, 3, 8},   {50, 1, 1, 8},   {33, 33, 3, 32}, {31, 47, 3, 64},  {300, 200, 1, 16}};
  uint64_t seed = 1;
  for (const Case& k : cases) {
    SCOPED_TRACE(std::to_string(k.width) + "x" + std::to_string(k.height) + "x" + std::to_string(k.channels) +
                 " to " + std::to_string(k.side));
    const Image im = random_image(k.width, k.height, k.channels, seed++);
    const std::vector<uint8_t> got = resized(im, k.side);
    const std::vector<double> want = reference(im, k.side);
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_LE(std::abs(got[i] - want[i]), 0.5 + 1e-3) << "element " << i << ": got " << int(got[i]) << ", want " << want[i];
  }
}

// Pillow's own resize (what torchvision's Resize does on PIL images), cropped as CenterCrop does: equal
// within 1 (Pillow rounds its intermediate rows to 8 bits, we keep them in float).
TEST(ResizeCrop, MatchesPillowShrinkingAndGrowing) {
  struct Ref {
    const char *src, *ref;
    int channels, side;
  };
  for (const Ref& r : {Ref{"resize_shrink_src.png", "resize_shrink_ref8.png", 3, 8},
                       Ref{"resize_grow_src.png", "resize_grow_ref16.png", 1, 16}}) {
    SCOPED_TRACE(r.src);
    const std::vector<uint8_t> sb = fixture(r.src), rb = fixture(r.ref);
    const DecodedImage src = decode_image(sb.data(), sb.size(), r.channels, r.src);
    const DecodedImage ref = decode_image(rb.data(), rb.size(), r.channels, r.ref);
    ASSERT_EQ(ref.width, r.side);
    ASSERT_EQ(ref.height, r.side);
    std::vector<uint8_t> chw(size_t(r.channels) * r.side * r.side);
    resize_shorter_and_crop(src.pixels.data(), src.width, src.height, r.channels, r.side, chw.data());
    int worst = 0;
    for (int y = 0; y < r.side; ++y)
      for (int x = 0; x < r.side; ++x)
        for (int c = 0; c < r.channels; ++c)
          worst = std::max(worst, std::abs(chw[(size_t(c) * r.side + y) * r.side + x] -
                                           ref.pixels[(size_t(y) * r.side + x) * r.channels + c]));
    EXPECT_LE(worst, 1);
  }
}

TEST(ResizeCrop, SameSizeIsTheIdentity) {
  for (int channels : {1, 3}) {
    const Image im = random_image(32, 32, channels, 77);
    const std::vector<uint8_t> got = resized(im, 32);
    for (int y = 0; y < 32; ++y)
      for (int x = 0; x < 32; ++x)
        for (int c = 0; c < channels; ++c)
          ASSERT_EQ(got[(size_t(c) * 32 + y) * 32 + x], im.pixels[(size_t(y) * 32 + x) * channels + c]);
  }
}

// With the shorter side already at `side` the longer one is only cropped: the centre offset is
// (length - side) / 2 rounded half to even, as Python's round() in torchvision's CenterCrop.
TEST(ResizeCrop, CentreCropOffsetRoundsHalfToEven) {
  const int side = 8;
  const std::pair<int, int> extra_and_offset[] = {{1, 0}, {2, 1}, {3, 2}, {4, 2}, {5, 2}, {7, 4}, {9, 4}};
  for (const auto& [extra, offset] : extra_and_offset)
    for (bool wide : {true, false}) {
      SCOPED_TRACE(std::to_string(extra) + (wide ? " extra columns" : " extra rows"));
      const int w = wide ? side + extra : side, h = wide ? side : side + extra;
      Image im{w, h, 1, std::vector<uint8_t>(size_t(w) * h)};
      for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) im.pixels[size_t(y) * w + x] = static_cast<uint8_t>(wide ? x * 10 : y * 10);
      const std::vector<uint8_t> got = resized(im, side);
      EXPECT_EQ(got[0], offset * 10);
      EXPECT_EQ(got[side * side - 1], (offset + side - 1) * 10);
    }
}

// ---- bad files ----------------------------------------------------------------------------------
std::vector<uint8_t> without_last(std::vector<uint8_t> b, size_t n) {
  b.resize(b.size() - n);
  return b;
}

std::vector<uint8_t> text(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

// A PNG whose IHDR claims width x height (stb_image does not check chunk CRCs).
std::vector<uint8_t> png_claiming(uint32_t width, uint32_t height) {
  std::vector<uint8_t> b = fixture("rgb.png");
  for (int i = 0; i < 4; ++i) {
    b[16 + i] = static_cast<uint8_t>(width >> (24 - 8 * i));
    b[20 + i] = static_cast<uint8_t>(height >> (24 - 8 * i));
  }
  return b;
}

// rgb.jpg with its first Huffman table claiming `codes` codes (stb_image 2.27 writes past its
// 257-entry list for more than 256).
std::vector<uint8_t> jpeg_with_huffman_codes(int codes) {
  std::vector<uint8_t> b = fixture("rgb.jpg");
  const size_t dht = std::string(b.begin(), b.end()).find("\xff\xc4");
  for (int k = 0; k < 16; ++k) b[dht + 5 + k] = 0;
  for (int k = 0; codes > 0; ++k, codes -= 255) b[dht + 5 + k] = static_cast<uint8_t>(std::min(codes, 255));
  return b;
}

// A PNG whose first IDAT chunk is empty (stb_image 2.27 copies into a null buffer).
std::vector<uint8_t> png_with_empty_idat() {
  const std::vector<uint8_t> good = fixture("rgb.png");
  std::vector<uint8_t> b(good.begin(), good.begin() + 33);  // signature and IHDR
  for (uint8_t v : std::vector<uint8_t>{0, 0, 0, 0, 'I', 'D', 'A', 'T', 0x35, 0xaf, 0x06, 0x1e}) b.push_back(v);  // and its CRC
  b.insert(b.end(), good.end() - 12, good.end());  // IEND
  return b;
}

TEST(ImageCheck, RefusesBadFilesWithTheirReason) {
  struct Bad {
    const char* what;
    std::vector<uint8_t> bytes;
    const char* reason;
  };
  const Bad cases[] = {
      {"empty", {}, "empty file"},
      {"text", text("hello, not an image at all"), "not a PNG, JPEG, BMP, GIF, PNM or TGA file"},
      {"ascii pgm", text("P2\n5 4\n255\n1 2 3\n"), "P1-P4"},
      {"16-bit pgm", text("P5\n2 1\n65535\n\x01\x02\x03\x04"), "16-bit PNM"},
      {"truncated png", without_last(fixture("rgb.png"), 20), "truncated: the PNG has no IEND chunk"},
      {"truncated jpeg", without_last(fixture("rgb.jpg"), 10), "truncated: the JPEG has no end-of-image marker"},
      {"truncated gif", without_last(fixture("palette.gif"), 1), "truncated: the GIF does not end"},
      {"truncated bmp", without_last(fixture("rgb.bmp"), 5), "truncated: 113 bytes, the BMP header needs 118"},
      {"truncated tga", without_last(fixture("rgb.tga"), 30), "truncated: 74 bytes, the TGA header needs 78"},
      {"truncated ppm", without_last(fixture("rgb.ppm"), 5), "truncated: 66 bytes, the PNM header needs 71"},
      {"too wide", png_claiming(20000, 4), "20000x4 is larger than the limit of 16384 pixels a side"},
      {"too many pixels", png_claiming(9000, 9000), "9000x9000 has more than the limit of 64 Mpx"},
      {"huge huffman table", jpeg_with_huffman_codes(300), "unreadable JPEG header (Bogus Huffman table definition)"},
      {"19-digit pnm number", text("P5\n1234567890123456789 4\n255\n"), "malformed PNM header"},
      {"empty first idat", png_with_empty_idat(), "corrupt PNG: an empty first IDAT chunk"},
      {"broken png header", [] { auto b = fixture("rgb.png"); b[24] = 3; b[25] = 7; return b; }(), "unreadable PNG header"},
  };
  for (const Bad& b : cases) {
    SCOPED_TRACE(b.what);
    const ImageCheck c = check_image_bytes(b.bytes.data(), b.bytes.size());
    EXPECT_FALSE(c.ok());
    EXPECT_HAS(c.problem, b.reason);
    // decode_image refuses it the same way, naming the file, without decoding.
    try {
      decode_image(b.bytes.data(), b.bytes.size(), 3, "dir/bad.img");
      ADD_FAILURE() << "decoded";
    } catch (const ImageDecodeError& e) {
      EXPECT_EQ(std::string(e.what()), "dir/bad.img: " + c.problem);
    }
  }
}

// stb_image took 0xFF fill bytes before a JPEG's start marker, and so do we (its format is JPEG, it
// decodes, and its tables are still checked).
TEST(ImageCheck, AJpegAfterFillBytesIsAJpeg) {
  std::vector<uint8_t> b = fixture("rgb.jpg");
  b.insert(b.begin(), 5, 0xff);
  const ImageCheck c = check_image_bytes(b.data(), b.size());
  ASSERT_TRUE(c.ok()) << c.problem;
  EXPECT_EQ(c.header.format, ImageFormat::Jpeg);
  const DecodedImage img = decode_image(b.data(), b.size(), 3, "fill.jpg");
  ASSERT_EQ(img.pixels.size(), size_t(W) * H * 3);
  EXPECT_NEAR(img.pixels[0], rgb(0, 0)[0], 4);
  std::vector<uint8_t> bad = jpeg_with_huffman_codes(257);
  bad.insert(bad.begin(), 3, 0xff);
  EXPECT_HAS(check_image_bytes(bad.data(), bad.size()).problem, "Bogus Huffman table definition");
}

// Issue 38: a Huffman table of 4,080 codes after the first scan, reached through entropy-coded data
// holding FF FF 00 (tests/fixtures/images/make_images.py says how it is made). stb_image 2.27 wrote
// past its Huffman size list on it (UBSan: stb_image.h:1990, found by `make fuzz`); libjpeg-turbo
// refuses the table. The header before the scan is sound, so the check passes and decoding refuses
// it, naming the file and the reason.
TEST(DecodeImage, AHuffmanTableOfTooManyCodesAfterTheFirstScanIsRefused) {
  const std::vector<uint8_t> b = fixture("dht_overflow.jpg");
  const ImageCheck c = check_image_bytes(b.data(), b.size());
  ASSERT_TRUE(c.ok()) << c.problem;
  EXPECT_EQ(c.header.width, 8);
  try {
    decode_image(b.data(), b.size(), 3, "cls/dht.jpg");
    ADD_FAILURE() << "decoded";
  } catch (const ImageDecodeError& e) {
    EXPECT_EQ(std::string(e.what()), "cls/dht.jpg: cannot decode the JPEG (Bogus Huffman table definition)");
  }
}

// A size too large for the limits is said to be too large, whatever the format, before any decoder's
// own limit speaks (stb_image refused a 100000x100000 PNG itself, and what reached us was the reason of
// the last format it tried: "unknown image type").
std::vector<uint8_t> with_bytes_at(std::vector<uint8_t> b, size_t at, std::vector<uint8_t> bytes) {
  std::copy(bytes.begin(), bytes.end(), b.begin() + at);
  return b;
}
std::vector<uint8_t> le32_bytes(uint32_t v) { return {uint8_t(v), uint8_t(v >> 8), uint8_t(v >> 16), uint8_t(v >> 24)}; }

TEST(ImageCheck, AnOversizedImageOfEveryFormatIsTooLarge) {
  std::vector<uint8_t> jpeg = fixture("rgb.jpg");
  const size_t sof = std::string(jpeg.begin(), jpeg.end()).find("\xff\xc0");
  ASSERT_NE(sof, std::string::npos);
  struct Big {
    const char* what;
    std::vector<uint8_t> bytes;
    const char* reason;
  };
  const Big cases[] = {
      {"png", png_claiming(100000, 100000), "100000x100000 is larger than the limit of 16384 pixels a side"},
      {"jpeg past libjpeg's limit", with_bytes_at(jpeg, sof + 5, {0xff, 0xff, 0xff, 0xff}),
       "65535x65535 is larger than the limit of 16384 pixels a side"},
      {"jpeg", with_bytes_at(jpeg, sof + 5, {0x4e, 0x20, 0x00, 0x04}), "4x20000 is larger than the limit"},
      {"bmp", with_bytes_at(fixture("rgb.bmp"), 18, le32_bytes(20000000)), "20000000x4 is larger than the limit"},
      {"gif", with_bytes_at(fixture("palette.gif"), 6, {0xff, 0xff, 0xff, 0xff}), "65535x65535 is larger than the limit"},
      {"tga", with_bytes_at(fixture("rgb.tga"), 12, {0xff, 0xff, 0xff, 0xff}), "65535x65535 is larger than the limit"},
      {"pnm", text("P5\n1234567890 4\n255\n"), "1234567890x4 is larger than the limit"},
  };
  for (const Big& b : cases) {
    SCOPED_TRACE(b.what);
    EXPECT_HAS(check_image_bytes(b.bytes.data(), b.bytes.size()).problem, b.reason);
  }
}

// A BMP stored top-down declares a negative height: it is an image like any other.
TEST(DecodeImage, ATopDownBmpGivesItsKnownPixels) {
  const std::vector<uint8_t> bottom_up = fixture("rgb.bmp");
  std::vector<uint8_t> b = with_bytes_at(bottom_up, 22, le32_bytes(uint32_t(-H)));
  const size_t data = bottom_up[10], row = (W * 3 + 3) / 4 * 4;
  for (int y = 0; y < H; ++y)
    std::copy_n(bottom_up.begin() + data + row * (H - 1 - y), row, b.begin() + data + row * y);
  const ImageCheck c = check_image_bytes(b.data(), b.size());
  ASSERT_TRUE(c.ok()) << c.problem;
  EXPECT_EQ(c.header.height, H);
  const DecodedImage img = decode_image(b.data(), b.size(), 3, "top-down.bmp");
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x)
      for (int ch = 0; ch < 3; ++ch) ASSERT_EQ(img.pixels[(size_t(y) * W + x) * 3 + ch], rgb(x, y)[ch]);
}

// The header and the end are fine, the compressed pixels are not: the check passes (it reads no
// pixels), decoding fails, and the error names the file.
TEST(DecodeImage, AFileThatPassesTheCheckButDoesNotDecodeIsNamed) {
  std::vector<uint8_t> b = fixture("rgb.png");
  const size_t idat = std::string(b.begin(), b.end()).find("IDAT");
  ASSERT_NE(idat, std::string::npos);
  for (size_t i = idat + 4; i < idat + 12; ++i) b[i] = 0xFF;  // the zlib header and the first data
  ASSERT_TRUE(check_image_bytes(b.data(), b.size()).ok());
  try {
    decode_image(b.data(), b.size(), 3, "cls/x.png");
    ADD_FAILURE() << "decoded";
  } catch (const ImageDecodeError& e) {
    EXPECT_HAS(e.what(), "cls/x.png: cannot decode the PNG");
  }
}

TEST(LoadImageFile, DecodesResizesAndNamesAMissingFile) {
  std::vector<uint8_t> chw(3 * 8 * 8);
  load_image_file(repo_path("tests/fixtures/images/resize_shrink_src.png"), 3, 8, chw.data());
  const std::vector<uint8_t> ref = fixture("resize_shrink_ref8.png");
  const DecodedImage want = decode_image(ref.data(), ref.size(), 3, "ref");
  for (int c = 0; c < 3; ++c)
    for (int p = 0; p < 64; ++p) ASSERT_NEAR(chw[c * 64 + p], want.pixels[p * 3 + c], 1);
  TempDir dir;
  try {
    load_image_file(dir / "missing.png", 3, 8, chw.data());
    ADD_FAILURE() << "loaded a missing file";
  } catch (const ImageDecodeError& e) {
    EXPECT_HAS(e.what(), dir / "missing.png");
  }
}

}  // namespace
