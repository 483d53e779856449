// The kernel lab's workbench: plans, the workspace, measuring versions, data and checks (lab/lab.h).
#include "kernel_lab/lab.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "core/check.h"
#include "core/cuda_graph.h"
#include "core/elapsed.h"
#include "core/format.h"
#include "core/json_line.h"

namespace lab {

namespace {

constexpr int kMaxChannels = 2048;

// Element i of a tensor's raw bytes in type t.
double element(const std::vector<uint8_t>& raw, size_t i, DType t) {
  if (t == DType::F32) {
    float f;
    std::memcpy(&f, raw.data() + 4 * i, 4);
    return f;
  }
  uint16_t b;
  std::memcpy(&b, raw.data() + 2 * i, 2);
  return __half2float(gpu_test::half_from_bits(b));
}

}  // namespace

Lab::Lab(const LabOptions& o)
    : opt(o),
      flush_(size_t(o.flush_mb) << 20, "L2 flush buffer (--flush-mb)"),
      zeros_(kMaxChannels * sizeof(float), "zero vector") {
  CUDA_CHECK(cudaGetDeviceProperties(&prop_, 0));
  CUDA_CHECK(cudaMemset(zeros_.get(), 0, zeros_.bytes()));
}

std::string Lab::header() const {
  char buf[2048];
  std::snprintf(buf, sizeof(buf),
                "kernel lab: %s (sm_%d%d, %d SMs, L2 %s), cuDNN %zu, %s\n"
                "batch %d: the check batch of %d images repeated %d times; conv and fused plans: %s\n"
                "each version runs once and is checked against the CPU reference in double (the worst output's "
                "relative error; bounds: fp16 %.0e, fp32 %.0e), then runs %d times, each after a %s memset that "
                "flushes L2 (outside the timed events); ms median of those runs%s\n",
                prop_.name, prop_.major, prop_.minor, prop_.multiProcessorCount,
                format_bytes(size_t(prop_.l2CacheSize)).c_str(), cudnnGetVersion(), today().c_str(), opt.batch,
                opt.check_batch, repeats(),
                opt.autotune ? "autotuned (the fastest of cuDNN's first candidates)" : "cuDNN's heuristics, first choice",
                gpu_test::kTolF16, gpu_test::kTolF32, opt.runs, format_bytes(flush_.bytes()).c_str(),
                opt.as_graph ? "; each run a CUDA graph of the version (--as-graph: cuDNN's memsets of statistics the "
                               "finalize leaves zero dropped, the rest run as kernels, as in the training step)"
                             : "");
  std::string s = buf;
  if (flush_.bytes() < 2 * size_t(prop_.l2CacheSize))
    s += "warning: --flush-mb is less than twice the L2 cache; runs may start with data in L2\n";
  return s;
}

std::string Lab::json_start(const std::string& command) const {
  return JsonLine()
      .add("event", "start")
      .add("program", "kernel_lab")
      .add("command", command)
      .add("gpu", prop_.name)
      .add("sm", prop_.major * 10 + prop_.minor)
      .add("l2_bytes", static_cast<unsigned long long>(prop_.l2CacheSize))
      .add("cudnn", static_cast<unsigned long>(cudnnGetVersion()))
      .add("date", today())
      .add("batch", opt.batch)
      .add("check_batch", opt.check_batch)
      .add("runs", opt.runs)
      .add("flush_bytes", static_cast<unsigned long long>(flush_.bytes()))
      .add("plans", opt.autotune ? "autotuned" : "heuristics")
      .add("as_graph", opt.as_graph)
      .str();
}

ConvLayer& Lab::conv(const ConvGeometry& g) {
  std::unique_ptr<ConvLayer>& c = convs_[g.key()];
  if (!c) {
    const auto t0 = std::chrono::steady_clock::now();
    c = make_conv(ConvApi::Graph, g, DType::F16, Layout::NHWC, true);
    const ConvPolicy p{opt.autotune ? AlgoPolicy::Autotune : AlgoPolicy::Heuristic, false,
                       size_t(opt.workspace_mb) << 20};
    AlgoChooser(gpu_.cudnn, p, nullptr).configure(*c);
    plan_s_ += seconds_since(t0);
  }
  return *c;
}

const FusedConv& Lab::fused(FusedPattern p, const ConvGeometry& g) {
  std::unique_ptr<FusedConv>& f = fused_[std::to_string(int(p)) + ":" + g.key()];
  if (!f) {
    const auto t0 = std::chrono::steady_clock::now();
    const FusedOptions o{DType::F16, Layout::NHWC, false, size_t(opt.workspace_mb) << 20, opt.autotune};
    f = std::make_unique<FusedConv>(gpu_.cudnn, p, g, o);
    plan_s_ += seconds_since(t0);
  }
  return *f;
}

void Lab::reserve_workspace(size_t bytes) {
  if (bytes > ws_.bytes()) {
    CUDA_CHECK(cudaStreamSynchronize(stream()));  // nothing may still use the old one
    ws_ = DeviceBuffer(bytes, "cuDNN workspace");
  }
}

void Lab::section(const std::string& op, const std::string& what, const std::string& bytes_rule) {
  std::printf("\n## %s: %s\nGB/s: %s\n\n%s", op.c_str(), what.c_str(), bytes_rule.c_str(), lab_table_header().c_str());
  std::fflush(stdout);
}

void Lab::measure(const std::string& op, const std::string& shape, const std::string& format, size_t bytes,
                  const std::vector<LabVersion>& versions) {
  for (const LabVersion& v : versions) {
    LabRow row;
    row.op = op;
    row.version = v.name;
    row.shape = shape;
    row.format = format;
    row.bytes = bytes;
    try {
      const Prepared p = v.prepare();
      row.note = p.note;
      row.refused = p.refused;
      if (row.refused.empty()) {
        p.run();  // loads its kernels, and gives the outputs the check reads
        CUDA_CHECK(cudaStreamSynchronize(stream()));
        // With --as-graph, as the step's graph runs it: the memsets into what the run keeps zero
        // dropped, the rest as kernels. The graph is what is checked and timed: a dropped memset that
        // mattered shows.
        CudaGraph g;
        std::function<void()> timed = p.run;
        if (opt.as_graph) {
          g.drop_memsets_into(p.kept_zero);
          g.capture(stream(), p.run);
          g.launch(stream());
          CUDA_CHECK(cudaStreamSynchronize(stream()));
          timed = [&] { g.launch(stream()); };
        }
        if (opt.check) row.checks = p.check();
        row.ms = time_with_cold_l2(stream(), flush_, opt.runs, timed);
      }
    } catch (const std::exception& e) {
      row.error = e.what();
      cudaStreamSynchronize(stream());  // let the next version start clean (a sticky error will fail it too)
      cudaGetLastError();
    }
    std::printf("%s", lab_table_line(row).c_str());
    std::fflush(stdout);
    rows_.push_back(std::move(row));
  }
}

BnBackwardArgs backward_args(const void* dy, ReluMask mask, const void* y, const void* x, const BnChannelState* bn,
                             float* dgamma, float* dbeta, void* dx) {
  BnBackwardArgs a{};
  a.dy = dy;
  a.relu = mask;
  a.y = y;
  a.x = x;
  a.bn = bn;
  a.dgamma = dgamma;
  a.dbeta = dbeta;
  a.dx = dx;
  return a;
}

DeviceTensor repeated(const Vec& small, const ref::Dims& d, int repeats, DType t, Layout l) {
  const DeviceTensor one = gpu_test::upload_activation(small, d, t, l);
  DeviceTensor all(small.size() * size_t(repeats), t, "lab tensor " + std::to_string(d.c) + "x" + std::to_string(d.h) +
                                                       "x" + std::to_string(d.w));
  const size_t total = all.count() * dtype_size(t);
  char* dst = static_cast<char*>(all.get());
  size_t done = std::min(total, one.count() * dtype_size(t));
  CUDA_CHECK(cudaMemcpy(dst, one.get(), done, cudaMemcpyDeviceToDevice));
  while (done < total) {  // doubling copies: log2(repeats) of them
    const size_t n = std::min(done, total - done);
    CUDA_CHECK(cudaMemcpy(dst + done, dst, n, cudaMemcpyDeviceToDevice));
    done += n;
  }
  return all;
}

LabCheck check_activation(const std::string& output, const DeviceTensor& got, const Vec& want, const ref::Dims& d,
                          Layout l, double bound) {
  const Vec w = gpu_test::to_layout(l, d, want);
  const std::vector<uint8_t> raw = got.bytes();
  if (w.empty() || got.count() % w.size() != 0)
    throw Fatal("kernel lab: " + output + " has " + std::to_string(got.count()) + " elements, not a multiple of " +
                std::to_string(w.size()));
  double num = 0, den = 0;
  for (size_t i = 0; i < got.count(); ++i) {
    const double g = element(raw, i, got.dtype()), r = w[i % w.size()];
    if (!std::isfinite(g)) return {output, std::numeric_limits<double>::quiet_NaN(), bound};
    num += (g - r) * (g - r);
    den += r * r;
  }
  const double err = den > 0 ? std::sqrt(num / den) : num == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  return {output, err, bound};
}

LabCheck check_vector(const std::string& output, const DeviceTensor& got, const Vec& want, double bound, double scale) {
  Vec w = want;
  for (double& v : w) v *= scale;
  return {output, ref::rel_error(got.download(), w), bound};
}

}  // namespace lab
