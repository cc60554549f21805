/*
 * case.c - the case descriptor of attn_prologue (testkit/testkit.h): per-head RMSNorm + rope of q
 * and k and the KV-cache write, on the full-attention layers of real models.
 *
 *   Qwen3-8B        q, k, v read out of the packed QKV projection (strided), q/k norms (x * w),
 *                   NEOX base 1e6, k and v written only to a bf16 cache through slots
 *   Qwen3.5/3.6-27B q read out of the [q | gate] projection, norms with HF weights (x * (1 + w)),
 *                   IMROPE [11,11,10,0] on 64 of 256, k_out and f8e4m3 caches with scales
 *   Llama-3.1-8B    no norm, llama3 freq_factors, k to k_out only (the prologue as a plain rope)
 *   paged caches    slots in any order, padding slots (-1, and past the last row) that write nothing
 *   decode batches  one token of each of T sequences: shuffled rows of a cache much larger than T,
 *                   scattered positions
 * The benchmark (ap_bench_cases) runs these models' prompt and decode shapes; each of its
 * configurations also has a row in the table, so `lmk check` verifies what `lmk bench` times.
 * Outputs and cache rows are compared with the float64 chain (lmk_ref_attn_prologue_token) under
 * lmk.h's contract (f32 1e-5 * max(1, |ref|), bf16/f16 one ulp + 1e-6, f8 one f8 ulp of x * inv,
 * inv the call's f32 1 / scale); v rows must be v's bits in v's dtype, and in an f8 cache exactly
 * lmk_f32_to_f8e4m3 of the f32 product v * inv; cache rows no slot names must keep their bytes.
 */
#include "ops/attn_prologue/attn_prologue.h"
#include "testkit_ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { QI, QO, KI, KO, VI, QW, KW, POS, FF, SLOTS, KC, VC };  /* the operands in tst_inst.arg */
enum { DENSE, QKV, QGATE };         /* q, k, v each dense; q|k|v packed; q inside [q | gate] */
enum { SLOT_SEQ, SLOT_SHUFFLED, SLOT_PADDED };
/* POS_DEFAULT: a text run (start + i) for the 1-D modes, every axis random for the multi-section
 * ones; POS_TEXT: start + i on every axis (a prompt); POS_SCATTERED: one random position in
 * [0, 131072) per token, on every axis (one token of each sequence of a decode batch). */
enum { POS_DEFAULT, POS_TEXT, POS_SCATTERED };
enum { FF_NONE, FF_LLAMA3 };

typedef struct ap_case {
    lmk_rope_params p;      /* n_k_heads: k and v heads */
    lmk_dtype dtype;
    int layout;
    bool q_in_place;        /* q_out is q_in */
    bool norm;              /* q and k norm weights */
    lmk_dtype w_dtype;
    float eps, weight_offset;
    bool k_out;             /* k to k_out (else only to the cache) */
    bool k_in_place;        /* k_out is k_in (k_out is then set too) */
    bool cache;             /* k_cache, and v_cache when v */
    bool v;
    uint32_t v_dim;
    lmk_dtype cache_dtype;  /* the input dtype or LMK_F8E4M3 */
    float k_scale, v_scale;
    uint32_t n_slots;       /* cache rows */
    int slots;              /* SLOT_* */
    lmk_dtype slot_dtype;   /* i32 or i64 */
    lmk_dtype pos_dtype;
    int ff;
    int pos;                /* POS_* */
} ap_case;

_Static_assert(sizeof(ap_case) <= TST_CASE_PARAMS, "ap_case must fit in tst_case.p");

static const ap_case *P(const tst_case *c)
{
    return (const ap_case *)(const void *)c->p.bytes;
}

static bool multi_mode(lmk_rope_mode m)
{
    return m == LMK_ROPE_MROPE || m == LMK_ROPE_IMROPE || m == LMK_ROPE_VISION;
}

/* ---- the table ---- */

#define QWEN3 .p = {.head_dim = 128, .rope_dim = 128, .n_heads = 32, .n_k_heads = 8, .freq_base = 1e6f, \
                    .mode = LMK_ROPE_NEOX}, .layout = QKV, .norm = true, .w_dtype = LMK_BF16, .eps = 1e-6f, \
              .cache = true, .v = true, .v_dim = 128
#define QWEN35 .p = {.head_dim = 256, .rope_dim = 64, .n_heads = 24, .n_k_heads = 4, .freq_base = 1e7f, \
                     .mode = LMK_ROPE_IMROPE, .sections = {11, 11, 10, 0}}, .layout = QGATE, .norm = true, \
               .w_dtype = LMK_BF16, .eps = 1e-6f, .weight_offset = 1.0f, .k_out = true, .cache = true, .v = true, \
               .v_dim = 256
#define LLAMA31 .p = {.head_dim = 128, .rope_dim = 128, .n_heads = 32, .n_k_heads = 8, .freq_base = 5e5f, \
                      .mode = LMK_ROPE_NEOX}, .k_out = true, .ff = FF_LLAMA3
/* Qwen3-8B as an engine that ropes inside the QKV projection runs it: q and k in place, k also to
 * the cache. */
#define QWEN3_IN_PLACE QWEN3, .q_in_place = true, .k_in_place = true, .k_out = true
/* Powers of two: an exact inverse, so lmk.h's x * inv is x / scale exactly. */
#define F8_SCALES .cache_dtype = LMK_F8E4M3, .k_scale = 0.0625f, .v_scale = 0.125f
/* Scales as a calibration gives them (amax / 448 of each tensor): no exact reciprocal, so x * inv
 * and x / scale may differ by an f32 ulp and the codes by one. */
#define F8_CALIBRATED .cache_dtype = LMK_F8E4M3, .k_scale = 0.0173f, .v_scale = 0.0291f
/* One token of each of T sequences: rows scattered over a cache of n, scattered positions. */
#define DECODE_SLOTS(n) .n_slots = (n), .slots = SLOT_SHUFFLED, .pos = POS_SCATTERED

typedef struct row {
    ap_case c;
    uint32_t T;
    lmk_dtype dtype;
    unsigned flags;
    const char *model;
} row;

static const row k_rows[] = {
    {{QWEN3, .n_slots = 256}, 1, LMK_BF16, 0, "Qwen3-8B decode"},
    {{QWEN3, .n_slots = 256}, 37, LMK_BF16, 0, "Qwen3-8B"},
    {{QWEN3, .n_slots = 64, .slots = SLOT_SHUFFLED}, 37, LMK_F32, 0, "Qwen3-8B, paged cache"},
    {{QWEN3, .n_slots = 16, .slots = SLOT_PADDED, .slot_dtype = LMK_I64}, 9, LMK_F16, 0, "Qwen3-8B, padded batch"},
    {{QWEN3, .n_slots = 8}, 4, LMK_BF16, TST_CASE_CONTRACT, "Qwen3-8B"},
    {{QWEN3, .n_slots = 4106}, 4106, LMK_BF16, TST_CASE_FULL, "Qwen3-8B prompt"},
    {{QWEN35, .cache_dtype = LMK_F8E4M3, .k_scale = 0.0625f, .v_scale = 0.125f, .n_slots = 64}, 37, LMK_BF16, 0,
     "Qwen3.5/3.6-27B, f8 cache"},
    {{QWEN35, .n_slots = 64, .q_in_place = true}, 17, LMK_F32, 0, "Qwen3.5/3.6-27B, q in place"},
    {{QWEN35, .cache_dtype = LMK_F8E4M3, .n_slots = 8, .slots = SLOT_SHUFFLED}, 3, LMK_F16, TST_CASE_CONTRACT,
     "Qwen3.5/3.6-27B, f8 cache"},
    /* the benchmark's configurations (ap_bench_cases) at check sizes */
    {{QWEN3_IN_PLACE, .n_slots = 64, .pos = POS_TEXT}, 37, LMK_BF16, 0, "Qwen3-8B prompt, q and k in place"},
    {{QWEN3_IN_PLACE, F8_SCALES, .n_slots = 64, .pos = POS_TEXT}, 37, LMK_F32, 0, "Qwen3-8B prompt, f8 cache"},
    {{QWEN3_IN_PLACE, DECODE_SLOTS(4096)}, 1, LMK_BF16, 0, "Qwen3-8B decode"},
    {{QWEN3_IN_PLACE, F8_SCALES, DECODE_SLOTS(4096)}, 64, LMK_BF16, 0, "Qwen3-8B decode batch, f8 cache"},
    {{QWEN35, DECODE_SLOTS(4096)}, 64, LMK_BF16, 0, "Qwen3.5/3.6-27B decode batch"},
    {{QWEN35, F8_SCALES, DECODE_SLOTS(4096)}, 64, LMK_F32, 0, "Qwen3.5/3.6-27B decode batch, f8 cache"},
    {{QWEN35, .n_slots = 4106, .pos = POS_TEXT}, 4106, LMK_BF16, TST_CASE_FULL, "Qwen3.5/3.6-27B prompt"},
    {{QWEN3_IN_PLACE, F8_SCALES, .n_slots = 4106, .pos = POS_TEXT}, 4106, LMK_BF16, TST_CASE_FULL,
     "Qwen3-8B prompt, f8 cache"},
    {{QWEN3_IN_PLACE, F8_CALIBRATED, .n_slots = 64, .pos = POS_TEXT}, 37, LMK_BF16, 0,
     "Qwen3-8B prompt, f8 cache, calibrated scales"},
    {{QWEN3_IN_PLACE, F8_CALIBRATED, DECODE_SLOTS(4096)}, 64, LMK_BF16, 0,
     "Qwen3-8B decode batch, f8 cache, calibrated scales"},
    {{LLAMA31, .pos_dtype = LMK_I64}, 37, LMK_BF16, 0, "Llama-3.1-8B (no norm)"},
    {{LLAMA31}, 5, LMK_F32, TST_CASE_CONTRACT, "Llama-3.1-8B (no norm)"},
    /* Rows of an odd number of 16-byte copy units (the last copy item has one unit), normed, with no
     * cache: on CUDA the k weights then end the block's shared memory, and the MIX kernels once read
     * weights past it for the missing unit (an illegal address, test_stress). Decode and prompt. */
    {{.p = {.head_dim = 72, .rope_dim = 48, .n_heads = 3, .n_k_heads = 2, .freq_base = 1e4f, .mode = LMK_ROPE_IMROPE,
            .sections = {8, 8, 8, 0}}, .q_in_place = true, .k_in_place = true, .k_out = true, .norm = true,
      .eps = 1e-6f, .weight_offset = 1.0f}, 4, LMK_F16, 0, "edge: odd copy units, weights last"},
    {{.p = {.head_dim = 100, .rope_dim = 56, .n_heads = 6, .n_k_heads = 3, .freq_base = 1e4f, .mode = LMK_ROPE_IMROPE,
            .sections = {10, 10, 8, 0}}, .layout = QGATE, .k_out = true, .norm = true, .eps = 1e-6f}, 5, LMK_F32, 0,
     "edge: odd copy units, weights last"},
    {{.p = {.head_dim = 100, .rope_dim = 24, .n_heads = 8, .n_k_heads = 2, .freq_base = 1e4f, .mode = LMK_ROPE_NEOX},
      .k_out = true, .norm = true, .eps = 1e-6f}, 1024, LMK_F32, 0, "edge: odd copy units, weights last"},
    /* Rows of 32 elements in bf16: on AVX-512 the element-order build (blocks of 32 split pairs
     * need rope_dim 64), with k to k_out and an f8 cache; the deepest CPU frames at -O0
     * (tests/test_small_stack.c). */
    {{.p = {.head_dim = 32, .rope_dim = 32, .n_heads = 16, .n_k_heads = 4, .freq_base = 1e4f, .mode = LMK_ROPE_NEOX},
      .norm = true, .w_dtype = LMK_BF16, .eps = 1e-6f, .k_out = true, .cache = true, .v = true, .v_dim = 32,
      F8_SCALES, .n_slots = 64}, 37, LMK_BF16, 0, "edge: head_dim 32"},
};

static int ap_n_cases(void)
{
    return (int)(sizeof k_rows / sizeof k_rows[0]);
}

static const char *mode_name(lmk_rope_mode m)
{
    return m == LMK_ROPE_NORMAL ? "normal" : m == LMK_ROPE_NEOX ? "neox" : m == LMK_ROPE_MROPE ? "mrope"
           : m == LMK_ROPE_VISION ? "vision" : "imrope";
}

/* "attn_prologue neox hd=128 rd=128 nh=32/8 T=37 bf16 qkv q-in-place k-in-place norm cache=bf16+v
 * rows=64 slots=seq pos=text // Qwen3-8B prompt": everything that tells one case from another in
 * the tables of `lmk check` and `lmk bench` (where k goes, the cache's dtype, rows and slot pattern). */
static void set_case(tst_case *c, const ap_case *ac, unsigned flags, const char *model)
{
    memcpy(c->p.bytes, ac, sizeof *ac);
    c->flags = flags;
    c->T = ac->p.seq_len;
    c->dtype = ac->dtype;
    static const char *const layouts[] = {"", " qkv", " q=q|gate"}, *const slots[] = {"seq", "shuffled", "padded"},
                             *const positions[] = {"", " pos=text", " pos=scattered"};
    char cache[96] = "", scales[48] = "";
    if (ac->cache_dtype == LMK_F8E4M3 && (ac->k_scale != 0.0f || ac->v_scale != 0.0f))
        snprintf(scales, sizeof scales, " scale=%g/%g", (double)ac->k_scale, (double)ac->v_scale);
    if (ac->cache)
        snprintf(cache, sizeof cache, " cache=%s%s%s rows=%u slots=%s%s", lmk_dtype_name(ac->cache_dtype),
                 ac->v ? "+v" : "", scales, ac->n_slots, slots[ac->slots], ac->slot_dtype == LMK_I64 ? "/i64" : "");
    const char *pos = ac->pos != POS_DEFAULT ? positions[ac->pos] : multi_mode(ac->p.mode) ? " pos=random" : "";
    tst_case_name(c, "attn_prologue %s hd=%u rd=%u nh=%u/%u T=%u %s%s%s%s%s%s%s%s%s%s // %s", mode_name(ac->p.mode),
                  ac->p.head_dim, ac->p.rope_dim, ac->p.n_heads, ac->p.n_k_heads, ac->p.seq_len,
                  lmk_dtype_name(ac->dtype), layouts[ac->layout], ac->q_in_place ? " q-in-place" : "",
                  ac->k_in_place ? " k-in-place" : "",
                  ac->norm ? (ac->weight_offset != 0.0f ? " norm(1+w)" : " norm") : "",
                  ac->k_out && !ac->k_in_place ? " k_out" : "", cache, ac->ff ? " llama3-ff" : "",
                  ac->pos_dtype == LMK_I64 ? " pos=i64" : "", pos, model);
}

/* Fills the fields a table row leaves to defaults. */
static void complete(ap_case *ac, uint32_t T, lmk_dtype dtype)
{
    ac->p.seq_len = T;
    ac->dtype = dtype;
    if (!ac->cache_dtype)
        ac->cache_dtype = dtype;
    if (!ac->slot_dtype)
        ac->slot_dtype = LMK_I32;
    if (!ac->pos_dtype)
        ac->pos_dtype = LMK_I32;
    if (!ac->w_dtype)
        ac->w_dtype = LMK_F32;
}

static void ap_get_case(int i, tst_case *c)
{
    ap_case ac = k_rows[i].c;
    complete(&ac, k_rows[i].T, k_rows[i].dtype);
    set_case(c, &ac, k_rows[i].flags, k_rows[i].model);
}

/* A random valid call: any mode, norm or not, k_out and/or cache, f8 caches, padding slots,
 * strided inputs, q in place. */
static void ap_random_case(tst_rng *r, tst_case *c)
{
    static const lmk_rope_mode modes[] = {LMK_ROPE_NORMAL, LMK_ROPE_NEOX, LMK_ROPE_MROPE, LMK_ROPE_VISION,
                                          LMK_ROPE_IMROPE};
    static const lmk_dtype dts[] = {LMK_F32, LMK_BF16, LMK_F16};
    ap_case ac = {.p = {.freq_base = 1e4f}};
    lmk_rope_params *p = &ac.p; /* one draw per statement: the same case from a seed with any compiler */
    p->head_dim = 2 * (1 + tst_rng_below(r, 64));
    p->n_heads = 1 + tst_rng_below(r, 8);
    p->n_k_heads = 1 + tst_rng_below(r, 4);
    if (tst_rng_below(r, 2))
        p->freq_base = 1e6f;
    p->mode = modes[tst_rng_below(r, 5)];
    p->rope_dim = p->mode == LMK_ROPE_VISION || tst_rng_below(r, 2) ? p->head_dim
                                                                    : 2 * (1 + tst_rng_below(r, p->head_dim / 2));
    for (int i = 0; i < 4 && multi_mode(p->mode); i++)
        p->sections[i] = tst_rng_below(r, 24);
    p->pairing = p->mode != LMK_ROPE_NORMAL && tst_rng_below(r, 4) == 0 ? LMK_ROPE_PAIR_HALF_HEAD
                                                                         : LMK_ROPE_PAIR_HALF_ROPE;
    ac.norm = tst_rng_below(r, 4) != 0;
    ac.w_dtype = dts[tst_rng_below(r, 3)];
    ac.eps = tst_rng_below(r, 2) ? 1e-6f : 1e-5f;
    ac.weight_offset = (float)tst_rng_below(r, 2);
    ac.cache = tst_rng_below(r, 4) != 0;
    ac.k_out = !ac.cache || tst_rng_below(r, 2);
    ac.v = ac.cache && tst_rng_below(r, 3) != 0;
    ac.v_dim = tst_rng_below(r, 2) ? p->head_dim : 1 + tst_rng_below(r, 64);
    ac.layout = ac.v && ac.v_dim == p->head_dim && tst_rng_below(r, 2) ? QKV : tst_rng_below(r, 3) == 0 ? QGATE : DENSE;
    ac.q_in_place = tst_rng_below(r, 3) == 0;
    ac.k_scale = tst_rng_below(r, 2) ? 0.0f : 0.25f;
    ac.v_scale = tst_rng_below(r, 2) ? 0.0f : 0.5f;
    ac.slots = (int)tst_rng_below(r, 3);
    ac.slot_dtype = tst_rng_below(r, 2) ? LMK_I32 : LMK_I64;
    ac.pos_dtype = tst_rng_below(r, 3) == 0 ? LMK_I64 : LMK_I32;
    uint32_t T = 1 + tst_rng_below(r, 8);
    ac.n_slots = T + tst_rng_below(r, 8);
    const lmk_dtype dt = dts[tst_rng_below(r, 3)];
    ac.cache_dtype = tst_rng_below(r, 3) == 0 ? LMK_F8E4M3 : dt;
    ac.k_in_place = ac.k_out && tst_rng_below(r, 3) == 0; /* drawn last: earlier seeds keep their cases */
    /* One call in eight a prompt of about 8 MB of q and k rows (1365-65536 tokens for these
     * dimensions). CUDA takes its decode kernel while T x rows x lanes <= 2 x SMs x 256 (67584 on
     * an H200; a row has at least one lane), which 65536 tokens of at least 2 rows exceed, so
     * random shapes, strides and modes also reach the prefill kernels (prologue_stream_kernel,
     * prologue_kernel), and on the CPU the worker pool. Drawn after every other draw, so the
     * other seven cases of eight stay what they were. */
    if (tst_rng_below(r, 8) == 0) {
        const uint32_t row_bytes = p->head_dim * (uint32_t)lmk_dtype_size(dt);
        const uint32_t want = (8u << 20) / ((p->n_heads + p->n_k_heads) * row_bytes) + tst_rng_below(r, 512);
        T = want > 65536 ? 65536 : want;
        ac.n_slots = T + tst_rng_below(r, 8);
    }
    complete(&ac, T, dt);
    set_case(c, &ac, 0, "random");
}

/* ---- the benchmark ---- */

/* T up to DECODE_MAX_T is a decode step's batch (one token of each of T sequences, rows scattered
 * over a paged cache of DECODE_ROWS rows: 1024 pages of 16 tokens, 64 MB of bf16 k and v for
 * Qwen3-8B, more than the CPU's L3); a longer T is one prompt written to T consecutive rows. */
#define DECODE_MAX_T 256
#define DECODE_ROWS 16384

typedef struct bench_row {
    ap_case c;
    bool bf16_only;    /* f8 caches: what a bf16 model runs (no f32 model has one) */
    bool prompt_only;  /* prompt lengths only */
    const char *model; /* before " prompt" / " decode batch" */
    const char *note;  /* after it */
} bench_row;

static const bench_row k_bench[] = {
    {{QWEN3_IN_PLACE}, false, false, "Qwen3-8B", ""},
    {{QWEN35}, false, false, "Qwen3.5/3.6-27B", ""},
    {{QWEN3_IN_PLACE, F8_SCALES}, true, false, "Qwen3-8B", ""},
    {{QWEN35, F8_SCALES}, true, false, "Qwen3.5/3.6-27B", ""},
    {{QWEN3_IN_PLACE, F8_CALIBRATED}, true, false, "Qwen3-8B", ", f8 cache, calibrated scales"},
    {{QWEN3}, false, true, "Qwen3-8B", ", q out of place"},
};

/* Per T and dtype at most 6 cases: Qwen3-8B (q, k in place and to the cache) and Qwen3.5/3.6-27B
 * (q from q|gate, k to k_out and the cache), each with a cache in the input dtype and, in bf16,
 * an f8 one (power-of-two scales), Qwen3-8B's also with calibrated scales; at prompt lengths also
 * the earlier Qwen3-8B case. Each configuration also has a row
 * in k_rows at check sizes. */
static int ap_bench_cases(uint32_t T, lmk_dtype dtype, bool longest, tst_case *out, int max)
{
    (void)longest;
    const bool decode = T <= DECODE_MAX_T;
    int n = 0;
    for (size_t i = 0; i < sizeof k_bench / sizeof k_bench[0] && n < max; i++) {
        const bench_row *b = &k_bench[i];
        if ((b->bf16_only && dtype != LMK_BF16) || (b->prompt_only && decode))
            continue;
        ap_case ac = b->c;
        ac.n_slots = decode ? DECODE_ROWS : T;
        ac.slots = decode ? SLOT_SHUFFLED : SLOT_SEQ;
        ac.pos = decode ? POS_SCATTERED : POS_TEXT;
        complete(&ac, T, dtype);
        char model[96];
        snprintf(model, sizeof model, "%s %s%s", b->model, decode ? "decode batch" : "prompt", b->note);
        set_case(&out[n++], &ac, 0, model);
    }
    return n;
}

static size_t n_positions(const ap_case *ac)
{
    return (multi_mode(ac->p.mode) ? 4 : 1) * (size_t)ac->p.seq_len;
}

/* Tokens whose slot names a cache row: fill_slots pads tokens 1, 4, 7, ... under SLOT_PADDED. */
static double cached_tokens(const ap_case *ac)
{
    if (!ac->cache)
        return 0.0;
    return ac->slots == SLOT_PADDED ? (double)(ac->p.seq_len - (ac->p.seq_len + 1) / 3) : (double)ac->p.seq_len;
}

/* The bytes the op must move, each element read or written once:
 * - q: read and written whole (the norm changes every element), in place or not; in place without
 *   a norm only the rope_dim rotated elements of each head move;
 * - k: a token with a cache row reads its whole row and writes it to the cache (1-byte elements for
 *   f8); k_out gets every token's row, again only the rotated part in place without a norm; a
 *   padding token without k_out needs no k at all;
 * - v: read and written to the cache for tokens with a cache row;
 * - the norm weights, positions, slots and freq_factors once. */
static double ap_bytes(const tst_case *c)
{
    const ap_case *ac = P(c);
    const lmk_rope_params *p = &ac->p;
    const double es = (double)lmk_dtype_size(ac->dtype), ces = (double)lmk_dtype_size(ac->cache_dtype);
    const double T = p->seq_len, Tc = cached_tokens(ac), D = p->head_dim, R = p->rope_dim;
    const double hq = p->n_heads, hk = p->n_k_heads;
    const double q_row = ac->q_in_place && !ac->norm ? R : D, k_out_row = ac->k_in_place && !ac->norm ? R : D;
    double b = 2.0 * T * hq * q_row * es;
    b += hk * (Tc * D + (T - Tc) * (ac->k_out ? k_out_row : 0.0)) * es; /* k read */
    b += (ac->k_out ? T * hk * k_out_row * es : 0.0) + Tc * hk * D * ces;
    b += ac->v ? Tc * hk * ac->v_dim * (es + ces) : 0.0;
    b += (ac->norm ? 2.0 * D * (double)lmk_dtype_size(ac->w_dtype) : 0.0) +
         (double)n_positions(ac) * (double)lmk_dtype_size(ac->pos_dtype) +
         (ac->cache ? T * (double)lmk_dtype_size(ac->slot_dtype) : 0.0) + (ac->ff ? 4.0 * (R / 2.0) : 0.0);
    return b;
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
static lmk_status dense(tst_inst *in, lmk_dtype t, size_t n0, size_t n1, size_t n2, bool input, bool output,
                        lmk_buffer **out)
{
    int r;
    lmk_status st = region(in, n0 * n1 * n2 * lmk_dtype_size(t), input, &r);
    return st == LMK_OK ? view3(in, r, 0, t, n0, n1, n2, NULL, output, out) : st;
}

/* q, k and v inputs in the case's layout; q and k are outputs too when in place. */
static lmk_status setup_inputs(tst_inst *in)
{
    const ap_case *ac = P(&in->c);
    const lmk_rope_params *p = &ac->p;
    const size_t T = p->seq_len, d = p->head_dim, hq = p->n_heads, hk = p->n_k_heads, es = lmk_dtype_size(ac->dtype);
    lmk_status st = LMK_OK;
    int r;
    if (ac->layout == QKV) { /* [T, (Hq + 2 Hk) D]: q, k, v read out of one projection */
        const size_t row = (hq + 2 * hk) * d, s[3] = {row, d, 1};
        st = region(in, T * row * es, true, &r);
        if (st == LMK_OK)
            st = view3(in, r, 0, ac->dtype, T, hq, d, s, ac->q_in_place, &in->arg[QI]);
        if (st == LMK_OK)
            st = view3(in, r, hq * d, ac->dtype, T, hk, d, s, ac->k_in_place, &in->arg[KI]);
        if (st == LMK_OK)
            st = view3(in, r, (hq + hk) * d, ac->dtype, T, hk, d, s, false, &in->arg[VI]);
        return st;
    }
    if (ac->layout == QGATE) { /* q of [T, Hq, 2D] */
        const size_t s[3] = {hq * 2 * d, 2 * d, 1};
        st = region(in, T * hq * 2 * d * es, true, &r);
        if (st == LMK_OK)
            st = view3(in, r, 0, ac->dtype, T, hq, d, s, ac->q_in_place, &in->arg[QI]);
    } else {
        st = dense(in, ac->dtype, T, hq, d, true, ac->q_in_place, &in->arg[QI]);
    }
    if (st == LMK_OK)
        st = dense(in, ac->dtype, T, hk, d, true, ac->k_in_place, &in->arg[KI]);
    if (st == LMK_OK && ac->v)
        st = dense(in, ac->dtype, T, hk, ac->v_dim, true, false, &in->arg[VI]);
    return st;
}

static lmk_status ap_setup(tst_inst *in)
{
    const ap_case *ac = P(&in->c);
    const lmk_rope_params *p = &ac->p;
    const size_t T = p->seq_len, d = p->head_dim, hq = p->n_heads, hk = p->n_k_heads;
    lmk_status st = setup_inputs(in);
    if (st == LMK_OK && ac->q_in_place)
        in->arg[QO] = in->arg[QI];
    else if (st == LMK_OK)
        st = dense(in, ac->dtype, T, hq, d, false, true, &in->arg[QO]);
    if (st == LMK_OK && ac->k_in_place)
        in->arg[KO] = in->arg[KI];
    else if (st == LMK_OK && ac->k_out)
        st = dense(in, ac->dtype, T, hk, d, false, true, &in->arg[KO]);
    if (st == LMK_OK && ac->norm)
        st = dense(in, ac->w_dtype, 1, 1, d, true, false, &in->arg[QW]);
    if (st == LMK_OK && ac->norm)
        st = dense(in, ac->w_dtype, 1, 1, d, true, false, &in->arg[KW]);
    if (st == LMK_OK)
        st = dense(in, ac->pos_dtype, 1, 1, n_positions(ac), true, false, &in->arg[POS]);
    if (st == LMK_OK && ac->ff)
        st = dense(in, LMK_F32, 1, 1, p->rope_dim / 2, true, false, &in->arg[FF]);
    /* Caches hold earlier rows (host copies of random bytes) that unnamed slots must keep. */
    if (st == LMK_OK && ac->cache)
        st = dense(in, ac->slot_dtype, 1, 1, T, true, false, &in->arg[SLOTS]);
    if (st == LMK_OK && ac->cache)
        st = dense(in, ac->cache_dtype, ac->n_slots, hk, d, true, true, &in->arg[KC]);
    if (st == LMK_OK && ac->cache && ac->v)
        st = dense(in, ac->cache_dtype, ac->n_slots, hk, ac->v_dim, true, true, &in->arg[VC]);
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

/* Cache rows for each token: in order from a random start, shuffled, or with padding (-1 and
 * n_slots, which write nothing). Distinct, so no two tokens race for a row. */
static void fill_slots(tst_inst *in, tst_rng *r)
{
    const ap_case *ac = P(&in->c);
    const uint32_t T = ac->p.seq_len, n = ac->n_slots;
    unsigned char *host = tst_mem_host(&in->mem, in->arg[SLOTS]);
    int64_t *rows = malloc((n + 2) * sizeof *rows);
    if (!rows)
        return;
    for (uint32_t i = 0; i < n; i++)
        rows[i] = i;
    const uint32_t start = tst_rng_below(r, n - T + 1);
    if (ac->slots != SLOT_SEQ)
        for (uint32_t i = n - 1; i > 0; i--) { /* Fisher-Yates */
            const uint32_t j = tst_rng_below(r, i + 1);
            const int64_t t = rows[i];
            rows[i] = rows[j];
            rows[j] = t;
        }
    for (uint32_t t = 0; t < T; t++) {
        int64_t v = ac->slots == SLOT_SEQ ? (int64_t)(start + t) : rows[t];
        if (ac->slots == SLOT_PADDED && t % 3 == 1)
            v = t % 2 ? -1 : (int64_t)n;
        put_index(ac->slot_dtype, host, t, v);
    }
    free(rows);
}

/* Positions as the case's POS_* says; multi-section modes hold 4 axes of T, axis-major. */
static void fill_positions(tst_inst *in, tst_rng *r)
{
    const ap_case *ac = P(&in->c);
    const size_t T = ac->p.seq_len, count = n_positions(ac);
    unsigned char *host = tst_mem_host(&in->mem, in->arg[POS]);
    const int64_t start = tst_rng_below(r, 100000);
    for (size_t i = 0; i < T; i++) { /* axis 0; the others below */
        const int64_t v = ac->pos == POS_SCATTERED                            ? (int64_t)tst_rng_below(r, 131072)
                          : ac->pos == POS_DEFAULT && multi_mode(ac->p.mode) ? (int64_t)tst_rng_below(r, 65536)
                                                                              : start + (int64_t)i;
        put_index(ac->pos_dtype, host, i, v);
    }
    const size_t es = lmk_dtype_size(ac->pos_dtype);
    for (size_t i = T; i < count; i++) {
        if (ac->pos == POS_DEFAULT)
            put_index(ac->pos_dtype, host, i, tst_rng_below(r, 65536));
        else /* every axis of a text token holds its position */
            memcpy(host + i * es, host + (i % T) * es, es);
    }
}

/* Hugging Face's llama3 rope_scaling (factor 8, low 1, high 4, original context 8192) as
 * freq_factors: base^(-2p/n) / inv_freq_HF[p]. */
static void llama3_factors(float *ff, const lmk_rope_params *p)
{
    const double factor = 8.0, low = 1.0, high = 4.0, orig = 8192.0, two_pi = 6.283185307179586;
    for (uint32_t i = 0; i < p->rope_dim / 2; i++) {
        const double inv = pow((double)p->freq_base, -2.0 * i / p->rope_dim), wavelen = two_pi / inv;
        double hf = inv;
        if (wavelen > orig / low)
            hf = inv / factor;
        else if (wavelen >= orig / high)
            hf = (1.0 - (orig / wavelen - low) / (high - low)) * inv / factor +
                 (orig / wavelen - low) / (high - low) * inv;
        ff[i] = (float)(inv / hf);
    }
}

/* Norm weights of magnitude 1 after the offset (w + offset = +-1) for timing an in-place case:
 * `lmk bench` calls it many times on the same buffers, each call normalising what the last one
 * wrote, and with random weights x * w^k sends every element but the largest into subnormals within
 * a few hundred calls (seen on the CPU: Qwen3-8B decode 67 us a call instead of 3.9 at T = 1, 4.3 ms
 * instead of 0.18 at T = 64). With |w + offset| = 1 each call keeps every head at rms 1 and every
 * pair's norm, so the inputs stay normal floats; the op's work does not depend on the values. */
static void unit_weights(tst_inst *in, tst_rng *r)
{
    const ap_case *ac = P(&in->c);
    for (int w = QW; w <= KW; w++) {
        void *host = tst_mem_host(&in->mem, in->arg[w]);
        for (uint32_t i = 0; i < ac->p.head_dim; i++)
            tst_store(ac->w_dtype, host, i, (tst_rng_below(r, 2) ? 1.0 : -1.0) - (double)ac->weight_offset);
    }
}

static void ap_fill(tst_inst *in, tst_rng *r)
{
    const ap_case *ac = P(&in->c);
    const int tensors[] = {QI, KI, VI, QW, KW, KC, VC};
    for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; i++)
        if (in->arg[tensors[i]])
            tst_inst_fill(in, in->arg[tensors[i]], r);
    if ((in->flags & TST_INST_FAST) && ac->norm && (ac->q_in_place || ac->k_in_place))
        unit_weights(in, r);
    fill_positions(in, r);
    if (ac->cache)
        fill_slots(in, r);
    if (ac->ff)
        llama3_factors(tst_mem_host(&in->mem, in->arg[FF]), &ac->p);
}

static lmk_attn_prologue_io io_of(const tst_inst *in)
{
    const ap_case *ac = P(&in->c);
    lmk_buffer *const *a = in->arg;
    return (lmk_attn_prologue_io){.q_in = a[QI], .k_in = a[KI], .v_in = a[VI], .q_norm_w = a[QW], .k_norm_w = a[KW],
                                  .positions = a[POS], .freq_factors = a[FF], .slots = a[SLOTS], .q_out = a[QO],
                                  .k_out = a[KO], .k_cache = a[KC], .v_cache = a[VC], .k_scale = ac->k_scale,
                                  .v_scale = ac->v_scale};
}

static lmk_status ap_run(const tst_inst *in, lmk_stream *s)
{
    const ap_case *ac = P(&in->c);
    const lmk_attn_prologue_io io = io_of(in);
    const lmk_rms_norm_params norm = {.eps = ac->eps ? ac->eps : 1e-6f, .weight_offset = ac->weight_offset};
    return lmk_attn_prologue(s, &io, &ac->p, &norm);
}

/* ---- verification ---- */

/* What one verification holds: the host arguments of the reference and the outputs read back. */
typedef struct ap_check {
    lmk_attn_prologue_args a;
    unsigned char *got[TST_MAX_REGIONS]; /* read back, per region */
    double *q64, *k64;                   /* one token of the float64 chain */
    double max_err, max_ratio;
} ap_check;

static const unsigned char *got_of(const tst_inst *in, const ap_check *k, int arg)
{
    const tst_view *v = tst_mem_find(&in->mem, in->arg[arg]);
    return k->got[v->region] + v->off;
}

static lmk_rows host_rows(const tst_inst *in, int arg)
{
    const tst_view *v = in->arg[arg] ? tst_mem_find(&in->mem, in->arg[arg]) : NULL;
    if (!v)
        return (lmk_rows){.data = NULL, .dtype = LMK_F32};
    return (lmk_rows){.data = tst_mem_host(&in->mem, in->arg[arg]), .tok = v->stride[0], .head = v->stride[1],
                      .dtype = v->dtype};
}

/* The reference's arguments over the host copies, as lmk_attn_prologue_prepare builds them. */
static lmk_attn_prologue_args host_args(const tst_inst *in)
{
    const ap_case *ac = P(&in->c);
    const tst_mem *m = &in->mem;
    const lmk_tensor3 rt[4] = {tst_view_host3(m, in->arg[QI]), tst_view_host3(m, in->arg[QO]),
                               tst_view_host3(m, in->arg[KI]), tst_view_host3(m, in->arg[ac->k_out ? KO : KI])};
    lmk_attn_prologue_args a = {
        .rope = lmk_rope_args_for(&ac->p, ac->dtype, rt, true, tst_mem_host(m, in->arg[POS]), ac->pos_dtype,
                                  in->arg[FF] ? tst_mem_host(m, in->arg[FF]) : NULL),
        .q_norm_w = in->arg[QW] ? tst_mem_host(m, in->arg[QW]) : NULL,
        .k_norm_w = in->arg[KW] ? tst_mem_host(m, in->arg[KW]) : NULL,
        .q_norm_dtype = ac->w_dtype, .k_norm_dtype = ac->w_dtype,
        .eps = (double)(ac->eps ? ac->eps : 1e-6f), .weight_offset = (double)ac->weight_offset,
        .v_in = host_rows(in, VI), .v_dim = ac->v_dim,
        .slots = in->arg[SLOTS] ? tst_mem_host(m, in->arg[SLOTS]) : NULL, .slot_dtype = ac->slot_dtype,
        .k_cache = host_rows(in, KC), .v_cache = host_rows(in, VC),
        .k_slots = ac->cache ? ac->n_slots : 0, .v_slots = ac->cache && ac->v ? ac->n_slots : 0,
        .k_inv_scale = lmk_attn_prologue_inv_scale(ac->k_scale),
        .v_inv_scale = lmk_attn_prologue_inv_scale(ac->v_scale),
    };
    return a;
}

/* Element i of a stored output, widened (f8 codes through lmk_f8e4m3_to_f32). */
static double stored(lmk_dtype t, const void *base, size_t i)
{
    return t == LMK_F8E4M3 ? (double)lmk_f8e4m3_to_f32(((const uint8_t *)base)[i]) : lmk_float_load(t, base, i);
}

/* One stored element against its float64 value: f32 1e-5 * max(1, |ref|), bf16/f16 one ulp plus
 * 1e-6, f8 one f8 ulp of the saturated value. */
static bool close_to(ap_check *k, lmk_dtype t, const void *base, size_t i, double ref)
{
    double tol;
    if (t == LMK_F8E4M3) {
        ref = ref > 448.0 ? 448.0 : ref < -448.0 ? -448.0 : ref;
        tol = lmk_ulp(LMK_F8E4M3, ref);
    } else {
        tol = t == LMK_F32 ? 1e-5 * fmax(1.0, fabs(ref)) : lmk_ulp(t, ref) + 1e-6;
    }
    const double err = fabs(stored(t, base, i) - ref);
    if (!(err <= tol))
        return false;
    k->max_err = fmax(k->max_err, err);
    k->max_ratio = fmax(k->max_ratio, err / tol);
    return true;
}

/* Heads of one token: rows64 (heads x dim) against a [rows, heads, dim] output at row r. */
static bool rows_close(ap_check *k, const char *what, size_t token, const lmk_rows *out, const unsigned char *got,
                       size_t r, size_t heads, size_t dim, const double *rows64, double inv, tst_result *res)
{
    for (size_t h = 0; h < heads; h++)
        for (size_t i = 0; i < dim; i++) {
            const size_t at = r * out->tok + h * out->head + i;
            if (!close_to(k, out->dtype, got, at, rows64[h * dim + i] * inv)) {
                snprintf(res->msg, sizeof res->msg, "%s of token %zu, head %zu, elem %zu: %.9g, reference %.9g", what,
                         token, h, i, stored(out->dtype, got, at), rows64[h * dim + i] * inv);
                return false;
            }
        }
    return true;
}

static long long slot_at(const ap_check *k, size_t t)
{
    if (k->a.slot_dtype == LMK_I64)
        return ((const int64_t *)k->a.slots)[t];
    return ((const int32_t *)k->a.slots)[t];
}

/* lmk.h's f8 code of a value x of the input dtype: lmk_f32_to_f8e4m3 of the f32 product x * inv (x
 * and inv have at most 24 significant bits each, so the double product is exact and rounds once);
 * a NaN keeps its sign, as lmk_f32_to_f8e4m3 of the NaN itself. */
static uint8_t f8_code_of(double x, float inv)
{
    return lmk_f32_to_f8e4m3((float)(isnan(x) ? x : x * (double)inv));
}

/* v of token t in its cache row: v's bits, or exactly its f8 code (f8_code_of). */
static bool v_row_ok(const tst_inst *in, ap_check *k, size_t t, size_t slot, tst_result *res)
{
    const lmk_attn_prologue_args *a = &k->a;
    const unsigned char *got = got_of(in, k, VC);
    const size_t es = lmk_dtype_size(a->rope.dtype);
    for (size_t h = 0; h < a->rope.t[1].n_heads; h++)
        for (size_t i = 0; i < a->v_dim; i++) {
            const size_t from = t * a->v_in.tok + h * a->v_in.head + i, to = slot * a->v_cache.tok + h * a->v_cache.head + i;
            const double x = lmk_float_load(a->rope.dtype, a->v_in.data, from);
            const bool ok = a->v_cache.dtype == LMK_F8E4M3
                                ? got[to] == f8_code_of(x, a->v_inv_scale)
                                : memcmp(got + to * es, (const unsigned char *)a->v_in.data + from * es, es) == 0;
            if (!ok) {
                snprintf(res->msg, sizeof res->msg, "v_cache row %zu (token %zu), head %zu, elem %zu differs", slot, t,
                         h, i);
                return false;
            }
        }
    return true;
}

/* Every token: q_out, k_out and the cache rows its slot names. */
static bool check_tokens(const tst_inst *in, ap_check *k, bool *written_k, tst_result *res)
{
    const ap_case *ac = P(&in->c);
    const lmk_attn_prologue_args *a = &k->a;
    const size_t d = ac->p.head_dim, hq = ac->p.n_heads, hk = ac->p.n_k_heads;
    const lmk_rows qo = host_rows(in, QO), ko = host_rows(in, KO);
    for (size_t t = 0; t < ac->p.seq_len; t++) {
        lmk_ref_attn_prologue_token(a, t, k->q64, k->k64);
        if (!rows_close(k, "q_out", t, &qo, got_of(in, k, QO), t, hq, d, k->q64, 1.0, res))
            return false;
        if (ac->k_out && !rows_close(k, "k_out", t, &ko, got_of(in, k, KO), t, hk, d, k->k64, 1.0, res))
            return false;
        if (!ac->cache)
            continue;
        const long long slot = slot_at(k, t);
        if (slot < 0 || (unsigned long long)slot >= ac->n_slots)
            continue;
        written_k[slot] = true;
        if (!rows_close(k, "k_cache", t, &a->k_cache, got_of(in, k, KC), (size_t)slot, hk, d, k->k64,
                        ac->cache_dtype == LMK_F8E4M3 ? (double)a->k_inv_scale : 1.0, res))
            return false;
        if (ac->v && !v_row_ok(in, k, t, (size_t)slot, res))
            return false;
    }
    return true;
}

/* Cache rows no slot names keep their bytes. */
static bool unnamed_rows_kept(const tst_inst *in, const ap_check *k, const bool *written, tst_result *res)
{
    const int caches[2] = {KC, VC};
    for (int c = 0; c < 2; c++) {
        const tst_view *v = in->arg[caches[c]] ? tst_mem_find(&in->mem, in->arg[caches[c]]) : NULL;
        if (!v)
            continue;
        const size_t row = v->stride[0] * lmk_dtype_size(v->dtype);
        const unsigned char *before = in->mem.r[v->region].host + v->off, *now = got_of(in, k, caches[c]);
        for (size_t s = 0; s < v->n[0]; s++)
            if (!written[s] && memcmp(before + s * row, now + s * row, row) != 0) {
                snprintf(res->msg, sizeof res->msg, "%s row %zu, named by no slot, changed", c ? "v_cache" : "k_cache",
                         s);
                return false;
            }
    }
    return true;
}

static bool ap_verify(const tst_inst *in, tst_result *res)
{
    const ap_case *ac = P(&in->c);
    ap_check k = {.a = host_args(in)};
    bool *written = calloc(ac->n_slots + 1, sizeof *written);
    k.q64 = malloc((size_t)ac->p.n_heads * ac->p.head_dim * sizeof *k.q64);
    k.k64 = malloc((size_t)ac->p.n_k_heads * ac->p.head_dim * sizeof *k.k64);
    bool ok = written && k.q64 && k.k64;
    for (int r = 0; r < in->mem.n_r && ok; r++)
        ok = (k.got[r] = tst_mem_download(&in->mem, r)) != NULL;
    if (!ok)
        snprintf(res->msg, sizeof res->msg, "out of host memory or read back failed: %s", lmk_last_error());
    ok = ok && check_tokens(in, &k, written, res) && unnamed_rows_kept(in, &k, written, res);
    if (ok)
        snprintf(res->msg, sizeof res->msg, "max err %.2g (%.2f of tol)%s", k.max_err, k.max_ratio,
                 ac->v && ac->cache_dtype != LMK_F8E4M3 ? ", v bit-exact" : "");
    res->max_err = k.max_err;
    res->max_ratio = k.max_ratio;
    for (int r = 0; r < TST_MAX_REGIONS; r++)
        free(k.got[r]);
    free(k.q64);
    free(k.k64);
    free(written);
    return ok;
}

/* 0: eps 0; 1: freq_base -1; 2: k goes nowhere (no k_out, no k_cache). */
static lmk_status ap_invalid(const tst_inst *in, lmk_stream *s, int k, const char **want)
{
    const ap_case *ac = P(&in->c);
    static const char *const wants[] = {"eps", "freq_base", "k_out or k_cache"};
    *want = wants[k];
    lmk_attn_prologue_io io = io_of(in);
    lmk_rope_params p = ac->p;
    lmk_rms_norm_params norm = {.eps = k == 0 ? 0.0f : 1e-6f, .weight_offset = ac->weight_offset};
    if (k == 1)
        p.freq_base = -1.0f;
    if (k == 2)
        io.k_out = io.k_cache = NULL;
    return lmk_attn_prologue(s, &io, &p, &norm);
}

const tst_op tst_op_attn_prologue = {
    .name = "attn_prologue",
    .n_cases = ap_n_cases,
    .get_case = ap_get_case,
    .random_case = ap_random_case,
    .bench_cases = ap_bench_cases,
    .bytes = ap_bytes,
    .setup = ap_setup,
    .fill = ap_fill,
    .run = ap_run,
    .verify = ap_verify,
    .n_invalid = 3,
    .invalid = ap_invalid,
    .launches = 1,
};
