#!/bin/sh
# test_python.sh - runs the Python package's tests (python/tests, pytest) against a built liblmk.so and
# prints one closing line "N passed, N failed, N skipped" for tests/run_tests.sh.
#
#   sh tests/test_python.sh [BUILD_DIR | path/to/liblmk.so]     (default: build/)
#
# CMake copies this file to <build>/tests/test_python with configure_file(... @ONLY), which fills in the two
# paths below, so `make test` runs it from the build tree; run from tests/ it finds the repository itself.
src='@CMAKE_SOURCE_DIR@'
bin='@CMAKE_BINARY_DIR@'
[ -d "$src/python/lmk" ] || { src=$(cd "$(dirname "$0")/.." && pwd); bin="$src/build"; }

lib=${1:-$bin}
[ -d "$lib" ] && lib="$lib/liblmk.so"
if [ ! -f "$lib" ]; then
    echo "FAIL python: no liblmk.so at $lib (build first: make)"
    echo "0 passed, 1 failed, 0 skipped"
    exit 1
fi
# A sanitizer build's library needs its runtime loaded first, which python3 does not do: nothing to test.
if grep -q -a -E '__(asan|tsan|msan)_init|__ubsan_handle_' "$lib"; then
    echo "SKIP python: $lib is built with sanitizers (python3 cannot load it)"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi
py=${PYTHON:-python3}
if ! "$py" -c "import pytest" >/dev/null 2>&1; then
    echo "SKIP python: pytest not installed"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi

# The compiled host path (python/lmk/_host.c), built next to the library and named by LMK_EXTENSION; without
# a C compiler or Python's headers the tests run the ctypes path alone (test_host.py then skips).
libdir=$(cd "$(dirname "$lib")" && pwd)
inc=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
suffix=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX") or ".so")')
cc=${CC:-cc}
if command -v "$cc" >/dev/null 2>&1 && [ -f "$inc/Python.h" ]; then
    ext="$libdir/python-ext/_host$suffix"
    mkdir -p "$libdir/python-ext"
    if ! "$cc" -std=c11 -O2 -fPIC -shared -Wall -Wextra -Werror -I"$inc" -I"$src/include" \
            "$src/python/lmk/_host.c" -o "$ext.tmp" || ! mv -f "$ext.tmp" "$ext"; then
        echo "FAIL python: python/lmk/_host.c does not build"
        echo "0 passed, 1 failed, 0 skipped"
        exit 1
    fi
    export LMK_EXTENSION="$ext" LMK_EXPECT_COMPILED=1
else
    echo "NOTE python: no C compiler ($cc) or no $inc/Python.h: testing the ctypes path alone"
    export LMK_EXTENSION=off
fi

out=$(mktemp)
trap 'rm -f "$out"' EXIT
LMK_LIBRARY=$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib") PYTHONPATH="$src/python${PYTHONPATH:+:$PYTHONPATH}" \
    "$py" -m pytest -q -rs -p no:cacheprovider "$src/python/tests" >"$out" 2>&1
rc=$?
cat "$out"

# pytest's summary, e.g. "3 failed, 120 passed, 4 skipped, 1 error in 2.1s": errors count as failures.
summary=$(grep -E '^=* ?[0-9]+ (passed|failed|skipped|errors?|xfailed|xpassed|deselected)' "$out" | tail -n 1)
count() { printf '%s\n' "$summary" | sed -nE "s/(^|.*[^0-9])([0-9]+) $1([^a-z].*|$)/\\2/p"; }
passed=$(count passed); failed=$(count failed); skipped=$(count skipped); errors=$(count 'errors?')
passed=${passed:-0}; failed=$((${failed:-0} + ${errors:-0})); skipped=${skipped:-0}
# pytest exits 5 when it collected nothing, 2-4 on interruptions and usage errors: never a pass.
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
    echo "!!! pytest exited $rc"
    failed=1
fi
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
