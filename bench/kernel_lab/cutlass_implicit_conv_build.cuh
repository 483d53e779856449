// One build of kernel_lab/cutlass_implicit_conv.h: CUTLASS's collective builders for the Hopper
// implicit-GEMM conv, and its arguments from a ConvGeometry. Included by the files that instantiate
// the builds (cutlass_implicit_fprop.cu, cutlass_implicit_dgrad.cu: a minute or more each to compile).
#pragma once

#include <memory>

// CUTLASS before the project's headers: its code names cute's Layout unqualified, which the
// project's own ::Layout (the tensor layouts) would make ambiguous.
#include "cute/tensor.hpp"
#include "cutlass/kernel_hardware_info.hpp"
#include "cutlass/conv/collective/collective_builder.hpp"
#include "cutlass/conv/convnd_problem_shape.hpp"
#include "cutlass/conv/device/conv_universal_adapter.hpp"
#include "cutlass/conv/kernel/conv_universal.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
// (then ours)
#include "core/check.h"
#include "core/errors.h"
#include "kernel_lab/cutlass_implicit_conv.h"

namespace lab::implicit_builds {

using namespace cute;

template <cutlass::conv::Operator Op, int TileM, int TileN>
struct Build {
  using Half = cutlass::half_t;
  using Tile = Shape<Int<TileM>, Int<TileN>, Shape<_64>>;
  using Cluster = Shape<_1, _1, _1>;
  // D = the accumulators in fp16, no source tensor.
  // CUTLASS 4.2's Hopper convs have one schedule (its dispatch policy refuses the persistent ones):
  // a CTA a tile, one consumer warpgroup.
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster, cutlass::epilogue::collective::EpilogueTileAuto,
      float, float, void, cutlass::layout::TensorNHWC, 8, Half, cutlass::layout::TensorNHWC, 8,
      cutlass::epilogue::TmaWarpSpecialized>::CollectiveOp;
  using Mainloop = typename cutlass::conv::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Op, Half, cutlass::layout::TensorNHWC, 8, Half,
      cutlass::layout::TensorNHWC, 8, float, Tile, Cluster,
      cutlass::conv::collective::StageCountAutoCarveout<int(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::conv::KernelImplicitTmaWarpSpecializedSm90>::CollectiveOp;
  using Problem = cutlass::conv::ConvProblemShape<Op, 2>;
  using Kernel = cutlass::conv::kernel::ConvUniversal<Problem, Mainloop, Epilogue>;
  using Conv = cutlass::conv::device::ConvUniversalAdapter<Kernel>;

  static typename Conv::Arguments arguments(const ConvGeometry& g, const void* in, const void* w, void* out) {
    // The problem by the activation's shape (x's, in both directions) and the filter's, NHWC/KRSC packed.
    const Problem problem(cutlass::conv::Mode::kCrossCorrelation, {g.n, g.h, g.w, g.c}, {g.k, g.r, g.r, g.c},
                          {g.pad, g.pad}, {g.pad, g.pad}, {g.stride, g.stride}, {1, 1}, 1);
    // The output's strides, from the problem's (its own order reversed), as CUTLASS's testbed sets them.
    typename Kernel::StrideC stride_c{};
    typename Kernel::StrideD stride_d{};
    cute::for_each(cute::make_seq<cute::rank<0>(typename Kernel::StrideD{})>{}, [&](auto i) {
      cute::get<0, i>(stride_c) = problem.stride_C[Problem::RankT - 2 - i];
      cute::get<0, i>(stride_d) = problem.stride_C[Problem::RankT - 2 - i];
    });
    cutlass::KernelHardwareInfo hw;
    CUDA_CHECK(cudaGetDevice(&hw.device_id));
    hw.sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(hw.device_id);
    typename Conv::Arguments args(problem, {static_cast<const Half*>(in), static_cast<const Half*>(w)},
                                  {{}, nullptr, stride_c, static_cast<Half*>(out), stride_d}, hw);
    args.epilogue.thread.alpha = 1.f;
    args.epilogue.thread.beta = 0.f;
    return args;
  }

  static ImplicitConvRun make(const ConvGeometry& g, const void* in, const void* w, void* out, void* ws) {
    ImplicitConvRun r;
    const typename Conv::Arguments args = arguments(g, in, w, out);
    if (Conv::can_implement(args) != cutlass::Status::kSuccess) {
      r.refused = "CUTLASS's can_implement refused the shape";
      return r;
    }
    r.workspace = Conv::get_workspace_size(args);
    if (!ws && r.workspace) return r;
    auto conv = std::make_shared<Conv>();
    if (conv->initialize(args, ws) != cutlass::Status::kSuccess) throw Fatal("CUTLASS implicit conv: initialize failed");
    r.run = [conv](cudaStream_t s) {
      if (conv->run(s) != cutlass::Status::kSuccess) throw Fatal("CUTLASS implicit conv: launch failed");
    };
    return r;
  }
};

}  // namespace lab::implicit_builds
