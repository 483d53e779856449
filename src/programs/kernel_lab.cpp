// bin/kernel_lab: every version of the batch-norm and fused-conv operations side by side at the
// network's shapes, each checked against the CPU reference in double and timed with the L2 cache
// flushed (docs/kernel-lab.md; the versions are in bench/kernel_lab/, the bookkeeping in
// measure/kernel_lab.h). Prints one table per operation as it goes; --json FILE also writes every
// row as a JSON line.
// Exit status: 0 when every version that ran passed its check, 1 when one failed or errored (or
// anything else went wrong), 2 for a bad command line or no GPU.
#include <chrono>
#include <cstdio>
#include <string>

#include "core/elapsed.h"
#include "core/errors.h"
#include "core/file_io.h"
#include "core/handles.h"
#include "kernel_lab/lab.h"
#include "measure/kernel_lab.h"

namespace {

std::string command_line(int argc, char** argv) {
  std::string s = "bin/kernel_lab";
  for (int i = 1; i < argc; ++i) s += std::string(" ") + argv[i];
  return s;
}

void write_text(const std::string& path, const std::string& text) { write_file_atomic(path, text.data(), text.size()); }

}  // namespace

int main(int argc, char** argv) {
  LabOptions opt;
  try {
    opt = parse_lab_options(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  if (opt.help) {
    std::printf("%s", lab_usage_text().c_str());
    return 0;
  }
  try {  // an existing --json file is never touched before the run has rows for it
    if (!opt.json.empty()) check_output_path(opt.json, "--json");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  if (!cuda_device_available()) {
    std::fprintf(stderr, "error: bin/kernel_lab times GPU kernels and needs a CUDA GPU; none was found\n");
    return 2;
  }
  try {
    const auto t0 = std::chrono::steady_clock::now();
    lab::Lab lab(opt);
    const std::string start = lab.json_start(command_line(argc, argv)) + "\n";
    std::printf("%s", lab.header().c_str());
    lab::measure_bn_operations(lab);
    lab::measure_join_operations(lab);
    lab::measure_conv_operations(lab);

    const double seconds = seconds_since(t0);
    std::printf("\n%s", lab_summary(lab.rows(), seconds, lab.plan_seconds()).c_str());
    bool failed = false;
    std::string lines = start;
    for (const LabRow& r : lab.rows()) {
      lines += lab_json_row(r) + "\n";
      failed |= row_failed(r);
    }
    if (!opt.json.empty()) {
      write_text(opt.json, lines + lab_json_end(lab.rows(), seconds, lab.plan_seconds()) + "\n");
      std::printf("kernel lab: rows written to %s\n", opt.json.c_str());
    }
    return failed ? 1 : 0;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
