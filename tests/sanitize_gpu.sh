#!/usr/bin/env bash
# `make sanitize-gpu`: compute-sanitizer over short training runs and over the GPU unit tests.
#
#   memcheck  (out-of-bounds and misaligned accesses)   every kernel    bin/train, bin/train-baseline
#   synccheck (barriers used wrongly)                   every kernel    bin/train, bin/train-baseline
#   racecheck (shared-memory races)                     our kernels     bin/train-baseline and
#             bin/train-fp32-nhwc with --no-tf32; the GPU unit tests of our kernel families
#   memcheck                                            every kernel    the GPU unit tests of the
#             fused batch-norm patterns (training and inference, our 1x1 convs' among them) and of the
#             networks that run them
#
# The training runs take --deterministic (the same algorithms every run, no search under the
# sanitizer), and --deterministic runs every conv unfused (NetConfig::fuses in model/network.h says why); so the
# fused patterns, bin/train's and bin/predict's, are checked through their unit tests, which build
# them with the heuristics' engines and no determinism asked.
#
# Why racecheck is run that way (compute-sanitizer 2025.3.1, driver 580.159.04, cuDNN 9.14, H100,
# 2026-11-23): racecheck cannot run cuDNN's and cuBLAS's tensor-core kernels for Hopper. With every
# kernel checked it reports hazards inside them (they synchronise through asynchronous barriers,
# which it does not follow); with none of them checked (a kernel filter that matches nothing, also
# with --check-warpgroup-mma no, --check-bulk-copy no and --racecheck-memcpy-async no) the first
# tensor-core convolution still fails: "Internal Sanitizer Error: The Sanitizer failed to handle a
# hardware exception", then CUDNN_STATUS_EXECUTION_FAILED. With --no-tf32, fp32 convs and GEMMs run
# FMA kernels, which it runs: so the training runs under racecheck are the fp32 builds, NCHW
# (bin/train-baseline) and NHWC with the graph API (bin/train-fp32-nhwc, bin/train in fp32). The
# kernels only fp16 builds use (casts, loss scaling, the fp16 instances) are checked through the unit
# tests. Only our kernels (namespace trainer_kernels, kernels/common.cuh) are checked: the library's
# FMA kernels need minutes under racecheck and are not ours to fix. Before the results count, the
# filter must catch the race planted in bin/racecheck_probe (tests/racecheck_probe.cu), which is
# named like our kernels.
#
# The checks run side by side, each its own process (the probe first: the racecheck results count
# only when it passes), and the fused memcheck runs as gtest shards: one after another they took
# more than the 600 s a GPU-machine call allows (FUSED_SHARDS below says how long side by side).
# Every check must end with the tool's clean summary and the program's exit status 0. Logs go to
# build/sanitize-gpu/<check>.log; one line per check is printed in the order they are listed below,
# whatever order they finish in, with the last lines of a failing one's log. Exit 0 when all pass,
# 1 when any fails, 2 when this machine cannot run it (no GPU, no compute-sanitizer, a binary missing).
# BIN_DIR and SANITIZE_GPU_LOGS change where the binaries and logs are (the CPU tests use them).
set -u
cd "$(dirname "$0")/.." || exit 2

die() { echo "sanitize-gpu: $1" >&2; exit 2; }
nvidia-smi -L 2>/dev/null | grep -q '^GPU ' || die "no CUDA GPU on this machine; run it on the GPU machine"
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
SANITIZER=$(command -v compute-sanitizer || echo "$CUDA_HOME/bin/compute-sanitizer")
[ -x "$SANITIZER" ] || die "compute-sanitizer not found on PATH nor in $CUDA_HOME/bin (it ships with the CUDA toolkit)"
BIN=${BIN_DIR:-bin}
for b in train train-baseline train-fp32-nhwc unit_tests racecheck_probe; do
  [ -x "$BIN/$b" ] || die "$BIN/$b is not built: run make sanitize-gpu (it builds what it runs)"
done

LOGS=${SANITIZE_GPU_LOGS:-build/sanitize-gpu}
mkdir -p "$LOGS"
# Three steps after a warm-up step, small enough to finish in seconds under memcheck. Deterministic:
# cuDNN's heuristics pick the algorithms (no search, so no autotune cache is read or written).
RUN=(--data synthetic --synthetic-size 64 --batch 16 --steps 3 --warmup-steps 1 --profile-steps 1 --no-eval
     --deterministic)
RACECHECK=(--tool racecheck --racecheck-report all --kernel-name kns=trainer_kernels)
RACECHECK_CLEAN="RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"
# The GPU unit tests of our kernel families, on more shapes than a training run has (partial tiles,
# short last chunks); the conv and linear tests are left out: they run only library kernels. Our own
# 1x1 and 3x3 convs (sm_90 only, skipped elsewhere) are in, but for six (ODD_TILES): tests whose
# shapes give some ping-pong CTA's two consumer warpgroups unequal numbers of tiles, and in which
# racecheck reported hazards on accesses a barrier of both warpgroups orders (its false positives,
# docs/testing.md). They stay memchecked, and each form they take is racechecked on shapes of two
# tiles every CTA (*TwoTilesEveryCta*). Measured on a 132-SM GPU (H200, 2026-12-03): each conv test
# alone took 2-10 s under racecheck, the six reported 363-13,315 errors, the rest none; this check
# then took 67-72 s alone (bench/results/racecheck-named-barriers-nvidia-h200-2026-12-03.md), 91 s
# beside the other checks. On another SM count the tiles split otherwise, and the list may need to
# change.
OUR_KERNEL_TESTS='*GpuBatchNorm*:*GpuPool*:*GpuSoftmaxXent*:GpuSgd*:GpuLossScale*:GpuNormalize*:GpuCast*'
OUR_CONV_TESTS='Conv1x1Stats*:Conv1x1Dgrad*:Conv3x3*'
ODD_TILES='Conv1x1Stats.FinalizedInTheKernelAsTheFinalizeKernelDoes'
ODD_TILES+=':Conv1x1DgradJoin.ProjectionShortcutSeveralTilesACtaMatchTheReference'
ODD_TILES+=':Conv1x1DgradJoin.MoreKTilesThanStagesMatchTheReference'
ODD_TILES+=':Conv1x1DgradJoin.AStride2ShortcutsCompactPartMatchesTheReference'
ODD_TILES+=':Conv1x1DgradJoin.TheShortcutsPartInABufferOfItsOwnMatchesTheReference'
ODD_TILES+=':Conv1x1DgradJoin.JoinedBackwardGivesThePlainPathsGradients'
GPU_TESTS="$OUR_KERNEL_TESTS:$OUR_CONV_TESTS-$ODD_TILES"
# Our 1x1 and 3x3 convs with BN sums (Conv1x1Stats, Conv1x1Dgrad*, Conv3x3*: sm_90 only, skipped
# elsewhere) are fused patterns of ours: memchecked with them, every one of their tests.
FUSED_TESTS="Shapes/FusedGpu*:Shapes/GemmGpu*:Shapes/GemmWgradGpu*:FusedBnFinalize*:FusedParityGpu*:$OUR_CONV_TESTS"
FUSED_TESTS+=':PredictGpu.BatchNormInTheConvEpiloguesGivesTheUnfusedLogits:PredictGpu.GemmConvsWithTheBnFoldedInGiveTheUnfusedLogits'
# The fused memcheck as gtest shards run side by side: as one process it took more than 300 s. H200,
# every check at once on a one-GPU machine: on 2026-11-30 the shards took 51, 290, 21 and 57 s, the
# other checks 7-59 s, the whole script 292 s; on 2026-12-02 the shards took 46, 51, 63 and 338 s
# (the slow shard holds different tests as tests are added), the script about 340 s; on 2026-12-03
# 57, 319, 50 and 44 s, the script 321 s.
FUSED_SHARDS=4
failed=0

# check NAME CLEAN_LINE -- sanitizer arguments and program: starts a background job that passes when
# the sanitizer printed CLEAN_LINE and exited 0 (it returns the program's status; --error-exitcode
# makes a report fail too). The job writes its lines to $LOGS/NAME.result and exits 0 or 1; report
# prints them. SIGINT is restored in it (bash ignores it in a script's background jobs), so that
# Ctrl-C stops the checks too.
names=() pids=()
check() {
  local name=$1 clean=$2; shift 3
  local log="$LOGS/$name.log" start=$SECONDS
  rm -f "$LOGS/$name.result"
  names+=("$name")
  (
    trap - INT
    "$SANITIZER" --error-exitcode 99 "$@" >"$log" 2>&1
    rc=$?
    if [ $rc -eq 0 ] && grep -qF "$clean" "$log"; then
      printf 'sanitize-gpu: %-30s ok    %s (%d s)\n' "$name" \
        "$(grep -F "$clean" "$log" | tail -1 | sed 's/^=* *//')" $((SECONDS - start)) >"$LOGS/$name.result"
    else
      { printf 'sanitize-gpu: %-30s FAILED (exit status %d, log %s):\n' "$name" $rc "$log"
        grep -v '^{' "$log" | tail -12 | sed 's/^/    /'; } >"$LOGS/$name.result"
      exit 1
    fi
  ) &
  pids+=($!)
}

# report: waits for every check in the order they were started and prints its lines.
report() {
  local i name
  for i in "${!names[@]}"; do
    name=${names[$i]}
    wait "${pids[$i]}" || failed=1
    cat "$LOGS/$name.result" 2>/dev/null ||
      printf 'sanitize-gpu: %-30s FAILED (no result, log %s)\n' "$name" "$LOGS/$name.log"
  done
}

# The positive control: the racecheck that the checks below run must report the planted race.
probe_log="$LOGS/racecheck-probe.log"
"$SANITIZER" --error-exitcode 99 "${RACECHECK[@]}" "$BIN/racecheck_probe" >"$probe_log" 2>&1
probe_rc=$?
if [ $probe_rc -eq 99 ] && grep -q 'hazard detected' "$probe_log" && grep -q 'planted_race' "$probe_log" &&
   grep -Eq 'RACECHECK SUMMARY: [1-9][0-9]* hazards? displayed \([1-9]' "$probe_log"; then
  printf 'sanitize-gpu: %-30s ok    %s\n' racecheck-probe \
    "the planted race was reported: the filter selects our kernels"
else
  failed=1
  printf 'sanitize-gpu: %-30s FAILED: %s did not report the planted race (exit status %d, log %s); %s\n' \
    racecheck-probe "${RACECHECK[*]}" $probe_rc "$probe_log" "the racecheck results below would prove nothing"
fi

# All started at once, side by side (one after another they overran a 600 s call: FUSED_SHARDS), reported in order.
for bin in train train-baseline; do
  check "memcheck-$bin" "ERROR SUMMARY: 0 errors" -- --tool memcheck "$BIN/$bin" "${RUN[@]}"
  check "synccheck-$bin" "ERROR SUMMARY: 0 errors" -- --tool synccheck "$BIN/$bin" "${RUN[@]}"
done
for bin in train-baseline train-fp32-nhwc; do
  check "racecheck-$bin" "$RACECHECK_CLEAN" -- "${RACECHECK[@]}" "$BIN/$bin" "${RUN[@]}" --no-tf32
done
check "racecheck-unit-tests" "$RACECHECK_CLEAN" -- \
  "${RACECHECK[@]}" "$BIN/unit_tests" --gtest_filter="$GPU_TESTS" --gtest_brief=1
for ((i = 1; i <= FUSED_SHARDS; i++)); do
  GTEST_TOTAL_SHARDS=$FUSED_SHARDS GTEST_SHARD_INDEX=$((i - 1)) check "memcheck-fused-unit-tests-${i}of$FUSED_SHARDS" \
    "ERROR SUMMARY: 0 errors" -- --tool memcheck "$BIN/unit_tests" --gtest_filter="$FUSED_TESTS" --gtest_brief=1
done
report

if [ $failed -ne 0 ]; then echo "sanitize-gpu: FAILED"; exit 1; fi
echo "sanitize-gpu: passed, no reports"
