// The conv-algorithm cache: its context line, its file format, loading and atomic saving.
#include "model/autotune_cache.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "core/errors.h"
#include "core/file_io.h"

namespace {

const char* kHeader = "resnet-trainer autotune cache v1";

bool parse_choice(const std::string& text, AlgoChoice& c) {
  // algo/math/workspace/ms, all present, integers then a float
  int algo = 0, math = 0;
  unsigned long long ws = 0;
  float ms = 0;
  char tail = 0;
  if (std::sscanf(text.c_str(), "%d/%d/%llu/%f%c", &algo, &math, &ws, &ms, &tail) != 4) return false;
  if (algo < 0 || algo > 64 || math < 0 || math > 16) return false;
  c = {algo, math, static_cast<size_t>(ws), ms};
  return true;
}

std::string format_choice(const AlgoChoice& c) {
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%d/%d/%zu/%.6g", c.algo, c.math, c.workspace, c.ms);
  return buf;
}

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
    std::string shape, f, b, w, acc;
    if (!(fields >> shape >> f >> b >> w) || (fields >> acc && (acc.rfind("bwd_data_acc=", 0) != 0 || fields >> line)))
      fail("expected: shape fwd=.. bwd_data=.. bwd_filter=.. [bwd_data_acc=..]");
    ConvAlgos a;
    if (f.rfind("fwd=", 0) != 0 || !parse_choice(f.substr(4), a.fwd)) fail("bad fwd field '" + f + "'");
    if (b.rfind("bwd_data=", 0) != 0 || !parse_choice(b.substr(9), a.bwd_data)) fail("bad bwd_data field '" + b + "'");
    if (w.rfind("bwd_filter=", 0) != 0 || !parse_choice(w.substr(11), a.bwd_filter)) fail("bad bwd_filter field '" + w + "'");
    if (!acc.empty() && !parse_choice(acc.substr(13), a.bwd_data_acc))
      fail("bad bwd_data_acc field '" + acc + "'");
    out[context][shape] = a;
  }
  if (number == 0) fail("empty file");
  return out;
}

std::string format_autotune_cache(const AutotuneEntries& entries) {
  std::string s = std::string(kHeader) + "\n";
  for (const auto& [context, shapes] : entries) {
    if (shapes.empty()) continue;
    s += "[" + context + "]\n";
    for (const auto& [shape, a] : shapes)
      s += shape + " fwd=" + format_choice(a.fwd) + " bwd_data=" + format_choice(a.bwd_data) +
           " bwd_filter=" + format_choice(a.bwd_filter) +
           (a.bwd_data_acc.algo >= 0 ? " bwd_data_acc=" + format_choice(a.bwd_data_acc) : "") + "\n";
  }
  return s;
}

std::string AutotuneContext::key() const {
  // A graph-API choice is a rank in the heuristics' lists of modes A then B (ConvGraph): files from
  // before B's list was searched hold A-only choices, and their context differs, so they are searched again.
  return "gpu=" + gpu + ";cudnn=" + std::to_string(cudnn_version) + ";precision=" + dtype_name(precision) +
         ";layout=" + layout_name(layout) + ";tf32=" + (tf32 ? "1" : "0") + ";api=" + conv_api_name(api) +
         (api == ConvApi::Graph ? ";lists=a,b" : "") + ";workspace_mb=" + std::to_string(workspace_mb);
}

AutotuneCache::AutotuneCache(std::string path, std::string context)
    : path_(std::move(path)), context_(std::move(context)) {}

std::vector<std::string> AutotuneCache::load() {
  std::vector<std::string> warnings;
  struct stat st{};
  if (path_.empty() || stat(path_.c_str(), &st) != 0) return warnings;  // no cache yet
  try {
    const std::vector<uint8_t> bytes = read_file(path_, size_t(16) << 20);  // a few KiB in practice
    all_ = parse_autotune_cache(std::string(bytes.begin(), bytes.end()), path_);
  } catch (const InputError& e) {
    all_.clear();
    warnings.push_back(std::string("ignoring the autotune cache: ") + e.what() + "; searching again");
    return warnings;
  }
  if (all_.count(context_) == 0 || all_[context_].empty())
    warnings.push_back("the autotune cache " + path_ + " has no entries for [" + context_ +
                       "] (made on another GPU, cuDNN or build); searching again");
  return warnings;
}

const ConvAlgos* AutotuneCache::find(const std::string& shape) const {
  const auto c = all_.find(context_);
  if (c == all_.end()) return nullptr;
  const auto s = c->second.find(shape);
  return s == c->second.end() ? nullptr : &s->second;
}

void AutotuneCache::put(const std::string& shape, const ConvAlgos& algos) { all_[context_][shape] = algos; }

void AutotuneCache::save() const {
  if (path_.empty()) return;
  const std::string text = format_autotune_cache(all_);
  write_file_atomic(path_, text.data(), text.size());
}

size_t AutotuneCache::entries_here() const {
  const auto c = all_.find(context_);
  return c == all_.end() ? 0 : c->second.size();
}
