/*
 * operand.c - how ops see buffers: the operand rule and the element-exact overlap rule of lmk.h
 * ("Operands").
 *
 * An operand of logical shape [n0, n1, n2] is resolved into a pointer and three element strides.
 * Overlap is then decided on the bytes the elements occupy, not on extents, so that q and k rotated
 * in place inside one packed QKV row are accepted while a real overlap is rejected:
 *  - disjoint extents: no overlap;
 *  - otherwise, when both tensors are token-major with the same token stride (every row of one
 *    token sits inside one token stride, as for tensors side by side in one projection or cache
 *    row), the two per-token footprints are compared modulo the token stride, which is exact
 *    whenever the tensors share a token, and conservative otherwise. A footprint is its heads, an
 *    arithmetic progression of equal byte intervals (merged into one when heads touch). Two
 *    progressions with one step (q, k and v interleaved head by head: GPT-NeoX's [T, H, 3, D],
 *    [rows, Hk, 2, D] caches) are compared in O(1) for any number of heads, others interval by
 *    interval of the one with fewer; either way in fixed memory and exactly;
 *  - anything else whose extents meet is reported as overlapping (lmk.h allows that for layouts
 *    other than the side-by-side ones).
 */
#include "core/internal.h"

#include <stdio.h>
#include <string.h>

void lmk_format_dims(char *buf, size_t n, const size_t *v, int k)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < k && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, i ? ", %zu" : "%zu", v[i]);
}

lmk_status lmk_operand3(const char *op, const char *name, const lmk_buffer *b, size_t n0, size_t n1, size_t n2,
                        lmk_tensor3 *out)
{
    size_t count;
    if (lmk_mul_overflows(n0 * n1, n2, &count) || (n1 && n0 * n1 / n1 != n0))
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: %s shape [%zu, %zu, %zu] overflows size_t", op, name, n0, n1, n2);
    const size_t es = lmk_dtype_size(b->dtype);
    *out = (lmk_tensor3){.data = b->data, .n = {n0, n1, n2}, .es = es};
    if (b->ndim == 3 && b->shape[0] == n0 && b->shape[1] == n1 && b->shape[2] == n2 && (b->stride[2] == 1 || n2 == 1)) {
        out->stride[0] = b->stride[0];
        out->stride[1] = b->stride[1];
        out->stride[2] = 1;
        return LMK_OK;
    }
    if (b->dense && b->element_count == count) {
        out->stride[0] = n1 * n2;
        out->stride[1] = n2;
        out->stride[2] = 1;
        return LMK_OK;
    }
    char shape[96], strides[96];
    lmk_format_dims(shape, sizeof shape, b->shape, b->ndim);
    lmk_format_dims(strides, sizeof strides, b->stride, b->ndim);
    if (b->dense)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT,
                        "%s: %s element count %zu != %zu * %zu * %zu = %zu (shape [%s]; a dense buffer must hold "
                        "exactly that many elements, or be a [%zu, %zu, %zu] view with last stride 1)",
                        op, name, b->element_count, n0, n1, n2, count, shape, n0, n1, n2);
    return lmk_fail(LMK_ERR_INVALID_ARGUMENT,
                    "%s: %s has shape [%s] and strides [%s]: a strided operand must have shape exactly [%zu, %zu, "
                    "%zu] with last stride 1",
                    op, name, shape, strides, n0, n1, n2);
}

lmk_tensor3 lmk_operand_flat(const lmk_buffer *b)
{
    const size_t n = b->element_count;
    return (lmk_tensor3){.data = b->data, .n = {1, 1, n}, .stride = {n, n, 1}, .es = lmk_dtype_size(b->dtype)};
}

static size_t count_of(const lmk_tensor3 *t)
{
    return t->n[0] * t->n[1] * t->n[2];
}

/* Bytes from the first byte of element [0,0,0] to the end of the furthest element (0 if empty). */
static size_t span_bytes(const lmk_tensor3 *t)
{
    if (!count_of(t))
        return 0;
    size_t last = 0;
    for (int i = 0; i < 3; i++)
        last += (t->n[i] - 1) * t->stride[i];
    return (last + 1) * t->es;
}

bool lmk_tensor3_same(const lmk_tensor3 *a, const lmk_tensor3 *b)
{
    if (a->data != b->data || a->es != b->es)
        return false;
    for (int i = 0; i < 3; i++)
        if (a->n[i] != b->n[i] || (a->n[i] > 1 && a->stride[i] != b->stride[i]))
            return false;
    return true;
}

bool lmk_tensor3_self_overlaps(const lmk_tensor3 *t)
{
    /* Sort the axes by stride; with the inner ones packed into [0, reach), each outer stride must
     * step past everything inside. Exact for nested layouts, conservative for interleaved ones. */
    size_t n[3], s[3];
    int k = 0;
    for (int i = 0; i < 3; i++)
        if (t->n[i] > 1)
            n[k] = t->n[i], s[k] = t->stride[i], k++;
    for (int i = 1; i < k; i++)
        for (int j = i; j > 0 && s[j] < s[j - 1]; j--) {
            size_t x = s[j]; s[j] = s[j - 1]; s[j - 1] = x;
            x = n[j]; n[j] = n[j - 1]; n[j - 1] = x;
        }
    size_t reach = 1; /* elements covered by the axes inside the current one */
    for (int i = 0; i < k; i++) {
        if (s[i] < reach)
            return true;
        reach = (n[i] - 1) * s[i] + reach;
    }
    return false;
}

/* A per-token footprint relative to element [0, 0, 0]: n intervals [h * step, h * step + len),
 * h < n (one interval, n = 1, when the heads touch or overlap: their union). */
typedef struct heads_fp {
    size_t n, step, len;
} heads_fp;

static heads_fp heads_of(const lmk_tensor3 *t)
{
    const size_t row = t->n[2] * t->es, hs = t->stride[1] * t->es;
    if (t->n[1] <= 1 || hs <= row)
        return (heads_fp){1, 0, t->n[1] ? (t->n[1] - 1) * hs + row : 0};
    return (heads_fp){t->n[1], hs, row};
}

/* floor(x / d) for d > 0. */
static long long floor_div(long long x, long long d)
{
    return x >= 0 ? x / d : -((-x + d - 1) / d);
}

/* Whether an interval of a meets an interval of b shifted by c (c may be negative). Byte offsets
 * here are below a token stride, itself below 2^63, so nothing overflows.
 *  - One step (or a single interval on either side): interval h of a and g of b meet iff
 *    c - len_a < (h - g) * step < c + len_b, and h - g takes every integer of
 *    [-(n_b - 1), n_a - 1]: the test is on the smallest such k with k * step > c - len_a.
 *  - Two steps: for each interval [x, y) of the one with fewer, the first interval of the other
 *    that ends past x, h = floor((x - len) / step) + 1, must start before y. */
static bool heads_meet(const heads_fp *a, const heads_fp *b, long long c)
{
    if (a->n == 1 || b->n == 1 || a->step == b->step) {
        const long long step = (long long)(a->n > 1 ? a->step : b->step);
        const long long lo = c - (long long)a->len, hi = c + (long long)b->len; /* k * step in (lo, hi) */
        if (step == 0) /* one interval each */
            return lo < 0 && 0 < hi;
        long long k = floor_div(lo, step) + 1;
        if (k < -(long long)(b->n - 1))
            k = -(long long)(b->n - 1);
        return k <= (long long)(a->n - 1) && k * step < hi;
    }
    if (b->n > a->n) /* a meets b + c exactly where b meets a - c */
        return heads_meet(b, a, -c);
    const long long sa = (long long)a->step, sb = (long long)b->step;
    for (long long g = 0; g < (long long)b->n; g++) {
        const long long x = c + g * sb, h = x - (long long)a->len < 0 ? 0 : floor_div(x - (long long)a->len, sa) + 1;
        if (h < (long long)a->n && h * sa < x + (long long)b->len)
            return true;
    }
    return false;
}

bool lmk_tensor3_overlap(const lmk_tensor3 *a, const lmk_tensor3 *b)
{
    const size_t sa = span_bytes(a), sb = span_bytes(b);
    if (!lmk_ranges_overlap(a->data, sa, b->data, sb))
        return false;
    /* Token-major with one token stride, each token's footprint inside it. */
    const size_t ta = a->n[0] > 1 ? a->stride[0] * a->es : 0, tb = b->n[0] > 1 ? b->stride[0] * b->es : 0;
    const size_t period = ta ? ta : tb;
    if (!period || (ta && tb && ta != tb))
        return true;
    const bool a_low = (uintptr_t)a->data <= (uintptr_t)b->data;
    const heads_fp lo = heads_of(a_low ? a : b), hi = heads_of(a_low ? b : a);
    if ((lo.n - 1) * lo.step + lo.len > period || (hi.n - 1) * hi.step + hi.len > period)
        return true;
    /* hi's footprint shifted by delta mod period lies in [0, 2 * period): its part past period
     * meets lo's footprint of the next token, i.e. lo's shifted by period. */
    const size_t shift = (size_t)((uintptr_t)(a_low ? b->data : a->data) - (uintptr_t)(a_low ? a->data : b->data)) %
                         period;
    return heads_meet(&lo, &hi, (long long)shift) || heads_meet(&lo, &hi, (long long)shift - (long long)period);
}

lmk_status lmk_check_overlaps(const char *op, const lmk_tensor3 *ops, const char *const *names, int n_ops,
                              const int *out_idx, const int *own_input, int n_out)
{
    for (int o = 0; o < n_out; o++) {
        const lmk_tensor3 *out = &ops[out_idx[o]];
        if (!out->data || !count_of(out))
            continue;
        if (lmk_tensor3_self_overlaps(out))
            return lmk_fail(LMK_ERR_INVALID_ARGUMENT,
                            "%s: %s has overlapping elements (strides [%zu, %zu, %zu] for shape [%zu, %zu, %zu]): "
                            "an output's elements must be distinct",
                            op, names[out_idx[o]], out->stride[0], out->stride[1], out->stride[2], out->n[0],
                            out->n[1], out->n[2]);
        for (int i = 0; i < n_ops; i++) {
            if (i == out_idx[o] || !ops[i].data)
                continue;
            if (i == own_input[o] && lmk_tensor3_same(out, &ops[i]))
                continue;
            if (lmk_tensor3_overlap(out, &ops[i]))
                return lmk_fail(LMK_ERR_INVALID_ARGUMENT,
                                i == own_input[o]
                                    ? "%s: %s overlaps %s without being exactly it (in place needs the same address, "
                                      "shape and strides)"
                                    : "%s: %s overlaps %s (an output must share no element with another operand)",
                                op, names[out_idx[o]], names[i]);
        }
    }
    return LMK_OK;
}
