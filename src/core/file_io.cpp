// Reading whole files and inflating gzip, atomic writes (whole or streamed) and output-path checks,
// with errors that name the file and the problem.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>

#include <zlib.h>

#include "core/errors.h"
#include "core/file_io.h"
#include "core/format.h"

namespace fs = std::filesystem;

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

size_t regular_file_size(const std::string& path) {
  struct stat st{};
  if (stat(path.c_str(), &st) != 0) throw InputError(path + ": cannot open: " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) throw InputError(path + ": is a directory, expected a file");
  if (!S_ISREG(st.st_mode)) throw InputError(path + ": is " + file_kind(st.st_mode) + ", expected a regular file");
  return static_cast<size_t>(st.st_size);
}

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa{}, sb{};
  const bool a_exists = stat(a.c_str(), &sa) == 0, b_exists = stat(b.c_str(), &sb) == 0;
  if (a_exists && b_exists) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  if (a_exists != b_exists) return false;
  std::error_code ea, eb;
  const fs::path ca = fs::weakly_canonical(fs::absolute(a, ea), ea), cb = fs::weakly_canonical(fs::absolute(b, eb), eb);
  return !ea && !eb ? ca == cb : a == b;
}

std::vector<uint8_t> read_file(const std::string& path, size_t max_bytes) {
  const size_t size = regular_file_size(path);
  if (size > max_bytes)
    throw InputError(path + ": too large: " + std::to_string(size) + " bytes (" + format_bytes(size) +
                     "), more than the " + std::to_string(max_bytes) + " bytes (" + format_bytes(max_bytes) +
                     ") such a file can hold");
  // O_NONBLOCK: should the path have become a FIFO since the stat, open must not wait for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw InputError(path + ": cannot open: " + std::strerror(errno));
  std::vector<uint8_t> bytes(size);
  size_t got = 0;
  while (got < size) {
    const ssize_t n = ::read(fd, bytes.data() + got, size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      throw InputError(path + ": read error: " + why);
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  if (got != size) throw InputError(path + ": file shrank while being read");
  return bytes;
}

std::vector<uint8_t> gunzip(const uint8_t* bytes, size_t size, const std::string& file,
                            size_t max_out) {
  if (size < 18 || bytes[0] != 0x1f || bytes[1] != 0x8b)
    throw InputError(file + ": not a gzip file (bad magic or too short)");
  z_stream zs{};
  if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) throw InputError(file + ": zlib init failed");
  std::vector<uint8_t> out;
  // The gzip trailer holds the uncompressed size modulo 2^32: a good first guess.
  size_t hint = static_cast<size_t>(bytes[size - 4]) | (static_cast<size_t>(bytes[size - 3]) << 8) |
                (static_cast<size_t>(bytes[size - 2]) << 16) |
                (static_cast<size_t>(bytes[size - 1]) << 24);
  // ... but a corrupt trailer can claim anything; deflate expands at most about 1032:1.
  out.resize(std::min({std::max<size_t>(hint, 1024), max_out, size * 1032 + 1024}));
  zs.next_in = const_cast<Bytef*>(bytes);
  size_t in_left = size;
  int ret = Z_OK;
  while (true) {
    if (zs.total_out == out.size()) {
      if (out.size() >= max_out) {
        inflateEnd(&zs);
        throw InputError(file + ": decompresses to more than " + std::to_string(max_out) +
                         " bytes");
      }
      out.resize(std::min(out.size() * 2, max_out));
    }
    const uInt in_chunk = static_cast<uInt>(std::min<size_t>(in_left, 1u << 30));
    zs.avail_in = in_chunk;
    zs.next_out = out.data() + zs.total_out;
    zs.avail_out = static_cast<uInt>(std::min<size_t>(out.size() - zs.total_out, 1u << 30));
    ret = inflate(&zs, Z_NO_FLUSH);
    in_left -= in_chunk - zs.avail_in;
    if (ret == Z_STREAM_END) break;
    if (ret == Z_BUF_ERROR && in_left == 0 && zs.avail_out != 0) break;  // input ran out
    if (ret != Z_OK && ret != Z_BUF_ERROR) break;
  }
  const std::string msg = zs.msg ? zs.msg : "";
  out.resize(zs.total_out);
  inflateEnd(&zs);
  if (ret == Z_STREAM_END) return out;
  if (ret == Z_BUF_ERROR || ret == Z_OK)
    throw InputError(file + ": truncated gzip stream (ended after " + std::to_string(out.size()) +
                     " decompressed bytes)");
  throw InputError(file + ": corrupt gzip stream" + (msg.empty() ? "" : ": " + msg));
}

std::string parent_directory(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
}

void write_file_atomic(const std::string& path, const void* bytes, size_t size) {
  AtomicFile f(path);
  f.write(bytes, size);
  f.commit();
}

namespace {

// Whether the open file `fd` is still the one named `name` (not renamed away or replaced).
bool still_named(int fd, const std::string& name) {
  struct stat a{}, b{};
  return ::fstat(fd, &a) == 0 && ::stat(name.c_str(), &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

}  // namespace

// The temporary file is path.tmp, held under an exclusive lock until it is renamed over path or
// removed. A lock dies with its process, so what a killed run left is taken over by the next write,
// not added to. A writer that finds path.tmp locked by another (two trainings saving the default
// autotune cache at once) writes a file of its own, path.tmp-<pid>-<n>, created only if it does not
// exist: both land a whole file and the later rename wins. (With one shared name and no lock the
// second rename found the first one's file gone and the run stopped.) path.tmp is checked to still
// name the locked file, since its holder may have renamed it away just before letting go.
AtomicFile::AtomicFile(const std::string& path) : path_(path), tmp_(path + ".tmp") {
  const int fd = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) == 0 && still_named(fd, tmp_) && ::ftruncate(fd, 0) == 0) {
    fd_ = fd;
    return;
  }
  if (fd >= 0) ::close(fd);
  static std::atomic<unsigned> count{0};
  const std::string stem = path + ".tmp-" + std::to_string(::getpid()) + "-";
  for (int attempt = 0; attempt < 100 && fd_ < 0; ++attempt) {
    tmp_ = stem + std::to_string(count++);
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ < 0 && errno != EEXIST) break;
  }
  if (fd_ < 0) throw Fatal(tmp_ + ": cannot create: " + std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ < 0) return;
  ::unlink(tmp_.c_str());  // before the lock goes with the close: no other writer takes it up
  ::close(fd_);
}

void AtomicFile::write(const void* bytes, size_t size) {
  if (fd_ < 0) throw Fatal(path_ + ": written after it was committed");
  const char* p = static_cast<const char*>(bytes);
  while (size > 0) {
    const ssize_t n = ::write(fd_, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw Fatal(tmp_ + ": write failed: " + std::strerror(errno) + " (" + path_ + " is untouched)");
    p += n;
    size -= static_cast<size_t>(n);
    written_ += static_cast<size_t>(n);
  }
}

void AtomicFile::commit() {
  if (fd_ < 0) throw Fatal(path_ + ": committed twice");
  const int fd = std::exchange(fd_, -1);
  const std::string &tmp = tmp_, &path = path_;
  // Flushed and renamed while still open, so that the lock on path.tmp is held until the rename:
  // no other writer can take the file up and truncate it in between.
  if (::fsync(fd) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    ::close(fd);
    throw Fatal(tmp + ": could not flush to disk: " + why + " (" + path + " is untouched)");
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    ::close(fd);
    throw Fatal(path + ": rename failed: " + why);
  }
  if (::close(fd) != 0) throw Fatal(path + ": closing it after the write failed: " + std::strerror(errno));
  // The rename itself is durable only once the directory entry is on disk.
  const int dfd = ::open(parent_directory(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void check_output_path(const std::string& path, const std::string& flag) {
  const std::string where = flag + " " + path + ": ";
  if (path.empty()) throw InputError(flag + ": an empty path");
  if (path.back() == '/') throw InputError(where + "names a directory, expected a file");
  const std::string dir = parent_directory(path);
  struct stat st{};
  if (stat(dir.c_str(), &st) != 0)
    throw InputError(where + "the directory " + dir + " " +
                     (errno == ENOENT ? "does not exist" : std::string("cannot be reached: ") + std::strerror(errno)));
  if (!S_ISDIR(st.st_mode)) throw InputError(where + dir + " is not a directory");
  if (stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) throw InputError(where + "is a directory, expected a file");
    if (!S_ISREG(st.st_mode)) throw InputError(where + "is " + file_kind(st.st_mode) + ", expected a regular file");
    if (access(path.c_str(), W_OK) != 0) throw InputError(where + "the file is not writable: " + std::strerror(errno));
  }
  // Creating a file is the only test that every file system (read-only mounts, ACLs, quotas of
  // inodes) answers truthfully; an existing file at `path` is never touched.
  std::string probe = dir + "/.write-probe-XXXXXX";
  const int fd = mkstemp(probe.data());
  if (fd < 0)
    throw InputError(where + "cannot create files in the directory " + dir + ": " + std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}
