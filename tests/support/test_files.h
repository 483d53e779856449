// Helpers shared by the unit tests that write files or check error messages: a scratch directory,
// the InputError a call must raise (also in a child process), a substring check on messages,
// repository paths, and gzip compression. Each test file once had its own copy; this is the one copy.
// Header-only (inline), so any tests/*.cpp may include it and nothing changes in the Makefile.
#pragma once

#include <gtest/gtest.h>

#include <stdlib.h>  // mkdtemp
#include <unistd.h>  // alarm, setuid
#include <zlib.h>

#include <cstdio>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "core/errors.h"

namespace test_files {

// A fresh directory under $TMPDIR, removed with everything in it when the test ends. `dir / "x"`
// is the path of x in it.
struct TempDir {
  std::string path;
  explicit TempDir(const std::string& prefix = "unit-test") {
    std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    const char* made = mkdtemp(tmpl.data());
    if (!made) ADD_FAILURE() << "mkdtemp " << tmpl << " failed";
    path = made ? made : tmpl;
  }
  ~TempDir() {
    std::error_code ignored;  // never throw from a destructor
    std::filesystem::remove_all(path, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return path + "/" + name; }
};

// The temporary files an atomic write of `path` leaves beside it while open (AtomicFile names them
// path.tmp-<pid>-<n>): empty once every writer has committed or given up.
inline std::vector<std::string> temporary_files_of(const std::string& path) {
  const std::filesystem::path p(path);
  const std::string prefix = p.filename().string() + ".tmp";
  std::vector<std::string> found;
  for (const auto& e : std::filesystem::directory_iterator(p.parent_path()))
    if (e.path().filename().string().rfind(prefix, 0) == 0) found.push_back(e.path().filename().string());
  return found;
}

// Runs `fn`, which must throw an InputError; returns its message ("" and a failure otherwise). The
// readers' contract is that every bad input is an InputError whose message the user sees.
inline std::string input_error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const InputError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected an InputError, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected an InputError, nothing was thrown";
  return "";
}

// For EXPECT_EXIT: runs `fn`, which must throw an InputError, in the child that EXPECT_EXIT forks,
// and exits 0 after printing its message on stderr (1 when nothing was thrown). The child first drops
// to user "nobody" when `as_nobody` (root reads and writes anything, so a permission test needs
// another user), and an alarm kills it after `seconds` (a read that hangs, on a FIFO say, fails).
[[noreturn]] inline void exit_with_input_error(const std::function<void()>& fn, bool as_nobody, unsigned seconds = 20) {
  if (as_nobody && geteuid() == 0 && setuid(65534) != 0) _exit(3);
  alarm(seconds);
  try {
    fn();
  } catch (const InputError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    _exit(0);
  }
  _exit(1);
}

// A path in the repository (tests run from its root, and so are they compiled: __FILE__ is relative).
inline std::string repo_path(const std::string& relative) {
  const std::string here = __FILE__, me = "tests/support/test_files.h";
  return here.substr(0, here.size() - me.size()) + relative;
}

// A gzip stream (zlib's gzip wrapper, maximum compression), as in the distributed .gz files.
inline std::vector<uint8_t> gzip(const std::vector<uint8_t>& in) {
  z_stream zs{};
  EXPECT_EQ(deflateInit2(&zs, 9, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::vector<uint8_t> out(deflateBound(&zs, in.size()) + 64);
  zs.next_in = const_cast<Bytef*>(in.data());
  zs.avail_in = static_cast<uInt>(in.size());
  zs.next_out = out.data();
  zs.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

}  // namespace test_files

// Expects `part` inside `message` (both anything std::string takes), printing both when it is not.
// A macro, not a function, so the failure points at the test's line.
#define EXPECT_HAS(message, part) EXPECT_NE(std::string(message).find(part), std::string::npos) \
    << "message '" << (message) << "' lacks '" << (part) << "'"
