/*
 * mem.c - device memory of one case: regions with host copies, operand views into them, poison,
 * and the check that a run wrote nothing but its outputs.
 *
 * A region is one u8 allocation; its host copy is what the device must hold before a run. Outputs
 * start poisoned, so an element never written fails its comparison. After the run every byte that
 * is not an output element (guards on both sides, the gaps of a strided layout such as the gate of
 * a [q | gate] projection or v inside a packed QKV buffer, every input) must still equal the host
 * copy: that is how a write past an output, or into an input, is caught.
 */
#include "testkit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK ((size_t)16 << 20) /* bytes moved per read or write of a poisoned region */

void tst_poison(void *p, size_t n, unsigned byte)
{
    memset(p, (int)byte, n);
}

long long tst_find_not(const void *p, size_t from, size_t to, unsigned byte)
{
    const unsigned char *c = p;
    for (size_t i = from; i < to; i++)
        if (c[i] != (unsigned char)byte)
            return (long long)i;
    return -1;
}

size_t tst_count_unwritten(const void *p, size_t n, size_t es, unsigned byte)
{
    const unsigned char *c = p;
    size_t count = 0;
    for (size_t i = 0; i < n; i++) {
        size_t j = 0;
        while (j < es && c[i * es + j] == (unsigned char)byte)
            j++;
        count += j == es;
    }
    return count;
}

size_t tst_span(const size_t n[3], const size_t *stride, size_t es)
{
    if (!n[0] || !n[1] || !n[2])
        return 0;
    const size_t dense[3] = {n[1] * n[2], n[2], 1};
    const size_t *s = stride ? stride : dense;
    return ((n[0] - 1) * s[0] + (n[1] - 1) * s[1] + (n[2] - 1) * s[2] + 1) * es;
}

lmk_status tst_mem_region(tst_mem *m, size_t len, bool host_copy, int *idx)
{
    if (m->n_r == TST_MAX_REGIONS)
        return tst_fail(LMK_ERR_INVALID_ARGUMENT, "testkit: more than %d regions in one case", TST_MAX_REGIONS);
    tst_region *r = &m->r[m->n_r];
    memset(r, 0, sizeof *r);
    r->len = len;
    if (host_copy) {
        r->host = malloc(len ? len : 1);
        if (!r->host)
            return tst_fail(LMK_ERR_OUT_OF_MEMORY, "testkit: out of host memory for a %zu-byte region", len);
        memset(r->host, TST_POISON, len);
    }
    const lmk_status st = m->hook ? m->hook->alloc(m->dev, len, &r->buf, &r->own, m->hook->user)
                                  : lmk_buffer_alloc(m->dev, len, LMK_U8, NULL, 0, &r->buf);
    if (st != LMK_OK) {
        free(r->host);
        memset(r, 0, sizeof *r);
        return st;
    }
    *idx = m->n_r++;
    return LMK_OK;
}

lmk_status tst_mem_view(tst_mem *m, int region, size_t off, lmk_dtype dtype, const size_t n[3], const size_t *stride,
                        bool output, lmk_buffer **out)
{
    if (m->n_v == TST_MAX_VIEWS)
        return tst_fail(LMK_ERR_INVALID_ARGUMENT, "testkit: more than %d views in one case", TST_MAX_VIEWS);
    tst_view *v = &m->v[m->n_v];
    *v = (tst_view){.region = region, .off = off, .dtype = dtype, .nd = 3, .n = {n[0], n[1], n[2]},
                    .stride = {n[1] * n[2], n[2], 1}, .output = output};
    const bool dense = !stride || (stride[0] == v->stride[0] && stride[1] == v->stride[1] && stride[2] == 1);
    lmk_status st;
    if (dense) {
        st = lmk_buffer_view(m->r[region].buf, off, dtype, n, 3, &v->buf);
    } else {
        memcpy(v->stride, stride, 3 * sizeof *stride);
        st = lmk_buffer_view_strided(m->r[region].buf, off, dtype, n, stride, 3, &v->buf);
    }
    if (st != LMK_OK)
        return st;
    m->n_v++;
    *out = v->buf;
    return LMK_OK;
}

size_t tst_span_nd(int nd, const size_t *n, const size_t *stride, size_t es)
{
    size_t last = 0;
    for (int i = 0; i < nd; i++) {
        if (!n[i])
            return 0;
        last += (n[i] - 1) * stride[i];
    }
    return (last + 1) * es;
}

lmk_status tst_mem_view_nd(tst_mem *m, int region, size_t off, lmk_dtype dtype, int nd, const size_t *n,
                           const size_t *stride, bool output, lmk_buffer **out)
{
    if (m->n_v == TST_MAX_VIEWS)
        return tst_fail(LMK_ERR_INVALID_ARGUMENT, "testkit: more than %d views in one case", TST_MAX_VIEWS);
    if (nd < 1 || nd > TST_VIEW_MAX_DIMS)
        return tst_fail(LMK_ERR_INVALID_ARGUMENT, "testkit: a view of %d axes", nd);
    tst_view *v = &m->v[m->n_v];
    *v = (tst_view){.region = region, .off = off, .dtype = dtype, .nd = nd, .output = output};
    for (int i = 0; i < nd; i++)
        v->n[i] = n[i], v->stride[i] = stride[i];
    const lmk_status st = lmk_buffer_view_strided(m->r[region].buf, off, dtype, n, stride, nd, &v->buf);
    if (st != LMK_OK)
        return st;
    m->n_v++;
    *out = v->buf;
    return LMK_OK;
}

void tst_view_runs(const tst_view *v, void (*fn)(void *ctx, size_t elem, size_t len), void *ctx)
{
    const int nd = v->nd ? v->nd : 3;
    const bool rows = v->stride[nd - 1] == 1 || v->n[nd - 1] == 1;
    const int outer = rows ? nd - 1 : nd;
    const size_t len = rows ? v->n[nd - 1] : 1;
    size_t count = 1;
    for (int i = 0; i < outer; i++)
        count *= v->n[i];
    if (!len)
        return;
    for (size_t r = 0; r < count; r++) {
        size_t rem = r, e = 0;
        for (int i = outer - 1; i >= 0; i--) {
            e += rem % v->n[i] * v->stride[i];
            rem /= v->n[i];
        }
        fn(ctx, e, len);
    }
}

const tst_view *tst_mem_find(const tst_mem *m, const lmk_buffer *view)
{
    for (int i = 0; i < m->n_v; i++)
        if (m->v[i].buf == view)
            return &m->v[i];
    return NULL;
}

void *tst_mem_host(const tst_mem *m, const lmk_buffer *view)
{
    const tst_view *v = tst_mem_find(m, view);
    return v && m->r[v->region].host ? m->r[v->region].host + v->off : NULL;
}

lmk_status tst_mem_upload(tst_mem *m)
{
    unsigned char *poison = NULL;
    lmk_status st = LMK_OK;
    for (int i = 0; i < m->n_r && st == LMK_OK; i++) {
        const tst_region *r = &m->r[i];
        if (r->host) {
            st = lmk_buffer_write(r->buf, 0, r->host, r->len);
            continue;
        }
        if (!poison && !(poison = malloc(CHUNK)))
            return tst_fail(LMK_ERR_OUT_OF_MEMORY, "testkit: out of host memory for poison");
        memset(poison, TST_POISON, CHUNK);
        for (size_t at = 0; at < r->len && st == LMK_OK; at += CHUNK)
            st = lmk_buffer_write(r->buf, at, poison, r->len - at < CHUNK ? r->len - at : CHUNK);
    }
    free(poison);
    return st;
}

lmk_status tst_mem_read(const tst_mem *m, int region, size_t off, void *dst, size_t n)
{
    return lmk_buffer_read(m->r[region].buf, off, dst, n);
}

void *tst_mem_download(const tst_mem *m, int region)
{
    const size_t len = m->r[region].len;
    void *p = malloc(len ? len : 1);
    if (!p) {
        tst_fail(LMK_ERR_OUT_OF_MEMORY, "testkit: out of host memory to read back %zu bytes", len);
        return NULL;
    }
    if (tst_mem_read(m, region, 0, p, len) != LMK_OK) {
        free(p);
        return NULL;
    }
    return p;
}

/* ---- untouched bytes ---- */

typedef struct range {
    size_t lo, hi;
} range;

static int cmp_range(const void *a, const void *b)
{
    const range *x = a, *y = b;
    return (x->lo > y->lo) - (x->lo < y->lo);
}

/* Runs of consecutive elements in a view (tst_view_runs). */
static size_t run_count(const tst_view *v)
{
    const bool rows = v->stride[v->nd - 1] == 1 || v->n[v->nd - 1] == 1;
    size_t count = 1;
    for (int i = 0; i < (rows ? v->nd - 1 : v->nd); i++)
        count *= v->n[i];
    return count;
}

typedef struct range_sink {
    range *r;
    size_t *n;
    size_t off, es;
} range_sink;

static void add_run(void *ctx, size_t elem, size_t len)
{
    range_sink *k = ctx;
    const size_t lo = k->off + elem * k->es;
    k->r[(*k->n)++] = (range){lo, lo + len * k->es};
}

/* The byte ranges of the output elements in region `ri`, sorted and merged; NULL with *n 0 when
 * there are none, NULL with *n SIZE_MAX when out of memory. */
static range *output_ranges(const tst_mem *m, int ri, size_t *n)
{
    size_t count = 0;
    for (int i = 0; i < m->n_v; i++)
        if (m->v[i].output && m->v[i].region == ri)
            count += lmk_buffer_is_contiguous(m->v[i].buf) ? 1 : run_count(&m->v[i]);
    *n = 0;
    if (!count)
        return NULL;
    range *r = malloc(count * sizeof *r);
    if (!r) {
        *n = SIZE_MAX;
        return NULL;
    }
    for (int i = 0; i < m->n_v; i++) {
        const tst_view *v = &m->v[i];
        if (!v->output || v->region != ri)
            continue;
        const size_t es = lmk_dtype_size(v->dtype);
        if (lmk_buffer_is_contiguous(v->buf)) {
            r[(*n)++] = (range){v->off, v->off + tst_span_nd(v->nd, v->n, v->stride, es)};
            continue;
        }
        range_sink sink = {r, n, v->off, es};
        tst_view_runs(v, add_run, &sink);
    }
    qsort(r, *n, sizeof *r, cmp_range);
    size_t k = 0;
    for (size_t i = 1; i < *n; i++) {
        if (r[i].lo <= r[k].hi)
            r[k].hi = r[i].hi > r[k].hi ? r[i].hi : r[k].hi;
        else
            r[++k] = r[i];
    }
    *n = k + 1;
    return r;
}

/* The bytes a region should hold outside its outputs: its host copy, or poison. */
static unsigned char expected(const tst_region *r, size_t b)
{
    return r->host ? r->host[b] : (unsigned char)TST_POISON;
}

/* Compares device bytes [lo, hi) of region r (read in chunks into buf) with what they should hold. */
static bool gap_unchanged(const tst_mem *m, int ri, size_t lo, size_t hi, unsigned char *buf, char *msg,
                          size_t msg_len)
{
    const tst_region *r = &m->r[ri];
    for (size_t at = lo; at < hi; at += CHUNK) {
        const size_t n = hi - at < CHUNK ? hi - at : CHUNK;
        const lmk_status st = tst_mem_read(m, ri, at, buf, n);
        if (st != LMK_OK) {
            snprintf(msg, msg_len, "read back: %s: %s", lmk_status_name(st), lmk_last_error());
            return false;
        }
        for (size_t i = 0; i < n; i++) {
            const unsigned char want = expected(r, at + i);
            if (buf[i] != want) {
                snprintf(msg, msg_len,
                         "a write outside the outputs: byte %zu of region %d (%zu bytes) is 0x%02x, was 0x%02x", at + i,
                         ri, r->len, buf[i], want);
                return false;
            }
        }
    }
    return true;
}

/* The gaps between the output ranges of region ri, compared in memory after one read of the whole
 * region: cheaper than one read per gap when a strided output leaves many. */
static bool gaps_unchanged_whole(const tst_mem *m, int ri, const range *outs, size_t n, char *msg, size_t msg_len)
{
    const tst_region *r = &m->r[ri];
    unsigned char *all = tst_mem_download(m, ri);
    if (!all) {
        snprintf(msg, msg_len, "read back: %s", lmk_last_error());
        return false;
    }
    bool ok = true;
    size_t at = 0;
    for (size_t i = 0; ok && i <= n; i++) {
        const size_t end = i < n ? outs[i].lo : r->len;
        for (size_t b = at; ok && b < end; b++)
            if (all[b] != expected(r, b)) {
                snprintf(msg, msg_len,
                         "a write outside the outputs: byte %zu of region %d (%zu bytes) is 0x%02x, was 0x%02x", b,
                         ri, r->len, all[b], expected(r, b));
                ok = false;
            }
        at = i < n ? outs[i].hi : r->len;
    }
    free(all);
    return ok;
}

bool tst_mem_untouched(const tst_mem *m, char *msg, size_t msg_len)
{
    unsigned char *buf = malloc(CHUNK);
    if (!buf) {
        snprintf(msg, msg_len, "out of host memory");
        return false;
    }
    bool ok = true;
    for (int ri = 0; ri < m->n_r && ok; ri++) {
        size_t n = 0;
        range *outs = output_ranges(m, ri, &n);
        if (n == SIZE_MAX) {
            snprintf(msg, msg_len, "out of host memory");
            ok = false;
        } else if (n > 64) {
            ok = gaps_unchanged_whole(m, ri, outs, n, msg, msg_len);
        } else {
            size_t at = 0;
            for (size_t i = 0; ok && i <= n; i++) {
                const size_t end = i < n ? outs[i].lo : m->r[ri].len;
                if (end > at)
                    ok = gap_unchanged(m, ri, at, end, buf, msg, msg_len);
                at = i < n ? outs[i].hi : m->r[ri].len;
            }
        }
        free(outs);
    }
    free(buf);
    return ok;
}

void tst_mem_free(tst_mem *m)
{
    for (int i = m->n_v - 1; i >= 0; i--)
        lmk_buffer_free(m->v[i].buf);
    for (int i = m->n_r - 1; i >= 0; i--) {
        lmk_buffer_free(m->r[i].buf);
        if (m->r[i].own && m->hook)
            m->hook->free(m->r[i].own, m->hook->user);
        free(m->r[i].host);
    }
    m->n_v = m->n_r = 0;
}
