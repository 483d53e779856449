// The pinned loader's GPU half of augmentation: uint8 pixels to normalized activations.
//
// The host sends uint8 (a quarter of the bytes of fp32); this kernel applies (x/255 - mean)/std in
// the activation type and layout, replicating a grey channel to the model's three.
#include "normalize.h"
#include "common.cuh"

namespace trainer_kernels {  // why: kernels/common.cuh
namespace {

constexpr int kThreads = 256;

template <class T, Layout L>
__global__ void normalize_kernel(const uint8_t* in, int n, int in_channels, int side, NormalizeParams p, T* out) {
  const size_t plane = size_t(side) * side, total = size_t(n) * 3 * plane;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total; i += size_t(gridDim.x) * blockDim.x) {
    // i indexes the output in its own layout
    size_t img, pix;
    int c;
    if (L == Layout::NCHW) {
      img = i / (3 * plane);
      c = static_cast<int>((i / plane) % 3);
      pix = i % plane;
    } else {
      img = i / (3 * plane);
      c = static_cast<int>(i % 3);
      pix = (i / 3) % plane;
    }
    const int sc = in_channels == 1 ? 0 : c;
    const size_t src = L == Layout::NCHW ? (img * in_channels + sc) * plane + pix
                                         : (img * plane + pix) * in_channels + sc;
    out[i] = from_float<T>(in[src] * p.scale[c] + p.shift[c]);
  }
}

}  // namespace
}  // namespace trainer_kernels
using namespace trainer_kernels;

void normalize_u8(const uint8_t* in, int n, int in_channels, int side, Layout l, const NormalizeParams& p,
                  void* out, DType t, cudaStream_t stream) {
  const size_t work = size_t(n) * 3 * side * side;
  dispatch_dtype(t, [&]<class T>() {
    T* y = static_cast<T*>(out);
    if (l == Layout::NCHW)
      launch_one_wave<normalize_kernel<T, Layout::NCHW>, kThreads>(work, stream, in, n, in_channels, side, p, y);
    else
      launch_one_wave<normalize_kernel<T, Layout::NHWC>, kThreads>(work, stream, in, n, in_channels, side, p, y);
  });
  CUDA_CHECK_LAUNCH();
}
