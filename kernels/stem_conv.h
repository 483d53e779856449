// The stem's conv by kernels of ours (kernels/stem_conv.cu): a conv whose taps per output channel
// (C x R x R) are at most 32, stride 1, 'same' padding, fp16 NHWC, fp32 sums. Its forward with the
// BN statistics of its output, and its filter gradient.
//
// Why: the stem is cuDNN's worst shape. Its 3 input channels make a product of 27 taps per pixel:
// at batch 128 on an H200 cuDNN's forward took 24 µs (an sm80 kernel for odd channel counts) and a
// statistics pass 6 µs more; its filter gradient padded the input and the gradient to 8 channels
// (two kernels), zeroed its split-K buffers (two fills), ran a split-K implicit GEMM and reduced it,
// about 40 µs, the step's last kernels before the optimizer with nothing beside them. Here each warp
// gathers 16 pixels' taps into shared memory and multiplies them on the tensor cores (WMMA, fp32
// sums): with the filter for the output, with the output's gradient for the filter's.
#pragma once

#include <cstddef>
#include <string>

#include <cuda_runtime.h>

// Why the kernels cannot take this conv ("" where they can): stride 1 with 'same' padding
// ((r - 1) / 2, r odd), c * r * r <= 32 taps, k a multiple of 16 up to 64. The launchers also throw
// on a batch of 2^31 - 16 pixels or more, and on unaligned tensors.
std::string stem_conv_refusal(int c, int k, int r, int stride, int pad);

struct StemShape {
  int n, h, w, c, k, r;  // input n x h x w x c, k filters r x r; the output n x h x w x k
};

// y = conv(x, w), fp16 NHWC; with `partials`, each CTA's sums of y and of y^2 per channel, as
// bn_finalize_partials reads them (kernels/batchnorm.h: rows of k floats, the sums of y first, then
// as many rows of y^2), of the fp16 values y holds. Returns the rows (CTAs).
struct StemForward {
  const void* x;    // fp16 NHWC [n, h, w, c]
  const void* w;    // fp16 KRSC [k, r, r, c]
  void* y;          // fp16 NHWC [n, h, w, k]: written
  float* partials;  // stem_conv_partials_bytes(); nullptr: no statistics (evaluation)
  StemShape s;
};
int stem_conv_forward(const StemForward& a, cudaStream_t stream);

// dw = the filter gradient of y = conv(x, w) given dy, fp16 KRSC, written; each CTA's sums added in
// a fixed order by a second kernel (the same bits every run).
struct StemWgrad {
  const void* x;    // fp16 NHWC [n, h, w, c]: the conv's input
  const void* dy;   // fp16 NHWC [n, h, w, k]: the gradient of its output, or with coef, the BN's dz
  void* dw;         // fp16 KRSC [k, r, r, c]: written
  float* partials;  // stem_conv_partials_bytes()
  StemShape s;
  // With coef, the BN after the conv's backward apply is taken as the gradient is read, in place of
  // bn_backward_apply's pass (kernels/batchnorm.h): the gradient of the conv's output is
  // coef[c] dz + coef[k + c] bn_x + coef[2k + c] (the BN's bwd_coef, 3k floats), rounded to fp16.
  const void* bn_x = nullptr;  // fp16 NHWC [n, h, w, k]: the BN's input, the conv's output
  const float* coef = nullptr;
};
void stem_wgrad(const StemWgrad& a, cudaStream_t stream);

// The partial sums' buffer of either kernel, for the most CTAs it launches.
size_t stem_conv_partials_bytes(const StemShape& s);
