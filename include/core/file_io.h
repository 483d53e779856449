// Whole-file reading, gzip inflation, atomic writes (whole or streamed) and output-path checks, with
// errors that name the file.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

// What a file that is not a regular one is, for messages: "a directory", "a FIFO (named pipe)", ...
const char* file_kind(mode_t mode);

// The size of a regular file, from the file system, before anything is read: a missing path, a
// directory, a FIFO, a device or a socket is an InputError naming it (a FIFO would block a reader).
size_t regular_file_size(const std::string& path);

// Reads a whole regular file (regular_file_size's checks) of at most max_bytes; a larger one is
// "too large" at once, before anything is read or allocated.
std::vector<uint8_t> read_file(const std::string& path, size_t max_bytes = size_t(1) << 30);

// Decompresses a gzip stream; a truncated or corrupt stream, or one larger than max_out, is an
// InputError naming `file`.
std::vector<uint8_t> gunzip(const uint8_t* bytes, size_t size, const std::string& file,
                            size_t max_out = size_t(1) << 30);

// Whether two paths name one file: the same device and inode where both exist (hard links,
// symlinks, "./x" and "x"), otherwise the same absolute path once "." and ".." are resolved.
bool same_file(const std::string& a, const std::string& b);

// The directory a path lies in: "." for a bare file name.
std::string parent_directory(const std::string& path);

// Writes `bytes` to `path` so that a crash at any moment leaves either the old file or the new one:
// write to path.tmp (locked; path.tmp-<pid>-<n> when another writer holds it), fsync, rename over
// path, fsync the directory. Two writers of one path at once each land a whole file; the later
// rename wins. What a killed run left is taken over by the next write. Errors name the path (Fatal).
void write_file_atomic(const std::string& path, const void* bytes, size_t size);

// The same for a file written piece by piece (bin/predict's CSV and .npy outputs): the pieces go to
// its temporary file, and commit() flushes it and renames it over path. Destroyed without commit()
// (an error, an early stop), it removes the temporary file and leaves path as it was.
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path);  // opens path.tmp or its own (Fatal naming it when it cannot)
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

// Checks, before a run starts, that `path` (given with `flag`, e.g. "--save") can be written: its
// directory exists and a file can be created in it (a probe file is created and removed; an
// existing file is never opened for writing), the path is not a directory or another non-regular
// file, and an existing file is writable. InputError "<flag> <path>: <what is wrong>" otherwise.
void check_output_path(const std::string& path, const std::string& flag);
