#!/bin/sh
# cuda_h200.sh - the GPU suite in one call, on a machine with an NVIDIA GPU (docs/bench.md, "On a
# GPU"): build with CMake (CUDA on), run the test programs (test_rope_modes also without the bulk
# kernel), `lmk check` on the GPU, then
# compute-sanitizer (memcheck, racecheck) on the CUDA graph test and a quick `lmk check`, memcheck on
# random cases (test_stress), then
# `lmk bench` on the GPU (table and JSON).
#
#   sh tests/cuda_h200.sh OUTDIR                 everything is logged under OUTDIR
#   B=build SKIP_TESTS=1 sh tests/cuda_h200.sh OUTDIR   reuse a build directory, skip the test programs
#
# A summary is printed last (OUTDIR/summary.txt).
OUT=${1:?usage: cuda_h200.sh OUTDIR}
mkdir -p "$OUT"
J=$(nproc)
B=${B:-build-h200}
log() { echo "### $*" | tee -a "$OUT/summary.txt"; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu --format=csv >"$OUT/gpu.txt" 2>&1
log "gpu: $(tail -n 1 "$OUT/gpu.txt")"
t0=$(date +%s)
cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DLMK_CUDA=ON >"$OUT/build.log" 2>&1 &&
  cmake --build "$B" -j "$J" >>"$OUT/build.log" 2>&1 || { tail -n 40 "$OUT/build.log"; exit 1; }
log "build ok ($(( $(date +%s) - t0 )) s)"

# The test programs (CPU and CUDA cases). LMK_TEST_QUICK keeps the CPU reference work short.
if [ -z "$SKIP_TESTS" ]; then
  LMK_TEST_QUICK=1 timeout 600 sh tests/run_tests.sh "$B/tests" >"$OUT/tests.log" 2>&1
  log "tests (rc $?): $(tail -n 1 "$OUT/tests.log")"
  grep -E "^(FAIL|!!!)" "$OUT/tests.log" | head -n 20 | tee -a "$OUT/summary.txt"
  # The rope cases again without the bulk kernel (sm_90), so the other prefill kernels see them too.
  LMK_TEST_QUICK=1 LMK_CUDA_BULK=0 timeout 300 "$B/tests/test_rope_modes" >"$OUT/tests_nobulk.log" 2>&1
  log "test_rope_modes with LMK_CUDA_BULK=0 (rc $?): $(tail -n 1 "$OUT/tests_nobulk.log")"
fi

# Every case of every op on the GPU against the float64 reference (the prompt-length ones too).
timeout 900 "$B/lmk" check --backend cuda >"$OUT/check.log" 2>&1
log "lmk check --backend cuda (rc $?): $(tail -n 1 "$OUT/check.log")"
grep -E "^cuda +FAIL|^[a-z_]+ +[0-9]+ passed" "$OUT/check.log" | head -n 20 | tee -a "$OUT/summary.txt"

# Sanitizers. The planted-fault cases are skipped: memcheck would (rightly) report them.
export LMK_TEST_SKIP_FAULTS=1
for tool in memcheck racecheck; do
  timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 "$B/tests/test_cuda_graph" >"$OUT/san_${tool}_graph.log" 2>&1
  log "compute-sanitizer $tool test_cuda_graph: rc $? | $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san_${tool}_graph.log" | tail -n 1) | $(grep -E '^[0-9]+ passed' "$OUT/san_${tool}_graph.log")"
  timeout 600 compute-sanitizer --tool $tool --error-exitcode 9 "$B/lmk" check --quick --backend cuda >"$OUT/san_${tool}_check.log" 2>&1
  log "compute-sanitizer $tool lmk check --quick: rc $? | $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san_${tool}_check.log" | tail -n 1) | $(tail -n 1 "$OUT/san_${tool}_check.log")"
done
unset LMK_TEST_SKIP_FAULTS
# Random cases of every op (test_stress on one thread, so a fault names its own call) under memcheck:
# the case table cannot hold every shape, and an out-of-bounds shared-memory read of the MIX kernels
# was found this way (docs/hardening.md, "What the checks have found").
LMK_STRESS_THREADS=1 LMK_STRESS_SECONDS=30 timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 \
  "$B/tests/test_stress" >"$OUT/san_memcheck_stress.log" 2>&1
log "compute-sanitizer memcheck test_stress (random cases, 30 s): rc $? | $(grep -E 'ERROR SUMMARY' "$OUT/san_memcheck_stress.log" | tail -n 1) | $(grep -E '^stress: [0-9]' "$OUT/san_memcheck_stress.log")"

# The benchmark.
timeout 600 "$B/lmk" bench --all --backend cuda >"$OUT/bench.txt" 2>&1
log "lmk bench (rc $?): $(tail -n 1 "$OUT/bench.txt")"
timeout 600 "$B/lmk" bench --all --backend cuda --json >"$OUT/bench.json" 2>"$OUT/bench_json.err"
log "lmk bench --json (rc $?)"
log "done in $(( $(date +%s) - t0 )) s"
# Fold the sanitizer logs into one file.
for f in "$OUT"/san_*.log; do echo "===== $f"; tail -n 30 "$f"; done >"$OUT/sanitizers.txt" 2>/dev/null && rm -f "$OUT"/san_*.log
exit 0
