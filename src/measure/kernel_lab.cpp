// bin/kernel_lab's bookkeeping: options, the network's shapes, rows, their table and JSON, timing.
#include "measure/kernel_lab.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "core/check.h"
#include "core/handles.h"
#include "core/json_line.h"

namespace {

constexpr int kStageWidths[4] = {64, 128, 256, 512};
constexpr int kStageBlocks[4] = {3, 4, 6, 3};
constexpr int kExpansion = 4;
constexpr int kSide = 32;      // CIFAR images; the stem keeps the side
constexpr int kStemWidth = 64;

// One bottleneck block's sizes, as the network builds them (model/resnet50_spec.h).
struct BlockDims {
  int stage, index;
  int in_c, width, out_c;
  int side, stride;
  int out_side() const { return (side + stride - 1) / stride; }  // what the strided conv gives
};

std::vector<BlockDims> blocks() {
  std::vector<BlockDims> b;
  int in_c = kStemWidth, side = kSide;
  for (int s = 0; s < 4; ++s)
    for (int i = 0; i < kStageBlocks[s]; ++i) {
      const int stride = (s > 0 && i == 0) ? 2 : 1, w = kStageWidths[s];
      b.push_back({s + 1, i, in_c, w, w * kExpansion, side, stride});
      in_c = w * kExpansion;
      side = b.back().out_side();
    }
  return b;
}

template <class T>
void add_unique(std::vector<T>& v, const T& x) {
  if (std::find(v.begin(), v.end(), x) == v.end()) v.push_back(x);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t end = s.find(sep, start);
    parts.push_back(s.substr(start, end - start));
    if (end == std::string::npos) return parts;
    start = end + 1;
  }
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

std::string shapes_text(const std::vector<ChwShape>& v) {
  std::vector<std::string> t;
  for (const ChwShape& s : v) t.push_back(s.text());
  return join(t, ",");
}

// "64x32x32", or "128x64x32x32" whose first number must be the batch.
ChwShape parse_shape(const std::string& text, int batch) {
  const std::vector<std::string> parts = split(text, 'x');
  if (parts.size() != 3 && parts.size() != 4)
    throw UsageError("--shapes: '" + text + "' is not CxHxW (or NxCxHxW)");
  std::vector<int> v;
  for (const std::string& p : parts) v.push_back(static_cast<int>(parse_long("--shapes", p, 1, 1 << 20)));
  if (v.size() == 4 && v[0] != batch)
    throw UsageError("--shapes: '" + text + "' has batch " + std::to_string(v[0]) + ", but --batch is " +
                     std::to_string(batch));
  const size_t o = v.size() - 3;
  return {v[o], v[o + 1], v[o + 2]};
}

// "fp16-nhwc": a format as --formats names it.
std::string flag_name(const LabFormat& f) {
  std::string n = std::string(dtype_name(f.t)) + "-" + layout_name(f.l);
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char ch) { return char(std::tolower(ch)); });
  return n;
}

std::vector<LabFormat> parse_formats(const std::string& text) {
  const LabFormat all[] = {{DType::F16, Layout::NHWC}, {DType::F16, Layout::NCHW}, {DType::F32, Layout::NHWC},
                           {DType::F32, Layout::NCHW}};
  std::vector<LabFormat> out;
  for (const std::string& name : split(text, ',')) {
    bool known = false;
    for (const LabFormat& f : all)
      if (name == flag_name(f) || name == "all") add_unique(out, f), known = true;
    if (!known) throw UsageError("--formats: '" + name + "' is none of fp16-nhwc, fp16-nchw, fp32-nhwc, fp32-nchw, all");
  }
  return out;
}

std::string formats_text(const std::vector<LabFormat>& v) {
  std::vector<std::string> t;
  for (const LabFormat& f : v) t.push_back(flag_name(f));
  return join(t, ",");
}

const std::vector<FlagRow<LabOptions>>& flag_table() {
  using O = LabOptions;
  auto num = [](long v) { return std::to_string(v); };
  static const std::vector<FlagRow<O>> table = {
      {"--batch", "N", "the batch the versions are timed at", [=](const O& o) { return num(o.batch); },
       [](O& o, const std::string& v) { o.batch = int(parse_long("--batch", v, 1, 4096)); }},
      {"--check-batch", "N",
       "images the CPU reference (double) computes; the timed batch is made of them repeated, so it must be a multiple",
       [=](const O& o) { return num(o.check_batch); },
       [](O& o, const std::string& v) { o.check_batch = int(parse_long("--check-batch", v, 1, 64)); }},
      {"--runs", "N", "timed runs per version (the median is reported)", [=](const O& o) { return num(o.runs); },
       [](O& o, const std::string& v) { o.runs = int(parse_long("--runs", v, 1, 10000)); }},
      {"--shapes", "LIST",
       "tensor shapes CxHxW (or NxCxHxW) of the network's batch norms: BN operations run at them, joins where they "
       "are block outputs, convs that read or write one",
       [](const O& o) { return shapes_text(o.shapes); }, [](O& o, const std::string& v) { o.shapes_flag = v; }},
      {"--only", "LIST", "operations to measure, or prefixes of them (bn, join, conv); see below",
       [](const O&) { return std::string("all"); },
       [](O& o, const std::string& v) { o.only = split(v, ','); }},
      {"--formats", "LIST",
       "element types and layouts of the BN operations: fp16-nhwc, fp16-nchw, fp32-nhwc, fp32-nchw, all",
       [](const O& o) { return formats_text(o.formats); },
       [](O& o, const std::string& v) { o.formats = parse_formats(v); }},
      {"--autotune", "", "time cuDNN's first candidate plans and keep the fastest, as autotuning builds do",
       [](const O&) { return std::string("the heuristics' first plan"); },
       [](O& o, const std::string&) { o.autotune = true; }},
      {"--no-check", "", "skip the checks against the CPU reference", [](const O&) { return std::string("check"); },
       [](O& o, const std::string&) { o.check = false; }},
      {"--flush-mb", "N", "MiB written before every timed run to flush the L2 cache",
       [=](const O& o) { return num(o.flush_mb); },
       [](O& o, const std::string& v) { o.flush_mb = parse_long("--flush-mb", v, 1, 65536); }},
      {"--as-graph", "",
       "time each version as a CUDA graph of its run, cuDNN's memsets as the training step's graph has them (those of "
       "statistics the finalize leaves zero dropped, the rest run as kernels)",
       [](const O&) { return std::string("each run launched eagerly"); },
       [](O& o, const std::string&) { o.as_graph = true; }},
      {"--workspace-mb", "N", "cuDNN workspace limit in MiB", [=](const O& o) { return num(o.workspace_mb); },
       [](O& o, const std::string& v) { o.workspace_mb = parse_long("--workspace-mb", v, 0, 1 << 20); }},
      {"--json", "FILE", "also write every row as a JSON line to FILE", [](const O&) { return std::string("off"); },
       [](O& o, const std::string& v) {
         if (v.empty()) throw UsageError("--json needs a file name");
         o.json = v;
       }},
      {"--help", "", "print this help", [](const O&) { return std::string(); },
       [](O& o, const std::string&) { o.help = true; }},
  };
  return table;
}

}  // namespace

std::string ChwShape::text() const { return std::to_string(c) + "x" + std::to_string(h) + "x" + std::to_string(w); }

std::string LabFormat::text() const { return std::string(dtype_name(t)) + " " + layout_name(l); }

const char* conv_role_name(ConvRole r) {
  switch (r) {
    case ConvRole::Reduce: return "conv1";
    case ConvRole::Spatial: return "conv2";
    case ConvRole::Expand: return "conv3";
    default: return "downsample.0";
  }
}

std::string LabConv::text() const {
  const std::string n = std::to_string(g.n) + "x";
  const ChwShape in{g.c, g.h, g.w}, out{g.k, g.out_h(), g.out_w()};
  return std::to_string(g.r) + "x" + std::to_string(g.r) + "/" + std::to_string(g.stride) + " " + n + in.text() +
         " -> " + n + out.text() + " (" + layers + ")";
}

std::vector<LabConv> network_convs(int n) {
  std::vector<LabConv> convs;
  std::vector<std::pair<int, int>> blocks_of;  // stage, first block of each conv
  for (const BlockDims& b : blocks()) {
    const int os = b.out_side();
    const std::pair<ConvRole, ConvGeometry> units[] = {
        {ConvRole::Reduce, {n, b.in_c, b.side, b.side, b.width, 1, 1, 0}},
        {ConvRole::Spatial, {n, b.width, b.side, b.side, b.width, 3, b.stride, 1}},
        {ConvRole::Expand, {n, b.width, os, os, b.out_c, 1, 1, 0}},
        {ConvRole::Shortcut, {n, b.in_c, b.side, b.side, b.out_c, 1, b.stride, 0}}};
    for (const auto& [role, g] : units) {
      if (role == ConvRole::Shortcut && b.stride == 1 && b.in_c == b.out_c) continue;  // identity shortcut
      auto same = [&](const LabConv& c) { return c.role == role && c.g.key() == g.key(); };
      auto it = std::find_if(convs.begin(), convs.end(), same);
      const std::string stage = "layer" + std::to_string(b.stage) + ".";
      if (it == convs.end()) {
        convs.push_back({role, g, stage + std::to_string(b.index) + "." + conv_role_name(role)});
        blocks_of.push_back({b.stage, b.index});
      } else {  // the blocks of one stage after its first share their convs: "layer1.1-2.conv1"
        const int first = blocks_of[it - convs.begin()].second;
        it->layers = stage + std::to_string(first) + "-" + std::to_string(b.index) + "." + conv_role_name(role);
      }
    }
  }
  return convs;
}

std::vector<ChwShape> network_bn_shapes() {
  std::vector<ChwShape> v{{kStemWidth, kSide, kSide}};
  for (const BlockDims& b : blocks()) {
    add_unique(v, {b.width, b.side, b.side});
    add_unique(v, {b.width, b.out_side(), b.out_side()});
    add_unique(v, {b.out_c, b.out_side(), b.out_side()});
  }
  return v;
}

std::vector<ChwShape> network_join_shapes() {
  std::vector<ChwShape> v;
  for (const BlockDims& b : blocks()) add_unique(v, {b.out_c, b.out_side(), b.out_side()});
  return v;
}

std::vector<ChwShape> default_lab_shapes() {
  std::vector<ChwShape> v;
  for (const BlockDims& b : blocks())
    if (b.index > 0) {
      add_unique(v, {b.width, b.side, b.side});
      add_unique(v, {b.out_c, b.side, b.side});
    }
  return v;
}

const std::vector<std::string>& lab_operations() {
  static const std::vector<std::string> ops = {
      "bn-stats",     "bn-apply",   "bn-backward", "join-projection-forward", "join-identity-forward",
      "join-projection-backward", "join-identity-backward", "conv-forward", "conv-dgrad", "conv-wgrad"};
  return ops;
}

bool operation_selected(const LabOptions& o, const std::string& op) {
  if (o.only.empty()) return true;
  for (const std::string& e : o.only)
    if (op == e || op.rfind(e + "-", 0) == 0) return true;
  return false;
}

bool conv_selected(const LabOptions& o, const LabConv& c) {
  const ChwShape in{c.g.c, c.g.h, c.g.w}, out{c.g.k, c.g.out_h(), c.g.out_w()};
  return std::find(o.shapes.begin(), o.shapes.end(), in) != o.shapes.end() ||
         std::find(o.shapes.begin(), o.shapes.end(), out) != o.shapes.end();
}

LabOptions parse_lab_options(int argc, const char* const* argv) {
  LabOptions o;
  parse_flags(flag_table(), argc, argv, o);
  if (!o.shapes_flag.empty()) {  // read once --batch, which may come after it, is known
    o.shapes.clear();
    const std::vector<ChwShape> known = network_bn_shapes();
    for (const std::string& text : split(o.shapes_flag, ',')) {
      const ChwShape s = parse_shape(text, o.batch);
      if (std::find(known.begin(), known.end(), s) == known.end())
        throw UsageError("--shapes: " + s.text() + " is not a batch-norm tensor of the network; those are " +
                         shapes_text(known));
      add_unique(o.shapes, s);
    }
  }
  for (const std::string& e : o.only) {
    bool any = false;
    for (const std::string& op : lab_operations()) any |= op == e || op.rfind(e + "-", 0) == 0;
    if (!any) throw UsageError("--only: '" + e + "' names no operation; they are " + join(lab_operations(), ", "));
  }
  if (o.batch % o.check_batch != 0)
    throw UsageError("--batch " + std::to_string(o.batch) + " is not a multiple of --check-batch " +
                     std::to_string(o.check_batch) + " (the timed batch repeats the checked images)");
  return o;
}

std::string lab_usage_text() {
  return "usage: kernel_lab [flags]\n"
         "Times every version of the batch-norm and fused-conv operations side by side at the network's shapes,\n"
         "each checked against the CPU reference, with the L2 cache flushed before every timed run.\n\nflags:\n" +
         flags_help(flag_table()) + "\noperations: " + join(lab_operations(), ", ") + "\n";
}

// ---- results ----------------------------------------------------------------------------------------

float median_of(std::vector<float> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5f * (v[m - 1] + v[m]);
}

double gb_per_s(size_t bytes, double ms) { return ms > 0 ? double(bytes) / (ms * 1e6) : 0.0; }

bool checks_passed(const std::vector<LabCheck>& c) {
  for (const LabCheck& k : c)
    if (!(k.error <= k.bound)) return false;  // NaN fails
  return true;
}

std::string check_text(const std::vector<LabCheck>& c) {
  if (c.empty()) return "-";
  const LabCheck* worst = &c[0];
  for (const LabCheck& k : c) {
    if (!(k.error <= k.bound)) {  // the first failure, NaN included
      worst = &k;
      break;
    }
    if (k.error / k.bound > worst->error / worst->bound) worst = &k;
  }
  char buf[160];
  if (checks_passed(c)) std::snprintf(buf, sizeof(buf), "ok %.1e", worst->error);
  else std::snprintf(buf, sizeof(buf), "FAIL %s %.1e > %.0e", worst->output.c_str(), worst->error, worst->bound);
  return buf;
}

bool row_failed(const LabRow& r) { return !r.error.empty() || !checks_passed(r.checks); }

namespace {
std::string pad(std::string s, size_t width) {
  if (s.size() < width) s.resize(width, ' ');
  return s;
}
std::string table_line(const std::string& version, const std::string& shape, const std::string& format,
                       const std::string& ms, const std::string& gbs, const std::string& check) {
  return "| " + pad(version, 66) + " | " + pad(shape, 50) + " | " + pad(format, 9) + " | " + pad(ms, 9) + " | " +
         pad(gbs, 6) + " | " + check + " |\n";
}
}  // namespace

std::string lab_table_header() {
  return table_line("version", "shape", "format", "ms median", "GB/s", "check") +
         table_line(std::string(66, '-'), std::string(50, '-'), std::string(9, '-'), std::string(9, '-'),
                    std::string(6, '-'), "-----");
}

std::string lab_table_line(const LabRow& r) {
  const std::string version = r.note.empty() ? r.version : r.version + " [" + r.note + "]";
  if (!r.refused.empty()) return table_line(version, r.shape, r.format, "refused: " + r.refused, "-", "-");
  if (!r.error.empty()) return table_line(version, r.shape, r.format, "-", "-", "error: " + r.error);
  const float ms = median_of(r.ms);
  char t[32], g[32];
  std::snprintf(t, sizeof(t), "%.4f", ms);
  if (r.bytes) std::snprintf(g, sizeof(g), "%.0f", gb_per_s(r.bytes, ms));
  else std::snprintf(g, sizeof(g), "-");
  return table_line(version, r.shape, r.format, t, g, check_text(r.checks));
}

std::string lab_json_row(const LabRow& r) {
  JsonLine j;
  j.add("event", "row").add("op", r.op).add("version", r.version).add("shape", r.shape).add("format", r.format);
  if (!r.note.empty()) j.add("note", r.note);
  const std::string status = !r.refused.empty() ? "refused" : !r.error.empty() ? "error"
                             : checks_passed(r.checks) ? "ok" : "check failed";
  j.add("status", status);
  if (!r.refused.empty()) j.add("why", r.refused);
  if (!r.error.empty()) j.add("why", r.error);
  if (!r.ms.empty()) {
    const float ms = median_of(r.ms);
    j.add("ms_median", double(ms))
        .add("ms_min", double(*std::min_element(r.ms.begin(), r.ms.end())))
        .add("ms_max", double(*std::max_element(r.ms.begin(), r.ms.end())))
        .add("runs", int(r.ms.size()));
    if (r.bytes) j.add("bytes", static_cast<unsigned long long>(r.bytes)).add("gb_per_s", gb_per_s(r.bytes, ms));
  }
  for (const LabCheck& k : r.checks) j.add("error_" + k.output, k.error);
  if (!r.checks.empty()) j.add("check", check_text(r.checks));
  return j.str();
}

namespace {
struct Tally {
  int ok = 0, refused = 0, failed = 0;
  explicit Tally(const std::vector<LabRow>& rows) {
    for (const LabRow& r : rows) {
      if (row_failed(r)) ++failed;
      else if (!r.refused.empty()) ++refused;
      else ++ok;
    }
  }
};
}  // namespace

std::string lab_summary(const std::vector<LabRow>& rows, double seconds, double plan_s) {
  const Tally t(rows);
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "kernel lab: %zu versions measured: %d ok, %d refused, %d failed; %.1f s, of which %.1f s "
                "building cuDNN plans\n",
                rows.size(), t.ok, t.refused, t.failed, seconds, plan_s);
  return buf;
}

std::string lab_json_end(const std::vector<LabRow>& rows, double seconds, double plan_s) {
  const Tally t(rows);
  return JsonLine()
      .add("event", "end")
      .add("rows", int(rows.size()))
      .add("ok", t.ok)
      .add("refused", t.refused)
      .add("failed", t.failed)
      .add("seconds", seconds)
      .add("plan_seconds", plan_s)
      .str();
}

// ---- timing -------------------------------------------------------------------------------------------

std::vector<float> time_with_cold_l2(cudaStream_t stream, const DeviceBuffer& flush, int runs,
                                     const std::function<void()>& f) {
  std::vector<Event> start, stop;
  for (int i = 0; i < runs; ++i) start.emplace_back(), stop.emplace_back();
  for (int i = 0; i < runs; ++i) {
    CUDA_CHECK(cudaMemsetAsync(flush.get(), i & 0xFF, flush.bytes(), stream));
    start[i].record(stream);
    f();
    stop[i].record(stream);
  }
  CUDA_CHECK(cudaEventSynchronize(stop.back().get()));
  std::vector<float> ms;
  for (int i = 0; i < runs; ++i) ms.push_back(stop[i].ms_since(start[i]));
  return ms;
}
