#!/bin/sh
# Runs every test program in the given directory and sums their closing lines
# ("N passed, N failed, N skipped") into one, the last line (CI reads it). A program that passes
# shows one line, its own summary; one that fails, crashes or prints no summary shows its whole
# output. LMK_TEST_VERBOSE=1 shows every program's output. Exits non-zero if any program failed.
dir=${1:-build/tests}
pass=0 fail=0 skip=0
for t in "$dir"/test_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    start=$(date +%s)
    out=$("$t" 2>&1); rc=$?
    secs=$(( $(date +%s) - start ))
    line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
    if [ -z "$line" ]; then
        echo "=== $name"
        printf '%s\n' "$out"
        echo "!!! $name printed no summary (exit $rc)"
        fail=$((fail + 1))
        continue
    fi
    p=$(echo "$line" | sed -E 's/^([0-9]+) passed.*/\1/')
    f=$(echo "$line" | sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/')
    s=$(echo "$line" | sed -nE 's/.*, ([0-9]+) skipped.*/\1/p')
    pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + ${s:-0}))
    if [ "$f" -ne 0 ] || [ "$rc" -ne 0 ] || [ -n "$LMK_TEST_VERBOSE" ]; then
        echo "=== $name"
        printf '%s\n' "$out"
        if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
            echo "!!! $name exited $rc"
            fail=$((fail + 1))
        fi
    else
        printf '%-20s %s (%s s)\n' "$name" "$line" "$secs"
    fi
done
echo "=== all test programs"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
