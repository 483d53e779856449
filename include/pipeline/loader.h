// Loaders: how a batch gets from the data set in host memory to normalized activations on the GPU.
//
// The training loop calls get(k) inside the "get batch" range and copy(k) inside "copy batch":
//   Synchronous (the baseline): get() decodes (image folders), crops, flips and normalizes on the
//     calling thread into pageable memory; copy() is a blocking cudaMemcpy.
// A file that does not decode is an ImageDecodeError out of get(), on the calling thread, whichever
// thread decoded it.
//   PinnedRing: worker threads crop and flip uint8 images into three pinned buffers (batch_ring.h),
//     decoding them first when the data set is decoded on demand (an image folder);
//     get() waits for batch k only if the workers are behind; copy() starts a cudaMemcpyAsync on a
//     copy stream and has the compute stream wait for it with an event, then normalizes on the GPU.
#pragma once

#include <cstdint>
#include <memory>

#include <cuda_runtime.h>

#include "data/augment.h"
#include "data/dataset.h"
#include "core/types.h"

struct DeviceBatch {
  const void* images;      // batch x 3 x side x side normalized, in the loader's type and layout
  const int32_t* labels;   // batch, -1 for padding
};

class BatchLoader {
 public:
  virtual ~BatchLoader() = default;
  // Starts a pass over `data` following `plan` from its batch `first` (0, or where a resumed run
  // stopped inside the epoch); both must outlive the pass.
  virtual void begin_pass(const Dataset& data, const EpochPlan& plan, int first) = 0;
  virtual void get(int k) = 0;
  // The returned buffers hold batch k for all work enqueued on the compute stream from now until the
  // next copy() call.
  virtual DeviceBatch copy(int k) = 0;
};

struct LoaderConfig {
  LoaderKind kind;
  int batch;
  int workers;
  DType dtype;
  Layout layout;
  Normalization norm;
  int channels;            // stored channels of the data (1 or 3)
  int side;                // images are side x side
  cudaStream_t compute;    // must be a blocking stream (the synchronous copy relies on it)
};

std::unique_ptr<BatchLoader> make_loader(const LoaderConfig& cfg);
