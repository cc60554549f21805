/*
 * common.h - what the test programs share beside the harness.
 *
 * The pieces, each in its own tests/common_*.c:
 *  - common_rng.c:     a seeded PRNG, the program seed (LMK_TEST_SEED, else time-varied; printed),
 *                      LMK_TEST_QUICK, and random fills of f32/bf16/f16 tensors;
 *  - common_buf.c:     backend iteration (CPU always, CUDA when a GPU is usable, else a visible
 *                      "SKIP cuda: ..." line), device buffers made from host arrays, poison and
 *                      guard bytes around outputs, and error-message checks;
 *  - common_cmp.c:     bit compare, f32 absolute tolerance, bf16/f16 "one ulp of the float64 result
 *                      plus 1e-6", and the rope comparison against lmk_ref_rope_f64_tokens (chunked
 *                      over tokens, so prompt-length shapes need no huge float64 buffers);
 *  - common_cases.c:   the real model shapes both ops are tested on, with case names printed the way
 *                      ggml's test-backend-ops prints them.
 *
 * Tests call the library only through lmk.h, except the float64 references and the argument
 * structs they take, which come from core/internal.h.
 */
#ifndef LMK_TEST_COMMON_H
#define LMK_TEST_COMMON_H

#include "core/internal.h"
#include "harness.h"
#include "ops/repeat/repeat.h"
#include "ops/rope/rope.h"
#include "lmk.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A case that failed or passed unconditionally (CHECK with a constant condition would warn). */
#define TST_FAIL(...) ((void)CHECK(0, __VA_ARGS__))
#define TST_PASS(what) ((void)CHECK(1, "%s", what))
/* Like CHECK, but counts only a failure: for setup steps inside a case, so that the counts stay
 * one per case. Evaluates to cond. */
#define TST_REQUIRE(cond, ...) ((cond) ? 1 : (TST_FAIL(__VA_ARGS__), 0))

/* ---- PRNG and seeds (common_rng.c) ---- */

typedef struct tst_rng {
    uint64_t s[4]; /* xoshiro256** state */
} tst_rng;

tst_rng  tst_rng_make(uint64_t seed);
uint64_t tst_rng_u64(tst_rng *r);
uint32_t tst_rng_u32(tst_rng *r);
uint32_t tst_rng_below(tst_rng *r, uint32_t n);        /* uniform in [0, n), n > 0 */
double   tst_rng_uniform(tst_rng *r, double lo, double hi); /* uniform in [lo, hi) */

/* The program's seed: LMK_TEST_SEED (decimal or 0x hex) when set, else time and pid. Printed once,
 * on the first call, as "seed 0x... (LMK_TEST_SEED=0x... reproduces this run)". */
uint64_t tst_program_seed(void);
/* A fresh seed for one case, drawn from a generator seeded with the program seed. Failure
 * messages print it. */
uint64_t tst_case_seed(void);
/* LMK_TEST_QUICK set to a non-empty value other than "0": shrink the big shapes. */
bool tst_quick(void);
/* Seconds from an arbitrary start (monotonic clock). */
double tst_now(void);

/* n elements of dtype (f32, bf16 or f16) uniform in [lo, hi), stored in dtype at dst. */
void tst_fill_float(tst_rng *r, lmk_dtype dtype, void *dst, size_t n, double lo, double hi);
/* n random bytes. */
void tst_fill_bytes(tst_rng *r, void *dst, size_t n);
/* Element i of a f32/bf16/f16 array, widened to double. */
double tst_load(lmk_dtype dtype, const void *base, size_t i);
/* Stores v (rounded through f32, then to dtype with the library's conversion) as element i. */
void tst_store(lmk_dtype dtype, void *base, size_t i, double v);

/* The seed library's test RNG: seed = seed*1103515245 + 12345 (u32, wrapping), then
 * value = (float)(int32)seed / 2147483648.0f. */
float tst_seed_rng_next(uint32_t *seed);

/* ---- devices, buffers, guards, messages (common_buf.c) ---- */

#define TST_MAX_DEVS 4
#define TST_GUARD 64            /* guard bytes after every output's used range */
#define TST_POISON 0xFFu        /* poison byte: NaN in f32, bf16 and f16; never a random input */

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
 * open), with streams of 3 and 5 threads, so one machine tests every CPU path and uneven splits. Nothing extra when the caller set LMK_CPU_ISA. */
int  tst_devs_open_isas(tst_dev devs[TST_MAX_DEVS]);
void tst_devs_close(tst_dev *devs, int n);

/* A buffer of dtype with the given shape (ndim 0: 1-D [used/size]) and byte_len used + extra,
 * where used is the shape's bytes. Its first `init_len` bytes are written from init (may be NULL),
 * and the rest is filled with `fill` when fill >= 0. Returns NULL (after a failed CHECK) on error. */
lmk_buffer *tst_buf(lmk_device *dev, lmk_dtype dtype, const size_t *shape, int ndim, size_t used,
                    size_t extra, const void *init, size_t init_len, int fill);
/* The whole buffer read into a fresh host array (free with free()); NULL after a failed CHECK. */
void *tst_read_all(const lmk_buffer *b);

/* Fills n bytes with `byte`. */
void tst_poison(void *p, size_t n, unsigned byte);
/* Offset of the first byte in [from, to) that is not `byte`, or -1. */
long long tst_find_not(const void *p, size_t from, size_t to, unsigned byte);
/* Number of elements of size es among n whose every byte is `byte` (elements never written). */
size_t tst_count_unwritten(const void *p, size_t n, size_t es, unsigned byte);

/* Whether this thread's lmk_last_error() contains every one of the NULL-terminated strings. */
bool tst_msg_has(const char *first, ...);

/* ---- comparisons (common_cmp.c) ---- */

/* Offset of the first differing byte, or -1 when the n bytes are equal. */
long long tst_bits_diff(const void *a, const void *b, size_t n);

/* The spacing of dtype (bf16 or f16) values at the magnitude of x: one ulp of x in that dtype. */
double tst_ulp(lmk_dtype dtype, double x);

typedef struct tst_cmp {
    size_t n_checked, n_bad;
    size_t first_bad;           /* element index of the first failure */
    double got, want, tol;      /* at the first failure */
    double max_err;             /* over all elements checked */
} tst_cmp;

/* Element i of got (dtype) against want[i] for i in [0, n) where mask is NULL or mask[i % mask_n]
 * is set: f32 within f32_tol absolute; bf16/f16 within one ulp of want plus 1e-6. A NaN want needs
 * a NaN got. Accumulates into *res (zero it first). */
void tst_cmp_f64(lmk_dtype dtype, const void *got, const double *want, size_t n, const bool *mask,
                 size_t mask_n, double f32_tol, tst_cmp *res);

/* Which of the head_dim elements of a row are rotated (true) for a pairing. */
void tst_rope_rotated_mask(const lmk_rope_multi_params *p, bool *mask);

/* Checks the outputs of a rope launch against the float64 reference: `a` holds host copies of
 * the inputs, positions and freq_factors (a->t[i].in with its strides, a->angle.positions; a->t[i].out
 * is ignored) and got[i] the output read back for tensor i, laid out with a->t[i]'s output strides.
 * Rotated elements: the precision contract (f32 within f32_tol * max(1, m), bf16/f16 one ulp plus
 * 1e-6); every other element: bit-exact copy of the input. Works in chunks of tokens. On failure
 * writes a description to msg and returns false. */
bool tst_rope_check(const lmk_rope_args *a, const void *const got[2], double f32_tol, char *msg, size_t msg_len);

/* Dense host operand [n0, n1, n2] of element size es at data (for lmk_rope_args_for). */
lmk_tensor3 tst_dense3(const void *data, size_t n0, size_t n1, size_t n2, size_t es);

/* Host arguments of a dense lmk_rope_multi / lmk_rope_multi_qk call (n_t tensors: q, and k with
 * n_k_heads heads) for the reference and tst_rope_check. */
lmk_rope_args tst_rope_host_args(const lmk_rope_multi_params *p, uint32_t n_k_heads, int n_t, lmk_dtype dtype,
                                 const void *q, const void *k, const int32_t *pos);
/* Host arguments of a dense tiled repeat (lmk_repeat_tiled) for lmk_ref_repeat. */
lmk_repeat_args tst_repeat_host_args(const void *src, void *dst, size_t seq, size_t hg, size_t h, size_t k, size_t es);

/* ---- case tables of real model shapes (common_cases.c) ---- */

typedef struct tst_attn_shape {
    const char *model;          /* "qwen3.5-27B" */
    uint32_t n_q_heads, n_k_heads;
    uint32_t head_dim, rope_dim;
    float freq_base;
    lmk_rope_mode mode;
    uint32_t sections[4];
} tst_attn_shape;
extern const tst_attn_shape tst_attn_shapes[];
extern const int tst_attn_shape_count;

typedef struct tst_gqa_shape {
    const char *model;          /* Gated DeltaNet q/k broadcast */
    uint32_t hg, h, k;
} tst_gqa_shape;
extern const tst_gqa_shape tst_gqa_shapes[];
extern const int tst_gqa_shape_count;

/* "rope_multi imrope hd=256 rd=64 nh=24 T=4106 f32 half_rope" plus " // comment" when comment is
 * not NULL or empty. Returns buf. */
char *tst_rope_name(char *buf, size_t n, const char *op, const lmk_rope_multi_params *p, lmk_dtype dtype,
                    const char *comment);
/* "repeat_tiled T=4106 hg=16 h=48 k=128 f32" plus " // comment". Returns buf. */
char *tst_repeat_name(char *buf, size_t n, const lmk_repeat_tiled_params *p, lmk_dtype dtype, const char *comment);

/* Positions for seq_len tokens: text (all four axes = start + i) or distinct t/h/w/e axes drawn
 * from the rng in [lo, hi]. */
void tst_positions_text(int32_t *pos, uint32_t seq_len, int32_t start);
void tst_positions_random(tst_rng *r, int32_t *pos, uint32_t seq_len, int32_t lo, int32_t hi);

#endif /* LMK_TEST_COMMON_H */
