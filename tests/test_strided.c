/*
 * test_strided.c - strided buffers (lmk.h "Buffers") and the element-exact overlap rule (lmk.h
 * "Operands"), the latter through lmk_rope, the op with the most operands.
 *
 *  1. The buffer API for strided views on every backend: shapes and strides round-trip, the byte
 *     length is the span, views that leave their parent, misaligned offsets, overflowing spans,
 *     ndim 0 or > LMK_MAX_DIMS and NULL shape/strides are rejected with a message and create no
 *     handle; is_contiguous ignores the strides of length-1 axes; a dense-strided view is
 *     contiguous (and an op takes it as a dense operand); views of a NULL-wrapped empty buffer
 *     (computing NULL + 0 there was undefined behaviour, caught by `make test-sanitize`); empty
 *     buffers (an axis of 0) whatever their other axes and strides, and every op given them.
 *  2. The overlap rule through lmk_rope (NEOX and IMROPE, q only and q+k): q and k rotated in place
 *     inside one packed QKV buffer [T, (Hq + 2 Hk) * D] are accepted and match the float64 reference
 *     (tst_rope_check) while v's bytes stay as they were; q of a Qwen3.5 [q | gate] projection
 *     (head stride 2D) likewise, gate untouched; real overlaps are rejected naming both operands,
 *     with no byte written.
 *     The rule itself against a byte-by-byte count on random layouts, and GPT-NeoX's [T, H, 3, D]
 *     with 65 and 128 heads (once reported as overlapping past 64 heads).
 *  3. Three public bugs as regression cases: vLLM #16658 (a kernel ignored the query's token
 *     stride: rows with poisoned gaps must come out right, gaps still poisoned), SGLang #20559 (q
 *     and k with different head strides), vLLM #52415 (overlapping stores: an output whose rows
 *     would be written twice is rejected, and every accepted call is deterministic).
 * Every byte of every buffer a call touches is compared afterwards: outputs against the
 * reference, everything else against what it held before.
 */
#include "common.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

HARNESS_DEFINE;

/* ------------------------------------------------------------------------------------------------
 * 1. the buffer API
 * ---------------------------------------------------------------------------------------------- */

/* A view_strided call that must fail with INVALID_ARGUMENT, a message naming the function and
 * holding `needle`, and no handle made (*out left as it was). */
static void expect_view_reject(const char *what, const lmk_buffer *parent, size_t off, lmk_dtype t,
                               const size_t *shape, const size_t *strides, int ndim, const char *needle)
{
    lmk_buffer *const sentinel = (lmk_buffer *)(uintptr_t)0x1000, *out = sentinel;
    lmk_clear_error();
    const lmk_status st = lmk_buffer_view_strided(parent, off, t, shape, strides, ndim, &out);
    CHECK(st == LMK_ERR_INVALID_ARGUMENT && tst_msg_has("lmk_buffer_view_strided: ", needle, NULL) && out == sentinel,
          "%s: %s \"%s\" (want INVALID_ARGUMENT with \"%s\")%s", what, lmk_status_name(st), lmk_last_error(), needle,
          out == sentinel ? "" : "; a handle was made");
    if (out != sentinel)
        lmk_buffer_free(out);
}

static lmk_buffer *view_ok(const char *what, const lmk_buffer *parent, size_t off, lmk_dtype t, const size_t *shape,
                           const size_t *strides, int ndim)
{
    lmk_buffer *v = NULL;
    const lmk_status st = lmk_buffer_view_strided(parent, off, t, shape, strides, ndim, &v);
    CHECK(st == LMK_OK, "%s: %s \"%s\"", what, lmk_status_name(st), lmk_last_error());
    return st == LMK_OK ? v : NULL;
}

/* Whether v reports exactly the shape, strides, span, dtype, device and address it was made with. */
static bool round_trips(const lmk_buffer *v, const lmk_buffer *parent, size_t off, lmk_dtype t, const size_t *shape,
                        const size_t *strides, int ndim, size_t span, char *why, size_t n)
{
    size_t count = 1;
    for (int i = 0; i < ndim; i++) {
        count *= shape[i];
        if (lmk_buffer_dim(v, i) != shape[i] || lmk_buffer_stride(v, i) != strides[i]) {
            snprintf(why, n, "axis %d: dim %zu stride %zu, made with %zu, %zu", i, lmk_buffer_dim(v, i),
                     lmk_buffer_stride(v, i), shape[i], strides[i]);
            return false;
        }
    }
    snprintf(why, n, "ndim %d, count %zu, byte_len %zu (span %zu), dtype %s, data %s, device %s, axis ndim %zu/%zu",
             lmk_buffer_ndim(v), lmk_buffer_element_count(v), lmk_buffer_byte_len(v), span,
             lmk_dtype_name(lmk_buffer_dtype(v)),
             lmk_buffer_data(v) == (char *)lmk_buffer_data(parent) + off ? "ok" : "wrong",
             lmk_buffer_device(v) == lmk_buffer_device(parent) ? "ok" : "wrong", lmk_buffer_dim(v, ndim),
             lmk_buffer_stride(v, ndim));
    return lmk_buffer_ndim(v) == ndim && lmk_buffer_element_count(v) == count && lmk_buffer_byte_len(v) == span &&
           lmk_buffer_dtype(v) == t && lmk_buffer_data(v) == (char *)lmk_buffer_data(parent) + off &&
           lmk_buffer_device(v) == lmk_buffer_device(parent) && lmk_buffer_dim(v, ndim) == 0 &&
           lmk_buffer_stride(v, ndim) == 0 && lmk_buffer_stride(v, -1) == 0;
}

static void test_round_trip(tst_dev *d, lmk_buffer *parent)
{
    static const struct {
        lmk_dtype t;
        size_t off;
        int ndim;
        size_t shape[LMK_MAX_DIMS], strides[LMK_MAX_DIMS];
        size_t span; /* bytes */
    } cs[] = {
        {LMK_F32, 8, 3, {3, 4, 5}, {40, 10, 1}, (2 * 40 + 3 * 10 + 4 + 1) * 4},
        {LMK_BF16, 2, 3, {2, 3, 4}, {24, 8, 1}, (24 + 16 + 3 + 1) * 2},         /* q|gate-like: head stride 2D */
        {LMK_F32, 0, 3, {4, 2, 3}, {3, 12, 1}, (9 + 12 + 2 + 1) * 4},           /* head-major: strides out of order */
        {LMK_F32, 4, 2, {5, 3}, {0, 1}, 3 * 4},                                 /* stride 0: accepted by the API */
        {LMK_U8, 3, 1, {7}, {3}, 19},
        {LMK_I64, 16, 2, {3, 0}, {5, 1}, 0},                                    /* an axis of 0: no bytes */
        {LMK_F16, 6, LMK_MAX_DIMS, {2, 1, 2, 1, 2, 1, 2, 3}, {97, 5, 41, 9, 19, 1, 4, 1}, (97 + 41 + 19 + 4 + 2 + 1) * 2},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        char what[320], why[256];
        snprintf(what, sizeof what, "[%s] round trip %zu (%s, %d-D)", d->name, i, lmk_dtype_name(cs[i].t), cs[i].ndim);
        lmk_buffer *v = view_ok(what, parent, cs[i].off, cs[i].t, cs[i].shape, cs[i].strides, cs[i].ndim);
        if (v)
            CHECK(round_trips(v, parent, cs[i].off, cs[i].t, cs[i].shape, cs[i].strides, cs[i].ndim, cs[i].span, why,
                              sizeof why),
                  "%s: %s", what, why);
        /* A strided view of the view: offsets add up, and its bounds are the inner view's span. */
        if (v && i == 0) {
            const size_t s2[2] = {3, 2}, st2[2] = {40, 2};
            lmk_buffer *w = view_ok(what, v, 4, LMK_F32, s2, st2, 2);
            const size_t span2 = (2 * 40 + 2 + 1) * 4;
            CHECK(w && lmk_buffer_data(w) == (char *)lmk_buffer_data(parent) + 12 && lmk_buffer_byte_len(w) == span2,
                  "%s: a view of the view", what);
            lmk_buffer_free(w);
            const size_t s3[1] = {115}, st3[1] = {1};
            expect_view_reject("a view one element past its strided parent's span", v, 4, LMK_F32, s3, st3, 1,
                               "past the parent's 460 bytes");
        }
        lmk_buffer_free(v);
    }
}

static void test_view_rejects(tst_dev *d, lmk_buffer *parent /* 4096 bytes */)
{
    const size_t sh3[3] = {3, 4, 5}, fit[3] = {3, 4, 5}, fit_strides[3] = {(1024 - 20) / 2, 5, 1};
    const size_t far[3] = {1000, 10, 1}, huge[3] = {SIZE_MAX / 2 + 1, 1, 1}, one[1] = {1};
    const size_t big_shape[2] = {SIZE_MAX, 2}, st2[2] = {0, 1}, span_ovf[1] = {SIZE_MAX / 4}, two[1] = {2};
    lmk_buffer *v = view_ok("a view that ends exactly at the parent's end", parent, 0, LMK_F32, fit, fit_strides, 3);
    CHECK(v && lmk_buffer_byte_len(v) == 4096, "[%s] exact fit: byte_len %zu", d->name, lmk_buffer_byte_len(v));
    lmk_buffer_free(v);
    expect_view_reject("one element more than fits", parent, 4, LMK_F32, fit, fit_strides, 3,
                       "past the parent's 4096 bytes");
    expect_view_reject("token stride 1000 leaves the parent", parent, 0, LMK_F32, sh3, far, 3,
                       "spans 8140 bytes from byte_offset 0, past the parent's 4096 bytes");
    expect_view_reject("offset past the end", parent, 4100, LMK_U8, one, one, 1, "byte_offset 4100 is past");
    expect_view_reject("f32 at byte offset 2", parent, 2, LMK_F32, sh3, far, 3, "byte_offset 2 is not aligned to the f32 size (4)");
    expect_view_reject("i64 at byte offset 4", parent, 4, LMK_I64, one, one, 1, "not aligned to the i64 size (8)");
    expect_view_reject("span of an axis overflows", parent, 0, LMK_F32, sh3, huge, 3, "span of axis 0");
    expect_view_reject("element count overflows", parent, 0, LMK_U8, big_shape, st2, 2, "element count overflows");
    expect_view_reject("byte span overflows", parent, 0, LMK_F32, two, span_ovf, 1, "byte span overflows");
    expect_view_reject("ndim 0", parent, 0, LMK_F32, sh3, far, 0, "ndim (0) must be in [1, 8]");
    expect_view_reject("ndim 9", parent, 0, LMK_F32, sh3, far, LMK_MAX_DIMS + 1, "ndim (9) must be in [1, 8]");
    expect_view_reject("ndim -1", parent, 0, LMK_F32, sh3, far, -1, "ndim (-1)");
    expect_view_reject("NULL shape", parent, 0, LMK_F32, NULL, far, 3, "shape must not be NULL");
    expect_view_reject("NULL strides", parent, 0, LMK_F32, sh3, NULL, 3, "strides must not be NULL");
    expect_view_reject("NULL parent", NULL, 0, LMK_F32, sh3, far, 3, "parent must not be NULL");
    expect_view_reject("unknown dtype 99", parent, 0, (lmk_dtype)99, sh3, far, 3, "unknown dtype 99");
    lmk_clear_error();
    CHECK(lmk_buffer_view_strided(parent, 0, LMK_F32, sh3, far, 3, NULL) == LMK_ERR_INVALID_ARGUMENT &&
              tst_msg_has("out must not be NULL", NULL),
          "[%s] NULL out: \"%s\"", d->name, lmk_last_error());
}

/* lmk_buffer_is_contiguous: dense row-major, strides of length-1 axes ignored; and an op takes a
 * contiguous view as a dense operand of any declared shape, a non-contiguous one only as an exact
 * [T, H, D] view. */
static void test_contiguous(tst_dev *d, lmk_buffer *parent)
{
    static const struct {
        int ndim;
        size_t shape[3], strides[3];
        int want;
        const char *what;
    } cs[] = {
        {3, {3, 4, 5}, {20, 5, 1}, 1, "dense strides"},
        {3, {3, 1, 5}, {5, 777, 1}, 1, "length-1 head axis with stride 777"},
        {3, {1, 4, 5}, {0, 5, 1}, 1, "length-1 token axis with stride 0"},
        {3, {3, 4, 1}, {4, 1, 9}, 1, "length-1 last axis with stride 9"},
        {3, {3, 4, 5}, {21, 5, 1}, 0, "token stride 21 (a pad)"},
        {3, {3, 4, 5}, {20, 5, 2}, 0, "last stride 2"},
        {3, {3, 4, 5}, {5, 15, 1}, 0, "head-major"},
        {3, {3, 4, 5}, {0, 5, 1}, 0, "stride 0 on a long axis"},
        {1, {60}, {1}, 1, "1-D dense"},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        lmk_buffer *v = view_ok(cs[i].what, parent, 0, LMK_F32, cs[i].shape, cs[i].strides, cs[i].ndim);
        CHECK(v && lmk_buffer_is_contiguous(v) == cs[i].want, "[%s] is_contiguous(%s) = %d, want %d", d->name,
              cs[i].what, v ? lmk_buffer_is_contiguous(v) : -1, cs[i].want);
        lmk_buffer_free(v);
    }
    lmk_buffer *dense = NULL;
    const size_t shape[3] = {3, 4, 5};
    CHECK(lmk_buffer_alloc(d->dev, 240, LMK_F32, shape, 3, &dense) == LMK_OK && lmk_buffer_is_contiguous(dense) &&
              lmk_buffer_stride(dense, 0) == 20 && lmk_buffer_stride(dense, 1) == 5 && lmk_buffer_stride(dense, 2) == 1,
          "[%s] an allocated [3, 4, 5] buffer reports strides [20, 5, 1] and contiguous", d->name);
    CHECK(!lmk_buffer_is_contiguous(NULL) && lmk_buffer_stride(NULL, 0) == 0, "[%s] NULL: not contiguous, stride 0",
          d->name);
    /* A 1-D contiguous view of 60 elements is a dense [3, 4, 5] operand; with stride 2 it is not. */
    const size_t s60[1] = {60}, st1[1] = {1}, st2[1] = {2};
    lmk_buffer *flat = view_ok("1-D dense view", parent, 0, LMK_F32, s60, st1, 1);
    lmk_buffer *flat2 = view_ok("1-D view with stride 2", parent, 0, LMK_F32, s60, st2, 1);
    const size_t src_shape[1] = {30};
    lmk_buffer *src = tst_buf(d->dev, LMK_F32, src_shape, 1, 120, 0, NULL, 0, 0x11);
    const lmk_repeat_heads_params p = {3, 2, 4, 5, LMK_REPEAT_TILED};
    lmk_status st = flat && src ? lmk_repeat_heads(d->stream, src, flat, &p) : LMK_ERR_OUT_OF_MEMORY;
    CHECK(st == LMK_OK && lmk_stream_sync(d->stream) == LMK_OK, "[%s] a contiguous 1-D view as a [3, 4, 5] dst: %s \"%s\"",
          d->name, lmk_status_name(st), lmk_last_error());
    lmk_clear_error();
    st = flat2 && src ? lmk_repeat_heads(d->stream, src, flat2, &p) : LMK_ERR_OUT_OF_MEMORY;
    CHECK(st == LMK_ERR_INVALID_ARGUMENT && tst_msg_has("dst has shape [60] and strides [2]", NULL),
          "[%s] a stride-2 1-D view as a [3, 4, 5] dst: %s \"%s\"", d->name, lmk_status_name(st), lmk_last_error());
    lmk_buffer_free(flat);
    lmk_buffer_free(flat2);
    lmk_buffer_free(src);
    lmk_buffer_free(dense);
}

/* Views of a wrapped empty buffer whose pointer is NULL. Before the fix lmk_buffer_view computed
 * NULL + 0, undefined in C: UBSan ("applying zero offset to null pointer") stops `make
 * test-sanitize` there. */
static void test_null_wrapped(tst_dev *d)
{
    lmk_buffer *empty = NULL, *v = NULL, *sv = NULL, *bad = NULL;
    lmk_status st = lmk_buffer_wrap(d->dev, NULL, 0, LMK_F32, NULL, 0, &empty);
    if (!CHECK(st == LMK_OK && lmk_buffer_data(empty) == NULL && lmk_buffer_byte_len(empty) == 0,
               "[%s] wrap(NULL, 0): %s \"%s\"", d->name, lmk_status_name(st), lmk_last_error()))
        return;
    st = lmk_buffer_view(empty, 0, LMK_F32, NULL, 0, &v);
    CHECK(st == LMK_OK && lmk_buffer_data(v) == NULL && lmk_buffer_byte_len(v) == 0 &&
              lmk_buffer_element_count(v) == 0,
          "[%s] lmk_buffer_view of a NULL-wrapped empty buffer: %s \"%s\"", d->name, lmk_status_name(st),
          lmk_last_error());
    const size_t zero[2] = {0, 4}, strides[2] = {4, 1}, one[1] = {1}, unit[1] = {1};
    st = lmk_buffer_view_strided(empty, 0, LMK_F32, zero, strides, 2, &sv);
    CHECK(st == LMK_OK && lmk_buffer_data(sv) == NULL && lmk_buffer_byte_len(sv) == 0,
          "[%s] a [0, 4] strided view of a NULL-wrapped empty buffer: %s \"%s\"", d->name, lmk_status_name(st),
          lmk_last_error());
    lmk_clear_error();
    st = lmk_buffer_view_strided(empty, 0, LMK_F32, one, unit, 1, &bad);
    CHECK(st == LMK_ERR_INVALID_ARGUMENT && bad == NULL && tst_msg_has("past the parent's 0 bytes", NULL),
          "[%s] one element of a NULL-wrapped empty buffer: %s \"%s\"", d->name, lmk_status_name(st), lmk_last_error());
    char c = 0;
    CHECK(lmk_buffer_read(v, 0, &c, 0) == LMK_OK && lmk_buffer_write(v, 0, &c, 0) == LMK_OK,
          "[%s] 0-byte read and write of the empty view", d->name);
    lmk_buffer_free(bad);
    lmk_buffer_free(sv);
    lmk_buffer_free(v);
    lmk_buffer_free(empty);
}

/* Buffers with no elements (lmk.h: a view's byte length is 0 when an axis is 0). Whatever the
 * other axes and strides, an empty view spans 0 bytes, counts 0 elements and is contiguous (it has
 * no element out of order); a dense view of a shape with a 0 axis holds 0 bytes whatever the other
 * axes. Every op rejects an empty operand where its shape asks for elements, naming it and writing
 * nothing, and lmk_attn_prologue takes caches of 0 rows (strided, dense or a NULL wrap) as caches
 * that every slot misses: the call succeeds and writes q_out and k_out only. */
/* A call given an empty operand: INVALID_ARGUMENT with a message naming the op and the operand. */
static void empty_rejected(const tst_dev *d, const char *what, const char *op, const char *operand, lmk_status st)
{
    CHECK(st == LMK_ERR_INVALID_ARGUMENT && tst_msg_has(op, operand, NULL),
          "[%s] %s with %s as %s: %s \"%s\" (want INVALID_ARGUMENT naming %s)", d->name, op, what, operand,
          lmk_status_name(st), lmk_last_error(), operand);
}

static void test_empty(tst_dev *d)
{
    lmk_buffer *parent = tst_buf(d->dev, LMK_U8, NULL, 0, 4096, 0, NULL, 0, TST_POISON);
    if (!parent)
        return;
    static const struct {
        int ndim;
        size_t shape[3], strides[3];
        const char *what;
    } cs[] = {
        {3, {0, 2, 16}, {100, 40, 1}, "[0, 2, 16] strides [100, 40, 1]"},
        {3, {2, 0, 16}, {100, 40, 1}, "[2, 0, 16] strides [100, 40, 1]"},
        {3, {2, 2, 0}, {100, 40, 3}, "[2, 2, 0] strides [100, 40, 3]"},
        {3, {0, 4, 5}, {1, 5, 2}, "[0, 4, 5] strides [1, 5, 2]"},
        {2, {0, SIZE_MAX}, {1, 2}, "[0, 2^64 - 1] strides [1, 2] (the span of axis 1 alone would overflow)"},
        {2, {SIZE_MAX / 2, 0}, {4, 1}, "[2^63 - 1, 0] strides [4, 1]"},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        char what[400];
        snprintf(what, sizeof what, "[%s] an empty view %s", d->name, cs[i].what);
        lmk_buffer *v = view_ok(what, parent, 4096, LMK_BF16, cs[i].shape, cs[i].strides, cs[i].ndim);
        CHECK(v && lmk_buffer_byte_len(v) == 0 && lmk_buffer_element_count(v) == 0 && lmk_buffer_is_contiguous(v) == 1,
              "%s: byte_len %zu, count %zu, contiguous %d (want 0, 0, 1)", what, v ? lmk_buffer_byte_len(v) : 0,
              v ? lmk_buffer_element_count(v) : 0, v ? lmk_buffer_is_contiguous(v) : -1);
        lmk_buffer_free(v);
    }
    const size_t big0[3] = {SIZE_MAX, 2, 0};
    lmk_buffer *dv = NULL;
    lmk_status st = lmk_buffer_view(parent, 0, LMK_F32, big0, 3, &dv);
    CHECK(st == LMK_OK && lmk_buffer_byte_len(dv) == 0 && lmk_buffer_element_count(dv) == 0,
          "[%s] a dense view [2^64 - 1, 2, 0] (0 bytes): %s \"%s\"", d->name, lmk_status_name(st), lmk_last_error());
    lmk_buffer_free(dv);

    /* The ops: an empty strided view and an empty dense buffer where an operand must hold elements. */
    const size_t e_shape[3] = {0, 2, 16}, e_str[3] = {100, 40, 1};
    lmk_buffer *ev = NULL, *ed = NULL, *en = NULL;
    const size_t shape3[3] = {2, 2, 16};
    lmk_buffer *x = tst_buf(d->dev, LMK_BF16, shape3, 3, 128, 0, NULL, 0, 0x3F);
    lmk_buffer *y = tst_buf(d->dev, LMK_BF16, shape3, 3, 128, 0, NULL, 0, TST_POISON);
    lmk_buffer *y2 = tst_buf(d->dev, LMK_BF16, shape3, 3, 128, 0, NULL, 0, TST_POISON);
    const int32_t pos_h[2] = {3, 4}, slots_h[2] = {0, 1};
    lmk_buffer *pos = tst_buf(d->dev, LMK_I32, NULL, 0, 8, 0, pos_h, 8, -1);
    lmk_buffer *slots = tst_buf(d->dev, LMK_I32, NULL, 0, 8, 0, slots_h, 8, -1);
    if (!x || !y || !y2 || !pos || !slots ||
        !TST_REQUIRE(lmk_buffer_view_strided(parent, 64, LMK_BF16, e_shape, e_str, 3, &ev) == LMK_OK &&
                         lmk_buffer_alloc(d->dev, 0, LMK_BF16, NULL, 0, &ed) == LMK_OK &&
                         lmk_buffer_wrap(d->dev, NULL, 0, LMK_BF16, NULL, 0, &en) == LMK_OK,
                     "[%s] empty buffers: %s", d->name, lmk_last_error()))
        goto done;
    const lmk_buffer *empties[3] = {ev, ed, en};
    static const char *const enames[3] = {"an empty strided view", "a 0-byte buffer", "a NULL-wrapped empty buffer"};
    const lmk_rope_params rp = {.head_dim = 16, .rope_dim = 16, .n_heads = 2, .seq_len = 2, .freq_base = 1e4f,
                                .mode = LMK_ROPE_NEOX, .n_k_heads = 2};
    const lmk_rope_multi_params mp = {.head_dim = 16, .rope_dim = 16, .n_heads = 2, .seq_len = 2, .freq_base = 1e4f,
                                      .mode = LMK_ROPE_MROPE, .sections = {3, 3, 2, 0}};
    const lmk_rms_norm_params np = {.eps = 1e-6f};
    const lmk_repeat_heads_params hp = {2, 2, 2, 16, LMK_REPEAT_TILED};
    const lmk_repeat_tiled_params tp = {2, 2, 2, 16};
    for (int e = 0; e < 3; e++) {
        lmk_buffer *E = (lmk_buffer *)(uintptr_t)empties[e];
        const lmk_attn_prologue_io io = {.q_in = x, .k_in = E, .positions = pos, .q_out = y, .k_out = y2};
        empty_rejected(d, enames[e], "repeat_tiled", "src", lmk_repeat_tiled(d->stream, E, y, &tp));
        empty_rejected(d, enames[e], "repeat_tiled", "dst", lmk_repeat_tiled(d->stream, x, E, &tp));
        empty_rejected(d, enames[e], "repeat_heads", "src", lmk_repeat_heads(d->stream, E, y, &hp));
        empty_rejected(d, enames[e], "repeat_heads", "dst", lmk_repeat_heads(d->stream, x, E, &hp));
        empty_rejected(d, enames[e], "rope", "q_in", lmk_rope(d->stream, E, NULL, pos, NULL, y, NULL, &rp));
        empty_rejected(d, enames[e], "rope", "q_out", lmk_rope(d->stream, x, NULL, pos, NULL, E, NULL, &rp));
        empty_rejected(d, enames[e], "rope_multi", "input", lmk_rope_multi(d->stream, E, y, pos, &mp));
        empty_rejected(d, enames[e], "attn_prologue", "k_in", lmk_attn_prologue(d->stream, &io, &rp, &np));
        lmk_stream_sync(d->stream);
        unsigned char *gy = tst_read_all(y), *gy2 = tst_read_all(y2), *gp = tst_read_all(parent);
        CHECK(gy && gy2 && gp && tst_find_not(gy, 0, 128, TST_POISON) < 0 && tst_find_not(gy2, 0, 128, TST_POISON) < 0 &&
                  tst_find_not(gp, 0, 4096, TST_POISON) < 0,
              "[%s] rejected calls with %s wrote bytes", d->name, enames[e]);
        free(gy), free(gy2), free(gp);

        /* Caches of 0 rows: every slot misses; q_out and k_out are written. */
        const lmk_attn_prologue_io cio = {.q_in = x, .k_in = x, .v_in = x, .positions = pos, .slots = slots,
                                          .q_out = y, .k_out = y2, .k_cache = E, .v_cache = E};
        lmk_clear_error();
        st = lmk_attn_prologue(d->stream, &cio, &rp, &np);
        if (st == LMK_OK)
            st = lmk_stream_sync(d->stream);
        gy = tst_read_all(y), gy2 = tst_read_all(y2), gp = tst_read_all(parent);
        CHECK(st == LMK_OK && gy && gy2 && gp && tst_count_unwritten(gy, 64, 2, TST_POISON) == 0 &&
                  tst_count_unwritten(gy2, 64, 2, TST_POISON) == 0 && tst_find_not(gp, 0, 4096, TST_POISON) < 0,
              "[%s] attn_prologue with caches of 0 rows (%s): %s \"%s\"", d->name, enames[e], lmk_status_name(st),
              lmk_last_error());
        free(gy), free(gy2), free(gp);
        lmk_buffer_free(y), lmk_buffer_free(y2);
        y = tst_buf(d->dev, LMK_BF16, shape3, 3, 128, 0, NULL, 0, TST_POISON);
        y2 = tst_buf(d->dev, LMK_BF16, shape3, 3, 128, 0, NULL, 0, TST_POISON);
        if (!y || !y2)
            break;
    }
done:
    lmk_buffer_free(ev), lmk_buffer_free(ed), lmk_buffer_free(en);
    lmk_buffer_free(x), lmk_buffer_free(y), lmk_buffer_free(y2), lmk_buffer_free(pos), lmk_buffer_free(slots);
    lmk_buffer_free(parent);
}

static void test_buffer_api(tst_dev *d)
{
    lmk_buffer *parent = tst_buf(d->dev, LMK_U8, NULL, 0, 4096, 0, NULL, 0, 0);
    if (!parent)
        return;
    test_round_trip(d, parent);
    test_view_rejects(d, parent);
    test_contiguous(d, parent);
    lmk_buffer_free(parent);
    test_null_wrapped(d);
    test_empty(d);
}

/* ------------------------------------------------------------------------------------------------
 * 2. the overlap rule through lmk_rope: an engine that runs one layout
 * ---------------------------------------------------------------------------------------------- */

#define N_PARENTS 3

/* One operand of lmk_rope: a [T, heads, D] view at element offset `off` of parent `parent`
 * (-1: absent) with element strides tok and head. */
typedef struct opnd {
    int parent;
    size_t off, tok, head;
} opnd;

static const opnd k_none = {-1, 0, 0, 0};

typedef struct lay_case {
    const char *what;
    lmk_rope_params p;
    lmk_dtype dtype;
    size_t parent_el[N_PARENTS]; /* elements of dtype; 0: unused */
    opnd q_in, q_out, k_in, k_out;
    int pos_parent;              /* -1: positions in their own buffer; else an i32 view of that parent */
    size_t pos_off;              /* byte offset of that view */
    bool poison_gaps;            /* bytes outside every operand's elements start as TST_POISON */
    const char *rej1, *rej2;     /* NULL: the call must be accepted; else words its message must hold */
} lay_case;

static bool is_multi(lmk_rope_mode m)
{
    return m == LMK_ROPE_MROPE || m == LMK_ROPE_IMROPE || m == LMK_ROPE_VISION;
}

static const char *mode_name(lmk_rope_mode m)
{
    return m == LMK_ROPE_NEOX ? "neox" : m == LMK_ROPE_IMROPE ? "imrope" : m == LMK_ROPE_MROPE ? "mrope" : "mode?";
}

/* Marks (in mask, one flag per byte of a parent) the bytes of operand o's elements. */
static void mark(unsigned char *mask, const opnd *o, size_t T, size_t heads, size_t D, size_t es)
{
    for (size_t t = 0; t < T; t++)
        for (size_t h = 0; h < heads; h++)
            memset(mask + (o->off + t * o->tok + h * o->head) * es, 1, D * es);
}

/* The state of one run: host copies of the parents as they were (orig) and as they came back (got),
 * device parents, the views (one per distinct operand, so equal operands share a handle: in
 * place), positions. */
typedef struct lay_run {
    const lay_case *c;
    size_t es, bytes[N_PARENTS], n_pos;
    unsigned char *orig[N_PARENTS], *got[N_PARENTS];
    lmk_buffer *par[N_PARENTS], *view[4], *pos;
    int32_t *pos_host, *pos_got;
} lay_run;

static const opnd *operand(const lay_case *c, int i)
{
    return i == 0 ? &c->q_in : i == 1 ? &c->q_out : i == 2 ? &c->k_in : &c->k_out;
}

/* Field by field: the struct's padding after parent is not part of its value (MemorySanitizer
 * reported a memcmp that read it, make test-msan). */
static bool same_opnd(const opnd *a, const opnd *b)
{
    return a->parent == b->parent && a->off == b->off && a->tok == b->tok && a->head == b->head;
}

static uint32_t heads_of(const lay_case *c, int i)
{
    return i < 2 ? c->p.n_heads : c->p.n_k_heads;
}

/* Host parents filled with floats in [-2, 2) (poisoned outside the operands when asked), their
 * device copies, the views and the positions. False after a failed TST_REQUIRE. */
static bool lay_setup(tst_dev *d, lay_run *r, tst_rng *rng)
{
    const lay_case *c = r->c;
    const size_t T = c->p.seq_len, D = c->p.head_dim;
    r->es = lmk_dtype_size(c->dtype);
    for (int i = 0; i < N_PARENTS; i++) {
        if (!c->parent_el[i])
            continue;
        r->bytes[i] = c->parent_el[i] * r->es;
        r->orig[i] = malloc(r->bytes[i]);
        unsigned char *mask = calloc(r->bytes[i], 1);
        if (!TST_REQUIRE(r->orig[i] && mask, "out of host memory")) {
            free(mask);
            return false;
        }
        tst_fill_float(rng, c->dtype, r->orig[i], c->parent_el[i], -2.0, 2.0);
        for (int o = 0; o < 4 && c->poison_gaps; o++)
            if (operand(c, o)->parent == i)
                mark(mask, operand(c, o), T, heads_of(c, o), D, r->es);
        for (size_t b = 0; b < r->bytes[i] && c->poison_gaps; b++)
            if (!mask[b])
                r->orig[i][b] = TST_POISON;
        free(mask);
        r->par[i] = tst_buf(d->dev, LMK_U8, NULL, 0, r->bytes[i], 0, r->orig[i], r->bytes[i], -1);
        if (!r->par[i])
            return false;
    }
    for (int o = 0; o < 4; o++) {
        const opnd *x = operand(c, o);
        for (int e = 0; e < o && x->parent >= 0 && !r->view[o]; e++)
            if (same_opnd(x, operand(c, e)) && heads_of(c, o) == heads_of(c, e))
                r->view[o] = r->view[e];
        if (x->parent < 0 || r->view[o])
            continue;
        const size_t shape[3] = {T, heads_of(c, o), D}, strides[3] = {x->tok, x->head, 1};
        const lmk_status st =
            lmk_buffer_view_strided(r->par[x->parent], x->off * r->es, c->dtype, shape, strides, 3, &r->view[o]);
        if (!TST_REQUIRE(st == LMK_OK, "%s: view of operand %d: %s", c->what, o, lmk_last_error()))
            return false;
    }
    r->n_pos = (is_multi(c->p.mode) ? 4 : 1) * T;
    r->pos_host = malloc(r->n_pos * sizeof *r->pos_host);
    if (!TST_REQUIRE(r->pos_host, "out of host memory"))
        return false;
    for (size_t i = 0; i < r->n_pos; i++)
        r->pos_host[i] = (int32_t)tst_rng_below(rng, 1u << 16) - 1000;
    const size_t pos_shape[1] = {r->n_pos};
    if (c->pos_parent >= 0)
        return TST_REQUIRE(lmk_buffer_view(r->par[c->pos_parent], c->pos_off, LMK_I32, pos_shape, 1, &r->pos) ==
                               LMK_OK,
                           "positions view: %s", lmk_last_error());
    r->pos = tst_buf(d->dev, LMK_I32, pos_shape, 1, r->n_pos * 4, 0, r->pos_host, r->n_pos * 4, -1);
    return r->pos != NULL;
}

/* Runs the call and reads every parent (and own positions buffer) back. Returns the status. */
static lmk_status lay_exec(tst_dev *d, lay_run *r)
{
    lmk_clear_error();
    lmk_status st = lmk_rope(d->stream, r->view[0], r->view[2], r->pos, NULL, r->view[1], r->view[3], &r->c->p);
    const lmk_status sync = lmk_stream_sync(d->stream);
    if (st == LMK_OK)
        st = sync;
    for (int i = 0; i < N_PARENTS; i++) {
        free(r->got[i]);
        r->got[i] = r->par[i] ? tst_read_all(r->par[i]) : NULL;
    }
    if (r->c->pos_parent < 0) {
        free(r->pos_got);
        r->pos_got = tst_read_all(r->pos);
    }
    return st;
}

static void lay_free(lay_run *r)
{
    for (int o = 0; o < 4; o++) {
        bool shared = false;
        for (int e = 0; e < o; e++)
            shared = shared || r->view[e] == r->view[o];
        if (!shared)
            lmk_buffer_free(r->view[o]);
    }
    lmk_buffer_free(r->pos);
    for (int i = 0; i < N_PARENTS; i++) {
        lmk_buffer_free(r->par[i]);
        free(r->orig[i]);
        free(r->got[i]);
    }
    free(r->pos_host);
    free(r->pos_got);
}

/* The first byte, over every parent, that is outside the outputs' elements (all bytes when
 * outputs_too) and differs from what it held before; -1 if none. *which: its parent. */
static long long lay_first_touched(const lay_run *r, bool outputs_too, int *which)
{
    const lay_case *c = r->c;
    for (int i = 0; i < N_PARENTS; i++) {
        if (!r->par[i])
            continue;
        if (!r->got[i]) {
            *which = i;
            return 0;
        }
        unsigned char *mask = calloc(r->bytes[i], 1);
        if (!mask) {
            *which = i;
            return 0;
        }
        for (int o = 1; o < 4 && !outputs_too; o += 2)
            if (operand(c, o)->parent == i)
                mark(mask, operand(c, o), c->p.seq_len, heads_of(c, o), c->p.head_dim, r->es);
        long long at = -1;
        for (size_t b = 0; b < r->bytes[i] && at < 0; b++)
            if (!mask[b] && r->got[i][b] != r->orig[i][b])
                at = (long long)b;
        free(mask);
        if (at >= 0) {
            *which = i;
            return at;
        }
    }
    return -1;
}

static void lay_name(char *buf, size_t n, const lay_case *c)
{
    snprintf(buf, n, "%s: rope %s T=%u hq=%u hk=%u D=%u R=%u %s", c->what, mode_name(c->p.mode), c->p.seq_len,
             c->p.n_heads, c->k_in.parent >= 0 ? c->p.n_k_heads : 0, c->p.head_dim, c->p.rope_dim,
             lmk_dtype_name(c->dtype));
}

/* An accepted call: outputs against the float64 reference, every other byte as it was, and a
 * second run from the same inputs bit-identical to the first. */
static void check_accepted(tst_dev *d, lay_run *r, const char *name, uint64_t seed)
{
    const lay_case *c = r->c;
    const bool has_k = c->k_in.parent >= 0;
    lmk_tensor3 t[4];
    memset(t, 0, sizeof t);
    for (int o = 0; o < (has_k ? 4 : 2); o++) {
        const opnd *x = operand(c, o);
        t[o] = (lmk_tensor3){.data = r->orig[x->parent] + x->off * r->es, .n = {c->p.seq_len, heads_of(c, o),
                             c->p.head_dim}, .stride = {x->tok, x->head, 1}, .es = r->es};
    }
    const lmk_rope_args a = lmk_rope_args_for(&c->p, c->dtype, t, has_k, r->pos_host, LMK_I32, NULL);
    const void *const got[2] = {r->got[c->q_out.parent] + c->q_out.off * r->es,
                                has_k ? r->got[c->k_out.parent] + c->k_out.off * r->es : NULL};
    char msg[512];
    CHECK(tst_rope_check(&a, got, 1e-5, msg, sizeof msg), "%s [%s] seed 0x%016" PRIx64 ": %s", name, d->name, seed,
          msg);
    int which = -1;
    const long long at = lay_first_touched(r, false, &which);
    const bool pos_ok = r->pos_got && memcmp(r->pos_got, r->pos_host, r->n_pos * 4) == 0;
    CHECK(at < 0 && pos_ok, "%s [%s]: byte %lld of parent %d (outside the outputs) changed%s", name, d->name, at, which,
          pos_ok ? "" : "; the positions changed");
    /* Determinism: the same inputs again give the same bits (vLLM #52415 was nondeterministic). */
    unsigned char *first[N_PARENTS] = {NULL};
    bool same = true;
    for (int i = 0; i < N_PARENTS; i++)
        if (r->par[i]) {
            first[i] = r->got[i];
            r->got[i] = NULL;
            same = same && first[i] && lmk_buffer_write(r->par[i], 0, r->orig[i], r->bytes[i]) == LMK_OK;
        }
    const lmk_status st = same ? lay_exec(d, r) : LMK_ERR_DEVICE;
    for (int i = 0; i < N_PARENTS; i++) {
        same = same && (!r->par[i] || (r->got[i] && memcmp(first[i], r->got[i], r->bytes[i]) == 0));
        free(first[i]);
    }
    CHECK(st == LMK_OK && same, "%s [%s]: a second run is not bit-identical (%s)", name, d->name, lmk_status_name(st));
}

static void run_layout(tst_dev *d, const lay_case *c)
{
    lay_run r;
    memset(&r, 0, sizeof r);
    r.c = c;
    const uint64_t seed = tst_case_seed();
    tst_rng rng = tst_rng_make(seed);
    char name[256];
    lay_name(name, sizeof name, c);
    if (!lay_setup(d, &r, &rng)) {
        lay_free(&r);
        return;
    }
    const lmk_status st = lay_exec(d, &r);
    if (c->rej1) {
        int which = -1;
        const long long at = lay_first_touched(&r, true, &which);
        const bool pos_ok = c->pos_parent >= 0 || (r.pos_got && memcmp(r.pos_got, r.pos_host, r.n_pos * 4) == 0);
        CHECK(st == LMK_ERR_INVALID_ARGUMENT && tst_msg_has("rope: ", c->rej1, c->rej2, NULL) && at < 0 && pos_ok,
              "%s [%s]: %s \"%s\" (want INVALID_ARGUMENT naming \"%s\" and \"%s\", nothing written)%s", name, d->name,
              lmk_status_name(st), lmk_last_error(), c->rej1, c->rej2 ? c->rej2 : "",
              at < 0 && pos_ok ? "" : "; a byte was written");
    } else if (CHECK(st == LMK_OK, "%s [%s]: %s \"%s\"%s", name, d->name, lmk_status_name(st), lmk_last_error(),
                     st == LMK_ERR_UNSUPPORTED ? " [UNSUPPORTED: the contract accepts this call; this backend's rope "
                                                 "kernel does not cover it yet]"
                                               : "")) {
        check_accepted(d, &r, name, seed);
    }
    lay_free(&r);
}

/* ------------------------------------------------------------------------------------------------
 * 2. the overlap rule itself, against a byte-by-byte count
 * ---------------------------------------------------------------------------------------------- */

/* Marks the bytes of t's elements (relative to base) in mask; t lies inside mask's n bytes. */
static void mark_t3(unsigned char *mask, const unsigned char *base, const lmk_tensor3 *t, unsigned char bit)
{
    for (size_t a = 0; a < t->n[0]; a++)
        for (size_t h = 0; h < t->n[1]; h++)
            for (size_t i = 0; i < t->n[2] * t->es; i++)
                mask[(size_t)(t->data - base) + (a * t->stride[0] + h * t->stride[1]) * t->es + i] |= bit;
}

/* lmk_tensor3_overlap on random token-major layouts of two tensors in one buffer, against the
 * bytes their elements cover: never false where they share a byte (lmk.h: conservative, never
 * wrong), and exact for the layouts engines use: one token stride, every head inside it, the two
 * tensors starting within one token stride of each other with equal token counts (side by side in
 * one row, or interleaved head by head as GPT-NeoX's [T, H, 3, D] and [rows, Hk, 2, D] caches),
 * with one head stride or two, up to 200 heads each (operand.c once merged more than 64 heads
 * into one interval and reported disjoint interleaved tensors as overlapping). */
static void test_overlap_exact(void)
{
    const uint64_t seed = tst_case_seed();
    tst_rng r = tst_rng_make(seed);
    enum { N = 1 << 16 };
    unsigned char *mask = malloc(N), *base = malloc(N);
    if (!TST_REQUIRE(mask && base, "out of host memory")) {
        free(mask), free(base);
        return;
    }
    size_t wrong = 0, inexact = 0, n_exact = 0, n_overlap = 0;
    char first[320] = "";
    for (int it = 0; it < 20000; it++) {
        const size_t es = (size_t)1 << tst_rng_below(&r, 3);
        const bool same_hs = tst_rng_below(&r, 4) != 0;
        const size_t ha = 1 + tst_rng_below(&r, it % 3 ? 8 : 200), hb = 1 + tst_rng_below(&r, it % 3 ? 8 : 200);
        const size_t da = 1 + tst_rng_below(&r, 12), db = 1 + tst_rng_below(&r, 12);
        const size_t hs_a = da + tst_rng_below(&r, 3 * db + 3);
        const size_t hs_b = same_hs ? hs_a : db + tst_rng_below(&r, 3 * da + 3);
        const size_t fa = (ha - 1) * hs_a + da, fb = (hb - 1) * hs_b + db; /* per-token footprints */
        const size_t period = (fa > fb ? fa : fb) + tst_rng_below(&r, 16);
        const size_t T = 1 + tst_rng_below(&r, 4), tb = tst_rng_below(&r, 4) ? T : 1 + tst_rng_below(&r, 4);
        const size_t span = ((T > tb ? T : tb) + 1) * period; /* both start inside the first period */
        if (span * es > N)
            continue;
        const size_t off_a = tst_rng_below(&r, (uint32_t)period), off_b = tst_rng_below(&r, (uint32_t)period);
        lmk_tensor3 a = {.data = base + off_a * es, .n = {T, ha, da}, .stride = {period, hs_a, 1}, .es = es};
        lmk_tensor3 b = {.data = base + off_b * es, .n = {tb, hb, db}, .stride = {period, hs_b, 1}, .es = es};
        memset(mask, 0, span * es);
        mark_t3(mask, base, &a, 1);
        mark_t3(mask, base, &b, 2);
        bool meet = false;
        for (size_t i = 0; i < span * es && !meet; i++)
            meet = mask[i] == 3;
        const bool got = lmk_tensor3_overlap(&a, &b), got2 = lmk_tensor3_overlap(&b, &a);
        const bool exact_class = tb == T && T >= 2;
        n_overlap += meet;
        n_exact += exact_class;
        if ((meet && (!got || !got2)) || (exact_class && (got != meet || got2 != meet))) {
            if (meet && (!got || !got2))
                wrong++;
            else
                inexact++;
            if (!first[0])
                snprintf(first, sizeof first,
                         "a: at %zu [%zu, %zu, %zu] strides [%zu, %zu, 1], b: at %zu [%zu, %zu, %zu] strides [%zu, %zu, "
                         "1], %zu-byte elements: bytes %s, overlap(a, b) %d, overlap(b, a) %d",
                         off_a, T, ha, da, period, hs_a, off_b, tb, hb, db, period, hs_b, es,
                         meet ? "shared" : "disjoint", got, got2);
        }
    }
    CHECK(wrong == 0 && inexact == 0 && n_exact > 1000 && n_overlap > 100,
          "lmk_tensor3_overlap seed 0x%016" PRIx64 ": %zu layouts reported disjoint although they share a byte, %zu "
          "layouts of the exact class answered wrongly (%zu in that class, %zu overlapping); first: %s",
          seed, wrong, inexact, n_exact, n_overlap, first);
    free(mask), free(base);
}

/* ------------------------------------------------------------------------------------------------
 * 2. the layouts
 * ---------------------------------------------------------------------------------------------- */

/* Llama-3.1-8B (NEOX, 32 q / 8 kv heads of 128) and Qwen3-VL-8B (IMROPE, same heads): packed QKV. */
static lmk_rope_params qkv_params(lmk_rope_mode mode, uint32_t T)
{
    if (mode == LMK_ROPE_NEOX)
        return (lmk_rope_params){.head_dim = 128, .rope_dim = 128, .n_heads = 32, .seq_len = T, .freq_base = 5e5f,
                                 .mode = LMK_ROPE_NEOX, .n_k_heads = 8};
    return (lmk_rope_params){.head_dim = 128, .rope_dim = 128, .n_heads = 32, .seq_len = T, .freq_base = 5e6f,
                             .mode = LMK_ROPE_IMROPE, .sections = {24, 20, 20, 0}, .n_k_heads = 8};
}

/* Qwen3.5/3.6-27B full attention: 24 q / 4 kv heads of 256, rope_dim 64 (IMROPE [11, 11, 10]; NEOX
 * for the same layout as Qwen3-Next's partial rotary). q comes from a [T, 24, 2 * 256] q|gate. */
static lmk_rope_params gate_params(lmk_rope_mode mode, uint32_t T)
{
    return (lmk_rope_params){.head_dim = 256, .rope_dim = 64, .n_heads = 24, .seq_len = T, .freq_base = 1e7f,
                             .mode = mode, .sections = {11, 11, 10, 0}, .n_k_heads = 4};
}

/* The accepted layouts of one mode and dtype. */
static void accepted_layouts(tst_dev *d, lmk_rope_mode mode, lmk_dtype dt, uint32_t T)
{
    const lmk_rope_params pq = qkv_params(mode, T), pg = gate_params(mode, T);
    const size_t D = 128, hq = 32, hk = 8, row = (hq + 2 * hk) * D, qkv = T * row + 8;
    const opnd q = {0, 0, row, D}, k = {0, hq * D, row, D};
    const opnd q_dense = {1, 0, hq * D, D}, k_dense = {2, 0, hk * D, D};
    const size_t q_el = T * hq * D, k_el = T * hk * D;
    const lay_case qkv_cases[] = {
        {"packed QKV, q in place", pq, dt, {qkv}, q, q, k_none, k_none, -1, 0, false, NULL, NULL},
        {"packed QKV, q and k in place (v untouched)", pq, dt, {qkv}, q, q, k, k, -1, 0, false, NULL, NULL},
        {"packed QKV -> dense q and k", pq, dt, {qkv, q_el, k_el}, q, q_dense, k, k_dense, -1, 0, false, NULL, NULL},
        {"dense q and k -> packed QKV rows", pq, dt, {qkv, q_el, k_el}, q_dense, q, k_dense, k, -1, 0, false, NULL, NULL},
        {"k_in = the first 8 heads of q_in (inputs may overlap)", pq, dt, {qkv, q_el, k_el}, q, q_dense, q, k_dense,
         -1, 0, false, NULL, NULL},
    };
    for (size_t i = 0; i < sizeof qkv_cases / sizeof qkv_cases[0]; i++)
        run_layout(d, &qkv_cases[i]);

    /* [q | gate]: head stride 2D (q of head h at h * 2D, its gate after it). */
    const size_t G = 256, gq = 24, gk = 4, grow = gq * 2 * G;
    const opnd gate_q = {0, 0, grow, 2 * G}, gk_dense = {1, 0, gk * G, G}, gq_dense = {2, 0, gq * G, G};
    const lay_case gate_cases[] = {
        {"q of [q | gate] in place (gate untouched)", pg, dt, {T * grow}, gate_q, gate_q, k_none, k_none, -1, 0, false,
         NULL, NULL},
        /* SGLang #20559: q and k with different head strides (2D and D) in one launch. */
        {"SGLang #20559: q of [q | gate] and dense k, in place", pg, dt, {T * grow, T * gk * G}, gate_q, gate_q,
         gk_dense, gk_dense, -1, 0, false, NULL, NULL},
        {"SGLang #20559: q of [q | gate] -> dense q, dense k in place", pg, dt, {T * grow, T * gk * G, T * gq * G},
         gate_q, gq_dense, gk_dense, gk_dense, -1, 0, false, NULL, NULL},
    };
    for (size_t i = 0; i < sizeof gate_cases / sizeof gate_cases[0]; i++)
        run_layout(d, &gate_cases[i]);

    /* vLLM #16658: the kernel ignored the query's token stride. Rows padded by 40 elements whose
     * bytes are poisoned: rows must come out right and the pads stay poisoned. */
    const size_t prow = hq * D + 40 + hk * D + 24;
    const opnd pq_v = {0, 0, prow, D}, pk_v = {0, hq * D + 40, prow, D}, out_pad = {1, 3, hq * D + 72, D};
    const lay_case pad_cases[] = {
        {"vLLM #16658: q and k in padded rows, in place", pq, dt, {T * prow}, pq_v, pq_v, pk_v, pk_v, -1, 0, true, NULL,
         NULL},
        {"vLLM #16658: padded q rows -> padded q rows of another stride", pq, dt, {T * prow, T * (hq * D + 72) + 3},
         pq_v, out_pad, k_none, k_none, -1, 0, true, NULL, NULL},
    };
    for (size_t i = 0; i < sizeof pad_cases / sizeof pad_cases[0]; i++)
        run_layout(d, &pad_cases[i]);
}

/* Dense operands in separate buffers, MROPE/IMROPE, in place and out of place: the layouts every
 * backend had before strided operands, so they check this file's engine and reference plumbing. */
static void dense_baseline(tst_dev *d, lmk_dtype dt)
{
    const lmk_rope_params pm = {.head_dim = 128, .rope_dim = 128, .n_heads = 28, .seq_len = 9, .freq_base = 1e6f,
                                .mode = LMK_ROPE_MROPE, .sections = {16, 24, 24, 0}, .n_k_heads = 4};
    const lmk_rope_params pi = gate_params(LMK_ROPE_IMROPE, 9);
    const opnd mq = {0, 0, 28 * 128, 128}, mk = {1, 0, 4 * 128, 128}, mq2 = {2, 0, 28 * 128, 128};
    const opnd iq = {0, 0, 24 * 256, 256}, ik = {1, 0, 4 * 256, 256};
    const lay_case cs[] = {
        {"dense baseline, q and k in place", pm, dt, {9 * 28 * 128, 9 * 4 * 128}, mq, mq, mk, mk, -1, 0, false, NULL,
         NULL},
        {"dense baseline, q out of place", pm, dt, {9 * 28 * 128, 0, 9 * 28 * 128}, mq, mq2, k_none, k_none, -1, 0,
         false, NULL, NULL},
        {"dense baseline, qwen3.5 q and k in place", pi, dt, {9 * 24 * 256, 9 * 4 * 256}, iq, iq, ik, ik, -1, 0, false,
         NULL, NULL},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        run_layout(d, &cs[i]);
}

/* GPT-NeoX's fused QKV [T, H, 3, D]: q, k and v of a head side by side, q and k rotated in place,
 * v untouched. With 8, 65 and 128 heads: operand.c once listed at most 64 heads one by one and
 * merged the rest into one interval, so the disjoint q and k of 65 heads were reported as an
 * overlap. A k_out moved one element back onto the last element of q's heads overlaps. */
static void neox_layouts(tst_dev *d, lmk_rope_mode mode, lmk_dtype dt)
{
    static const uint32_t heads[] = {8, 65, 128};
    const uint32_t T = 3, D = 32;
    for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++) {
        const uint32_t H = heads[i];
        const size_t row = 3 * (size_t)H * D;
        const lmk_rope_params p = {.head_dim = D, .rope_dim = D, .n_heads = H, .seq_len = T, .freq_base = 1e4f,
                                   .mode = mode, .sections = {6, 5, 5, 0}, .n_k_heads = H};
        const opnd q = {0, 0, row, 3 * D}, k = {0, D, row, 3 * D}, k_back = {1, D - 1, row, 3 * D};
        const opnd k_dense = {1, 0, (size_t)H * D, D};
        const lay_case cs[] = {
            {"GPT-NeoX [T, H, 3, D], q and k in place (v untouched)", p, dt, {T * row}, q, q, k, k, -1, 0, false, NULL,
             NULL},
            {"GPT-NeoX [T, H, 3, D]: q in place, k -> k_out one element back onto q's heads", p, dt,
             {T * row, T * row}, q, q, (opnd){1, D, row, 3 * D}, k_back, -1, 0, false, "k_out", "overlaps"},
            {"GPT-NeoX [T, H, 3, D]: q in place, k_out inside q_in's rows", p, dt, {T * row, T * (size_t)H * D},
             q, q, k_dense, (opnd){0, D - 1, row, 3 * D}, -1, 0, false, "q_out overlaps k_out", NULL},
        };
        for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++)
            run_layout(d, &cs[c]);
    }
}

/* Real overlaps, each rejected naming both operands (one for an output overlapping itself), with
 * no byte of any buffer written. A small packed QKV row: 4 q heads, 2 k, 2 v, D = 16. */
static void rejected_layouts(tst_dev *d, lmk_rope_mode mode, lmk_dtype dt)
{
    const uint32_t T = 5;
    const size_t D = 16, row = 8 * D, n = T * row;
    const lmk_rope_params p = {.head_dim = 16, .rope_dim = 16, .n_heads = 4, .seq_len = T, .freq_base = 1e4f,
                               .mode = mode, .sections = {3, 3, 2, 0}, .n_k_heads = 2};
    lmk_rope_params p22 = p;
    p22.n_heads = 2;
    const opnd q = {0, 0, row, D}, k = {0, 4 * D, row, D};
    const opnd qd = {1, 0, 4 * D, D}, kd = {2, 0, 2 * D, D};
    const size_t qn = T * 4 * D, kn = T * 2 * D;
    const lay_case cs[] = {
        {"k_out shares one element per token with q_in", p, dt, {n, qn, kn}, q, qd, k, (opnd){0, 4 * D - 1, row, D}, -1,
         0, false, "k_out overlaps q_in", NULL},
        {"k_out == q_out (one handle, 2 heads each)", p22, dt, {n, kn, kn}, q, kd, k, kd, -1, 0, false,
         "q_out overlaps k_out", NULL},
        {"k_out on q_out's memory (4 and 2 heads)", p, dt, {n, qn, kn}, q, qd, k, (opnd){1, 0, 4 * D, D}, -1, 0, false,
         "q_out overlaps k_out", NULL},
        {"q_out over the positions", p, dt, {n, qn, kn}, q, qd, k, kd, 1, 0, false, "q_out overlaps positions", NULL},
        {"k_out over the positions", p, dt, {n, qn, kn}, q, qd, k, kd, 2, 8, false, "k_out overlaps positions", NULL},
        {"q_out head stride D/2 < D", p, dt, {n, qn, kn}, q, (opnd){1, 0, 4 * D, D / 2}, k_none, k_none, -1, 0, false,
         "q_out has overlapping elements", "[5, 4, 16]"},
        {"q in place with head stride D/2", p, dt, {n}, (opnd){0, 0, row, D / 2}, (opnd){0, 0, row, D / 2}, k_none,
         k_none, -1, 0, false, "q_out has overlapping elements", NULL},
        {"q_out at q_in's address with other strides", p, dt, {n}, q, (opnd){0, 0, row, 2 * D}, k_none, k_none, -1, 0,
         false, "q_out overlaps q_in", "without being exactly it"},
        /* vLLM #52415: rows written twice. */
        {"vLLM #52415: q_out token stride 3D < its row of 4D", p, dt, {n, qn, kn}, q, (opnd){1, 0, 3 * D, D}, k_none,
         k_none, -1, 0, false, "q_out has overlapping elements", "[48, 16, 1]"},
        {"vLLM #52415: k_out token stride D < its row of 2D", p, dt, {n, qn, kn}, q, q, k, (opnd){2, 0, D, D}, -1, 0,
         false, "k_out has overlapping elements", NULL},
        {"k_out on q's last head in packed rows (q in place)", p, dt, {n, qn, kn}, q, q, kd, (opnd){0, 3 * D, row, D},
         -1, 0, false, "q_out overlaps k_out", NULL},
        {"k_in on q's last head in packed rows (q in place)", p, dt, {n, qn, kn}, q, q, (opnd){0, 3 * D, row, D}, kd,
         -1, 0, false, "q_out overlaps k_in", NULL},
        {"q and k in place but k_out shifted one element into v", p, dt, {n, qn, kn}, q, q, k,
         (opnd){0, 4 * D + 1, row, D}, -1, 0, false, "k_out overlaps k_in", "without being exactly it"},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        run_layout(d, &cs[i]);
}

int main(void)
{
    tst_program_seed();
    const double t0 = tst_now();
    tst_dev devs[TST_MAX_DEVS];
    const int n = tst_devs_open_isas(devs);
    test_overlap_exact();
    static const lmk_rope_mode modes[2] = {LMK_ROPE_NEOX, LMK_ROPE_IMROPE};
    static const lmk_dtype dtypes[2] = {LMK_F32, LMK_BF16};
    for (int i = 0; i < n; i++) {
        const int failed = harness_failed;
        tst_dev *d = &devs[i];
        if (!d->isa_variant)
            test_buffer_api(d);
        for (int t = 0; t < 2; t++) {
            dense_baseline(d, dtypes[t]);
            for (int m = 0; m < 2; m++) {
                accepted_layouts(d, modes[m], dtypes[t], 7);
                neox_layouts(d, modes[m], dtypes[t]);
                if (!d->isa_variant)
                    rejected_layouts(d, modes[m], dtypes[t]);
            }
        }
        if (!tst_quick())
            accepted_layouts(d, LMK_ROPE_IMROPE, LMK_BF16, 129);
        printf("[%s] %s: %s\n", d->name, lmk_device_name(d->dev),
               harness_failed == failed ? "all cases pass" : "FAILURES above");
    }
    tst_devs_close(devs, n);
    printf("test_strided: %.2f s\n", tst_now() - t0);
    return harness_summary();
}
