// The conv-algorithm cache: its context line, its file format, loading and atomic saving.
#include "model/autotune_cache.h"

#include <sys/stat.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>

#include "core/errors.h"
#include "core/file_io.h"

namespace {

const char* kHeader = "resnet-trainer autotune cache v2";
// Earlier formats, refused with a line of their own: their choices name engines by rank, not tag.
const char* kOlderHeader = "resnet-trainer autotune cache v1";

// A choice's algorithm: a legacy algorithm's number ("3"), a cuBLASLt GEMM's ("lt3"), or
// cudnn-frontend's engine tag, the engine's number and its knobs ("eng62_k2=4_k25=-1").
bool valid_algorithm(const std::string& a) {
  static const std::regex kAlgorithm(R"((lt)?\d{1,9}|eng\d{1,9}(_k\d{1,9}=-?\d{1,9})*)");
  return std::regex_match(a, kAlgorithm);
}

// The four fields of a choice: algorithm, a small integer, bytes, milliseconds ("eng3_k2=1/1/4096/0.0412").
bool parse_quad(const std::string& text, std::string& first, int& second, size_t& bytes, float& ms) {
  const size_t slash = text.find('/');
  if (slash == std::string::npos) return false;
  first = text.substr(0, slash);
  unsigned long long ws = 0;
  char tail = 0;
  if (std::sscanf(text.c_str() + slash + 1, "%d/%llu/%f%c", &second, &ws, &ms, &tail) != 3) return false;
  if (!valid_algorithm(first) || second < 0 || second > 16 || !std::isfinite(ms)) return false;
  bytes = static_cast<size_t>(ws);
  return true;
}

std::string format_quad(const std::string& first, int second, size_t bytes, float ms) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "/%d/%zu/%.6g", second, bytes, ms);
  return first + buf;
}

bool parse_choice(const std::string& text, AlgoChoice& c) { return parse_quad(text, c.algo, c.math, c.workspace, c.ms); }
std::string format_choice(const AlgoChoice& c) { return format_quad(c.algo, c.math, c.workspace, c.ms); }

}  // namespace

AutotuneEntries parse_autotune_cache(const std::string& text, const std::string& file) {
  AutotuneEntries out;
  std::istringstream in(text);
  std::string line, context;
  int number = 0;
  auto fail = [&](const std::string& why) {
    throw InputError(file + ":" + std::to_string(number) + ": " + why);
  };
  while (std::getline(in, line)) {
    ++number;
    if (number == 1) {
      if (line == kOlderHeader) fail("written by an older version of the trainer (format v1, this one reads v2)");
      if (line != kHeader) fail("not an autotune cache (expected the line '" + std::string(kHeader) + "')");
      continue;
    }
    if (line.empty()) continue;
    if (line.front() == '[') {
      if (line.back() != ']' || line.size() < 3) fail("malformed context line");
      context = line.substr(1, line.size() - 2);
      out[context];
      continue;
    }
    if (context.empty()) fail("entry before any [context] line");
    std::istringstream fields(line);
    if (line.rfind("fused.", 0) == 0) {  // a fused pattern's plan
      std::string key, plan, unfused, extra;
      FusedChoice c;
      char tail = 0;
      if (!(fields >> key >> plan) || plan.rfind("plan=", 0) != 0 ||
          !parse_quad(plan.substr(5), c.engine, c.types, c.workspace, c.ms) ||
          (fields >> unfused && (unfused.rfind("unfused=", 0) != 0 ||
                                 std::sscanf(unfused.c_str() + 8, "%f%c", &c.unfused_ms, &tail) != 1 ||
                                 !std::isfinite(c.unfused_ms) || fields >> extra)))
        fail("expected: fused.<pattern>.<shape> plan=engine/types/workspace/ms [unfused=ms]");
      out[context].fused[key] = c;
      continue;
    }
    std::string shape, f, b, w;
    if (!(fields >> shape >> f >> b >> w) || fields >> line) fail("expected: shape fwd=.. bwd_data=.. bwd_filter=..");
    ConvAlgos a;
    if (f.rfind("fwd=", 0) != 0 || !parse_choice(f.substr(4), a.fwd)) fail("bad fwd field '" + f + "'");
    if (b.rfind("bwd_data=", 0) != 0 || !parse_choice(b.substr(9), a.bwd_data)) fail("bad bwd_data field '" + b + "'");
    if (w.rfind("bwd_filter=", 0) != 0 || !parse_choice(w.substr(11), a.bwd_filter)) fail("bad bwd_filter field '" + w + "'");
    out[context].convs[shape] = a;
  }
  if (number == 0) fail("empty file");
  return out;
}

std::string format_autotune_cache(const AutotuneEntries& entries) {
  std::string s = std::string(kHeader) + "\n";
  for (const auto& [context, here] : entries) {
    if (here.empty()) continue;
    s += "[" + context + "]\n";
    for (const auto& [shape, a] : here.convs)
      s += shape + " fwd=" + format_choice(a.fwd) + " bwd_data=" + format_choice(a.bwd_data) +
           " bwd_filter=" + format_choice(a.bwd_filter) + "\n";
    for (const auto& [key, c] : here.fused) {
      s += key + " plan=" + format_quad(c.engine, c.types, c.workspace, c.ms);
      if (c.unfused_ms >= 0) {
        char buf[48];
        std::snprintf(buf, sizeof(buf), " unfused=%.6g", c.unfused_ms);
        s += buf;
      }
      s += "\n";
    }
  }
  return s;
}

int algorithm_number(const std::string& algo, const std::string& prefix) {
  if (algo.rfind(prefix, 0) != 0) return -1;
  const std::string n = algo.substr(prefix.size());
  if (n.empty() || n.size() > 3 || n.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoi(n);
}

std::string AutotuneContext::key() const {
  return "gpu=" + gpu + ";cudnn=" + std::to_string(cudnn_version) + ";precision=" + dtype_name(precision) +
         ";layout=" + layout_name(layout) + ";tf32=" + (tf32 ? "1" : "0") + ";api=" + conv_api_name(api) +
         ";workspace_mb=" + std::to_string(workspace_mb);
}

std::vector<std::string> AutotuneCache::load() {
  struct stat st{};
  if (path_.empty() || stat(path_.c_str(), &st) != 0) return {};  // no cache yet
  try {
    const std::vector<uint8_t> bytes = read_file(path_, size_t(16) << 20);  // a few KiB in practice
    all_ = parse_autotune_cache(std::string(bytes.begin(), bytes.end()), path_);
  } catch (const InputError& e) {
    all_.clear();
    return {std::string("ignoring the autotune cache: ") + e.what() + "; searching again"};
  }
  if (all_.count(context_) == 0 || all_[context_].empty())
    return {"the autotune cache " + path_ + " has no entries for [" + context_ +
            "] (made on another GPU, cuDNN or build); searching again"};
  return {};
}

namespace {

// A context's entry of one kind (a conv's choices or a fused pattern's plan), or null.
template <class T>
const T* find_entry(const AutotuneEntries& all, const std::string& context,
                    std::map<std::string, T> ContextEntries::*kind, const std::string& key) {
  const auto c = all.find(context);
  if (c == all.end()) return nullptr;
  const std::map<std::string, T>& entries = c->second.*kind;
  const auto e = entries.find(key);
  return e == entries.end() ? nullptr : &e->second;
}

// Sets an entry; whether that changed it.
template <class T>
bool put_entry(std::map<std::string, T>& entries, const std::string& key, const T& value) {
  const auto [e, added] = entries.try_emplace(key, value);
  if (added) return true;
  if (e->second == value) return false;
  e->second = value;
  return true;
}

}  // namespace

void AutotuneCache::arm_late_notice(std::chrono::milliseconds delay, FILE* out) {
  notice_delay_ = delay;
  notice_out_ = out;
}

void AutotuneCache::end_late_notice() {
  notice_.reset();  // waits for the notice's thread
  notice_delay_.reset();
}

void AutotuneCache::missed() const {
  if (notice_delay_ && !notice_) notice_ = std::make_unique<LateNotice>(*notice_delay_, still_measuring_line(), notice_out_);
}

const ConvAlgos* AutotuneCache::find(const std::string& shape) const {
  const ConvAlgos* hit = find_entry(all_, context_, &ContextEntries::convs, shape);
  if (!hit) missed();
  return hit;
}

void AutotuneCache::put(const std::string& shape, const ConvAlgos& algos) {
  changed_ = put_entry(all_[context_].convs, shape, algos) || changed_;
}

const FusedChoice* AutotuneCache::find_fused(const std::string& key) const {
  const FusedChoice* hit = find_entry(all_, context_, &ContextEntries::fused, key);
  if (!hit) missed();
  return hit;
}

void AutotuneCache::put_fused(const std::string& key, const FusedChoice& choice) {
  changed_ = put_entry(all_[context_].fused, key, choice) || changed_;
}

void AutotuneCache::save() const {
  if (path_.empty()) return;
  const std::string text = format_autotune_cache(all_);
  write_file_atomic(path_, text.data(), text.size());
}

void AutotuneCache::erase_fused(const std::string& key) {
  const auto c = all_.find(context_);
  if (c != all_.end() && c->second.fused.erase(key) > 0) changed_ = true;
}

size_t AutotuneCache::entries_here() const {
  const auto c = all_.find(context_);
  return c == all_.end() ? 0 : c->second.convs.size() + c->second.fused.size();
}

std::string AutotuneCache::still_measuring_line() const {
  const std::string what = entries_here() == 0 ? path_ + " has none for this GPU and build yet"
                                               : "shapes or patterns new to " + path_ + ": another batch or image size";
  return "convs: measuring cuDNN's conv algorithms and fused plans (" + what + "); this can take a minute, and " +
         (unsaved_.empty() ? "they are saved so that later starts skip it" : "they are not saved: " + unsaved_);
}

std::string injected_tool_in(const char* injection_path, std::istream& maps) {
  if (injection_path && *injection_path) return injection_path;
  for (std::string line; std::getline(maps, line);) {
    const size_t path = line.find('/');
    if (path == std::string::npos) continue;
    std::string name = line.substr(line.rfind('/') + 1);
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (name.find("injection") != std::string::npos || name.find("sanitizer") != std::string::npos)
      return line.substr(path);
  }
  return "";
}

std::string injected_cuda_tool() {
  std::ifstream maps("/proc/self/maps");
  return injected_tool_in(std::getenv("CUDA_INJECTION64_PATH"), maps);
}

bool AutotuneCache::leave_unsaved_under_tool() {
  const std::string tool = injected_cuda_tool();
  if (!tool.empty()) left_unsaved(measured_under_tool(tool));
  return !tool.empty();
}

std::string measured_under_tool(const std::string& tool) {
  return "measured under a CUDA tool (" + tool + "), whose overhead skews the timings; run once without it to "
         "fill the cache, then profile";
}
