// JPEG decode rate of one core, stb_image against libjpeg-turbo (its libjpeg API), on files held in
// memory, to interleaved RGB: the choice of decoder for the image folder (issue 38) was made with it.
// A third row is the trainer's own decode_image (header check, then libjpeg-turbo). Each round
// decodes every file given over and over for about a second and counts images per second of this
// thread's CPU time (per core, whatever else the machine runs) and of wall time; the median of the
// rounds is printed, and the largest difference between the two decoders' pixels.
//
//   g++ -std=c++20 -O2 -Iinclude -isystem /usr/include/stb bench/decode_bench.cpp src/data/image_check.cpp
//       src/data/image_decode.cpp src/data/image_jpeg.cpp src/data/image_resize.cpp src/core/file_io.cpp
//       src/core/format.cpp -o build/decode_bench -ljpeg -lz                                (one line)
//   taskset -c 0 build/decode_bench [--rounds 7] FILE.jpg...
#include <time.h>

#include <algorithm>
#include <csetjmp>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <jpeglib.h>  // after <cstddef> and <cstdio>: it uses size_t and FILE without including them

#include "data/image_decode.h"

// stb_image's JPEG decoder, private to this file (image_decode.cpp holds the trainer's stb_image,
// built without it).
#define STB_IMAGE_STATIC
#define STB_IMAGE_IMPLEMENTATION
#define STBI_ONLY_JPEG
#include <stb_image.h>

#define STRINGIFY(x) #x
#define AS_TEXT(x) STRINGIFY(x)

namespace {

struct Rgb {
  int width = 0, height = 0;
  std::vector<uint8_t> pixels;
};

Rgb stb(const std::vector<uint8_t>& file) {
  Rgb out;
  int comp = 0;
  uint8_t* px = stbi_load_from_memory(file.data(), int(file.size()), &out.width, &out.height, &comp, 3);
  if (!px) { std::fprintf(stderr, "stb_image: %s\n", stbi_failure_reason()); std::exit(1); }
  out.pixels.assign(px, px + size_t(out.width) * out.height * 3);
  stbi_image_free(px);
  return out;
}

struct Failure {
  jpeg_error_mgr mgr;
  jmp_buf jump;
};
void fail(j_common_ptr c) { std::longjmp(reinterpret_cast<Failure*>(c->err)->jump, 1); }

// As the trainer decodes: the library's defaults (accurate integer IDCT, fancy upsampling) to RGB.
Rgb turbo(const std::vector<uint8_t>& file) {
  Rgb out;
  jpeg_decompress_struct d;
  Failure f;
  d.err = jpeg_std_error(&f.mgr);
  f.mgr.error_exit = fail;
  if (setjmp(f.jump)) { std::fprintf(stderr, "libjpeg-turbo failed\n"); std::exit(1); }
  jpeg_create_decompress(&d);
  jpeg_mem_src(&d, file.data(), file.size());
  jpeg_read_header(&d, TRUE);
  d.out_color_space = JCS_RGB;
  jpeg_start_decompress(&d);
  out.width = int(d.output_width);
  out.height = int(d.output_height);
  out.pixels.resize(size_t(out.width) * out.height * 3);
  while (d.output_scanline < d.output_height) {
    JSAMPROW row = out.pixels.data() + size_t(d.output_scanline) * out.width * 3;
    jpeg_read_scanlines(&d, &row, 1);
  }
  jpeg_finish_decompress(&d);
  jpeg_destroy_decompress(&d);
  return out;
}

Rgb ours(const std::vector<uint8_t>& file) {
  DecodedImage img = decode_image(file.data(), file.size(), 3, "bench");
  return {img.width, img.height, std::move(img.pixels)};
}

double now(clockid_t clock) {
  timespec t{};
  clock_gettime(clock, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

struct Rate {
  double cpu, wall;  // images per second
};

template <class Decode>
Rate median_rate(const std::vector<std::vector<uint8_t>>& files, Decode decode, int rounds) {
  std::vector<double> cpu, wall;
  for (int r = 0; r < rounds; ++r) {
    const double c0 = now(CLOCK_THREAD_CPUTIME_ID), w0 = now(CLOCK_MONOTONIC);
    long images = 0;
    while (now(CLOCK_THREAD_CPUTIME_ID) - c0 < 1.0)
      for (const auto& f : files) {
        volatile uint8_t sink = decode(f).pixels[0];
        (void)sink;
        ++images;
      }
    cpu.push_back(images / (now(CLOCK_THREAD_CPUTIME_ID) - c0));
    wall.push_back(images / (now(CLOCK_MONOTONIC) - w0));
  }
  std::sort(cpu.begin(), cpu.end());
  std::sort(wall.begin(), wall.end());
  return {cpu[cpu.size() / 2], wall[wall.size() / 2]};
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 7;
  std::vector<std::vector<uint8_t>> files;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--rounds" && i + 1 < argc) { rounds = std::max(1, std::atoi(argv[++i])); continue; }
    std::ifstream in(argv[i], std::ios::binary);
    if (!in) { std::fprintf(stderr, "error: cannot open %s\n", argv[i]); return 1; }
    files.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  if (files.empty()) { std::fprintf(stderr, "usage: decode_bench [--rounds N] FILE.jpg...\n"); return 1; }
  int worst = 0;
  for (const auto& f : files) {
    const Rgb a = stb(f), b = turbo(f);
    if (a.width != b.width || a.height != b.height) { std::fprintf(stderr, "error: the decoders disagree on a size\n"); return 1; }
    for (size_t k = 0; k < a.pixels.size(); ++k) worst = std::max(worst, std::abs(a.pixels[k] - b.pixels[k]));
  }
  const Rate s = median_rate(files, stb, rounds), t = median_rate(files, turbo, rounds), o = median_rate(files, ours, rounds);
  std::printf("%zu files, median of %d rounds; largest pixel difference between the decoders: %d\n", files.size(), rounds, worst);
  std::printf("| decoder | images/s per core (thread CPU time) | images/s (wall) |\n| --- | --- | --- |\n");
  std::printf("| stb_image 2.27 | %.0f | %.0f |\n| libjpeg-turbo %s | %.0f | %.0f |\n", s.cpu, s.wall, AS_TEXT(LIBJPEG_TURBO_VERSION), t.cpu, t.wall);
  std::printf("| decode_image (header check + libjpeg-turbo) | %.0f | %.0f |\n", o.cpu, o.wall);
  std::printf("libjpeg-turbo / stb_image: %.2fx (CPU time)\n", t.cpu / s.cpu);
  return 0;
}
