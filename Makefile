# lmk: the two commands of the quick start, and the build they share.
#
#   make            build build/liblmk.so, build/liblmk.a and build/lmk
#   make run        build, then the main job: a quick `lmk check` and `lmk bench` (its headline cases)
#                   on the default device, and the check's verdict again at the end
#   make test       build, then run the whole test suite (ends with "N passed, N failed, N skipped")
#   make install    build, then install into PREFIX (default /usr/local): include/, lib/ (liblmk.a,
#                   liblmk.so, pkgconfig/lmk.pc, cmake/lmk/), bin/lmk; e.g. make install PREFIX=$HOME/.local
#   make CUDA=1     build the CUDA backend (fails without nvcc); CUDA=0: without it. Default: with it
#                   when nvcc is found and `nvidia-smi -L` lists a GPU, else without (a backend that
#                   cannot run here is minutes of compiling for nothing)
#   make CC=clang   build with another C compiler (use a fresh BUILD directory per compiler)
#
# Hardening targets (sanitizers, fuzzing) live in mk/*.mk.

BUILD  ?= build
# CUDA unset: AUTO (CMake builds the backend when it finds nvcc) where a GPU answers, else OFF.
ifeq ($(origin CUDA),undefined)
  CUDA := $(shell nvidia-smi -L >/dev/null 2>&1 && echo AUTO || echo OFF)
  CUDA_WHY := $(if $(filter OFF,$(CUDA)),no GPU here (nvidia-smi -L lists none): building without CUDA; make CUDA=1 builds it)
endif
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
	@$(if $(CUDA_WHY),echo "-- lmk: $(CUDA_WHY)",true)

all: configure
	@cmake --build $(BUILD) -j $(JOBS)

# The check first (a failure stops here, its verdict the last line), then the bench, then the
# check's verdict once more, so that it is not lost above the table.
run: all
	@{ $(BUILD)/lmk check --quick; echo $$? >$(BUILD)/check.rc; } | tee $(BUILD)/check.log
	@exit $$(cat $(BUILD)/check.rc)
	@echo
	@$(BUILD)/lmk bench
	@echo
	@echo "make run: $$(grep '^check:' $(BUILD)/check.log)"
	@echo "make run: full tables: $(BUILD)/lmk check (every case), $(BUILD)/lmk bench --all; make test: the test suite"

test: all
	@sh tests/run_tests.sh $(BUILD)/tests

install: all
	cmake --install $(BUILD) --prefix $(PREFIX)

clean:
	rm -rf $(BUILD) $(BUILD).configure.log

-include mk/*.mk
