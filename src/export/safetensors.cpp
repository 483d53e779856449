// The safetensors writer (export/safetensors.h).
#include "export/safetensors.h"

#include <set>

#include "core/errors.h"
#include "core/file_io.h"
#include "core/json_line.h"

namespace {

size_t element_bytes(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "F16") return 2;
  if (dtype == "I64") return 8;
  throw Fatal("safetensors: unsupported dtype " + dtype);
}

std::string json_list(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

}  // namespace

std::vector<uint8_t> safetensors_bytes(const std::vector<SafeTensor>& tensors, const SafeMetadata& metadata) {
  std::string header = "{";
  std::set<std::string> names;
  int64_t offset = 0;
  for (const SafeTensor& t : tensors) {
    int64_t count = 1;
    for (int64_t d : t.shape) count *= d;
    if (t.data.size() != size_t(count) * element_bytes(t.dtype))
      throw Fatal("safetensors: " + t.name + " holds " + std::to_string(t.data.size()) + " bytes, its shape " +
                  json_list(t.shape) + " of " + t.dtype + " needs " + std::to_string(count * element_bytes(t.dtype)));
    if (t.name == "__metadata__" || !names.insert(t.name).second)
      throw Fatal("safetensors: tensor name " + t.name + " is repeated or reserved");
    header += (header.size() > 1 ? "," : "") + JsonLine::quote(t.name) + ":{\"dtype\":\"" + t.dtype +
              "\",\"shape\":" + json_list(t.shape) + ",\"data_offsets\":" +
              json_list({offset, offset + int64_t(t.data.size())}) + "}";
    offset += int64_t(t.data.size());
  }
  if (!metadata.empty()) {
    std::string meta = "{";
    for (const auto& [key, value] : metadata) meta += (meta.size() > 1 ? "," : "") + JsonLine::quote(key) + ":" + JsonLine::quote(value);
    header += (header.size() > 1 ? "," : "") + std::string("\"__metadata__\":") + meta + "}";
  }
  header += "}";
  header.resize((header.size() + 7) / 8 * 8, ' ');  // the data then start 8-byte aligned
  std::vector<uint8_t> out(8);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(uint64_t(header.size()) >> (8 * i));
  out.insert(out.end(), header.begin(), header.end());
  out.reserve(out.size() + size_t(offset));
  for (const SafeTensor& t : tensors) out.insert(out.end(), t.data.begin(), t.data.end());
  return out;
}

void write_safetensors(const std::string& path, const std::vector<SafeTensor>& tensors, const SafeMetadata& metadata) {
  const std::vector<uint8_t> bytes = safetensors_bytes(tensors, metadata);
  write_file_atomic(path, bytes.data(), bytes.size());
}
