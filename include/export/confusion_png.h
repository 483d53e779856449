// The confusion matrix of a prediction run as a PNG (bin/predict writes it beside its CSV): one
// cell per (true class, predicted class), shaded from white (none) to blue (every image of the true
// class) by the share of the row, with its count written in it, and the class names beside the rows.
// Text is stb_easy_font's segment font, drawn into the pixels; the file is stb_image_write's PNG.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

struct RgbImage {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;  // row-major, 3 bytes a pixel
};

// Geometry of the drawing, so that tests can find a cell.
struct ConfusionLayout {
  int cell = 0;              // pixels per cell side
  int left = 0, top = 0;     // where cell (0, 0) starts
  int cell_x(int predicted) const { return left + predicted * cell; }
  int cell_y(int truth) const { return top + truth * cell; }
};

// counts[t * classes + p]: images of true class t predicted as p; names: one per class.
RgbImage render_confusion(const std::vector<long>& counts, const std::vector<std::string>& names,
                          ConfusionLayout* layout = nullptr);
// The PNG, written atomically (core/file_io.h).
void write_confusion_png(const std::string& path, const std::vector<long>& counts, const std::vector<std::string>& names);
