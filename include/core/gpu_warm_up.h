// The CUDA context, made on a thread of its own while the start-up reads the data set. The driver
// takes 0.3-0.7 s to make a context on an H100 host (measured 2026-11-27), as long as reading
// Fashion-MNIST: side by side, the GPU is ready when the data is. Time to a trained model counts the
// start-up, and on several GPUs it is what keeps the time from halving.
#pragma once

#include <thread>

class GpuWarmUp {
 public:
  // local_rank picks the device as device_for_local_rank() will (dist/data_parallel.h): the only
  // device shown, else the rank's own.
  explicit GpuWarmUp(int local_rank);
  ~GpuWarmUp() { wait(); }
  GpuWarmUp(const GpuWarmUp&) = delete;
  GpuWarmUp& operator=(const GpuWarmUp&) = delete;

  // Until the context is made (or found impossible). Errors are not reported here: the checks that
  // follow (require_cuda_device) say them in their one line.
  void wait();

 private:
  std::thread thread_;
};
