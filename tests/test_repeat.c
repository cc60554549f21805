/*
 * test_repeat.c - repeat_tiled (tiled GQA head broadcast) on every backend against the reference.
 *
 *     src [T, Hg, K] -> dst [T, H, K],   dst[t, h, k] = src[t, h % Hg, k]
 *
 * A pure copy, so every comparison is bit for bit: the fast path of each backend against
 * lmk_ref_repeat on fresh random bytes (NaN payloads and all), over the Gated DeltaNet shapes
 * of the Qwen3.5/3.6 models, edge shapes and every element size. Outputs are poisoned and followed
 * by guard bytes, often inside larger (pooled) buffers or views at unaligned offsets. Then every
 * validation rule of lmk.h (repeat_tiled), in its order, with the message it must give, and with no
 * output byte changed by a rejected call; strided views, whose strides are honoured (gaps between
 * their rows keep their bytes).
 */
#include "common.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

HARNESS_DEFINE;

static const lmk_dtype k_all_dtypes[] = {LMK_U8, LMK_U16, LMK_BF16, LMK_F16, LMK_F32, LMK_I32, LMK_U32};

/* Random source elements, none of which is all poison bytes (so an unwritten output element can
 * never pass for a written one). */
static void fill_src(tst_rng *r, unsigned char *p, size_t n, size_t es)
{
    tst_fill_bytes(r, p, n * es);
    for (size_t i = 0; i < n; i++)
        if (tst_count_unwritten(p + i * es, 1, es, TST_POISON))
            p[i * es] ^= 0x5A;
}

typedef struct rep_case {
    lmk_repeat_tiled_params p;
    lmk_dtype dtype;
    size_t src_extra;  /* bytes past the source's used range (pooled) */
    size_t dst_off;    /* the output is a view at this byte offset of a larger parent */
    const char *comment;
    bool print;        /* one line per case (the model shapes) */
    bool twice;        /* run a second time into a second output: bit-identical (determinism) */
} rep_case;

/* Runs one case on one device; two CHECKs: the output's used range, and everything around it. */
static void run_case(tst_dev *d, const rep_case *c)
{
    const lmk_repeat_tiled_params *p = &c->p;
    const size_t es = lmk_dtype_size(c->dtype);
    const size_t src_n = (size_t)p->seq * p->hg * p->k, dst_n = (size_t)p->seq * p->h * p->k;
    const size_t used = dst_n * es, total = c->dst_off + used + TST_GUARD;
    const uint64_t seed = tst_case_seed();
    tst_rng r = tst_rng_make(seed);
    char name[256];
    tst_repeat_name(name, sizeof name, p, c->dtype, c->comment);
    const double t0 = tst_now();

    unsigned char *src = malloc(src_n * es + c->src_extra), *want = malloc(total);
    lmk_buffer *bs = NULL, *parent = NULL, *view = NULL, *parent2 = NULL;
    unsigned char *got = NULL, *got2 = NULL;
    if (!src || !want) {
        TST_FAIL("%s: out of host memory", name);
        goto done;
    }
    fill_src(&r, src, src_n, es);
    tst_fill_bytes(&r, src + src_n * es, c->src_extra);
    bs = tst_buf(d->dev, c->dtype, NULL, 0, src_n * es, c->src_extra, src, src_n * es + c->src_extra, -1);
    parent = tst_buf(d->dev, c->dtype, NULL, 0, total, 0, NULL, 0, TST_POISON);
    if (!bs || !parent)
        goto done;
    lmk_buffer *dst = parent;
    if (c->dst_off) {
        const lmk_status st = lmk_buffer_view(parent, c->dst_off, c->dtype, NULL, 0, &view);
        if (!CHECK(st == LMK_OK, "%s: view at %zu: %s", name, c->dst_off, lmk_last_error()))
            goto done;
        dst = view;
    }

    lmk_status st = lmk_repeat_tiled(d->stream, bs, dst, p);
    if (st == LMK_OK)
        st = lmk_stream_sync(d->stream);
    if (!CHECK(st == LMK_OK, "%s [%s]: %s \"%s\"", name, d->name, lmk_status_name(st), lmk_last_error()))
        goto done;
    got = tst_read_all(parent);
    if (!got)
        goto done;

    tst_poison(want, total, TST_POISON);
    const lmk_repeat_args a = tst_repeat_host_args(src, want + c->dst_off, p->seq, p->hg, p->h, p->k, es);
    lmk_ref_repeat(&a);

    const long long diff = tst_bits_diff(got + c->dst_off, want + c->dst_off, used);
    if (diff >= 0) {
        const size_t e = (size_t)diff / es;
        TST_FAIL("%s [%s] seed 0x%016" PRIx64 ": output differs from the reference at element %zu (t=%zu h=%zu "
                      "k=%zu); %zu of %zu elements never written",
              name, d->name, seed, e, e / ((size_t)p->h * p->k), e / p->k % p->h, e % p->k,
              tst_count_unwritten(got + c->dst_off, dst_n, es, TST_POISON), dst_n);
    } else {
        TST_PASS(name);
    }
    const long long before = tst_find_not(got, 0, c->dst_off, TST_POISON);
    const long long after = tst_find_not(got, c->dst_off + used, total, TST_POISON);
    CHECK(before < 0 && after < 0, "%s [%s]: bytes outside the output changed (before: %lld, guard: %lld)", name,
          d->name, before, after >= 0 ? after - (long long)(c->dst_off + used) : -1);

    if (c->twice) {
        parent2 = tst_buf(d->dev, c->dtype, NULL, 0, total, 0, NULL, 0, TST_POISON);
        lmk_buffer *dst2 = parent2, *view2 = NULL;
        if (parent2 && c->dst_off && lmk_buffer_view(parent2, c->dst_off, c->dtype, NULL, 0, &view2) == LMK_OK)
            dst2 = view2;
        st = parent2 ? lmk_repeat_tiled(d->stream, bs, dst2, p) : LMK_ERR_OUT_OF_MEMORY;
        if (st == LMK_OK)
            st = lmk_stream_sync(d->stream);
        got2 = st == LMK_OK ? tst_read_all(parent2) : NULL;
        CHECK(got2 && memcmp(got, got2, total) == 0, "%s [%s]: a second run is not bit-identical (%s)", name,
              d->name, lmk_status_name(st));
        lmk_buffer_free(view2);
    }
    if (c->print)
        printf("  %-100s [%s] %s (%.2f s)\n", name, d->name, diff < 0 && before < 0 && after < 0 ? "OK" : "FAIL",
               tst_now() - t0);

done:
    lmk_buffer_free(view);
    lmk_buffer_free(parent);
    lmk_buffer_free(parent2);
    lmk_buffer_free(bs);
    free(src);
    free(want);
    free(got);
    free(got2);
}

static void test_model_shapes(tst_dev *d)
{
    /* The prompt length of the seed's benchmark; the ISA variants of the CPU share the copy code
     * and need not move the 134 MB again. */
    const uint32_t big_t = tst_quick() || d->isa_variant ? 129 : 4106;
    const uint32_t ts[] = {1, 7, big_t};
    for (int s = 0; s < tst_gqa_shape_count; s++)
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
            const tst_gqa_shape *g = &tst_gqa_shapes[s];
            const rep_case c = {.p = {.seq = ts[i], .hg = g->hg, .h = g->h, .k = g->k}, .dtype = LMK_F32,
                                .comment = g->model, .print = true, .twice = ts[i] != big_t || s == 0};
            run_case(d, &c);
        }
    /* The same shapes in bf16 (a 2-byte element size), decode and a short prompt. */
    for (int s = 0; s < tst_gqa_shape_count; s++) {
        const tst_gqa_shape *g = &tst_gqa_shapes[s];
        const rep_case c = {.p = {.seq = 33, .hg = g->hg, .h = g->h, .k = g->k}, .dtype = LMK_BF16,
                            .comment = g->model, .print = true};
        run_case(d, &c);
    }
}

static void test_edge_shapes(tst_dev *d)
{
    static const lmk_repeat_tiled_params shapes[] = {
        {1, 1, 1, 1},     /* everything 1 */
        {1, 1, 7, 1},     /* K = 1, one source head */
        {5, 4, 4, 3},     /* hg == h: a plain copy */
        {2, 1, 8, 127},   /* hg 1, odd K */
        {3, 3, 9, 1},     /* K = 1 */
        {4, 2, 6, 3},     /* K = 3 */
        {1, 16, 32, 128}, /* one token of a real shape */
        {3, 5, 15, 33},
        {2, 7, 14, 127},
        {6, 2, 4, 129},
        {1, 3, 96, 5},    /* many repeats */
        {17, 1, 1, 64},   /* h = hg = 1 */
    };
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t t = 0; t < sizeof k_all_dtypes / sizeof k_all_dtypes[0]; t++) {
            const size_t es = lmk_dtype_size(k_all_dtypes[t]);
            /* Alternate plain outputs with views at an unaligned (but element-aligned) offset and
             * sources with pooled tails. */
            const rep_case c = {.p = shapes[s], .dtype = k_all_dtypes[t], .src_extra = (s % 2) ? 3 * es + 8 : 0,
                                .dst_off = (s + t) % 3 == 1 ? es * 3 : (s + t) % 3 == 2 ? es * 5 : 0,
                                .twice = s == 6};
            run_case(d, &c);
        }
}

/* ---- validation ---- */

/* Calls repeat_tiled and checks the status, that the message names the op and holds every needle,
 * and that no byte of the (poisoned) output changed. */
static void expect_reject(tst_dev *d, const char *what, const lmk_buffer *src, lmk_buffer *dst,
                          const lmk_repeat_tiled_params *p, const char *n1, const char *n2)
{
    lmk_clear_error();
    const lmk_status st = lmk_repeat_tiled(d->stream, src, dst, p);
    lmk_stream_sync(d->stream);
    bool unchanged = true;
    if (dst) {
        unsigned char *got = tst_read_all(dst);
        unchanged = got && tst_find_not(got, 0, lmk_buffer_byte_len(dst), TST_POISON) < 0;
        free(got);
    }
    CHECK(st == LMK_ERR_INVALID_ARGUMENT && tst_msg_has("repeat_tiled", n1, n2, NULL) && unchanged,
          "[%s] %s: %s \"%s\" (want INVALID_ARGUMENT with \"%s\"%s%s%s)%s", d->name, what, lmk_status_name(st),
          lmk_last_error(), n1 ? n1 : "", n2 ? ", \"" : "", n2 ? n2 : "", n2 ? "\"" : "",
          unchanged ? "" : "; the output was written");
}

static lmk_buffer *poisoned(tst_dev *d, lmk_dtype t, size_t bytes)
{
    return tst_buf(d->dev, t, NULL, 0, bytes, 0, NULL, 0, TST_POISON);
}

static void test_validation(tst_dev *d)
{
    /* Every rule, in lmk.h's order: start from a call that breaks all of them and mend one rule at
     * a time; each step must report the first rule still broken. */
    lmk_buffer *src116 = poisoned(d, LMK_F32, 116), *src120 = poisoned(d, LMK_F32, 120);
    lmk_buffer *dst_u16 = poisoned(d, LMK_U16, 236), *dst236 = poisoned(d, LMK_F32, 236);
    lmk_buffer *dst240 = poisoned(d, LMK_F32, 240);
    if (!src116 || !src120 || !dst_u16 || !dst236 || !dst240)
        goto done;
    lmk_repeat_tiled_params p = {.seq = 0, .hg = 2, .h = 5, .k = 0xFFFFFFFFu};
    expect_reject(d, "rule 1 (seq 0), all later rules broken too", src116, dst_u16, &p, "must all be > 0", NULL);
    p.seq = 0xFFFFFFFFu;
    expect_reject(d, "rule 2 (h 5, hg 2), later rules broken too", src116, dst_u16, &p,
                  "h (5) must be a multiple of hg (2)", NULL);
    p.h = 4;
    expect_reject(d, "rule 3 (seq*hg*k overflows), later rules broken too", src116, dst_u16, &p, "overflow", NULL);
    p.seq = 3;
    p.k = 5;
    expect_reject(d, "dtype mismatch f32 vs u16, src and dst too small", src116, dst_u16, &p, "f32", "u16");
    expect_reject(d, "rule 4 (src too small), dst too small too", src116, dst236, &p,
                  "src buffer too small: need 120 bytes, have 116", NULL);
    expect_reject(d, "rule 4 (dst too small)", src120, dst236, &p, "dst buffer too small: need 240 bytes, have 236",
                  NULL);
    lmk_status st = lmk_repeat_tiled(d->stream, src120, dst240, &p);
    CHECK(st == LMK_OK && lmk_stream_sync(d->stream) == LMK_OK, "[%s] the mended call: %s \"%s\"", d->name,
          lmk_status_name(st), lmk_last_error());

    /* Rule 1 for each dimension, with the values in the message. */
    lmk_buffer_free(dst240);
    dst240 = poisoned(d, LMK_F32, 240);
    if (!dst240)
        goto done;
    const lmk_repeat_tiled_params zeros[] = {{0, 2, 4, 5}, {3, 0, 4, 5}, {3, 2, 0, 5}, {3, 2, 4, 0}, {0, 0, 0, 0}};
    for (size_t i = 0; i < sizeof zeros / sizeof zeros[0]; i++) {
        char vals[96];
        snprintf(vals, sizeof vals, "seq (%u), hg (%u), h (%u), k (%u)", zeros[i].seq, zeros[i].hg, zeros[i].h,
                 zeros[i].k);
        expect_reject(d, "a zero dim", src120, dst240, &zeros[i], "must all be > 0", vals);
    }
    /* Rule 2: the seed's rejection vector and others; hg > h is not a multiple either. */
    const lmk_repeat_tiled_params notmul[] = {{3, 2, 5, 5}, {3, 4, 6, 5}, {3, 8, 4, 5}, {1, 3, 1, 1}};
    for (size_t i = 0; i < sizeof notmul / sizeof notmul[0]; i++) {
        char want[96];
        snprintf(want, sizeof want, "h (%u) must be a multiple of hg (%u)", notmul[i].h, notmul[i].hg);
        expect_reject(d, "h not a multiple of hg", src120, dst240, &notmul[i], want, NULL);
    }
    /* Rule 3: element counts that overflow, and byte counts that overflow although the element
     * count fits (f32: 2^64 - 2^32 elements). */
    const lmk_repeat_tiled_params ovf[] = {
        {0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu},
        {0xFFFFFFFFu, 1, 0xFFFFFFFFu, 0xFFFFFFFFu},
        {65536, 1, 0xFFFFFFFFu, 65536},
        {0x80000000u, 0x80000000u, 0x80000000u, 2},
    };
    for (size_t i = 0; i < sizeof ovf / sizeof ovf[0]; i++)
        expect_reject(d, "huge dims", src120, dst240, &ovf[i], "overflows", NULL);
    /* The same u8 shape fits size_t (one byte per element): then the buffers are too small. */
    lmk_buffer *src_u8 = poisoned(d, LMK_U8, 64), *dst_u8 = poisoned(d, LMK_U8, 64);
    if (src_u8 && dst_u8) {
        const lmk_repeat_tiled_params big = {1, 1, 0xFFFFFFFFu, 65536};
        expect_reject(d, "u8 h=2^32-1 k=65536 (fits size_t)", src_u8, dst_u8, &big,
                      "src buffer too small: need 65536 bytes, have 64", NULL);
        const lmk_repeat_tiled_params big2 = {1, 1, 0xFFFFFFFFu, 64};
        expect_reject(d, "u8 dst of 274877906880 bytes", src_u8, dst_u8, &big2,
                      "dst buffer too small: need 274877906880 bytes, have 64", NULL);
    }
    lmk_buffer_free(src_u8);
    lmk_buffer_free(dst_u8);

    /* NULL arguments. */
    expect_reject(d, "NULL src", NULL, dst240, &p, "NULL", NULL);
    expect_reject(d, "NULL params", src120, dst240, NULL, "NULL", NULL);
    lmk_clear_error();
    st = lmk_repeat_tiled(d->stream, src120, NULL, &p);
    CHECK(st == LMK_ERR_INVALID_ARGUMENT && tst_msg_has("repeat_tiled", NULL), "[%s] NULL dst: %s", d->name,
          lmk_status_name(st));
    st = lmk_repeat_tiled(NULL, src120, dst240, &p);
    CHECK(st == LMK_ERR_INVALID_ARGUMENT && tst_msg_has("repeat_tiled", NULL), "[%s] NULL stream: %s", d->name,
          lmk_status_name(st));

    /* Larger buffers are accepted (pooled memory) and only the used range is written. */
    {
        lmk_buffer *bigsrc = tst_buf(d->dev, LMK_F32, NULL, 0, 120, 1000, NULL, 0, 0x3C);
        lmk_buffer *bigdst = poisoned(d, LMK_F32, 240 + 1000);
        st = bigsrc && bigdst ? lmk_repeat_tiled(d->stream, bigsrc, bigdst, &p) : LMK_ERR_OUT_OF_MEMORY;
        lmk_stream_sync(d->stream);
        unsigned char *got = st == LMK_OK ? tst_read_all(bigdst) : NULL;
        CHECK(got && tst_find_not(got, 0, 240, 0x3C) < 0 && tst_find_not(got, 240, 1240, TST_POISON) < 0,
              "[%s] pooled buffers: %s \"%s\"", d->name, lmk_status_name(st), lmk_last_error());
        free(got);
        lmk_buffer_free(bigsrc);
        lmk_buffer_free(bigdst);
    }
done:
    lmk_buffer_free(src116);
    lmk_buffer_free(src120);
    lmk_buffer_free(dst_u16);
    lmk_buffer_free(dst236);
    lmk_buffer_free(dst240);
}

/* Overlap of src and dst is rejected; adjacent views are fine. Also a buffer of another device. */
static void test_overlap_and_devices(tst_dev *d)
{
    const lmk_repeat_tiled_params p = {.seq = 2, .hg = 2, .h = 4, .k = 4}; /* src 64 B, dst 128 B (f32) */
    lmk_buffer *parent = poisoned(d, LMK_F32, 512);
    if (!parent)
        return;
    lmk_buffer *s = NULL, *t = NULL;
    const size_t s_shape[1] = {16}, t_shape[1] = {32};
    /* src == dst (the whole parent holds both sizes) */
    expect_reject(d, "src == dst", parent, parent, &p, "overlap", NULL);
    /* dst view starting inside src's range */
    if (lmk_buffer_view(parent, 0, LMK_F32, s_shape, 1, &s) == LMK_OK &&
        lmk_buffer_view(parent, 60, LMK_F32, t_shape, 1, &t) == LMK_OK) {
        lmk_clear_error();
        const lmk_status st = lmk_repeat_tiled(d->stream, s, t, &p);
        unsigned char *got = tst_read_all(parent);
        CHECK(st == LMK_ERR_INVALID_ARGUMENT && tst_msg_has("repeat_tiled", "overlap", NULL) && got &&
                  tst_find_not(got, 0, 512, TST_POISON) < 0,
              "[%s] dst starts 4 bytes before src ends: %s \"%s\"", d->name, lmk_status_name(st), lmk_last_error());
        free(got);
    }
    lmk_buffer_free(t);
    t = NULL;
    /* src view starting inside dst's range */
    if (lmk_buffer_view(parent, 0, LMK_F32, t_shape, 1, &t) == LMK_OK) {
        lmk_buffer *s2 = NULL;
        if (lmk_buffer_view(parent, 124, LMK_F32, s_shape, 1, &s2) == LMK_OK) {
            lmk_clear_error();
            const lmk_status st = lmk_repeat_tiled(d->stream, s2, t, &p);
            CHECK(st == LMK_ERR_INVALID_ARGUMENT && tst_msg_has("overlap", NULL),
                  "[%s] src starts 4 bytes before dst ends: %s \"%s\"", d->name, lmk_status_name(st),
                  lmk_last_error());
        }
        lmk_buffer_free(s2);
    }
    lmk_buffer_free(t);
    t = NULL;
    /* adjacent: src [0, 64), dst [64, 192) */
    float vals[16];
    for (int i = 0; i < 16; i++)
        vals[i] = (float)i;
    if (s && lmk_buffer_write(s, 0, vals, sizeof vals) == LMK_OK &&
        lmk_buffer_view(parent, 64, LMK_F32, t_shape, 1, &t) == LMK_OK) {
        const lmk_status st = lmk_repeat_tiled(d->stream, s, t, &p);
        lmk_stream_sync(d->stream);
        float out[32];
        const bool ok = st == LMK_OK && lmk_buffer_read(t, 0, out, sizeof out) == LMK_OK;
        /* token 1, head 3 reads source head 1: elements 12..15 */
        CHECK(ok && out[0] == 0.0f && out[4] == 4.0f && out[8] == 0.0f && out[28] == 12.0f && out[31] == 15.0f,
              "[%s] adjacent src and dst views: %s \"%s\"", d->name, lmk_status_name(st), lmk_last_error());
    }
    lmk_buffer_free(t);
    lmk_buffer_free(s);
    lmk_buffer_free(parent);

    /* A buffer of another device (a second handle of the same backend) is rejected. */
    lmk_device *other = NULL;
    if (lmk_device_open(d->backend, 0, &other) == LMK_OK) {
        lmk_buffer *src_o = tst_buf(other, LMK_F32, NULL, 0, 64, 0, NULL, 0, 0);
        lmk_buffer *src_d = tst_buf(d->dev, LMK_F32, NULL, 0, 64, 0, NULL, 0, 0);
        lmk_buffer *dst_o = tst_buf(other, LMK_F32, NULL, 0, 128, 0, NULL, 0, TST_POISON);
        lmk_buffer *dst_d = poisoned(d, LMK_F32, 128);
        if (src_o && dst_d && src_d && dst_o) {
            expect_reject(d, "src of another device", src_o, dst_d, &p, "device", NULL);
            lmk_clear_error();
            const lmk_status st = lmk_repeat_tiled(d->stream, src_d, dst_o, &p);
            unsigned char *got = tst_read_all(dst_o);
            CHECK(st == LMK_ERR_INVALID_ARGUMENT && tst_msg_has("device", NULL) && got &&
                      tst_find_not(got, 0, 128, TST_POISON) < 0,
                  "[%s] dst of another device: %s \"%s\"", d->name, lmk_status_name(st), lmk_last_error());
            free(got);
        }
        lmk_buffer_free(src_o);
        lmk_buffer_free(src_d);
        lmk_buffer_free(dst_o);
        lmk_buffer_free(dst_d);
        lmk_device_close(other);
    } else {
        TST_FAIL("[%s] a second device handle: %s", d->name, lmk_last_error());
    }
}

/* Strided views (lmk.h repeat_tiled): a [seq, hg, k] source and a [seq, h, k] output with gaps
 * between heads and between tokens, inside larger parents. The output's elements get the tiled
 * copy and no other byte of either parent changes (the 0.1 code copied densely over the span and
 * overwrote the gaps); a source and an output interleaved in one parent, elements disjoint, are
 * accepted too; a strided view of another shape is rejected naming it, with nothing written. */
static void test_strided_views(tst_dev *d)
{
    const lmk_repeat_tiled_params p = {.seq = 3, .hg = 2, .h = 6, .k = 5};
    const lmk_dtype t = LMK_U16;
    const size_t es = 2;
    const size_t s_head = 7, s_tok = 2 * 7 + 3, s_off = 1; /* src element (t, g, j) at s_off + t*s_tok + g*s_head + j */
    const size_t d_head = 8, d_tok = 6 * 8 + 2, d_off = 2;
    const size_t s_n = s_off + 3 * s_tok + 4, d_n = d_off + 3 * d_tok + 4;
    const uint64_t seed = tst_case_seed();
    tst_rng r = tst_rng_make(seed);
    unsigned char *src = malloc(s_n * es), *want = malloc(d_n * es), *got = NULL, *got_src = NULL;
    lmk_buffer *ps = NULL, *pd = NULL, *vs = NULL, *vd = NULL, *flat = NULL;
    if (!TST_REQUIRE(src && want, "out of host memory"))
        goto done;
    fill_src(&r, src, s_n, es);
    ps = tst_buf(d->dev, t, NULL, 0, s_n * es, 0, src, s_n * es, -1);
    pd = tst_buf(d->dev, t, NULL, 0, d_n * es, 0, NULL, 0, TST_POISON);
    const size_t s_shape[3] = {3, 2, 5}, s_str[3] = {s_tok, s_head, 1};
    const size_t d_shape[3] = {3, 6, 5}, d_str[3] = {d_tok, d_head, 1};
    if (!ps || !pd || !TST_REQUIRE(lmk_buffer_view_strided(ps, s_off * es, t, s_shape, s_str, 3, &vs) == LMK_OK &&
                                       lmk_buffer_view_strided(pd, d_off * es, t, d_shape, d_str, 3, &vd) == LMK_OK,
                                   "strided views: %s", lmk_last_error()))
        goto done;
    tst_poison(want, d_n * es, TST_POISON);
    for (size_t tt = 0; tt < p.seq; tt++)
        for (size_t h = 0; h < p.h; h++)
            memcpy(want + (d_off + tt * d_tok + h * d_head) * es, src + (s_off + tt * s_tok + h % p.hg * s_head) * es,
                   p.k * es);
    lmk_clear_error();
    lmk_status st = lmk_repeat_tiled(d->stream, vs, vd, &p);
    if (st == LMK_OK)
        st = lmk_stream_sync(d->stream);
    got = tst_read_all(pd);
    got_src = tst_read_all(ps);
    const long long diff = got ? tst_bits_diff(got, want, d_n * es) : 0;
    CHECK(st == LMK_OK && got && diff < 0 && got_src && memcmp(got_src, src, s_n * es) == 0,
          "[%s] repeat_tiled with strided src and dst (gaps between heads and tokens) seed 0x%016" PRIx64
          ": %s \"%s\"; first wrong byte of the output's parent %lld (element %lld: %s)%s",
          d->name, seed, lmk_status_name(st), lmk_last_error(), diff, diff >= 0 ? diff / (long long)es - (long long)d_off : -1,
          diff >= 0 && got && got[diff] != TST_POISON && want[diff] == TST_POISON ? "a gap byte was written" : "wrong value",
          got_src && memcmp(got_src, src, s_n * es) != 0 ? "; the source changed" : "");

    /* The source's k rows interleaved with the output's in one parent: [seq][h + hg][k] rows, the
     * source the last hg heads of each token. Elements disjoint: accepted, gaps untouched. */
    {
        const size_t row = (p.h + p.hg) * p.k, n = p.seq * row;
        lmk_buffer *par = tst_buf(d->dev, t, NULL, 0, n * es, 0, NULL, 0, TST_POISON), *a = NULL, *b = NULL;
        unsigned char *img = malloc(n * es), *exp = malloc(n * es);
        const size_t as[3] = {3, 2, 5}, ast[3] = {row, p.k, 1}, bs[3] = {3, 6, 5}, bst[3] = {row, p.k, 1};
        if (par && img && exp && TST_REQUIRE(lmk_buffer_view_strided(par, p.h * p.k * es, t, as, ast, 3, &a) == LMK_OK &&
                                                 lmk_buffer_view_strided(par, 0, t, bs, bst, 3, &b) == LMK_OK,
                                             "interleaved views: %s", lmk_last_error())) {
            fill_src(&r, img, n, es);
            memcpy(exp, img, n * es);
            for (size_t tt = 0; tt < p.seq; tt++)
                for (size_t h = 0; h < p.h; h++)
                    memcpy(exp + (tt * row + h * p.k) * es, img + (tt * row + (p.h + h % p.hg) * p.k) * es, p.k * es);
            st = lmk_buffer_write(par, 0, img, n * es);
            if (st == LMK_OK)
                st = lmk_repeat_tiled(d->stream, a, b, &p);
            if (st == LMK_OK)
                st = lmk_stream_sync(d->stream);
            unsigned char *g = tst_read_all(par);
            CHECK(st == LMK_OK && g && memcmp(g, exp, n * es) == 0,
                  "[%s] repeat_tiled: src heads after dst heads in one [seq, h + hg, k] parent: %s \"%s\"%s", d->name,
                  lmk_status_name(st), lmk_last_error(), st == LMK_OK ? "; wrong bytes" : "");
            free(g);
        }
        lmk_buffer_free(a);
        lmk_buffer_free(b);
        lmk_buffer_free(par);
        free(img);
        free(exp);
    }

    /* A strided view that is not [seq, h, k] (1-D, every other element) is rejected. */
    const size_t f_shape[1] = {p.seq * p.h * p.k}, f_str[1] = {2};
    lmk_buffer_free(pd);
    pd = tst_buf(d->dev, t, NULL, 0, 2 * f_shape[0] * es, 0, NULL, 0, TST_POISON);
    if (pd && TST_REQUIRE(lmk_buffer_view_strided(pd, 0, t, f_shape, f_str, 1, &flat) == LMK_OK, "1-D view: %s",
                          lmk_last_error()))
        expect_reject(d, "dst a 1-D strided view", vs, flat, &p, "dst", "[3, 6, 5]");
done:
    lmk_buffer_free(flat);
    lmk_buffer_free(vs);
    lmk_buffer_free(vd);
    lmk_buffer_free(ps);
    lmk_buffer_free(pd);
    free(src);
    free(want);
    free(got);
    free(got_src);
}

/* T*H*K past 2^32 elements (64-bit indexing), checked at sampled windows: only where it is cheap
 * (a GPU with memory to spare), never on the CPU. */
static void test_huge(tst_dev *d)
{
    if (d->backend != LMK_BACKEND_CUDA) {
        SKIP("repeat_tiled T*H*K > 2^32 on %s: too slow and too large for the CPU run", d->name);
        return;
    }
    if (tst_quick()) {
        SKIP("repeat_tiled T*H*K > 2^32 on %s: LMK_TEST_QUICK", d->name);
        return;
    }
    struct {
        lmk_repeat_tiled_params p;
        lmk_dtype t;
        const char *comment;
    } cases[] = {
        {{32768, 16, 64, 2049}, LMK_U8, "4297064448 elements > 2^32"},
        {{65536, 16, 64, 128}, LMK_F32, "qwen3.5-122B/397B GDN at a 65536-token prompt, 2 GiB out"},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const lmk_repeat_tiled_params *p = &cases[ci].p;
        const size_t es = lmk_dtype_size(cases[ci].t);
        const size_t src_n = (size_t)p->seq * p->hg * p->k, dst_n = (size_t)p->seq * p->h * p->k;
        char name[256];
        tst_repeat_name(name, sizeof name, p, cases[ci].t, cases[ci].comment);
        const uint64_t seed = tst_case_seed();
        tst_rng r = tst_rng_make(seed);
        unsigned char *src = malloc(src_n * es);
        lmk_buffer *bs = NULL, *bd = NULL;
        if (!src) {
            SKIP("%s: no host memory for the source", name);
            continue;
        }
        fill_src(&r, src, src_n, es);
        bs = tst_buf(d->dev, cases[ci].t, NULL, 0, src_n * es, 0, src, src_n * es, -1);
        if (bs && lmk_buffer_alloc(d->dev, dst_n * es + TST_GUARD, cases[ci].t, NULL, 0, &bd) != LMK_OK) {
            SKIP("%s: no device memory (%s)", name, lmk_last_error());
            lmk_buffer_free(bs);
            free(src);
            continue;
        }
        const double t0 = tst_now();
        lmk_status st = bs ? lmk_repeat_tiled(d->stream, bs, bd, p) : LMK_ERR_OUT_OF_MEMORY;
        if (st == LMK_OK)
            st = lmk_stream_sync(d->stream);
        const double dt = tst_now() - t0;
        /* Windows: the start, around element 2^32, around byte 2^32, the end, and random places. */
        enum { W = 1 << 16 };
        size_t starts[24];
        int nw = 0;
        starts[nw++] = 0;
        const size_t marks[] = {(size_t)1 << 31, (size_t)1 << 32, ((size_t)1 << 32) / es};
        for (size_t m = 0; m < sizeof marks / sizeof marks[0]; m++)
            if (marks[m] < dst_n)
                starts[nw++] = marks[m] > W / 2 ? marks[m] - W / 2 : 0;
        starts[nw++] = dst_n - W;
        while (nw < 24)
            starts[nw++] = (size_t)(tst_rng_u64(&r) % (dst_n - W));
        unsigned char *got = malloc((size_t)W * es), *want = malloc((size_t)W * es);
        size_t bad_w = 0, first_bad = 0;
        for (int w = 0; w < nw && st == LMK_OK && got && want; w++) {
            if (lmk_buffer_read(bd, starts[w] * es, got, (size_t)W * es) != LMK_OK) {
                st = LMK_ERR_DEVICE;
                break;
            }
            for (size_t i = 0; i < W; i++) {
                const size_t e = starts[w] + i, kk = e % p->k, hh = e / p->k % p->h, tt = e / ((size_t)p->h * p->k);
                memcpy(want + i * es, src + ((tt * p->hg + hh % p->hg) * p->k + kk) * es, es);
            }
            if (memcmp(got, want, (size_t)W * es) != 0 && !bad_w++)
                first_bad = starts[w];
        }
        unsigned char guard[TST_GUARD];
        const bool guard_ok = st == LMK_OK && lmk_buffer_read(bd, dst_n * es, guard, TST_GUARD) == LMK_OK &&
                              tst_find_not(guard, 0, TST_GUARD, 0) < 0;
        CHECK(st == LMK_OK && bad_w == 0 && guard_ok,
              "%s [%s] seed 0x%016" PRIx64 ": %s \"%s\"; %zu of %d windows wrong, first at element %zu; guard %s",
              name, d->name, seed, lmk_status_name(st), lmk_last_error(), bad_w, nw, first_bad,
              guard_ok ? "ok" : "touched");
        printf("  %-100s [%s] %s (%.1f GB/s)\n", name, d->name, st == LMK_OK && bad_w == 0 ? "OK" : "FAIL",
               (double)(src_n + dst_n) * (double)es / dt * 1e-9);
        free(got);
        free(want);
        lmk_buffer_free(bd);
        lmk_buffer_free(bs);
        free(src);
    }
}

int main(void)
{
    tst_program_seed();
    const double t0 = tst_now();
    tst_dev devs[TST_MAX_DEVS];
    const int n = tst_devs_open_isas(devs);
    for (int i = 0; i < n; i++) {
        printf("[%s] %s\n", devs[i].name, lmk_device_name(devs[i].dev));
        test_model_shapes(&devs[i]);
        test_edge_shapes(&devs[i]);
        test_validation(&devs[i]);
        test_overlap_and_devices(&devs[i]);
        test_strided_views(&devs[i]);
        test_huge(&devs[i]);
    }
    tst_devs_close(devs, n);
    printf("test_repeat: %.2f s\n", tst_now() - t0);
    return harness_summary();
}
