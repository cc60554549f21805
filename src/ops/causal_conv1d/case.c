/*
 * case.c - the case descriptor of causal_conv1d (testkit/testkit.h): the depthwise causal
 * convolution of the Gated DeltaNet layers, with its state pool.
 *
 *   Qwen3.5-27B              C = 10240 (q 16 x 128, k 16 x 128, v 48 x 128), W = 4, SiLU, no bias
 *   Qwen3.5-35B-A3B, Qwen3-Next  C = 8192 (16, 16 and 32 heads of 128), W = 4
 *   decode batches           one token of each of 1, 64 or 256 sequences, rows of a pool larger
 *                            than the batch in shuffled order, some slots padding (negative or past
 *                            the pool)
 *   prompts                  T = 300 and 4106 (TST_CASE_FULL) as one sequence with a state row
 *   varlen batches           sequences of random lengths with an empty one, a one-token one and
 *                            one shorter than W-1 among them
 *   layouts                  in place (y == x) and not; x as the [T, C] slice of a wider projection
 *                            row; the state dense, in Hugging Face's [B, C, W-1] cache (the view
 *                            [B, W-1, C] with strides (C*(W-1), 1, W-1)) or with padded rows; no
 *                            state; duplicate slots; i32 and i64 indices
 *   edges                    widths 2..8, channel counts that are no multiple of a vector step,
 *                            no bias, activation none, f32/bf16/f16 with f32/bf16/f16 weights
 * The benchmark (conv_bench_cases) runs Qwen3.5-27B as one sequence of T tokens in place, and at
 * T = 1 a decode step of 256 sequences over a pool of 512 rows; both have rows in the table.
 *
 * Verification runs lmk_ref_causal_conv1d on the host copies, a block of channels at a time
 * (channels are independent): once in the case's dtype, whose state pool must then equal the
 * device's bit for bit over the whole region (stored rows are bit copies of inputs, every other row
 * and byte unchanged); once on the inputs widened to f32 (exact), which gives the float64 result
 * rounded to f32; once on their magnitudes with no activation, which gives |bias| + sum |w * xx|.
 * Each y element must then be within lmk.h's bound of the f32 result: one ulp of y's dtype plus
 * 1e-6 of the magnitude sum, plus one f32 ulp for that result's own rounding.
 */
#include "ops/causal_conv1d/causal_conv1d.h"
#include "testkit_ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { X, WT, BIAS, CU, SLOTS, STATE, Y }; /* the operands in tst_inst.arg */
/* cu_seqlens: none (one sequence), [0, T], one token each (decode), random lengths, equal ones */
enum { SEQ_ONE, SEQ_WHOLE, SEQ_DECODE, SEQ_VARLEN, SEQ_EVEN };
/* the pool: none, dense [n_slots, W-1, C], Hugging Face's [n_slots, C, W-1] viewed as
 * [n_slots, W-1, C], rows padded apart */
enum { STATE_NONE, STATE_DENSE, STATE_HF, STATE_PADDED };
/* state_slots: none (row s), distinct rows in shuffled order, the same with every fourth sequence
 * padding, the same with every third sequence naming the previous one's row */
enum { SLOTS_NONE, SLOTS_SHUFFLED, SLOTS_PADDED, SLOTS_DUP };

typedef struct conv_case {
    lmk_causal_conv1d_params p;
    lmk_dtype dtype, w_dtype, b_dtype;
    bool bias;
    bool in_place;
    bool stable;         /* TST_INST_FAST: weights (0, .., 0, 1) and bias 1, values stay normal */
    uint32_t x_extra;    /* x is the [T, C] slice at element x_at of rows of C + x_extra elements */
    uint32_t x_at;
    int seqs;            /* SEQ_* */
    uint32_t n_seq;      /* SEQ_VARLEN, SEQ_EVEN */
    lmk_dtype idx_dtype; /* cu_seqlens and state_slots: i32 or i64 */
    int state;           /* STATE_* */
    uint32_t n_slots;
    int slots;           /* SLOTS_* */
} conv_case;

_Static_assert(sizeof(conv_case) <= TST_CASE_PARAMS, "conv_case must fit in tst_case.p");

static const conv_case *P(const tst_case *c)
{
    return (const conv_case *)(const void *)c->p.bytes;
}

static size_t n_seq_of(const conv_case *cc)
{
    return cc->seqs == SEQ_DECODE ? cc->p.seq_len : cc->seqs == SEQ_VARLEN || cc->seqs == SEQ_EVEN ? cc->n_seq : 1;
}

/* ---- the table ---- */

#define QWEN35_27B .p = {.channels = 10240, .width = 4, .activation = LMK_ACT_SILU}
#define QWEN3_NEXT .p = {.channels = 8192, .width = 4, .activation = LMK_ACT_SILU}
#define BF16_MODEL .dtype = LMK_BF16, .w_dtype = LMK_BF16
/* One token of each of n sequences, rows of a pool of n + 64 in shuffled order, some padding. */
#define DECODE(n) .seqs = SEQ_DECODE, .state = STATE_DENSE, .n_slots = (n) + 64, .slots = SLOTS_PADDED
/* x inside Qwen3.5-27B's [qkv | z] projection row (z: 48 x 128). */
#define QKV_OF_QKVZ .x_extra = 6144, .x_at = 0

typedef struct row {
    conv_case c;
    uint32_t T;
    unsigned flags;
    const char *model;
} row;

static const row k_rows[] = {
    {{QWEN35_27B, BF16_MODEL, .in_place = true, .state = STATE_DENSE, .n_slots = 1}, 1, 0, "Qwen3.5-27B decode"},
    {{QWEN35_27B, BF16_MODEL, .in_place = true, DECODE(64)}, 64, 0, "Qwen3.5-27B decode batch"},
    {{QWEN35_27B, BF16_MODEL, .in_place = true, DECODE(256), .idx_dtype = LMK_I64}, 256, 0, "Qwen3.5-27B decode batch"},
    {{QWEN3_NEXT, .dtype = LMK_F32, .w_dtype = LMK_F32, DECODE(128)}, 128, 0, "Qwen3-Next decode batch"},
    {{QWEN3_NEXT, .dtype = LMK_F16, .w_dtype = LMK_F16, .in_place = true, DECODE(1)}, 1, 0, "Qwen3-Next decode"},
    {{QWEN35_27B, BF16_MODEL, .in_place = true, .seqs = SEQ_WHOLE, .idx_dtype = LMK_I64, .state = STATE_DENSE,
      .n_slots = 8, .slots = SLOTS_SHUFFLED}, 300, 0, "Qwen3.5-27B prompt"},
    {{QWEN35_27B, BF16_MODEL, .state = STATE_DENSE, .n_slots = 2, .slots = SLOTS_SHUFFLED}, 256, 0,
     "Qwen3.5-27B prompt, out of place"},
    {{QWEN3_NEXT, .dtype = LMK_F16, .w_dtype = LMK_BF16, .seqs = SEQ_VARLEN, .n_seq = 3, .state = STATE_HF,
      .n_slots = 4, .slots = SLOTS_SHUFFLED}, 300, 0, "Qwen3-Next varlen prompt, out of place"},
    {{QWEN35_27B, BF16_MODEL, .in_place = true, .state = STATE_DENSE, .n_slots = 1}, 4106, TST_CASE_FULL,
     "Qwen3.5-27B prompt"},
    {{QWEN3_NEXT, BF16_MODEL, .in_place = true, .state = STATE_DENSE, .n_slots = 1}, 4106, TST_CASE_FULL,
     "Qwen3.5-35B-A3B / Qwen3-Next prompt"},
    {{QWEN35_27B, BF16_MODEL, .in_place = true, QKV_OF_QKVZ, .seqs = SEQ_VARLEN, .n_seq = 9, .state = STATE_DENSE,
      .n_slots = 16, .slots = SLOTS_SHUFFLED}, 200, 0, "Qwen3.5-27B varlen, x in the [qkv | z] projection"},
    {{QWEN3_NEXT, BF16_MODEL, .seqs = SEQ_VARLEN, .n_seq = 7, .state = STATE_HF, .n_slots = 7}, 150, 0,
     "Qwen3-Next varlen, Hugging Face cache layout"},
    {{QWEN3_NEXT, .dtype = LMK_F32, .w_dtype = LMK_F32, .seqs = SEQ_EVEN, .n_seq = 4, .state = STATE_HF,
      .n_slots = 6, .slots = SLOTS_DUP}, 96, 0, "Qwen3-Next, Hugging Face cache, duplicate slots"},
    {{QWEN3_NEXT, .dtype = LMK_F16, .w_dtype = LMK_F32, .in_place = true, .seqs = SEQ_VARLEN, .n_seq = 12,
      .idx_dtype = LMK_I64, .state = STATE_PADDED, .n_slots = 20, .slots = SLOTS_PADDED}, 120, 0,
     "Qwen3-Next varlen, padded pool rows"},
    {{QWEN35_27B, BF16_MODEL, .in_place = true, QKV_OF_QKVZ}, 64, 0, "Qwen3.5-27B prompt without a cache"},
    {{QWEN3_NEXT, .dtype = LMK_F32, .w_dtype = LMK_BF16, .bias = true, .b_dtype = LMK_F32, .state = STATE_DENSE,
      .n_slots = 3, .seqs = SEQ_EVEN, .n_seq = 3}, 45, 0, "Qwen3-Next, rows s of the pool, f32 bias"},
    /* the benchmark's configurations at check sizes (conv_bench_cases) */
    {{QWEN35_27B, BF16_MODEL, .in_place = true, .bias = true, .b_dtype = LMK_BF16, .stable = true,
      .state = STATE_DENSE, .n_slots = 1}, 300, 0, "Qwen3.5-27B prompt (bench)"},
    {{QWEN35_27B, .dtype = LMK_F32, .w_dtype = LMK_F32, .in_place = true, .bias = true, .b_dtype = LMK_F32,
      .stable = true, .seqs = SEQ_DECODE, .state = STATE_DENSE, .n_slots = 512, .slots = SLOTS_SHUFFLED}, 256, 0,
     "Qwen3.5-27B decode batch (bench)"},
    /* contract cases: small and representative */
    {{.p = {.channels = 200, .width = 4, .activation = LMK_ACT_SILU}, BF16_MODEL, .in_place = true,
      .seqs = SEQ_VARLEN, .n_seq = 5, .state = STATE_DENSE, .n_slots = 8, .slots = SLOTS_PADDED}, 33,
     TST_CASE_CONTRACT, "edge: varlen, padding slots"},
    {{.p = {.channels = 72, .width = 3, .activation = LMK_ACT_NONE}, .dtype = LMK_F16, .w_dtype = LMK_F32,
      .bias = true, .b_dtype = LMK_F16, .seqs = SEQ_DECODE, .state = STATE_HF, .n_slots = 6}, 6, TST_CASE_CONTRACT,
     "edge: decode, Hugging Face cache"},
    /* widths 2..8 on channel counts with tails at every vector width, every dtype */
    {{.p = {.channels = 101, .width = 2, .activation = LMK_ACT_SILU}, .dtype = LMK_F32, .w_dtype = LMK_BF16,
      .seqs = SEQ_VARLEN, .n_seq = 6, .state = STATE_DENSE, .n_slots = 6}, 23, 0, "edge: width 2"},
    {{.p = {.channels = 37, .width = 3, .activation = LMK_ACT_SILU}, .dtype = LMK_BF16, .w_dtype = LMK_F16,
      .bias = true, .b_dtype = LMK_BF16, .in_place = true, .seqs = SEQ_VARLEN, .n_seq = 5, .state = STATE_HF,
      .n_slots = 9, .slots = SLOTS_SHUFFLED}, 19, 0, "edge: width 3"},
    {{.p = {.channels = 130, .width = 5, .activation = LMK_ACT_SILU}, .dtype = LMK_F16, .w_dtype = LMK_F16,
      .x_extra = 7, .x_at = 3, .seqs = SEQ_VARLEN, .n_seq = 6, .idx_dtype = LMK_I64, .state = STATE_PADDED,
      .n_slots = 8, .slots = SLOTS_DUP}, 40, 0, "edge: width 5, x strided"},
    {{.p = {.channels = 48, .width = 6, .activation = LMK_ACT_NONE}, .dtype = LMK_BF16, .w_dtype = LMK_BF16,
      .in_place = true, .x_extra = 16, .x_at = 16, .seqs = SEQ_VARLEN, .n_seq = 4, .state = STATE_DENSE,
      .n_slots = 3}, 30, 0, "edge: width 6, more sequences than rows"},
    {{.p = {.channels = 67, .width = 7, .activation = LMK_ACT_SILU}, .dtype = LMK_F32, .w_dtype = LMK_F32,
      .bias = true, .b_dtype = LMK_BF16, .seqs = SEQ_VARLEN, .n_seq = 8, .state = STATE_HF, .n_slots = 12,
      .slots = SLOTS_PADDED, .idx_dtype = LMK_I64}, 50, 0, "edge: width 7"},
    {{.p = {.channels = 160, .width = 8, .activation = LMK_ACT_SILU}, .dtype = LMK_BF16, .w_dtype = LMK_F32,
      .in_place = true, .seqs = SEQ_VARLEN, .n_seq = 10, .state = STATE_DENSE, .n_slots = 10,
      .slots = SLOTS_SHUFFLED}, 70, 0, "edge: width 8"},
    {{.p = {.channels = 33, .width = 8, .activation = LMK_ACT_SILU}, .dtype = LMK_F16, .w_dtype = LMK_BF16}, 5, 0,
     "edge: width 8, fewer tokens than the width, no state"},
    {{.p = {.channels = 1, .width = 4, .activation = LMK_ACT_SILU}, .dtype = LMK_F32, .w_dtype = LMK_F32,
      .seqs = SEQ_VARLEN, .n_seq = 4, .state = STATE_DENSE, .n_slots = 4}, 9, 0, "edge: one channel"},
};

static int conv_n_cases(void)
{
    return (int)(sizeof k_rows / sizeof k_rows[0]);
}

static const char *const k_seq_names[] = {"", " seqs=[0,T]", " seqs=decode", " seqs=varlen", " seqs=even"};
static const char *const k_state_names[] = {" no-state", " state=dense", " state=hf[B,C,W-1]", " state=padded-rows"};
static const char *const k_slot_names[] = {"", " slots=shuffled", " slots=padded", " slots=dup"};

/* "causal_conv1d C=10240 W=4 T=64 bf16 silu w=bf16 seqs=decode/64 state=dense rows=128 slots=padded
 * in-place // Qwen3.5-27B decode batch". */
static void set_case(tst_case *c, const conv_case *cc, unsigned flags, const char *model)
{
    memcpy(c->p.bytes, cc, sizeof *cc);
    c->flags = flags;
    c->T = cc->p.seq_len;
    c->dtype = cc->dtype;
    char seqs[48] = "", state[64] = "", bias[32] = "", x[48] = "";
    if (cc->seqs != SEQ_ONE)
        snprintf(seqs, sizeof seqs, "%s/%zu%s", k_seq_names[cc->seqs], n_seq_of(cc),
                 cc->idx_dtype == LMK_I64 ? " i64" : "");
    snprintf(state, sizeof state, "%s", k_state_names[cc->state]);
    if (cc->state != STATE_NONE)
        snprintf(state + strlen(state), sizeof state - strlen(state), " rows=%u%s", cc->n_slots,
                 k_slot_names[cc->slots]);
    if (cc->bias)
        snprintf(bias, sizeof bias, " bias=%s", lmk_dtype_name(cc->b_dtype));
    if (cc->x_extra)
        snprintf(x, sizeof x, " x=[%u+%u]@%u", cc->p.channels, cc->x_extra, cc->x_at);
    tst_case_name(c, "causal_conv1d C=%u W=%u T=%u %s %s w=%s%s%s%s%s%s // %s", cc->p.channels, cc->p.width,
                  cc->p.seq_len, lmk_dtype_name(cc->dtype), cc->p.activation == LMK_ACT_SILU ? "silu" : "act=none",
                  lmk_dtype_name(cc->w_dtype), bias, seqs, state, x, cc->in_place ? " in-place" : "", model);
}

static void complete(conv_case *cc, uint32_t T)
{
    cc->p.seq_len = T;
    if (cc->idx_dtype != LMK_I64)
        cc->idx_dtype = LMK_I32;
}

static void conv_get_case(int i, tst_case *c)
{
    conv_case cc = k_rows[i].c;
    complete(&cc, k_rows[i].T);
    set_case(c, &cc, k_rows[i].flags, k_rows[i].model);
}

/* A random valid call drawing every option; one in eight large enough for the CPU worker pool. */
static void conv_random_case(tst_rng *r, tst_case *c)
{
    static const lmk_dtype dts[] = {LMK_F32, LMK_BF16, LMK_F16};
    conv_case cc = {.p = {.width = 2 + tst_rng_below(r, 7)}};
    cc.p.activation = tst_rng_below(r, 4) ? LMK_ACT_SILU : LMK_ACT_NONE;
    cc.dtype = dts[tst_rng_below(r, 3)];
    cc.w_dtype = dts[tst_rng_below(r, 3)];
    cc.bias = tst_rng_below(r, 2);
    cc.b_dtype = dts[tst_rng_below(r, 3)];
    cc.in_place = tst_rng_below(r, 2);
    const bool big = tst_rng_below(r, 8) == 0;
    cc.p.channels = big ? 1024 + 16 * tst_rng_below(r, 64) : 1 + tst_rng_below(r, 300);
    const uint32_t cap = (big ? 160000 : 32768) / cc.p.channels;
    uint32_t T = 1 + tst_rng_below(r, cap < 96 ? cap : 96);
    if (tst_rng_below(r, 3) == 0) {
        cc.x_at = tst_rng_below(r, 9);
        cc.x_extra = cc.x_at + tst_rng_below(r, 40);
    }
    cc.seqs = (int)tst_rng_below(r, 5);
    cc.n_seq = 1 + tst_rng_below(r, 12);
    cc.idx_dtype = tst_rng_below(r, 2) ? LMK_I64 : LMK_I32;
    cc.state = (int)tst_rng_below(r, 4);
    const uint32_t state_cap = 32768 / ((cc.p.width - 1) * cc.p.channels);
    if (cc.seqs == SEQ_DECODE && cc.state != STATE_NONE && T > state_cap)
        T = state_cap ? state_cap : 1;
    complete(&cc, T);
    const size_t n_seq = n_seq_of(&cc);
    cc.n_slots = (uint32_t)n_seq + tst_rng_below(r, 6);
    if (cc.n_slots > state_cap)
        cc.n_slots = state_cap ? state_cap : 1;
    cc.slots = cc.state == STATE_NONE || cc.n_slots < n_seq ? SLOTS_NONE : (int)tst_rng_below(r, 4);
    set_case(c, &cc, 0, "random");
}

/* ---- the benchmark ---- */

/* Qwen3.5-27B in place, one sequence of T tokens with its state row; at T = 1 a decode step: one
 * token of each of 256 sequences, rows of a pool of 512 in shuffled order (the case's T stays 1,
 * the row the benchmark files it under). Repeated calls on the same buffers keep values normal
 * numbers through the weights (0, 0, 0, 1) and bias 1 of TST_INST_FAST instances (x -> silu(x +
 * 1)); with random weights the in-place values would decay into subnormals or grow to infinity.
 * The bias adds one vector load a step (the kernels start every sum from the bias, zeros without
 * one). Both configurations have a row in k_rows at check sizes. */
static int conv_bench_cases(uint32_t T, lmk_dtype dtype, bool longest, tst_case *out, int max)
{
    (void)longest;
    if (max < 1)
        return 0;
    conv_case cc = {QWEN35_27B, .dtype = dtype, .w_dtype = dtype, .bias = true, .b_dtype = dtype, .in_place = true,
                    .stable = true, .state = STATE_DENSE, .n_slots = 1};
    if (T == 1) {
        cc.seqs = SEQ_DECODE, cc.n_slots = 512, cc.slots = SLOTS_SHUFFLED;
        complete(&cc, 256);
    } else {
        complete(&cc, T);
    }
    set_case(out, &cc, 0, T == 1 ? "Qwen3.5-27B decode batch" : "Qwen3.5-27B prompt");
    out->T = T;
    return 1;
}

/* Sequences that read a state row and sequences that store one (every sequence counted as
 * non-empty: the benchmark's are). */
static void state_rows(const conv_case *cc, double *reads, double *writes)
{
    const double n = (double)n_seq_of(cc);
    *reads = *writes = 0.0;
    if (cc->state == STATE_NONE)
        return;
    if (cc->slots == SLOTS_NONE)
        *reads = *writes = n < cc->n_slots ? n : cc->n_slots;
    else if (cc->slots == SLOTS_PADDED)
        *reads = *writes = n - (double)(n_seq_of(cc) / 4);
    else if (cc->slots == SLOTS_DUP)
        *reads = n, *writes = n - (double)(n_seq_of(cc) / 3);
    else
        *reads = *writes = n;
}

/* The bytes the op must move: x read and y written once each, the weights, bias and index arrays,
 * and the W-1 state rows of every sequence read (those with a row) and written (those storing). */
static double conv_bytes(const tst_case *c)
{
    const conv_case *cc = P(c);
    const double es = (double)lmk_dtype_size(cc->dtype), T = cc->p.seq_len, C = cc->p.channels, W = cc->p.width;
    double reads, writes;
    state_rows(cc, &reads, &writes);
    double b = 2.0 * T * C * es + C * W * (double)lmk_dtype_size(cc->w_dtype);
    b += cc->bias ? C * (double)lmk_dtype_size(cc->b_dtype) : 0.0;
    b += (reads + writes) * (W - 1) * C * es;
    const double is = (double)lmk_dtype_size(cc->idx_dtype), n = (double)n_seq_of(cc);
    b += (cc->seqs != SEQ_ONE ? (n + 1) * is : 0.0) + (cc->slots != SLOTS_NONE ? n * is : 0.0);
    return b;
}

/* ---- on a device ---- */

/* A region of `bytes` with guards on both sides; a host copy when it holds inputs. */
static lmk_status region(tst_inst *in, size_t bytes, bool input, int *r)
{
    return tst_mem_region(&in->mem, 2 * TST_GUARD + bytes, input, r);
}

/* A dense [n0, n1, n2] tensor in a region of its own. */
static lmk_status dense(tst_inst *in, lmk_dtype t, size_t n0, size_t n1, size_t n2, bool input, bool output,
                        lmk_buffer **out)
{
    int r;
    const size_t n[3] = {n0, n1, n2};
    const lmk_status st = region(in, n0 * n1 * n2 * lmk_dtype_size(t), input, &r);
    return st == LMK_OK ? tst_mem_view(&in->mem, r, TST_GUARD, t, n, NULL, output, out) : st;
}

/* x: dense, or the [T, C] slice at element x_at of rows of C + x_extra elements (a 2-D view). */
static lmk_status setup_x(tst_inst *in)
{
    const conv_case *cc = P(&in->c);
    const size_t T = cc->p.seq_len, C = cc->p.channels, es = lmk_dtype_size(cc->dtype);
    if (!cc->x_extra)
        return dense(in, cc->dtype, T, 1, C, true, cc->in_place, &in->arg[X]);
    const size_t row = C + cc->x_extra, n[2] = {T, C}, stride[2] = {row, 1};
    int r;
    const lmk_status st = region(in, T * row * es, true, &r);
    return st == LMK_OK ? tst_mem_view_nd(&in->mem, r, TST_GUARD + cc->x_at * es, cc->dtype, 2, n, stride,
                                          cc->in_place, &in->arg[X])
                        : st;
}

/* The pool [n_slots, W-1, C] in the case's layout: an input whose stored rows are outputs. */
static lmk_status setup_state(tst_inst *in)
{
    const conv_case *cc = P(&in->c);
    const size_t C = cc->p.channels, R = cc->p.width - 1, es = lmk_dtype_size(cc->dtype);
    if (cc->state == STATE_DENSE)
        return dense(in, cc->dtype, cc->n_slots, R, C, true, true, &in->arg[STATE]);
    const size_t n[3] = {cc->n_slots, R, C};
    const size_t hf[3] = {C * R, 1, R}, padded[3] = {R * (C + 8) + 24, C + 8, 1};
    const size_t *stride = cc->state == STATE_HF ? hf : padded;
    int r;
    const lmk_status st = region(in, tst_span_nd(3, n, stride, es), true, &r);
    return st == LMK_OK ? tst_mem_view_nd(&in->mem, r, TST_GUARD, cc->dtype, 3, n, stride, true, &in->arg[STATE])
                        : st;
}

static lmk_status conv_setup(tst_inst *in)
{
    const conv_case *cc = P(&in->c);
    const size_t T = cc->p.seq_len, C = cc->p.channels, n_seq = n_seq_of(cc);
    lmk_status st = setup_x(in);
    if (st == LMK_OK && cc->in_place)
        in->arg[Y] = in->arg[X];
    else if (st == LMK_OK)
        st = dense(in, cc->dtype, T, 1, C, false, true, &in->arg[Y]);
    if (st == LMK_OK) /* Hugging Face's conv1d.weight [C, 1, W] */
        st = dense(in, cc->w_dtype, C, 1, cc->p.width, true, false, &in->arg[WT]);
    if (st == LMK_OK && cc->bias)
        st = dense(in, cc->b_dtype, 1, 1, C, true, false, &in->arg[BIAS]);
    if (st == LMK_OK && cc->seqs != SEQ_ONE)
        st = dense(in, cc->idx_dtype, 1, 1, n_seq + 1, true, false, &in->arg[CU]);
    if (st == LMK_OK && cc->slots != SLOTS_NONE)
        st = dense(in, cc->idx_dtype, 1, 1, n_seq, true, false, &in->arg[SLOTS]);
    if (st == LMK_OK && cc->state != STATE_NONE)
        st = setup_state(in);
    return st;
}

/* Index v as element i of an i32 or i64 host array. */
static void put_index(lmk_dtype t, unsigned char *host, size_t i, int64_t v)
{
    if (t == LMK_I64) {
        memcpy(host + 8 * i, &v, 8);
    } else {
        const int32_t v32 = (int32_t)v;
        memcpy(host + 4 * i, &v32, 4);
    }
}

static int cmp_size(const void *a, const void *b)
{
    const size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return (x > y) - (x < y);
}

/* n lengths summing to T: an empty sequence, a one-token one and one of W-2 tokens (shorter than
 * W-1) while T allows, the rest random cuts of what is left, then shuffled. */
static void varlen_lengths(tst_rng *r, size_t T, size_t n, size_t W, size_t *len)
{
    const size_t special[3] = {0, 1, W - 2};
    size_t k = 0, used = 0;
    for (; k < 3 && k < n; k++) {
        len[k] = special[k] <= T - used ? special[k] : 0;
        used += len[k];
    }
    const size_t m = n - k, rest = T - used;
    if (m == 0) {
        len[n - 1] += rest;
    } else {
        for (size_t i = 0; i + 1 < m; i++)
            len[k + i] = tst_rng_below(r, (uint32_t)rest + 1);
        qsort(len + k, m - 1, sizeof *len, cmp_size);
        len[n - 1] = rest;
        for (size_t i = m - 1; i > 0; i--) /* cut points to lengths, back to front */
            len[k + i] -= len[k + i - 1];
    }
    for (size_t i = n - 1; i > 0; i--) { /* Fisher-Yates */
        const size_t j = tst_rng_below(r, (uint32_t)i + 1), t = len[i];
        len[i] = len[j];
        len[j] = t;
    }
}

static void fill_cu(tst_inst *in, tst_rng *r)
{
    const conv_case *cc = P(&in->c);
    const size_t T = cc->p.seq_len, n = n_seq_of(cc);
    unsigned char *host = tst_mem_host(&in->mem, in->arg[CU]);
    size_t *len = malloc(n * sizeof *len);
    if (!len)
        return;
    for (size_t s = 0; s < n; s++)
        len[s] = cc->seqs == SEQ_DECODE ? 1 : cc->seqs == SEQ_EVEN ? T / n + (s < T % n) : T;
    if (cc->seqs == SEQ_VARLEN)
        varlen_lengths(r, T, n, cc->p.width, len);
    size_t at = 0;
    put_index(cc->idx_dtype, host, 0, 0);
    for (size_t s = 0; s < n; s++) {
        at += len[s];
        put_index(cc->idx_dtype, host, s + 1, (int64_t)at);
    }
    free(len);
}

/* Distinct rows in shuffled order; SLOTS_PADDED: every fourth sequence padding (-1 or n_slots);
 * SLOTS_DUP: every third sequence the row of the one before it. */
static void fill_slots(tst_inst *in, tst_rng *r)
{
    const conv_case *cc = P(&in->c);
    const size_t n = n_seq_of(cc), rows = cc->n_slots;
    unsigned char *host = tst_mem_host(&in->mem, in->arg[SLOTS]);
    int64_t *perm = malloc(rows * sizeof *perm);
    if (!perm)
        return;
    for (size_t i = 0; i < rows; i++)
        perm[i] = (int64_t)i;
    for (size_t i = rows - 1; i > 0; i--) {
        const size_t j = tst_rng_below(r, (uint32_t)i + 1);
        const int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int64_t prev = 0;
    for (size_t s = 0; s < n; s++) {
        int64_t v = perm[s % rows];
        if (cc->slots == SLOTS_PADDED && s % 4 == 3)
            v = s / 4 % 2 ? -1 : (int64_t)rows;
        if (cc->slots == SLOTS_DUP && s % 3 == 2)
            v = prev;
        put_index(cc->idx_dtype, host, s, v);
        prev = v;
    }
    free(perm);
}

/* Weights (0, .., 0, 1) and bias 1: each call maps x to silu(x + 1) (conv_bench_cases). */
static void stable_values(tst_inst *in)
{
    const conv_case *cc = P(&in->c);
    void *w = tst_mem_host(&in->mem, in->arg[WT]), *b = tst_mem_host(&in->mem, in->arg[BIAS]);
    for (size_t c = 0; c < cc->p.channels; c++) {
        for (size_t j = 0; j < cc->p.width; j++)
            tst_store(cc->w_dtype, w, c * cc->p.width + j, j + 1 == cc->p.width ? 1.0 : 0.0);
        tst_store(cc->b_dtype, b, c, 1.0);
    }
}

static void conv_fill(tst_inst *in, tst_rng *r)
{
    const conv_case *cc = P(&in->c);
    const int tensors[] = {X, WT, BIAS, STATE};
    for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; i++)
        if (in->arg[tensors[i]])
            tst_inst_fill(in, in->arg[tensors[i]], r);
    if ((in->flags & TST_INST_FAST) && cc->stable && cc->bias)
        stable_values(in);
    if (in->arg[CU])
        fill_cu(in, r);
    if (in->arg[SLOTS])
        fill_slots(in, r);
}

static lmk_status conv_run(const tst_inst *in, lmk_stream *s)
{
    lmk_buffer *const *a = in->arg;
    return lmk_causal_conv1d(s, a[X], a[WT], a[BIAS], a[CU], a[SLOTS], a[STATE], a[Y], &P(&in->c)->p);
}

/* ---- verification ---- */

#define CHUNK_CHANNELS 256

/* What one verification holds: the host arguments, the regions read back, the reference's copy of
 * the state region, and the buffers of one block of channels. */
typedef struct conv_check {
    const tst_inst *in;
    lmk_causal_conv1d_args host;          /* over the host copies; state: into state_ref */
    unsigned char *got[TST_MAX_REGIONS];
    unsigned char *state_ref;             /* the state region as the reference leaves it */
    unsigned char *y_dt, *w_abs, *b_abs;  /* [T, CHUNK] y in dtype; the block's |weights|, |bias| */
    float *x32, *y32, *m32, *st32;        /* [T, CHUNK] and [n_slots, W-1, CHUNK] */
    double max_err, max_ratio;
} conv_check;

static const tst_view *view_of(const tst_inst *in, int arg)
{
    return in->arg[arg] ? tst_mem_find(&in->mem, in->arg[arg]) : NULL;
}

static int is64_of(const lmk_buffer *b)
{
    return b && lmk_buffer_dtype(b) == LMK_I64;
}

/* The call's arguments over the host copies, the state pointed into state_ref. */
static lmk_causal_conv1d_args host_args(const tst_inst *in, unsigned char *state_ref)
{
    const conv_case *cc = P(&in->c);
    const tst_mem *m = &in->mem;
    const tst_view *xv = view_of(in, X), *sv = view_of(in, STATE);
    lmk_causal_conv1d_args a = {
        .x = tst_mem_host(m, in->arg[X]), .dtype = cc->dtype, .T = cc->p.seq_len, .C = cc->p.channels,
        .W = cc->p.width, .x_tok = xv->stride[0], .weight = tst_mem_host(m, in->arg[WT]), .w_dtype = cc->w_dtype,
        .bias = in->arg[BIAS] ? tst_mem_host(m, in->arg[BIAS]) : NULL, .bias_dtype = cc->b_dtype,
        .cu_seqlens = in->arg[CU] ? tst_mem_host(m, in->arg[CU]) : NULL, .cu_is64 = is64_of(in->arg[CU]),
        .slots = in->arg[SLOTS] ? tst_mem_host(m, in->arg[SLOTS]) : NULL, .slots_is64 = is64_of(in->arg[SLOTS]),
        .n_seq = n_seq_of(cc), .act = cc->p.activation,
    };
    if (sv) {
        a.state = state_ref + sv->off, a.n_slots = sv->n[0];
        a.st_slot = sv->stride[0], a.st_row = sv->stride[1], a.st_ch = sv->stride[2];
    }
    return a;
}

/* Clears the sign bit of n elements of dtype t (f32, bf16, f16) from src into dst. */
static void abs_copy(lmk_dtype t, unsigned char *dst, const unsigned char *src, size_t n)
{
    const size_t es = lmk_dtype_size(t);
    memcpy(dst, src, n * es);
    for (size_t i = 0; i < n; i++)
        dst[i * es + es - 1] &= 0x7f;
}

/* The block's x and state rows (before the run) widened to f32, dense; magnitudes when `mag`. */
static void widen_block(conv_check *k, size_t c0, size_t n, bool mag)
{
    const lmk_causal_conv1d_args *a = &k->host;
    const tst_view *sv = view_of(k->in, STATE);
    const unsigned char *st0 = sv ? tst_mem_host(&k->in->mem, k->in->arg[STATE]) : NULL;
    for (size_t t = 0; t < a->T; t++)
        for (size_t c = 0; c < n; c++) {
            const double v = lmk_float_load(a->dtype, a->x, t * a->x_tok + c0 + c);
            k->x32[t * n + c] = (float)(mag ? fabs(v) : v);
        }
    for (size_t s = 0; st0 && s < a->n_slots; s++)
        for (size_t i = 0; i + 1 < a->W; i++)
            for (size_t c = 0; c < n; c++) {
                const double v = lmk_float_load(a->dtype, st0, s * a->st_slot + i * a->st_row + (c0 + c) * a->st_ch);
                k->st32[(s * (a->W - 1) + i) * n + c] = (float)(mag ? fabs(v) : v);
            }
}

/* The three reference runs on channels [c0, c0 + n): in dtype (state_ref updated), widened to
 * f32 (y32), on magnitudes without activation (m32). */
static void reference_block(conv_check *k, size_t c0, size_t n)
{
    const lmk_causal_conv1d_args *a = &k->host;
    const size_t es = lmk_dtype_size(a->dtype), wes = lmk_dtype_size(a->w_dtype), bes = lmk_dtype_size(a->bias_dtype);
    lmk_causal_conv1d_args d = *a;
    d.C = n, d.x = (const unsigned char *)a->x + c0 * es, d.y = k->y_dt, d.y_tok = n;
    d.weight = (const unsigned char *)a->weight + c0 * a->W * wes;
    d.bias = a->bias ? (const unsigned char *)a->bias + c0 * bes : NULL;
    d.state = a->state ? (unsigned char *)a->state + c0 * a->st_ch * es : NULL;
    lmk_ref_causal_conv1d(&d);
    lmk_causal_conv1d_args f = d;
    f.dtype = LMK_F32, f.x = k->x32, f.x_tok = n, f.y = k->y32;
    f.state = a->state ? k->st32 : NULL, f.st_slot = (a->W - 1) * n, f.st_row = n, f.st_ch = 1;
    widen_block(k, c0, n, false);
    lmk_ref_causal_conv1d(&f);
    widen_block(k, c0, n, true);
    abs_copy(a->w_dtype, k->w_abs, d.weight, n * a->W);
    if (a->bias)
        abs_copy(a->bias_dtype, k->b_abs, d.bias, n);
    f.weight = k->w_abs, f.bias = a->bias ? k->b_abs : NULL, f.y = k->m32, f.act = LMK_ACT_NONE;
    lmk_ref_causal_conv1d(&f);
}

/* y of channels [c0, c0 + n) read back against the f32 reference: one ulp of y's dtype plus 1e-6
 * of the magnitude sum, plus half an f32 ulp for the reference's own rounding. */
static bool compare_block(conv_check *k, size_t c0, size_t n, tst_result *res)
{
    const lmk_causal_conv1d_args *a = &k->host;
    const tst_view *yv = view_of(k->in, Y);
    const unsigned char *y = k->got[yv->region] + yv->off;
    for (size_t t = 0; t < a->T; t++)
        for (size_t c = 0; c < n; c++) {
            const double g = lmk_float_load(a->dtype, y, t * yv->stride[0] + c0 + c);
            const double v = k->y32[t * n + c], m = k->m32[t * n + c];
            const double tol = lmk_ulp(a->dtype, v) + 0.5 * lmk_ulp(LMK_F32, v) + 1e-6 * m, err = fabs(g - v);
            if (!(err <= tol) && !(isnan(v) && isnan(g))) {
                snprintf(res->msg, sizeof res->msg, "y[t=%zu, c=%zu] = %.9g, reference %.9g (|err| %.3g > tol %.3g)",
                         t, c0 + c, g, v, err, tol);
                return false;
            }
            k->max_err = fmax(k->max_err, err);
            k->max_ratio = fmax(k->max_ratio, tol > 0 ? err / tol : 0.0);
        }
    return true;
}

/* The state region read back against the reference's, byte for byte (rows stored as bit copies,
 * every other row and byte as before the call). */
static bool compare_state(conv_check *k, tst_result *res)
{
    const tst_view *sv = view_of(k->in, STATE);
    if (!sv)
        return true;
    const size_t len = k->in->mem.r[sv->region].len, es = lmk_dtype_size(sv->dtype);
    const long long d = tst_bits_diff(k->got[sv->region], k->state_ref, len);
    if (d < 0)
        return true;
    const size_t e = ((size_t)d - sv->off) / es; /* the element it lies in, if any */
    for (size_t s = 0; s < sv->n[0]; s++)
        for (size_t i = 0; i < sv->n[1]; i++)
            for (size_t c = 0; c < sv->n[2]; c++)
                if ((size_t)d >= sv->off && s * sv->stride[0] + i * sv->stride[1] + c * sv->stride[2] == e) {
                    snprintf(res->msg, sizeof res->msg, "conv_state[row %zu, %zu, c=%zu] differs from the reference", s,
                             i, c);
                    return false;
                }
    snprintf(res->msg, sizeof res->msg, "conv_state region byte %lld (outside every element) changed", d);
    return false;
}

static bool check_alloc(conv_check *k)
{
    const conv_case *cc = P(&k->in->c);
    const size_t T = cc->p.seq_len, W = cc->p.width, n = CHUNK_CHANNELS, rows = cc->state ? cc->n_slots : 0;
    const tst_view *sv = view_of(k->in, STATE);
    k->y_dt = malloc(T * n * 4);
    k->w_abs = malloc(n * W * 4);
    k->b_abs = malloc(n * 4);
    k->x32 = malloc(T * n * sizeof *k->x32);
    k->y32 = malloc(T * n * sizeof *k->y32);
    k->m32 = malloc(T * n * sizeof *k->m32);
    k->st32 = malloc((rows * (W - 1) * n + 1) * sizeof *k->st32);
    bool ok = k->y_dt && k->w_abs && k->b_abs && k->x32 && k->y32 && k->m32 && k->st32;
    if (ok && sv) {
        const tst_region *r = &k->in->mem.r[sv->region];
        ok = (k->state_ref = malloc(r->len)) != NULL;
        if (ok)
            memcpy(k->state_ref, r->host, r->len);
    }
    for (int r = 0; r < k->in->mem.n_r && ok; r++)
        ok = (k->got[r] = tst_mem_download(&k->in->mem, r)) != NULL;
    return ok;
}

static void check_free(conv_check *k)
{
    for (int r = 0; r < TST_MAX_REGIONS; r++)
        free(k->got[r]);
    free(k->state_ref), free(k->y_dt), free(k->w_abs), free(k->b_abs);
    free(k->x32), free(k->y32), free(k->m32), free(k->st32);
}

static bool conv_verify(const tst_inst *in, tst_result *res)
{
    conv_check k = {.in = in};
    bool ok = check_alloc(&k);
    if (!ok)
        snprintf(res->msg, sizeof res->msg, "out of host memory or read back failed: %s", lmk_last_error());
    k.host = host_args(in, k.state_ref);
    for (size_t c0 = 0; ok && c0 < k.host.C; c0 += CHUNK_CHANNELS) {
        const size_t n = k.host.C - c0 < CHUNK_CHANNELS ? k.host.C - c0 : CHUNK_CHANNELS;
        reference_block(&k, c0, n);
        ok = compare_block(&k, c0, n, res);
    }
    ok = ok && compare_state(&k, res);
    if (ok)
        snprintf(res->msg, sizeof res->msg, "max err %.2g (%.2f of tol)%s", k.max_err, k.max_ratio,
                 in->arg[STATE] ? ", state bit-exact" : "");
    res->max_err = k.max_err;
    res->max_ratio = k.max_ratio;
    check_free(&k);
    return ok;
}

/* A dense operand of the case whose element count is not T * C (y of a wrong shape), or NULL. */
static lmk_buffer *wrong_shape(const tst_inst *in)
{
    const conv_case *cc = P(&in->c);
    const int dense_args[] = {WT, BIAS, CU, SLOTS};
    for (size_t i = 0; i < sizeof dense_args / sizeof dense_args[0]; i++) {
        lmk_buffer *b = in->arg[dense_args[i]];
        if (b && lmk_buffer_element_count(b) != (size_t)cc->p.seq_len * cc->p.channels)
            return b;
    }
    return NULL;
}

/* 0: width 9; 1: y of a wrong shape (or, when every dense operand has T * C elements, channels
 * C + 1, which x's shape then breaks); 2: state_slots without conv_state; 3: an unknown
 * activation. */
static lmk_status conv_invalid(const tst_inst *in, lmk_stream *s, int k, const char **want)
{
    const conv_case *cc = P(&in->c);
    static const char *const wants[] = {"width (9) must be in 2..8", "y element count", "state_slots given without",
                                        "unknown activation 7"};
    *want = wants[k];
    lmk_buffer *const *a = in->arg;
    lmk_causal_conv1d_params p = cc->p;
    lmk_buffer *y = a[Y], *slots = a[SLOTS], *state = a[STATE];
    if (k == 0)
        p.width = 9;
    if (k == 1 && (y = wrong_shape(in)) == NULL) {
        y = a[Y], p.channels++;
        *want = "causal_conv1d: x ";
    }
    if (k == 2)
        slots = a[SLOTS] ? a[SLOTS] : a[WT], state = NULL;
    if (k == 3)
        p.activation = (lmk_activation)7;
    return lmk_causal_conv1d(s, a[X], a[WT], a[BIAS], a[CU], slots, state, y, &p);
}

const tst_op tst_op_causal_conv1d = {
    .name = "causal_conv1d",
    .n_cases = conv_n_cases,
    .get_case = conv_get_case,
    .random_case = conv_random_case,
    .bench_cases = conv_bench_cases,
    .bytes = conv_bytes,
    .setup = conv_setup,
    .fill = conv_fill,
    .run = conv_run,
    .verify = conv_verify,
    .n_invalid = 4,
    .invalid = conv_invalid,
    .launches = 1,
};
