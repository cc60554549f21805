/*
 * check.c - `lmk check`: every op on every available backend against the float64 reference.
 *
 * Each case (a row of the tables below, commented with the model it comes from) runs in every
 * dtype on fresh random data. The data and the float64 reference are made once per case and
 * dtype, then every backend runs the op on exactly the same inputs. Outputs sit between guard
 * bytes in buffers poisoned with 0xFF (NaN in every float dtype), so an element never written
 * fails the comparison and a write past either end fails the guard check. Tolerances are the
 * library's contract (SPEC.md): f32 within 1e-5 absolute, bf16/f16 within one ulp of the float64
 * result plus 1e-6, copied rope elements and every repeat element bit-exact.
 */
#include "tool.h"

#include "ops/repeat/repeat.h"
#include "ops/rope/rope.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define GUARD 64                          /* poisoned bytes before and after every output */
#define POISON 0xFF
#define CHUNK_BYTES ((size_t)16 << 20)    /* repeat outputs are compared this much at a time */

enum { POS_TEXT, POS_RANDOM, POS_LARGE }; /* how positions are drawn, see make_positions */
enum { RES_OK, RES_FAIL, RES_SKIP };

typedef struct rope_case {
    uint32_t head_dim, rope_dim, n_heads, n_k_heads; /* n_k_heads > 0: the fused lmk_rope_multi_qk */
    uint32_t seq_len;
    float freq_base;
    lmk_rope_mode mode;
    uint32_t sections[4];
    lmk_rope_pairing pairing;
    bool in_place;
    int positions;
    bool pos_u32;      /* positions buffer typed u32 (read as i32) */
    uint32_t offset;   /* elements past a 64-byte boundary: 1 makes every view unaligned */
    bool full_only;    /* left out by --quick */
} rope_case;

/* Qwen3.5/3.6 full-attention layers, every size: head_dim 256, rope_dim 64, IMROPE [11,11,10,0]. */
#define QWEN35 .head_dim = 256, .rope_dim = 64, .freq_base = 1e7f, .mode = LMK_ROPE_IMROPE, .sections = {11, 11, 10, 0}

static const rope_case rope_cases[] = {
    /* Qwen3.5/3.6-27B: Q 24 heads + K 4 heads in one fused call, a prefill of text tokens */
    {QWEN35, .n_heads = 24, .n_k_heads = 4, .seq_len = 64},
    {QWEN35, .n_heads = 24, .n_k_heads = 4, .seq_len = 64, .in_place = true},
    /* the same Q and K as separate calls, with image-like positions (every axis its own) */
    {QWEN35, .n_heads = 24, .seq_len = 37, .positions = POS_RANDOM},
    {QWEN35, .n_heads = 4, .seq_len = 37, .positions = POS_RANDOM, .in_place = true},
    /* decode, Qwen3.5-122B/397B (Q 32, K 2): one token anywhere in a long context */
    {QWEN35, .n_heads = 32, .n_k_heads = 2, .seq_len = 1, .positions = POS_LARGE},
    /* positions up to |2^20|, where an angle computed in f32 is off by ~1e-2 */
    {QWEN35, .n_heads = 24, .n_k_heads = 4, .seq_len = 16, .positions = POS_LARGE},
    {QWEN35, .n_heads = 4, .seq_len = 16, .positions = POS_LARGE, .pos_u32 = true, .in_place = true},
    /* the Metal seed's pairing (x[p], x[p + head_dim/2]) on the same model */
    {QWEN35, .n_heads = 24, .n_k_heads = 4, .seq_len = 9, .positions = POS_RANDOM, .pairing = LMK_ROPE_PAIR_HALF_HEAD},
    {QWEN35, .n_heads = 4, .seq_len = 9, .pairing = LMK_ROPE_PAIR_HALF_HEAD, .in_place = true},
    /* MROPE (contiguous sections) over the Qwen3.5 shape */
    {.head_dim = 256, .rope_dim = 64, .freq_base = 1e7f, .mode = LMK_ROPE_MROPE, .sections = {11, 11, 10, 0},
     .n_heads = 8, .n_k_heads = 2, .seq_len = 12, .positions = POS_RANDOM},
    /* unaligned views: every tensor starts one element past a 64-byte boundary */
    {QWEN35, .n_heads = 24, .n_k_heads = 4, .seq_len = 5, .positions = POS_RANDOM, .offset = 1},
    {QWEN35, .n_heads = 4, .seq_len = 5, .positions = POS_RANDOM, .offset = 1, .in_place = true},
    /* Qwen3-VL-8B text (Q 32, K 8): head_dim = rope_dim = 128, IMROPE [24,20,20,0] */
    {.head_dim = 128, .rope_dim = 128, .freq_base = 5e6f, .mode = LMK_ROPE_IMROPE, .sections = {24, 20, 20, 0},
     .n_heads = 32, .n_k_heads = 8, .seq_len = 20, .positions = POS_RANDOM},
    /* Qwen2-VL-7B (Q 28, K 4): head_dim = rope_dim = 128, MROPE [16,24,24,0] */
    {.head_dim = 128, .rope_dim = 128, .freq_base = 1e6f, .mode = LMK_ROPE_MROPE, .sections = {16, 24, 24, 0},
     .n_heads = 28, .n_k_heads = 4, .seq_len = 20, .positions = POS_RANDOM, .in_place = true},
    /* the seed's own test shapes (its test vectors 1-3) */
    {.head_dim = 16, .rope_dim = 8, .freq_base = 2.0f, .mode = LMK_ROPE_IMROPE, .sections = {2, 2, 1, 0},
     .n_heads = 1, .seq_len = 1, .positions = POS_RANDOM, .pairing = LMK_ROPE_PAIR_HALF_HEAD},
    {.head_dim = 32, .rope_dim = 16, .freq_base = 1e4f, .mode = LMK_ROPE_IMROPE, .sections = {3, 3, 2, 0},
     .n_heads = 4, .seq_len = 6, .pairing = LMK_ROPE_PAIR_HALF_HEAD},
    /* sections summing to 0 (every pair on axis e), and sums past 2^32 that must not wrap */
    {.head_dim = 32, .rope_dim = 32, .freq_base = 1e4f, .mode = LMK_ROPE_MROPE, .sections = {0, 0, 0, 0},
     .n_heads = 2, .seq_len = 3, .positions = POS_RANDOM},
    {.head_dim = 32, .rope_dim = 32, .freq_base = 1e4f, .mode = LMK_ROPE_IMROPE,
     .sections = {UINT32_MAX, UINT32_MAX, 7, 0}, .n_heads = 2, .seq_len = 3, .positions = POS_RANDOM},
    {.head_dim = 32, .rope_dim = 32, .freq_base = 1e4f, .mode = LMK_ROPE_MROPE,
     .sections = {2, UINT32_MAX, UINT32_MAX, 1}, .n_heads = 2, .seq_len = 3, .positions = POS_RANDOM},
    /* odd sizes that leave vector tails everywhere */
    {.head_dim = 6, .rope_dim = 4, .freq_base = 1e4f, .mode = LMK_ROPE_IMROPE, .sections = {1, 1, 0, 0},
     .n_heads = 3, .n_k_heads = 1, .seq_len = 5, .positions = POS_RANDOM},
    {.head_dim = 10, .rope_dim = 2, .freq_base = 100.0f, .mode = LMK_ROPE_MROPE, .sections = {1, 0, 0, 0},
     .n_heads = 3, .seq_len = 4, .positions = POS_RANDOM, .pairing = LMK_ROPE_PAIR_HALF_HEAD, .in_place = true},
    {.head_dim = 130, .rope_dim = 126, .freq_base = 1e4f, .mode = LMK_ROPE_IMROPE, .sections = {7, 7, 7, 0},
     .n_heads = 3, .n_k_heads = 2, .seq_len = 7, .positions = POS_LARGE, .offset = 1},
    /* outputs of several MB, large enough for the CPU's streaming-store path, aligned or not */
    {QWEN35, .n_heads = 24, .n_k_heads = 4, .seq_len = 640, .positions = POS_RANDOM},
    {QWEN35, .n_heads = 24, .seq_len = 641, .positions = POS_LARGE, .offset = 1},
    {QWEN35, .n_heads = 24, .seq_len = 640, .positions = POS_LARGE, .offset = 1, .in_place = true},
    /* Qwen3.5-27B at the seed's benchmark length */
    {QWEN35, .n_heads = 24, .n_k_heads = 4, .seq_len = 4106, .full_only = true},
    {QWEN35, .n_heads = 24, .n_k_heads = 4, .seq_len = 4106, .positions = POS_LARGE, .in_place = true,
     .full_only = true},
};

static const lmk_dtype rope_dtypes[] = {LMK_F32, LMK_BF16, LMK_F16};

typedef struct repeat_case {
    uint32_t seq, hg, h, k;
    uint32_t offset;
    bool u8_only;
    bool full_only;
} repeat_case;

static const repeat_case repeat_cases[] = {
    /* Gated DeltaNet q/k (K 128, 16 source heads): Qwen3.5/3.6-27B 48, 4B/9B/35B-A3B 32, 122B/397B 64 */
    {.seq = 1, .hg = 16, .h = 48, .k = 128},
    {.seq = 64, .hg = 16, .h = 48, .k = 128},
    {.seq = 1, .hg = 16, .h = 32, .k = 128},
    {.seq = 64, .hg = 16, .h = 32, .k = 128},
    {.seq = 1, .hg = 16, .h = 64, .k = 128},
    {.seq = 33, .hg = 16, .h = 64, .k = 128},
    /* unaligned views, and sizes that leave tails */
    {.seq = 5, .hg = 16, .h = 48, .k = 128, .offset = 1},
    {.seq = 7, .hg = 1, .h = 7, .k = 3},
    {.seq = 3, .hg = 3, .h = 6, .k = 5, .offset = 1},
    {.seq = 4, .hg = 4, .h = 4, .k = 33},
    {.seq = 9, .hg = 16, .h = 48, .k = 1},
    /* outputs of several MB, large enough for the CPU's streaming-store path, aligned or not */
    {.seq = 700, .hg = 16, .h = 48, .k = 128},
    {.seq = 701, .hg = 16, .h = 32, .k = 128, .offset = 1},
    /* the seed's benchmark length */
    {.seq = 4106, .hg = 16, .h = 48, .k = 128, .full_only = true},
    {.seq = 4106, .hg = 16, .h = 32, .k = 128, .full_only = true},
    /* more than 2^32 output elements (and bytes): the kernels must index with 64 bits */
    {.seq = 699051, .hg = 16, .h = 48, .k = 128, .u8_only = true, .full_only = true},
};

static const lmk_dtype repeat_dtypes[] = {LMK_F32, LMK_BF16, LMK_F16, LMK_U8, LMK_I32};

typedef struct backend {
    const char *name;
    lmk_device *dev;
    lmk_stream *s;
} backend;

typedef struct check_state {
    backend be[2];
    int n_be;
    int passed, failed, skipped;
    int name_width; /* the longest case name, so the results line up */
} check_state;

/* ---- reporting ---- */

static void report(check_state *c, const char *be, int res, const char *name, const char *detail)
{
    static const char *const tags[] = {"OK", "FAIL", "SKIP"};
    printf("%-5s %-5s %-*s  %s\n", be, tags[res], c->name_width, name, detail);
    fflush(stdout);
    if (res == RES_OK)
        c->passed++;
    else if (res == RES_FAIL)
        c->failed++;
    else
        c->skipped++;
}

/* A library failure inside a case: running out of memory is the machine's limit (SKIP), anything
 * else is the library's fault (FAIL). */
static int lib_failure(lmk_status st, const char *what, char *detail, size_t dn)
{
    snprintf(detail, dn, "%s: %s: %s", what, lmk_status_name(st), lmk_last_error());
    return st == LMK_ERR_OUT_OF_MEMORY ? RES_SKIP : RES_FAIL;
}

/* "1e7" rather than "1e+07": names stay short and read like the model configs. */
static void format_base(char *out, size_t n, float base)
{
    char tmp[32], *o = out;
    snprintf(tmp, sizeof tmp, "%g", (double)base);
    for (const char *p = tmp; *p && (size_t)(o - out) + 1 < n; p++) {
        if (p[0] == 'e' && p[1] == '+') {
            *o++ = 'e';
            p++;
            while (p[1] == '0' && p[2])
                p++;
            continue;
        }
        *o++ = *p;
    }
    *o = '\0';
}

/* A section as printed: "max" for UINT32_MAX, which the overflow cases use. */
static const char *section_str(char *buf, size_t n, uint32_t v)
{
    if (v == UINT32_MAX)
        snprintf(buf, n, "max");
    else
        snprintf(buf, n, "%u", v);
    return buf;
}

static void rope_case_name(char *out, size_t n, const rope_case *rc, lmk_dtype dt)
{
    static const char *const pos_names[] = {"text", "random", "large"};
    char heads[32], base[32], s[4][12];
    if (rc->n_k_heads)
        snprintf(heads, sizeof heads, "%u+%u", rc->n_heads, rc->n_k_heads);
    else
        snprintf(heads, sizeof heads, "%u", rc->n_heads);
    format_base(base, sizeof base, rc->freq_base);
    for (int i = 0; i < 4; i++)
        section_str(s[i], sizeof s[i], rc->sections[i]);
    snprintf(out, n, "rope_multi %s hd=%u rd=%u nh=%s T=%u %s %s%s s=%s,%s,%s,%s base=%s pos=%s%s%s",
             rc->mode == LMK_ROPE_IMROPE ? "imrope" : "mrope", rc->head_dim, rc->rope_dim, heads, rc->seq_len,
             lmk_dtype_name(dt), rc->pairing == LMK_ROPE_PAIR_HALF_HEAD ? "half_head" : "half_rope",
             rc->in_place ? " in-place" : "", s[0], s[1], s[2], s[3], base, pos_names[rc->positions],
             rc->pos_u32 ? "(u32)" : "", rc->offset ? " unaligned" : "");
}

/* ---- device buffers with guards ---- */

/* A tensor of `n` elements placed GUARD + offset elements into an allocation that has GUARD more
 * bytes after it; `view` is the tensor the op sees. */
typedef struct guarded {
    lmk_buffer *whole, *view;
    size_t lead, bytes, total; /* bytes before the tensor, in it, in the whole allocation */
} guarded;

static void guarded_free(guarded *g)
{
    lmk_buffer_free(g->view);
    lmk_buffer_free(g->whole);
    memset(g, 0, sizeof *g);
}

/* Allocates, fills the whole allocation with POISON (from `scratch`, scratch_len bytes of it),
 * then writes `data` (if not NULL) into the tensor. */
static lmk_status guarded_make(lmk_device *dev, lmk_dtype dt, const size_t *shape, int ndim, size_t n,
                               uint32_t offset, const void *data, unsigned char *scratch, size_t scratch_len,
                               guarded *g)
{
    const size_t es = lmk_dtype_size(dt);
    g->lead = GUARD + offset * es;
    g->bytes = n * es;
    g->total = g->lead + g->bytes + GUARD;
    const size_t step = g->total < scratch_len ? g->total : scratch_len;
    lmk_status st = lmk_buffer_alloc(dev, g->total, LMK_U8, NULL, 0, &g->whole);
    memset(scratch, POISON, step);
    for (size_t at = 0; st == LMK_OK && at < g->total; at += step)
        st = lmk_buffer_write(g->whole, at, scratch, g->total - at < step ? g->total - at : step);
    if (st == LMK_OK && data)
        st = lmk_buffer_write(g->whole, g->lead, data, g->bytes);
    if (st == LMK_OK)
        st = lmk_buffer_view(g->whole, g->lead, dt, shape, ndim, &g->view);
    return st;
}

/* Whether the guard bytes on both sides of the tensor still hold POISON. */
static lmk_status guarded_check(const guarded *g, unsigned char *scratch, bool *intact)
{
    const size_t tail = g->lead + g->bytes;
    *intact = true;
    lmk_status st = lmk_buffer_read(g->whole, 0, scratch, g->lead);
    for (size_t i = 0; st == LMK_OK && i < g->lead; i++)
        *intact &= scratch[i] == POISON;
    if (st == LMK_OK)
        st = lmk_buffer_read(g->whole, tail, scratch, GUARD);
    for (size_t i = 0; st == LMK_OK && i < GUARD; i++)
        *intact &= scratch[i] == POISON;
    return st;
}

/* ---- rope_multi ---- */


/* Positions, axis-major (t, h, w, e). Text: all four axes hold the token's position. Random: each
 * axis its own, as for image patches. Large: anywhere in [-2^20, 2^20], both ends included. */
static void make_positions(tool_rng *r, int kind, uint32_t T, int32_t *pos)
{
    const int32_t start = (int32_t)(tool_rng_next(r) % 1024);
    for (uint32_t a = 0; a < 4; a++)
        for (uint32_t i = 0; i < T; i++) {
            int32_t v = start + (int32_t)i;
            if (kind == POS_RANDOM)
                v = (int32_t)(tool_rng_next(r) % 65536);
            else if (kind == POS_LARGE)
                v = (int32_t)(tool_rng_next(r) % ((2u << 20) + 1)) - (1 << 20);
            pos[(size_t)a * T + i] = v;
        }
    if (kind == POS_LARGE) {
        pos[0] = 1 << 20;
        pos[T > 1 ? 1 : 0] = -(1 << 20);
    }
}

/* Everything one rope case needs on the host: inputs, positions, the float64 results. */
typedef struct rope_host {
    int n_t;
    uint32_t heads[2];
    size_t n[2];
    void *in[2];
    double *ref[2];
    int32_t *pos;
    unsigned char *out;   /* one whole output allocation read back, guards included */
    unsigned char *scratch;
    size_t scratch_len;
    bool rotated[65536];  /* per element of a row: part of a rotated pair */
} rope_host;

/* Compares tensor ti's output (read back into h->out at h->out + lead) with the reference. */
static int rope_compare(const rope_case *rc, lmk_dtype dt, const rope_host *h, int ti, const unsigned char *got,
                        double *max_err, double *max_ratio, char *detail, size_t dn)
{
    const size_t es = lmk_dtype_size(dt), hd = rc->head_dim;
    const char *tname = h->n_t == 2 ? (ti == 0 ? "q" : "k") : "out";
    for (size_t i = 0; i < h->n[ti]; i++) {
        const size_t d = i % hd, row = i / hd;
        const size_t t = row / h->heads[ti], head = row % h->heads[ti];
        if (!h->rotated[d]) {
            if (memcmp(got + i * es, (const unsigned char *)h->in[ti] + i * es, es) != 0) {
                uint32_t g = 0, w = 0;
                memcpy(&g, got + i * es, es);
                memcpy(&w, (const unsigned char *)h->in[ti] + i * es, es);
                snprintf(detail, dn, "copied element not bit-exact at %s[t=%zu,h=%zu,d=%zu]: got 0x%0*x want 0x%0*x",
                         tname, t, head, d, (int)(2 * es), g, (int)(2 * es), w);
                return RES_FAIL;
            }
            continue;
        }
        const double v = lmk_float_load(dt, got, i), want = h->ref[ti][i];
        const double err = fabs(v - want), ratio = err / lmk_rope_tolerance(dt, want);
        if (!(ratio <= 1.0)) { /* NaN (an element never written) fails too */
            snprintf(detail, dn, "error %.3g = %.3g x tol at %s[t=%zu,h=%zu,d=%zu]: got %.9g want %.9g", err, ratio,
                     tname, t, head, d, v, want);
            return RES_FAIL;
        }
        if (err > *max_err)
            *max_err = err;
        if (ratio > *max_ratio)
            *max_ratio = ratio;
    }
    return RES_OK;
}

/* Runs the case on one backend and compares. */
static int rope_run_backend(const backend *be, const rope_case *rc, lmk_dtype dt, rope_host *h, char *detail,
                            size_t dn)
{
    guarded in[2] = {{0}}, out[2] = {{0}};
    lmk_buffer *pos = NULL;
    int res = RES_OK;
    lmk_status st = LMK_OK;
    const size_t n_pos = 4 * (size_t)rc->seq_len;
    const lmk_rope_multi_params p = {
        .head_dim = rc->head_dim, .rope_dim = rc->rope_dim, .n_heads = rc->n_heads, .seq_len = rc->seq_len,
        .freq_base = rc->freq_base, .mode = rc->mode,
        .sections = {rc->sections[0], rc->sections[1], rc->sections[2], rc->sections[3]}, .pairing = rc->pairing,
    };

    st = lmk_buffer_alloc(be->dev, n_pos * 4, rc->pos_u32 ? LMK_U32 : LMK_I32, &n_pos, 1, &pos);
    if (st == LMK_OK)
        st = lmk_buffer_write(pos, 0, h->pos, n_pos * 4);
    for (int ti = 0; ti < h->n_t && st == LMK_OK; ti++) {
        const size_t shape[3] = {rc->seq_len, h->heads[ti], rc->head_dim};
        if (!rc->in_place)
            st = guarded_make(be->dev, dt, shape, 3, h->n[ti], rc->offset, h->in[ti], h->scratch, h->scratch_len,
                              &in[ti]);
        if (st == LMK_OK)
            st = guarded_make(be->dev, dt, shape, 3, h->n[ti], rc->offset, rc->in_place ? h->in[ti] : NULL,
                              h->scratch, h->scratch_len, &out[ti]);
    }
    if (st != LMK_OK) {
        res = lib_failure(st, "setup", detail, dn);
        goto done;
    }

    const lmk_buffer *q_in = rc->in_place ? out[0].view : in[0].view;
    const lmk_buffer *k_in = rc->in_place ? out[1].view : in[1].view;
    st = h->n_t == 2 ? lmk_rope_multi_qk(be->s, q_in, out[0].view, k_in, out[1].view, pos, &p, rc->n_k_heads)
                     : lmk_rope_multi(be->s, q_in, out[0].view, pos, &p);
    if (st == LMK_OK)
        st = lmk_stream_sync(be->s);
    if (st != LMK_OK) {
        res = lib_failure(st, h->n_t == 2 ? "lmk_rope_multi_qk" : "lmk_rope_multi", detail, dn);
        goto done;
    }

    double max_err = 0, max_ratio = 0;
    for (int ti = 0; ti < h->n_t && res == RES_OK; ti++) {
        bool intact = true;
        st = lmk_buffer_read(out[ti].whole, 0, h->out, out[ti].total);
        if (st == LMK_OK)
            st = guarded_check(&out[ti], h->scratch, &intact);
        if (st != LMK_OK) {
            res = lib_failure(st, "read back", detail, dn);
        } else if (!intact) {
            snprintf(detail, dn, "a write outside the %s tensor (guard bytes changed)", ti ? "k" : "output");
            res = RES_FAIL;
        } else {
            res = rope_compare(rc, dt, h, ti, h->out + out[ti].lead, &max_err, &max_ratio, detail, dn);
        }
    }
    if (res == RES_OK)
        snprintf(detail, dn, "max err %.2g (%.2f of tol %s), copies bit-exact", max_err, max_ratio,
                 dt == LMK_F32 ? "1e-5" : "1 ulp+1e-6");
done:
    for (int ti = 0; ti < 2; ti++) {
        guarded_free(&in[ti]);
        guarded_free(&out[ti]);
    }
    lmk_buffer_free(pos);
    return res;
}

static void rope_host_free(rope_host *h)
{
    for (int i = 0; i < 2; i++) {
        free(h->in[i]);
        free(h->ref[i]);
    }
    free(h->pos);
    free(h->out);
    free(h->scratch);
    free(h);
}

static void check_rope_case(check_state *c, const rope_case *rc, lmk_dtype dt, uint64_t seed)
{
    char name[256], detail[512];
    rope_case_name(name, sizeof name, rc, dt);
    rope_host *h = calloc(1, sizeof *h);
    tool_rng rng = {seed};
    const size_t es = lmk_dtype_size(dt);
    bool ok = h != NULL && rc->head_dim <= sizeof h->rotated;
    if (ok) {
        h->n_t = rc->n_k_heads ? 2 : 1;
        h->heads[0] = rc->n_heads;
        h->heads[1] = rc->n_k_heads;
        size_t largest = 0;
        for (int ti = 0; ti < h->n_t; ti++) {
            h->n[ti] = (size_t)rc->seq_len * h->heads[ti] * rc->head_dim;
            h->in[ti] = malloc(h->n[ti] * es);
            h->ref[ti] = malloc(h->n[ti] * sizeof(double));
            ok &= h->in[ti] && h->ref[ti];
            if (h->in[ti])
                tool_fill_random(&rng, dt, h->in[ti], h->n[ti]);
            largest = h->n[ti] > largest ? h->n[ti] : largest;
        }
        h->pos = malloc(4 * (size_t)rc->seq_len * sizeof(int32_t));
        h->out = malloc(largest * es + 2 * GUARD + 8);
        h->scratch_len = largest * es + 2 * GUARD + 8 < CHUNK_BYTES ? largest * es + 2 * GUARD + 8 : CHUNK_BYTES;
        h->scratch = malloc(h->scratch_len);
        ok &= h->pos && h->out && h->scratch;
    }
    if (!ok) {
        for (int b = 0; b < c->n_be; b++)
            report(c, c->be[b].name, RES_SKIP, name, "out of host memory");
        if (h)
            rope_host_free(h);
        return;
    }
    make_positions(&rng, rc->positions, rc->seq_len, h->pos);

    /* Which elements of a row are rotated: p and p + stride for every pair p. */
    const uint32_t stride = rc->pairing == LMK_ROPE_PAIR_HALF_HEAD ? rc->head_dim / 2 : rc->rope_dim / 2;
    for (uint32_t p = 0; p < rc->rope_dim / 2; p++)
        h->rotated[p] = h->rotated[p + stride] = true;

    lmk_rope_params rp = {.head_dim = rc->head_dim, .rope_dim = rc->rope_dim, .n_heads = h->heads[0],
                          .seq_len = rc->seq_len, .freq_base = rc->freq_base, .mode = rc->mode,
                          .pairing = rc->pairing, .n_k_heads = h->n_t > 1 ? h->heads[1] : 0};
    memcpy(rp.sections, rc->sections, sizeof rp.sections);
    lmk_tensor3 t[4] = {{0}};
    for (int ti = 0; ti < h->n_t; ti++) {
        const size_t hd = rc->head_dim, nh = h->heads[ti];
        t[2 * ti] = t[2 * ti + 1] = (lmk_tensor3){.data = h->in[ti], .n = {rc->seq_len, nh, hd},
                                                  .stride = {nh * hd, hd, 1}, .es = lmk_dtype_size(dt)};
    }
    const lmk_rope_args a = lmk_rope_args_for(&rp, dt, t, h->n_t > 1, h->pos, LMK_I32, NULL);
    lmk_ref_rope_f64(&a, h->ref);

    for (int b = 0; b < c->n_be; b++) {
        const int res = rope_run_backend(&c->be[b], rc, dt, h, detail, sizeof detail);
        report(c, c->be[b].name, res, name, detail);
    }
    rope_host_free(h);
}

/* ---- repeat_tiled ---- */

static int repeat_run_backend(const backend *be, const repeat_case *rc, lmk_dtype dt, const unsigned char *src,
                              unsigned char *got, unsigned char *want, unsigned char *scratch, char *detail, size_t dn)
{
    const size_t es = lmk_dtype_size(dt);
    const size_t src_shape[3] = {rc->seq, rc->hg, rc->k}, dst_shape[3] = {rc->seq, rc->h, rc->k};
    const size_t src_n = (size_t)rc->seq * rc->hg * rc->k, dst_n = (size_t)rc->seq * rc->h * rc->k;
    const size_t row_src = (size_t)rc->hg * rc->k * es, row_dst = (size_t)rc->h * rc->k * es;
    const lmk_repeat_tiled_params p = {.seq = rc->seq, .hg = rc->hg, .h = rc->h, .k = rc->k};
    guarded in = {0}, out = {0};
    int res = RES_OK;

    /* src has no poison to keep, but its guards give it the same (mis)alignment as dst. */
    lmk_status st = guarded_make(be->dev, dt, src_shape, 3, src_n, rc->offset, NULL, scratch, CHUNK_BYTES, &in);
    for (size_t at = 0; st == LMK_OK && at < src_n * es; at += CHUNK_BYTES)
        st = lmk_buffer_write(in.whole, in.lead + at, src + at, src_n * es - at < CHUNK_BYTES ? src_n * es - at : CHUNK_BYTES);
    if (st == LMK_OK)
        st = guarded_make(be->dev, dt, dst_shape, 3, dst_n, rc->offset, NULL, scratch, CHUNK_BYTES, &out);
    if (st != LMK_OK) {
        res = lib_failure(st, "setup", detail, dn);
        goto done;
    }
    st = lmk_repeat_tiled(be->s, in.view, out.view, &p);
    if (st == LMK_OK)
        st = lmk_stream_sync(be->s);
    if (st != LMK_OK) {
        res = lib_failure(st, "lmk_repeat_tiled", detail, dn);
        goto done;
    }

    /* Token chunks: the reference runs on each chunk alone (tokens are independent), so a case
     * larger than memory twice over still compares every element. */
    const size_t chunk = CHUNK_BYTES / row_dst ? CHUNK_BYTES / row_dst : 1;
    for (size_t t0 = 0; t0 < rc->seq && res == RES_OK; t0 += chunk) {
        const size_t nt = rc->seq - t0 < chunk ? rc->seq - t0 : chunk;
        st = lmk_buffer_read(out.whole, out.lead + t0 * row_dst, got, nt * row_dst);
        if (st != LMK_OK) {
            res = lib_failure(st, "read back", detail, dn);
            break;
        }
        const lmk_repeat_args a = {
            .src = src + t0 * row_src, .dst = want, .seq = nt, .hg = rc->hg, .h = rc->h, .k = rc->k, .elem_size = es,
            .src_tok = (size_t)rc->hg * rc->k, .src_head = rc->k, .dst_tok = (size_t)rc->h * rc->k, .dst_head = rc->k,
            .layout = LMK_REPEAT_TILED,
        };
        lmk_ref_repeat(&a);
        if (memcmp(got, want, nt * row_dst) == 0)
            continue;
        size_t i = 0;
        while (memcmp(got + i * es, want + i * es, es) == 0)
            i++;
        uint32_t g = 0, w = 0;
        memcpy(&g, got + i * es, es);
        memcpy(&w, want + i * es, es);
        snprintf(detail, dn, "not bit-exact at dst[t=%zu,h=%zu,k=%zu]: got 0x%0*x want 0x%0*x",
                 t0 + i / (row_dst / es), i / rc->k % rc->h, i % rc->k, (int)(2 * es), g, (int)(2 * es), w);
        res = RES_FAIL;
    }
    bool intact = true;
    if (res == RES_OK && (st = guarded_check(&out, scratch, &intact)) != LMK_OK)
        res = lib_failure(st, "read back", detail, dn);
    else if (res == RES_OK && !intact) {
        snprintf(detail, dn, "a write outside dst (guard bytes changed)");
        res = RES_FAIL;
    }
    if (res == RES_OK)
        snprintf(detail, dn, "bit-exact");
done:
    guarded_free(&in);
    guarded_free(&out);
    return res;
}

static void repeat_case_name(char *out, size_t n, const repeat_case *rc, lmk_dtype dt)
{
    snprintf(out, n, "repeat_tiled %u->%u K=%u T=%u %s%s%s", rc->hg, rc->h, rc->k, rc->seq, lmk_dtype_name(dt),
             rc->offset ? " unaligned" : "", (uint64_t)rc->seq * rc->h * rc->k > UINT32_MAX ? " (>2^32 elements)" : "");
}

static void check_repeat_case(check_state *c, const repeat_case *rc, lmk_dtype dt, uint64_t seed)
{
    char name[160], detail[512];
    repeat_case_name(name, sizeof name, rc, dt);
    const size_t es = lmk_dtype_size(dt);
    const size_t src_bytes = (size_t)rc->seq * rc->hg * rc->k * es;
    const size_t chunk_bytes = (size_t)rc->h * rc->k * es > CHUNK_BYTES ? (size_t)rc->h * rc->k * es : CHUNK_BYTES;
    unsigned char *src = malloc(src_bytes), *got = malloc(chunk_bytes), *want = malloc(chunk_bytes);
    unsigned char *scratch = malloc(CHUNK_BYTES);
    if (!src || !got || !want || !scratch) {
        for (int b = 0; b < c->n_be; b++)
            report(c, c->be[b].name, RES_SKIP, name, "out of host memory");
    } else {
        tool_rng rng = {seed};
        tool_fill_random(&rng, dt, src, src_bytes / es);
        for (int b = 0; b < c->n_be; b++) {
            const int res = repeat_run_backend(&c->be[b], rc, dt, src, got, want, scratch, detail, sizeof detail);
            report(c, c->be[b].name, res, name, detail);
        }
    }
    free(src);
    free(got);
    free(want);
    free(scratch);
}

/* ---- the command ---- */

/* Opens `kind` if this machine has it. A backend asked for by name must exist; under "all" a
 * missing CUDA is a visible SKIP, so the same command runs on a laptop and on a GPU host. */
static int open_backend(check_state *c, lmk_backend kind, bool required)
{
    backend *be = &c->be[c->n_be];
    be->name = kind == LMK_BACKEND_CUDA ? "cuda" : "cpu";
    if (kind == LMK_BACKEND_CUDA && !required && lmk_device_count(LMK_BACKEND_CUDA) == 0) {
#ifdef LMK_WITH_CUDA
        report(c, "cuda", RES_SKIP, "every case", "no GPU");
#else
        report(c, "cuda", RES_SKIP, "every case", "this build has no CUDA backend");
#endif
        return 0;
    }
    char what[64];
    snprintf(what, sizeof what, "cannot open the %s device", be->name);
    lmk_status st = lmk_device_open(kind, 0, &be->dev);
    if (st == LMK_OK && (st = lmk_stream_create(be->dev, &be->s)) != LMK_OK) {
        lmk_device_close(be->dev);
        snprintf(what, sizeof what, "cannot create a %s stream", be->name);
    }
    if (st != LMK_OK)
        return tool_lib_error(st, what);
    printf("%-5s device: %s\n", be->name, lmk_device_name(be->dev));
    c->n_be++;
    return 0;
}

/* Mixes the run's seed with the case and dtype, so every case has its own data and a rerun with
 * the printed seed reproduces any of them, whatever --op or --quick select. */
static uint64_t case_seed(uint64_t seed, int table, size_t index, int dtype)
{
    tool_rng r = {seed ^ ((uint64_t)table << 56) ^ ((uint64_t)index << 16) ^ (uint64_t)dtype};
    return tool_rng_next(&r);
}

int tool_check(int argc, char **argv)
{
    static const char *const backends[] = {"cpu", "cuda", "all"};
    static const char *const ops[] = {"repeat", "rope", "all"};
    bool quick = false;
    int want_be = 2, want_op = 2;
    uint64_t seed = (uint64_t)time(NULL) * 1000003u ^ (uint64_t)getpid();
    seed %= 1000000000u; /* short enough to retype */

    for (int i = 2; i < argc; i++) {
        const char *v = NULL;
        int r;
        if (tool_flag(argv, i, "--quick")) {
            quick = true;
        } else if ((r = tool_opt(argc, argv, &i, "--backend", &v)) != 0) {
            if (r < 0 || (want_be = tool_parse_choice("--backend", v, backends, 3)) < 0)
                return TOOL_EXIT_USAGE;
        } else if ((r = tool_opt(argc, argv, &i, "--op", &v)) != 0) {
            if (r < 0 || (want_op = tool_parse_choice("--op", v, ops, 3)) < 0)
                return TOOL_EXIT_USAGE;
        } else if ((r = tool_opt(argc, argv, &i, "--seed", &v)) != 0) {
            if (r < 0 || tool_parse_u64("--seed", v, 0, UINT64_MAX, &seed) < 0)
                return TOOL_EXIT_USAGE;
        } else {
            return tool_unknown_arg("check", argv[i]);
        }
    }

    check_state c = {0};
    int rc = 0;
    char name[256];
    for (size_t i = 0; i < sizeof rope_cases / sizeof rope_cases[0]; i++) {
        rope_case_name(name, sizeof name, &rope_cases[i], LMK_BF16); /* the longest dtype name */
        c.name_width = (int)strlen(name) > c.name_width ? (int)strlen(name) : c.name_width;
    }
    for (size_t i = 0; i < sizeof repeat_cases / sizeof repeat_cases[0]; i++) {
        repeat_case_name(name, sizeof name, &repeat_cases[i], LMK_BF16);
        c.name_width = (int)strlen(name) > c.name_width ? (int)strlen(name) : c.name_width;
    }
    printf("lmk check %s: seed %llu (rerun with --seed %llu)\n", quick ? "--quick" : "(full)",
           (unsigned long long)seed, (unsigned long long)seed);
    if (want_be == 0 || want_be == 2)
        rc = open_backend(&c, LMK_BACKEND_CPU, want_be == 0);
    if (rc == 0 && (want_be == 1 || want_be == 2))
        rc = open_backend(&c, LMK_BACKEND_CUDA, want_be == 1);
    if (rc == 0) {
        const double t0 = tool_now();
        if (want_op == 1 || want_op == 2)
            for (size_t i = 0; i < sizeof rope_cases / sizeof rope_cases[0]; i++)
                for (int d = 0; d < 3; d++)
                    if (!quick || !rope_cases[i].full_only)
                        check_rope_case(&c, &rope_cases[i], rope_dtypes[d], case_seed(seed, 1, i, d));
        if (want_op == 0 || want_op == 2)
            for (size_t i = 0; i < sizeof repeat_cases / sizeof repeat_cases[0]; i++)
                for (int d = 0; d < 5; d++)
                    if ((!quick || !repeat_cases[i].full_only) && (!repeat_cases[i].u8_only || repeat_dtypes[d] == LMK_U8))
                        check_repeat_case(&c, &repeat_cases[i], repeat_dtypes[d], case_seed(seed, 2, i, d));
        printf("check: %d passed, %d failed, %d skipped in %.1f s (seed %llu)\n", c.passed, c.failed, c.skipped,
               tool_now() - t0, (unsigned long long)seed);
        rc = c.failed ? TOOL_EXIT_FAIL : 0;
    }
    for (int b = 0; b < c.n_be; b++) {
        lmk_stream_destroy(c.be[b].s);
        lmk_device_close(c.be[b].dev);
    }
    return rc;
}
