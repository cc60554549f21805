/*
 * inst.c - the life of a case on a device.
 *
 * What a case does on a device follows the same steps for every op: make (the op's setup and fill,
 * then upload), run, verify (the op's comparison, then the bytes around the outputs), reject (calls
 * the op must refuse without touching a byte). The descriptors it drives come from the registry
 * (registry.c) through the case itself (tst_case.op), so this file names no op.
 */
#include "testkit.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tst_case_name(tst_case *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->name, sizeof c->name, fmt, ap);
    va_end(ap);
}

/* ---- filling ---- */

#define POOL_ELEMS ((size_t)1 << 16)

/* The instance's pool of random elements of dtype t (TST_INST_FAST), made on first use. */
static const unsigned char *pool_of(tst_inst *in, lmk_dtype t, tst_rng *r)
{
    if (!in->pool[t] && (in->pool[t] = malloc(POOL_ELEMS * lmk_dtype_size(t))) != NULL)
        tst_fill_random(r, t, in->pool[t], POOL_ELEMS);
    return in->pool[t];
}

typedef struct fill_sink {
    unsigned char *host;
    lmk_dtype dtype;
    size_t es;
    tst_rng *r;
    const unsigned char *pool; /* TST_INST_FAST: tile from it */
} fill_sink;

static void fill_run(void *ctx, size_t elem, size_t row)
{
    fill_sink *k = ctx;
    unsigned char *dst = k->host + elem * k->es;
    if (!k->pool) {
        tst_fill_random(k->r, k->dtype, dst, row);
        return;
    }
    for (size_t done = 0; done < row;) {
        const size_t from = tst_rng_below(k->r, (uint32_t)POOL_ELEMS);
        const size_t n = row - done < POOL_ELEMS - from ? row - done : POOL_ELEMS - from;
        memcpy(dst + done * k->es, k->pool + from * k->es, n * k->es);
        done += n;
    }
}

void tst_inst_fill(tst_inst *in, const lmk_buffer *view, tst_rng *r)
{
    const tst_view *v = tst_mem_find(&in->mem, view);
    unsigned char *host = tst_mem_host(&in->mem, view);
    if (!v || !host)
        return;
    fill_sink k = {.host = host, .dtype = v->dtype, .es = lmk_dtype_size(v->dtype), .r = r,
                   .pool = in->flags & TST_INST_FAST ? pool_of(in, v->dtype, r) : NULL};
    tst_view_runs(v, fill_run, &k);
}

/* ---- the life of a case ---- */

void tst_inst_refill(tst_inst *in, uint64_t seed)
{
    for (int i = 0; i < in->mem.n_r; i++)
        if (in->mem.r[i].host)
            memset(in->mem.r[i].host, TST_POISON, in->mem.r[i].len);
    tst_rng r = tst_rng_make(seed);
    in->c.op->fill(in, &r);
}

lmk_status tst_inst_make(const tst_case *c, lmk_device *dev, uint64_t seed, unsigned flags,
                         const tst_alloc_hook *hook, tst_inst **out)
{
    tst_inst *in = calloc(1, sizeof *in);
    if (!in)
        return tst_fail(LMK_ERR_OUT_OF_MEMORY, "testkit: out of host memory");
    in->c = *c;
    in->flags = flags;
    in->mem.dev = dev;
    in->mem.hook = hook;
    lmk_status st = c->op->setup(in);
    if (st == LMK_OK) {
        tst_inst_refill(in, seed);
        st = tst_mem_upload(&in->mem);
    }
    for (int t = 0; t < LMK_DTYPE_COUNT; t++) {
        free(in->pool[t]);
        in->pool[t] = NULL;
    }
    if (st == LMK_OK && (flags & TST_INST_FAST))
        for (int i = 0; i < in->mem.n_r; i++) {
            free(in->mem.r[i].host);
            in->mem.r[i].host = NULL;
        }
    if (st != LMK_OK) {
        tst_inst_free(in);
        return st;
    }
    *out = in;
    return LMK_OK;
}

lmk_status tst_inst_reset(tst_inst *in, uint64_t seed)
{
    if (in->flags & TST_INST_FAST)
        return tst_fail(LMK_ERR_INVALID_ARGUMENT, "testkit: a TST_INST_FAST instance keeps no inputs to reset");
    tst_inst_refill(in, seed);
    return tst_mem_upload(&in->mem);
}

lmk_status tst_inst_run(const tst_inst *in, lmk_stream *s)
{
    return in->c.op->run(in, s);
}

bool tst_inst_verify(const tst_inst *in, tst_result *res)
{
    memset(res, 0, sizeof *res);
    if (in->flags & TST_INST_FAST) {
        snprintf(res->msg, sizeof res->msg, "a TST_INST_FAST instance keeps no inputs to verify against");
        return false;
    }
    res->ok = in->c.op->verify(in, res);
    if (res->ok && !tst_mem_untouched(&in->mem, res->msg, sizeof res->msg))
        res->ok = false;
    return res->ok;
}

/* Every region read back into before[] (or compared with it when `compare`). */
static bool regions_snapshot(const tst_inst *in, unsigned char **before, bool compare, tst_result *res)
{
    for (int i = 0; i < in->mem.n_r; i++) {
        unsigned char *now = tst_mem_download(&in->mem, i);
        if (!now) {
            snprintf(res->msg, sizeof res->msg, "read back: %s", lmk_last_error());
            return false;
        }
        if (!compare) {
            before[i] = now;
            continue;
        }
        const long long d = tst_bits_diff(before[i], now, in->mem.r[i].len);
        free(now);
        if (d >= 0) {
            snprintf(res->msg, sizeof res->msg, "a rejected call changed byte %lld of region %d", d, i);
            return false;
        }
    }
    return true;
}

bool tst_inst_reject(const tst_inst *in, lmk_stream *s, int k, tst_result *res)
{
    memset(res, 0, sizeof *res);
    unsigned char *before[TST_MAX_REGIONS] = {NULL};
    bool ok = regions_snapshot(in, before, false, res);
    if (ok) {
        const char *want = "";
        lmk_clear_error();
        const lmk_status st = in->c.op->invalid(in, s, k, &want);
        char msg[512];
        snprintf(msg, sizeof msg, "%s", lmk_last_error());
        const lmk_status sync = lmk_stream_sync(s);
        if (st != LMK_ERR_INVALID_ARGUMENT) {
            snprintf(res->msg, sizeof res->msg, "invalid call %d returned %s (\"%.300s\")", k, lmk_status_name(st), msg);
            ok = false;
        } else if (!strstr(msg, in->c.op->name) || !strstr(msg, want)) {
            snprintf(res->msg, sizeof res->msg, "invalid call %d: message \"%.300s\" lacks \"%.60s\" or \"%.60s\"", k, msg,
                     in->c.op->name, want);
            ok = false;
        } else if (sync != LMK_OK) {
            snprintf(res->msg, sizeof res->msg, "sync after invalid call %d: %s", k, lmk_last_error());
            ok = false;
        } else {
            ok = regions_snapshot(in, before, true, res);
            if (ok)
                snprintf(res->msg, sizeof res->msg, "rejected: %.400s", msg);
        }
    }
    for (int i = 0; i < TST_MAX_REGIONS; i++)
        free(before[i]);
    res->ok = ok;
    return ok;
}

void tst_inst_free(tst_inst *in)
{
    if (!in)
        return;
    tst_mem_free(&in->mem);
    for (int t = 0; t < LMK_DTYPE_COUNT; t++)
        free(in->pool[t]);
    free(in);
}

bool tst_case_check(const tst_case *c, lmk_stream *s, uint64_t seed, tst_result *res, lmk_status *status)
{
    memset(res, 0, sizeof *res);
    tst_inst *in = NULL;
    const char *step = "setup";
    lmk_status st = tst_inst_make(c, lmk_stream_device(s), seed, 0, NULL, &in);
    if (st == LMK_OK) {
        step = "run";
        st = tst_inst_run(in, s);
    }
    if (st == LMK_OK) {
        step = "sync";
        st = lmk_stream_sync(s);
    }
    if (status)
        *status = st;
    if (st != LMK_OK)
        snprintf(res->msg, sizeof res->msg, "%s: %s: %s", step, lmk_status_name(st), lmk_last_error());
    else
        tst_inst_verify(in, res);
    tst_inst_free(in);
    return res->ok;
}
