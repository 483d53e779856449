#!/usr/bin/env bash
# `make sanitize-gpu`: compute-sanitizer over short training runs and over the GPU unit tests.
#
#   memcheck  (out-of-bounds and misaligned accesses)   every kernel
#   synccheck (barriers used wrongly)                   every kernel
#   racecheck (shared-memory races)                     our kernels only
#
# racecheck checks only the kernels in namespace trainer_kernels (--kernel-name kns=trainer_kernels,
# kernels/common.cuh). What it did with the library kernels (compute-sanitizer 2025.3.1, H100, cuDNN
# 9.14, 2026-11-23): with every kernel instrumented it reported shared-memory hazards inside
# cuBLASLt's and cuDNN's sm90 kernels (they synchronise through asynchronous barriers, which it does
# not follow) and the process then ended; with the anonymous-namespace kernels selected
# (kns=_GLOBAL__N_, a name that library kernels can share) the first cuDNN convolution failed after
# "Internal Sanitizer Error: The Sanitizer failed to handle a hardware exception". Before its result
# counts, the filter must catch the race planted in bin/racecheck_probe (tests/racecheck_probe.cu),
# which is named like our kernels.
#
# Every check must end with the tool's clean summary and the program's exit status 0. Logs go to
# build/sanitize-gpu/<check>.log; the last lines of a failing one are printed. Exit 0 when all pass,
# 1 when any fails, 2 when this machine cannot run it (no GPU, no compute-sanitizer, a binary missing).
# BIN_DIR and SANITIZE_GPU_LOGS change where the binaries and logs are (the CPU tests use them).
set -u
cd "$(dirname "$0")/.."

die() { echo "sanitize-gpu: $1" >&2; exit 2; }
nvidia-smi -L 2>/dev/null | grep -q '^GPU ' || die "no CUDA GPU on this machine; run it on the GPU machine"
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
SANITIZER=$(command -v compute-sanitizer || echo "$CUDA_HOME/bin/compute-sanitizer")
[ -x "$SANITIZER" ] || die "compute-sanitizer not found on PATH nor in $CUDA_HOME/bin (it ships with the CUDA toolkit)"
BIN=${BIN_DIR:-bin}
for b in train train-baseline unit_tests racecheck_probe; do
  [ -x "$BIN/$b" ] || die "$BIN/$b is not built: run make sanitize-gpu (it builds what it runs)"
done

LOGS=${SANITIZE_GPU_LOGS:-build/sanitize-gpu}
mkdir -p "$LOGS"
# Three steps after a warm-up step, small enough to finish in seconds under memcheck. Deterministic:
# cuDNN's heuristics pick the algorithms (no search, so no autotune cache is read or written).
RUN=(--data synthetic --synthetic-size 64 --batch 16 --steps 3 --warmup-steps 1 --profile-steps 1 --no-eval
     --deterministic)
OURS=(--kernel-name kns=trainer_kernels)
# The GPU unit tests of our kernel families, on more shapes than a training run has (partial tiles,
# short last chunks); the conv and linear tests are left out: they run only library kernels.
GPU_TESTS='*GpuBatchNorm*:*GpuPool*:*GpuSoftmaxXent*:GpuSgd*:GpuLossScale*:GpuNormalize*:GpuCast*'
failed=0

# check NAME CLEAN_LINE -- sanitizer arguments and program: passes when the sanitizer printed
# CLEAN_LINE and exited 0 (it returns the program's status; --error-exitcode makes a report fail too).
check() {
  local name=$1 clean=$2; shift 3
  local log="$LOGS/$name.log" start=$SECONDS
  "$SANITIZER" --error-exitcode 99 "$@" >"$log" 2>&1
  local rc=$?
  if [ $rc -eq 0 ] && grep -qF "$clean" "$log"; then
    printf 'sanitize-gpu: %-28s ok    %s (%d s)\n' "$name" "$(grep -F "$clean" "$log" | tail -1 | sed 's/^=* *//')" $((SECONDS - start))
  else
    failed=1
    printf 'sanitize-gpu: %-28s FAILED (exit status %d, log %s):\n' "$name" $rc "$log"
    grep -v '^{' "$log" | tail -12 | sed 's/^/    /'
  fi
}

# The positive control: the filtered racecheck must see the planted race.
probe_log="$LOGS/racecheck-probe.log"
"$SANITIZER" --tool racecheck --error-exitcode 99 "${OURS[@]}" "$BIN/racecheck_probe" >"$probe_log" 2>&1
if [ $? -eq 99 ] && grep -q 'hazard detected' "$probe_log"; then
  printf 'sanitize-gpu: %-28s ok    %s\n' racecheck-probe "the planted race was reported: the filter selects our kernels"
else
  failed=1
  printf 'sanitize-gpu: %-28s FAILED: racecheck with %s did not report the planted race (log %s); the racecheck results below would prove nothing\n' \
    racecheck-probe "${OURS[*]}" "$probe_log"
fi

for bin in train train-baseline; do
  check "memcheck-$bin" "ERROR SUMMARY: 0 errors" -- --tool memcheck "$BIN/$bin" "${RUN[@]}"
  check "synccheck-$bin" "ERROR SUMMARY: 0 errors" -- --tool synccheck "$BIN/$bin" "${RUN[@]}"
  check "racecheck-$bin" "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)" -- \
    --tool racecheck --racecheck-report all "${OURS[@]}" "$BIN/$bin" "${RUN[@]}"
done
check "racecheck-unit-tests" "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)" -- \
  --tool racecheck --racecheck-report all "${OURS[@]}" "$BIN/unit_tests" --gtest_filter="$GPU_TESTS" --gtest_brief=1

if [ $failed -ne 0 ]; then echo "sanitize-gpu: FAILED"; exit 1; fi
echo "sanitize-gpu: passed, no reports"
