// JPEG through libjpeg-turbo (image_jpeg.h).
//
// libjpeg reports a fatal error by calling error_exit, which must not return: ours longjmps back to
// the function that set up the decompressor. So those functions hold no C++ object with a destructor
// from setjmp on (what the longjmp skips is C frames only), and make every libjpeg call after it,
// jpeg_create_decompress (which can run out of memory) included.
// Warnings (corrupt entropy-coded data, extra bytes before a marker) are what Pillow decodes through
// as well: they are counted, not printed, and the image is decoded.
#include "data/image_jpeg.h"

#include <csetjmp>
#include <cstdint>
#include <cstdio>

#include <jpeglib.h>  // after <cstdio>: it uses FILE and size_t without including them
#include <jerror.h>

namespace {

// One decompression's error handling: libjpeg hands back the error manager (the first member) as
// cinfo->err, and the progress manager as cinfo->progress.
struct Session {
  jpeg_error_mgr errors;
  jpeg_progress_mgr progress;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

Session& session_of(j_common_ptr c) { return *reinterpret_cast<Session*>(c->err); }

[[noreturn]] void fail(j_common_ptr c) {
  Session& s = session_of(c);
  (*c->err->format_message)(c, s.message);
  std::longjmp(s.jump, 1);
}

void count_warnings(j_common_ptr c, int level) {
  if (level < 0) ++c->err->num_warnings;
}

void print_nothing(j_common_ptr) {}

// Called between passes over the input: a progressive file's scans are counted here.
void limit_scans(j_common_ptr c) {
  const auto* d = reinterpret_cast<j_decompress_ptr>(c);
  if (d->input_scan_number <= kMaxJpegScans) return;
  Session& s = session_of(c);
  std::snprintf(s.message, sizeof(s.message), "more than %d progressive scans", kMaxJpegScans);
  std::longjmp(s.jump, 1);
}

void prepare(jpeg_decompress_struct& d, Session& s) {
  d.err = jpeg_std_error(&s.errors);
  s.errors.error_exit = fail;
  s.errors.emit_message = count_warnings;
  s.errors.output_message = print_nothing;
  s.progress.progress_monitor = limit_scans;
  s.message[0] = '\0';
}

// The colour channels a component layout decodes to; 0 for one libjpeg cannot convert (2 components,
// or more than 4).
int decoded_channels(J_COLOR_SPACE space) {
  switch (space) {
    case JCS_GRAYSCALE: return 1;
    case JCS_YCbCr: case JCS_RGB: case JCS_CMYK: case JCS_YCCK: return 3;
    default: return 0;
  }
}

// CMYK to RGB in place (4 bytes a pixel in, `channels` out), as Pillow converts: Adobe's files store
// the inks inverted (255 - ink), others as they are. One channel is the luma of the RGB.
void cmyk_to(uint8_t* px, size_t pixels, int channels, bool inverted) {
  for (size_t i = 0; i < pixels; ++i) {
    const uint8_t* in = px + 4 * i;
    const unsigned k = inverted ? in[3] : 255u - in[3];
    unsigned rgb[3];
    for (int c = 0; c < 3; ++c) {
      const unsigned ink = inverted ? in[c] : 255u - in[c];
      rgb[c] = (ink * k + 127) / 255;
    }
    uint8_t* out = px + size_t(channels) * i;  // never ahead of `in`: channels <= 4
    if (channels == 1) {
      out[0] = static_cast<uint8_t>((rgb[0] * 299 + rgb[1] * 587 + rgb[2] * 114 + 500) / 1000);
    } else {
      for (int c = 0; c < 3; ++c) out[c] = static_cast<uint8_t>(rgb[c]);
    }
  }
}

}  // namespace

size_t jpeg_start(const uint8_t* p, size_t n) {
  size_t i = 0;
  while (i < n && p[i] == 0xff) ++i;
  return i > 0 && i < n && p[i] == 0xd8 ? i - 1 : kNotJpeg;
}

JpegHeader read_jpeg_header(const uint8_t* bytes, size_t size) {
  JpegHeader h;
  const size_t start = jpeg_start(bytes, size);
  if (start == kNotJpeg) return {0, 0, 0, "not a JPEG"};
  jpeg_decompress_struct d{};  // zero: destroying it is safe even if creating it failed
  Session s;
  prepare(d, s);
  if (setjmp(s.jump)) {
    // The frame was read and is too large for libjpeg-turbo: report its size, for the size limit.
    if (s.errors.msg_code == JERR_IMAGE_TOO_BIG) {
      h.width = static_cast<int>(d.image_width);
      h.height = static_cast<int>(d.image_height);
      h.channels = d.num_components == 1 ? 1 : 3;
    } else {
      h.problem = s.message;
    }
    jpeg_destroy_decompress(&d);
    return h;
  }
  jpeg_create_decompress(&d);
  jpeg_mem_src(&d, bytes + start, static_cast<unsigned long>(size - start));
  jpeg_read_header(&d, TRUE);
  h.width = static_cast<int>(d.image_width);
  h.height = static_cast<int>(d.image_height);
  h.channels = decoded_channels(d.jpeg_color_space);
  jpeg_destroy_decompress(&d);
  if (h.channels == 0) {
    h.problem = std::to_string(d.num_components) + " colour components (1, 3 or 4 are decoded)";
    h.channels = d.num_components;
  }
  return h;
}

bool decode_jpeg(const uint8_t* bytes, size_t size, int channels, int& width, int& height,
                 std::vector<uint8_t>& pixels, std::string& problem) {
  const size_t start = jpeg_start(bytes, size);
  if (start == kNotJpeg) {
    problem = "not a JPEG";
    return false;
  }
  jpeg_decompress_struct d{};
  Session s;
  prepare(d, s);
  if (setjmp(s.jump)) {
    problem = s.message;
    jpeg_destroy_decompress(&d);
    return false;
  }
  jpeg_create_decompress(&d);
  d.progress = &s.progress;
  jpeg_mem_src(&d, bytes + start, static_cast<unsigned long>(size - start));
  jpeg_read_header(&d, TRUE);
  const bool cmyk = d.jpeg_color_space == JCS_CMYK || d.jpeg_color_space == JCS_YCCK;
  // libjpeg-turbo converts YCbCr and RGB to grey or RGB, grey to RGB, YCCK to CMYK; CMYK is ours.
  d.out_color_space = cmyk ? JCS_CMYK : channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&d);
  width = static_cast<int>(d.output_width);
  height = static_cast<int>(d.output_height);
  const size_t row = size_t(width) * d.output_components;
  try {
    pixels.resize(row * height);
  } catch (...) {  // out of memory: the decompressor is released before the exception goes on
    jpeg_destroy_decompress(&d);
    throw;
  }
  while (d.output_scanline < d.output_height) {
    JSAMPROW rows[16];
    JDIMENSION n = 0;
    for (; n < 16 && d.output_scanline + n < d.output_height; ++n) rows[n] = pixels.data() + row * (d.output_scanline + n);
    jpeg_read_scanlines(&d, rows, n);
  }
  jpeg_finish_decompress(&d);
  if (cmyk) {
    cmyk_to(pixels.data(), size_t(width) * height, channels, d.saw_Adobe_marker);
    pixels.resize(size_t(width) * height * channels);
  }
  jpeg_destroy_decompress(&d);
  return true;
}
