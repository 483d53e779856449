// safetensors files (https://github.com/huggingface/safetensors): what bin/predict --export writes
// so that PyTorch (and anything else with a safetensors reader) can load a model trained here.
//
// A file is a u64 little-endian header length N, then N bytes of JSON: one entry per tensor,
// {"name": {"dtype": "F32", "shape": [64, 3, 3, 3], "data_offsets": [begin, end]}, ...} plus an
// optional "__metadata__" map of strings, padded with spaces to a multiple of 8 bytes; then the
// tensors' bytes, little-endian and in C order, back to back in the order of the header, offsets
// counted from the end of the header, no gaps.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

struct SafeTensor {
  std::string name;
  std::string dtype;            // "F32", "F16" or "I64"
  std::vector<int64_t> shape;   // [] for a scalar
  std::vector<uint8_t> data;    // product(shape) elements of dtype
};
using SafeMetadata = std::vector<std::pair<std::string, std::string>>;

// The whole file; a tensor whose data does not match its dtype and shape, or a repeated or
// reserved name, is a Fatal (a bug of the caller, not of the user's input).
std::vector<uint8_t> safetensors_bytes(const std::vector<SafeTensor>& tensors, const SafeMetadata& metadata);
// The same, written atomically (core/file_io.h).
void write_safetensors(const std::string& path, const std::vector<SafeTensor>& tensors, const SafeMetadata& metadata);
