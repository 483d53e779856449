// The 1x1 conv's data gradient with the previous join's backward (kernels/conv1x1_dgrad_join.h):
// kernels/conv1x1_stats_kernel.cuh with the join's epilogue, B (the filter) read N-major, 128x64
// tiles, the ping-pong schedule. Compiled only where CONV1X1_WITH_CUTLASS is set (sm_90a); elsewhere
// every shape is refused.
#include "kernels/conv1x1_dgrad_join.h"

#include "core/errors.h"
#include "kernels/conv1x1_launch.cuh"

using namespace trainer_kernels::conv1x1;

std::string conv1x1_dgrad_join_refusal(int m, int k, int c) { return gemm_refusal(m, c, k); }

int conv1x1_dgrad_join_rows(int m, int c) { return ctas_per_column(m, c); }

size_t conv1x1_dgrad_join_partials_bytes(int m, int c) {
  return 3 * size_t(conv1x1_dgrad_join_rows(m, c)) * c * sizeof(float);
}

void conv1x1_dgrad_join(const Conv1x1DgradJoin& a, cudaStream_t stream) {
  if (const std::string why = conv1x1_dgrad_join_refusal(a.m, a.k, a.c); !why.empty())
    throw Fatal("conv1x1_dgrad_join: " + why);
  if (!a.x2 != !a.mean2 || !a.x2 != !a.invstd2)
    throw Fatal("conv1x1_dgrad_join: the shortcut's BN needs its input, mean and 1/std together");
#if defined(CONV1X1_WITH_CUTLASS)
  using K = trainer_kernels::ResidentConv<kTileM, kTileN, false, true, trainer_kernels::JoinGradEpilogue>;
  typename K::Mainloop::Arguments args{};
  args.ptr_A = static_cast<const cutlass::half_t*>(a.dy);
  args.dA = cute::make_stride(int64_t(a.k), cute::_1{}, int64_t(a.m) * a.k);
  args.ptr_B = static_cast<const cutlass::half_t*>(a.w);  // B(n, k) = w[k][n]: N-major
  args.dB = cute::make_stride(cute::_1{}, int64_t(a.c), int64_t(a.k) * a.c);
  typename K::Params p{};
  p.mainloop = K::Mainloop::to_underlying_arguments(cute::make_shape(a.m, a.c, a.k, 1), args, nullptr);
  p.m = a.m, p.n = a.c, p.k = a.k;
  p.epilogue = {static_cast<cutlass::half_t*>(a.dz),
                a.relu_bits,
                static_cast<const __half*>(a.x),
                a.mean,
                a.invstd,
                static_cast<const __half*>(a.x2),
                a.mean2,
                a.invstd2,
                a.partials};
  launch<K>(p, stream);
#else
  (void)stream;
#endif
}
