# lmk: the two commands of the quick start, and the build they share.
#
#   make            build build/liblmk.so, build/liblmk.a and build/lmk
#   make run        build, then the main job: a quick `lmk check` and `lmk bench` on the default device
#   make test       build, then run the whole test suite (ends with "N passed, N failed, N skipped")
#   make install    build, then install into PREFIX (default /usr/local): include/, lib/ (liblmk.a,
#                   liblmk.so, pkgconfig/lmk.pc, cmake/lmk/), bin/lmk; e.g. make install PREFIX=$HOME/.local
#   make CUDA=0     build without the CUDA backend (default: with it when nvcc is found)
#   make CC=clang   build with another C compiler (use a fresh BUILD directory per compiler)
#
# Hardening targets (sanitizers, fuzzing) live in mk/*.mk.

BUILD  ?= build
CUDA   ?= AUTO
TYPE   ?= Release
JOBS   ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=
PREFIX ?= /usr/local

# cmake --build runs make again below this one: without this every line of the build would come
# between "Entering directory" and "Leaving directory" lines.
MAKEFLAGS += --no-print-directory

.PHONY: all configure run test install clean
.DEFAULT_GOAL := all

configure:
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(TYPE) -DLMK_CUDA=$(CUDA) -DCMAKE_C_COMPILER=$(CC) $(CMAKE_FLAGS) >$(BUILD).configure.log 2>&1 \
	  || { cat $(BUILD).configure.log; exit 1; }
	@grep -h "lmk:" $(BUILD).configure.log || true

all: configure
	@cmake --build $(BUILD) -j $(JOBS)

run: all
	$(BUILD)/lmk check --quick
	$(BUILD)/lmk bench

test: all
	@sh tests/run_tests.sh $(BUILD)/tests

install: all
	cmake --install $(BUILD) --prefix $(PREFIX)

clean:
	rm -rf $(BUILD) $(BUILD).configure.log

-include mk/*.mk
