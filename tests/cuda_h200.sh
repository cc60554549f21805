#!/bin/sh
# cuda_h200.sh - the CUDA backend's one-call job on the GPU machine (docs/cuda_notes.md): build with
# CMake, run the test programs, compute-sanitizer (memcheck, racecheck, initcheck) on the CUDA tests,
# the kernel sweep and timing driver (tests/cuda_kernels_bench.c), and timing-only runs of kernel
# variants made from the sources by text substitution (so experiments never enter the tree).
#
#   sh tests/cuda_h200.sh OUTDIR [variants...]     variants: see vdef below; none by default
#   B=build SKIP_TESTS=1 sh tests/cuda_h200.sh ...  reuse `make test`'s build dir, skip the test programs
#
# Everything is logged under OUTDIR; a summary is printed last.
OUT=${1:?usage: cuda_h200.sh OUTDIR [variants]}; shift
J=$(nproc)
B=${B:-build-h200}
NV="nvcc -std=c++17 -O3 -gencode arch=compute_90,code=sm_90 -I include -I src -DLMK_WITH_CUDA"
LINK="-L/usr/local/cuda/lib64 -lcudart_static -lstdc++ -lpthread -ldl -lrt -lm"
DRV="tests/cuda_kernels_bench.c tools/bench_cuda.c tests/common_rng.c tests/common_buf.c tests/common_cmp.c tests/common_cases.c"
CFLAGS="-std=c11 -O2 -D_GNU_SOURCE -DLMK_WITH_CUDA -I include -I src -I tests -I tools -I /usr/local/cuda/include"
log() { echo "### $*" | tee -a "$OUT/summary.txt"; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu --format=csv >"$OUT/gpu.txt" 2>&1
log "gpu: $(tail -n 1 "$OUT/gpu.txt")"
t0=$(date +%s)
cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DLMK_CUDA=ON >"$OUT/build.log" 2>&1 &&
  cmake --build $B -j "$J" >>"$OUT/build.log" 2>&1 || { tail -n 40 "$OUT/build.log"; exit 1; }
gcc $CFLAGS $DRV $B/liblmk.a $LINK -o $B/ckb >>"$OUT/build.log" 2>&1 || { tail -n 40 "$OUT/build.log"; exit 1; }
log "build ok ($(( $(date +%s) - t0 )) s)"

# Variants: name | file | python replacement (old => new) | timing filter | sweep (1: check with the
# quick sweep; 0: a diagnostic that computes wrong values on purpose, timed only). Each is a CMake
# build (sm_90 only) of a copy of the tree with one substitution. The builds run in the background
# while the tests and the sanitizers use the GPU; the timings come after the main timing.
VDEFS=/tmp/vdefs; rm -rf $VDEFS /tmp/vs_*; mkdir -p $VDEFS
vdef() { printf '%s\n' "$2" >$VDEFS/$1.file; printf '%s' "$3" >$VDEFS/$1.old; printf '%s' "$4" >$VDEFS/$1.new
         printf '%s\n' "$5" >$VDEFS/$1.filter; printf '%s\n' "$6" >$VDEFS/$1.sweep; }
# Decode diagnostics (docs/cuda_notes.md, run 5): empty returns at once (the launch's own cost in a
# graph; since v6 in the small-T kernel, which T=1 uses); nosync rotates without waiting for the
# angle table (the general kernel: prefill rows only since v6).
vdef empty rope_multi.cu "    const uint32_t x = threadIdx.x, t = blockIdx.x;" "    if (blockIdx.x < 0xffffffffu)
        return;
    const uint32_t x = threadIdx.x, t = blockIdx.x;" T=1 0
vdef nosync rope_multi.cu "        __syncthreads();
        for (;;) {
            rot_store" "        for (;;) {
            rot_store" T=1 0
# v6 (run 6): nodec never chooses the small-T kernel (v5's path at decode, timed against v6 in the
# same run); dec1024 puts a token's rows in blocks of up to 1024 threads (Qwen3.5 bf16 out of place:
# one block of 784 threads, f32: two of 784) instead of ~256.
vdef nodec rope_multi.cu "if (half <= kDecMaxPairs && ipr <= kDecMaxItems) {" "if (false && half <= kDecMaxPairs && ipr <= kDecMaxItems) {" T=1 0
vdef dec1024 rope_multi.cu "constexpr uint32_t kDecThreads = 256;" "constexpr uint32_t kDecThreads = 1024;" T=1 1
# Decode block size (run 7): blocks of ~64 or ~128 threads instead of ~256, i.e. more, smaller blocks.
vdef dec64 rope_multi.cu "constexpr uint32_t kDecThreads = 256;" "constexpr uint32_t kDecThreads = 64;" T=1 1
vdef dec128 rope_multi.cu "constexpr uint32_t kDecThreads = 256;" "constexpr uint32_t kDecThreads = 128;" T=1 1
VARS=$*
vbuild() {
  name=$1 d=/tmp/vs_$1 file=$(cat $VDEFS/$1.file)
  mkdir -p $d && tar --exclude='./build*' --exclude=./.git -cf - . | (cd $d && tar xf -)
  python3 - "$d/src/cuda/$file" "$VDEFS/$name.old" "$VDEFS/$name.new" <<'EOF2' || { echo "pattern not found"; return 1; }
import sys
p, old, new = sys.argv[1], open(sys.argv[2]).read(), open(sys.argv[3]).read()
s = open(p).read()
if s.count(old) != 1:
    sys.exit(1)
open(p, "w").write(s.replace(old, new))
EOF2
  cmake -S $d -B $d/b -DCMAKE_BUILD_TYPE=Release -DLMK_CUDA=ON -DLMK_BUILD_TESTS=OFF -DCMAKE_CUDA_ARCHITECTURES=90-real &&
    cmake --build $d/b -j 4 --target lmk_static && gcc $CFLAGS $DRV $d/b/liblmk.a $LINK -o $d/ckb && echo BUILT
}
( for v in $VARS; do [ -f $VDEFS/$v.file ] && vbuild $v >"$OUT/var_$v.log" 2>&1 & done; wait ) &
VPID=$!

# The test programs (CPU and CUDA cases). LMK_TEST_QUICK keeps the CPU reference work short.
if [ -z "$SKIP_TESTS" ]; then
  LMK_TEST_QUICK=1 timeout 300 sh tests/run_tests.sh $B/tests >"$OUT/tests.log" 2>&1
  log "tests (rc $?): $(tail -n 1 "$OUT/tests.log")"
  grep -E "^(FAIL|SKIP|!!!)" "$OUT/tests.log" | head -n 20 | tee -a "$OUT/summary.txt"
fi

# Sanitizers. The planted-fault cases are skipped: memcheck would (rightly) report them.
export LMK_TEST_SKIP_FAULTS=1
for tool in memcheck racecheck initcheck; do
  timeout 240 compute-sanitizer --tool $tool --error-exitcode 9 $B/tests/test_cuda_graph >"$OUT/san_${tool}_graph.log" 2>&1
  log "compute-sanitizer $tool test_cuda_graph: rc $? | $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san_${tool}_graph.log" | tail -n 1) | $(grep -E '^[0-9]+ passed' "$OUT/san_${tool}_graph.log")"
done
for tool in memcheck racecheck; do
  timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 $B/ckb --quick >"$OUT/san_${tool}_sweep.log" 2>&1
  log "compute-sanitizer $tool ckb --quick: rc $? | $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san_${tool}_sweep.log" | tail -n 1) | $(grep -E '^[0-9]+ passed' "$OUT/san_${tool}_sweep.log")"
done
unset LMK_TEST_SKIP_FAULTS

# The full sweep and the timing of the targets.
timeout 400 $B/ckb >"$OUT/bench.log" 2>&1
log "ckb (rc $?): $(grep -E '^sweep:' "$OUT/bench.log") | $(tail -n 1 "$OUT/bench.log")"
grep -E "^FAIL" "$OUT/bench.log" | head -n 10 | tee -a "$OUT/summary.txt"
grep -E " us |us/call" "$OUT/bench.log" | tee -a "$OUT/summary.txt"

wait $VPID
for v in $VARS; do
  [ -f $VDEFS/$v.file ] || { log "variant $v: unknown"; continue; }
  grep -q BUILT "$OUT/var_$v.log" || { log "variant $v: build failed or pattern not found"; continue; }
  if [ "$(cat $VDEFS/$v.sweep)" = 1 ]; then
    timeout 100 /tmp/vs_$v/ckb --quick >>"$OUT/var_$v.log" 2>&1
    log "[$v] quick sweep (rc $?): $(tail -n 1 "$OUT/var_$v.log")"
  fi
  timeout 150 /tmp/vs_$v/ckb --time-only --filter "$(cat $VDEFS/$v.filter)" >>"$OUT/var_$v.log" 2>&1
  grep -E " us |us/call" "$OUT/var_$v.log" | sed "s/^/[$v] /" | tee -a "$OUT/summary.txt"
done
log "done in $(( $(date +%s) - t0 )) s"
# At most 8 files come back: fold the sanitizer and variant logs into two.
for f in "$OUT"/san_*.log; do echo "===== $f"; tail -n 30 "$f"; done >"$OUT/sanitizers.txt" 2>/dev/null && rm -f "$OUT"/san_*.log
if [ -n "$VARS" ]; then
  for f in "$OUT"/var_*.log; do echo "===== $f"; cat "$f"; done >"$OUT/variants.txt" 2>/dev/null && rm -f "$OUT"/var_*.log
fi
exit 0
