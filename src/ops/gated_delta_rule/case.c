/*
 * case.c - the case descriptor of gated_delta_rule (testkit/testkit.h): the Gated DeltaNet layers
 * of Qwen3.5/3.6 and Qwen3-Next as engines call them.
 *
 *   Qwen3.5/3.6-27B               Hk 16, Hv 48, dk = dv = 128
 *   Qwen3.5-35B-A3B, Qwen3-Next   Hk 16, Hv 32, dk = dv = 128
 *   decode                        one token of each of 1, 64 or 256 sequences, rows shuffled over a
 *                                 pool larger than the batch, some slots padding (-1, past the pool)
 *   prefill                       one sequence, or a varlen batch with empty and one-token sequences
 * q, k and v are strided views of the convolution's output row [T, 2*Hk*dk + Hv*dv] (q at 0, k at
 * Hk*dk, v at 2*Hk*dk) or dense tensors; z may be a slice of a wider projection row, a and b views
 * of one packed [T, 2*Hv] projection, out a view inside wider rows; the state pool f32 or bf16,
 * dv fastest (FLA, Hugging Face) or dk fastest (FlashInfer, ggml), its rows optionally padded;
 * both head maps, raw gates (A_log, dt_bias) or g and beta given, L2 norm on and off, z and
 * norm_w given or not with weight_offset 0 and 1, small odd head dims and the largest (256).
 *
 * Inputs are the test kit's values (uniform in [-2, 2), never zero), mapped to the ranges models
 * hold: A_log in [-2, 1) and dt_bias in [-4, 0), so with a in [-2, 2) the decays exp(g) spread
 * over (0.003, 1); g in [-3, 0) and beta in [0, 1) when given directly; norm_w around 1 for x * w,
 * around 0 for x * (1 + w); the state's rows scaled by 1/sqrt(dk) as a state built from unit keys
 * is. Without the L2 norm q and k are scaled to elements within 0.5/sqrt(dk) (|k| <= 0.5), so the
 * delta rule's step I - beta k k^T stays a contraction and the recurrence bounded.
 *
 * Verification runs the float64 reference (lmk_ref_gated_delta_rule) on q, k and v widened to f32
 * (exact) with an f32 output and an f32 copy of the state rows the call names, so its results are
 * the float64 ones rounded once to f32 (a relative 6e-8, far inside every tolerance). Every output
 * row of every (token, head) and every stored state row of every head must satisfy lmk.h's
 * norm-wise precision: ||got - ref|| <= tol * ||ref|| + the norm of half an ulp of the stored dtype
 * at each element (the output's or the pool's own rounding, which lmk.h counts in the budget),
 * with tol 1e-4 for f32 q/k/v/out and an f32 (or no) state and 4e-3 otherwise; an output row whose
 * o = S^T qn cancels by more than COND_MAX is held to tol times its terms' size / COND_MAX instead
 * (below, "the magnitude of each output row"). Pool rows no sequence stores, and rows whose
 * storing sequence is empty, must keep their bytes.
 */
#include "ops/gated_delta_rule/gated_delta_rule.h"
#include "ops/varlen.h"
#include "testkit_ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { Q, K, V, A, B, A_LOG, DT_BIAS, CU, SLOTS, STATE, Z, NORM_W, OUT, WS }; /* operands in tst_inst.arg */
enum { QKV_ROW, QKV_DENSE };               /* q, k, v views of the conv output row, or each dense */
enum { SEQ_ONE, SEQ_DECODE, SEQ_VARLEN, SEQ_EQUAL }; /* cu_seqlens NULL; T sequences of 1 token; a varlen
                                                         batch; n_seq sequences of T / n_seq tokens */
enum { SLOTS_NONE, SLOTS_SHUFFLED, SLOTS_PADDED };
enum { STATE_DENSE, STATE_KFAST, STATE_NONE }; /* a pool dv fastest or dk fastest; no pool */

typedef struct gdn_case {
    lmk_gdn_params p;
    lmk_dtype dtype;        /* q, k, v and out */
    lmk_dtype gate_dtype;   /* a and b */
    lmk_dtype w_dtype;      /* A_log, dt_bias and norm_w */
    lmk_dtype z_dtype;
    lmk_dtype state_dtype;  /* f32 or bf16 */
    lmk_dtype index_dtype;  /* cu_seqlens and state_slots: i32 or i64 */
    int layout, seqs, slots, state;
    bool g_beta;            /* a is g and b is beta (else A_log and dt_bias given) */
    bool no_z;              /* z and norm_w NULL */
    bool ab_packed;         /* a and b views of one [T, 2*Hv] projection */
    bool z_strided;         /* z the second half of [T, Hv, 2*dv] rows */
    bool out_strided;       /* out inside rows of Hv*dv + OUT_PAD elements */
    bool pool_padded;       /* pool rows POOL_PAD elements longer than a row's state */
    bool workspace;         /* the call gets a workspace of the chunked form's bytes (on CUDA: the
                               chunked kernels, where they take the call) */
    uint32_t n_seq, n_slots;
    uint32_t pattern;       /* seeds the varlen lengths */
} gdn_case;

_Static_assert(sizeof(gdn_case) <= TST_CASE_PARAMS, "gdn_case must fit in tst_case.p");

#define OUT_PAD 8
#define POOL_PAD 64

static const gdn_case *P(const tst_case *c)
{
    return (const gdn_case *)(const void *)c->p.bytes;
}

/* ---- sequences and slots, derived from the case alone (bytes() needs them too) ---- */

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Tokens of each sequence. A varlen batch: sequences 1, 6, 11, ... empty, 3, 8, ... one token
 * while tokens last, the rest spread at random (from the case's pattern) over the others. */
static void seq_lengths(const gdn_case *gc, uint32_t *len)
{
    const uint32_t n = gc->n_seq, T = gc->p.seq_len;
    if (gc->seqs == SEQ_EQUAL) {
        for (uint32_t s = 0; s < n; s++)
            len[s] = T / n + (s == n - 1 ? T % n : 0);
        return;
    }
    if (gc->seqs != SEQ_VARLEN) {
        for (uint32_t s = 0; s < n; s++)
            len[s] = gc->seqs == SEQ_ONE ? T : 1;
        return;
    }
    uint32_t left = T, n_open = 0;
    for (uint32_t s = 0; s < n; s++) {
        len[s] = s % 5 == 3 && left ? 1 : 0;
        left -= len[s];
        n_open += s % 5 != 1 && s % 5 != 3;
    }
    uint64_t h = gc->pattern;
    for (; left && n_open; left--) {
        uint32_t pick = (uint32_t)(splitmix(&h) % n_open), s = 0;
        for (;; s++)
            if (s % 5 != 1 && s % 5 != 3 && pick-- == 0)
                break;
        len[s]++;
    }
    len[n - 1] += left;
}

/* Whether sequence s has a pool row (padding: every fourth sequence from the third). */
static bool has_row(const gdn_case *gc, uint32_t s)
{
    if (gc->state == STATE_NONE)
        return false;
    return gc->slots == SLOTS_NONE ? s < gc->n_slots : gc->slots != SLOTS_PADDED || s % 4 != 2;
}

/* ---- the table ---- */

/* A row's zero fields are the models' defaults: q, k, v views of the conv output row, raw gates,
 * z and norm_w with x * w weights, a state pool dv fastest, tiled heads (GGUF's order). */
#define QWEN35_27B .p = {.n_k_heads = 16, .n_v_heads = 48, .k_dim = 128, .v_dim = 128, .norm = {.eps = 1e-6f}}
#define QWEN3_NEXT .p = {.n_k_heads = 16, .n_v_heads = 32, .k_dim = 128, .v_dim = 128, .norm = {.eps = 1e-6f}}
#define SMALL(hk, hv, dk, dv) .p = {.n_k_heads = (hk), .n_v_heads = (hv), .k_dim = (dk), .v_dim = (dv), \
                                    .norm = {.eps = 1e-6f}}
/* Hugging Face's order of the heads; llama.cpp's keeps the tiled order and the state dk fastest. */
#define HF .p.head_map = LMK_REPEAT_BLOCK
#define GGUF .state = STATE_KFAST
#define DECODE(rows) .seqs = SEQ_DECODE, .slots = SLOTS_PADDED, .n_slots = (rows)
#define CHUNKED .workspace = true

typedef struct row {
    gdn_case c;
    uint32_t T;
    lmk_dtype dtype;
    unsigned flags;
    const char *model;
} row;

static const row k_rows[] = {
    {{QWEN35_27B, HF, .seqs = SEQ_DECODE, .slots = SLOTS_SHUFFLED, .n_slots = 3}, 1, LMK_BF16, TST_CASE_CONTRACT,
     "Qwen3.5-27B decode"},
    {{QWEN35_27B, HF, DECODE(72)}, 64, LMK_BF16, 0, "Qwen3.5-27B decode batch"},
    {{QWEN3_NEXT, HF, DECODE(288), .state_dtype = LMK_BF16, .index_dtype = LMK_I64}, 256, LMK_BF16, TST_CASE_FULL,
     "Qwen3-Next decode batch"},
    {{QWEN35_27B, HF, .slots = SLOTS_SHUFFLED, .n_slots = 2}, 37, LMK_BF16, 0, "Qwen3.5-27B prompt"},
    {{QWEN3_NEXT, GGUF, .n_slots = 1}, 37, LMK_F32, 0, "Qwen3-Next prompt, GGUF"},
    {{QWEN35_27B, HF, .n_slots = 1}, 4106, LMK_BF16, TST_CASE_FULL, "Qwen3.5-27B prompt"},
    {{QWEN3_NEXT, GGUF, .n_slots = 1}, 4106, LMK_F32, TST_CASE_FULL, "Qwen3-Next prompt, GGUF"},
    {{QWEN3_NEXT, HF, .seqs = SEQ_VARLEN, .n_seq = 7, .slots = SLOTS_PADDED, .n_slots = 12,
      .state_dtype = LMK_BF16, .index_dtype = LMK_I64, .pattern = 7}, 40, LMK_BF16, 0, "Qwen3-Next varlen batch"},
    {{QWEN3_NEXT, HF, .seqs = SEQ_VARLEN, .n_seq = 3, .slots = SLOTS_SHUFFLED, .n_slots = 4,
      .state_dtype = LMK_BF16, .p.scale = 0.0625f, .pattern = 3}, 4, LMK_BF16, TST_CASE_CONTRACT,
     "Qwen3-Next varlen batch"},
    {{QWEN35_27B, HF, .state = STATE_NONE}, 9, LMK_F16, 0, "Qwen3.5-27B prompt, no state"},
    {{QWEN3_NEXT, HF, .g_beta = true, .n_slots = 1}, 17, LMK_F32, 0, "Qwen3-Next, FLA's g and beta"},
    {{QWEN3_NEXT, HF, .p.flags = LMK_GDN_NO_L2NORM, .n_slots = 1}, 17, LMK_BF16, 0, "Qwen3-Next"},
    {{QWEN35_27B, HF, .no_z = true, .n_slots = 1}, 5, LMK_F32, 0, "Qwen3.5-27B, no output norm"},
    {{QWEN3_NEXT, HF, .p.norm.weight_offset = 1.0f, .w_dtype = LMK_BF16, .z_strided = true, .out_strided = true,
      .ab_packed = true, .n_slots = 1}, 9, LMK_BF16, 0, "Qwen3-Next, (1 + w) weights"},
    {{QWEN35_27B, HF, DECODE(6), .pool_padded = true}, 4, LMK_F32, 0, "Qwen3.5-27B decode, padded pool rows"},
    {{SMALL(3, 3, 16, 24), .layout = QKV_DENSE, .seqs = SEQ_VARLEN, .n_seq = 6, .slots = SLOTS_SHUFFLED,
      .n_slots = 8, .pattern = 1}, 13, LMK_F32, TST_CASE_CONTRACT, "edge: odd head dims, Hk == Hv"},
    {{SMALL(1, 3, 7, 5), GGUF, .seqs = SEQ_DECODE, .n_slots = 2, .z_dtype = LMK_BF16}, 4, LMK_F16, 0,
     "edge: tiny head dims, more sequences than rows"},
    {{SMALL(1, 2, 256, 256), HF, .layout = QKV_DENSE, .n_slots = 1}, 3, LMK_F32, 0, "edge: the largest head dims"},
    {{SMALL(2, 8, 32, 64), HF, .seqs = SEQ_VARLEN, .n_seq = 4, .slots = SLOTS_PADDED, .n_slots = 5,
      .state = STATE_KFAST, .state_dtype = LMK_BF16, .p.flags = LMK_GDN_NO_L2NORM, .g_beta = true, .pattern = 11},
     19, LMK_BF16, 0, "edge: g and beta, bf16 dk-fastest state"},
    /* The chunked form (a workspace given): one chunk, one more token, a short second chunk; every
     * layout option; then prompts, varlen batches and the calls it leaves to the token kernel. */
    {{QWEN35_27B, HF, CHUNKED, .n_slots = 1}, 64, LMK_BF16, 0, "Qwen3.5-27B prompt, chunked"},
    {{QWEN35_27B, GGUF, CHUNKED, .n_slots = 2, .slots = SLOTS_SHUFFLED, .index_dtype = LMK_I64}, 65, LMK_BF16, 0,
     "Qwen3.5-27B prompt, chunked, GGUF"},
    {{QWEN3_NEXT, HF, CHUNKED, .n_slots = 1, .state_dtype = LMK_BF16, .z_strided = true, .out_strided = true,
      .ab_packed = true, .gate_dtype = LMK_BF16, .w_dtype = LMK_BF16, .p.norm.weight_offset = 1.0f}, 127, LMK_F16, 0,
     "Qwen3-Next prompt, chunked, f16, bf16 pool"},
    {{QWEN3_NEXT, CHUNKED, .layout = QKV_DENSE, .no_z = true, .g_beta = true, .state = STATE_NONE,
      .p.scale = 0.25f}, 130, LMK_BF16, 0, "Qwen3-Next, chunked, no z, g and beta, no state"},
    {{SMALL(2, 4, 64, 64), HF, CHUNKED, .seqs = SEQ_VARLEN, .n_seq = 3, .slots = SLOTS_PADDED, .n_slots = 4,
      .pattern = 5}, 200, LMK_BF16, 0, "edge: chunked at dk = dv = 64, varlen"},
    {{QWEN3_NEXT, HF, CHUNKED, .p.flags = LMK_GDN_NO_L2NORM, .n_slots = 1}, 70, LMK_BF16, 0,
     "Qwen3-Next, workspace, no L2 norm (the token kernel)"},
    {{QWEN3_NEXT, HF, CHUNKED, .n_slots = 1}, 70, LMK_F32, 0, "Qwen3-Next, workspace, f32 (the token kernel)"},
    {{QWEN35_27B, HF, CHUNKED, .n_slots = 1}, 4096, LMK_BF16, TST_CASE_FULL, "Qwen3.5-27B prompt, chunked"},
    {{QWEN3_NEXT, GGUF, CHUNKED, .n_slots = 1, .state_dtype = LMK_BF16}, 4100, LMK_BF16, TST_CASE_FULL,
     "Qwen3-Next prompt, chunked, GGUF"},
    {{QWEN35_27B, HF, CHUNKED, .seqs = SEQ_VARLEN, .n_seq = 11, .slots = SLOTS_PADDED, .n_slots = 16,
      .index_dtype = LMK_I64, .pattern = 9}, 1500, LMK_BF16, TST_CASE_FULL, "Qwen3.5-27B varlen batch, chunked"},
    {{QWEN3_NEXT, CHUNKED, .seqs = SEQ_VARLEN, .n_seq = 6, .slots = SLOTS_SHUFFLED, .n_slots = 9,
      .state = STATE_KFAST, .z_strided = true, .out_strided = true, .pattern = 21}, 2000, LMK_F16, TST_CASE_FULL,
     "Qwen3-Next varlen batch, chunked, tiled"},
};

static int gdn_n_cases(void)
{
    return (int)(sizeof k_rows / sizeof k_rows[0]);
}

/* "gated_delta_rule hk=16 hv=48 dk=128 dv=128 T=64 bf16 seqs=64x1 rows=72/padded state=f32 qkv-row
 * block z(w) // Qwen3.5-27B decode batch". */
static void set_case(tst_case *c, const gdn_case *g, unsigned flags, const char *model)
{
    memcpy(c->p.bytes, g, sizeof *g);
    c->flags = flags;
    c->T = g->p.seq_len;
    c->dtype = g->dtype;
    static const char *const seqs[] = {"one", "decode", "varlen", "equal"},
                             *const slots[] = {"row=s", "shuffled", "padded"},
                             *const layouts[] = {"", "-dk-fastest"};
    char state[96] = "state=none", extra[96];
    if (g->state != STATE_NONE)
        snprintf(state, sizeof state, "state=%s%s%s rows=%u/%s%s", lmk_dtype_name(g->state_dtype), layouts[g->state],
                 g->pool_padded ? "-padded" : "", g->n_slots, slots[g->slots],
                 g->index_dtype == LMK_I64 ? "/i64" : "");
    snprintf(extra, sizeof extra, "%s%s%s%s%s%s", g->layout == QKV_ROW ? " qkv-row" : "", g->ab_packed ? " a|b" : "",
             g->z_strided ? " z-strided" : "", g->out_strided ? " out-strided" : "",
             g->p.scale != 0.0f ? " scale" : "", g->workspace ? " workspace" : "");
    tst_case_name(c, "gated_delta_rule hk=%u hv=%u dk=%u dv=%u T=%u %s seqs=%s/%u %s%s %s %s %s // %s",
                  g->p.n_k_heads, g->p.n_v_heads, g->p.k_dim, g->p.v_dim, g->p.seq_len, lmk_dtype_name(g->dtype),
                  seqs[g->seqs], g->n_seq, state, extra, g->p.head_map == LMK_REPEAT_BLOCK ? "block" : "tiled",
                  g->g_beta ? "g,beta" : "gates",
                  g->no_z ? "no-z" : g->p.norm.weight_offset != 0.0f ? "z(1+w)" : "z(w)",
                  model);
    if (g->p.flags & LMK_GDN_NO_L2NORM)
        snprintf(c->name + strlen(c->name), TST_CASE_NAME - strlen(c->name), " (no L2 norm)");
}

/* Fills the fields a table row leaves to defaults: a, b, A_log, dt_bias and norm_w f32, z in the
 * dtype of q (z_dtype 0 is f32 only where the dtype is), an f32 state, i32 indices. */
static void complete(gdn_case *g, uint32_t T, lmk_dtype dtype)
{
    g->p.seq_len = T;
    g->dtype = dtype;
    g->n_seq = g->seqs == SEQ_ONE ? 1 : g->seqs == SEQ_DECODE ? T : g->n_seq;
    if (g->z_dtype == LMK_F32)
        g->z_dtype = dtype;
    if (!g->index_dtype)
        g->index_dtype = LMK_I32;
}

static void gdn_get_case(int i, tst_case *c)
{
    gdn_case g = k_rows[i].c;
    complete(&g, k_rows[i].T, k_rows[i].dtype);
    set_case(c, &g, k_rows[i].flags, k_rows[i].model);
}

/* Shrinks the state's head dims until a pool row of every head holds at most `cap` elements. */
static void fit_state(lmk_gdn_params *p, size_t cap)
{
    while ((size_t)p->n_v_heads * p->k_dim * p->v_dim > cap) {
        if (p->k_dim >= p->v_dim)
            p->k_dim = (p->k_dim + 1) / 2;
        else
            p->v_dim = (p->v_dim + 1) / 2;
    }
}

/* A random valid call drawing every option; every operand at most ~32 K elements. One draw per
 * statement, so a seed gives the same case with any compiler. */
static void gdn_random_case(tst_rng *r, tst_case *c)
{
    static const lmk_dtype fl[] = {LMK_F32, LMK_BF16, LMK_F16};
    gdn_case g = {.p = {.norm = {.eps = 1e-6f}}};
    lmk_gdn_params *p = &g.p;
    p->n_k_heads = 1 + tst_rng_below(r, 4);
    p->n_v_heads = p->n_k_heads * (1 + tst_rng_below(r, 3));
    p->k_dim = 1 + tst_rng_below(r, 64);
    p->v_dim = 1 + tst_rng_below(r, 64);
    p->head_map = (lmk_repeat_layout)tst_rng_below(r, 2);
    p->flags = tst_rng_below(r, 4) == 0 ? LMK_GDN_NO_L2NORM : 0;
    p->scale = tst_rng_below(r, 3) == 0 ? (float)tst_rng_uniform(r, 0.05, 1.0) : 0.0f;
    p->norm.weight_offset = (float)tst_rng_below(r, 2);
    const lmk_dtype dtype = fl[tst_rng_below(r, 3)];
    g.gate_dtype = fl[tst_rng_below(r, 3)];
    g.w_dtype = fl[tst_rng_below(r, 3)];
    const lmk_dtype z_dtype = fl[tst_rng_below(r, 3)];
    g.state_dtype = tst_rng_below(r, 2) ? LMK_F32 : LMK_BF16;
    g.index_dtype = tst_rng_below(r, 2) ? LMK_I32 : LMK_I64;
    g.layout = (int)tst_rng_below(r, 2);
    g.seqs = (int)tst_rng_below(r, 3);
    g.slots = (int)tst_rng_below(r, 3);
    g.state = (int)tst_rng_below(r, 3);
    g.g_beta = tst_rng_below(r, 2);
    g.no_z = tst_rng_below(r, 3) == 0;
    g.ab_packed = tst_rng_below(r, 2);
    g.z_strided = tst_rng_below(r, 2);
    g.out_strided = tst_rng_below(r, 2);
    g.pool_padded = tst_rng_below(r, 4) == 0;
    g.pattern = tst_rng_u32(r);
    g.workspace = tst_rng_below(r, 4) == 0;
    const size_t per_token = 2 * (size_t)p->n_k_heads * p->k_dim + 2 * (size_t)p->n_v_heads * p->v_dim + OUT_PAD;
    const uint32_t t_max = (uint32_t)(32768 / per_token < 24 ? 32768 / per_token : 24);
    const uint32_t T = 1 + tst_rng_below(r, t_max);
    g.n_seq = g.seqs == SEQ_VARLEN ? 1 + tst_rng_below(r, 8) : 1;
    fit_state(p, 16384);
    const uint32_t max_rows = (uint32_t)(32768 / ((size_t)p->n_v_heads * p->k_dim * p->v_dim + POOL_PAD));
    const uint32_t n_seq = g.seqs == SEQ_DECODE ? T : g.n_seq;
    if (g.slots != SLOTS_NONE && n_seq > max_rows)
        g.slots = SLOTS_NONE; /* distinct rows for every sequence do not fit: sequences past the pool pad */
    g.n_slots = g.slots == SLOTS_NONE ? 1 + tst_rng_below(r, max_rows) : n_seq + tst_rng_below(r, max_rows - n_seq + 1);
    complete(&g, T, dtype);
    g.z_dtype = z_dtype;
    set_case(c, &g, 0, "random");
}

#define BENCH_BATCHES 4
#define BENCH_PROMPTS 4

/* Qwen3.5/3.6-27B with an f32 state pool: at T = 1 decode steps of 1, 64, 256 and 512 sequences
 * (one token each, rows shuffled over a pool of as many rows). At larger T, prompts with the
 * workspace (the chunked form on CUDA), allocated with the case, outside the timed calls: one
 * sequence of T tokens of Qwen3.5-27B and of Qwen3.5-35B-A3B, four sequences of T / 4 tokens of
 * Qwen3.5-27B; and one sequence of Qwen3.5-27B without a workspace (the token kernel). Their
 * nominal work is 4 * T * Hv * dk * dv multiply-adds counted twice (the token form's). */
static int gdn_bench_cases(uint32_t T, lmk_dtype dtype, bool longest, tst_case *out, int max)
{
    (void)longest;
    static const uint32_t batches[BENCH_BATCHES] = {1, 64, 256, 512};
    int n = 0;
    for (int i = 0; i < (T == 1 ? BENCH_BATCHES : BENCH_PROMPTS) && n < max; i++) {
        gdn_case g = {QWEN35_27B, HF};
        char model[64];
        if (T == 1) {
            g.seqs = SEQ_DECODE, g.slots = SLOTS_SHUFFLED, g.n_slots = batches[i];
            snprintf(model, sizeof model, "Qwen3.5-27B decode batch %u", batches[i]);
        } else if (i == 1 && T >= 4) {
            g.seqs = SEQ_EQUAL, g.n_seq = 4, g.slots = SLOTS_SHUFFLED, g.n_slots = 4, g.workspace = true;
            snprintf(model, sizeof model, "Qwen3.5-27B 4 prompts");
        } else {
            if (i == 2)
                g.p = (lmk_gdn_params){.n_k_heads = 16, .n_v_heads = 32, .k_dim = 128, .v_dim = 128,
                                       .head_map = LMK_REPEAT_BLOCK, .norm = {.eps = 1e-6f}};
            g.n_slots = 1, g.workspace = i != 3;
            snprintf(model, sizeof model, "%s prompt%s", i == 2 ? "Qwen3.5-35B-A3B" : "Qwen3.5-27B",
                     i == 3 ? ", token kernel" : "");
        }
        complete(&g, T == 1 ? batches[i] : T, dtype);
        set_case(&out[n++], &g, 0, model);
    }
    return n;
}

/* The bytes the op must move: q, k, v, a, b, z and out once, the weights once, cu_seqlens and
 * state_slots, and the state row of every sequence that has one and a token, read and written
 * once (an empty sequence leaves its row as it was; padding reads nothing). */
static double gdn_bytes(const tst_case *c)
{
    const gdn_case *g = P(c);
    const double T = g->p.seq_len, hk = g->p.n_k_heads, hv = g->p.n_v_heads, dk = g->p.k_dim, dv = g->p.v_dim;
    const double es = (double)lmk_dtype_size(g->dtype), ew = (double)lmk_dtype_size(g->w_dtype);
    double b = T * (2.0 * hk * dk + 2.0 * hv * dv) * es + 2.0 * T * hv * (double)lmk_dtype_size(g->gate_dtype);
    b += !g->g_beta ? 2.0 * hv * ew : 0.0;
    b += !g->no_z ? T * hv * dv * (double)lmk_dtype_size(g->z_dtype) + dv * ew : 0.0;
    const double ei = (double)lmk_dtype_size(g->index_dtype);
    b += g->seqs != SEQ_ONE ? (g->n_seq + 1.0) * ei : 0.0;
    b += g->state != STATE_NONE && g->slots != SLOTS_NONE ? g->n_seq * ei : 0.0;
    uint32_t *len = malloc(g->n_seq * sizeof *len);
    if (!len)
        return b;
    seq_lengths(g, len);
    double rows = 0.0;
    for (uint32_t s = 0; s < g->n_seq; s++)
        rows += has_row(g, s) && len[s] > 0;
    free(len);
    return b + 2.0 * rows * hv * dk * dv * (double)lmk_dtype_size(g->state_dtype);
}

/* ---- on a device ---- */

/* A region of `bytes` with guards; host copy when it holds inputs. */
static lmk_status region(tst_inst *in, size_t bytes, bool input, int *r)
{
    return tst_mem_region(&in->mem, 2 * TST_GUARD + bytes, input, r);
}

static lmk_status view3(tst_inst *in, int r, size_t at_elems, lmk_dtype t, size_t n0, size_t n1, size_t n2,
                        const size_t *stride, bool output, lmk_buffer **out)
{
    const size_t n[3] = {n0, n1, n2};
    return tst_mem_view(&in->mem, r, TST_GUARD + at_elems * lmk_dtype_size(t), t, n, stride, output, out);
}

/* A dense [n0, n1, n2] tensor in a region of its own. */
static lmk_status dense(tst_inst *in, lmk_dtype t, size_t n0, size_t n1, size_t n2, bool output, lmk_buffer **out)
{
    int r;
    lmk_status st = region(in, n0 * n1 * n2 * lmk_dtype_size(t), true, &r);
    return st == LMK_OK ? view3(in, r, 0, t, n0, n1, n2, NULL, output, out) : st;
}

/* q, k and v: dense, or views of one [T, 2*Hk*dk + Hv*dv] convolution output. */
static lmk_status setup_qkv(tst_inst *in)
{
    const gdn_case *g = P(&in->c);
    const size_t T = g->p.seq_len, hk = g->p.n_k_heads, hv = g->p.n_v_heads, dk = g->p.k_dim, dv = g->p.v_dim;
    if (g->layout == QKV_DENSE) {
        lmk_status st = dense(in, g->dtype, T, hk, dk, false, &in->arg[Q]);
        if (st == LMK_OK)
            st = dense(in, g->dtype, T, hk, dk, false, &in->arg[K]);
        return st == LMK_OK ? dense(in, g->dtype, T, hv, dv, false, &in->arg[V]) : st;
    }
    const size_t row = 2 * hk * dk + hv * dv, sk[3] = {row, dk, 1}, sv[3] = {row, dv, 1};
    int r;
    lmk_status st = region(in, T * row * lmk_dtype_size(g->dtype), true, &r);
    if (st == LMK_OK)
        st = view3(in, r, 0, g->dtype, T, hk, dk, sk, false, &in->arg[Q]);
    if (st == LMK_OK)
        st = view3(in, r, hk * dk, g->dtype, T, hk, dk, sk, false, &in->arg[K]);
    return st == LMK_OK ? view3(in, r, 2 * hk * dk, g->dtype, T, hv, dv, sv, false, &in->arg[V]) : st;
}

/* a and b: dense [T, Hv] each, or 2-D views of one [T, 2*Hv] projection (a, then b). */
static lmk_status setup_gates(tst_inst *in)
{
    const gdn_case *g = P(&in->c);
    const size_t T = g->p.seq_len, hv = g->p.n_v_heads, es = lmk_dtype_size(g->gate_dtype);
    if (!g->ab_packed) {
        lmk_status st = dense(in, g->gate_dtype, T, 1, hv, false, &in->arg[A]);
        return st == LMK_OK ? dense(in, g->gate_dtype, T, 1, hv, false, &in->arg[B]) : st;
    }
    const size_t n[2] = {T, hv}, s[2] = {2 * hv, 1};
    int r;
    lmk_status st = region(in, T * 2 * hv * es, true, &r);
    if (st == LMK_OK)
        st = tst_mem_view_nd(&in->mem, r, TST_GUARD, g->gate_dtype, 2, n, s, false, &in->arg[A]);
    return st == LMK_OK ? tst_mem_view_nd(&in->mem, r, TST_GUARD + hv * es, g->gate_dtype, 2, n, s, false,
                                          &in->arg[B])
                        : st;
}

/* The state pool [n_slots, Hv, dk, dv]: dv fastest or dk fastest, rows optionally padded. */
static lmk_status setup_state(tst_inst *in)
{
    const gdn_case *g = P(&in->c);
    const size_t hv = g->p.n_v_heads, dk = g->p.k_dim, dv = g->p.v_dim;
    const size_t row = hv * dk * dv + (g->pool_padded ? POOL_PAD : 0);
    const size_t n[4] = {g->n_slots, hv, dk, dv};
    const size_t s[4] = {row, dk * dv, g->state == STATE_KFAST ? 1 : dv, g->state == STATE_KFAST ? dk : 1};
    int r;
    lmk_status st = region(in, g->n_slots * row * lmk_dtype_size(g->state_dtype), true, &r);
    return st == LMK_OK ? tst_mem_view_nd(&in->mem, r, TST_GUARD, g->state_dtype, 4, n, s, true, &in->arg[STATE])
                        : st;
}

/* z (dense, or the second half of [T, Hv, 2*dv] rows), norm_w and out (dense, or inside rows of
 * Hv*dv + OUT_PAD elements). */
static lmk_status setup_z_out(tst_inst *in)
{
    const gdn_case *g = P(&in->c);
    const size_t T = g->p.seq_len, hv = g->p.n_v_heads, dv = g->p.v_dim;
    lmk_status st = LMK_OK;
    int r;
    if (!g->no_z && g->z_strided) {
        const size_t s[3] = {hv * 2 * dv, 2 * dv, 1};
        st = region(in, T * hv * 2 * dv * lmk_dtype_size(g->z_dtype), true, &r);
        if (st == LMK_OK)
            st = view3(in, r, dv, g->z_dtype, T, hv, dv, s, false, &in->arg[Z]);
    } else if (!g->no_z) {
        st = dense(in, g->z_dtype, T, hv, dv, false, &in->arg[Z]);
    }
    if (st == LMK_OK && !g->no_z)
        st = dense(in, g->w_dtype, 1, 1, dv, false, &in->arg[NORM_W]);
    if (st != LMK_OK || !g->out_strided)
        return st == LMK_OK ? dense(in, g->dtype, T, hv, dv, true, &in->arg[OUT]) : st;
    const size_t s[3] = {hv * dv + OUT_PAD, dv, 1};
    st = region(in, T * s[0] * lmk_dtype_size(g->dtype), true, &r);
    return st == LMK_OK ? view3(in, r, 0, g->dtype, T, hv, dv, s, true, &in->arg[OUT]) : st;
}

/* The workspace: a u8 view of the chunked form's bytes (lmk_gdn_chunk_plan, the size
 * lmk_gated_delta_rule_workspace answers on CUDA), at least 1 byte (the CPU ignores it), an output
 * the kernels may write anywhere in; the region's guards must hold. */
static lmk_status setup_workspace(tst_inst *in)
{
    const gdn_case *g = P(&in->c);
    const size_t n_seq = g->seqs == SEQ_ONE ? 1 : g->n_seq;
    const lmk_gdn_chunk_layout l =
        lmk_gdn_chunk_plan(g->p.seq_len, n_seq, g->p.n_k_heads, g->p.n_v_heads, g->p.k_dim, g->p.v_dim);
    const size_t n[1] = {l.total ? l.total : 1}, s[1] = {1};
    int r;
    lmk_status st = region(in, n[0], false, &r);
    return st == LMK_OK ? tst_mem_view_nd(&in->mem, r, TST_GUARD, LMK_U8, 1, n, s, true, &in->arg[WS]) : st;
}

static lmk_status gdn_setup(tst_inst *in)
{
    const gdn_case *g = P(&in->c);
    const size_t hv = g->p.n_v_heads;
    lmk_status st = setup_qkv(in);
    if (st == LMK_OK)
        st = setup_gates(in);
    if (st == LMK_OK && !g->g_beta)
        st = dense(in, g->w_dtype, 1, 1, hv, false, &in->arg[A_LOG]);
    if (st == LMK_OK && !g->g_beta)
        st = dense(in, g->w_dtype, 1, 1, hv, false, &in->arg[DT_BIAS]);
    if (st == LMK_OK && g->seqs != SEQ_ONE)
        st = dense(in, g->index_dtype, 1, 1, g->n_seq + 1, false, &in->arg[CU]);
    if (st == LMK_OK && g->state != STATE_NONE && g->slots != SLOTS_NONE)
        st = dense(in, g->index_dtype, 1, 1, g->n_seq, false, &in->arg[SLOTS]);
    if (st == LMK_OK && g->state != STATE_NONE)
        st = setup_state(in);
    if (st == LMK_OK)
        st = setup_z_out(in);
    return st == LMK_OK && g->workspace ? setup_workspace(in) : st;
}

/* ---- filling ---- */

typedef struct affine_map {
    unsigned char *host;
    lmk_dtype dtype;
    double mul, add;
} affine_map;

static void affine_run(void *ctx, size_t elem, size_t len)
{
    const affine_map *m = ctx;
    for (size_t i = elem; i < elem + len; i++)
        tst_store(m->dtype, m->host, i, tst_load(m->dtype, m->host, i) * m->mul + m->add);
}

/* Operand `arg` filled with the kit's values x in [-2, 2), then mapped to x * mul + add. */
static void fill_mapped(tst_inst *in, tst_rng *r, int arg, double mul, double add)
{
    tst_inst_fill(in, in->arg[arg], r);
    const tst_view *v = tst_mem_find(&in->mem, in->arg[arg]);
    affine_map m = {.host = tst_mem_host(&in->mem, in->arg[arg]), .dtype = v ? v->dtype : LMK_F32, .mul = mul,
                    .add = add};
    if (v && m.host && (mul != 1.0 || add != 0.0))
        tst_view_runs(v, affine_run, &m);
}

static void put_index(lmk_dtype t, unsigned char *host, size_t i, int64_t v)
{
    if (t == LMK_I64) {
        memcpy(host + 8 * i, &v, 8);
    } else {
        const int32_t v32 = (int32_t)v;
        memcpy(host + 4 * i, &v32, 4);
    }
}

/* cu_seqlens from the case's lengths; state_slots distinct rows shuffled over the pool, padding
 * sequences -1 or past the pool. */
static void fill_sequences(tst_inst *in, tst_rng *r)
{
    const gdn_case *g = P(&in->c);
    uint32_t *len = malloc(g->n_seq * sizeof *len);
    int64_t *rows = malloc((g->n_slots + 1) * sizeof *rows);
    if (len && rows && in->arg[CU]) {
        seq_lengths(g, len);
        unsigned char *cu = tst_mem_host(&in->mem, in->arg[CU]);
        int64_t at = 0;
        put_index(g->index_dtype, cu, 0, 0);
        for (uint32_t s = 0; s < g->n_seq; s++)
            put_index(g->index_dtype, cu, s + 1, at += len[s]);
    }
    if (len && rows && in->arg[SLOTS]) {
        for (uint32_t i = 0; i < g->n_slots; i++)
            rows[i] = i;
        for (uint32_t i = g->n_slots - 1; i > 0; i--) { /* Fisher-Yates */
            const uint32_t j = tst_rng_below(r, i + 1);
            const int64_t t = rows[i];
            rows[i] = rows[j], rows[j] = t;
        }
        unsigned char *slots = tst_mem_host(&in->mem, in->arg[SLOTS]);
        for (uint32_t s = 0; s < g->n_seq; s++)
            put_index(g->index_dtype, slots, s, has_row(g, s) ? rows[s] : s % 8 == 2 ? -1 : (int64_t)g->n_slots + s);
    }
    free(len);
    free(rows);
}

static void gdn_fill(tst_inst *in, tst_rng *r)
{
    const gdn_case *g = P(&in->c);
    const double qk = g->p.flags & LMK_GDN_NO_L2NORM ? 0.25 / sqrt((double)g->p.k_dim) : 1.0;
    fill_mapped(in, r, Q, qk, 0.0);
    fill_mapped(in, r, K, qk, 0.0);
    fill_mapped(in, r, V, 1.0, 0.0);
    fill_mapped(in, r, A, g->g_beta ? 0.75 : 1.0, g->g_beta ? -1.5 : 0.0); /* g in [-3, 0) */
    fill_mapped(in, r, B, g->g_beta ? 0.25 : 1.0, g->g_beta ? 0.5 : 0.0);  /* beta in [0, 1) */
    if (!g->g_beta) {
        fill_mapped(in, r, A_LOG, 0.75, -0.5); /* [-2, 1) */
        fill_mapped(in, r, DT_BIAS, 1.0, -2.0); /* [-4, 0) */
    }
    if (!g->no_z) {
        fill_mapped(in, r, Z, 1.0, 0.0);
        fill_mapped(in, r, NORM_W, 0.25, 1.0 - (double)g->p.norm.weight_offset);
    }
    if (g->state != STATE_NONE)
        fill_mapped(in, r, STATE, 1.0 / sqrt((double)g->p.k_dim), 0.0);
    fill_sequences(in, r);
}

static lmk_gdn_io io_of(const tst_inst *in)
{
    lmk_buffer *const *a = in->arg;
    return (lmk_gdn_io){.q = a[Q], .k = a[K], .v = a[V], .a = a[A], .b = a[B], .A_log = a[A_LOG],
                        .dt_bias = a[DT_BIAS], .cu_seqlens = a[CU], .state_slots = a[SLOTS], .state = a[STATE],
                        .z = a[Z], .norm_w = a[NORM_W], .out = a[OUT], .workspace = a[WS]};
}

static lmk_status gdn_run(const tst_inst *in, lmk_stream *s)
{
    const lmk_gdn_io io = io_of(in);
    return lmk_gated_delta_rule(s, &io, &P(&in->c)->p);
}

/* ---- verification ---- */

/* What one verification holds: the reference's host arguments and results, the regions read back. */
typedef struct gdn_check {
    lmk_gdn_args a;          /* over the widened copies below */
    float *q32, *k32, *v32;  /* q, k, v widened to f32, dense */
    float *out32;            /* the reference's output, dense [T, Hv, dv] */
    float *pool32;           /* the reference's state: one dense row per pool row the call names */
    int64_t *slots32;        /* each sequence's row of pool32, or -1 */
    int64_t *compact;        /* each pool row's row of pool32, or -1 */
    uint32_t *len;           /* tokens of each sequence */
    float *mag;              /* ||m|| of each out row (row_magnitudes) */
    unsigned char *got[TST_MAX_REGIONS];
    double tol, max_err, max_ratio;
} gdn_check;

/* The elements of the view of operand `arg` as read back. */
static const unsigned char *got_of(const tst_inst *in, const gdn_check *k, int arg)
{
    const tst_view *v = tst_mem_find(&in->mem, in->arg[arg]);
    return k->got[v->region] + v->off;
}

/* A [T, H, d] operand's host copy widened to a dense f32 array. */
static float *widen(const tst_inst *in, int arg)
{
    const tst_view *v = tst_mem_find(&in->mem, in->arg[arg]);
    const unsigned char *host = tst_mem_host(&in->mem, in->arg[arg]);
    float *w = malloc(v->n[0] * v->n[1] * v->n[2] * sizeof *w);
    for (size_t t = 0; w && t < v->n[0]; t++)
        for (size_t h = 0; h < v->n[1]; h++)
            for (size_t i = 0; i < v->n[2]; i++)
                w[(t * v->n[1] + h) * v->n[2] + i] =
                    (float)tst_load(v->dtype, host, t * v->stride[0] + h * v->stride[1] + i);
    return w;
}

/* The pool rows the call names, in a compact f32 pool of their own (initial values widened from
 * the host copy), and each sequence's row in it. */
static bool compact_state(const tst_inst *in, gdn_check *k)
{
    const gdn_case *g = P(&in->c);
    const tst_view *v = tst_mem_find(&in->mem, in->arg[STATE]);
    const unsigned char *host = tst_mem_host(&in->mem, in->arg[STATE]), *slots = NULL;
    if (in->arg[SLOTS])
        slots = tst_mem_host(&in->mem, in->arg[SLOTS]);
    const size_t per_row = (size_t)g->p.n_v_heads * g->p.k_dim * g->p.v_dim;
    k->compact = malloc((g->n_slots + 1) * sizeof *k->compact);
    k->pool32 = malloc((g->n_seq < g->n_slots ? g->n_seq : g->n_slots) * per_row * sizeof *k->pool32 + 1);
    if (!k->compact || !k->pool32)
        return false;
    for (uint32_t i = 0; i < g->n_slots; i++)
        k->compact[i] = -1;
    int64_t used = 0;
    for (size_t s = 0; s < g->n_seq; s++) {
        const int64_t row = lmk_seq_slot(slots, g->index_dtype == LMK_I64, s, g->n_slots);
        if (row >= 0 && k->compact[row] < 0) {
            float *dst = k->pool32 + (size_t)used * per_row;
            for (size_t h = 0; h < v->n[1]; h++)
                for (size_t i = 0; i < v->n[2]; i++)
                    for (size_t j = 0; j < v->n[3]; j++)
                        dst[(h * v->n[2] + i) * v->n[3] + j] = (float)tst_load(
                            v->dtype, host, (size_t)row * v->stride[0] + h * v->stride[1] + i * v->stride[2] +
                                                j * v->stride[3]);
            k->compact[row] = used++;
        }
        k->slots32[s] = row >= 0 ? k->compact[row] : -1;
    }
    k->a.state = k->pool32, k->a.state_dtype = LMK_F32, k->a.n_slots = (size_t)used;
    k->a.s_slot = per_row, k->a.s_head = (size_t)g->p.k_dim * g->p.v_dim, k->a.s_k = g->p.v_dim, k->a.s_v = 1;
    k->a.slots = k->slots32, k->a.slots_is64 = 1;
    return true;
}

/* The reference's arguments over host copies, resolved as lmk_gated_delta_rule resolves the call
 * (the scale as op.c resolves it). */
static bool host_args(const tst_inst *in, gdn_check *k)
{
    const gdn_case *g = P(&in->c);
    const tst_mem *m = &in->mem;
    const size_t T = g->p.seq_len, hk = g->p.n_k_heads, hv = g->p.n_v_heads, dk = g->p.k_dim, dv = g->p.v_dim;
    const tst_view *va = tst_mem_find(m, in->arg[A]), *vb = tst_mem_find(m, in->arg[B]);
    const tst_view *vz = in->arg[Z] ? tst_mem_find(m, in->arg[Z]) : NULL;
    k->q32 = widen(in, Q), k->k32 = widen(in, K), k->v32 = widen(in, V);
    k->out32 = malloc(T * hv * dv * sizeof *k->out32);
    k->slots32 = malloc(g->n_seq * sizeof *k->slots32);
    k->len = malloc(g->n_seq * sizeof *k->len);
    if (!k->q32 || !k->k32 || !k->v32 || !k->out32 || !k->slots32 || !k->len)
        return false;
    k->a = (lmk_gdn_args){
        .q = k->q32, .k = k->k32, .v = k->v32, .out = k->out32, .dtype = LMK_F32, .T = T, .Hk = hk, .Hv = hv,
        .dk = dk, .dv = dv, .q_tok = hk * dk, .q_head = dk, .k_tok = hk * dk, .k_head = dk, .v_tok = hv * dv,
        .v_head = dv, .o_tok = hv * dv, .o_head = dv,
        .a = tst_mem_host(m, in->arg[A]), .b = tst_mem_host(m, in->arg[B]), .a_dtype = g->gate_dtype,
        .b_dtype = g->gate_dtype, .a_tok = va->stride[0], .b_tok = vb->stride[0],
        .A_log = in->arg[A_LOG] ? tst_mem_host(m, in->arg[A_LOG]) : NULL,
        .dt_bias = in->arg[DT_BIAS] ? tst_mem_host(m, in->arg[DT_BIAS]) : NULL,
        .A_dtype = g->w_dtype, .dt_dtype = g->w_dtype,
        .z = vz ? tst_mem_host(m, in->arg[Z]) : NULL, .z_dtype = g->z_dtype, .z_tok = vz ? vz->stride[0] : 0,
        .z_head = vz ? vz->stride[1] : 0, .norm_w = in->arg[NORM_W] ? tst_mem_host(m, in->arg[NORM_W]) : NULL,
        .nw_dtype = g->w_dtype,
        .cu_seqlens = in->arg[CU] ? tst_mem_host(m, in->arg[CU]) : NULL, .cu_is64 = g->index_dtype == LMK_I64,
        .n_seq = g->n_seq, .head_map = g->p.head_map,
        .scale = g->p.scale != 0.0f ? g->p.scale : 1.0f / sqrtf((float)dk),
        .l2norm = !(g->p.flags & LMK_GDN_NO_L2NORM), .eps = g->p.norm.eps, .weight_offset = g->p.norm.weight_offset,
    };
    for (size_t s = 0; s < g->n_seq; s++) {
        size_t lo, hi;
        lmk_seq_bounds(k->a.cu_seqlens, k->a.cu_is64, s, T, &lo, &hi);
        k->len[s] = (uint32_t)(hi - lo);
    }
    return in->arg[STATE] ? compact_state(in, k) : true;
}

/* ---- the magnitude of each output row before cancellation ----
 *
 * o = S^T qn sums dk products, and a row whose sum cancels (qn nearly orthogonal to S's columns:
 * the first token of a sequence without a state has o = u (kn . qn)) is small next to its terms. A
 * relative bound on such a row asks f32 for more digits than its terms carry, so the bound of a
 * row whose terms are more than COND_MAX times its norm grows with them: ||got - ref|| <= tol *
 * max(||ref||, ||m|| / COND_MAX), m_j = f_j * sum_i |S_ij qn_i| (S after the token's update, f_j
 * the output norm's factor r * |norm_w_j + offset| * |silu(z_j)|, or 1 without z). For terms of
 * random signs ||m|| is about sqrt(2 dk / pi) ||o|| (9 at dk 128), so most rows keep the plain
 * bound; an f32 evaluation's error stays within a few ulps of ||m||, far inside tol * ||m|| / 16. */
#define COND_MAX 16.0

/* The decay exp(g) and beta of token t, head h, in double. */
static void mag_gates(const lmk_gdn_args *a, size_t t, size_t h, double *decay, double *beta)
{
    const double x = lmk_float_load(a->a_dtype, a->a, t * a->a_tok + h);
    const double y = lmk_float_load(a->b_dtype, a->b, t * a->b_tok + h);
    if (!a->A_log) {
        *decay = exp(x), *beta = y;
        return;
    }
    const double s = x + lmk_float_load(a->dt_dtype, a->dt_bias, h);
    *decay = exp(-exp(lmk_float_load(a->A_dtype, a->A_log, h)) * (s > 0 ? s + log1p(exp(-s)) : log1p(exp(s))));
    *beta = 1.0 / (1.0 + exp(-y));
}

/* One token of head h on S (dk x dv doubles; w: 2 dk + 3 dv doubles of scratch): ||m||. */
static double mag_step(const lmk_gdn_args *a, size_t t, size_t h, double *S, double *w)
{
    const size_t dk = a->dk, dv = a->dv, kh = lmk_gdn_k_head(a, h);
    double *qn = w, *kn = w + dk, *u = w + 2 * dk, *o = u + dv, *m = o + dv, decay, beta, qq = 0, kk = 0, ms = 0;
    mag_gates(a, t, h, &decay, &beta);
    for (size_t i = 0; i < dk; i++) {
        qn[i] = lmk_float_load(a->dtype, a->q, t * a->q_tok + kh * a->q_head + i);
        kn[i] = lmk_float_load(a->dtype, a->k, t * a->k_tok + kh * a->k_head + i);
        qq += qn[i] * qn[i], kk += kn[i] * kn[i];
    }
    const double rq = (a->l2norm ? 1.0 / sqrt(qq + 1e-6) : 1.0) * a->scale;
    const double rk = a->l2norm ? 1.0 / sqrt(kk + 1e-6) : 1.0;
    for (size_t i = 0; i < dk; i++)
        qn[i] *= rq, kn[i] *= rk;
    for (size_t j = 0; j < dv; j++) {
        double sk = 0;
        for (size_t i = 0; i < dk; i++)
            sk += S[i * dv + j] * kn[i];
        u[j] = beta * (lmk_float_load(a->dtype, a->v, t * a->v_tok + h * a->v_head + j) - decay * sk);
        o[j] = m[j] = 0;
    }
    for (size_t i = 0; i < dk; i++)
        for (size_t j = 0; j < dv; j++) {
            S[i * dv + j] = decay * S[i * dv + j] + kn[i] * u[j];
            o[j] += S[i * dv + j] * qn[i], m[j] += fabs(S[i * dv + j] * qn[i]);
        }
    for (size_t j = 0; j < dv; j++)
        ms += o[j] * o[j];
    const double r = 1.0 / sqrt(ms / (double)dv + (double)a->eps);
    double mm = 0;
    for (size_t j = 0; j < dv && a->z; j++) {
        const double z = lmk_float_load(a->z_dtype, a->z, t * a->z_tok + h * a->z_head + j);
        m[j] *= r * fabs(lmk_float_load(a->nw_dtype, a->norm_w, j) + (double)a->weight_offset) * fabs(z) /
                (1.0 + exp(-z));
    }
    for (size_t j = 0; j < dv; j++)
        mm += m[j] * m[j];
    return sqrt(mm);
}

/* ||m|| of every out row [T, Hv], over the reference's arguments before the reference runs (the
 * pool still holds the rows as they were). */
static bool row_magnitudes(const lmk_gdn_args *a, float *mag)
{
    const size_t dk = a->dk, dv = a->dv;
    double *S = malloc(dk * dv * sizeof *S), *w = malloc((2 * dk + 3 * dv) * sizeof *w);
    for (size_t s = 0; S && w && s < a->n_seq; s++) {
        size_t lo, hi;
        lmk_seq_bounds(a->cu_seqlens, a->cu_is64, s, a->T, &lo, &hi);
        const int64_t row = a->state ? lmk_seq_slot(a->slots, a->slots_is64, s, a->n_slots) : -1;
        for (size_t h = 0; h < a->Hv; h++) {
            for (size_t e = 0; e < dk * dv; e++)
                S[e] = row < 0 ? 0.0
                               : lmk_float_load(a->state_dtype, a->state,
                                                (size_t)row * a->s_slot + h * a->s_head + e / dv * a->s_k +
                                                    e % dv * a->s_v);
            for (size_t t = lo; t < hi; t++)
                mag[t * a->Hv + h] = (float)mag_step(a, t, h, S, w);
        }
    }
    const bool ok = S && w;
    free(S), free(w);
    return ok;
}

/* Sums of one row's comparison: ||got - ref||^2, ||ref||^2, and the squared half ulps of the
 * stored dtype at each element (its own rounding, which lmk.h counts in the budget). */
typedef struct row_sum {
    double err2, ref2, round2;
    bool bad; /* a non-finite element */
} row_sum;

static void row_add(row_sum *x, lmk_dtype t, double got, double ref)
{
    const double d = got - ref, half = 0.5 * lmk_ulp(t, fmax(fabs(ref), fabs(got)));
    x->bad |= !isfinite(got);
    x->err2 += d * d, x->ref2 += ref * ref, x->round2 += half * half;
}

/* lmk.h's norm-wise bound on one row (mag: its ||m||, 0 for state rows); records the largest
 * relative error and fraction of the bound. */
static bool row_ok(gdn_check *k, const row_sum *x, double mag)
{
    const double err = sqrt(x->err2), norm = fmax(sqrt(x->ref2), 1e-30);
    const double bound = k->tol * fmax(norm, mag / COND_MAX) + sqrt(x->round2);
    if (x->bad || !(err <= bound))
        return false;
    k->max_err = fmax(k->max_err, err / norm);
    k->max_ratio = fmax(k->max_ratio, err / bound);
    return true;
}

static bool check_out(const tst_inst *in, gdn_check *k, tst_result *res)
{
    const gdn_case *g = P(&in->c);
    const tst_view *v = tst_mem_find(&in->mem, in->arg[OUT]);
    const unsigned char *got = got_of(in, k, OUT);
    const size_t hv = g->p.n_v_heads, dv = g->p.v_dim;
    for (size_t t = 0; t < g->p.seq_len; t++)
        for (size_t h = 0; h < hv; h++) {
            row_sum x = {0};
            for (size_t j = 0; j < dv; j++)
                row_add(&x, g->dtype, tst_load(g->dtype, got, t * v->stride[0] + h * v->stride[1] + j),
                        k->out32[(t * hv + h) * dv + j]);
            if (!row_ok(k, &x, k->mag[t * hv + h])) {
                snprintf(res->msg, sizeof res->msg,
                         "out of token %zu, head %zu: ||got - ref|| %.3g > %.3g * max(||ref|| %.3g, ||m|| %.3g / %g) + "
                         "rounding %.3g%s",
                         t, h, sqrt(x.err2), k->tol, sqrt(x.ref2), k->mag[t * hv + h], COND_MAX, sqrt(x.round2),
                         x.bad ? " (non-finite)" : "");
                return false;
            }
        }
    return true;
}

/* Pool row `row`, head h, against the reference's compact row c (norm-wise), or its bytes against
 * the host copy (c < 0). */
static bool state_head_ok(const tst_inst *in, gdn_check *k, int64_t row, size_t h, int64_t c)
{
    const tst_view *v = tst_mem_find(&in->mem, in->arg[STATE]);
    const unsigned char *got = got_of(in, k, STATE), *before = tst_mem_host(&in->mem, in->arg[STATE]);
    const size_t es = lmk_dtype_size(v->dtype), dk = v->n[2], dv = v->n[3];
    row_sum x = {0};
    for (size_t i = 0; i < dk; i++)
        for (size_t j = 0; j < dv; j++) {
            const size_t at = (size_t)row * v->stride[0] + h * v->stride[1] + i * v->stride[2] + j * v->stride[3];
            if (c < 0 && memcmp(got + at * es, before + at * es, es) != 0)
                return false;
            if (c >= 0)
                row_add(&x, v->dtype, tst_load(v->dtype, got, at),
                        k->pool32[(size_t)c * k->a.s_slot + h * k->a.s_head + i * dv + j]);
        }
    return c < 0 || row_ok(k, &x, 0.0);
}

/* Every pool row: stored by a sequence with tokens, within the bound of the reference's row;
 * stored by an empty sequence or by none, unchanged. */
static bool check_state(const tst_inst *in, gdn_check *k, tst_result *res)
{
    const gdn_case *g = P(&in->c);
    const void *slots = in->arg[SLOTS] ? tst_mem_host(&in->mem, in->arg[SLOTS]) : NULL;
    const int is64 = g->index_dtype == LMK_I64;
    int64_t *by = malloc((g->n_slots + 1) * sizeof *by);
    if (!by)
        return false;
    for (uint32_t i = 0; i < g->n_slots; i++)
        by[i] = -1;
    for (size_t s = 0; s < g->n_seq; s++) {
        const int64_t row = lmk_seq_slot(slots, is64, s, g->n_slots);
        if (lmk_seq_stores(slots, is64, s, g->n_seq, g->n_slots, row))
            by[row] = (int64_t)s;
    }
    bool ok = true;
    for (uint32_t r = 0; r < g->n_slots && ok; r++)
        for (size_t h = 0; h < g->p.n_v_heads && ok; h++) {
            const bool stored = by[r] >= 0 && k->len[by[r]] > 0;
            ok = state_head_ok(in, k, r, h, stored ? k->compact[r] : -1);
            if (!ok)
                snprintf(res->msg, sizeof res->msg, "state row %u, head %zu: %s", r, h,
                         stored ? "outside the bound of the reference's final state"
                         : by[r] >= 0 ? "changed, stored by an empty sequence" : "changed, stored by no sequence");
        }
    free(by);
    return ok;
}

static void check_free(gdn_check *k)
{
    free(k->q32), free(k->k32), free(k->v32), free(k->out32), free(k->pool32);
    free(k->slots32), free(k->compact), free(k->len), free(k->mag);
    for (int r = 0; r < TST_MAX_REGIONS; r++)
        free(k->got[r]);
}

static bool gdn_verify(const tst_inst *in, tst_result *res)
{
    const gdn_case *g = P(&in->c);
    gdn_check k = {.tol = g->dtype == LMK_F32 && (g->state == STATE_NONE || g->state_dtype == LMK_F32) ? 1e-4 : 4e-3};
    bool ok = host_args(in, &k);
    for (int r = 0; r < in->mem.n_r && ok; r++)
        ok = (k.got[r] = tst_mem_download(&in->mem, r)) != NULL;
    if (!ok)
        snprintf(res->msg, sizeof res->msg, "out of host memory or read back failed: %s", lmk_last_error());
    if (ok) {
        k.mag = malloc((size_t)g->p.seq_len * g->p.n_v_heads * sizeof *k.mag);
        ok = k.mag && row_magnitudes(&k.a, k.mag);
        if (!ok)
            snprintf(res->msg, sizeof res->msg, "out of host memory");
    }
    if (ok)
        lmk_ref_gated_delta_rule(&k.a);
    ok = ok && check_out(in, &k, res) && (!in->arg[STATE] || check_state(in, &k, res));
    if (ok)
        snprintf(res->msg, sizeof res->msg, "max err/||ref|| %.2g, %.2f of the bound (tol %.0e)", k.max_err,
                 k.max_ratio, k.tol);
    res->max_err = k.max_err;
    res->max_ratio = k.max_ratio;
    check_free(&k);
    return ok;
}

/* 0: k_dim above 256; 1: n_v_heads not a multiple of n_k_heads; 2: out aliasing v; 3: dt_bias
 * without A_log (or the reverse); 4: unknown head_map; 5: scale NaN. */
static lmk_status gdn_invalid(const tst_inst *in, lmk_stream *s, int k, const char **want)
{
    static const char *const wants[] = {"k_dim (257) must be <= 256", "multiple of n_k_heads", "out overlaps v",
                                        "given together", "head_map", "scale must be finite"};
    *want = wants[k];
    lmk_gdn_io io = io_of(in);
    lmk_gdn_params p = P(&in->c)->p;
    if (k == 0)
        p.k_dim = 257;
    if (k == 1)
        p.n_k_heads = p.n_v_heads + 1;
    if (k == 2)
        io.out = in->arg[V];
    if (k == 3 && io.A_log)
        io.dt_bias = NULL;
    else if (k == 3)
        io.dt_bias = in->arg[A];
    if (k == 4)
        p.head_map = (lmk_repeat_layout)7;
    if (k == 5)
        p.scale = NAN;
    return lmk_gated_delta_rule(s, &io, &p);
}

const tst_op tst_op_gated_delta_rule = {
    .name = "gated_delta_rule",
    .n_cases = gdn_n_cases,
    .get_case = gdn_get_case,
    .random_case = gdn_random_case,
    .bench_cases = gdn_bench_cases,
    .bytes = gdn_bytes,
    .setup = gdn_setup,
    .fill = gdn_fill,
    .run = gdn_run,
    .verify = gdn_verify,
    .n_invalid = 6,
    .invalid = gdn_invalid,
    .launches = 1,
};
