// The stem's filter gradient by a kernel of ours (kernels/stem_wgrad.cu): a conv whose taps per
// output channel (C x R x R) are at most 32, stride 1, 'same' padding, fp16 NHWC, fp32 sums.
//
// Why: the stem's weight gradient is the step's last kernel before the optimizer, with nothing
// beside it. cuDNN pads the 3-channel input to 8 and the gradient (two padding kernels), zeroes its
// split-K buffers (two fills), runs a split-K implicit GEMM and reduces it: about 40 µs on an H200
// at batch 128 for a product of 64 x 27 outputs over 131,072 pixels. Here each CTA sums its pixels'
// products on the tensor cores (taps x channels, 16 pixels at a time) and writes its partial sums;
// a second kernel adds the CTAs' partial sums in a fixed order (the same bits every run) and writes
// the fp16 gradient.
#pragma once

#include <cstddef>
#include <string>

#include <cuda_runtime.h>

struct StemWgrad {
  const void* x;    // fp16 NHWC [n, h, w, c]: the conv's input
  const void* dy;   // fp16 NHWC [n, h, w, k]: the gradient of its output (stride 1: the same h, w)
  void* dw;         // fp16 KRSC [k, r, r, c]: written
  float* partials;  // stem_wgrad_partials_bytes(k, c, r)
  int n, h, w, c, k, r;
};

// Why the kernel cannot take this conv ("" where it can): it takes stride 1 with 'same' padding
// ((r - 1) / 2, r odd), c * r * r <= 32 taps, k a multiple of 16 up to 64.
std::string stem_wgrad_refusal(int c, int k, int r, int stride, int pad);
// The partial sums' buffer: one row of taps x k floats per CTA, for the most CTAs it launches.
size_t stem_wgrad_partials_bytes(int k, int c, int r);
void stem_wgrad(const StemWgrad& a, cudaStream_t stream);
