// The .npy header and a streaming writer (export/npy.h).
#include "export/npy.h"

#include "core/errors.h"

namespace {
constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kAlign = 64;  // numpy's own alignment of the data
}  // namespace

const char* npy_descr(DType t) { return t == DType::F16 ? "<f2" : "<f4"; }

std::vector<uint8_t> npy_header(DType t, const std::vector<size_t>& shape) {
  std::string dims;
  for (size_t d : shape) dims += std::to_string(d) + ", ";
  if (shape.size() > 1) dims.resize(dims.size() - 2);  // (N,) for one dimension, (N, M) for more
  else if (shape.size() == 1) dims.resize(dims.size() - 1);
  std::string dict = std::string("{'descr': '") + npy_descr(t) + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  const size_t prefix = sizeof(kMagic) - 1 + 2 + 2;  // magic, version, u16 length
  const size_t total = (prefix + dict.size() + 1 + kAlign - 1) / kAlign * kAlign;
  dict.resize(total - prefix - 1, ' ');
  dict += '\n';
  if (dict.size() > 0xFFFF) throw Fatal("npy header too long for format 1.0");
  std::vector<uint8_t> out(kMagic, kMagic + sizeof(kMagic) - 1);
  out.push_back(1);
  out.push_back(0);
  out.push_back(static_cast<uint8_t>(dict.size() & 0xFF));
  out.push_back(static_cast<uint8_t>(dict.size() >> 8));
  out.insert(out.end(), dict.begin(), dict.end());
  return out;
}

NpyWriter::NpyWriter(const std::string& path, DType t, const std::vector<size_t>& shape) : file_(path) {
  data_bytes_ = dtype_size(t);
  for (size_t d : shape) data_bytes_ *= d;
  const std::vector<uint8_t> header = npy_header(t, shape);
  file_.write(header.data(), header.size());
}

void NpyWriter::append(const void* bytes, size_t size) {
  if (written_ + size > data_bytes_)
    throw Fatal(path() + ": more data than its shape holds (" + std::to_string(written_ + size) + " > " +
                std::to_string(data_bytes_) + " bytes)");
  file_.write(bytes, size);
  written_ += size;
}

void NpyWriter::commit() {
  if (written_ != data_bytes_)
    throw Fatal(path() + ": " + std::to_string(written_) + " of " + std::to_string(data_bytes_) +
                " bytes written; the array is incomplete");
  file_.commit();
}
