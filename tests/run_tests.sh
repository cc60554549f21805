#!/bin/sh
# Runs every test program in the given directory and sums their closing lines
# ("N passed, N failed, N skipped") into one. Exits non-zero if any program failed or crashed.
dir=${1:-build/tests}
pass=0 fail=0 skip=0 crashed=0
for t in "$dir"/test_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    echo "=== $name"
    out=$("$t" 2>&1); rc=$?
    printf '%s\n' "$out"
    line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
    if [ -z "$line" ]; then
        echo "!!! $name printed no summary (exit $rc)"
        crashed=$((crashed + 1)); fail=$((fail + 1)); continue
    fi
    p=$(echo "$line" | sed -E 's/^([0-9]+) passed.*/\1/')
    f=$(echo "$line" | sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/')
    s=$(echo "$line" | sed -nE 's/.*, ([0-9]+) skipped.*/\1/p')
    pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + ${s:-0}))
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "!!! $name exited $rc"; fail=$((fail + 1))
    fi
done
echo "=== all test programs"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
