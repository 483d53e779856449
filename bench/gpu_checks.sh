#!/usr/bin/env bash
# The one-GPU checks, section by section, on the GPU machine: what a session with a lent GPU runs to
# check the rungs, the programs and the tools (docs/testing.md, "Running the checks on a GPU"). Each section
# writes its full log to $LOGS/<section>.log (default bench/out/gpu-checks) and prints a short
# summary; the exit status is that of the last section that failed (0 if none did).
#
#   bash bench/gpu_checks.sh build test lab predict     # any sections, in the order given
#
# Sections: build (every binary, -j all cores), test (make test), gtest and pytest (make test's suites
# apart: GoogleTest; the Python tests and fuzz smoke runs), sanitize (make sanitize-gpu),
# lab (bin/kernel_lab default run, its table and JSON into bench/results), predict (make
# bench-predict, and a trained model's export evaluated in PyTorch against bin/predict), bench
# (make bench at batch 128 and 256 with PyTorch's baseline and best rungs), accuracy (the new rungs
# and the baseline on Fashion-MNIST, 15 epochs, a run a GPU), profile (nsys of the fused and graph
# rungs), folder (make data-folder, make bench-folder, and 15 epochs on the Fashion-MNIST PNG folder
# beside the idx reader).
set -uo pipefail
cd "$(dirname "$0")/.."
LOGS=${LOGS:-bench/out/gpu-checks}
mkdir -p "$LOGS" bench/results
DAY=$(date +%F)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr 'A-Z ' 'a-z-' | sed 's/nvidia-//')
JOBS=$(nproc)
status=0

run() {  # run NAME COMMAND...: log to $LOGS/NAME.log, print its last lines, remember a failure
  local name=$1
  shift
  local t0=$SECONDS
  "$@" >"$LOGS/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc in $((SECONDS - t0)) s"
  [ $rc -ne 0 ] && status=$rc
  return $rc
}

section_build() {
  run build make -j"$JOBS" variants predict-variants bin/unit_tests bin/kernel_lab bin/train-fp32-nhwc \
    bin/racecheck_probe || tail -20 "$LOGS/build.log"
}

section_test() {
  run test make -j"$JOBS" test
  grep -E "passed, .* failed, .* skipped" "$LOGS/test.log"
  grep -E "^  \[|FAILED" "$LOGS/test.log" | head -30
}

# make test by halves, for calls shorter than the whole (docs/testing.md), each building what make
# test builds first (make test-build; nothing when it is built). The Python half builds the rungs
# too: without them its tests of bin/train-baseline, -cudagraph and bin/predict's rungs skip (21 on
# an H200, 2026-12-03).
section_gtest() {
  suites gtest gtest
}

section_pytest() {
  suites pytest python,fuzz variants predict-variants
}

suites() {  # suites NAME LIST [TARGET...]: tests/run_tests.py --suites LIST, its tally and failures
  local name=$1 list=$2
  shift 2
  run "$name-build" make -j"$JOBS" test-build "$@" || { tail -20 "$LOGS/$name-build.log"; return; }
  run "$name" python3 tests/run_tests.py --suites "$list"
  grep -E "passed, .* failed, .* skipped" "$LOGS/$name.log"
  sed -n '/^FAILED:/,$p' "$LOGS/$name.log" | head -30
}

section_sanitize() {
  run sanitize make sanitize-gpu
  grep -E "^sanitize-gpu:" "$LOGS/sanitize.log"
}

section_lab() {
  local base=bench/results/kernel-lab-$GPU-$DAY
  run lab ./bin/kernel_lab --json "$base.jsonl"
  cp "$LOGS/lab.log" "$base.md"
  tail -3 "$LOGS/lab.log"
}

section_predict() {
  run bench-predict make bench-predict
  tail -12 "$LOGS/bench-predict.log"
  local d=$LOGS/predict
  mkdir -p "$d"
  run predict-train ./bin/train --data fashion-mnist --epochs 2 --save "$d/m.ckpt" --no-eval &&
    run predict-csv ./bin/predict --checkpoint "$d/m.ckpt" --data fashion-mnist --out "$d/predictions.csv" &&
    run predict-export ./bin/predict --checkpoint "$d/m.ckpt" --export "$d/m.safetensors" &&
    run predict-torch python3 bench/load_safetensors.py "$d/m.safetensors" --compare-csv "$d/predictions.csv"
  grep -hE "accuracy|agree" "$LOGS/predict-csv.log" "$LOGS/predict-torch.log" 2>/dev/null | tail -6
}

section_bench() {
  run bench python3 bench/bench.py --batch 128,256 --runs 3 --variants baseline,graph,fusedbn,cudagraph,wgradstream \
    --pytorch-rungs baseline,resident-amp-cl-graphs
  grep -E "^\|" "$LOGS/bench.log" | tail -24
}

section_accuracy() {  # each run with an autotune cache of its rung's, not one file for all
  run accuracy python3 bench/rung_accuracy.py --variants baseline,fusedbn,cudagraph,wgradstream --seeds 1 \
    --out "bench/results/fmnist-accuracy-$GPU-$DAY.md"
  grep -E "^\| \`|ended at" "$LOGS/accuracy.log" | head -5
}

section_folder() {  # training from an image folder: the PNG export of Fashion-MNIST against the idx reader
  run data-folder make data-folder
  run bench-folder make bench-folder
  grep -E "^\|" "$LOGS/bench-folder.log" | tail -12
  local d=$LOGS/folder
  mkdir -p "$d"
  ./bin/train --data folder --data-dir data/fashion-mnist-png --epochs 15 --json >"$d/folder.jsonl" 2>"$d/folder.err" &&
    ./bin/train --data fashion-mnist --epochs 15 --json >"$d/idx.jsonl" 2>"$d/idx.err"
  for r in folder idx; do
    echo "$r: $(grep '"summary"' "$d/$r.jsonl" | python3 -c 'import json,sys; s=json.load(sys.stdin); print("test acc %.2f%%, %.0f images/s, data stall %.1f%%" % (100*s["final_test_acc"], s["images_per_s"], s["data_stall_pct"]))' 2>/dev/null || tail -1 "$d/$r.err")"
  done
}

section_profile() {
  run profile python3 bench/profile.py --variants graph,fusedbn,cudagraph,wgradstream
  tail -20 "$LOGS/profile.log"
}

for s in "$@"; do
  if declare -F "section_$s" >/dev/null; then "section_$s"; else echo "unknown section: $s"; status=2; fi
done
exit $status
