// The conv-algorithm cache: measured cuDNN choices, in memory and in a text file.
//
// Entries are grouped under a context line naming everything a choice depends on besides the shape
// (GPU, cuDNN version, precision, layout, TF32, cuDNN API, workspace limit), so one file can serve
// several binaries and GPUs. A corrupt file, or one of an older format, is ignored with a warning
// (and rewritten on save); a file without entries for this context is used for nothing but kept for
// the others.
//
//   resnet-trainer autotune cache v2
//   [gpu=NVIDIA H100 80GB HBM3;cudnn=91400;precision=fp16;layout=NHWC;tf32=1;api=graph;workspace_mb=1024]
//   n128.c64.h32.w32.k64.r3.s1.p1 fwd=eng62_k2=4_k25=1/0/0/0.0322 bwd_data=eng67_k2=4/0/0/0.0316 bwd_filter=...
//   fused.conv-bn-relu.n256.c64.h32.w32.k64.r3.s1.p1 plan=eng31_k2=1/1/0/0.0541 unfused=0.0612
//
// A conv's line holds each direction's choice (AlgoChoice: algorithm/math/workspace bytes/measured
// ms); a fused batch-norm pattern's line, keyed by the pattern and the conv's shape, its plan
// (FusedChoice: engine/types/workspace bytes/measured ms) and the time it was weighed against.
#pragma once

#include <chrono>
#include <cstdio>
#include <istream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/late_notice.h"
#include "core/types.h"

struct AlgoChoice {
  // The legacy API's algorithm number, or with the graph API (context "api=graph") cudnn-frontend's
  // engine tag, the engine and its knobs, which a later start builds alone (model/cudnn/plan_picker.h).
  std::string algo;      // empty: none chosen
  int math = 0;          // the legacy API's cudnnMathType_t; 0 for a graph-API engine, whose tag fixes it
  size_t workspace = 0;  // bytes
  float ms = -1;         // measured time; -1 when it came from the heuristics
  bool operator==(const AlgoChoice&) const = default;
};

struct ConvAlgos {
  AlgoChoice fwd, bwd_data, bwd_filter;
  bool operator==(const ConvAlgos&) const = default;
  // By direction: forward, backward-data, backward-filter (ConvLayer::Op).
  AlgoChoice& operator[](int op) { return op == 0 ? fwd : op == 1 ? bwd_data : bwd_filter; }
  const AlgoChoice& operator[](int op) const { return op == 0 ? fwd : op == 1 ? bwd_data : bwd_filter; }
};

struct FusedChoice {
  std::string engine;    // cuDNN's engine tag, or "lt<index>" for a cuBLASLt GEMM; empty: none
  int types = 0;         // which of the pattern's scale/bias and intermediate type pairs (FusedConv)
  size_t workspace = 0;  // bytes
  float ms = -1;         // measured time of one run
  // The plain conv with the BN passes fusing saves, as measured then, so that a later start makes the
  // same choice (model/fusion_planner.h); -1: not kept.
  float unfused_ms = -1;
  bool operator==(const FusedChoice&) const = default;
};

// One context's entries: the convs' choices by shape key, the fused patterns' by pattern and shape.
struct ContextEntries {
  std::map<std::string, ConvAlgos> convs;
  std::map<std::string, FusedChoice> fused;
  bool empty() const { return convs.empty() && fused.empty(); }
  bool operator==(const ContextEntries&) const = default;
};

// The whole file: context -> its entries.
using AutotuneEntries = std::map<std::string, ContextEntries>;

// The number a choice's algorithm gives after `prefix`: a legacy algorithm's ("3"), a cuBLASLt GEMM's
// index with prefix "lt" ("lt3"); -1 where it gives none (an engine tag, a corrupt entry).
int algorithm_number(const std::string& algo, const std::string& prefix = "");

// Parses the text of a cache file; any malformed line is an InputError naming `file` and the line.
AutotuneEntries parse_autotune_cache(const std::string& text, const std::string& file);
std::string format_autotune_cache(const AutotuneEntries& entries);

// Everything a measured choice depends on besides the shape; key() is the file's context line.
struct AutotuneContext {
  std::string gpu;
  size_t cudnn_version = 0;
  DType precision = DType::F32;
  Layout layout = Layout::NCHW;
  bool tf32 = true;
  ConvApi api = ConvApi::Legacy;
  long workspace_mb = 0;
  std::string key() const;
};

class AutotuneCache {
 public:
  AutotuneCache(std::string path, const AutotuneContext& context) : AutotuneCache(std::move(path), context.key()) {}
  // Any context string (tests, and callers that measure nothing).
  AutotuneCache(std::string path, std::string context) : path_(std::move(path)), context_(std::move(context)) {}
  // Reads the file if it exists; returns warnings for the user (corrupt file, no entries here).
  std::vector<std::string> load();
  const ConvAlgos* find(const std::string& shape) const;
  void put(const std::string& shape, const ConvAlgos& algos);
  // A fused pattern's plan; `key` is fused_cache_key()'s (model/fused_conv.h).
  const FusedChoice* find_fused(const std::string& key) const;
  void put_fused(const std::string& key, const FusedChoice& choice);
  void erase_fused(const std::string& key);  // a plan that no longer plans, so later starts skip it
  // Whether a put since the load changed an entry: what a caller saves for.
  bool changed() const { return changed_; }
  // Writes the file atomically, keeping other contexts' entries. No-op with an empty path.
  void save() const;
  size_t entries_here() const;
  const std::string& context() const { return context_; }
  // What the programs print when measuring runs long: shapes and fused patterns missing here are
  // being measured, and saved unless the program said why not (left_unsaved).
  std::string still_measuring_line() const;
  // The program will not save what it measures, for this reason (measured_under_tool's).
  void left_unsaved(std::string why) { unsaved_ = std::move(why); }
  // Where a CUDA tool is injected (injected_cuda_tool), leaves the cache unsaved for that reason;
  // whether one is. The programs call it once CUDA is initialised, before measuring.
  bool leave_unsaved_under_tool();
  // The programs' warning where they measured and did not save: the file and why.
  std::string unsaved_line() const { return "the conv choices are not saved to " + path_ + ": " + unsaved_; }
  // A first start measures every conv and fused pattern, a minute or more with nothing printed. Armed,
  // the first lookup that misses (a search follows it) starts a LateNotice (core/late_notice.h) that
  // prints still_measuring_line() to `out` if it is still going `delay` later; a network found whole
  // in the cache prints nothing however long it takes to build. end_late_notice() (or the
  // destructor) ends it: the programs arm it around building their network.
  void arm_late_notice(std::chrono::milliseconds delay, FILE* out = stdout);
  void end_late_notice();

 private:
  void missed() const;  // a lookup found nothing: starts the armed notice

  std::string path_, context_;
  std::string unsaved_;  // why the program will not save, or ""
  AutotuneEntries all_;
  bool changed_ = false;
  std::optional<std::chrono::milliseconds> notice_delay_;  // armed
  FILE* notice_out_ = stdout;
  mutable std::unique_ptr<LateNotice> notice_;  // started by a lookup (const) that misses
};

// The CUDA tool injected into this process, "" where none is. A tool's overhead on each launch skews
// what autotuning times: on an H200 at batch 256 a cache filled under ncu ran 8.0% slower than one
// filled without a tool, one filled under nsys 0.6% (2026-12-03). So the programs measure under a
// tool without saving. Nsight Systems sets $CUDA_INJECTION64_PATH in the process; Nsight Compute and
// compute-sanitizer do not, but map their libraries into it (libInterceptorInjectionTarget.so,
// libsanitizer-*.so). Call it after CUDA is initialised: tools load when it is.
std::string injected_cuda_tool();
// The same from given inputs: $CUDA_INJECTION64_PATH's value (null where unset) and the lines of
// /proc/self/maps; a tool is that value where set, else the first mapped file whose name holds
// "injection" or "sanitizer" (any case).
std::string injected_tool_in(const char* injection_path, std::istream& maps);
// Why a cache measured under `tool` is not saved, for the programs' conv line and warning.
std::string measured_under_tool(const std::string& tool);
