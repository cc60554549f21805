/*
 * test_repeat_heads.c - lmk_repeat_heads (GQA head broadcast, tiled or block layout, dense or
 * strided operands) on every backend against the reference, bit for bit.
 *
 *     src [T, hg, k] -> dst [T, h, k],   dst[t, i, j] = src[t, g(i), j]
 *     TILED g(i) = i % hg (GGUF),  BLOCK g(i) = i / (h / hg) (Hugging Face repeat_kv)
 *
 * A pure copy, so every comparison is of bits: each backend against lmk_ref_repeat on fresh
 * random bytes, over the Gated DeltaNet shapes of Qwen3.5/3.6 and the GQA shapes of Hugging Face
 * models (Llama-3.1-8B, Qwen3.5-27B), at decode, a short prompt and the 4106-token prompt, in
 * element sizes 1, 2, 4 and 8. Sources are dense or strided views (k inside a packed QKV
 * projection, head-major, stride 0); outputs are dense or strided views inside a larger parent.
 * The whole parent of the output is poisoned before each run and compared afterwards, so an
 * unwritten element, a write into a gap between rows and a write past the end (guard bytes) all
 * fail. Then lmk_repeat_tiled against lmk_repeat_heads(TILED), and every validation rule of lmk.h
 * in its order, with the message it must give and no byte written by a rejected call.
 */
#include "common.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

HARNESS_DEFINE;

/* ------------------------------------------------------------------------------------------------
 * one case: operands, run, compare
 * ---------------------------------------------------------------------------------------------- */

/* Where an operand lives: a plain dense buffer of exactly [T, heads, k] (view false), or a strided
 * view at element offset `off` of a parent of `off + span + tail` elements, with element strides. */
typedef struct geom {
    bool view;
    size_t tok, head, off, tail;
} geom;

typedef struct rh_case {
    lmk_repeat_heads_params p;
    lmk_dtype dtype;
    geom src, dst;
    const char *what;
} rh_case;

static const char *layout_name(lmk_repeat_layout l)
{
    return l == LMK_REPEAT_TILED ? "tiled" : l == LMK_REPEAT_BLOCK ? "block" : "layout?";
}

static void case_name(char *buf, size_t n, const rh_case *c)
{
    snprintf(buf, n, "repeat_heads %s T=%u hg=%u h=%u k=%u %s src[%zu,%zu]+%zu dst[%zu,%zu]+%zu // %s",
             layout_name(c->p.layout), c->p.seq, c->p.hg, c->p.h, c->p.k, lmk_dtype_name(c->dtype), c->src.tok,
             c->src.head, c->src.off, c->dst.tok, c->dst.head, c->dst.off, c->what ? c->what : "");
}

/* The strides an operand of `heads` heads really has (dense: row-major). */
static geom resolved(geom g, const lmk_repeat_heads_params *p, uint32_t heads)
{
    if (!g.view)
        g = (geom){.tok = (size_t)heads * p->k, .head = p->k};
    return g;
}

/* Elements from element 0 of the operand to one past its furthest element. */
static size_t span_of(const geom *g, const lmk_repeat_heads_params *p, uint32_t heads)
{
    return (p->seq - 1) * g->tok + (heads - 1) * g->head + p->k;
}

/* Random elements, none of which is all poison bytes (an unwritten output element can never pass
 * for a written one). */
static void fill_src(tst_rng *r, unsigned char *p, size_t n, size_t es)
{
    tst_fill_bytes(r, p, n * es);
    for (size_t i = 0; i < n; i++)
        if (tst_count_unwritten(p + i * es, 1, es, TST_POISON))
            p[i * es] ^= 0x5A;
}

/* A device operand over a host parent of `bytes` bytes: a plain [T, heads, k] buffer (g.tok == 0 in
 * the case) or a strided view of a parent buffer. *parent is what to read back (the parent). */
static lmk_buffer *make_operand(tst_dev *d, const rh_case *c, const geom *given, const geom *g, uint32_t heads,
                                const unsigned char *host, size_t bytes, lmk_buffer **parent)
{
    const size_t es = lmk_dtype_size(c->dtype);
    const size_t shape[3] = {c->p.seq, heads, c->p.k}, strides[3] = {g->tok, g->head, 1};
    if (!given->view) {
        const size_t used = (size_t)c->p.seq * heads * c->p.k * es;
        *parent = tst_buf(d->dev, c->dtype, shape, 3, used, bytes - used, host, bytes, -1);
        return *parent;
    }
    *parent = tst_buf(d->dev, LMK_U8, NULL, 0, bytes, 0, host, bytes, -1);
    lmk_buffer *v = NULL;
    if (*parent) {
        const lmk_status st = lmk_buffer_view_strided(*parent, g->off * es, c->dtype, shape, strides, 3, &v);
        TST_REQUIRE(st == LMK_OK, "view_strided: %s", lmk_last_error());
    }
    return v;
}

/* Where byte `at` of the dst parent sits: an element (t, i, j) of dst, or outside every element.
 * A search over the rows, since strides may be in any order (only run on a failure). */
static void describe_byte(char *buf, size_t n, const rh_case *c, const geom *g, size_t at)
{
    const size_t es = lmk_dtype_size(c->dtype);
    if (at >= g->off * es) {
        const size_t e = (at - g->off * es) / es;
        for (size_t t = 0; t < c->p.seq; t++)
            for (size_t i = 0; i < c->p.h; i++) {
                const size_t row = t * g->tok + i * g->head;
                if (e >= row && e < row + c->p.k) {
                    snprintf(buf, n, "byte %zu = element t=%zu head=%zu j=%zu", at, t, i, e - row);
                    return;
                }
            }
    }
    snprintf(buf, n, "byte %zu, outside every output element (before it, a gap or the guard)", at);
}

/* Runs lmk_repeat_heads on both parents' device copies and compares the whole dst parent with the
 * reference run on host copies. Returns the dst parent read back (caller frees) or NULL. */
static unsigned char *run_once(tst_dev *d, const rh_case *c, lmk_buffer *src, lmk_buffer *dst,
                               lmk_buffer *dst_parent, const char *name)
{
    lmk_status st = lmk_repeat_heads(d->stream, src, dst, &c->p);
    if (st == LMK_OK)
        st = lmk_stream_sync(d->stream);
    if (!TST_REQUIRE(st == LMK_OK, "%s [%s]: %s \"%s\"", name, d->name, lmk_status_name(st), lmk_last_error()))
        return NULL;
    return tst_read_all(dst_parent);
}

static void run_case(tst_dev *d, const rh_case *c, bool twice)
{
    const size_t es = lmk_dtype_size(c->dtype);
    const geom sg = resolved(c->src, &c->p, c->p.hg), dg = resolved(c->dst, &c->p, c->p.h);
    const size_t src_bytes = (sg.off + span_of(&sg, &c->p, c->p.hg) + sg.tail) * es;
    const size_t dst_bytes = (dg.off + span_of(&dg, &c->p, c->p.h) + dg.tail) * es + TST_GUARD;
    const uint64_t seed = tst_case_seed();
    tst_rng r = tst_rng_make(seed);
    char name[320];
    case_name(name, sizeof name, c);
    unsigned char *src_host = malloc(src_bytes), *want = malloc(dst_bytes), *got = NULL, *got2 = NULL;
    lmk_buffer *sp = NULL, *dp = NULL, *sv = NULL, *dv = NULL;
    if (!TST_REQUIRE(src_host && want, "%s: out of host memory", name))
        goto done;
    fill_src(&r, src_host, src_bytes / es, es);
    tst_poison(want, dst_bytes, TST_POISON);
    sv = make_operand(d, c, &c->src, &sg, c->p.hg, src_host, src_bytes, &sp);
    dv = make_operand(d, c, &c->dst, &dg, c->p.h, want, dst_bytes, &dp);
    if (!sv || !dv)
        goto done;
    const lmk_repeat_args a = {
        .src = src_host + sg.off * es, .dst = want + dg.off * es, .seq = c->p.seq, .hg = c->p.hg, .h = c->p.h,
        .k = c->p.k, .elem_size = es, .src_tok = sg.tok, .src_head = sg.head, .dst_tok = dg.tok,
        .dst_head = dg.head, .layout = c->p.layout};
    lmk_ref_repeat(&a);
    got = run_once(d, c, sv, dv, dp, name);
    if (!got)
        goto done;
    const long long diff = tst_bits_diff(got, want, dst_bytes);
    char where[160] = "";
    if (diff >= 0)
        describe_byte(where, sizeof where, c, &dg, (size_t)diff);
    CHECK(diff < 0, "%s [%s] seed 0x%016" PRIx64 ": differs from the reference at %s (got 0x%02x, want 0x%02x)",
          name, d->name, seed, where, diff >= 0 ? got[diff] : 0, diff >= 0 ? want[diff] : 0);
    if (twice) {
        /* Determinism: a second run into a freshly poisoned output gives the same bits. */
        if (lmk_buffer_write(dp, 0, memset(want, TST_POISON, dst_bytes), dst_bytes) == LMK_OK)
            got2 = run_once(d, c, sv, dv, dp, name);
        CHECK(got2 && memcmp(got, got2, dst_bytes) == 0, "%s [%s]: a second run is not bit-identical", name, d->name);
    }
done:
    if (dv != dp)
        lmk_buffer_free(dv);
    if (sv != sp)
        lmk_buffer_free(sv);
    lmk_buffer_free(dp);
    lmk_buffer_free(sp);
    free(src_host);
    free(want);
    free(got);
    free(got2);
}

/* ------------------------------------------------------------------------------------------------
 * the cases
 * ---------------------------------------------------------------------------------------------- */

typedef struct gqa {
    const char *model;
    uint32_t hg, h, k;
} gqa;

/* The Gated DeltaNet shapes of common.h and the Hugging Face GQA shapes (k/v heads -> q heads). */
static int model_shapes(gqa *out)
{
    int n = 0;
    for (int i = 0; i < tst_gqa_shape_count; i++)
        out[n++] = (gqa){tst_gqa_shapes[i].model, tst_gqa_shapes[i].hg, tst_gqa_shapes[i].h, tst_gqa_shapes[i].k};
    out[n++] = (gqa){"llama-3.1-8B k/v", 8, 32, 128};
    out[n++] = (gqa){"qwen3.5-27B full-attention k/v", 4, 24, 256};
    return n;
}

/* k of a packed QKV projection [T, (Hq + 2 Hk) * D] with Hq = h, Hk = hg, D = k. */
static geom packed_k(const gqa *g)
{
    return (geom){true, ((size_t)g->h + 2 * g->hg) * g->k, g->k, (size_t)g->h * g->k, 3};
}

/* dst inside a larger cache-like buffer: rows padded by one head plus 8 elements, heads by 8. */
static geom padded_dst(const gqa *g)
{
    return (geom){true, ((size_t)g->h + 1) * (g->k + 8) + 8, g->k + 8, 8, 64};
}

static void test_model_shapes(tst_dev *d)
{
    gqa shapes[8];
    const int ns = model_shapes(shapes);
    const uint32_t big = tst_quick() || d->isa_variant ? 129 : 4106;
    const uint32_t ts[] = {1, 5, big};
    static const lmk_repeat_layout layouts[] = {LMK_REPEAT_TILED, LMK_REPEAT_BLOCK};
    for (int s = 0; s < ns; s++)
        for (size_t ti = 0; ti < sizeof ts / sizeof ts[0]; ti++)
            for (int l = 0; l < 2; l++) {
                const gqa *g = &shapes[s];
                const lmk_repeat_heads_params p = {ts[ti], g->hg, g->h, g->k, layouts[l]};
                const bool target = g->hg == 16 && g->h == 48; /* the shape the H200 timings use */
                /* dense f32, and strided bf16 (k of packed QKV -> padded dst) */
                run_case(d, &(rh_case){p, LMK_F32, {0}, {0}, g->model}, ts[ti] == 5);
                run_case(d, &(rh_case){p, LMK_BF16, packed_k(g), padded_dst(g), g->model}, false);
                if (target || ts[ti] != big) {
                    run_case(d, &(rh_case){p, LMK_BF16, {0}, {0}, g->model}, false);
                    run_case(d, &(rh_case){p, LMK_F32, packed_k(g), padded_dst(g), g->model}, target);
                }
                if (ts[ti] == 5) {
                    run_case(d, &(rh_case){p, LMK_U8, packed_k(g), {0}, g->model}, false);
                    run_case(d, &(rh_case){p, LMK_I64, {0}, padded_dst(g), g->model}, false);
                }
            }
}

/* Every element size (every dtype), both layouts, dense and strided, at odd sizes and offsets: on
 * CUDA these reach each word width (16, 8, 4, 2, 1 bytes) of both kernels. */
static void test_dtypes(tst_dev *d)
{
    static const lmk_dtype dtypes[] = {LMK_U8, LMK_F8E4M3, LMK_U16, LMK_BF16, LMK_F16,
                                       LMK_F32, LMK_I32, LMK_U32, LMK_I64};
    static const lmk_repeat_heads_params shapes[] = {
        {3, 2, 6, 8, 0}, {5, 4, 12, 7, 0}, {2, 3, 9, 33, 0}, {7, 1, 4, 16, 0}, {4, 5, 5, 3, 0},
    };
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t t = 0; t < sizeof dtypes / sizeof dtypes[0]; t++)
            for (int l = 0; l < 2; l++) {
                lmk_repeat_heads_params p = shapes[s];
                p.layout = l ? LMK_REPEAT_BLOCK : LMK_REPEAT_TILED;
                const gqa g = {"", p.hg, p.h, p.k};
                const geom odd_dst = {true, (size_t)p.h * (p.k + 1) + 3, p.k + 1, 1, 5};
                run_case(d, &(rh_case){p, dtypes[t], {0}, {0}, "dense"}, false);
                run_case(d, &(rh_case){p, dtypes[t], packed_k(&g), padded_dst(&g), "packed k, padded dst"}, false);
                run_case(d, &(rh_case){p, dtypes[t], {0}, odd_dst, "odd strides and offset"}, false);
            }
}

/* Edge shapes and layouts: ones, hg == h and hg == 1 (the layouts agree), head-major operands
 * ([heads, T, k] memory), stride 0 on a source axis (one token or head broadcast), length-1 axes
 * with arbitrary strides. */
static void test_edges(tst_dev *d)
{
    struct {
        lmk_repeat_heads_params p;
        geom src, dst;
        const char *what;
    } cs[] = {
        {{1, 1, 1, 1, 0}, {0}, {0}, "everything 1"},
        {{1, 1, 1, 1, 1}, {true, 7, 3, 2, 1}, {true, 5, 9, 1, 1}, "everything 1, strided (strides of length-1 axes unused)"},
        {{6, 4, 4, 5, 1}, {0}, {0}, "hg == h, block"},
        {{6, 4, 4, 5, 1}, {0}, {true, 40, 10, 0, 4}, "hg == h, block, padded heads"},
        {{3, 1, 8, 127, 1}, {0}, {0}, "hg 1, block, odd k"},
        {{3, 1, 8, 64, 1}, {true, 64, 9999, 0, 1}, {0}, "hg 1: unused src head stride"},
        {{1, 3, 96, 5, 1}, {0}, {0}, "many copies, block"},
        {{17, 1, 1, 64, 0}, {0}, {0}, "h = hg = 1"},
        {{5, 2, 6, 4, 0}, {true, 4, 20, 0, 1}, {true, 4, 20, 0, 1}, "head-major src and dst"},
        {{5, 2, 6, 4, 1}, {true, 4, 20, 0, 1}, {true, 4, 20, 0, 1}, "head-major src and dst, block"},
        {{5, 2, 6, 4, 1}, {true, 0, 4, 0, 1}, {0}, "src token stride 0 (one token broadcast)"},
        {{5, 2, 6, 4, 0}, {true, 8, 0, 0, 1}, {0}, "src head stride 0, tiled"},
        {{5, 2, 6, 4, 1}, {true, 8, 0, 0, 1}, {true, 24, 4, 0, 1}, "src head stride 0, block"},
        {{1, 16, 48, 128, 1}, {true, 384, 128, 8, 8}, {true, 7, 130, 2, 3}, "decode, dst token stride unused"},
        {{9, 3, 12, 128, 0}, {0}, {true, 12 * 128 + 4, 128, 4, 4}, "dst rows 16-byte aligned in f32 only"},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        for (int t = 0; t < 3; t++) {
            static const lmk_dtype ts[] = {LMK_F32, LMK_U8, LMK_BF16};
            run_case(d, &(rh_case){cs[i].p, ts[t], cs[i].src, cs[i].dst, cs[i].what}, i == 8);
        }
}

/* lmk_repeat_tiled (the 0.1 entry point) and lmk_repeat_heads(TILED) give the same bits, guard
 * bytes included. */
static void test_tiled_equivalence(tst_dev *d)
{
    static const lmk_repeat_tiled_params shapes[] = {
        {1, 16, 48, 128}, {5, 16, 32, 128}, {33, 4, 24, 256}, {3, 2, 6, 7}, {2, 5, 5, 1}, {4, 1, 3, 9},
    };
    static const lmk_dtype dtypes[] = {LMK_U8, LMK_BF16, LMK_F32, LMK_I64};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t t = 0; t < sizeof dtypes / sizeof dtypes[0]; t++) {
            const lmk_repeat_tiled_params *p = &shapes[s];
            const lmk_repeat_heads_params hp = {p->seq, p->hg, p->h, p->k, LMK_REPEAT_TILED};
            const size_t es = lmk_dtype_size(dtypes[t]);
            const size_t sn = (size_t)p->seq * p->hg * p->k, dn = (size_t)p->seq * p->h * p->k;
            tst_rng r = tst_rng_make(tst_case_seed());
            unsigned char *src = malloc(sn * es), *a = NULL, *b = NULL;
            lmk_buffer *bs = NULL, *ba = NULL, *bb = NULL;
            if (src) {
                fill_src(&r, src, sn, es);
                bs = tst_buf(d->dev, dtypes[t], NULL, 0, sn * es, 0, src, sn * es, -1);
                ba = tst_buf(d->dev, dtypes[t], NULL, 0, dn * es, 0, NULL, 0, TST_POISON);
                bb = tst_buf(d->dev, dtypes[t], NULL, 0, dn * es, 0, NULL, 0, TST_POISON);
            }
            lmk_status st = bs && ba && bb ? lmk_repeat_tiled(d->stream, bs, ba, p) : LMK_ERR_OUT_OF_MEMORY;
            if (st == LMK_OK)
                st = lmk_repeat_heads(d->stream, bs, bb, &hp);
            if (st == LMK_OK)
                st = lmk_stream_sync(d->stream);
            if (st == LMK_OK) {
                a = tst_read_all(ba);
                b = tst_read_all(bb);
            }
            CHECK(a && b && memcmp(a, b, dn * es) == 0 && tst_count_unwritten(a, dn, es, TST_POISON) == 0,
                  "[%s] repeat_tiled vs repeat_heads(TILED) T=%u hg=%u h=%u k=%u %s: %s \"%s\"%s", d->name, p->seq,
                  p->hg, p->h, p->k, lmk_dtype_name(dtypes[t]), lmk_status_name(st), lmk_last_error(),
                  a && b ? " (outputs differ or are unwritten)" : "");
            free(src);
            free(a);
            free(b);
            lmk_buffer_free(bs);
            lmk_buffer_free(ba);
            lmk_buffer_free(bb);
        }
}

/* ------------------------------------------------------------------------------------------------
 * validation
 * ---------------------------------------------------------------------------------------------- */

/* Buffers whose bytes a rejected call must leave as they were. */
typedef struct watch {
    lmk_buffer *b[4];
    unsigned char *before[4];
} watch;

static void watch_start(watch *w, lmk_buffer *b0, lmk_buffer *b1, lmk_buffer *b2, lmk_buffer *b3)
{
    lmk_buffer *const bs[4] = {b0, b1, b2, b3};
    for (int i = 0; i < 4; i++) {
        w->b[i] = bs[i];
        w->before[i] = bs[i] ? tst_read_all(bs[i]) : NULL;
    }
}

/* Whether every watched buffer still holds its bytes; frees the snapshots. */
static bool watch_unchanged(watch *w)
{
    bool ok = true;
    for (int i = 0; i < 4; i++) {
        if (!w->b[i])
            continue;
        unsigned char *now = tst_read_all(w->b[i]);
        ok = ok && now && w->before[i] && memcmp(now, w->before[i], lmk_buffer_byte_len(w->b[i])) == 0;
        free(now);
        free(w->before[i]);
        w->before[i] = NULL;
    }
    return ok;
}

/* Calls lmk_repeat_heads and checks INVALID_ARGUMENT, a message holding "repeat_heads: " and every
 * needle, and that no byte of the watched parents changed. */
static void expect_reject(tst_dev *d, const char *what, const lmk_buffer *src, lmk_buffer *dst,
                          const lmk_repeat_heads_params *p, watch *w, const char *n1, const char *n2, const char *n3)
{
    lmk_clear_error();
    const lmk_status st = lmk_repeat_heads(d->stream, src, dst, p);
    lmk_stream_sync(d->stream);
    const bool unchanged = watch_unchanged(w);
    CHECK(st == LMK_ERR_INVALID_ARGUMENT && tst_msg_has("repeat_heads: ", n1, n2, n3, NULL) && unchanged,
          "[%s] %s: %s \"%s\" (want INVALID_ARGUMENT naming \"%s\" \"%s\" \"%s\")%s", d->name, what,
          lmk_status_name(st), lmk_last_error(), n1 ? n1 : "", n2 ? n2 : "", n3 ? n3 : "",
          unchanged ? "" : "; a buffer was written");
}

static lmk_buffer *filled(tst_dev *d, lmk_dtype t, size_t n_el, int byte)
{
    return tst_buf(d->dev, t, NULL, 0, n_el * lmk_dtype_size(t), 0, NULL, 0, byte);
}

static lmk_buffer *strided(lmk_buffer *parent, size_t off_el, lmk_dtype t, size_t n0, size_t n1, size_t n2,
                           size_t s0, size_t s1, size_t s2)
{
    const size_t shape[3] = {n0, n1, n2}, strides[3] = {s0, s1, s2};
    lmk_buffer *v = NULL;
    const lmk_status st =
        parent ? lmk_buffer_view_strided(parent, off_el * lmk_dtype_size(t), t, shape, strides, 3, &v) : LMK_OK;
    TST_REQUIRE(v || !parent, "a strided test view: %s \"%s\"", lmk_status_name(st), lmk_last_error());
    return v;
}

/* lmk.h's order: start from a call that breaks every rule and mend one at a time; each step must
 * report the first rule still broken. src [3, 2, 5] -> dst [3, 4, 5] f32. */
static void test_rule_order(tst_dev *d, lmk_device *other)
{
    lmk_buffer *src29 = filled(d, LMK_F32, 29, 0x11), *src30 = filled(d, LMK_F32, 30, 0x11);
    lmk_buffer *dst_u16_59 = filled(d, LMK_U16, 59, TST_POISON), *dst_u16 = filled(d, LMK_U16, 60, TST_POISON);
    lmk_buffer *dst_other = tst_buf(other, LMK_F32, NULL, 0, 240, 0, NULL, 0, TST_POISON);
    lmk_buffer *shared = filled(d, LMK_F32, 100, TST_POISON), *dst60 = filled(d, LMK_F32, 60, TST_POISON);
    lmk_buffer *sh_src = strided(shared, 0, LMK_F32, 3, 2, 5, 10, 5, 1);
    lmk_buffer *sh_dst = strided(shared, 25, LMK_F32, 3, 4, 5, 20, 5, 1);
    lmk_buffer *self_dst = strided(dst60, 0, LMK_F32, 3, 4, 5, 20, 0, 1);
    watch w;
    if (!src29 || !src30 || !dst_u16_59 || !dst_u16 || !dst_other || !sh_src || !sh_dst || !self_dst)
        goto done;
    lmk_repeat_heads_params p = {.seq = 0, .hg = 2, .h = 5, .k = 5, .layout = (lmk_repeat_layout)2};
    watch_start(&w, src29, dst_u16_59, NULL, NULL);
    expect_reject(d, "zero seq, and every later rule broken", src29, dst_u16_59, &p, &w, "must all be > 0",
                  "seq (0), hg (2), h (5), k (5)", NULL);
    p.seq = 3;
    watch_start(&w, src29, dst_u16_59, NULL, NULL);
    expect_reject(d, "h % hg, and later rules", src29, dst_u16_59, &p, &w, "h (5) must be a multiple of hg (2)",
                  NULL, NULL);
    p.h = 4;
    watch_start(&w, src29, dst_u16_59, NULL, NULL);
    expect_reject(d, "unknown layout 2, and later rules", src29, dst_u16_59, &p, &w, "unknown layout 2", NULL, NULL);
    p.layout = LMK_REPEAT_BLOCK;
    watch_start(&w, src29, dst_u16_59, NULL, NULL);
    expect_reject(d, "src of 29 elements, and later rules", src29, dst_u16_59, &p, &w, "src element count 29",
                  "[3, 2, 5]", "shape [29]");
    watch_start(&w, src30, dst_u16_59, NULL, NULL);
    expect_reject(d, "dst of 59 elements, and later rules", src30, dst_u16_59, &p, &w, "dst element count 59",
                  "[3, 4, 5]", "shape [59]");
    watch_start(&w, src30, dst_u16, NULL, NULL);
    expect_reject(d, "dtype mismatch, and later rules", src30, dst_u16, &p, &w, "dtype mismatch", "f32 vs u16", NULL);
    watch_start(&w, src30, dst_other, NULL, NULL);
    expect_reject(d, "dst of another device", src30, dst_other, &p, &w, "device", NULL, NULL);
    watch_start(&w, shared, NULL, NULL, NULL);
    expect_reject(d, "dst view overlapping the src view", sh_src, sh_dst, &p, &w, "dst overlaps src", NULL, NULL);
    watch_start(&w, src30, dst60, NULL, NULL);
    expect_reject(d, "dst head stride 0", src30, self_dst, &p, &w, "dst has overlapping elements",
                  "strides [20, 0, 1]", NULL);
    const lmk_status st = lmk_repeat_heads(d->stream, src30, dst60, &p);
    CHECK(st == LMK_OK && lmk_stream_sync(d->stream) == LMK_OK, "[%s] the mended call: %s \"%s\"", d->name,
          lmk_status_name(st), lmk_last_error());
done:
    lmk_buffer_free(sh_src);
    lmk_buffer_free(sh_dst);
    lmk_buffer_free(self_dst);
    lmk_buffer_free(shared);
    lmk_buffer_free(src29);
    lmk_buffer_free(src30);
    lmk_buffer_free(dst_u16_59);
    lmk_buffer_free(dst_u16);
    lmk_buffer_free(dst_other);
    lmk_buffer_free(dst60);
}

/* Each rule on its own, with the value in the message. */
static void test_rules(tst_dev *d)
{
    lmk_buffer *src = filled(d, LMK_F32, 30, 0x11), *dst = filled(d, LMK_F32, 60, TST_POISON);
    lmk_buffer *par = filled(d, LMK_F32, 200, 0x22);
    lmk_buffer *k4 = strided(par, 0, LMK_F32, 3, 2, 4, 40, 20, 1), *s2 = strided(par, 0, LMK_F32, 3, 2, 5, 40, 10, 2);
    lmk_buffer *dst_k4 = strided(par, 0, LMK_F32, 3, 4, 4, 40, 8, 1), *flat = NULL;
    const size_t flat_shape[2] = {3, 10}, flat_strides[2] = {12, 1};
    watch w;
    if (!src || !dst || !k4 || !s2 || !dst_k4 ||
        !TST_REQUIRE(lmk_buffer_view_strided(par, 0, LMK_F32, flat_shape, flat_strides, 2, &flat) == LMK_OK,
                     "2-D view: %s", lmk_last_error()))
        goto done;
    const lmk_repeat_heads_params p = {3, 2, 4, 5, LMK_REPEAT_TILED};
    static const char *const null_names[4] = {"stream must not be NULL", "src must not be NULL",
                                              "dst must not be NULL", "params must not be NULL"};
    for (int i = 0; i < 4; i++) {
        /* NULL the i-th argument; the later ones are broken too (zero seq) and must not be reported. */
        const lmk_repeat_heads_params bad = {0, 2, 5, 5, (lmk_repeat_layout)2};
        watch_start(&w, src, dst, NULL, NULL);
        lmk_clear_error();
        const lmk_status st = lmk_repeat_heads(i == 0 ? NULL : d->stream, i == 1 ? NULL : src, i == 2 ? NULL : dst,
                                               i == 3 ? NULL : &bad);
        const bool unchanged = watch_unchanged(&w);
        CHECK(st == LMK_ERR_INVALID_ARGUMENT && tst_msg_has("repeat_heads: ", null_names[i], NULL) && unchanged,
              "[%s] NULL argument %d: %s \"%s\" (want \"%s\")%s", d->name, i, lmk_status_name(st), lmk_last_error(),
              null_names[i], unchanged ? "" : "; a buffer was written");
    }
    const lmk_repeat_heads_params zeros[] = {{0, 2, 4, 5, 0}, {3, 0, 4, 5, 0}, {3, 2, 0, 5, 0}, {3, 2, 4, 0, 0}};
    for (size_t i = 0; i < sizeof zeros / sizeof zeros[0]; i++) {
        char vals[96];
        snprintf(vals, sizeof vals, "seq (%u), hg (%u), h (%u), k (%u)", zeros[i].seq, zeros[i].hg, zeros[i].h,
                 zeros[i].k);
        watch_start(&w, src, dst, NULL, NULL);
        expect_reject(d, "a zero dim", src, dst, &zeros[i], &w, "must all be > 0", vals, NULL);
    }
    const lmk_repeat_heads_params notmul[] = {{3, 2, 5, 5, 0}, {3, 4, 6, 5, 1}, {3, 8, 4, 5, 0}};
    for (size_t i = 0; i < sizeof notmul / sizeof notmul[0]; i++) {
        char want[96];
        snprintf(want, sizeof want, "h (%u) must be a multiple of hg (%u)", notmul[i].h, notmul[i].hg);
        watch_start(&w, src, dst, NULL, NULL);
        expect_reject(d, "h not a multiple of hg", src, dst, &notmul[i], &w, want, NULL, NULL);
    }
    static const int bad_layouts[] = {2, -1, 100};
    for (size_t i = 0; i < sizeof bad_layouts / sizeof bad_layouts[0]; i++) {
        char want[48];
        snprintf(want, sizeof want, "unknown layout %d", bad_layouts[i]);
        lmk_repeat_heads_params q = p;
        q.layout = (lmk_repeat_layout)bad_layouts[i];
        watch_start(&w, src, dst, NULL, NULL);
        expect_reject(d, "unknown layout", src, dst, &q, &w, want, NULL, NULL);
    }
    /* Wrong shapes of strided operands name the operand, its shape and its strides. */
    watch_start(&w, par, dst, NULL, NULL);
    expect_reject(d, "src view [3, 2, 4]", k4, dst, &p, &w, "src has shape [3, 2, 4]", "strides [40, 20, 1]", NULL);
    watch_start(&w, par, dst, NULL, NULL);
    expect_reject(d, "src view with last stride 2", s2, dst, &p, &w, "src has shape [3, 2, 5]", "strides [40, 10, 2]",
                  NULL);
    watch_start(&w, par, dst, NULL, NULL);
    expect_reject(d, "src 2-D view", flat, dst, &p, &w, "src has shape [3, 10]", "strides [12, 1]", NULL);
    watch_start(&w, par, src, NULL, NULL);
    expect_reject(d, "dst view [3, 4, 4]", src, dst_k4, &p, &w, "dst has shape [3, 4, 4]", "strides [40, 8, 1]", NULL);
done:
    lmk_buffer_free(flat);
    lmk_buffer_free(k4);
    lmk_buffer_free(s2);
    lmk_buffer_free(dst_k4);
    lmk_buffer_free(par);
    lmk_buffer_free(src);
    lmk_buffer_free(dst);
}

/* src and dst views of one parent: accepted (and correct) when their elements are disjoint, even
 * with interleaved extents; rejected, writing nothing, when they share one element or when dst's
 * own elements overlap. src [T, hg, k], dst [T, h, k] with element strides, in a u8 parent of
 * `n_el` elements of dtype t. */
static void shared_case(tst_dev *d, const char *what, const lmk_repeat_heads_params *p, lmk_dtype t, size_t n_el,
                        const geom *sg, const geom *dg, const char *reject_needle)
{
    const size_t es = lmk_dtype_size(t), bytes = n_el * es;
    tst_rng r = tst_rng_make(tst_case_seed());
    unsigned char *host = malloc(bytes), *got = NULL;
    lmk_buffer *par = NULL, *sv = NULL, *dv = NULL;
    if (!TST_REQUIRE(host, "out of host memory"))
        return;
    fill_src(&r, host, n_el, es);
    par = tst_buf(d->dev, LMK_U8, NULL, 0, bytes, 0, host, bytes, -1);
    sv = strided(par, sg->off, t, p->seq, p->hg, p->k, sg->tok, sg->head, 1);
    dv = strided(par, dg->off, t, p->seq, p->h, p->k, dg->tok, dg->head, 1);
    if (sv && dv) {
        lmk_clear_error();
        lmk_status st = lmk_repeat_heads(d->stream, sv, dv, p);
        if (st == LMK_OK)
            st = lmk_stream_sync(d->stream);
        got = tst_read_all(par);
        if (reject_needle == NULL) {
            const lmk_repeat_args a = {
                .src = host + sg->off * es, .dst = host + dg->off * es, .seq = p->seq, .hg = p->hg, .h = p->h,
                .k = p->k, .elem_size = es, .src_tok = sg->tok, .src_head = sg->head, .dst_tok = dg->tok,
                .dst_head = dg->head, .layout = p->layout};
            lmk_ref_repeat(&a); /* in place on the host copy: the elements are disjoint */
            CHECK(st == LMK_OK && got && memcmp(got, host, bytes) == 0, "[%s] %s: %s \"%s\"%s", d->name, what,
                  lmk_status_name(st), lmk_last_error(), st == LMK_OK ? " (result differs from the reference)" : "");
        } else {
            CHECK(st == LMK_ERR_INVALID_ARGUMENT && tst_msg_has("repeat_heads: ", reject_needle, NULL) && got &&
                      memcmp(got, host, bytes) == 0,
                  "[%s] %s: %s \"%s\" (want INVALID_ARGUMENT with \"%s\" and nothing written)", d->name, what,
                  lmk_status_name(st), lmk_last_error(), reject_needle);
        }
    }
    lmk_buffer_free(sv);
    lmk_buffer_free(dv);
    lmk_buffer_free(par);
    free(host);
    free(got);
}

static void test_overlaps(tst_dev *d)
{
    /* One row of a packed buffer holds [src heads | dst heads]: T=7, hg=2, h=6, k=16 (f32). */
    const lmk_repeat_heads_params p = {7, 2, 6, 16, LMK_REPEAT_BLOCK}, pt = {7, 2, 6, 16, LMK_REPEAT_TILED};
    const size_t row = (2 + 6) * 16, n = 7 * row;
    const geom src = {true, row, 16, 0, 0}, dst = {true, row, 16, 2 * 16, 0};
    shared_case(d, "src and dst side by side in packed rows (block)", &p, LMK_F32, n, &src, &dst, NULL);
    shared_case(d, "src and dst side by side in packed rows (tiled, bf16)", &pt, LMK_BF16, n, &src, &dst, NULL);
    const geom dst_one = {true, row, 16, 2 * 16 - 1, 0}; /* shares src's last element of each token */
    shared_case(d, "dst sharing one element per token with src", &p, LMK_F32, n + 1, &src, &dst_one,
                "dst overlaps src");
    const geom dst_gaps = {true, row, 32, 16, 0}; /* heads interleaved with src's */
    const lmk_repeat_heads_params p3 = {7, 2, 4, 16, LMK_REPEAT_TILED};
    const geom src_il = {true, row, 32, 0, 0};
    shared_case(d, "src and dst heads interleaved, disjoint", &p3, LMK_F32, n, &src_il, &dst_gaps, NULL);
    const geom dst_rows_overlap = {true, 16, 16, 32, 0}; /* token stride < row: rows written twice */
    shared_case(d, "dst token stride 16 < 6 heads x 16", &p, LMK_F32, n + 200, &src, &dst_rows_overlap,
                "dst has overlapping elements");
    const lmk_repeat_heads_params same = {7, 2, 2, 16, LMK_REPEAT_TILED};
    shared_case(d, "dst == src (hg == h)", &same, LMK_F32, n, &src, &src, "dst overlaps src");
}

/* More than 2^32 elements through the strided kernel (64-bit offsets), checked at sampled rows:
 * only where it is cheap (a GPU with memory to spare), never on the CPU. u8, block layout, dst rows
 * padded by 3 bytes (the padding must stay as allocated: zero). */
static void test_huge(tst_dev *d)
{
    if (d->backend != LMK_BACKEND_CUDA || tst_quick()) {
        SKIP("repeat_heads T*H*K > 2^32 on %s: %s", d->name,
             d->backend != LMK_BACKEND_CUDA ? "too slow and too large for the CPU run" : "LMK_TEST_QUICK");
        return;
    }
    const lmk_repeat_heads_params p = {32768, 16, 64, 2049, LMK_REPEAT_BLOCK};
    const size_t tok = (size_t)p.h * p.k + 3, src_n = (size_t)p.seq * p.hg * p.k, dst_bytes = p.seq * tok + TST_GUARD;
    const uint64_t seed = tst_case_seed();
    tst_rng r = tst_rng_make(seed);
    unsigned char *src = malloc(src_n), *row = malloc(tok);
    lmk_buffer *bs = NULL, *par = NULL, *view = NULL;
    if (!src || !row) {
        SKIP("repeat_heads T*H*K > 2^32: no host memory");
        goto done;
    }
    tst_fill_bytes(&r, src, src_n);
    bs = tst_buf(d->dev, LMK_U8, NULL, 0, src_n, 0, src, src_n, -1);
    if (bs && lmk_buffer_alloc(d->dev, dst_bytes, LMK_U8, NULL, 0, &par) != LMK_OK) {
        SKIP("repeat_heads T*H*K > 2^32: no device memory (%s)", lmk_last_error());
        goto done;
    }
    const size_t shape[3] = {p.seq, p.h, p.k}, strides[3] = {tok, p.k, 1};
    lmk_status st = bs ? lmk_buffer_view_strided(par, 0, LMK_U8, shape, strides, 3, &view) : LMK_ERR_OUT_OF_MEMORY;
    if (st == LMK_OK)
        st = lmk_repeat_heads(d->stream, bs, view, &p);
    if (st == LMK_OK)
        st = lmk_stream_sync(d->stream);
    /* Rows: the first, the last, the last rows of the tokens holding bytes 2^31 and 2^32, rows of
     * the last 16 tokens (past byte 2^32), random ones; a token's last row is read with its 3
     * padding bytes. */
    size_t bad = 0, first_bad = 0;
    for (int s = 0; s < 40 && st == LMK_OK; s++) {
        const size_t n_rows = (size_t)p.seq * p.h;
        size_t rw = s == 0 ? 0 : s == 1 ? n_rows - 1 : s < 4 ? (((size_t)1 << (29 + s)) / tok) * p.h + p.h - 1
                                                               : tst_rng_u64(&r) % n_rows;
        if (s >= 4 && s < 12) /* the last 16 tokens: the bytes past 2^32 */
            rw = n_rows - 1 - tst_rng_u64(&r) % (16u * p.h);
        const size_t t = rw / p.h, i = rw % p.h, g = i / (p.h / p.hg), len = i == p.h - 1u ? p.k + 3u : p.k;
        if (lmk_buffer_read(par, t * tok + i * p.k, row, len) != LMK_OK) {
            st = LMK_ERR_DEVICE;
            break;
        }
        const bool ok = memcmp(row, src + (t * p.hg + g) * p.k, p.k) == 0 &&
                        (len == p.k || tst_find_not(row, p.k, len, 0) < 0);
        if (!ok && !bad++)
            first_bad = rw;
    }
    unsigned char guard[TST_GUARD];
    const bool guard_ok = st == LMK_OK && lmk_buffer_read(par, p.seq * tok, guard, TST_GUARD) == LMK_OK &&
                          tst_find_not(guard, 0, TST_GUARD, 0) < 0;
    CHECK(st == LMK_OK && bad == 0 && guard_ok,
          "repeat_heads block T=%u hg=%u h=%u k=%u u8, dst token stride %zu (%zu bytes) [%s] seed 0x%016" PRIx64
          ": %s \"%s\"; %zu sampled rows wrong, first row %zu; guard %s",
          p.seq, p.hg, p.h, p.k, tok, dst_bytes, d->name, seed, lmk_status_name(st), lmk_last_error(), bad, first_bad,
          guard_ok ? "ok" : "touched");
done:
    lmk_buffer_free(view);
    lmk_buffer_free(par);
    lmk_buffer_free(bs);
    free(src);
    free(row);
}

int main(void)
{
    tst_program_seed();
    const double t0 = tst_now();
    tst_dev devs[TST_MAX_DEVS];
    const int n = tst_devs_open_isas(devs);
    for (int i = 0; i < n; i++) {
        const int failed = harness_failed;
        test_model_shapes(&devs[i]);
        test_dtypes(&devs[i]);
        test_edges(&devs[i]);
        test_tiled_equivalence(&devs[i]);
        test_rules(&devs[i]);
        test_overlaps(&devs[i]);
        test_huge(&devs[i]);
        lmk_device *other = NULL;
        if (TST_REQUIRE(lmk_device_open(devs[i].backend, 0, &other) == LMK_OK, "[%s] a second device handle: %s",
                        devs[i].name, lmk_last_error()))
            test_rule_order(&devs[i], other);
        lmk_device_close(other);
        printf("[%s] %s: %s\n", devs[i].name, lmk_device_name(devs[i].dev),
               harness_failed == failed ? "all cases pass" : "FAILURES above");
    }
    tst_devs_close(devs, n);
    printf("test_repeat_heads: %.2f s\n", tst_now() - t0);
    return harness_summary();
}
