#!/bin/bash
# bench/rope_variants.sh - one timing run of the CUDA rope kernel's compile-time variants.
#
# Builds the lmk tool once per variant of src/ops/rope/cuda.cu (-DLMK_ROPE_VARIANT=n through
# CMAKE_CUDA_FLAGS, one build directory each, sm_90 only, all in parallel), plus "v8": the kernel as
# committed in 108d24f (bench/rope_v8.cu, built from a copy of the tree), the same-run baseline for
# the figures measured before. Then, one variant at a time: `lmk check --backend cuda --op rope
# --quick` (every mode against the float64 reference) and `lmk bench --backend cuda --op rope` at
# T = 1 and 4106 (f32 and bf16) and T = 16384 (bf16: the in-place case runs at the longest T).
# Variant 0 runs first and again last ("0b", same build) to show the run's drift.
# docs/cuda_notes.md (version 9) says what each variant is and what it should move.
#
# Usage, on the GPU machine from the repository root:  bash bench/rope_variants.sh [variant ...]
# (default: 0 v8 4 3 1 5 6 2 0b). Prints one table at the end; everything (build logs, checks, the raw
# JSON) goes to $OUT/variants.txt and the parsed results to $OUT/variants.json ($OUT defaults to
# ./build-rv-out). Stops starting new variants after LMK_RV_BUDGET seconds (default 420).
set -u
cd "$(dirname "$0")/.." || exit 2
ROOT=$(pwd)
OUT=${OUT:-$ROOT/build-rv-out}
mkdir -p "$OUT"
LOG=$OUT/variants.txt
RAW=$OUT/raw
mkdir -p "$RAW"
: >"$LOG"
VARIANTS=${*:-0 v8 4 3 1 5 6 2 0b}
BUDGET=${LMK_RV_BUDGET:-420}
BACKEND=${LMK_RV_BACKEND:-cuda} # cpu: to try the script itself on a machine without a GPU
NCPU=$(nproc 2>/dev/null || echo 8)
T0=$(date +%s)
say() { echo "$*" | tee -a "$LOG"; }
elapsed() { echo $(($(date +%s) - T0)); }

say "# rope variants: $VARIANTS ($(date -u +%FT%TZ), $NCPU CPUs)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader >>"$LOG" 2>&1

# ---- builds (parallel) ----
builds=""
for v in $VARIANTS; do
    case $v in 0b) continue ;; esac
    builds="$builds $v"
done
nb=$(echo $builds | wc -w)
jobs_each=$(( (NCPU + nb - 1) / nb + 1 ))
build_one() {
    local v=$1 src=$ROOT bd=$ROOT/build-rv$1 flags=""
    if [ "$v" = v8 ]; then
        src=/tmp/lmk-rv8-src
        rm -rf "$src" && mkdir -p "$src"
        tar -C "$ROOT" --exclude='./build*' --exclude='./.git' -cf - . | tar -C "$src" -xf -
        cp "$ROOT/bench/rope_v8.cu" "$src/src/ops/rope/cuda.cu"
    else
        flags="-DLMK_ROPE_VARIANT=$v"
    fi
    # an existing build directory (a second run) is built incrementally
    cmake -S "$src" -B "$bd" -DLMK_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90-real \
        -DLMK_BUILD_TESTS=OFF "-DCMAKE_CUDA_FLAGS=$flags" >"$RAW/build-$v.log" 2>&1 &&
        cmake --build "$bd" --target lmk_tool -j"$jobs_each" >>"$RAW/build-$v.log" 2>&1
}
for v in $builds; do
    build_one "$v" &
done
wait
for v in $builds; do
    if [ -x "$ROOT/build-rv$v/lmk" ]; then
        say "built $v"
    else
        say "BUILD FAILED $v:"
        tail -20 "$RAW/build-$v.log" | tee -a "$LOG"
    fi
done
say "# builds done at $(elapsed) s"

# ---- check and time, one variant at a time ----
ran=""
for v in $VARIANTS; do
    b=$v
    [ "$v" = 0b ] && b=0
    tool=$ROOT/build-rv$b/lmk
    [ -x "$tool" ] || continue
    if [ "$(elapsed)" -ge "$BUDGET" ]; then
        say "# skipped $v and later: $(elapsed) s used of $BUDGET"
        break
    fi
    if [ "$v" != 0b ]; then
        "$tool" check --backend "$BACKEND" --op rope --quick >"$RAW/check-$v.txt" 2>&1
        rc=$?
        say "check $v: $(grep -E '^rope ' "$RAW/check-$v.txt" | tail -1) (exit $rc)"
    fi
    "$tool" bench --backend "$BACKEND" --op rope --T "${LMK_RV_T:-1,4106}" --json >"$RAW/bench-$v.json" 2>"$RAW/bench-$v.err"
    rc=$?
    "$tool" bench --backend "$BACKEND" --op rope --T "${LMK_RV_TLONG:-16384}" --dtype bf16 --json >>"$RAW/bench-$v.json" 2>>"$RAW/bench-$v.err"
    say "bench $v: exit $rc $?, $(elapsed) s"
    ran="$ran $v"
done

{
    for f in "$RAW"/check-*.txt "$RAW"/bench-*.json "$RAW"/bench-*.err; do
        [ -f "$f" ] && { echo "==== $f"; cat "$f"; }
    done
    for v in $builds; do
        echo "==== build $v (ptxas warnings, errors)"
        grep -iE 'warning|error' "$RAW/build-$v.log" | head -20
    done
} >>"$LOG"

# ---- one table ----
python3 - "$RAW" "$OUT/variants.json" $ran <<'EOF' | tee -a "$LOG"
import json, re, sys
raw, out, variants = sys.argv[1], sys.argv[2], sys.argv[3:]

def cases_of(path):
    """lmk bench --json prints one JSON array per invocation; read them all."""
    text = open(path).read()
    rows, dec, i = [], json.JSONDecoder(), 0
    while True:
        j = text.find('[', i)
        if j < 0:
            return rows
        try:
            val, i = dec.raw_decode(text, j)
        except ValueError:
            i = j + 1
            continue
        rows += [r for r in val if isinstance(r, dict)]

def label(r):
    c = r.get('case', '')
    kind = ('QK-inpl' if 'in-place' in c else 'QK') if 'rope_multi_qk' in c else \
           'Llama' if 'neox' in c else 'Q' if 'nh=24 ' in c else 'K' if 'nh=4 ' in c else c[:12]
    return '%-7s T=%-5s %-4s' % (kind, r.get('T'), r.get('dtype'))

res, order = {}, []
for v in variants:
    try:
        rows = cases_of('%s/bench-%s.json' % (raw, v))
    except OSError:
        rows = []
    for r in rows:
        k = label(r)
        if k not in order:
            order.append(k)
        res.setdefault(k, {})[v] = (r.get('time_us'), r.get('fraction'))
json.dump({k: {v: {'time_us': t, 'fraction': f} for v, (t, f) in d.items()} for k, d in res.items()},
          open(out, 'w'), indent=1)
print('%-20s' % 'case (us, fraction)' + ''.join('%12s' % v for v in variants))
for k in order:
    cells = []
    for v in variants:
        t, f = res[k].get(v, (None, None))
        if t is None:
            cells.append('%12s' % '-')
        elif ' T=1 ' in k:
            cells.append('%12.3f' % t)
        else:
            cells.append('%7.2f %.2f' % (t, f if f is not None else float('nan')))
    print('%-20s' % k + ''.join(cells))
EOF
say "# done in $(elapsed) s; full log $LOG"
