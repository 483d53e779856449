// Drawing the confusion matrix and writing it as a PNG (export/confusion_png.h).
#include "export/confusion_png.h"

#include <algorithm>

// Static, so this unit's copy of stb_image_write cannot clash with the one data/sample_grid.cpp
// compiles (stb_easy_font's functions are static already).
#define STB_IMAGE_WRITE_STATIC
#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb_easy_font.h>
#include <stb_image_write.h>

#include "core/errors.h"
#include "core/file_io.h"

namespace {

struct Rgb {
  uint8_t r, g, b;
};
constexpr Rgb kWhite{255, 255, 255}, kBlack{0, 0, 0}, kBlue{30, 136, 229}, kGrid{200, 200, 200};
constexpr int kGlyphHeight = 8;  // rows of an stb_easy_font capital, descenders aside

void fill(RgbImage& img, int x0, int y0, int x1, int y1, Rgb c) {
  for (int y = std::max(0, y0); y < std::min(img.height, y1); ++y)
    for (int x = std::max(0, x0); x < std::min(img.width, x1); ++x) {
      uint8_t* p = &img.rgb[(size_t(y) * img.width + x) * 3];
      p[0] = c.r, p[1] = c.g, p[2] = c.b;
    }
}

// The font knows printable ASCII only: anything else (UTF-8 class names) is drawn as '?'.
std::string printable(const std::string& s) {
  std::string out = s;
  for (char& c : out)
    if (c < 32 || c > 126) c = '?';
  return out;
}

int text_width(const std::string& s, int scale) { return stb_easy_font_width(printable(s).data()) * scale; }

// The text's quads, scaled, filled: stb_easy_font builds every glyph from axis-aligned rectangles.
void draw_text(RgbImage& img, int x, int y, const std::string& s, int scale, Rgb c) {
  std::string text = printable(s);
  std::vector<char> quads(300 * (text.size() + 1));  // the header's estimate: ~270 bytes a character
  const int n = stb_easy_font_print(0, 0, text.data(), nullptr, quads.data(), static_cast<int>(quads.size()));
  for (int q = 0; q < n; ++q) {
    const float* v0 = reinterpret_cast<const float*>(&quads[size_t(q) * 64]);       // top-left vertex
    const float* v2 = reinterpret_cast<const float*>(&quads[size_t(q) * 64 + 32]);  // bottom-right vertex
    fill(img, x + int(v0[0]) * scale, y + int(v0[1]) * scale, x + int(v2[0]) * scale, y + int(v2[1]) * scale, c);
  }
}

Rgb shade(double share) {
  auto mixc = [&](uint8_t a, uint8_t b) { return static_cast<uint8_t>(a + (b - a) * share + 0.5); };
  return {mixc(kWhite.r, kBlue.r), mixc(kWhite.g, kBlue.g), mixc(kWhite.b, kBlue.b)};
}

}  // namespace

RgbImage render_confusion(const std::vector<long>& counts, const std::vector<std::string>& names,
                          ConfusionLayout* layout_out) {
  const int k = static_cast<int>(names.size());
  if (k == 0 || counts.size() != size_t(k) * k) throw Fatal("render_confusion: counts do not match the classes");
  ConfusionLayout L;
  L.cell = std::clamp(1200 / k, 16, 48);
  const int label_scale = L.cell >= 24 ? 2 : 1;
  int label_w = 0;
  for (int t = 0; t < k; ++t) label_w = std::max(label_w, text_width(std::to_string(t) + " " + names[t], label_scale));
  const std::string title = "rows: true class, columns: predicted class";
  L.left = std::max(label_w + 12, 8);
  L.top = 2 * kGlyphHeight * 2 + 24;
  RgbImage img;
  img.width = std::max(L.left + k * L.cell + 8, text_width(title, 2) + 16);
  img.height = L.top + k * L.cell + 8;
  img.rgb.assign(size_t(img.width) * img.height * 3, 255);
  draw_text(img, 8, 6, title, 2, kBlack);
  for (int t = 0; t < k; ++t) {
    long row = 0;
    for (int p = 0; p < k; ++p) row += counts[size_t(t) * k + p];
    const int y = L.cell_y(t);
    draw_text(img, 6, y + (L.cell - kGlyphHeight * label_scale) / 2, std::to_string(t) + " " + names[t], label_scale, kBlack);
    const std::string col = std::to_string(t);
    draw_text(img, L.cell_x(t) + (L.cell - text_width(col, label_scale)) / 2, L.top - kGlyphHeight * label_scale - 6, col,
              label_scale, kBlack);
    for (int p = 0; p < k; ++p) {
      const long n = counts[size_t(t) * k + p];
      const double share = row ? double(n) / double(row) : 0.0;
      const int x = L.cell_x(p);
      fill(img, x, y, x + L.cell, y + L.cell, kGrid);
      fill(img, x + 1, y + 1, x + L.cell, y + L.cell, shade(share));
      const std::string text = std::to_string(n);
      const int scale = text_width(text, 2) + 4 <= L.cell ? 2 : 1;
      if (text_width(text, scale) + 2 <= L.cell)
        draw_text(img, x + (L.cell - text_width(text, scale)) / 2, y + (L.cell - kGlyphHeight * scale) / 2, text, scale,
                  share > 0.5 ? kWhite : kBlack);
    }
  }
  if (layout_out) *layout_out = L;
  return img;
}

void write_confusion_png(const std::string& path, const std::vector<long>& counts, const std::vector<std::string>& names) {
  const RgbImage img = render_confusion(counts, names);
  std::vector<uint8_t> png;
  auto append = [](void* context, void* data, int size) {
    auto* out = static_cast<std::vector<uint8_t>*>(context);
    out->insert(out->end(), static_cast<uint8_t*>(data), static_cast<uint8_t*>(data) + size);
  };
  if (!stbi_write_png_to_func(append, &png, img.width, img.height, 3, img.rgb.data(), img.width * 3))
    throw Fatal(path + ": could not encode the confusion matrix as PNG");
  write_file_atomic(path, png.data(), png.size());
}
