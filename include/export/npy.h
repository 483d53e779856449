// NumPy .npy files (format version 1.0), written as a stream: bin/predict's --features.
//
// A file is the magic "\x93NUMPY", the version bytes 1 0, the header length (u16, little-endian)
// and the header, a Python dict literal such as {'descr': '<f2', 'fortran_order': False,
// 'shape': (10000, 2048), } padded with spaces and ended by '\n' so that the data start at a
// multiple of 64 bytes; then the array in C order, little-endian. numpy.load reads it as it is.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/file_io.h"
#include "core/types.h"

// "<f2" / "<f4": the NumPy type string of an element type.
const char* npy_descr(DType t);
// The bytes before the data (magic, version, length, padded header).
std::vector<uint8_t> npy_header(DType t, const std::vector<size_t>& shape);

// An array of known shape written piece by piece in C order; commit() checks that every element
// arrived, then gives the file its name (until then it is a temporary file beside it:
// core/file_io.h's AtomicFile).
class NpyWriter {
 public:
  NpyWriter(const std::string& path, DType t, const std::vector<size_t>& shape);
  void append(const void* bytes, size_t size);
  void commit();
  const std::string& path() const { return file_.path(); }

 private:
  AtomicFile file_;
  size_t data_bytes_ = 0, written_ = 0;
};
