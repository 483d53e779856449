// The CUTLASS 1x1 conv with BN statistics (cutlass_conv_stats.h): which builds there are, and the
// dispatch to them (cutlass_gemm_*.cu). In a build without sm_90 it refuses every shape.
#include "kernel_lab/cutlass_conv_stats.h"

#include "core/check.h"
#include "core/errors.h"
#include "kernel_lab/cutlass_kernel_builds.h"
#include "kernels/conv1x1_stats.h"

namespace lab {

const std::vector<CutlassKernel>& cutlass_kernels() {
  using S = Schedule;
  static const std::vector<CutlassKernel> all{
      {false, S::Cooperative, 128, 64}, {true, S::Cooperative, 128, 64}, {false, S::PingPong, 128, 64},
      {true, S::PingPong, 128, 64},     {false, S::Cooperative, 256, 64}, {true, S::Cooperative, 256, 64},
      {false, S::Resident, 128, 64},    {true, S::Resident, 128, 64},
      {false, S::ResidentPingPong, 128, 64}, {true, S::ResidentPingPong, 128, 64},
      {false, S::Cooperative, 256, 64, true}, {true, S::Cooperative, 256, 64, true},
      {false, S::Resident, 128, 64, true},    {true, S::Resident, 128, 64, true},
      {false, S::ResidentPingPong, 128, 64, true}, {true, S::ResidentPingPong, 128, 64, true}};
  return all;
}

std::string cutlass_kernel_text(const CutlassKernel& k) {
  const char* schedule = k.schedule == Schedule::PingPong           ? "ping-pong"
                         : k.schedule == Schedule::Resident         ? "resident, each CTA a column of tiles"
                         : k.schedule == Schedule::ResidentPingPong ? "resident ping-pong, each CTA a column of tiles"
                                                                    : "cooperative";
  return std::string(schedule) + ", " +
         std::to_string(k.tile_m) + "x" + std::to_string(k.tile_n) + " tiles" +
         (k.prologue ? ", the previous BN applied in registers" : "");
}

#if defined(LAB_WITH_CUTLASS)
namespace {

// The resident kernel is the trainer's (kernels/conv1x1_stats.h), its two schedules as builds here;
// with the prologue where the conv's arguments carry a scale and shift.
template <bool Stats, bool PingPong>
struct Resident {
  static std::string refusal(int m, int k, int c) { return conv1x1_stats_refusal(m, k, c); }
  static size_t workspace(int m, int k, int) { return Stats ? conv1x1_partials_bytes(m, k) : 0; }
  static CutlassPartials partials(int m, int k) { return {conv1x1_partial_rows(m, k), k}; }
  static void run(const CutlassConvStats& a, cudaStream_t stream) {
    if (workspace(a.m, a.k, a.c) > a.workspace_bytes) throw Fatal("resident conv stats: workspace too small");
    conv1x1_stats({a.x, a.w, a.y, a.m, a.k, a.c, a.scale, a.shift, Stats ? static_cast<float*>(a.workspace) : nullptr,
                   PingPong ? Conv1x1Schedule::PingPong : Conv1x1Schedule::Cooperative},
                  stream);
  }
  static const cutlass_builds::Ops* ops() {
    static const cutlass_builds::Ops o{&refusal, &workspace, &run, &partials};
    return &o;
  }
};

// The build of `kernel`, or nullptr where there is none.
const cutlass_builds::Ops* ops_of(const CutlassKernel& kernel) {
  const bool pp = kernel.schedule == Schedule::PingPong;
  if (kernel.tile_n != 64) return nullptr;
  if (kernel.schedule == Schedule::Resident || kernel.schedule == Schedule::ResidentPingPong) {
    if (kernel.tile_m != 128) return nullptr;
    if (kernel.schedule == Schedule::ResidentPingPong)
      return kernel.stats ? Resident<true, true>::ops() : Resident<false, true>::ops();
    return kernel.stats ? Resident<true, false>::ops() : Resident<false, false>::ops();
  }
  if (kernel.prologue)
    return kernel.tile_m == 256 && !pp ? cutlass_builds::prologue_cooperative_256x64(kernel.stats) : nullptr;
  if (kernel.tile_m == 128 && pp) return cutlass_builds::pingpong_128x64(kernel.stats);
  if (kernel.tile_m == 128) return cutlass_builds::cooperative_128x64(kernel.stats);
  if (kernel.tile_m == 256 && !pp) return cutlass_builds::cooperative_256x64(kernel.stats);
  return nullptr;
}

}  // namespace
#endif

std::string cutlass_conv_stats_refusal(const CutlassKernel& kernel, int m, int k, int c) {
#if defined(LAB_WITH_CUTLASS)
  if (const std::string why = sm90a_gpu_refusal(); !why.empty()) return why;
  if (k % 8 || c % 8) return "channels not in multiples of 8";
  const cutlass_builds::Ops* ops = ops_of(kernel);
  if (!ops) return "no such build (" + cutlass_kernel_text(kernel) + ")";
  return ops->refusal(m, k, c);
#else
  (void)kernel, (void)m, (void)k, (void)c;
  return "built without CUTLASS (the build covers no sm_90)";
#endif
}

CutlassPartials cutlass_partials_layout(const CutlassKernel& kernel, int m, int k) {
#if defined(LAB_WITH_CUTLASS)
  if (const cutlass_builds::Ops* ops = ops_of(kernel)) return ops->partials(m, k);
#endif
  return cutlass_builds::partials_layout(kernel.tile_m, kernel.tile_n, m, k);
}

size_t cutlass_conv_stats_workspace(const CutlassKernel& kernel, int m, int k, int c) {
#if defined(LAB_WITH_CUTLASS)
  const cutlass_builds::Ops* ops = ops_of(kernel);
  return ops ? ops->workspace(m, k, c) : 0;
#else
  (void)kernel, (void)m, (void)k, (void)c;
  return 0;
#endif
}

void cutlass_conv_stats(const CutlassKernel& kernel, const CutlassConvStats& a, cudaStream_t stream) {
  if (const std::string why = cutlass_conv_stats_refusal(kernel, a.m, a.k, a.c); !why.empty())
    throw Fatal("CUTLASS conv stats: " + why);
#if defined(LAB_WITH_CUTLASS)
  ops_of(kernel)->run(a, stream);
#else
  (void)stream;
#endif
}

}  // namespace lab
