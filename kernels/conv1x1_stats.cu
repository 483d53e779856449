// The 1x1 conv with BN statistics (kernels/conv1x1_stats.h): which shapes it runs, and the launch
// of kernels/conv1x1_stats_kernel.cuh with 128x64 tiles, with or without the prologue, either
// schedule. The kernel is compiled only where CONV1X1_WITH_CUTLASS is set (the Makefile: sm_90a,
// where the build covers sm_90); elsewhere every shape is refused.
#include "kernels/conv1x1_stats.h"

#include "core/errors.h"
#include "kernels/conv1x1_launch.cuh"

namespace {

using namespace trainer_kernels::conv1x1;

#if defined(CONV1X1_WITH_CUTLASS)
using trainer_kernels::Operand;

template <Operand A, bool PingPong>
void launch_stats(const Conv1x1Stats& a, cudaStream_t stream) {
  using K = trainer_kernels::ResidentConv<kTileM, kTileN, A, PingPong, trainer_kernels::StatsEpilogue>;
  typename K::Mainloop::Arguments args{};
  args.ptr_A = static_cast<const cutlass::half_t*>(a.x);
  args.dA = cute::make_stride(int64_t(a.c), cute::_1{}, int64_t(a.m) * a.c);
  args.ptr_B = static_cast<const cutlass::half_t*>(a.w);
  args.dB = cute::make_stride(int64_t(a.c), cute::_1{}, int64_t(a.k) * a.c);
  if constexpr (A == Operand::Bn) {
    args.scale = a.scale;
    args.shift = a.shift;
  }
  if constexpr (A == Operand::Join || A == Operand::JoinBn) {
    const Conv1x1Join& j = a.join;
    args.second = j.res;
    args.scale = j.scale;
    args.shift = j.shift;
    args.res_scale = j.res_scale;
    args.res_shift = j.res_shift;
    args.out = j.out;
    args.bits = j.bits;
  }
  typename K::Params p{};
  p.mainloop = K::Mainloop::to_underlying_arguments(cute::make_shape(a.m, a.k, a.c, 1), args, nullptr);
  p.m = a.m, p.n = a.k, p.k = a.c;
  p.epilogue = {static_cast<cutlass::half_t*>(a.y), a.partials, a.finalize};
  launch<K>(p, stream);
}
#endif

// "" where the join (if any) has what it needs, else what it lacks.
std::string join_refusal(const Conv1x1Stats& a) {
  const Conv1x1Join& j = a.join;
  if (!j.on())
    return j.res || j.scale || j.shift || j.res_scale || j.res_shift || j.bits ? "a join needs its output" : "";
  if (a.scale || a.shift) return "a join and a BN prologue at once";
  if (a.schedule != Conv1x1Schedule::PingPong) return "the join runs with the ping-pong schedule only";
  if (!j.res || !j.scale || !j.shift || !j.bits) return "the join lacks its shortcut, coefficients or bits";
  if (!j.res_scale != !j.res_shift) return "the join's shortcut BN needs both its scale and its shift";
  // The first column's stores would overwrite tiles the other columns have still to read.
  const size_t bytes = size_t(a.m) * a.c * 2;
  if (overlap(j.out, bytes, a.x, bytes) || overlap(j.out, bytes, j.res, bytes)) return "the join's output overlaps its inputs";
  if (!aligned(a.x, 16) || !aligned(j.res, 16) || !aligned(j.out, 16) || !aligned(j.bits, 8) || !aligned(j.scale, 8) ||
      !aligned(j.shift, 8) || (j.res_scale && (!aligned(j.res_scale, 8) || !aligned(j.res_shift, 8))))
    return "the join's tensors are not aligned (16 bytes, the coefficients and bits 8)";
  return "";
}

}  // namespace

std::string sm90a_gpu_refusal() {
  const int cc = gpu().cc;
  return cc == 90 ? "" : "compiled for sm_90a only (this GPU is sm_" + std::to_string(cc) + ")";
}

std::string conv1x1_stats_refusal(int m, int k, int c) { return gemm_refusal(m, k, c); }

int conv1x1_partial_rows(int m, int k) { return ctas_per_column(m, k); }

size_t conv1x1_partials_bytes(int m, int k) { return partials_bytes(2, m, k); }

int conv1x1_columns(int k) { return k / kTileN; }

int conv1x1_finalize_counters(int n) { return std::max(1, conv1x1_columns(n)); }

void conv1x1_stats(const Conv1x1Stats& a, cudaStream_t stream) {
  if (const std::string why = conv1x1_stats_refusal(a.m, a.k, a.c); !why.empty())
    throw Fatal("conv1x1_stats: " + why);
  if (!a.scale != !a.shift) throw Fatal("conv1x1_stats: the prologue needs both its scale and its shift");
  if (a.finalize.arrivals && !a.partials) throw Fatal("conv1x1_stats: a finalize needs the partial sums");
  if (const std::string why = finalize_refusal(a.finalize, true); !why.empty())
    throw Fatal("conv1x1_stats: " + why);
  if (const std::string why = join_refusal(a); !why.empty()) throw Fatal("conv1x1_stats: " + why);
#if defined(CONV1X1_WITH_CUTLASS)
  const bool pp = a.schedule == Conv1x1Schedule::PingPong;
  if (a.join.on())
    a.join.res_scale ? launch_stats<Operand::JoinBn, true>(a, stream) : launch_stats<Operand::Join, true>(a, stream);
  else if (a.scale) pp ? launch_stats<Operand::Bn, true>(a, stream) : launch_stats<Operand::Bn, false>(a, stream);
  else pp ? launch_stats<Operand::Stored, true>(a, stream) : launch_stats<Operand::Stored, false>(a, stream);
#else
  (void)stream;
#endif
}
