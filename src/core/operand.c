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
 *    row), each tensor's per-token footprint is a short sorted list of byte intervals (one per
 *    head, merged when heads touch); the two footprints are compared modulo the token stride,
 *    which is exact whenever the tensors share a token, and conservative otherwise;
 *  - anything else whose extents meet is reported as overlapping (lmk.h allows that for layouts
 *    other than the side-by-side ones).
 */
#include "core/internal.h"

#include <stdio.h>
#include <string.h>

/* More heads than this in a footprint are merged into one interval (conservative, never wrong).
 * The footprints live on the validating thread's stack (2 KB in all): thread-local storage would
 * be carved out of every thread's stack in a process that links lmk. */
#define MAX_INTERVALS 64

static void format_dims(char *buf, size_t n, const size_t *v, int k)
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
    format_dims(shape, sizeof shape, b->shape, b->ndim);
    format_dims(strides, sizeof strides, b->stride, b->ndim);
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

typedef struct ivl {
    size_t lo, hi; /* bytes [lo, hi) */
} ivl;

/* Per-token footprint of t in bytes relative to its element [0,0,0]: sorted, merged intervals.
 * Returns the count (at least 1). */
static int footprint(const lmk_tensor3 *t, ivl *out)
{
    const size_t row = t->n[2] * t->es, hs = t->stride[1] * t->es;
    if (t->n[1] <= 1 || hs <= row || t->n[1] > MAX_INTERVALS) {
        out[0] = (ivl){0, t->n[1] ? (t->n[1] - 1) * hs + row : 0};
        return 1;
    }
    int k = 0;
    for (size_t h = 0; h < t->n[1]; h++)
        out[k++] = (ivl){h * hs, h * hs + row};
    return k;
}

/* Whether any interval of a meets an interval of b shifted by `shift` (< period) and wrapped
 * modulo `period`. Every interval lies in [0, period). */
static bool footprints_meet(const ivl *a, int na, const ivl *b, int nb, size_t shift, size_t period)
{
    for (int i = 0; i < nb; i++) {
        const size_t lo = b[i].lo + shift, hi = b[i].hi + shift; /* both < 2 * period */
        ivl piece[2];
        int k = 0;
        if (lo < period)
            piece[k++] = (ivl){lo, hi < period ? hi : period};
        if (hi > period)
            piece[k++] = (ivl){lo > period ? lo - period : 0, hi - period};
        for (int p = 0; p < k; p++)
            for (int j = 0; j < na; j++)
                if (piece[p].lo < piece[p].hi && a[j].lo < piece[p].hi && piece[p].lo < a[j].hi)
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
    ivl fa[MAX_INTERVALS], fb[MAX_INTERVALS];
    const int na = footprint(a, fa), nb = footprint(b, fb);
    if (fa[na - 1].hi > period || fb[nb - 1].hi > period)
        return true;
    const lmk_tensor3 *lo = (uintptr_t)a->data <= (uintptr_t)b->data ? a : b;
    const size_t delta = (size_t)((uintptr_t)(lo == a ? b->data : a->data) - (uintptr_t)lo->data);
    return lo == a ? footprints_meet(fa, na, fb, nb, delta % period, period)
                   : footprints_meet(fb, nb, fa, na, delta % period, period);
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
