// Whole-file reading, gzip inflation and atomic writes (whole or streamed), with errors that name the file.
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

// The directory a path lies in: "." for a bare file name.
std::string parent_directory(const std::string& path);

// Writes `bytes` to `path` so that a crash at any moment leaves either the old file or the new one:
// write to path.tmp, fsync, rename over path, fsync the directory. Errors name the path (Fatal).
void write_file_atomic(const std::string& path, const void* bytes, size_t size);

// The same for a file written piece by piece (bin/predict's CSV and .npy outputs): the pieces go to
// path.tmp, and commit() flushes it and renames it over path. Destroyed without commit() (an error,
// an early stop), it removes path.tmp and leaves path as it was.
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path);  // creates path.tmp (Fatal naming it when it cannot)
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* bytes, size_t size);
  void write(const std::string& text) { write(text.data(), text.size()); }
  void commit();  // nothing may be written after it

  const std::string& path() const { return path_; }
  size_t bytes_written() const { return written_; }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  size_t written_ = 0;
};
