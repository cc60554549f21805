/*
 * test_cuda_routing.c - which kernel variant each CUDA call launches (src/cuda/cuda_route.h; the
 * variants tables src/ops/rope/variants.h and src/ops/attn_prologue/variants.h).
 *
 * The CUDA backend picks one row of an op's variants table per launch (rope: decode, bulk, rows,
 * pairs; attn_prologue: decode, stream, the general kernel, with instantiations such as MIX, f8
 * and CHUNK), and the choice is the one docs/cuda.md describes and docs/decisions.md measured: a
 * change that sends a model's prompt to another row keeps every result right and loses its speed
 * without any other test noticing.
 * This test plans the calls of real model shapes through the launchers' own planning
 * (lmk_cuda_rope_route, lmk_cuda_attn_prologue_route) and checks each route's row and unit width:
 *   - on described devices, so it runs without a GPU: an H200 (132 SMs, sm_90's bulk copies and
 *     tensor maps, 228 KB of shared memory an SM) and an A100 (108 SMs, no bulk copies);
 *   - on CUDA device 0 when one is usable, against the H200 table where the device has the H200's
 *     SM count and bulk copies (else a visible SKIP).
 * Every row of both tables must be some case's route (a row that no shape reaches is dead code or
 * untested). The bench's hook that forces a row (lmk_cuda_*_force) is checked too: a forced row
 * that the call can run is its route, one it cannot run is LMK_ERR_UNSUPPORTED.
 * The arguments come from op.c's own constructors (lmk_rope_args_for, lmk_attn_prologue_prepare)
 * on views of host memory that nothing reads or writes: planning looks only at shapes, strides
 * and addresses.
 */
#include "common.h"
#include "ops/attn_prologue/attn_prologue.h"
#include "ops/attn_prologue/route.h"
#include "ops/rope/route.h"

#include <cuda.h>
#include <stdlib.h>
#include <string.h>

HARNESS_DEFINE;

enum { ARENA = 640u << 20, MAX_BUFS = 24 };
enum { DENSE, QGATE, QKV };      /* q dense; q inside [T, Hq, 2D] q|gate; q, k, v inside [q|k|v] rows */
enum { NO_CACHE, SAME, F8 };     /* attn_prologue caches: none (k_out only), the input dtype, f8e4m3 */

/* Stands in for the driver's cuTensorMapEncodeTiled on a described device: planning only needs to
 * know that encoding succeeded (the map itself goes to a kernel, which a route never launches). */
static CUresult fake_encode(CUtensorMap *m, CUtensorMapDataType t, cuuint32_t rank, void *base, const cuuint64_t *dim,
                            const cuuint64_t *stride, const cuuint32_t *box, const cuuint32_t *step,
                            CUtensorMapInterleave il, CUtensorMapSwizzle sw, CUtensorMapL2promotion l2,
                            CUtensorMapFloatOOBfill oob)
{
    (void)t, (void)rank, (void)base, (void)dim, (void)stride, (void)box, (void)step, (void)il, (void)sw, (void)l2,
        (void)oob;
    memset(m, 0, sizeof *m);
    return CUDA_SUCCESS;
}

static lmk_cuda_device described_h200(void)
{
    return (lmk_cuda_device){.sm_count = 132, .pdl = true, .bulk = true, .tmap_encode = (void *)fake_encode,
                             .smem_sm = 233472, .smem_optin = 232448, .smem_reserved = 1024};
}

static lmk_cuda_device described_a100(void)
{
    return (lmk_cuda_device){.sm_count = 108, .pdl = true, .bulk = false, .tmap_encode = NULL,
                             .smem_sm = 167936, .smem_optin = 166912, .smem_reserved = 1024};
}

/* Views of one host arena (4 KiB-aligned regions, never touched: the pages stay unmapped). */
typedef struct arena {
    lmk_device *cpu;
    unsigned char *base;
    size_t used;
    lmk_buffer *bufs[MAX_BUFS];
    int n;
} arena;

static lmk_buffer *keep(arena *A, lmk_status st, lmk_buffer *b, const char *what)
{
    if (!TST_REQUIRE(st == LMK_OK && A->n < MAX_BUFS, "%s: %s", what, lmk_last_error()))
        return NULL;
    A->bufs[A->n++] = b;
    return b;
}

/* A region of `bytes` (its first byte `offset` elements of dt past a 4 KiB boundary). */
static lmk_buffer *region(arena *A, size_t bytes, lmk_dtype dt, size_t offset)
{
    const size_t es = lmk_dtype_size(dt), len = bytes + offset * es;
    if (!TST_REQUIRE(A->used + len <= ARENA, "arena: %zu bytes more than %u", A->used + len, (unsigned)ARENA))
        return NULL;
    lmk_buffer *b = NULL;
    const lmk_status st = lmk_buffer_wrap(A->cpu, A->base + A->used + offset * es, bytes, LMK_U8, NULL, 0, &b);
    A->used += (len + 4095) & ~(size_t)4095;
    return keep(A, st, b, "lmk_buffer_wrap");
}

/* A [n0, n1, n2] view of parent at element `at`, strides {s0, s1, 1}. */
static lmk_buffer *view3(arena *A, lmk_buffer *parent, lmk_dtype dt, size_t at, size_t n0, size_t n1, size_t n2,
                         size_t s0, size_t s1)
{
    if (!parent)
        return NULL;
    const size_t shape[3] = {n0, n1, n2}, strides[3] = {s0, s1, 1};
    lmk_buffer *b = NULL;
    const lmk_status st = lmk_buffer_view_strided(parent, at * lmk_dtype_size(dt), dt, shape, strides, 3, &b);
    return keep(A, st, b, "lmk_buffer_view_strided");
}

static lmk_buffer *dense(arena *A, lmk_dtype dt, size_t n0, size_t n1, size_t n2, size_t offset)
{
    return view3(A, region(A, n0 * n1 * n2 * lmk_dtype_size(dt), dt, offset), dt, 0, n0, n1, n2, n1 * n2, n2);
}

/* A dense 1-D [n] buffer of dt (weights, positions, slots). */
static lmk_buffer *flat(arena *A, lmk_dtype dt, size_t n)
{
    lmk_buffer *parent = region(A, n * lmk_dtype_size(dt), dt, 0), *b = NULL;
    if (!parent)
        return NULL;
    const lmk_status st = lmk_buffer_view(parent, 0, dt, &n, 1, &b);
    return keep(A, st, b, "lmk_buffer_view");
}

static void arena_reset(arena *A)
{
    while (A->n > 0)
        lmk_buffer_free(A->bufs[--A->n]); /* views before their parents */
    A->used = 0;
}

/* The q, k (and v) operands of a layout: in[0..2] inputs, out[0..1] outputs (in place: the inputs). */
typedef struct operands {
    lmk_buffer *in[3], *out[2];
} operands;

static operands make_operands(arena *A, int layout, bool in_place, lmk_dtype dt, size_t T, size_t hq, size_t hk,
                              size_t D, size_t offset, bool with_v)
{
    operands o = {{NULL}, {NULL}};
    if (layout == QKV) { /* [T, hq + 2 hk, D] rows; q, k and v side by side; rotated in place */
        const size_t row = (hq + 2 * hk) * D;
        lmk_buffer *p = region(A, T * row * lmk_dtype_size(dt), dt, offset);
        o.in[0] = o.out[0] = view3(A, p, dt, 0, T, hq, D, row, D);
        o.in[1] = o.out[1] = view3(A, p, dt, hq * D, T, hk, D, row, D);
        o.in[2] = with_v ? view3(A, p, dt, (hq + hk) * D, T, hk, D, row, D) : NULL;
        return o;
    }
    if (layout == QGATE) { /* q is the first D of each head's 2D in [T, hq, 2D] */
        lmk_buffer *p = region(A, T * hq * 2 * D * lmk_dtype_size(dt), dt, offset);
        o.in[0] = view3(A, p, dt, 0, T, hq, D, hq * 2 * D, 2 * D);
    } else {
        o.in[0] = dense(A, dt, T, hq, D, offset);
    }
    o.in[1] = hk ? dense(A, dt, T, hk, D, offset) : NULL;
    o.in[2] = with_v ? dense(A, dt, T, hk, D, offset) : NULL;
    o.out[0] = in_place ? o.in[0] : dense(A, dt, T, hq, D, offset);
    o.out[1] = !hk ? NULL : in_place ? o.in[1] : dense(A, dt, T, hk, D, offset);
    return o;
}

/* ---- rope ---- */

typedef struct rope_route_case {
    const char *name;
    lmk_rope_params p;
    lmk_dtype dt;
    int layout;
    bool in_place;
    size_t offset;      /* elements past a 4 KiB boundary: 1 makes every view unaligned */
    /* expected */
    lmk_rope_variant h200; /* the row on the described H200 */
    unsigned unit;         /* unit bytes */
    int launches;
    lmk_rope_variant a100; /* the row on the described A100 */
} rope_route_case;

#define R_QWEN35_ROPE .head_dim = 256, .rope_dim = 64, .freq_base = 1e7f, .mode = LMK_ROPE_IMROPE, \
                      .sections = {11, 11, 10, 0}
#define R_QWEN35 R_QWEN35_ROPE, .n_heads = 24, .n_k_heads = 4
#define R_LLAMA31 .head_dim = 128, .rope_dim = 128, .n_heads = 32, .n_k_heads = 8, .freq_base = 5e5f, \
                  .mode = LMK_ROPE_NEOX
#define R_GPTJ .head_dim = 256, .rope_dim = 64, .n_heads = 16, .freq_base = 1e4f, .mode = LMK_ROPE_NORMAL

static const rope_route_case k_rope[] = {
    /* decode: one token, q and k in one launch; 8-byte units for 2-byte types (kDecNarrowRows) */
    {"Qwen3.5-27B decode bf16, q from q|gate", {R_QWEN35, .seq_len = 1}, LMK_BF16, QGATE, false, 0,
     LMK_ROPE_DECODE_COPY, 8, 1, LMK_ROPE_DECODE_COPY},
    {"Llama-3.1-8B decode bf16", {R_LLAMA31, .seq_len = 1}, LMK_BF16, DENSE, false, 0, LMK_ROPE_DECODE, 8, 1,
     LMK_ROPE_DECODE},
    {"Llama-3.1-8B decode f32", {R_LLAMA31, .seq_len = 1}, LMK_F32, DENSE, false, 0, LMK_ROPE_DECODE, 16, 1,
     LMK_ROPE_DECODE},
    /* prompts with copy items (partial rope, out of place): the bulk kernel on sm_90 */
    {"Qwen3.5-27B prompt bf16", {R_QWEN35, .seq_len = 4106}, LMK_BF16, DENSE, false, 0, LMK_ROPE_BULK,
     16, 1, LMK_ROPE_ROWS},
    {"Qwen3.5-27B prompt bf16, q from q|gate", {R_QWEN35, .seq_len = 4106}, LMK_BF16, QGATE, false, 0,
     LMK_ROPE_BULK_MAPS, 16, 1, LMK_ROPE_ROWS},
    {"Qwen3.5-27B prompt f16, q from q|gate", {R_QWEN35, .seq_len = 4106}, LMK_F16, QGATE, false, 0,
     LMK_ROPE_BULK_MAPS, 16, 1, LMK_ROPE_ROWS},
    {"Qwen3.5-27B prompt f32, q only", {R_QWEN35_ROPE, .n_heads = 24, .seq_len = 4106}, LMK_F32, DENSE, false, 0,
     LMK_ROPE_BULK, 16, 1, LMK_ROPE_ROWS},
    /* f32 q and k: 28 KB a token, more than a stage holds */
    {"Qwen3.5-27B prompt f32", {R_QWEN35, .seq_len = 4106}, LMK_F32, DENSE, false, 0, LMK_ROPE_ROWS, 16,
     1, LMK_ROPE_ROWS},
    /* one-element units: the rows kernel */
    {"Qwen3.5-27B prompt bf16, unaligned", {R_QWEN35, .seq_len = 4106}, LMK_BF16, DENSE, false, 1,
     LMK_ROPE_ROWS, 2, 1, LMK_ROPE_ROWS},
    /* no copy items: full rope, or in place */
    {"Llama-3.1-8B prompt bf16", {R_LLAMA31, .seq_len = 4106}, LMK_BF16, DENSE, false, 0, LMK_ROPE_PAIRS, 16, 1,
     LMK_ROPE_PAIRS},
    {"Llama-3.1-8B prompt bf16, in place in QKV", {R_LLAMA31, .seq_len = 4106}, LMK_BF16, QKV, true, 0,
     LMK_ROPE_PAIRS, 16, 1, LMK_ROPE_PAIRS},
    {"Qwen3.5-27B prompt bf16, in place", {R_QWEN35, .seq_len = 4106}, LMK_BF16, DENSE, true, 0,
     LMK_ROPE_PAIRS, 16, 1, LMK_ROPE_PAIRS},
    /* NORMAL pairs adjacent: GPT-J's partial rope keeps copy items */
    {"GPT-J-6B prompt bf16", {R_GPTJ, .seq_len = 4106}, LMK_BF16, DENSE, false, 0, LMK_ROPE_BULK, 16, 1,
     LMK_ROPE_ROWS},
    /* rope_dim 512: two slices of 128 pairs, two launches */
    {"head 512, full NEOX rope, bf16", {.head_dim = 512, .rope_dim = 512, .n_heads = 8, .n_k_heads = 2,
      .freq_base = 1e4f, .mode = LMK_ROPE_NEOX, .seq_len = 512}, LMK_BF16, DENSE, false, 0, LMK_ROPE_PAIRS, 16, 2,
     LMK_ROPE_PAIRS},
};

static bool multi(lmk_rope_mode m)
{
    return m == LMK_ROPE_MROPE || m == LMK_ROPE_IMROPE || m == LMK_ROPE_VISION;
}

/* lmk_rope's arguments for c on views of the arena (NULL positions buffer on failure). */
static bool rope_args(arena *A, const rope_route_case *c, lmk_rope_args *a)
{
    const lmk_rope_params *p = &c->p;
    const bool has_k = p->n_k_heads > 0;
    const operands o = make_operands(A, c->layout, c->in_place, c->dt, p->seq_len, p->n_heads, p->n_k_heads,
                                     p->head_dim, c->offset, false);
    const size_t n_pos = (multi(p->mode) ? 4 : 1) * (size_t)p->seq_len;
    lmk_buffer *pos = flat(A, LMK_I32, n_pos);
    if (!o.in[0] || !o.out[0] || (has_k && (!o.in[1] || !o.out[1])) || !pos)
        return false;
    const lmk_buffer *b[4] = {o.in[0], o.out[0], o.in[1], o.out[1]};
    const size_t heads[4] = {p->n_heads, p->n_heads, p->n_k_heads, p->n_k_heads};
    lmk_tensor3 t[4] = {{0}};
    for (int i = 0; i < (has_k ? 4 : 2); i++)
        if (!TST_REQUIRE(lmk_operand3("rope", "operand", b[i], p->seq_len, heads[i], p->head_dim, &t[i]) == LMK_OK,
                         "%s: operand %d: %s", c->name, i, lmk_last_error()))
            return false;
    *a = lmk_rope_args_for(p, c->dt, t, has_k, lmk_buffer_data(pos), LMK_I32, NULL);
    return true;
}

static const char *const k_rope_names[] = {
#define ROPE_NAME(id, name, kernel, copy, maps, reason, bench) name,
    LMK_ROPE_VARIANTS(ROPE_NAME)
#undef ROPE_NAME
};

static const char *const k_prologue_names[] = {
#define AP_NAME(id, name, kernel, units, f8, mix, chunk, reason, bench) name,
    LMK_AP_VARIANTS(AP_NAME)
#undef AP_NAME
};

/* c's route on d: the call's status, its launches in *n and the first's route in *r0 (variant -1
 * where the call fails; lmk_last_error says why). */
static lmk_status rope_route_of(arena *A, const rope_route_case *c, const lmk_cuda_device *d, int *n,
                                lmk_cuda_route *r0)
{
    lmk_rope_args a;
    lmk_cuda_route r[4];
    lmk_status st = LMK_ERR_INVALID_ARGUMENT;
    *n = 0;
    *r0 = (lmk_cuda_route){.variant = -1, .variant_name = "-"};
    if (rope_args(A, c, &a) && (st = lmk_cuda_rope_route(d, &a, r, 4, n)) == LMK_OK) {
        for (int j = 1; j < *n && j < 4; j++)
            CHECK(r[j].variant == r[0].variant, "rope %s: slice %d takes %s, slice 0 %s", c->name, j,
                  r[j].variant_name, r[0].variant_name);
        if (*n > 0)
            *r0 = r[0];
    }
    arena_reset(A);
    return st;
}

static void check_rope(arena *A, const char *dev_name, const lmk_cuda_device *d, bool h200)
{
    for (size_t i = 0; i < sizeof k_rope / sizeof k_rope[0]; i++) {
        const rope_route_case *c = &k_rope[i];
        const lmk_rope_variant want = h200 ? c->h200 : c->a100;
        lmk_cuda_route r;
        int n;
        const lmk_status st = rope_route_of(A, c, d, &n, &r);
        CHECK(st == LMK_OK && n == c->launches && r.variant == (int)want && r.unit_bytes == c->unit,
              "rope %s on %s: %d launches of %s (%u-byte units), want %d of %s (%u-byte units)%s%s", c->name, dev_name,
              n, r.variant_name, r.unit_bytes, c->launches, k_rope_names[want], c->unit, st == LMK_OK ? "" : ": ",
              st == LMK_OK ? "" : lmk_last_error());
    }
}

/* ---- attn_prologue ---- */

typedef struct prologue_route_case {
    const char *name;
    lmk_rope_params p;
    lmk_dtype dt;
    int layout;
    bool in_place;
    bool norm;
    int cache;          /* NO_CACHE, SAME, F8 */
    float scale;        /* f8 k_scale and v_scale */
    size_t offset;
    /* expected on the described H200 */
    lmk_ap_variant variant;
    unsigned unit;
} prologue_route_case;

#define P_QWEN3 .head_dim = 128, .rope_dim = 128, .n_heads = 32, .n_k_heads = 8, .freq_base = 1e6f, \
                .mode = LMK_ROPE_NEOX

static const prologue_route_case k_prologue[] = {
    /* prompts, 16-byte units: the stream kernel; MIX where rows hold pair and copy items, without f8 */
    {"Qwen3.5-27B prompt bf16, q from q|gate, bf16 cache", {R_QWEN35, .seq_len = 4106}, LMK_BF16, QGATE, false, true,
     SAME, 0, 0, LMK_AP_STREAM_MIX, 16},
    {"Qwen3.5-27B prompt f32, q from q|gate", {R_QWEN35, .seq_len = 4106}, LMK_F32, QGATE, false, true, SAME, 0, 0,
     LMK_AP_STREAM_MIX, 16},
    {"Qwen3.5-27B prompt bf16, f8 cache, scale 1/16", {R_QWEN35, .seq_len = 4106}, LMK_BF16, QGATE, false, true, F8,
     0.0625f, 0, LMK_AP_STREAM_F8, 16},
    {"Qwen3-8B prompt bf16, in place in QKV, bf16 cache", {P_QWEN3, .seq_len = 4106}, LMK_BF16, QKV, true, true, SAME,
     0, 0, LMK_AP_STREAM, 16},
    {"Qwen3-8B prompt bf16, f8 cache, calibrated scale", {P_QWEN3, .seq_len = 4106}, LMK_BF16, QKV, true, true, F8,
     0.0213f, 0, LMK_AP_STREAM_F8, 16},
    {"Llama-3.1-8B prompt bf16, no norm, k_out only", {R_LLAMA31, .seq_len = 4106}, LMK_BF16, DENSE, false, false,
     NO_CACHE, 0, 0, LMK_AP_STREAM, 16},
    /* decode: one token, and a batch of 64 sequences; with an f8 cache, 4-element units where a row
     * stays within 32 items (2-byte types), else 16-byte units */
    {"Qwen3.5-27B decode bf16", {R_QWEN35, .seq_len = 1}, LMK_BF16, QGATE, false, true, SAME, 0, 0,
     LMK_AP_DECODE_MIX, 16},
    {"Qwen3.5-27B decode bf16, f8 cache", {R_QWEN35, .seq_len = 1}, LMK_BF16, QGATE, false, true, F8, 0.0625f, 0,
     LMK_AP_DECODE_F8_NARROW_MIX, 8},
    {"Qwen3.5-27B decode f32, f8 cache", {R_QWEN35, .seq_len = 1}, LMK_F32, QGATE, false, true, F8, 0.0625f, 0,
     LMK_AP_DECODE_F8_MIX, 16},
    {"Qwen3-8B decode bf16, f8 cache", {P_QWEN3, .seq_len = 1}, LMK_BF16, QKV, true, true, F8, 0.0625f, 0,
     LMK_AP_DECODE_F8_NARROW, 8},
    {"Qwen3-8B decode f32, f8 cache", {P_QWEN3, .seq_len = 1}, LMK_F32, QKV, true, true, F8, 0.0625f, 0,
     LMK_AP_DECODE_F8, 16},
    {"Qwen3.5-27B batch of 64 bf16", {R_QWEN35, .seq_len = 64}, LMK_BF16, QGATE, false, true, SAME, 0, 0,
     LMK_AP_DECODE, 16},
    {"Qwen3.5-27B batch of 64 bf16, f8 cache", {R_QWEN35, .seq_len = 64}, LMK_BF16, QGATE, false, true, F8, 0.0625f,
     0, LMK_AP_DECODE_F8_NARROW_MIX, 8},
    {"Qwen3-8B decode bf16, in place in QKV", {P_QWEN3, .seq_len = 1}, LMK_BF16, QKV, true, true, SAME, 0, 0,
     LMK_AP_DECODE, 16},
    /* test_attn_prologue's rows of an odd number of copy units, no cache: they must reach MIX */
    {"edge: odd copy units, decode f16", {.head_dim = 72, .rope_dim = 48, .n_heads = 3, .n_k_heads = 2,
      .freq_base = 1e4f, .mode = LMK_ROPE_IMROPE, .sections = {8, 8, 8, 0}, .seq_len = 4}, LMK_F16, DENSE, true, true,
     NO_CACHE, 0, 0, LMK_AP_DECODE_MIX, 16},
    {"edge: odd copy units, decode f32, q from q|gate", {.head_dim = 100, .rope_dim = 56, .n_heads = 6,
      .n_k_heads = 3, .freq_base = 1e4f, .mode = LMK_ROPE_IMROPE, .sections = {10, 10, 8, 0}, .seq_len = 5},
     LMK_F32, QGATE, false, true, NO_CACHE, 0, 0, LMK_AP_DECODE_MIX, 16},
    {"edge: odd copy units, prompt f32", {.head_dim = 100, .rope_dim = 24, .n_heads = 8, .n_k_heads = 2,
      .freq_base = 1e4f, .mode = LMK_ROPE_NEOX, .seq_len = 1024}, LMK_F32, DENSE, false, true, NO_CACHE, 0, 0,
     LMK_AP_STREAM_MIX, 16},
    /* one-element units, rows in chunks, stream tables past 48 KB: the general kernel */
    {"Qwen3-8B prompt bf16, unaligned", {P_QWEN3, .seq_len = 4106}, LMK_BF16, DENSE, false, true, SAME, 0, 1,
     LMK_AP_BLOCK_ELEM, 2},
    {"head 4096 bf16, chunked rows", {.head_dim = 4096, .rope_dim = 4096, .n_heads = 2, .n_k_heads = 1,
      .freq_base = 1e4f, .mode = LMK_ROPE_NEOX, .seq_len = 64}, LMK_BF16, DENSE, false, true, SAME, 0, 0,
     LMK_AP_BLOCK_CHUNK, 16},
    {"head 512 bf16 unaligned, chunked rows", {.head_dim = 512, .rope_dim = 512, .n_heads = 4, .n_k_heads = 2,
      .freq_base = 1e4f, .mode = LMK_ROPE_NEOX, .seq_len = 256}, LMK_BF16, DENSE, false, true, SAME, 0, 1,
     LMK_AP_BLOCK_ELEM_CHUNK, 2},
    {"head 1024 bf16 prompt, full rope", {.head_dim = 1024, .rope_dim = 1024, .n_heads = 12, .n_k_heads = 2,
      .freq_base = 1e4f, .mode = LMK_ROPE_NEOX, .seq_len = 256}, LMK_BF16, DENSE, false, true, SAME, 0, 0,
     LMK_AP_BLOCK, 16},
};

static bool prologue_args(arena *A, const prologue_route_case *c, lmk_attn_prologue_args *a)
{
    const lmk_rope_params *p = &c->p;
    const size_t T = p->seq_len, D = p->head_dim;
    const operands o = make_operands(A, c->layout, c->in_place, c->dt, T, p->n_heads, p->n_k_heads, D, c->offset,
                                     c->cache != NO_CACHE);
    const lmk_dtype cdt = c->cache == F8 ? LMK_F8E4M3 : c->dt;
    lmk_attn_prologue_io io = {.q_in = o.in[0], .k_in = o.in[1], .q_out = o.out[0]};
    if (c->norm) {
        io.q_norm_w = flat(A, LMK_F32, D);
        io.k_norm_w = flat(A, LMK_F32, D);
    }
    io.positions = flat(A, LMK_I32, (multi(p->mode) ? 4 : 1) * T);
    if (c->cache == NO_CACHE) {
        io.k_out = o.out[1];
    } else {
        io.v_in = o.in[2];
        io.slots = flat(A, LMK_I32, T);
        io.k_cache = dense(A, cdt, T, p->n_k_heads, D, c->offset);
        io.v_cache = dense(A, cdt, T, p->n_k_heads, D, c->offset);
        io.k_scale = io.v_scale = c->scale;
    }
    if (!io.q_in || !io.k_in || !io.q_out || !io.positions || (c->norm && (!io.q_norm_w || !io.k_norm_w)) ||
        (c->cache != NO_CACHE && (!io.slots || !io.v_in || !io.k_cache || !io.v_cache)) ||
        (c->cache == NO_CACHE && !io.k_out))
        return false;
    const lmk_rms_norm_params norm = {.eps = 1e-6f, .weight_offset = 0.0f};
    return TST_REQUIRE(lmk_attn_prologue_prepare(A->cpu, &io, p, &norm, a) == LMK_OK, "%s: prepare: %s", c->name,
                       lmk_last_error());
}

/* c's route on d (the call's status; r->variant -1 where it fails). */
static lmk_status prologue_route_of(arena *A, const prologue_route_case *c, const lmk_cuda_device *d,
                                    lmk_cuda_route *r)
{
    lmk_attn_prologue_args a;
    lmk_status st = LMK_ERR_INVALID_ARGUMENT;
    *r = (lmk_cuda_route){.variant = -1, .variant_name = "-"};
    if (prologue_args(A, c, &a) && (st = lmk_cuda_attn_prologue_route(d, &a, r)) != LMK_OK)
        *r = (lmk_cuda_route){.variant = -1, .variant_name = "-"};
    arena_reset(A);
    return st;
}

static void check_prologue(arena *A, const char *dev_name, const lmk_cuda_device *d)
{
    for (size_t i = 0; i < sizeof k_prologue / sizeof k_prologue[0]; i++) {
        const prologue_route_case *c = &k_prologue[i];
        lmk_cuda_route r;
        const lmk_status st = prologue_route_of(A, c, d, &r);
        CHECK(st == LMK_OK && r.variant == (int)c->variant && r.unit_bytes == c->unit,
              "attn_prologue %s on %s: %s (%u-byte units), want %s (%u-byte units)%s%s", c->name, dev_name,
              r.variant_name, r.unit_bytes, k_prologue_names[c->variant], c->unit, st == LMK_OK ? "" : ": ",
              st == LMK_OK ? "" : lmk_last_error());
    }
}

/* Every row of both tables is the route of some case on the described devices: a row that no
 * shape reaches is dead code, or code no test plans. */
static void check_coverage(void)
{
    bool rope[LMK_ROPE_N_VARIANTS] = {false}, prologue[LMK_AP_N_VARIANTS] = {false};
    for (size_t i = 0; i < sizeof k_rope / sizeof k_rope[0]; i++)
        rope[k_rope[i].h200] = rope[k_rope[i].a100] = true;
    for (size_t i = 0; i < sizeof k_prologue / sizeof k_prologue[0]; i++)
        prologue[k_prologue[i].variant] = true;
    for (int v = 0; v < LMK_ROPE_N_VARIANTS; v++)
        CHECK(rope[v], "rope: variant %s is no case's route", k_rope_names[v]);
    for (int v = 0; v < LMK_AP_N_VARIANTS; v++)
        CHECK(prologue[v], "attn_prologue: variant %s is no case's route", k_prologue_names[v]);
}

/* A row forced onto a case (by its name in k_rope or k_prologue): its route is then that row, or
 * the call fails with LMK_ERR_UNSUPPORTED (runs false) where the row cannot run it. */
typedef struct forced_case {
    const char *name;
    int variant;
    bool runs;
    unsigned unit; /* unit bytes where it runs */
} forced_case;

#define P_QWEN3_PROMPT "Qwen3-8B prompt bf16, in place in QKV, bf16 cache"
static const forced_case k_prologue_forced[] = {
    {"Qwen3.5-27B prompt bf16, q from q|gate, bf16 cache", LMK_AP_STREAM, true, 16}, /* MIX off */
    {P_QWEN3_PROMPT, LMK_AP_STREAM_F8, true, 16},                                    /* f8 paths, no f8 cache */
    {P_QWEN3_PROMPT, LMK_AP_BLOCK, true, 16},                                        /* the general kernel */
    {"Qwen3-8B decode bf16, in place in QKV", LMK_AP_BLOCK, true, 16},               /* its small-call form */
    {"Qwen3.5-27B batch of 64 bf16", LMK_AP_DECODE_MIX, true, 16},                   /* MIX past a block an SM */
    {"Qwen3.5-27B decode bf16, f8 cache", LMK_AP_DECODE_F8_MIX, true, 16},           /* 16-byte f8 units */
    {P_QWEN3_PROMPT, LMK_AP_STREAM_MIX, false, 0},                                   /* no pair-and-copy rows */
    {"Qwen3-8B prompt bf16, f8 cache, calibrated scale", LMK_AP_STREAM, false, 0},  /* its f8 cache needs f8 paths */
    {P_QWEN3_PROMPT, LMK_AP_DECODE, false, 0},                                       /* a prompt */
    {"Qwen3-8B decode f32, f8 cache", LMK_AP_DECODE_F8_NARROW, false, 0},           /* f32: 4 elements are 16 bytes */
    {"Qwen3-8B prompt bf16, unaligned", LMK_AP_STREAM, false, 0},                    /* one-element units */
};

static const forced_case k_rope_forced[] = {
    {"Qwen3.5-27B prompt bf16", LMK_ROPE_ROWS, true, 16},
    {"Qwen3.5-27B prompt bf16, q from q|gate", LMK_ROPE_ROWS, true, 16},
    {"Qwen3.5-27B decode bf16, q from q|gate", LMK_ROPE_ROWS, true, 8},
    {"Llama-3.1-8B decode bf16", LMK_ROPE_PAIRS, true, 8},
    {"Llama-3.1-8B decode bf16", LMK_ROPE_DECODE_COPY, true, 8},          /* copy items compiled in, none run */
    {"Qwen3.5-27B prompt bf16", LMK_ROPE_BULK_MAPS, true, 16},             /* tensor maps carried, none used */
    {"Llama-3.1-8B prompt bf16", LMK_ROPE_BULK, false, 0},                 /* nothing to copy */
    {"Qwen3.5-27B prompt bf16", LMK_ROPE_PAIRS, false, 0},                 /* elements to copy */
    {"Qwen3.5-27B prompt bf16, q from q|gate", LMK_ROPE_BULK, false, 0}, /* q's heads need tensor maps */
    {"Qwen3.5-27B decode bf16, q from q|gate", LMK_ROPE_DECODE, false, 0}, /* elements to copy */
};

/* The forced rows on the described H200; the hooks reject ids outside their tables. */
static void check_forced(arena *A, const lmk_cuda_device *h200)
{
    for (size_t i = 0; i < sizeof k_prologue_forced / sizeof k_prologue_forced[0]; i++) {
        const forced_case *f = &k_prologue_forced[i];
        const prologue_route_case *c = NULL;
        for (size_t j = 0; j < sizeof k_prologue / sizeof k_prologue[0] && !c; j++)
            c = strcmp(k_prologue[j].name, f->name) == 0 ? &k_prologue[j] : NULL;
        lmk_cuda_route r = {.variant = -1, .variant_name = "-"};
        lmk_status st = LMK_ERR_INVALID_ARGUMENT;
        if (TST_REQUIRE(c, "forced: no attn_prologue case %s", f->name) &&
            TST_REQUIRE(lmk_cuda_attn_prologue_force(f->variant) == LMK_OK, "force: %s", lmk_last_error()))
            st = prologue_route_of(A, c, h200, &r);
        CHECK(f->runs ? st == LMK_OK && r.variant == f->variant && r.unit_bytes == f->unit : st == LMK_ERR_UNSUPPORTED,
              "attn_prologue %s forced onto %s: %s, %s (%u-byte units); want %s", f->name, k_prologue_names[f->variant],
              lmk_status_name(st), st == LMK_OK ? r.variant_name : lmk_last_error(), st == LMK_OK ? r.unit_bytes : 0,
              f->runs ? "that row" : "UNSUPPORTED");
    }
    for (size_t i = 0; i < sizeof k_rope_forced / sizeof k_rope_forced[0]; i++) {
        const forced_case *f = &k_rope_forced[i];
        const rope_route_case *c = NULL;
        for (size_t j = 0; j < sizeof k_rope / sizeof k_rope[0] && !c; j++)
            c = strcmp(k_rope[j].name, f->name) == 0 ? &k_rope[j] : NULL;
        lmk_cuda_route r = {.variant = -1, .variant_name = "-"};
        lmk_status st = LMK_ERR_INVALID_ARGUMENT;
        int n = 0;
        if (TST_REQUIRE(c, "forced: no rope case %s", f->name) &&
            TST_REQUIRE(lmk_cuda_rope_force(f->variant) == LMK_OK, "force: %s", lmk_last_error()))
            st = rope_route_of(A, c, h200, &n, &r);
        CHECK(f->runs ? st == LMK_OK && n == c->launches && r.variant == f->variant && r.unit_bytes == f->unit
                      : st == LMK_ERR_UNSUPPORTED,
              "rope %s forced onto %s: %s, %d launches of %s (%u-byte units)%s%s; want %s", f->name,
              k_rope_names[f->variant], lmk_status_name(st), n, r.variant_name, r.unit_bytes,
              st == LMK_OK ? "" : ": ", st == LMK_OK ? "" : lmk_last_error(), f->runs ? "that row" : "UNSUPPORTED");
    }
    CHECK(lmk_cuda_attn_prologue_force(-1) == LMK_OK && lmk_cuda_rope_force(-1) == LMK_OK, "unforce: %s",
          lmk_last_error());
    CHECK(lmk_cuda_attn_prologue_force(LMK_AP_N_VARIANTS) == LMK_ERR_INVALID_ARGUMENT &&
              lmk_cuda_rope_force(-2) == LMK_ERR_INVALID_ARGUMENT,
          "the force hooks take -1 and the tables' ids only");
}

int main(void)
{
    arena A = {0};
    A.base = malloc(ARENA);
    if (!A.base || lmk_device_open(LMK_BACKEND_CPU, 0, &A.cpu) != LMK_OK) {
        TST_FAIL("setup: %s", A.base ? lmk_last_error() : "cannot reserve the arena");
        free(A.base);
        return harness_summary();
    }
    const lmk_cuda_device h200 = described_h200(), a100 = described_a100();
    check_rope(&A, "a described H200", &h200, true);
    check_rope(&A, "a described A100", &a100, false);
    check_prologue(&A, "a described H200", &h200);
    check_coverage();
    check_forced(&A, &h200);

    lmk_device *gpu = NULL;
    if (lmk_device_count(LMK_BACKEND_CUDA) <= 0) {
        SKIP("cuda: no GPU; routes checked on described devices only");
    } else if (lmk_device_open(LMK_BACKEND_CUDA, 0, &gpu) != LMK_OK) {
        TST_FAIL("cuda:0: lmk_device_open: %s", lmk_last_error());
    } else {
        const lmk_cuda_device *d = lmk_cuda_dev(gpu);
        if (d->sm_count == h200.sm_count && d->bulk && d->tmap_encode) {
            check_rope(&A, gpu->name, d, true);
            check_prologue(&A, gpu->name, d);
        } else {
            SKIP("cuda: %s has %d SMs%s; its routes are checked only where it is H200-like", gpu->name, d->sm_count,
                 d->bulk ? "" : ", no bulk copies");
        }
        lmk_device_close(gpu);
    }
    lmk_device_close(A.cpu);
    free(A.base);
    return harness_summary();
}
