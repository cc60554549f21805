#!/bin/sh
# cuda_h200.sh - the CUDA backend's one-call job on the GPU machine (docs/cuda_notes.md): build with
# CMake, run the test programs, compute-sanitizer (memcheck, racecheck, initcheck) on the CUDA tests,
# the kernel sweep and timing driver (tests/cuda_kernels_bench.c), and timing-only runs of kernel
# variants made from the sources by text substitution (so experiments never enter the tree).
#
#   sh tests/cuda_h200.sh OUTDIR [variants...]     variants: see the table at the end; none = all
#
# Everything is logged under OUTDIR; a summary is printed last.
OUT=${1:?usage: cuda_h200.sh OUTDIR [variants]}; shift
J=$(nproc)
B=build-h200
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

# The test programs (CPU and CUDA cases). LMK_TEST_QUICK keeps the CPU reference work short.
LMK_TEST_QUICK=1 timeout 300 sh tests/run_tests.sh $B/tests >"$OUT/tests.log" 2>&1
log "tests (rc $?): $(tail -n 1 "$OUT/tests.log")"
grep -E "^(FAIL|SKIP|!!!)" "$OUT/tests.log" | head -n 20 | tee -a "$OUT/summary.txt"

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

# Variants: name | file | python replacement (old => new) | timing filter. Each is a full CMake
# build of a copy of the tree (sm_90 only), checked with the quick sweep, then timed.
variant() {
  name=$1 file=$2 old=$3 new=$4 filter=$5
  rm -rf /tmp/vs && mkdir -p /tmp/vs && tar --exclude='./build*' --exclude=./.git -cf - . | (cd /tmp/vs && tar xf -)
  python3 - "/tmp/vs/src/cuda/$file" "$old" "$new" <<'EOF' || { log "variant $name: pattern not found"; return; }
import sys
p, old, new = sys.argv[1:4]
s = open(p).read()
if old not in s:
    sys.exit(1)
open(p, "w").write(s.replace(old, new))
EOF
  { cmake -S /tmp/vs -B /tmp/vs/b -DCMAKE_BUILD_TYPE=Release -DLMK_CUDA=ON -DLMK_BUILD_TESTS=OFF -DCMAKE_CUDA_ARCHITECTURES=90-real &&
    cmake --build /tmp/vs/b -j "$J" --target lmk_static && gcc $CFLAGS $DRV /tmp/vs/b/liblmk.a $LINK -o /tmp/ckb_var; } >"$OUT/var_$name.log" 2>&1 ||
    { log "variant $name: build failed"; return; }
  timeout 100 /tmp/ckb_var --quick >>"$OUT/var_$name.log" 2>&1
  log "[$name] quick sweep (rc $?): $(tail -n 1 "$OUT/var_$name.log")"
  timeout 100 /tmp/ckb_var --time-only --filter "$filter" >>"$OUT/var_$name.log" 2>&1
  grep -E " us |us/call" "$OUT/var_$name.log" | sed "s/^/[$name] /" | tee -a "$OUT/summary.txt"
}
VARS=${*:-items2k small direct}
want() { case " $VARS " in *" $1 "*) return 0 ;; esac; return 1; }
want items2k && variant items2k rope_multi.cu "constexpr uint32_t kBlockItems = 1024;" "constexpr uint32_t kBlockItems = 2048;" "rope"
want small && variant small rope_multi.cu "constexpr int kRotBatch = 2;          /* pair items a thread loads (two units each) before storing */
constexpr int kCopyBatch = 4;" "constexpr int kRotBatch = 1; constexpr int kCopyBatch = 2;" "rope"
want direct && variant direct rope_multi.cu "rope_multi_kernel<DT, VE><<<blocks, kThreads, 0, st>>>(p);" "void *args[] = {(void *)&p}; (void)cudaLaunchKernel((const void *)rope_multi_kernel<DT, VE>, blocks, dim3(kThreads), args, 0, st);" "T=1"
log "done in $(( $(date +%s) - t0 )) s"
# At most 8 files come back: fold the sanitizer and variant logs into two.
for f in "$OUT"/san_*.log; do echo "===== $f"; tail -n 30 "$f"; done >"$OUT/sanitizers.txt" 2>/dev/null && rm -f "$OUT"/san_*.log
for f in "$OUT"/var_*.log; do echo "===== $f"; cat "$f"; done >"$OUT/variants.txt" 2>/dev/null && rm -f "$OUT"/var_*.log
