#!/bin/sh
# tests/test_install.sh [BUILD_DIR] - lmk as its users get it: installed, then linked three ways.
#
# Installs the build (default: the one this copy was configured in, else ./build) into a temporary
# prefix, then builds examples/hello.c against the installed copy
#   (a) shared:  cc hello.c $(pkg-config --cflags --libs lmk) -Wl,-rpath,<libdir>
#   (b) static:  liblmk.a plus `pkg-config --static --libs lmk` (CUDA's static runtime included)
#   (c) CMake:   find_package(lmk REQUIRED) with lmk::lmk (and lmk::lmk_static)
# runs each program without LD_LIBRARY_PATH and checks the numbers it prints against cos/sin
# computed here by awk; and (d) builds a parent project that add_subdirectory()s lmk (CPU only):
# the library must be built, no test, tool or fuzzer. Every version it meets (lmk --version, the
# library file's name, lmk.pc, what hello prints, find_package's check) must be lmk.h's.
# CMake copies this file to <build>/tests/test_install with the directories below filled in, so
# `make test` (tests/run_tests.sh) runs it. Ends with "N passed, N failed, N skipped".

src='@PROJECT_SOURCE_DIR@'
build='@PROJECT_BINARY_DIR@'
with_cuda='@LMK_WITH_CUDA@'
version='@PROJECT_VERSION@'
[ -f "$src/include/lmk.h" ] || src=$(cd "$(dirname "$0")/.." && pwd) # run from the source tree
case $version in [0-9]*) ;; *) # not configured: the version's one place, lmk.h's three macros
    version=$(for p in MAJOR MINOR PATCH; do sed -n "s/^#define LMK_VERSION_$p  *\([0-9][0-9]*\) *$/\1/p" \
        "$src/include/lmk.h"; done | paste -sd. -) ;;
esac
[ -f "$build/CMakeCache.txt" ] || build=build
if [ $# -gt 0 ]; then build=$1 with_cuda=; fi # another build: find out below whether it has CUDA

pass=0 fail=0 skip=0
finish() {
    echo "$pass passed, $fail failed, $skip skipped"
    [ "$fail" -eq 0 ]
    exit
}
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
skip_all() { echo "SKIP install: $1"; skip=$((skip + 1)); finish; }
skip_one() { echo "SKIP $1"; skip=$((skip + 1)); }

case $build in /*) ;; *) build=$(pwd)/$build ;; esac
[ -f "$build/CMakeCache.txt" ] || { bad "no configured build in $build"; finish; }
cache() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt" | head -n 1; }
cmake=$(cache CMAKE_COMMAND)
cc=$(cache CMAKE_C_COMPILER)
libdir=$(cache CMAKE_INSTALL_LIBDIR)
case $with_cuda in
ON | OFF) ;;
*) # not configured by CMake: CUDA is on when LMK_CUDA allows it and CMake enabled the language
    with_cuda=OFF
    case $(cache LMK_CUDA | tr a-z A-Z) in OFF | 0 | NO | FALSE) ;; *)
        ls "$build"/CMakeFiles/*/CMakeCUDACompiler.cmake >/dev/null 2>&1 && with_cuda=ON ;;
    esac ;;
esac

command -v pkg-config >/dev/null 2>&1 || skip_all "pkg-config not found (apt-get install pkg-config)"
case $(cache LMK_SANITIZE) in "" | OFF) ;; *) # a program without -fsanitize cannot link or load that library
    skip_all "the build uses sanitizers ($(cache LMK_SANITIZE))" ;;
esac
[ "$(cache LMK_INSTALL)" = ON ] || skip_all "the build in $build has no install rules (LMK_INSTALL=$(cache LMK_INSTALL))"
[ -n "$cmake" ] || cmake=cmake
[ -n "$libdir" ] || libdir=lib
[ -n "$cc" ] || cc=cc

tmp=$(mktemp -d "${TMPDIR:-/tmp}/lmk-install-test.XXXXXX") || { bad "mktemp"; finish; }
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' HUP INT TERM
prefix=$tmp/prefix
warn="-std=c11 -Wall -Wextra -Werror"
hello=$src/examples/hello.c
unset LD_LIBRARY_PATH

# run NAME LOG CMD...: runs CMD with its output in LOG; on failure shows the log's end.
run() {
    run_name=$1 run_log=$2
    shift 2
    if "$@" >"$run_log" 2>&1; then
        return 0
    fi
    bad "$run_name: $*"
    tail -n 25 "$run_log" | sed 's/^/    /'
    return 1
}

# check_hello NAME PROGRAM [CUDA]: runs it and compares what it printed with cos/sin computed here;
# its build info must say cuda=yes exactly when CUDA (default: this build's) is ON.
check_hello() {
    name=$1 prog=$2 want_cuda=${3:-$with_cuda}
    run "$name: run" "$tmp/hello_$name.out" "$prog" || return 1
    if ! awk -v cuda="$want_cuda" -v version="$version" '
        function fail(msg) { print "    " msg; bad = 1 }
        function abs(v) { return v < 0 ? -v : v }
        NR == 1 {
            if ($1 != "lmk" || $2 != version) fail("first line: " $0 " (want lmk " version ")")
            if ((cuda == "ON") != (index($0, "cuda=yes") > 0)) fail("build info says " $0 " but CUDA is " cuda)
        }
        /^device: / { dev = ($2 == "cpu") }
        /^token / {
            t = $2; p = $4; h = $6 + 0
            if (p != (t == 0 ? 0 : t == 1 ? 1 : 5)) fail("token " t " has position " p)
            i0 = (t * 2 + h) * 4
            for (d = 0; d < 4; d++) x[d] = 0.25 * (i0 + d + 1)
            for (q = 0; q < 2; q++) {        # pair (x[q], x[q+2]), angle p * 10000^(-2q/4)
                th = p * exp(-q / 2 * log(10000))
                e[q] = x[q] * cos(th) - x[q + 2] * sin(th)
                e[q + 2] = x[q] * sin(th) + x[q + 2] * cos(th)
            }
            for (d = 0; d < 4; d++)
                if (abs($(7 + d) - e[d]) > 2e-5) fail("token " t " head " h " [" d "]: got " $(7 + d) ", want " e[d])
            seen[t, h] = 1; n++
        }
        END {
            if (!dev) fail("no \"device: cpu\" line")
            if (n != 6) fail(n " token lines, want 6")
            for (t = 0; t < 3; t++) for (h = 0; h < 2; h++) if (!seen[t, h]) fail("no line for token " t " head " h)
            exit bad
        }' "$tmp/hello_$name.out"; then
        bad "$name: wrong output:"
        sed 's/^/    | /' "$tmp/hello_$name.out"
        return 1
    fi
    ok "$name: printed the expected rotation"
}

# needs PROGRAM LIB: whether PROGRAM's dynamic section lists LIB (a prefix of the name).
needs() { LC_ALL=C readelf -d "$1" 2>/dev/null | grep NEEDED | grep -q "\[$2"; }
have_readelf=0
command -v readelf >/dev/null 2>&1 && have_readelf=1

# ---- install ----
echo "install: $build -> temporary prefix (CUDA $with_cuda, $cc)"
run "cmake --install" "$tmp/install.log" "$cmake" --install "$build" --prefix "$prefix" || finish
missing=""
for f in include/lmk.h "$libdir/liblmk.a" "$libdir/liblmk.so" "$libdir/liblmk.so.0" bin/lmk \
    "$libdir/pkgconfig/lmk.pc" "$libdir/cmake/lmk/lmkConfig.cmake" "$libdir/cmake/lmk/lmkConfigVersion.cmake" \
    "$libdir/cmake/lmk/lmkTargets.cmake"; do
    [ -e "$prefix/$f" ] || missing="$missing $f"
done
if [ "$with_cuda" = ON ]; then [ -e "$prefix/include/lmk_cuda.h" ] || missing="$missing include/lmk_cuda.h"; fi
if [ -z "$missing" ]; then ok "install: headers, liblmk.a, liblmk.so, bin/lmk, lmk.pc, lmk CMake package"; else
    bad "install: missing$missing"; fi
if [ $have_readelf = 1 ]; then
    if LC_ALL=C readelf -d "$prefix/$libdir/liblmk.so" | grep -q 'SONAME.*\[liblmk\.so\.0\]'; then
        ok "liblmk.so has soname liblmk.so.0"
    else bad "liblmk.so soname: $(LC_ALL=C readelf -d "$prefix/$libdir/liblmk.so" | grep SONAME)"; fi
else skip_one "liblmk.so's soname: readelf not found (apt-get install binutils)"; fi
# Only lmk_* leaves liblmk.so: a toolchain that links pieces of libstdc++ into it once exported
# __cxa_* too, and the static link below then pulled in liblmk.so for them.
if command -v nm >/dev/null 2>&1; then
    others=$(LC_ALL=C nm -D --defined-only "$prefix/$libdir/liblmk.so" | awk '$3 !~ /^lmk_/ {print $3}' | head -n 5)
    [ -z "$others" ] && ok "liblmk.so exports lmk_* only" || bad "liblmk.so exports more than lmk_*: $(echo $others)"
else skip_one "liblmk.so's exports: nm not found (apt-get install binutils)"; fi
if run "bin/lmk info" "$tmp/tool.out" "$prefix/bin/lmk" info; then
    if head -n 1 "$tmp/tool.out" | grep -q '^lmk [0-9]'; then ok "installed bin/lmk runs"; else
        bad "bin/lmk info printed: $(head -n 1 "$tmp/tool.out")"; fi
fi
# One version everywhere (lmk.h's macros): the tool, the library file's name; lmk.pc and hello below.
tool_version=$("$prefix/bin/lmk" --version 2>&1)
[ "$tool_version" = "lmk $version" ] && ok "lmk --version: $tool_version" ||
    bad "lmk --version printed '$tool_version', want 'lmk $version'"
[ -e "$prefix/$libdir/liblmk.so.$version" ] && ok "liblmk.so.$version installed" ||
    bad "no $libdir/liblmk.so.$version: $(ls "$prefix/$libdir" | tr '\n' ' ')"

# ---- (a) pkg-config, shared library, rpath ----
export PKG_CONFIG_PATH="$prefix/$libdir/pkgconfig"
if ! pkg-config --exists lmk; then
    bad "pkg-config does not find lmk.pc in $PKG_CONFIG_PATH"
else
    pc_libdir=$(pkg-config --variable=libdir lmk)
    pc_version=$(pkg-config --modversion lmk)
    [ "$pc_version" = "$version" ] && ok "lmk.pc: version $version" || bad "lmk.pc: version $pc_version, want $version"
    [ "$pc_libdir" = "$prefix/$libdir" ] && ok "lmk.pc: libdir is the install prefix's" ||
        bad "lmk.pc: libdir $pc_libdir, want $prefix/$libdir"
    # shellcheck disable=SC2046 # word splitting of pkg-config's output is intended
    if run "shared: link" "$tmp/shared.log" "$cc" $warn -o "$tmp/hello_shared" "$hello" \
        $(pkg-config --cflags --libs lmk) "-Wl,-rpath,$pc_libdir"; then
        if [ $have_readelf = 1 ] && ! needs "$tmp/hello_shared" liblmk.so.0; then
            bad "shared: hello does not need liblmk.so.0"
        else
            check_hello shared "$tmp/hello_shared"
        fi
    fi

    # ---- (b) pkg-config --static: liblmk.a and what it needs (with CUDA: the static runtime) ----
    static_libs=$(pkg-config --static --libs lmk)
    if [ "$with_cuda" = ON ]; then
        case $static_libs in *-lcudart_static*-lstdc++*) ;; *) bad "static: pkg-config --static --libs lmk lacks CUDA: $static_libs" ;; esac
    fi
    # The README's line: -Bstatic picks liblmk.a over liblmk.so; --as-needed drops the unused
    # liblmk.so that pkg-config's own -llmk then names.
    # shellcheck disable=SC2046,SC2086
    if run "static: link" "$tmp/static.log" "$cc" $warn -o "$tmp/hello_static" "$hello" $(pkg-config --cflags lmk) \
        -Wl,--as-needed -Wl,-Bstatic -llmk -Wl,-Bdynamic $static_libs; then
        if [ $have_readelf = 1 ] && needs "$tmp/hello_static" liblmk; then
            bad "static: hello needs a shared liblmk"
        else
            check_hello static "$tmp/hello_static"
        fi
    fi
fi

# ---- (c) CMake: find_package(lmk) ----
mkdir -p "$tmp/consumer"
cat >"$tmp/consumer/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.18)
project(lmk_consumer LANGUAGES C)
find_package(lmk $version REQUIRED)
add_executable(hello_cmake "$hello")
target_link_libraries(hello_cmake PRIVATE lmk::lmk)
add_executable(hello_cmake_static "$hello")
target_link_libraries(hello_cmake_static PRIVATE lmk::lmk_static)
EOF
if run "find_package: configure" "$tmp/consumer.log" "$cmake" -S "$tmp/consumer" -B "$tmp/consumer/build" \
    -DCMAKE_C_COMPILER="$cc" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON \
    "-DCMAKE_C_FLAGS=$warn" &&
    run "find_package: build" "$tmp/consumer.log" "$cmake" --build "$tmp/consumer/build" -j 2; then
    found=$(sed -n 's/^lmk_DIR:[A-Z]*=//p' "$tmp/consumer/build/CMakeCache.txt")
    [ "$found" = "$prefix/$libdir/cmake/lmk" ] && ok "find_package found the installed lmk" ||
        bad "find_package found lmk in $found"
    if [ $have_readelf = 1 ] && ! needs "$tmp/consumer/build/hello_cmake" liblmk.so.0; then
        bad "find_package: lmk::lmk did not link liblmk.so"
    else
        check_hello cmake "$tmp/consumer/build/hello_cmake"
    fi
    if [ $have_readelf = 1 ] && needs "$tmp/consumer/build/hello_cmake_static" liblmk; then
        bad "find_package: lmk::lmk_static linked a shared liblmk"
    else
        check_hello cmake_static "$tmp/consumer/build/hello_cmake_static"
    fi
fi

# ---- (d) add_subdirectory(lmk) from a parent project: the library only ----
mkdir -p "$tmp/parent"
cat >"$tmp/parent/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.18)
project(parent LANGUAGES C)
add_subdirectory("$src" lmk)
add_executable(hello_subdir "$hello")
target_link_libraries(hello_subdir PRIVATE lmk::lmk)
EOF
if run "add_subdirectory: configure" "$tmp/parent.log" "$cmake" -S "$tmp/parent" -B "$tmp/parent/build" \
    -DCMAKE_C_COMPILER="$cc" -DLMK_CUDA=OFF &&
    run "add_subdirectory: build" "$tmp/parent.log" "$cmake" --build "$tmp/parent/build" -j 2; then
    extra=$("$cmake" --build "$tmp/parent/build" --target help 2>/dev/null |
        grep -E 'test_|lmk_tool|lmk_test_common|fuzz_' | tr '\n' ' ')
    built=$(cd "$tmp/parent/build" && find . -type f -perm -u+x \( -name 'test_*' -o -name lmk -o -name 'fuzz_*' \) | tr '\n' ' ')
    if [ -z "$extra$built" ] && [ -e "$tmp/parent/build/lmk/liblmk.so" ] && [ -e "$tmp/parent/build/lmk/liblmk.a" ]; then
        ok "add_subdirectory: built liblmk only (no tests, tool or fuzzers)"
    else
        bad "add_subdirectory: targets [$extra] files [$built]"
        ls "$tmp/parent/build/lmk" | sed 's/^/    /'
    fi
    check_hello subdir "$tmp/parent/build/hello_subdir" OFF
    if run "add_subdirectory: install" "$tmp/parent.log" "$cmake" --install "$tmp/parent/build" --prefix "$tmp/parent-prefix"; then
        [ -e "$tmp/parent-prefix/include/lmk.h" ] && bad "add_subdirectory: the parent's install installs lmk (LMK_INSTALL should default off)" ||
            ok "add_subdirectory: the parent's install leaves lmk out"
    fi
fi

finish
