// Is there a GPU to run on, and can this build run on it? Asked before anything else touches CUDA.
// And timing on it (fastest_ms).
//
// TRAINER_SASS_ARCHS and TRAINER_PTX_ARCHS are the architectures the Makefile compiled kernels/ for
// (it passes them to this file alone, and rebuilds it and the kernels when they change).
#include "core/device.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "core/check.h"
#include "core/handles.h"

#ifndef TRAINER_SASS_ARCHS
#error "TRAINER_SASS_ARCHS (the compute capabilities kernels/ is built for) must come from the Makefile"
#endif
#ifndef TRAINER_PTX_ARCHS
#error "TRAINER_PTX_ARCHS must come from the Makefile"
#endif

namespace {

std::string arch_text(int a) { return std::to_string(a / 10) + "." + std::to_string(a % 10); }

bool nvidia_driver_installed() {
  if (access("/proc/driver/nvidia/version", F_OK) == 0) return true;
  void* lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (lib) dlclose(lib);
  return lib != nullptr;
}

}  // namespace

std::string no_device_message(const std::string& cuda_error, bool driver_error, bool driver_found,
                              const std::optional<std::string>& visible_devices) {
  const std::string said = cuda_error.empty() ? "" : " (" + cuda_error + ")";
  if (!driver_found)  // CUDA then says "driver version is insufficient", which is not the problem
    return "no CUDA device: no NVIDIA driver or GPU was found on this machine; this program needs an NVIDIA GPU. "
           "On a machine without one, `make test` builds everything and runs the CPU tests";
  if (driver_error)
    return "no CUDA device: the NVIDIA driver cannot serve this CUDA runtime" + said +
           "; update the driver to one that supports CUDA " + std::to_string(CUDART_VERSION / 1000) + "." +
           std::to_string(CUDART_VERSION % 1000 / 10);
  if (visible_devices)
    return "no CUDA device visible" + said + ": CUDA_VISIBLE_DEVICES='" + *visible_devices +
           "' leaves no GPU visible; unset it or name a GPU that exists";
  return "no CUDA device found" + said + "; this program needs an NVIDIA GPU with a working driver";
}

std::vector<int> parse_arch_list(const std::string& list) {
  std::vector<int> archs;
  size_t i = 0;
  while (i < list.size()) {
    const size_t end = list.find_first_of(" ,", i);
    const std::string item = list.substr(i, end == std::string::npos ? std::string::npos : end - i);
    if (!item.empty()) archs.push_back(std::atoi(item.c_str()));
    if (end == std::string::npos) break;
    i = end + 1;
  }
  return archs;
}

std::optional<std::string> arch_mismatch(int cc, const std::string& gpu_name, const std::vector<int>& sass,
                                         const std::vector<int>& ptx) {
  for (int a : sass)
    if (a / 10 == cc / 10 && a % 10 <= cc % 10) return std::nullopt;
  for (int a : ptx)
    if (a <= cc) return std::nullopt;
  std::string built;
  for (int a : sass) built += (built.empty() ? "sm_" : ", sm_") + std::to_string(a);
  for (int a : ptx) built += (built.empty() ? "PTX compute_" : " and PTX compute_") + std::to_string(a);
  return "the GPU " + gpu_name + " has compute capability " + arch_text(cc) + ", but this build holds code for " +
         built + " only; rebuild for it: make clean && make CUDA_ARCH=" + std::to_string(cc) +
         (cc < 80 ? " (the trainer is written for compute capability 8.0, Ampere, and later)" : "");
}

bool cuda_device_available() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) cudaGetLastError();
  return err == cudaSuccess && n > 0;
}

int current_device_sms() {
  int device = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

void require_cuda_device() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n == 0) {
    cudaGetLastError();
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    const std::string said = err == cudaSuccess ? "" : std::string("cudaGetDeviceCount: ") + cudaGetErrorString(err);
    throw InputError(no_device_message(said, err == cudaErrorInsufficientDriver, nvidia_driver_installed(),
                                       visible ? std::optional<std::string>(visible) : std::nullopt));
  }
  // Device 0 is the one every program uses: decided from the build's architecture list, before any
  // kernel is launched.
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  if (const std::optional<std::string> why = arch_mismatch(prop.major * 10 + prop.minor, prop.name,
                                                           parse_arch_list(TRAINER_SASS_ARCHS),
                                                           parse_arch_list(TRAINER_PTX_ARCHS)))
    throw InputError(*why);
}

float fastest_ms(cudaStream_t stream, int runs, const std::function<void()>& f) {
  Event start, stop;
  f();
  float best = -1;
  for (int i = 0; i < runs; ++i) {
    start.record(stream);
    f();
    stop.record(stream);
    CUDA_CHECK(cudaEventSynchronize(stop.get()));
    const float t = stop.ms_since(start);
    best = best < 0 ? t : std::min(best, t);
  }
  return best;
}
