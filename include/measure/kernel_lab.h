// The bookkeeping of bin/kernel_lab (docs/kernel-lab.md; the versions themselves are in bench/kernel_lab/):
// its command line, the network's tensor and conv shapes it measures at, timing one version with the
// L2 cache flushed before every run, and the rows it reports (a table for people, JSON lines for
// bench/results). Everything here but the timing runs without a GPU, and is tested so.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "core/flags.h"
#include "core/memory.h"
#include "model/conv.h"

// ---- shapes ----------------------------------------------------------------------------------------
// A tensor's channels and sides; the batch is the lab's (--batch).
struct ChwShape {
  int c = 0, h = 0, w = 0;
  bool operator==(const ChwShape&) const = default;
  std::string text() const;  // "64x32x32"
};

// The role a conv has in its bottleneck block, which decides the fused pattern of its forward and
// whether the BN before it is fused into its backward (src/model/training_network.cpp).
enum class ConvRole { Reduce, Spatial, Expand, Shortcut };  // conv1, conv2 (3x3), conv3, downsample.0
const char* conv_role_name(ConvRole r);

// One distinct conv of the network (role and geometry), with the layers that have it.
struct LabConv {
  ConvRole role;
  ConvGeometry g;
  std::string layers;  // "layer2.0.conv2", "layer1.1-2.conv1" (blocks 1 to 2 of stage 1)
  std::string text() const;  // "3x3/2 128x128x32x32 -> 128x128x16x16 (layer2.0.conv2)"
};

// The bottleneck blocks' distinct convs at batch n, in network order, as model/resnet50_spec.h
// describes them (stages [3, 4, 6, 3] of widths 64-512, x4 expansion, stride 2 on the first 3x3 of
// stages 2-4, a projection where the shape changes).
std::vector<LabConv> network_convs(int n);
// Every tensor a batch norm of the network normalizes (its stem's and its blocks'), and the block
// outputs (where the residual joins are).
std::vector<ChwShape> network_bn_shapes();
std::vector<ChwShape> network_join_shapes();
// What the lab measures without --shapes: the BN tensors of the blocks repeated in every stage.
std::vector<ChwShape> default_lab_shapes();

// ---- options --------------------------------------------------------------------------------------
struct LabFormat {
  DType t;
  Layout l;
  bool operator==(const LabFormat&) const = default;
  std::string text() const;  // "fp16 NHWC"
};

struct LabOptions {
  int batch = 128;
  int check_batch = 2;            // images the CPU reference computes; the timed batch repeats them
  int runs = 20;
  std::vector<ChwShape> shapes = default_lab_shapes();
  std::string shapes_flag;        // --shapes as given, read into `shapes` once --batch is known
  std::vector<std::string> only;  // operations or their prefixes; empty: all
  // The formats the batch-norm operations run in: the ones the ladder uses (convs are fp16 NHWC).
  std::vector<LabFormat> formats = {{DType::F16, Layout::NHWC}, {DType::F16, Layout::NCHW},
                                    {DType::F32, Layout::NCHW}};
  bool autotune = false;          // measure cuDNN's candidate plans (as autotuning builds do)
  bool check = true;
  long flush_mb = 256;
  // Each version timed as a CUDA graph of its run, cuDNN's memsets as the training step's graph has
  // them (those of sums the finalize leaves zero dropped, the rest as kernels; core/graph_memsets.h).
  bool as_graph = false;
  long workspace_mb = 1024;
  std::string json;               // JSON lines written here
  bool help = false;
};

// The operations, in the order they are measured (--only picks among them).
const std::vector<std::string>& lab_operations();
bool operation_selected(const LabOptions& o, const std::string& op);
// Whether a conv is measured: it reads or writes one of the chosen shapes.
bool conv_selected(const LabOptions& o, const LabConv& c);

// UsageError (exit 2) for an unknown flag, a bad value, a shape that is not one of the network's,
// or a batch that is not a multiple of --check-batch.
LabOptions parse_lab_options(int argc, const char* const* argv);
std::string lab_usage_text();

// ---- results --------------------------------------------------------------------------------------
// One output of a version against the CPU reference: ||gpu - ref|| / ||ref||, and its bound.
struct LabCheck {
  std::string output;
  double error;
  double bound;
};

struct LabRow {
  std::string op, version, shape, format;
  std::string note;                  // what cuDNN chose, e.g. "fp16 scale/bias"
  std::string refused;               // cuDNN refused the version: why (no time)
  std::string error;                 // the version failed: the exception's message
  std::vector<LabCheck> checks;      // empty: not checked (--no-check)
  std::vector<float> ms;             // every timed run
  size_t bytes = 0;                  // that the operation must move; 0: not memory-bound (no GB/s)
};

float median_of(std::vector<float> v);
double gb_per_s(size_t bytes, double ms);
// Every output within its bound (true when nothing was checked).
bool checks_passed(const std::vector<LabCheck>& c);
// "ok 3.1e-04", "FAIL dx 2.3e-02 > 1e-02", or "-" when not checked: the worst output relative to its bound.
std::string check_text(const std::vector<LabCheck>& c);
// A row counts as failed when it errored or a check failed (a refusal is not a failure).
bool row_failed(const LabRow& r);

// The plain table: a header (two lines), then one line per row, columns padded to fixed widths.
std::string lab_table_header();
std::string lab_table_line(const LabRow& r);
// The JSON line of a row ("event":"row").
std::string lab_json_row(const LabRow& r);
// The last line of the table and of the JSON lines: how many rows were ok, refused, failed;
// the run's seconds, of which building cuDNN plans took plan_s.
std::string lab_summary(const std::vector<LabRow>& rows, double seconds, double plan_s);
std::string lab_json_end(const std::vector<LabRow>& rows, double seconds, double plan_s);

// ---- timing ---------------------------------------------------------------------------------------
// Milliseconds of each of `runs` runs of f() on `stream`, each between two events recorded after a
// cudaMemsetAsync of `flush` (larger than the L2 cache) on the same stream: every run starts with
// nothing of its data in L2, as in a training step, where the tensors between two uses of one are
// far larger than L2. The caller has run f() once before (to load its kernels).
std::vector<float> time_with_cold_l2(cudaStream_t stream, const DeviceBuffer& flush, int runs,
                                     const std::function<void()>& f);
