// Whole-file reads (only regular files, sizes checked first), atomic writes, output-path checks and
// gzip inflation, with errors that name the file.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "core/errors.h"
#include "core/file_io.h"
#include "support/test_files.h"

namespace {

namespace fs = std::filesystem;
using namespace test_files;  // TempDir, input_error_of, gzip

std::vector<uint8_t> some_bytes(size_t n, uint32_t seed) {
  std::vector<uint8_t> b(n);
  for (auto& x : b) {
    seed = seed * 1664525u + 1013904223u;
    x = static_cast<uint8_t>(seed >> 24);
  }
  return b;
}

// Compressible data (a text-like repetition with some noise), so the stream has real deflate blocks.
std::vector<uint8_t> compressible(size_t n) {
  std::vector<uint8_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>("the quick brown fox "[i % 20] + (i % 997 == 0));
  return b;
}

TEST(FileIo, AtomicWriteThenReadRoundTrip) {
  TempDir dir;
  const std::string path = dir / "blob.bin";
  const std::vector<uint8_t> bytes = some_bytes(1 << 20, 1);
  write_file_atomic(path, bytes.data(), bytes.size());
  EXPECT_EQ(read_file(path), bytes);
  EXPECT_TRUE(temporary_files_of(path).empty());
  // Overwriting replaces the content completely (a shorter file leaves no tail of the old one).
  const std::vector<uint8_t> shorter = some_bytes(1000, 2);
  write_file_atomic(path, shorter.data(), shorter.size());
  EXPECT_EQ(read_file(path), shorter);
  write_file_atomic(path, nullptr, 0);
  EXPECT_TRUE(read_file(path).empty());
}

TEST(FileIo, RelativePathInTheCurrentDirectory) {
  TempDir dir;
  const fs::path before = fs::current_path();
  fs::current_path(dir.path);
  const std::vector<uint8_t> bytes = some_bytes(100, 3);
  write_file_atomic("plain-name.bin", bytes.data(), bytes.size());
  const std::vector<uint8_t> back = read_file("plain-name.bin");
  fs::current_path(before);
  EXPECT_EQ(back, bytes);
}

TEST(FileIo, ReadMissingOrDirectoryNamesThePath) {
  TempDir dir;
  std::string m = input_error_of([&] { read_file(dir / "absent.bin"); });
  EXPECT_HAS(m, dir / "absent.bin");
  EXPECT_HAS(m, "No such file");
  m = input_error_of([&] { read_file(dir.path); });
  EXPECT_HAS(m, dir.path);
  EXPECT_HAS(m, "directory");
}

TEST(FileIo, ReadUnreadableFileNamesIt) {
  TempDir dir;
  const std::vector<uint8_t> bytes = some_bytes(10, 4);
  const std::string path = dir / "secret.bin";
  write_file_atomic(path, bytes.data(), bytes.size());
  chmod(path.c_str(), 0);
  // Root reads anything, so the read runs in a child that first drops to user "nobody".
  EXPECT_EXIT(exit_with_input_error([&] { read_file(path); }, true),
      ::testing::ExitedWithCode(0), "secret.bin.*cannot open");
}

TEST(FileIo, AtomicWriteIntoMissingDirectoryNamesIt) {
  TempDir dir;
  const std::string path = dir / "nowhere/file.bin";
  try {
    write_file_atomic(path, "x", 1);
    ADD_FAILURE() << "writing into a missing directory succeeded";
  } catch (const Fatal& e) {
    EXPECT_HAS(e.what(), path);
  }
}

TEST(FileIo, ANonRegularFileIsNamedNeverRead) {
  TempDir dir;
  const std::string fifo = dir / "pipe";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  // Opening a FIFO waits for a writer: the read runs in a child that an alarm kills if it hangs.
  EXPECT_EXIT(exit_with_input_error([&] { read_file(fifo); }, false),
      ::testing::ExitedWithCode(0), "pipe: is a FIFO");
  EXPECT_HAS(input_error_of([] { regular_file_size("/dev/null"); }), "/dev/null: is a device");
}

TEST(FileIo, AFileLargerThanAllowedIsRefusedBeforeItIsRead) {
  TempDir dir;
  const std::string path = dir / "huge.bin";
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fclose(f);
  }
  // 100 GiB, sparse: allocating or reading it would take minutes or fail with std::bad_alloc.
  ASSERT_EQ(truncate(path.c_str(), off_t(100) << 30), 0);
  const std::string m = input_error_of([&] { read_file(path, size_t(1) << 20); });
  EXPECT_HAS(m, path);
  EXPECT_HAS(m, "too large: 107374182400 bytes");
  EXPECT_EQ(regular_file_size(path), size_t(100) << 30);
  const std::vector<uint8_t> bytes = some_bytes(64, 9);
  write_file_atomic(path, bytes.data(), bytes.size());
  EXPECT_EQ(read_file(path, 64), bytes) << "exactly the limit is fine";
}

// ---- output paths, checked before a run ----------------------------------------------------------

// Two flags naming one file however it is spelt: links, "./", "..", a file not there yet.
TEST(SameFile, OneFileUnderEverySpellingAndDifferentFilesApart) {
  TempDir dir;
  const std::string a = dir / "a.ckpt", b = dir / "b.ckpt";
  write_file_atomic(a, "x", 1);
  write_file_atomic(b, "x", 1);
  ASSERT_EQ(link(a.c_str(), (dir / "hard").c_str()), 0);
  ASSERT_EQ(symlink(a.c_str(), (dir / "soft").c_str()), 0);
  fs::create_directory(dir / "sub");
  EXPECT_TRUE(same_file(a, a));
  EXPECT_TRUE(same_file(a, dir / "hard"));
  EXPECT_TRUE(same_file(dir / "soft", a));
  EXPECT_TRUE(same_file(a, dir / "sub/../a.ckpt"));
  EXPECT_FALSE(same_file(a, b)) << "same contents, different files";
  EXPECT_FALSE(same_file(a, dir / "new.csv")) << "one there, one not";
  EXPECT_TRUE(same_file(dir / "new.csv", dir / "./new.csv")) << "neither there yet";
  EXPECT_FALSE(same_file(dir / "new.csv", dir / "new.npy"));
  const fs::path cwd = fs::current_path();
  fs::current_path(dir.path);
  EXPECT_TRUE(same_file("a.ckpt", a));
  EXPECT_TRUE(same_file("later.csv", dir / "later.csv"));
  fs::current_path(cwd);
}

TEST(CheckOutputPath, AWritablePathPassesAndNothingIsLeftBehind) {
  TempDir dir;
  EXPECT_NO_THROW(check_output_path(dir / "new.ckpt", "--save"));
  const std::vector<uint8_t> bytes = some_bytes(100, 3);
  write_file_atomic(dir / "old.ckpt", bytes.data(), bytes.size());
  EXPECT_NO_THROW(check_output_path(dir / "old.ckpt", "--save"));
  EXPECT_EQ(read_file(dir / "old.ckpt"), bytes) << "an existing file is not touched";
  size_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path)) ++entries;
  EXPECT_EQ(entries, 1u) << "the probe file must be removed";
}

TEST(CheckOutputPath, AMissingDirectoryIsNamed) {
  TempDir dir;
  const std::string m = input_error_of([&] { check_output_path(dir / "no/such/x.ckpt", "--save"); });
  EXPECT_EQ(m, "--save " + (dir / "no/such/x.ckpt") + ": the directory " + (dir / "no/such") + " does not exist");
  EXPECT_HAS(input_error_of([] { check_output_path("/no/such/dir/x.ckpt", "--save"); }), "does not exist");
}

TEST(CheckOutputPath, ADirectoryOrAFifoIsNotAFile) {
  TempDir dir;
  EXPECT_HAS(input_error_of([&] { check_output_path(dir.path, "--loss-log"); }), "is a directory");
  EXPECT_HAS(input_error_of([&] { check_output_path(dir.path + "/", "--loss-log"); }), "directory");
  const std::string fifo = dir / "pipe";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_HAS(input_error_of([&] { check_output_path(fifo, "--trace"); }), "--trace " + fifo + ": is a FIFO");
  const std::vector<uint8_t> bytes = some_bytes(4, 1);
  write_file_atomic(dir / "file", bytes.data(), bytes.size());
  EXPECT_HAS(input_error_of([&] { check_output_path(dir / "file/x.png", "--sample-png"); }), "is not a directory");
}

TEST(CheckOutputPath, AReadOnlyDirectoryIsNamed) {
  // /proc refuses new files even to root.
  EXPECT_HAS(input_error_of([] { check_output_path("/proc/x.ckpt", "--save"); }),
             "cannot create files in the directory /proc");
  TempDir dir;
  chmod(dir.path.c_str(), 0555);
  const std::string path = dir / "x.ckpt";
  // Root writes anywhere, so the check runs in a child that first drops to user "nobody".
  EXPECT_EXIT(exit_with_input_error([&] { check_output_path(path, "--save"); }, true),
      ::testing::ExitedWithCode(0), "cannot create files in the directory");
  chmod(dir.path.c_str(), 0755);
}

TEST(CheckOutputPath, AnExistingReadOnlyFileIsNamed) {
  TempDir dir;
  chmod(dir.path.c_str(), 0777);
  const std::string path = dir / "ro.ckpt";
  write_file_atomic(path, "x", 1);
  chmod(path.c_str(), 0444);
  EXPECT_EXIT(exit_with_input_error([&] { check_output_path(path, "--save"); }, true),
      ::testing::ExitedWithCode(0), "ro.ckpt: the file is not writable");
}

// Two writers of one path at once (two trainings saving the default autotune cache): the first
// holds path.tmp, the second writes a file of its own; both commits succeed, and the file is the one
// renamed last, whole. With one shared temporary name and no lock the second commit failed ("rename
// failed"), as a device run found.
TEST(FileIo, TwoWritersOfOnePathAtOnceBothLand) {
  TempDir dir;
  const std::string path = dir / "cache.txt";
  const std::vector<uint8_t> a = some_bytes(5000, 7), b = some_bytes(3000, 8);
  AtomicFile first(path), second(path);
  const std::vector<std::string> tmps = temporary_files_of(path);
  ASSERT_EQ(tmps.size(), 2u) << "each writer has a temporary file of its own";
  EXPECT_NE(std::find(tmps.begin(), tmps.end(), "cache.txt.tmp"), tmps.end());
  first.write(a.data(), a.size());
  second.write(b.data(), b.size());
  EXPECT_NO_THROW(first.commit());
  EXPECT_EQ(read_file(path), a);
  EXPECT_NO_THROW(second.commit());
  EXPECT_EQ(read_file(path), b) << "the later rename wins, whole";
  EXPECT_TRUE(temporary_files_of(path).empty());
}

// A run killed mid-write leaves path.tmp, its lock gone with it: the next write takes the file
// over, so runs killed again and again leave one temporary file, not one each.
TEST(FileIo, AKilledWritersFileIsTakenOverNotAddedTo) {
  TempDir dir;
  const std::string path = dir / "ck.bin";
  for (int run = 0; run < 3; ++run) {
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      AtomicFile f(path);
      f.write("half", 4);
      _exit(0);  // no destructor, no commit: as a killed run
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    EXPECT_EQ(temporary_files_of(path), std::vector<std::string>{"ck.bin.tmp"}) << "run " << run;
  }
  write_file_atomic(path, "whole", 5);
  EXPECT_EQ(read_file(path), (std::vector<uint8_t>{'w', 'h', 'o', 'l', 'e'}));
  EXPECT_TRUE(temporary_files_of(path).empty()) << "the leftover became the file";
}

// A path.tmp that cannot be written (another user's) or is not a file does not block the check nor
// the write: the writer takes a name of its own and leaves the leftover as it was.
TEST(CheckOutputPath, LeftoversThatCannotBeTakenOverDoNotBlockTheWrite) {
  TempDir dir;
  chmod(dir.path.c_str(), 0777);
  const std::string path = dir / "out.csv";
  fs::create_directory(path + ".tmp");
  EXPECT_NO_THROW(check_output_path(path, "--out"));
  write_file_atomic(path, "abc", 3);
  EXPECT_EQ(read_file(path), (std::vector<uint8_t>{'a', 'b', 'c'}));
  EXPECT_TRUE(fs::is_directory(path + ".tmp")) << "a leftover is left as it was";
  fs::remove(path + ".tmp");
  write_file_atomic(path + ".tmp", "x", 1);
  chmod((path + ".tmp").c_str(), 0444);
  // Root writes anything, so the write runs in a child that first drops to user "nobody".
  EXPECT_EXIT(
      {
        if (geteuid() == 0 && setuid(65534) != 0) _exit(3);
        write_file_atomic(path, "def", 3);
        _exit(read_file(path) == std::vector<uint8_t>{'d', 'e', 'f'} ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
  EXPECT_EQ(read_file(path + ".tmp"), (std::vector<uint8_t>{'x'})) << "a leftover is left as it was";
}

TEST(CheckOutputPath, AnEmptyPathNamesTheFlag) {
  EXPECT_EQ(input_error_of([] { check_output_path("", "--export"); }), "--export: an empty path");
}

TEST(Gunzip, InflatesGoodStreams) {
  for (size_t n : {size_t(0), size_t(1), size_t(1000), size_t(5'000'000)}) {
    const std::vector<uint8_t> data = compressible(n);
    const std::vector<uint8_t> gz = gzip(data);
    EXPECT_EQ(gunzip(gz.data(), gz.size(), "x.gz"), data) << n << " bytes";
  }
  const std::vector<uint8_t> noise = some_bytes(300000, 5);
  const std::vector<uint8_t> gz = gzip(noise);
  EXPECT_EQ(gunzip(gz.data(), gz.size(), "x.gz"), noise);
}

TEST(Gunzip, ExactlyMaxOutFits) {
  const std::vector<uint8_t> data = compressible(100000);
  const std::vector<uint8_t> gz = gzip(data);
  EXPECT_EQ(gunzip(gz.data(), gz.size(), "x.gz", data.size()), data);
}

TEST(Gunzip, LargerThanMaxOutIsRefused) {
  const std::vector<uint8_t> data = compressible(100000);
  const std::vector<uint8_t> gz = gzip(data);
  const std::string m = input_error_of([&] { gunzip(gz.data(), gz.size(), "big.gz", 99999); });
  EXPECT_HAS(m, "big.gz");
  EXPECT_HAS(m, "more than 99999");
}

TEST(Gunzip, EveryTruncationIsNamed) {
  const std::vector<uint8_t> gz = gzip(compressible(20000));
  for (size_t n = 0; n < gz.size(); ++n) {
    // A small max_out: a truncated stream's last bytes are not its size, and must not matter.
    const std::string m = input_error_of([&] { gunzip(gz.data(), n, "cut.gz", 1 << 20); });
    ASSERT_NE(m.find("cut.gz"), std::string::npos) << n << " bytes: " << m;
    if (n >= 18) {
      ASSERT_NE(m.find("truncated"), std::string::npos) << n << " bytes: " << m;
    }
  }
}

TEST(Gunzip, CorruptStreamIsNamed) {
  const std::vector<uint8_t> good = gzip(compressible(50000));
  // Damage in the deflate data, and in the trailer's CRC.
  for (size_t at : {good.size() / 3, good.size() / 2, good.size() - 8}) {
    std::vector<uint8_t> gz = good;
    for (size_t i = at; i < at + 4; ++i) gz[i] ^= 0x5A;
    const std::string m = input_error_of([&] { gunzip(gz.data(), gz.size(), "bad.gz", 1 << 20); });
    EXPECT_HAS(m, "bad.gz");
    EXPECT_HAS(m, "corrupt");
  }
}

TEST(Gunzip, NotGzipIsNamed) {
  const std::vector<uint8_t> plain = compressible(100);
  std::string m = input_error_of([&] { gunzip(plain.data(), plain.size(), "plain.gz"); });
  EXPECT_HAS(m, "plain.gz");
  EXPECT_HAS(m, "not a gzip");
  m = input_error_of([&] { gunzip(plain.data(), 0, "empty.gz"); });
  EXPECT_HAS(m, "empty.gz");
}

}  // namespace
