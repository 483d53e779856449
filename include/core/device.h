// Can this machine's GPU run this build? The decisions behind require_cuda_device() (handles.h), as
// functions of what CUDA and the machine report, so that they are tested without a GPU.
#pragma once

#include <optional>
#include <string>
#include <vector>

// Why no CUDA device can be used, in one line that starts "no CUDA device": `cuda_error` is what
// cudaGetDeviceCount said ("" when it succeeded and found none), `driver_error` whether it said the
// driver is insufficient, `driver_found` whether the NVIDIA driver is installed (/proc/driver/nvidia
// or libcuda), `visible_devices` $CUDA_VISIBLE_DEVICES where it is set.
std::string no_device_message(const std::string& cuda_error, bool driver_error, bool driver_found,
                              const std::optional<std::string>& visible_devices);

// Compute capabilities as the Makefile passes them: "80 86 89 90" -> {80, 86, 89, 90}.
std::vector<int> parse_arch_list(const std::string& list);

// nullopt when a GPU of compute capability `cc` (major * 10 + minor: 86) can run kernels built as
// cubins for `sass` (a cubin runs on its own major version, same or higher minor) or as PTX for
// `ptx` (compiled by the driver for that or any later GPU); else the one-line reason, naming the
// compute capability and the make line that builds for it.
std::optional<std::string> arch_mismatch(int cc, const std::string& gpu_name, const std::vector<int>& sass,
                                         const std::vector<int>& ptx);
