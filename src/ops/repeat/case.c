/*
 * case.c - the case descriptor of repeat (testkit/testkit.h): lmk_repeat_heads in both layouts and
 * the 0.1 entry point lmk_repeat_tiled, on real model shapes, dense and strided.
 *
 * One table holds every case `lmk check` and the tests run: the Gated DeltaNet q/k broadcasts of
 * Qwen3.5/3.6 (16 key heads to 32, 48 or 64, tiled, q read straight out of the packed q|k|v
 * convolution output), Llama-3.1-8B's Hugging Face repeat_kv (8 KV heads to 32, block, k read out
 * of the packed QKV projection), edge shapes (tails, h == hg, k = 1, unaligned views, more than
 * 2^32 elements). A copy is compared bit for bit with lmk_ref_repeat, in chunks of tokens, so a
 * case larger than memory twice over still compares every element.
 */
#include "ops/repeat/case.h"
#include "testkit_ref.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ENTRY_TILED, ENTRY_HEADS }; /* lmk_repeat_tiled (0.1), lmk_repeat_heads */
enum { SRC, DST };                 /* the operands in tst_inst.arg */

/* Where an operand lies in the buffer that holds it: `row` elements per token (0: the operand is
 * dense), its head 0 `at` elements into the row, heads `head` elements apart (0: k). */
typedef struct lay {
    uint32_t row, at, head;
    const char *what; /* how the name says it, e.g. "src=k of qkv[32|8|8]" */
} lay;

typedef struct repeat_case {
    int entry;
    uint32_t seq, hg, h, k;
    lmk_repeat_layout layout;
    lmk_dtype dtype;
    uint32_t offset; /* elements past a 256-byte boundary: 1 makes every view unaligned */
    lay src, dst;
} repeat_case;

_Static_assert(sizeof(repeat_case) <= TST_CASE_PARAMS, "repeat_case must fit in tst_case.p");

static const repeat_case *P(const tst_case *c)
{
    return (const repeat_case *)(const void *)c->p.bytes;
}

/* ---- the table ---- */

#define D(t) (1u << (t))
#define D5 (D(LMK_F32) | D(LMK_BF16) | D(LMK_F16) | D(LMK_U8) | D(LMK_I32))

typedef struct row {
    repeat_case rc;  /* dtype unset: one case per dtype of `dtypes` */
    unsigned dtypes;
    unsigned flags;
    const char *model;
} row;

#define TILED01 .entry = ENTRY_TILED, .layout = LMK_REPEAT_TILED
#define HEADS(l) .entry = ENTRY_HEADS, .layout = LMK_REPEAT_##l
/* Llama-3.1-8B: q 32, k 8, v 8 heads of 128 in one projection; k is the source. */
#define LLAMA_K {.row = 48 * 128, .at = 32 * 128, .what = "src=k of qkv[32|8|8]"}
/* Qwen3.5/3.6-27B Gated DeltaNet: the convolution's output holds q 16, k 16, v 48 heads of 128. */
#define GDN_Q {.row = 80 * 128, .at = 0, .what = "src=q of qkv[16|16|48]"}

static const row k_rows[] = {
    /* lmk_repeat_tiled (0.1): Gated DeltaNet q/k, K 128, 16 source heads */
    {{TILED01, .seq = 1, .hg = 16, .h = 48, .k = 128}, D5, 0, "Qwen3.5/3.6-27B GDN decode"},
    {{TILED01, .seq = 64, .hg = 16, .h = 48, .k = 128}, D5, 0, "Qwen3.5/3.6-27B GDN"},
    {{TILED01, .seq = 1, .hg = 16, .h = 32, .k = 128}, D5, 0, "Qwen3.5-4B/9B/35B-A3B GDN decode"},
    {{TILED01, .seq = 64, .hg = 16, .h = 32, .k = 128}, D5, 0, "Qwen3.5-4B/9B/35B-A3B GDN"},
    {{TILED01, .seq = 1, .hg = 16, .h = 64, .k = 128}, D5, 0, "Qwen3.5-122B/397B GDN decode"},
    {{TILED01, .seq = 33, .hg = 16, .h = 64, .k = 128}, D5, 0, "Qwen3.5-122B/397B GDN"},
    {{TILED01, .seq = 37, .hg = 16, .h = 48, .k = 128}, D(LMK_F32), TST_CASE_CONTRACT, "Qwen3.5/3.6-27B GDN"},
    /* unaligned views, and sizes that leave tails */
    {{TILED01, .seq = 5, .hg = 16, .h = 48, .k = 128, .offset = 1}, D5, 0, "Qwen3.5/3.6-27B GDN, unaligned"},
    {{TILED01, .seq = 7, .hg = 1, .h = 7, .k = 3}, D5, 0, "edge: one source head, k 3"},
    {{TILED01, .seq = 3, .hg = 3, .h = 6, .k = 5, .offset = 1}, D5, 0, "edge: odd sizes, unaligned"},
    {{TILED01, .seq = 4, .hg = 4, .h = 4, .k = 33}, D5, 0, "edge: h == hg"},
    {{TILED01, .seq = 9, .hg = 16, .h = 48, .k = 1}, D5, 0, "edge: k 1"},
    /* outputs of several MB, large enough for the CPU's streaming-store path, aligned or not */
    {{TILED01, .seq = 700, .hg = 16, .h = 48, .k = 128}, D5, 0, "Qwen3.5/3.6-27B GDN prompt"},
    {{TILED01, .seq = 701, .hg = 16, .h = 32, .k = 128, .offset = 1}, D5, 0, "Qwen3.5-9B GDN prompt, unaligned"},
    {{TILED01, .seq = 4106, .hg = 16, .h = 48, .k = 128}, D5, TST_CASE_FULL, "Qwen3.5/3.6-27B GDN prompt"},
    {{TILED01, .seq = 4106, .hg = 16, .h = 32, .k = 128}, D5, TST_CASE_FULL, "Qwen3.5-9B GDN prompt"},
    /* more than 2^32 output elements (and bytes): the kernels must index with 64 bits */
    {{TILED01, .seq = 699051, .hg = 16, .h = 48, .k = 128}, D(LMK_U8), TST_CASE_FULL, "more than 2^32 elements"},

    /* lmk_repeat_heads, block: Hugging Face repeat_kv, k straight out of the QKV projection */
    {{HEADS(BLOCK), .seq = 1, .hg = 8, .h = 32, .k = 128, .src = LLAMA_K}, D(LMK_BF16) | D(LMK_F32), 0,
     "Llama-3.1-8B decode (HF repeat_kv)"},
    {{HEADS(BLOCK), .seq = 37, .hg = 8, .h = 32, .k = 128, .src = LLAMA_K}, D(LMK_BF16) | D(LMK_F16), 0,
     "Llama-3.1-8B (HF repeat_kv)"},
    {{HEADS(BLOCK), .seq = 5, .hg = 8, .h = 32, .k = 128, .src = LLAMA_K}, D(LMK_BF16), TST_CASE_CONTRACT,
     "Llama-3.1-8B (HF repeat_kv)"},
    {{HEADS(BLOCK), .seq = 37, .hg = 8, .h = 32, .k = 128}, D(LMK_F32), 0, "Llama-3.1-8B, dense k"},
    {{HEADS(BLOCK), .seq = 4106, .hg = 8, .h = 32, .k = 128, .src = LLAMA_K}, D(LMK_BF16), TST_CASE_FULL,
     "Llama-3.1-8B prompt (HF repeat_kv)"},
    {{HEADS(BLOCK), .seq = 20, .hg = 4, .h = 28, .k = 128}, D(LMK_BF16), 0, "Qwen2-VL-7B (HF repeat_kv)"},
    /* 4.3 MB out of a strided source: the CPU's streaming stores, and memcpy when unaligned */
    {{HEADS(BLOCK), .seq = 520, .hg = 8, .h = 32, .k = 128, .src = LLAMA_K}, D(LMK_BF16), 0,
     "Llama-3.1-8B prompt (HF repeat_kv)"},
    {{HEADS(BLOCK), .seq = 520, .hg = 8, .h = 32, .k = 128, .offset = 1, .src = LLAMA_K}, D(LMK_BF16), 0,
     "Llama-3.1-8B prompt (HF repeat_kv), unaligned"},
    {{HEADS(TILED), .seq = 260, .hg = 16, .h = 48, .k = 128, .src = GDN_Q}, D(LMK_BF16), 0,
     "Qwen3.5/3.6-27B GDN prompt"},
    /* lmk_repeat_heads, tiled: the Gated DeltaNet q read out of the convolution's q|k|v output */
    {{HEADS(TILED), .seq = 1, .hg = 16, .h = 48, .k = 128, .src = GDN_Q}, D(LMK_F32) | D(LMK_BF16), 0,
     "Qwen3.5/3.6-27B GDN decode"},
    {{HEADS(TILED), .seq = 64, .hg = 16, .h = 48, .k = 128, .src = GDN_Q}, D(LMK_F32) | D(LMK_BF16), 0,
     "Qwen3.5/3.6-27B GDN"},
    {{HEADS(TILED), .seq = 3, .hg = 16, .h = 48, .k = 128, .src = GDN_Q}, D(LMK_F16), TST_CASE_CONTRACT,
     "Qwen3.5/3.6-27B GDN"},
    {{HEADS(TILED), .seq = 4106, .hg = 16, .h = 48, .k = 128, .src = GDN_Q}, D(LMK_BF16), TST_CASE_FULL,
     "Qwen3.5/3.6-27B GDN prompt"},
    {{HEADS(TILED), .seq = 64, .hg = 16, .h = 32, .k = 128}, D(LMK_F32), 0, "Qwen3.5-9B GDN, dense q"},
    /* edges: heads padded apart, a destination inside a wider buffer, odd sizes, every dtype */
    {{HEADS(BLOCK), .seq = 5, .hg = 4, .h = 8, .k = 33, .src = {.row = 163, .at = 3, .head = 40, .what = "src=padded"}},
     D(LMK_F32) | D(LMK_U8), 0, "edge: padded heads"},
    {{HEADS(BLOCK), .seq = 7, .hg = 2, .h = 6, .k = 16, .dst = {.row = 128, .at = 16, .what = "dst=heads 1-6 of 8"}},
     D(LMK_U16) | D(LMK_F8E4M3), 0, "edge: dst inside a wider buffer"},
    {{HEADS(TILED), .seq = 3, .hg = 3, .h = 6, .k = 5, .offset = 1}, D5 | D(LMK_I64) | D(LMK_F8E4M3), 0,
     "edge: odd sizes, unaligned"},
    {{HEADS(BLOCK), .seq = 7, .hg = 1, .h = 7, .k = 3}, D5, 0, "edge: one source head"},
};

static int popcount(unsigned x)
{
    int n = 0;
    for (; x; x &= x - 1)
        n++;
    return n;
}

static int repeat_n_cases(void)
{
    int n = 0;
    for (size_t i = 0; i < sizeof k_rows / sizeof k_rows[0]; i++)
        n += popcount(k_rows[i].dtypes);
    return n;
}

/* "repeat_heads block 8->32 k=128 T=37 bf16 src=k of qkv[32|8|8] // Llama-3.1-8B". */
static void name_case(tst_case *c, const char *model)
{
    const repeat_case *rc = P(c);
    const bool tiled01 = rc->entry == ENTRY_TILED;
    const bool huge = (uint64_t)rc->seq * rc->h * rc->k > UINT32_MAX;
    tst_case_name(c, "%s%s %u->%u k=%u T=%u %s%s%s%s%s%s%s // %s", tiled01 ? "repeat_tiled" : "repeat_heads",
                  tiled01 ? "" : rc->layout == LMK_REPEAT_BLOCK ? " block" : " tiled", rc->hg, rc->h, rc->k, rc->seq,
                  lmk_dtype_name(rc->dtype), rc->src.what ? " " : "", rc->src.what ? rc->src.what : "",
                  rc->dst.what ? " " : "", rc->dst.what ? rc->dst.what : "", rc->offset ? " unaligned" : "",
                  huge ? " (>2^32 elements)" : "", model);
}

static void set_case(tst_case *c, const repeat_case *rc, unsigned flags, const char *model)
{
    memcpy(c->p.bytes, rc, sizeof *rc);
    c->flags = flags;
    c->T = rc->seq;
    c->dtype = rc->dtype;
    name_case(c, model);
}

static void repeat_get_case(int i, tst_case *c)
{
    for (size_t r = 0; r < sizeof k_rows / sizeof k_rows[0]; r++)
        for (int t = 0; t < LMK_DTYPE_COUNT; t++)
            if (k_rows[r].dtypes & D(t) && i-- == 0) {
                repeat_case rc = k_rows[r].rc;
                rc.dtype = (lmk_dtype)t;
                set_case(c, &rc, k_rows[r].flags, k_rows[r].model);
                return;
            }
}

/* A random valid case: any dtype, both entry points and layouts, strided operands with padded
 * heads and tokens; one in eight large enough for the CPU worker pool. */
static void repeat_random_case(tst_rng *r, tst_case *c)
{
    static const uint32_t hgs[] = {1, 2, 3, 4, 8, 16}, ks[] = {1, 3, 8, 33, 64, 128};
    repeat_case rc = {.entry = tst_rng_below(r, 4) == 0 ? ENTRY_TILED : ENTRY_HEADS};
    rc.layout = rc.entry == ENTRY_TILED || tst_rng_below(r, 2) ? LMK_REPEAT_TILED : LMK_REPEAT_BLOCK;
    rc.dtype = (lmk_dtype)tst_rng_below(r, LMK_DTYPE_COUNT);
    const bool big = tst_rng_below(r, 8) == 0;
    rc.hg = big ? 16 : hgs[tst_rng_below(r, 6)];
    rc.h = rc.hg * (1 + tst_rng_below(r, big ? 3 : 4));
    rc.k = big ? 128 : ks[tst_rng_below(r, 6)];
    const uint32_t cap = big ? 400000 : 32768, max_seq = cap / (rc.h * rc.k) ? cap / (rc.h * rc.k) : 1;
    rc.seq = 1 + tst_rng_below(r, max_seq < 48 ? max_seq : 48);
    rc.offset = tst_rng_below(r, 4) == 0;
    if (rc.entry == ENTRY_HEADS) {
        lay *l[2] = {&rc.src, &rc.dst};
        const uint32_t heads[2] = {rc.hg, rc.h};
        for (int i = 0; i < 2; i++) {
            if (tst_rng_below(r, 2))
                continue;
            l[i]->head = rc.k + tst_rng_below(r, 3) * (1 + tst_rng_below(r, 8));
            l[i]->at = tst_rng_below(r, 9);
            l[i]->row = l[i]->at + (heads[i] - 1) * l[i]->head + rc.k + tst_rng_below(r, 9);
            l[i]->what = i ? "dst=strided" : "src=strided";
        }
    }
    set_case(c, &rc, 0, "random");
}

/* lmk_repeat_tiled on the Gated DeltaNet shapes, then lmk_repeat_heads reading
 * its source out of a projection: Hugging Face's repeat_kv (block) on Llama-3.1-8B's k inside the
 * packed QKV, and the tiled broadcast of Qwen3.5's GDN q inside the convolution's q|k|v output.
 * Each has a row in k_rows at check sizes. */
static int repeat_bench_cases(uint32_t T, lmk_dtype dtype, bool longest, tst_case *out, int max)
{
    (void)longest;
    const repeat_case b[] = {
        {TILED01, .seq = T, .hg = 16, .h = 48, .k = 128, .dtype = dtype},
        {TILED01, .seq = T, .hg = 16, .h = 32, .k = 128, .dtype = dtype},
        {HEADS(BLOCK), .seq = T, .hg = 8, .h = 32, .k = 128, .dtype = dtype, .src = LLAMA_K},
        {HEADS(TILED), .seq = T, .hg = 16, .h = 48, .k = 128, .dtype = dtype, .src = GDN_Q},
    };
    static const char *const model[] = {"Qwen3.5/3.6-27B GDN", "Qwen3.5-4B/9B/35B-A3B GDN",
                                        "Llama-3.1-8B (HF repeat_kv)", "Qwen3.5/3.6-27B GDN"};
    int n = 0;
    for (size_t i = 0; i < sizeof b / sizeof b[0] && n < max; i++)
        set_case(&out[n++], &b[i], 0, model[i]);
    return n;
}

static double repeat_bytes(const tst_case *c)
{
    const repeat_case *rc = P(c);
    return (double)rc->seq * (rc->hg + rc->h) * rc->k * (double)lmk_dtype_size(rc->dtype);
}

/* ---- on a device ---- */

/* The operand of `heads` heads laid out as l: its own region (guards on both sides), then the view.
 * The destination's region needs no host copy: it holds only poison and the output. */
static lmk_status place(tst_inst *in, const lay *l, uint32_t heads, bool output, lmk_buffer **out)
{
    const repeat_case *rc = P(&in->c);
    const size_t es = lmk_dtype_size(rc->dtype), k = rc->k;
    const size_t head = l->head ? l->head : k, row = l->row ? l->row : heads * head;
    const size_t n[3] = {rc->seq, heads, k}, stride[3] = {row, head, 1};
    int region;
    lmk_status st = tst_mem_region(&in->mem, 2 * TST_GUARD + es * (rc->offset + (size_t)rc->seq * row), !output,
                                   &region);
    if (st == LMK_OK)
        st = tst_mem_view(&in->mem, region, TST_GUARD + es * (rc->offset + l->at), rc->dtype, n, stride, output, out);
    return st;
}

static lmk_status repeat_setup(tst_inst *in)
{
    const repeat_case *rc = P(&in->c);
    lmk_status st = place(in, &rc->src, rc->hg, false, &in->arg[SRC]);
    if (st == LMK_OK)
        st = place(in, &rc->dst, rc->h, true, &in->arg[DST]);
    return st;
}

static void repeat_fill(tst_inst *in, tst_rng *r)
{
    tst_inst_fill(in, in->arg[SRC], r);
}

static lmk_status repeat_run(const tst_inst *in, lmk_stream *s)
{
    const repeat_case *rc = P(&in->c);
    if (rc->entry == ENTRY_TILED) {
        const lmk_repeat_tiled_params p = {.seq = rc->seq, .hg = rc->hg, .h = rc->h, .k = rc->k};
        return lmk_repeat_tiled(s, in->arg[SRC], in->arg[DST], &p);
    }
    const lmk_repeat_heads_params p = {.seq = rc->seq, .hg = rc->hg, .h = rc->h, .k = rc->k, .layout = rc->layout};
    return lmk_repeat_heads(s, in->arg[SRC], in->arg[DST], &p);
}

#define CHUNK_BYTES ((size_t)16 << 20)

/* Tokens [t0, t0 + nt) of dst read back (from element [t0, 0, 0] to the end of the last element)
 * against the reference written over a copy of the same bytes. */
static bool verify_chunk(const tst_inst *in, size_t t0, size_t nt, unsigned char *got, unsigned char *want,
                         tst_result *res)
{
    const repeat_case *rc = P(&in->c);
    const tst_view *sv = tst_mem_find(&in->mem, in->arg[SRC]), *dv = tst_mem_find(&in->mem, in->arg[DST]);
    const size_t es = lmk_dtype_size(rc->dtype);
    const size_t n[3] = {nt, rc->h, rc->k}, len = tst_span(n, dv->stride, es);
    const lmk_status st = tst_mem_read(&in->mem, dv->region, dv->off + t0 * dv->stride[0] * es, got, len);
    if (st != LMK_OK) {
        snprintf(res->msg, sizeof res->msg, "read back: %s: %s", lmk_status_name(st), lmk_last_error());
        return false;
    }
    memcpy(want, got, len);
    const unsigned char *src = tst_mem_host(&in->mem, in->arg[SRC]);
    const lmk_repeat_args a = {
        .src = src + t0 * sv->stride[0] * es, .dst = want, .seq = nt, .hg = rc->hg, .h = rc->h, .k = rc->k,
        .elem_size = es, .src_tok = sv->stride[0], .src_head = sv->stride[1], .dst_tok = dv->stride[0],
        .dst_head = dv->stride[1], .layout = rc->layout,
    };
    lmk_ref_repeat(&a);
    const long long d = tst_bits_diff(got, want, len);
    if (d < 0)
        return true;
    const size_t e = (size_t)d / es, t = e / dv->stride[0], rem = e % dv->stride[0];
    uint64_t g = 0, w = 0;
    memcpy(&g, got + e * es, es);
    memcpy(&w, want + e * es, es);
    snprintf(res->msg, sizeof res->msg, "not bit-exact at dst[t=%zu,h=%zu,k=%zu]: got 0x%0*llx want 0x%0*llx",
             t0 + t, rem / dv->stride[1], rem % dv->stride[1], (int)(2 * es), (unsigned long long)g, (int)(2 * es),
             (unsigned long long)w);
    return false;
}

static bool repeat_verify(const tst_inst *in, tst_result *res)
{
    const repeat_case *rc = P(&in->c);
    const tst_view *dv = tst_mem_find(&in->mem, in->arg[DST]);
    const size_t row_bytes = dv->stride[0] * lmk_dtype_size(rc->dtype);
    const size_t chunk = CHUNK_BYTES / row_bytes ? CHUNK_BYTES / row_bytes : 1;
    const size_t n[3] = {chunk < rc->seq ? chunk : rc->seq, rc->h, rc->k};
    const size_t cap = tst_span(n, dv->stride, lmk_dtype_size(rc->dtype));
    unsigned char *got = malloc(cap), *want = malloc(cap);
    bool ok = got && want;
    if (!ok)
        snprintf(res->msg, sizeof res->msg, "out of host memory");
    for (size_t t0 = 0; ok && t0 < rc->seq; t0 += chunk)
        ok = verify_chunk(in, t0, rc->seq - t0 < chunk ? rc->seq - t0 : chunk, got, want, res);
    free(got);
    free(want);
    res->exact = true;
    if (ok)
        snprintf(res->msg, sizeof res->msg, "bit-exact");
    return ok;
}

/* 0: h not a multiple of hg; 1: dst is src. */
static lmk_status repeat_invalid(const tst_inst *in, lmk_stream *s, int k, const char **want)
{
    const repeat_case *rc = P(&in->c);
    lmk_buffer *src = in->arg[SRC], *dst = k == 1 ? in->arg[SRC] : in->arg[DST];
    const uint32_t hg = k == 0 ? rc->h + 1 : rc->hg;
    *want = k == 0 ? "must be a multiple of hg" : "";
    if (rc->entry == ENTRY_TILED) {
        const lmk_repeat_tiled_params p = {.seq = rc->seq, .hg = hg, .h = rc->h, .k = rc->k};
        return lmk_repeat_tiled(s, src, dst, &p);
    }
    const lmk_repeat_heads_params p = {.seq = rc->seq, .hg = hg, .h = rc->h, .k = rc->k, .layout = rc->layout};
    return lmk_repeat_heads(s, src, dst, &p);
}

const tst_op tst_op_repeat = {
    .name = "repeat",
    .n_cases = repeat_n_cases,
    .get_case = repeat_get_case,
    .random_case = repeat_random_case,
    .bench_cases = repeat_bench_cases,
    .bytes = repeat_bytes,
    .setup = repeat_setup,
    .fill = repeat_fill,
    .run = repeat_run,
    .verify = repeat_verify,
    .n_invalid = 2,
    .invalid = repeat_invalid,
    .launches = 1,
};

/* ---- what the repeat tests share (case.h) ---- */

/* Gated DeltaNet layers broadcast q and k from Hg = 16 key heads of K = 128 to H value heads. */
const tst_gqa_shape tst_gqa_shapes[] = {
    {"qwen3.5-4B/9B/35B-A3B, qwen3.6-35B-A3B, qwen3-next-80B GDN", 16, 32, 128},
    {"qwen3.5/3.6-27B GDN", 16, 48, 128},
    {"qwen3.5-122B/397B GDN", 16, 64, 128},
};
const int tst_gqa_shape_count = (int)(sizeof tst_gqa_shapes / sizeof tst_gqa_shapes[0]);

char *tst_repeat_name(char *buf, size_t n, const lmk_repeat_tiled_params *p, lmk_dtype dtype, const char *comment)
{
    snprintf(buf, n, "repeat_tiled T=%u hg=%u h=%u k=%u %s%s%s", p->seq, p->hg, p->h, p->k, lmk_dtype_name(dtype),
             comment && *comment ? " // " : "", comment ? comment : "");
    return buf;
}

lmk_repeat_args tst_repeat_host_args(const void *src, void *dst, size_t seq, size_t hg, size_t h, size_t k, size_t es)
{
    return (lmk_repeat_args){.src = src, .dst = dst, .seq = seq, .hg = hg, .h = h, .k = k, .elem_size = es,
                             .src_tok = hg * k, .src_head = k, .dst_tok = h * k, .dst_head = k,
                             .layout = LMK_REPEAT_TILED};
}
