// The image-folder data set (image_folder.h): class discovery, the header pass, and the decoded
// cache.
#include "data/image_folder.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "core/elapsed.h"
#include "core/file_io.h"
#include "core/format.h"
#include "core/host_memory.h"
#include "core/memory.h"
#include "core/parallel.h"

namespace fs = std::filesystem;

namespace {

constexpr int kMaxDepth = 16;         // directory nesting under a class (a symlink loop ends here)
constexpr int kMaxClasses = 256;      // labels are stored as bytes
constexpr size_t kExamplesShown = 3;  // bad files named in the --skip-bad-images warning

std::atomic<long> g_images_decoded{0};  // images_decoded()

bool hidden(const std::string& name) { return name.empty() || name[0] == '.'; }

bool is_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec);  // follows symlinks
}

// The non-hidden entries of `dir`, sorted, split into directories and other files.
void list_dir(const std::string& dir, std::vector<std::string>& dirs, std::vector<std::string>& files) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (hidden(name)) continue;
    (is_dir(dir + "/" + name) ? dirs : files).push_back(name);
  }
  if (ec) throw InputError(dir + ": cannot list the directory: " + ec.message());
  std::sort(dirs.begin(), dirs.end());
  std::sort(files.begin(), files.end());
}

// A directory's image files, then those of its subdirectories in order (ImageFolder's sorted walk).
void collect_images(const std::string& dir, int depth, std::vector<std::string>& out, int& ignored) {
  if (depth > kMaxDepth)
    throw InputError(dir + ": directories nested more than " + std::to_string(kMaxDepth) + " deep (a symlink loop?)");
  std::vector<std::string> dirs, files;
  list_dir(dir, dirs, files);
  for (const std::string& f : files) {
    if (has_image_extension(f))
      out.push_back(dir + "/" + f);
    else
      ++ignored;
  }
  for (const std::string& d : dirs) collect_images(dir + "/" + d, depth + 1, out, ignored);
}

// Reads up to `n` bytes at `offset`; fewer only at the end of the file.
size_t read_at(int fd, uint8_t* buf, size_t n, off_t offset) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = pread(fd, buf + got, n - got, offset + static_cast<off_t>(got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw InputError(std::string("read error: ") + std::strerror(errno));
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  return got;
}

std::string join(const std::vector<std::string>& names, const std::string& sep) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : sep) + n;
  return s;
}

// "missing a, b; extra c": how the test split's classes differ from the training split's.
std::string class_difference(const std::vector<std::string>& train, const std::vector<std::string>& test) {
  std::vector<std::string> missing, extra;
  std::set_difference(train.begin(), train.end(), test.begin(), test.end(), std::back_inserter(missing));
  std::set_difference(test.begin(), test.end(), train.begin(), train.end(), std::back_inserter(extra));
  std::string s;
  if (!missing.empty()) s += "missing " + join(missing, ", ");
  if (!extra.empty()) s += std::string(s.empty() ? "" : "; ") + "extra " + join(extra, ", ");
  return s;
}

// The test split: DIR/test or DIR/val (not both).
std::string test_split_name(const std::string& dir) {
  const bool test = is_dir(dir + "/test"), val = is_dir(dir + "/val");
  if (test && val) throw InputError(dir + ": has both test/ and val/; keep the one that is the test split");
  if (!test && !val)
    throw InputError(dir + ": no test/ (or val/) directory: an image folder is DIR/train/<class>/<images> and "
                     "DIR/test/<class>/<images>");
  return test ? "test" : "val";
}

// Why each file fails the header check ("" when it passes), all files checked on every core.
std::vector<std::string> header_pass(const std::vector<std::string>& paths, std::vector<int>& channels) {
  std::vector<std::string> problems(paths.size());
  channels.assign(paths.size(), 0);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  parallel_for(static_cast<int>(paths.size()), cores, [&](int i) {
    const ImageCheck c = check_image_file(paths[i]);
    problems[i] = c.problem;
    channels[i] = c.header.channels;
  });
  return problems;
}

// The data set of one split from its kept files.
Dataset make_dataset(const FolderListing& l, const std::vector<bool>& keep, const std::vector<std::string>& classes,
                     int channels, int side) {
  Dataset d;
  d.name = "folder";
  d.channels = channels;
  d.side = side;
  d.class_names = classes;
  d.decoded_on_demand = true;
  for (size_t i = 0; i < l.paths.size(); ++i)
    if (keep[i]) {
      d.paths.push_back(l.paths[i]);
      d.labels.push_back(l.labels[i]);
    }
  d.count = static_cast<int>(d.paths.size());
  return d;
}

// Records bad files: an InputError naming the first unless they may be skipped.
void handle_bad(const std::vector<std::pair<std::string, std::string>>& bad, bool skip_bad, FolderReport& r,
                const char* when) {
  if (bad.empty()) return;
  if (!skip_bad) {
    const std::string hint = bad.size() > 1 ? " (and " + with_commas(long(bad.size()) - 1) + " more bad files; --skip-bad-images leaves them out)"
                                            : " (--skip-bad-images leaves it out)";
    throw InputError(bad[0].first + ": " + bad[0].second + hint);
  }
  r.skipped += static_cast<int>(bad.size());
  for (const auto& [path, why] : bad)
    if (r.skipped_examples.size() < kExamplesShown) r.skipped_examples.push_back(path + ": " + why + " (" + when + ")");
}

// Decodes every image of a split on `threads` threads, into memory (keep_pixels: the cache) or only
// to find the files that do not decode; those are returned (path, reason) and dropped from the split.
std::vector<std::pair<std::string, std::string>> decode_all(Dataset& d, int threads, bool keep_pixels) {
  if (keep_pixels) d.images.assign(d.image_bytes() * d.count, 0);
  std::vector<std::string> failed(d.count);
  parallel_for(d.count, threads, [&](int i) {
    std::vector<uint8_t> scratch(keep_pixels ? 0 : d.image_bytes());
    try {
      load_image_file(d.paths[i], d.channels, d.side, keep_pixels ? d.images.data() + d.image_bytes() * i : scratch.data());
    } catch (const ImageDecodeError& e) {
      failed[i] = e.what();
    }
    g_images_decoded.fetch_add(1, std::memory_order_relaxed);
  });
  std::vector<std::pair<std::string, std::string>> bad;
  int kept = 0;
  for (int i = 0; i < d.count; ++i) {
    if (!failed[i].empty()) {
      const std::string prefix = d.paths[i] + ": ";
      bad.emplace_back(d.paths[i], failed[i].rfind(prefix, 0) == 0 ? failed[i].substr(prefix.size()) : failed[i]);
      continue;
    }
    if (kept != i) {
      if (keep_pixels) std::memmove(d.images.data() + d.image_bytes() * kept, d.image(i), d.image_bytes());
      d.paths[kept] = d.paths[i];
      d.labels[kept] = d.labels[i];
    }
    ++kept;
  }
  d.count = kept;
  if (keep_pixels) {
    d.images.resize(d.image_bytes() * kept);
    d.decoded_on_demand = false;
  }
  d.paths.resize(kept);
  d.labels.resize(kept);
  return bad;
}

// Both splits decoded once at start: into memory (--cache-decoded, once the memory check has passed),
// or with --skip-bad-images only to leave out the files that pass the header check but do not
// decode, so that what is skipped does not depend on whether images are cached.
void decode_at_start(FolderData& f, const ImageOptions& o) {
  const int images = f.split.train.count + f.split.test.count;
  if (o.cache_decoded)
    check_cache_fits(uint64_t(images) * f.split.train.image_bytes(), read_mem_available(o.meminfo).value_or(0), images, o.side);
  if (o.before_decoding) o.before_decoding(images);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::pair<std::string, std::string>> failed = decode_all(f.split.train, o.threads, o.cache_decoded);
  const auto test_failed = decode_all(f.split.test, o.threads, o.cache_decoded);
  f.report.decode_seconds = seconds_since(t0);
  f.report.decode_threads = o.threads;
  f.report.decoded_images = images;
  failed.insert(failed.end(), test_failed.begin(), test_failed.end());
  handle_bad(failed, o.skip_bad, f.report, "decoding");
  f.report.cache_bytes = uint64_t(f.split.train.images.size()) + f.split.test.images.size();
}

void require_each_class(const Dataset& d, const std::string& split_dir) {
  std::vector<int> per_class(d.classes(), 0);
  for (uint8_t l : d.labels) ++per_class[l];
  for (int k = 0; k < d.classes(); ++k)
    if (per_class[k] == 0)
      throw InputError(split_dir + "/" + d.class_names[k] + ": no readable images left once the bad ones are skipped");
}

}  // namespace

bool has_image_extension(const std::string& file_name) {
  const size_t dot = file_name.rfind('.');
  if (dot == std::string::npos) return false;
  std::string ext = file_name.substr(dot + 1);
  for (char& ch : ext) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  for (const char* e : {"png", "jpg", "jpeg", "bmp", "tga", "gif", "ppm", "pgm"})
    if (ext == e) return true;
  return false;
}

std::vector<std::string> find_classes(const std::string& split_dir) {
  std::vector<std::string> classes, files;
  list_dir(split_dir, classes, files);
  if (classes.empty())
    throw InputError(split_dir + ": no class directories (expected " + split_dir + "/<class>/<images>)");
  return classes;
}

FolderListing list_images(const std::string& split_dir, const std::vector<std::string>& classes) {
  FolderListing l;
  for (size_t k = 0; k < classes.size(); ++k) {
    const size_t before = l.paths.size();
    collect_images(split_dir + "/" + classes[k], 0, l.paths, l.ignored);
    if (l.paths.size() == before)
      throw InputError(split_dir + "/" + classes[k] +
                       ": no images in this class (files ending .png .jpg .jpeg .bmp .tga .gif .ppm .pgm)");
    l.labels.resize(l.paths.size(), static_cast<uint8_t>(k));
  }
  return l;
}

ImageCheck check_image_file(const std::string& path) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is then refused as not a regular file.
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return {{}, std::string("cannot open: ") + std::strerror(errno)};
  try {
    struct stat st{};
    if (fstat(fd, &st) != 0) throw InputError(std::string("cannot stat: ") + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) throw InputError(std::string("is ") + file_kind(st.st_mode) + ", expected a regular file");
    const off_t end = lseek(fd, 0, SEEK_END);
    if (end < 0) throw InputError(std::string("cannot seek: ") + std::strerror(errno));
    const uint64_t size = static_cast<uint64_t>(end);
    std::vector<uint8_t> head(std::min<uint64_t>(size, kImageHeadBytes)), tail(std::min<uint64_t>(size, kImageTailBytes));
    head.resize(read_at(fd, head.data(), head.size(), 0));
    tail.resize(read_at(fd, tail.data(), tail.size(), static_cast<off_t>(size - tail.size())));
    ImageCheck c = check_image(head.data(), head.size(), tail.data(), tail.size(), size);
    if (!c.ok() && size > head.size() && size <= kMaxImageFileBytes) {  // the header may lie deeper
      std::vector<uint8_t> whole(size);
      whole.resize(read_at(fd, whole.data(), whole.size(), 0));
      c = check_image_bytes(whole.data(), whole.size());
    }
    close(fd);
    return c;
  } catch (const InputError& e) {
    close(fd);
    return {{}, e.what()};
  }
}

void check_cache_fits(uint64_t need, uint64_t available, int images, int side) {
  if (available == 0 || need <= available / 4 * 3) return;
  const std::string size = std::to_string(side) + "x" + std::to_string(side);
  throw InputError("--cache-decoded: " + with_commas(images) + " images at " + size + " need " + format_bytes(need) +
                   ", more than 3/4 of the " + format_bytes(available) +
                   " of memory available (MemAvailable): leave out --cache-decoded to decode every epoch, or "
                   "use a smaller --image-size");
}

FolderData load_image_folder(const std::string& dir, const ImageOptions& o) {
  if (!is_dir(dir))
    throw InputError("image folder '" + dir + "' not found (expected DIR/train/<class>/<images> and "
                     "DIR/test/<class>/<images>; `make data-folder` writes Fashion-MNIST as one)");
  const std::string train_dir = dir + "/train";
  if (!is_dir(train_dir))
    throw InputError(dir + ": no train/ directory: an image folder is DIR/train/<class>/<images> and "
                     "DIR/test/<class>/<images>");
  FolderData f;
  f.report.test_split = test_split_name(dir);
  const std::string test_dir = dir + "/" + f.report.test_split;
  const std::vector<std::string> classes = find_classes(train_dir);
  if (classes.size() > size_t(kMaxClasses))
    throw InputError(train_dir + ": " + std::to_string(classes.size()) + " classes, more than the " +
                     std::to_string(kMaxClasses) + " this reader stores");
  const std::vector<std::string> test_classes = find_classes(test_dir);
  if (test_classes != classes)
    throw InputError(test_dir + ": its classes differ from those of " + train_dir + " (" +
                     class_difference(classes, test_classes) + ")");
  const FolderListing listing[2] = {list_images(train_dir, classes), list_images(test_dir, classes)};
  f.report.ignored = listing[0].ignored + listing[1].ignored;

  // The header pass over both splits, then one verdict: error, or skip.
  std::vector<std::string> all(listing[0].paths);
  all.insert(all.end(), listing[1].paths.begin(), listing[1].paths.end());
  std::vector<int> channels;
  const std::vector<std::string> problems = header_pass(all, channels);
  std::vector<std::pair<std::string, std::string>> bad;
  std::vector<bool> keep(all.size());
  bool colour = false;
  for (size_t i = 0; i < all.size(); ++i) {
    keep[i] = problems[i].empty();
    if (!keep[i]) bad.emplace_back(all[i], problems[i]);
    else colour = colour || channels[i] > 2;
  }
  handle_bad(bad, o.skip_bad, f.report, "header check");
  const int stored = colour ? 3 : 1;
  const std::vector<bool> keep_train(keep.begin(), keep.begin() + listing[0].paths.size());
  const std::vector<bool> keep_test(keep.begin() + listing[0].paths.size(), keep.end());
  f.split.train = make_dataset(listing[0], keep_train, classes, stored, o.side);
  f.split.test = make_dataset(listing[1], keep_test, classes, stored, o.side);

  if (o.cache_decoded || o.skip_bad) decode_at_start(f, o);
  require_each_class(f.split.train, train_dir);
  if (f.split.test.count == 0) throw InputError(test_dir + ": no readable images left once the bad ones are skipped");
  return f;
}

const uint8_t* image_pixels(const Dataset& d, int i, uint8_t* scratch) {
  if (!d.decoded_on_demand) return d.image(i);
  load_image_file(d.paths[i], d.channels, d.side, scratch);
  g_images_decoded.fetch_add(1, std::memory_order_relaxed);
  return scratch;
}

long images_decoded() { return g_images_decoded.load(std::memory_order_relaxed); }
