// The file writers of bin/predict, byte by byte: CSV quoting, the .npy header (every field, the
// 64-byte alignment, the data after it), safetensors (header length, JSON entries, offsets that
// tile the data, metadata, alignment, refused inputs), the confusion-matrix PNG (read back with
// stb_image), and that no output carries its final name before commit.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#define STB_IMAGE_STATIC
#define STB_IMAGE_IMPLEMENTATION
#include <stb_image.h>

#include "core/errors.h"
#include "core/file_io.h"
#include "export/confusion_png.h"
#include "export/csv.h"
#include "export/npy.h"
#include "export/safetensors.h"
#include "support/test_files.h"

namespace {

namespace fs = std::filesystem;
using test_files::TempDir;
using test_files::temporary_files_of;

uint64_t le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// ---- CSV ----------------------------------------------------------------------------------------
TEST(Csv, PlainFieldsAreLeftAsTheyAre) {
  EXPECT_EQ(csv_field("T-shirt/top"), "T-shirt/top");
  EXPECT_EQ(csv_field(""), "");
  EXPECT_EQ(csv_line({"0", "7", "sneaker", "0.25"}), "0,7,sneaker,0.25\n");
}

TEST(Csv, CommasQuotesAndLineBreaksAreQuoted) {
  EXPECT_EQ(csv_field("a,b"), "\"a,b\"");
  EXPECT_EQ(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
  EXPECT_EQ(csv_field("two\nlines"), "\"two\nlines\"");
  EXPECT_EQ(csv_field("cr\rhere"), "\"cr\rhere\"");
  EXPECT_EQ(csv_line({"dir,1/x.png", "3"}), "\"dir,1/x.png\",3\n");
}

// ---- .npy ---------------------------------------------------------------------------------------
struct NpyHeader {
  int major = 0, minor = 0;
  std::string dict;
  size_t data_offset = 0;
};

NpyHeader parse_npy(const std::vector<uint8_t>& b) {
  NpyHeader h;
  EXPECT_GE(b.size(), 10u);
  EXPECT_EQ(std::string(b.begin(), b.begin() + 6), "\x93NUMPY");
  h.major = b[6];
  h.minor = b[7];
  const size_t len = b[8] | (size_t(b[9]) << 8);
  h.dict = std::string(b.begin() + 10, b.begin() + 10 + len);
  h.data_offset = 10 + len;
  return h;
}

TEST(Npy, HeaderFieldsShapesAndAlignment) {
  struct Case {
    DType t;
    std::vector<size_t> shape;
    std::string descr, shape_text;
  };
  for (const Case& c : {Case{DType::F32, {10000, 2048}, "<f4", "(10000, 2048)"}, Case{DType::F16, {3, 5}, "<f2", "(3, 5)"},
                        Case{DType::F32, {7}, "<f4", "(7,)"}, Case{DType::F16, {}, "<f2", "()"},
                        Case{DType::F32, {2, 3, 4}, "<f4", "(2, 3, 4)"}}) {
    SCOPED_TRACE(c.shape_text);
    const std::vector<uint8_t> b = npy_header(c.t, c.shape);
    const NpyHeader h = parse_npy(b);
    EXPECT_EQ(h.major, 1);
    EXPECT_EQ(h.minor, 0);
    EXPECT_EQ(b.size() % 64, 0u) << "the data must start 64-byte aligned";
    EXPECT_EQ(h.data_offset, b.size());
    const std::string want = "{'descr': '" + c.descr + "', 'fortran_order': False, 'shape': " + c.shape_text + ", }";
    ASSERT_GE(h.dict.size(), want.size() + 1);
    EXPECT_EQ(h.dict.substr(0, want.size()), want);
    EXPECT_EQ(h.dict.back(), '\n');
    EXPECT_EQ(h.dict.find_first_not_of(' ', want.size()), h.dict.size() - 1) << "padding is spaces only";
  }
}

TEST(Npy, StreamedArrayLandsAfterTheHeaderAndOnlyOnCommit) {
  TempDir dir;
  const std::string path = dir / "features.npy";
  std::vector<float> rows(6 * 4);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = 0.5f * float(i) - 3.f;
  {
    NpyWriter w(path, DType::F32, {6, 4});
    w.append(rows.data(), 4 * sizeof(float));  // one row, then the rest: pieces of any size
    EXPECT_FALSE(fs::exists(path)) << "the final name must not exist before commit";
    EXPECT_EQ(temporary_files_of(path).size(), 1u);
    w.append(rows.data() + 4, 20 * sizeof(float));
    w.commit();
  }
  EXPECT_TRUE(temporary_files_of(path).empty());
  const std::vector<uint8_t> b = read_file(path);
  const NpyHeader h = parse_npy(b);
  ASSERT_EQ(b.size(), h.data_offset + rows.size() * sizeof(float));
  EXPECT_EQ(std::memcmp(b.data() + h.data_offset, rows.data(), rows.size() * sizeof(float)), 0);
}

TEST(Npy, IncompleteOrOverlongArraysAreRefusedAndLeaveNoFile) {
  TempDir dir;
  const std::string path = dir / "short.npy";
  const std::vector<uint16_t> half(10);
  {
    NpyWriter w(path, DType::F16, {2, 4});
    w.append(half.data(), 6 * 2);
    EXPECT_THROW(w.append(half.data(), 4 * 2), Fatal) << "past the shape";
    EXPECT_THROW(w.commit(), Fatal) << "6 of 8 elements";
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_TRUE(temporary_files_of(path).empty()) << "an abandoned writer removes its temporary file";
}

// ---- safetensors ----------------------------------------------------------------------------------
std::vector<uint8_t> bytes_of(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

TEST(Safetensors, HeaderOffsetsAndDataAreExact) {
  std::vector<uint8_t> step(8);
  step[0] = 42;  // int64 42, little-endian
  const std::vector<SafeTensor> tensors = {
      {"conv1.weight", "F32", {2, 1, 1, 2}, bytes_of({1, 2, 3, 4})},
      {"bn1.num_batches_tracked", "I64", {}, step},
      {"fc.bias", "F16", {3}, {1, 2, 3, 4, 5, 6}},
  };
  const std::vector<uint8_t> b = safetensors_bytes(tensors, {{"format", "pt"}, {"note", "a \"quoted\" value"}});
  const uint64_t n = le64(b.data());
  ASSERT_LE(8 + n, b.size());
  EXPECT_EQ((8 + n) % 8, 0u) << "the data start 8-byte aligned";
  std::string header(b.begin() + 8, b.begin() + 8 + long(n));
  const size_t end = header.find_last_not_of(' ');
  EXPECT_EQ(header[0], '{');
  EXPECT_EQ(header[end], '}');
  header.resize(end + 1);
  EXPECT_EQ(header,
            "{\"conv1.weight\":{\"dtype\":\"F32\",\"shape\":[2,1,1,2],\"data_offsets\":[0,16]},"
            "\"bn1.num_batches_tracked\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[16,24]},"
            "\"fc.bias\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[24,30]},"
            "\"__metadata__\":{\"format\":\"pt\",\"note\":\"a \\\"quoted\\\" value\"}}");
  ASSERT_EQ(b.size(), 8 + n + 30) << "the data end where the last offset does: no gaps, no tail";
  const uint8_t* data = b.data() + 8 + n;
  float f[4];
  std::memcpy(f, data, 16);
  EXPECT_EQ(f[0], 1.f);
  EXPECT_EQ(f[3], 4.f);
  EXPECT_EQ(data[16], 42);
  EXPECT_EQ(data[29], 6);
}

TEST(Safetensors, MismatchedSizesAndRepeatedNamesAreRefused) {
  EXPECT_THROW(safetensors_bytes({{"x", "F32", {3}, bytes_of({1, 2})}}, {}), Fatal);
  EXPECT_THROW(safetensors_bytes({{"x", "BF16", {1}, {0, 0}}}, {}), Fatal);
  EXPECT_THROW(safetensors_bytes({{"x", "F32", {1}, bytes_of({1})}, {"x", "F32", {1}, bytes_of({2})}}, {}), Fatal);
  EXPECT_THROW(safetensors_bytes({{"__metadata__", "F32", {1}, bytes_of({1})}}, {}), Fatal);
}

TEST(Safetensors, WrittenAtomically) {
  TempDir dir;
  const std::string path = dir / "model.safetensors";
  write_safetensors(path, {{"w", "F32", {2}, bytes_of({1, 2})}}, {});
  EXPECT_EQ(read_file(path), safetensors_bytes({{"w", "F32", {2}, bytes_of({1, 2})}}, {}));
  EXPECT_TRUE(temporary_files_of(path).empty());
}

// ---- the confusion-matrix PNG ---------------------------------------------------------------------
// The colour of a cell away from its text (which sits in the middle) and from its grid line.
const uint8_t* cell_pixel(const RgbImage& img, const ConfusionLayout& L, int truth, int predicted) {
  const int x = L.cell_x(predicted) + 3, y = L.cell_y(truth) + 3;
  return &img.rgb[(size_t(y) * img.width + x) * 3];
}

TEST(ConfusionPng, CellsAreShadedByTheShareOfTheirRow) {
  const std::vector<std::string> names = {"zero", "one", "two"};
  // Row 0 all correct, row 1 split 1:3, row 2 empty.
  const std::vector<long> counts = {50, 0, 0, 1, 3, 0, 0, 0, 0};
  ConfusionLayout L;
  const RgbImage img = render_confusion(counts, names, &L);
  ASSERT_EQ(img.rgb.size(), size_t(img.width) * img.height * 3);
  ASSERT_GT(L.cell, 8);
  const uint8_t* full = cell_pixel(img, L, 0, 0);
  EXPECT_EQ(full[0], 30);  // the blue of a share of 1
  EXPECT_EQ(full[2], 229);
  const uint8_t* none = cell_pixel(img, L, 0, 1);
  EXPECT_EQ(none[0], 255);
  EXPECT_EQ(none[1], 255);
  EXPECT_EQ(none[2], 255);
  const uint8_t* quarter = cell_pixel(img, L, 1, 0);
  const uint8_t* three_quarters = cell_pixel(img, L, 1, 1);
  EXPECT_GT(quarter[0], three_quarters[0]) << "a larger share is darker";
  EXPECT_LT(quarter[0], 255);
  EXPECT_EQ(cell_pixel(img, L, 2, 2)[0], 255) << "an empty row is white";
  // The count is written in the cell: its middle holds text pixels of another colour.
  bool text = false;
  for (int dy = 0; dy < L.cell; ++dy)
    for (int dx = 0; dx < L.cell; ++dx) {
      const uint8_t* p = &img.rgb[(size_t(L.cell_y(0) + dy) * img.width + L.cell_x(0) + dx) * 3];
      text |= p[0] == 255 && p[1] == 255 && p[2] == 255;  // white digits on the full blue cell
    }
  EXPECT_TRUE(text);
}

TEST(ConfusionPng, ManyClassesAndOddNamesStillDraw) {
  std::vector<std::string> names;
  for (int i = 0; i < 120; ++i) names.push_back(i % 2 ? "caf\xc3\xa9 " + std::to_string(i) : "x");
  const RgbImage img = render_confusion(std::vector<long>(120 * 120, 7), names);
  EXPECT_GT(img.width, 120 * 8);
  EXPECT_THROW(render_confusion({1, 2, 3}, {"a", "b"}), Fatal);
}

TEST(ConfusionPng, WrittenPngReadsBackAsTheRendering) {
  TempDir dir;
  const std::string path = dir / "confusion.png";
  const std::vector<std::string> names = {"cat", "dog"};
  const std::vector<long> counts = {9, 1, 2, 8};
  write_confusion_png(path, counts, names);
  const RgbImage want = render_confusion(counts, names);
  int w = 0, h = 0, ch = 0;
  stbi_uc* got = stbi_load(path.c_str(), &w, &h, &ch, 3);
  ASSERT_NE(got, nullptr) << stbi_failure_reason();
  EXPECT_EQ(w, want.width);
  EXPECT_EQ(h, want.height);
  EXPECT_EQ(std::memcmp(got, want.rgb.data(), want.rgb.size()), 0);
  stbi_image_free(got);
}

// ---- streamed atomic files (core/file_io.h) ---------------------------------------------------------
TEST(AtomicFile, PiecesAppearUnderTheNameOnlyOnCommit) {
  TempDir dir;
  const std::string path = dir / "rows.csv";
  write_file_atomic(path, "old", 3);
  {
    AtomicFile f(path);
    f.write("a,b\n");
    f.write("1,2\n", 4);
    EXPECT_EQ(f.bytes_written(), 8u);
    EXPECT_EQ(read_file(path).size(), 3u) << "the old file stays until commit";
    f.commit();
    EXPECT_THROW(f.write("x"), Fatal);
  }
  const std::vector<uint8_t> b = read_file(path);
  EXPECT_EQ(std::string(b.begin(), b.end()), "a,b\n1,2\n");
  {
    AtomicFile abandoned(path);
    abandoned.write("partial");
  }
  const std::vector<uint8_t> kept = read_file(path);
  EXPECT_EQ(std::string(kept.begin(), kept.end()), "a,b\n1,2\n") << "an abandoned file leaves the old one";
  EXPECT_TRUE(temporary_files_of(path).empty());
}

}  // namespace
