// The switchboard: the one place where the optimization defines are read.
//
// Each optimization of the ladder is a build-time define, 0 or 1 (the Makefile passes them; with
// none given, everything is on). This header turns them into one constexpr BuildSettings (train/build.h).
// Only the programs' mains (src/programs/) include it: they hand kBuild to the code they run, so
// that code is compiled once, and the layers see precision and layout through their descriptors.
//
//   OPT_DEVICE_LOSS  loss/accuracy stay on the GPU; the host reads them asynchronously, rarely
//   OPT_PINNED       triple-buffered pinned loader with worker threads and a copy stream
//   OPT_AUTOTUNE     cuDNN algorithms measured with cudnnFind*Ex and cached in a file
//   OPT_FP16         fp16 activations and conv/linear weights, fp32 master weights, loss scaling
//   OPT_NHWC         channels-last activations and filters
//   OPT_CONV_GRAPH   convs through cuDNN's graph API with execution plans built once (past the
//                    seed ladder: removes the host time of the legacy cudnnConvolution* calls)
//   OPT_FUSED_BN     batch norm fused into the convolutions: statistics from the conv that writes a
//                    tensor, scale/bias + ReLU applied while the next conv reads it (fp16, NHWC)
//   OPT_CUDA_GRAPH   forward, loss, backward and optimizer step captured once as a CUDA graph and
//                    replayed every step
//   OPT_WGRAD_STREAM each conv's weight gradient on a second stream, beside its data gradient (both
//                    read the same output gradient): two branches of the step's graph, which fill
//                    the GPU where one small conv alone does not
//
// bin/predict's egress ladder (seed 001's GPU-to-CPU case study), cumulative in this order, read
// into kEgress (pipeline/egress.h); src/programs/predict.cpp hands it to the predictor:
//   OPT_EGRESS_WORKERS  outputs processed (formatted and written) by worker threads, not the main thread
//   OPT_EGRESS_POOL     pre-allocated pinned output buffers instead of a new pageable one every batch
//   OPT_EGRESS_ASYNC    cudaMemcpyAsync with a CUDA event per buffer; the host keeps queuing compute
//   OPT_EGRESS_STREAM   the copies on their own stream, overlapping the next batch's compute
//   OPT_DDP_OVERLAP  several GPUs: each gradient bucket is all-reduced as soon as backward has
//                    produced it, on a communication stream; 0 = one all-reduce after the whole
//                    backward (bin/train-ddp-naive, the seed's single bucket). Not a rung.
#pragma once

#include "pipeline/egress.h"
#include "train/build.h"

#ifndef OPT_DEVICE_LOSS
#define OPT_DEVICE_LOSS 1
#endif
#ifndef OPT_PINNED
#define OPT_PINNED 1
#endif
#ifndef OPT_AUTOTUNE
#define OPT_AUTOTUNE 1
#endif
#ifndef OPT_FP16
#define OPT_FP16 1
#endif
#ifndef OPT_NHWC
#define OPT_NHWC 1
#endif
#ifndef OPT_CONV_GRAPH
#define OPT_CONV_GRAPH 1
#endif
#ifndef OPT_FUSED_BN
#define OPT_FUSED_BN 1
#endif
#ifndef OPT_CUDA_GRAPH
#define OPT_CUDA_GRAPH 1
#endif
#ifndef OPT_EGRESS_WORKERS
#define OPT_EGRESS_WORKERS 1
#endif
#ifndef OPT_EGRESS_POOL
#define OPT_EGRESS_POOL 1
#endif
#ifndef OPT_EGRESS_ASYNC
#define OPT_EGRESS_ASYNC 1
#endif
#ifndef OPT_EGRESS_STREAM
#define OPT_EGRESS_STREAM 1
#endif
#ifndef OPT_WGRAD_STREAM
#define OPT_WGRAD_STREAM 1
#endif
#ifndef OPT_DDP_OVERLAP
#define OPT_DDP_OVERLAP 1
#endif
#ifndef VARIANT_NAME
#define VARIANT_NAME "train"
#endif

inline constexpr BuildSettings kBuild{
    OPT_DEVICE_LOSS != 0,
    OPT_PINNED ? LoaderKind::PinnedRing : LoaderKind::Synchronous,
    OPT_AUTOTUNE ? AlgoPolicy::Autotune : AlgoPolicy::Heuristic,
    OPT_FP16 ? DType::F16 : DType::F32,
    OPT_NHWC ? Layout::NHWC : Layout::NCHW,
    OPT_CONV_GRAPH ? ConvApi::Graph : ConvApi::Legacy,
    OPT_FUSED_BN != 0,
    OPT_CUDA_GRAPH != 0,
    VARIANT_NAME,
    OPT_DDP_OVERLAP != 0,
    OPT_WGRAD_STREAM != 0,
};

inline constexpr EgressSettings kEgress{
    OPT_EGRESS_WORKERS != 0,
    OPT_EGRESS_POOL != 0,
    OPT_EGRESS_ASYNC != 0,
    OPT_EGRESS_STREAM != 0,
    VARIANT_NAME,
};
