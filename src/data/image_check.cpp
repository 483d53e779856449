// The header check of one image file (image_decode.h): its format by signature, what stb_image or
// libjpeg-turbo read of its header, the limits, and whether the file is as long as its format says.
// Nothing here decodes pixels.
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <optional>

#include <stb_image.h>  // the declarations; image_decode.cpp holds the implementation

#include "data/image_decode.h"
#include "data/image_jpeg.h"

const char* image_format_name(ImageFormat f) {
  switch (f) {
    case ImageFormat::Png: return "PNG";
    case ImageFormat::Jpeg: return "JPEG";
    case ImageFormat::Bmp: return "BMP";
    case ImageFormat::Gif: return "GIF";
    case ImageFormat::Tga: return "TGA";
    case ImageFormat::Pnm: return "PNM";
  }
  return "?";
}

namespace {

bool starts_with(const uint8_t* p, size_t n, const char* sig, size_t len) {
  return n >= len && std::memcmp(p, sig, len) == 0;
}

bool contains(const uint8_t* p, size_t n, const char* pattern, size_t len) {
  const auto* pat = reinterpret_cast<const uint8_t*>(pattern);  // char may be signed: compare bytes
  return n >= len && std::search(p, p + n, pat, pat + len) != p + n;
}

uint32_t le16(const uint8_t* p) { return uint32_t(p[0]) | uint32_t(p[1]) << 8; }
uint32_t le32(const uint8_t* p) { return le16(p) | le16(p + 2) << 16; }
uint32_t be16(const uint8_t* p) { return uint32_t(p[0]) << 8 | p[1]; }
uint32_t be32(const uint8_t* p) { return be16(p) << 16 | be16(p + 2); }

// The format by its signature. TGA has none: it is what is left when no other signature matches
// (stb_image's TGA reader then decides).
ImageFormat sniff(const uint8_t* p, size_t n) {
  if (jpeg_start(p, n) != kNotJpeg) return ImageFormat::Jpeg;
  if (starts_with(p, n, "\x89PNG\r\n\x1a\n", 8)) return ImageFormat::Png;
  if (starts_with(p, n, "GIF87a", 6) || starts_with(p, n, "GIF89a", 6)) return ImageFormat::Gif;
  if (starts_with(p, n, "BM", 2)) return ImageFormat::Bmp;
  if (starts_with(p, n, "P5", 2) || starts_with(p, n, "P6", 2)) return ImageFormat::Pnm;
  return ImageFormat::Tga;
}

// Where the pixel data of a binary PNM (P5/P6) starts and how deep it is, from its text header:
// magic, width, height, maxval (whitespace and # comments between), then one whitespace byte. A
// number of more than 18 digits is malformed; one of more than 9 (stb_image 2.27 overflows an int
// reading it) is read, and refused by the size limits before stb_image sees it.
struct PnmLayout {
  size_t data_offset = 0;
  long long width = 0, height = 0, maxval = 0;
  bool ok = false;
};
PnmLayout pnm_layout(const uint8_t* p, size_t n) {
  PnmLayout l;
  size_t i = 2;
  long long values[3] = {};
  for (long long& v : values) {
    while (i < n && (std::isspace(p[i]) || p[i] == '#')) {
      if (p[i] == '#')
        while (i < n && p[i] != '\n' && p[i] != '\r') ++i;
      else
        ++i;
    }
    if (i >= n || !std::isdigit(p[i])) return l;
    for (int digits = 0; i < n && std::isdigit(p[i]); ++i, ++digits) {
      if (digits == 18) return l;
      v = v * 10 + (p[i] - '0');
    }
  }
  if (i >= n || !std::isspace(p[i])) return l;
  l.data_offset = i + 1;
  l.width = values[0];
  l.height = values[1];
  l.maxval = values[2];
  l.ok = true;
  return l;
}

// Bytes of pixel data after the header for the uncompressed variants of BMP and TGA (0: compressed,
// not known without decoding), and where that data starts.
struct RawExtent {
  uint64_t offset = 0, bytes = 0;
};
RawExtent bmp_extent(const uint8_t* p, size_t n, const ImageHeader& h) {
  if (n < 34) return {};
  const uint32_t header_size = le32(p + 14);
  const uint32_t bits = header_size == 12 ? le16(p + 24) : le16(p + 28);
  const uint32_t compression = header_size == 12 ? 0 : le32(p + 30);
  if (compression != 0 && compression != 3) return {};  // RLE: its length is in the data
  const uint64_t row = (uint64_t(h.width) * bits + 31) / 32 * 4;
  return {le32(p + 10), row * uint64_t(h.height)};
}
RawExtent tga_extent(const uint8_t* p, size_t n, const ImageHeader& h) {
  if (n < 18 || p[2] < 1 || p[2] > 3) return {};  // types 9-11 are run-length encoded
  const uint64_t palette = p[1] ? uint64_t(le16(p + 5)) * ((p[7] + 7u) / 8) : 0;
  return {18 + uint64_t(p[0]) + palette, uint64_t(h.width) * h.height * ((p[16] + 7u) / 8)};
}

// "" when the file is as long as its format says; else why it looks truncated.
std::string completeness(const ImageHeader& h, const uint8_t* head, size_t head_size, const uint8_t* tail,
                         size_t tail_size, uint64_t file_size) {
  RawExtent raw;
  switch (h.format) {
    case ImageFormat::Png:
      return contains(tail, tail_size, "IEND\xae\x42\x60\x82", 8) ? "" : "truncated: the PNG has no IEND chunk at its end";
    case ImageFormat::Jpeg:
      return contains(tail, tail_size, "\xff\xd9", 2) ? "" : "truncated: the JPEG has no end-of-image marker (FF D9) at its end";
    case ImageFormat::Gif:
      return tail_size > 0 && tail[tail_size - 1] == 0x3b ? "" : "truncated: the GIF does not end with its trailer byte (0x3B)";
    case ImageFormat::Bmp: raw = bmp_extent(head, head_size, h); break;
    case ImageFormat::Tga: raw = tga_extent(head, head_size, h); break;
    case ImageFormat::Pnm: {
      const PnmLayout l = pnm_layout(head, head_size);
      raw = {l.data_offset, uint64_t(h.width) * h.height * h.channels};
      break;
    }
  }
  if (raw.bytes == 0 || raw.offset + raw.bytes <= file_size) return "";
  return "truncated: " + std::to_string(file_size) + " bytes, the " + image_format_name(h.format) + " header needs " +
         std::to_string(raw.offset + raw.bytes);
}

// A PNG whose first IDAT chunk is empty: stb_image 2.27 copies 0 bytes into a null buffer (undefined
// behaviour). No encoder writes one.
std::string png_structure_problem(const uint8_t* p, size_t n) {
  for (size_t i = 8; i + 8 <= n;) {
    const uint32_t len = be32(p + i);
    if (std::memcmp(p + i + 4, "IDAT", 4) == 0) return len == 0 ? "corrupt PNG: an empty first IDAT chunk" : "";
    if (len > n - i - 8) return "";  // runs past what we have: stb_image reports a real truncation
    i += 12 + size_t(len);
  }
  return "";
}

// What stb_image must not be shown at all, not even to read the header (it parses more than the
// header: every number of a PNM header, PNG chunks up to IDAT).
std::string before_stb_problem(ImageFormat f, const uint8_t* head, size_t n) {
  if (f == ImageFormat::Png) return png_structure_problem(head, n);
  if (f != ImageFormat::Pnm) return "";
  const PnmLayout l = pnm_layout(head, n);
  if (!l.ok || l.maxval < 1) return "malformed PNM header";
  if (l.maxval > 255) return "16-bit PNM (maxval " + std::to_string(l.maxval) + ") is not supported";
  return "";
}

// The size limits, on what a header declares (a BMP's, a PNM's and a PNG's numbers exceed an int).
std::string size_problem(int64_t width, int64_t height) {
  const std::string dims = std::to_string(width) + "x" + std::to_string(height);
  if (width < 1 || height < 1) return "implausible size " + dims;
  if (width > kMaxImageSide || height > kMaxImageSide)
    return dims + " is larger than the limit of " + std::to_string(kMaxImageSide) + " pixels a side";
  if (width * height > kMaxImagePixels)
    return dims + " has more than the limit of " + std::to_string(kMaxImagePixels >> 20) + " Mpx";
  return "";
}

// The size a PNG, GIF, BMP or PNM header declares, read here so that the size limits speak before
// stb_image: its header reader refuses some large images itself, and what reaches us then is the
// reason of the last format it tried ("unknown image type"). nullopt where the bytes at hand do not
// hold it (stb_image then says what is wrong), and for TGA, which has no signature to be sure of.
struct DeclaredSize {
  int64_t width, height;
};
std::optional<DeclaredSize> declared_size(ImageFormat f, const uint8_t* p, size_t n) {
  switch (f) {
    case ImageFormat::Png:
      if (n < 24 || std::memcmp(p + 12, "IHDR", 4) != 0) return std::nullopt;
      return DeclaredSize{be32(p + 16), be32(p + 20)};
    case ImageFormat::Gif:
      if (n < 10) return std::nullopt;
      return DeclaredSize{le16(p + 6), le16(p + 8)};
    case ImageFormat::Bmp:
      if (n < 26) return std::nullopt;
      if (le32(p + 14) == 12) return DeclaredSize{le16(p + 18), le16(p + 20)};  // OS/2's header: 16-bit sizes
      // Signed: a negative height is a top-down image (stb_image's header reader passes it on negative).
      return DeclaredSize{int32_t(le32(p + 18)), std::abs(int64_t(int32_t(le32(p + 22))))};
    case ImageFormat::Pnm: {
      const PnmLayout l = pnm_layout(p, n);
      if (!l.ok) return std::nullopt;
      return DeclaredSize{l.width, l.height};
    }
    default: return std::nullopt;
  }
}

// JPEG: libjpeg-turbo reads the header (a frame too large for it comes back with its size).
std::string jpeg_header(const uint8_t* p, size_t n, ImageHeader& h) {
  const JpegHeader j = read_jpeg_header(p, n);
  h.width = j.width;
  h.height = j.height;
  h.channels = j.channels;
  return j.problem.empty() ? "" : "unreadable JPEG header (" + j.problem + ")";
}

// The other formats: what stb_image must not see, the declared size, then stb_image's header reader.
std::string stb_header(const uint8_t* p, size_t n, ImageHeader& h) {
  std::string problem = before_stb_problem(h.format, p, n);
  if (!problem.empty()) return problem;
  const std::optional<DeclaredSize> size = declared_size(h.format, p, n);
  if (size && !(problem = size_problem(size->width, size->height)).empty()) return problem;
  const int usable = static_cast<int>(std::min(n, size_t(kMaxImageFileBytes)));
  if (!stbi_info_from_memory(p, usable, &h.width, &h.height, &h.channels))
    return h.format == ImageFormat::Tga
               ? std::string("not a PNG, JPEG, BMP, GIF, PNM or TGA file")
               : std::string("unreadable ") + image_format_name(h.format) + " header (" + stbi_failure_reason() + ")";
  if (size) {  // within the limits: an int
    h.width = static_cast<int>(size->width);
    h.height = static_cast<int>(size->height);
  }
  return "";
}

}  // namespace

ImageCheck check_image(const uint8_t* head, size_t head_size, const uint8_t* tail, size_t tail_size,
                       uint64_t file_size) {
  ImageCheck c;
  if (file_size == 0) return {{}, "empty file"};
  if (file_size > kMaxImageFileBytes)
    return {{}, std::to_string(file_size) + " bytes, above the limit of " + std::to_string(kMaxImageFileBytes >> 20) + " MiB"};
  if (starts_with(head, head_size, "P1", 2) || starts_with(head, head_size, "P2", 2) ||
      starts_with(head, head_size, "P3", 2) || starts_with(head, head_size, "P4", 2))
    return {{}, "text or 1-bit PNM (P1-P4) is not supported: save it as binary P5/P6"};
  c.header.format = sniff(head, head_size);
  c.problem = c.header.format == ImageFormat::Jpeg ? jpeg_header(head, head_size, c.header)
                                                   : stb_header(head, head_size, c.header);
  if (!c.ok()) return c;
  c.problem = size_problem(c.header.width, c.header.height);
  if (!c.ok()) return c;
  if (c.header.channels < 1 || c.header.channels > 4)
    return {c.header, std::to_string(c.header.channels) + " channels (1 to 4 are accepted)"};
  c.problem = completeness(c.header, head, head_size, tail, tail_size, file_size);
  return c;
}

ImageCheck check_image_bytes(const uint8_t* bytes, size_t size) {
  const size_t tail = std::min(size, kImageTailBytes);
  return check_image(bytes, size, bytes + size - tail, tail, size);
}

