// Whole-file reading, gzip inflation and atomic writes, with errors that name the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

// Reads a whole file; a missing, unreadable or directory path is an InputError naming it.
std::vector<uint8_t> read_file(const std::string& path);

// Decompresses a gzip stream; a truncated or corrupt stream, or one larger than max_out, is an
// InputError naming `file`.
std::vector<uint8_t> gunzip(const uint8_t* bytes, size_t size, const std::string& file,
                            size_t max_out = size_t(1) << 30);

// Writes `bytes` to `path` so that a crash at any moment leaves either the old file or the new one:
// write to path.tmp, fsync, rename over path, fsync the directory. Errors name the path (Fatal).
void write_file_atomic(const std::string& path, const void* bytes, size_t size);
