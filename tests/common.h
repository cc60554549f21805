/*
 * common.h - what the test programs share beside the harness.
 *
 * The helpers the tests share with the `lmk` tool and the fuzzers live in testkit/ (included
 * here): the random-number generator and random tensors, comparisons (bits, ulps, the rope
 * precision contract against lmk_ref_rope_f64), poison and guarded device memory, real model
 * shapes and case names, and the ops' case descriptors (src/ops/<op>/case.c) with their registry
 * tst_ops[]. What only the tests need is here, each piece in its own tests/common_*.c:
 *  - common_rng.c:     the program seed (LMK_TEST_SEED, else time-varied; printed), per-case seeds,
 *                      LMK_TEST_QUICK, and the seed library's own test generator;
 *  - common_buf.c:     backend iteration (CPU always, CUDA when a GPU is usable, else a visible
 *                      "SKIP cuda: ..." line), device buffers made from host arrays, and
 *                      error-message checks. These count harness cases.
 *
 * Tests call the library only through lmk.h, except the float64 references and the argument
 * structs they take, which come from core/internal.h.
 */
#ifndef LMK_TEST_COMMON_H
#define LMK_TEST_COMMON_H

#include "core/internal.h"
#include "harness.h"
#include "ops/repeat/case.h"
#include "ops/rope/rope.h"
#include "lmk.h"
#include "testkit.h"
#include "testkit_ref.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A case that failed or passed unconditionally (CHECK with a constant condition would warn). */
#define TST_FAIL(...) ((void)CHECK(0, __VA_ARGS__))
#define TST_PASS(what) ((void)CHECK(1, "%s", what))
/* Like CHECK, but counts only a failure: for setup steps inside a case, so that the counts stay
 * one per case. Evaluates to cond. */
#define TST_REQUIRE(cond, ...) ((cond) ? 1 : (TST_FAIL(__VA_ARGS__), 0))

/* ---- seeds (common_rng.c) ---- */

/* The program's seed: LMK_TEST_SEED (decimal or 0x hex) when set, else time and pid. Printed once,
 * on the first call, as "seed 0x... (LMK_TEST_SEED=0x... reproduces this run)". */
uint64_t tst_program_seed(void);
/* A fresh seed for one case, drawn from a generator seeded with the program seed. Failure
 * messages print it. */
uint64_t tst_case_seed(void);
/* LMK_TEST_QUICK set to a non-empty value other than "0": shrink the big shapes. */
bool tst_quick(void);

/* The seed library's test RNG: seed = seed*1103515245 + 12345 (u32, wrapping), then
 * value = (float)(int32)seed / 2147483648.0f. */
float tst_seed_rng_next(uint32_t *seed);

/* ---- devices, buffers, messages (common_buf.c) ---- */

#define TST_MAX_DEVS 4

typedef struct tst_dev {
    char name[32];              /* "cpu", "cuda:0" */
    lmk_backend backend;
    lmk_device *dev;
    lmk_stream *stream;
    bool isa_variant;           /* a CPU device capped below its best level (tst_devs_open_isas) */
} tst_dev;

/* Opens a device and a stream for every backend available: the CPU always, CUDA device 0 when
 * lmk_device_count(LMK_BACKEND_CUDA) > 0, otherwise a visible "SKIP cuda: ..." line. Counts one
 * case per device opened. Returns how many were opened. */
int  tst_devs_open(tst_dev devs[TST_MAX_DEVS]);
/* tst_devs_open, plus CPU devices capped at each lower instruction-set level of the CPU backend
 * ("cpu/avx2/3t", "cpu/scalar/5t", through the LMK_CPU_ISA variable that src/cpu reads at device
 * open), with streams of 3 and 5 threads, so one machine tests every CPU path and uneven splits.
 * Nothing extra when the caller set LMK_CPU_ISA. */
int  tst_devs_open_isas(tst_dev devs[TST_MAX_DEVS]);
void tst_devs_close(tst_dev *devs, int n);

/* A buffer of dtype with the given shape (ndim 0: 1-D [used/size]) and byte_len used + extra,
 * where used is the shape's bytes. Its first `init_len` bytes are written from init (may be NULL),
 * and the rest is filled with `fill` when fill >= 0. Returns NULL (after a failed CHECK) on error. */
lmk_buffer *tst_buf(lmk_device *dev, lmk_dtype dtype, const size_t *shape, int ndim, size_t used,
                    size_t extra, const void *init, size_t init_len, int fill);
/* The whole buffer read into a fresh host array (free with free()); NULL after a failed CHECK. */
void *tst_read_all(const lmk_buffer *b);

/* Whether this thread's lmk_last_error() contains every one of the NULL-terminated strings. */
bool tst_msg_has(const char *first, ...);

#endif /* LMK_TEST_COMMON_H */
