/*
 * test_rope_modes.c - lmk_rope (0.2) on every backend, written to lmk.h's contract ("rope").
 *
 * Every section runs on each device of tst_devs_open_isas (the CPU at every instruction-set level,
 * CUDA when a GPU is usable, else a visible SKIP):
 *  1. the matrix: mode (NORMAL, NEOX and MROPE and IMROPE with both pairings, VISION) x scaling
 *     (none, linear, YaRN with default and other betas and attn_factor, YaRN with ext_factor 0.5,
 *     freq_factors, YaRN+freq_factors) x dtype (f32, bf16, f16) x layout (dense; q inside [q|gate]; q and k inside
 *     a packed QKV; in place; in place inside a packed QKV; each q only and q+k) x positions dtype
 *     (i32, u32, i64), fresh random inputs in [-2, 2] and positions up to +-2^20, against the
 *     float64 reference lmk_ref_rope_f64 under the precision contract (tst_rope_check);
 *  2. the real model shapes (Llama-3.1-8B, Qwen3-8B, Qwen3.5-27B plain and with 1M-context YaRN,
 *     gpt-oss-20B, GPT-J-6B, the Qwen2-VL ViT) at T = 1, 7 and a prompt length;
 *  3. Hugging Face's rope_type formulas (linear, llama3, yarn with and without truncation) written
 *     here in C, mapped onto lmk's fields the way lmk.h says, against HF's rotate_half computed in
 *     float64: an independent check of lmk's scaling formula, plus a negative control showing
 *     that the check tells truncated from untruncated YaRN apart;
 *  4. a precision regression bound far inside the contract: f32 launches with m <= 1 must stay
 *     within 2e-6 of the reference (the contract allows 1e-5; the kernels reach ~2.5e-7), so a
 *     tenfold loss of accuracy fails; the largest error seen is printed once per backend;
 *  5. validation: lmk.h's R1-R14 in order (a call breaking rule N and the later rules reports rule
 *     N), then the variants of each rule; every message must hold the value and the rule, and no
 *     byte of any buffer may change;
 *  6. determinism, inside 1 and 2: every launch is repeated and must give the same bits, and a q+k
 *     launch must equal two q-only launches bit for bit.
 * Every launch poisons its outputs (TST_POISON) and keeps guard bytes after every buffer; every
 * byte of every buffer outside the outputs' elements (the gate, v, padding, guards, positions,
 * freq_factors) must be left as it was. UNSUPPORTED is a failure: the contract has no such case.
 * Failures beyond the first MAX_PRINTED are counted, not printed.
 */
#include "common.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

HARNESS_DEFINE;

#define F32_TOL 1e-5        /* lmk.h: f32 within 1e-5 * max(1, m) */
#define F32_REGRESSION 2e-6 /* section 4 */
#define MAX_PRINTED 40
#define MAX_PAIRS 128       /* rope_dim <= 256 in every case here */

static const double k_pi = 3.14159265358979323846;
static const lmk_dtype k_dtypes[3] = {LMK_F32, LMK_BF16, LMK_F16};
static const lmk_dtype k_pos_dtypes[3] = {LMK_I32, LMK_U32, LMK_I64};

/* ------------------------------------------------------------------------------------------------
 * verdicts and per-device figures
 * ---------------------------------------------------------------------------------------------- */

static int g_printed, g_unprinted;

/* Counts one case like CHECK. A backend that lacks a feature fails thousands of matrix cases, so
 * only the first MAX_PRINTED failures are printed in full; the rest are counted and summarised. */
static bool verdict_at(bool ok, int line, const char *fmt, ...) LMK_PRINTF(3, 4);
static bool verdict_at(bool ok, int line, const char *fmt, ...)
{
    if (ok) {
        harness_passed++;
        return true;
    }
    harness_failed++;
    if (g_printed >= MAX_PRINTED) {
        g_unprinted++;
        return false;
    }
    g_printed++;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL %s:%d: ", __FILE__, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return false;
}
#define VERDICT(ok, ...) verdict_at(!!(ok), __LINE__, __VA_ARGS__)

/* What one device showed over sections 1-3. */
typedef struct dev_figures {
    int cases, failed, unsupported;
    char unsupported_msg[200];  /* the first UNSUPPORTED message */
    double f32_max_m1;          /* largest f32 error of launches with m <= 1 (section 4) */
    double f32_max_rel;         /* largest f32 error / max(1, m) over every f32 launch */
    int n_m1, n_f32;
} dev_figures;
static dev_figures g_fig;

/* ------------------------------------------------------------------------------------------------
 * layouts: where the operands sit in their parent buffers
 * ---------------------------------------------------------------------------------------------- */

enum { LAY_DENSE, LAY_QGATE, LAY_QKV, LAY_INPLACE, LAY_INPLACE_QKV, LAY_COUNT };
static const char *const k_lay_name[LAY_COUNT] = {"dense", "q|gate", "qkv", "inplace", "inplace-qkv"};

enum { OP_WHOLE, OP_SAME, OP_VIEW };

/* An operand: element (t, h, i) at byte off + (t*st[0] + h*st[1] + i) * es of parent `par`. */
typedef struct opnd {
    int par;            /* -1: absent */
    int kind;           /* OP_WHOLE: the parent buffer itself; OP_SAME: the previous operand's handle
                           (in place, one handle); OP_VIEW: a strided view made for the call */
    size_t off;
    size_t n[3], st[3];
} opnd;

typedef struct geom {
    int n_par;
    size_t bytes[4];    /* used bytes of each parent; TST_GUARD more are allocated and checked */
    bool input[4];      /* random values, else poisoned (an output) */
    int ndim[4];
    size_t shape[4][3];
    opnd o[4];          /* q_in, q_out, k_in, k_out */
} geom;

static int add_parent(geom *g, bool input, size_t es, int ndim, size_t s0, size_t s1, size_t s2)
{
    const int i = g->n_par++;
    g->input[i] = input;
    g->ndim[i] = ndim;
    g->shape[i][0] = s0;
    g->shape[i][1] = s1;
    g->shape[i][2] = s2;
    g->bytes[i] = s0 * (ndim > 1 ? s1 : 1) * (ndim > 2 ? s2 : 1) * es;
    return i;
}

static opnd whole(int par, size_t t, size_t h, size_t d)
{
    return (opnd){.par = par, .kind = OP_WHOLE, .n = {t, h, d}, .st = {h * d, d, 1}};
}

static opnd view3(int par, size_t off, size_t t, size_t h, size_t d, size_t st0, size_t st1)
{
    return (opnd){.par = par, .kind = OP_VIEW, .off = off, .n = {t, h, d}, .st = {st0, st1, 1}};
}

/* Dense q or k: one buffer in, one out (declared 1-D: a dense operand's shape does not matter), or
 * one buffer rotated in place through a single handle. */
static void dense_pair(geom *g, opnd *in, opnd *out, bool in_place, size_t T, size_t h, size_t D, size_t es)
{
    *in = whole(add_parent(g, true, es, 3, T, h, D), T, h, D);
    if (in_place) {
        *out = *in;
        out->kind = OP_SAME;
    } else {
        *out = whole(add_parent(g, false, es, 1, T * h * D, 0, 0), T, h, D);
    }
}

/* The parents and operands of a layout: T tokens, hq q heads, hk k heads (the packed QKV row holds
 * k and v even for a q-only call), head_dim D, element size es. Out-of-place QKV outputs go to a
 * row of their own with head stride D + 2 and a leading pad, so token and head strides of inputs
 * and outputs all differ. */
static geom make_geom(int lay, bool has_k, size_t T, size_t hq, size_t hk, size_t D, size_t es)
{
    geom g = {.n_par = 0};
    for (int i = 0; i < 4; i++)
        g.o[i].par = -1;
    const size_t row = (hq + 2 * hk) * D, orow = (hq + hk) * (D + 2) + D;
    if (lay == LAY_DENSE || lay == LAY_INPLACE) {
        dense_pair(&g, &g.o[0], &g.o[1], lay == LAY_INPLACE, T, hq, D, es);
        if (has_k)
            dense_pair(&g, &g.o[2], &g.o[3], lay == LAY_INPLACE, T, hk, D, es);
    } else if (lay == LAY_QGATE) { /* Qwen3.5: q of a [T, H, 2D] q|gate projection; k its own */
        const int pi = add_parent(&g, true, es, 3, T, hq, 2 * D), po = add_parent(&g, false, es, 3, T, hq, 2 * D);
        g.o[0] = view3(pi, 0, T, hq, D, 2 * hq * D, 2 * D);
        g.o[1] = view3(po, D * es, T, hq, D, 2 * hq * D, 2 * D);
        if (has_k)
            dense_pair(&g, &g.o[2], &g.o[3], false, T, hk, D, es);
    } else if (lay == LAY_QKV) {
        const int pi = add_parent(&g, true, es, 2, T, row, 0), po = add_parent(&g, false, es, 2, T, orow, 0);
        g.o[0] = view3(pi, 0, T, hq, D, row, D);
        g.o[1] = view3(po, D * es, T, hq, D, orow, D + 2);
        if (has_k) {
            g.o[2] = view3(pi, hq * D * es, T, hk, D, row, D);
            g.o[3] = view3(po, (D + hq * (D + 2)) * es, T, hk, D, orow, D + 2);
        }
    } else { /* LAY_INPLACE_QKV: separate handles with equal address, shape and strides */
        const int p = add_parent(&g, true, es, 2, T, row, 0);
        g.o[0] = g.o[1] = view3(p, 0, T, hq, D, row, D);
        if (has_k)
            g.o[2] = g.o[3] = view3(p, hq * D * es, T, hk, D, row, D);
    }
    return g;
}

/* ------------------------------------------------------------------------------------------------
 * a case and its host side
 * ---------------------------------------------------------------------------------------------- */

enum { POS_TEXT, POS_RANDOM, POS_GRID };
enum { FF_NONE, FF_RANDOM, FF_GIVEN };
enum { HF_DEFAULT, HF_LINEAR, HF_LLAMA3, HF_YARN };

/* A Hugging Face rope configuration (section 3). */
typedef struct hf_rope {
    int type;
    double factor;
    double low_freq_factor, high_freq_factor; /* llama3 */
    double beta_fast, beta_slow;              /* yarn */
    uint32_t orig;                            /* original_max_position_embeddings */
    bool truncate;                            /* yarn */
} hf_rope;

typedef struct rcase {
    lmk_rope_params p;        /* as passed; n_k_heads may be anything for a q-only call */
    bool has_k;
    uint32_t hk;              /* heads of k (also sizes the QKV row of a q-only call) */
    lmk_dtype dtype, pos_dtype;
    int lay;
    int pos_kind;
    int64_t pos_lo, pos_hi;   /* POS_TEXT: start at pos_lo; POS_RANDOM: every entry in [lo, hi] */
    int ff_kind;
    const float *ff_given;    /* FF_GIVEN: n_pairs values */
    const hf_rope *hf;        /* section 3: also compare with Hugging Face's formula */
    bool hf_must_differ;      /* section 3's negative control */
    const char *comment;      /* the model */
    bool progress;            /* a slow case: print a line first */
} rcase;

typedef struct host_case {
    const rcase *c;
    geom g;
    size_t es;
    unsigned char *init[4];   /* each parent before the call, guard included */
    unsigned char *pos;       /* positions as stored (pos_dtype) */
    size_t n_pos, pos_bytes;
    float *ff;                /* NULL, or n_ff values: n_pairs and two NaNs the op must not read */
    size_t n_ff;
} host_case;

static bool is_multi(lmk_rope_mode m)
{
    return m == LMK_ROPE_MROPE || m == LMK_ROPE_IMROPE || m == LMK_ROPE_VISION;
}

static void store_pos(lmk_dtype t, unsigned char *dst, size_t i, int64_t v)
{
    if (t == LMK_I64) {
        memcpy(dst + 8 * i, &v, 8);
    } else {
        const int32_t w = (int32_t)v; /* u32 holds the same bits; lmk reads it as i32 */
        memcpy(dst + 4 * i, &w, 4);
    }
}

static int64_t load_pos(lmk_dtype t, const unsigned char *src, size_t i)
{
    if (t == LMK_I64) {
        int64_t v;
        memcpy(&v, src + 8 * i, 8);
        return v;
    }
    int32_t w;
    memcpy(&w, src + 4 * i, 4);
    return w;
}

/* Positions of every axis: text (all axes start + i), random entries, or a ViT patch grid
 * (row, column, row, column). */
static void make_positions(tst_rng *r, const rcase *c, host_case *h)
{
    const size_t T = c->p.seq_len, axes = is_multi(c->p.mode) ? 4 : 1, W = (size_t)ceil(sqrt((double)T));
    const uint64_t span = (uint64_t)(c->pos_hi - c->pos_lo) + 1;
    for (size_t a = 0; a < axes; a++)
        for (size_t i = 0; i < T; i++) {
            int64_t v = c->pos_lo + (int64_t)i;
            if (c->pos_kind == POS_RANDOM)
                v = c->pos_lo + (int64_t)(tst_rng_u64(r) % span);
            else if (c->pos_kind == POS_GRID)
                v = (int64_t)(a % 2 == 0 ? i / W : i % W);
            store_pos(c->pos_dtype, h->pos, a * T + i, v);
        }
}

static void free_host(host_case *h)
{
    for (int i = 0; i < 4; i++)
        free(h->init[i]);
    free(h->pos);
    free(h->ff);
}

/* Inputs random in [-2, 2] (the gate and v parts too), outputs and guards poisoned, positions,
 * freq_factors (1 for every fourth pair, else in [1, 8], so that angles stay within 2^20). */
static bool make_host(tst_rng *r, const rcase *c, host_case *h)
{
    memset(h, 0, sizeof *h);
    h->c = c;
    h->es = lmk_dtype_size(c->dtype);
    h->g = make_geom(c->lay, c->has_k, c->p.seq_len, c->p.n_heads, c->hk, c->p.head_dim, h->es);
    h->n_pos = (is_multi(c->p.mode) ? 4 : 1) * (size_t)c->p.seq_len;
    h->pos_bytes = h->n_pos * lmk_dtype_size(c->pos_dtype);
    h->pos = malloc(h->pos_bytes);
    bool ok = h->pos != NULL;
    for (int i = 0; i < h->g.n_par && ok; i++) {
        ok = (h->init[i] = malloc(h->g.bytes[i] + TST_GUARD)) != NULL;
        if (!ok)
            break;
        tst_poison(h->init[i], h->g.bytes[i] + TST_GUARD, TST_POISON);
        if (h->g.input[i])
            tst_fill_float(r, c->dtype, h->init[i], h->g.bytes[i] / h->es, -2.0, 2.0);
    }
    const size_t n_pairs = c->p.rope_dim / 2;
    if (ok && c->ff_kind != FF_NONE) {
        h->n_ff = n_pairs + 2;
        ok = (h->ff = malloc(h->n_ff * sizeof *h->ff)) != NULL;
        for (size_t p = 0; ok && p < h->n_ff; p++)
            h->ff[p] = p >= n_pairs                ? NAN
                       : c->ff_kind == FF_GIVEN    ? c->ff_given[p]
                       : p % 4 == 0                ? 1.0f
                                                   : (float)tst_rng_uniform(r, 1.0, 8.0);
    }
    if (ok)
        make_positions(r, c, h);
    if (!ok)
        free_host(h);
    return ok;
}

/* The host arguments of the launch for the reference: inputs from the images before the call,
 * outputs' strides (their data is what got[] shows). */
static lmk_rope_args host_args(const host_case *h, unsigned char *const got[4])
{
    lmk_tensor3 t[4];
    memset(t, 0, sizeof t);
    for (int i = 0; i < 4; i++) {
        const opnd *o = &h->g.o[i];
        if (o->par < 0)
            continue;
        unsigned char *base = (i % 2 ? got : h->init)[o->par] + o->off;
        t[i] = (lmk_tensor3){.data = base, .n = {o->n[0], o->n[1], o->n[2]}, .stride = {o->st[0], o->st[1], 1},
                             .es = h->es};
    }
    return lmk_rope_args_for(&h->c->p, h->c->dtype, t, h->c->has_k, h->pos, h->c->pos_dtype, h->ff);
}

/* ------------------------------------------------------------------------------------------------
 * one launch on a device
 * ---------------------------------------------------------------------------------------------- */

enum { CALL_QK, CALL_Q, CALL_K }; /* q and k; q alone; k alone, passed as q */

typedef struct dev_bufs {
    lmk_buffer *par[4], *op[4], *pos, *ff;
    bool view[4];
} dev_bufs;

static void free_dev(dev_bufs *b)
{
    for (int i = 0; i < 4; i++)
        if (b->view[i])
            lmk_buffer_free(b->op[i]);
    for (int i = 0; i < 4; i++)
        lmk_buffer_free(b->par[i]);
    lmk_buffer_free(b->pos);
    lmk_buffer_free(b->ff);
}

static bool make_dev(tst_dev *d, const host_case *h, dev_bufs *b)
{
    memset(b, 0, sizeof *b);
    const geom *g = &h->g;
    for (int i = 0; i < g->n_par; i++)
        if (!(b->par[i] = tst_buf(d->dev, h->c->dtype, g->shape[i], g->ndim[i], g->bytes[i], TST_GUARD, h->init[i],
                                  g->bytes[i] + TST_GUARD, -1)))
            return false;
    for (int i = 0; i < 4; i++) {
        const opnd *o = &g->o[i];
        if (o->par < 0)
            continue;
        if (o->kind == OP_WHOLE) {
            b->op[i] = b->par[o->par];
        } else if (o->kind == OP_SAME) {
            b->op[i] = b->op[i - 1];
        } else {
            const lmk_status st = lmk_buffer_view_strided(b->par[o->par], o->off, h->c->dtype, o->n, o->st, 3, &b->op[i]);
            if (!TST_REQUIRE(st == LMK_OK, "view of operand %d: %s: %s", i, lmk_status_name(st), lmk_last_error()))
                return false;
            b->view[i] = true;
        }
    }
    const size_t npos[1] = {h->n_pos}, nff[1] = {h->n_ff};
    b->pos = tst_buf(d->dev, h->c->pos_dtype, npos, 1, h->pos_bytes, TST_GUARD, h->pos, h->pos_bytes, TST_POISON);
    if (h->ff)
        b->ff = tst_buf(d->dev, LMK_F32, nff, 1, h->n_ff * 4, TST_GUARD, h->ff, h->n_ff * 4, TST_POISON);
    return b->pos && (!h->ff || b->ff);
}

/* Whether a read-back buffer still holds `want` followed by TST_GUARD poison bytes. */
static bool kept(lmk_buffer *b, const void *want, size_t n)
{
    unsigned char *x = tst_read_all(b);
    const bool ok = x && memcmp(x, want, n) == 0 && tst_find_not(x, n, n + TST_GUARD, TST_POISON) < 0;
    free(x);
    return ok;
}

/* Runs one call (CALL_*) on fresh device buffers made from the host images and reads every parent
 * back into got[]. Positions or freq_factors changed by the call are reported in `side`. */
static lmk_status exec(tst_dev *d, const host_case *h, int call, unsigned char *const got[4], char *side, size_t n)
{
    side[0] = '\0';
    dev_bufs b;
    lmk_status st = LMK_ERR_OUT_OF_MEMORY;
    if (make_dev(d, h, &b)) {
        lmk_rope_params p = h->c->p;
        if (call == CALL_QK) {
            st = lmk_rope(d->stream, b.op[0], b.op[2], b.pos, b.ff, b.op[1], b.op[3], &p);
        } else {
            p.n_k_heads = 0; /* ignored without k */
            if (call == CALL_K)
                p.n_heads = h->c->hk;
            const int i = call == CALL_K ? 2 : 0;
            st = lmk_rope(d->stream, b.op[i], NULL, b.pos, b.ff, b.op[i + 1], NULL, &p);
        }
        if (st == LMK_OK)
            st = lmk_stream_sync(d->stream);
        for (int i = 0; i < h->g.n_par && st == LMK_OK; i++)
            st = lmk_buffer_read(b.par[i], 0, got[i], h->g.bytes[i] + TST_GUARD);
        if (st == LMK_OK && !kept(b.pos, h->pos, h->pos_bytes))
            snprintf(side, n, "the positions buffer changed");
        if (st == LMK_OK && b.ff && !kept(b.ff, h->ff, h->n_ff * 4))
            snprintf(side, n, "the freq_factors buffer changed");
    }
    free_dev(&b);
    return st;
}

/* ------------------------------------------------------------------------------------------------
 * checks of one launch
 * ---------------------------------------------------------------------------------------------- */

/* Copies operand o's elements from one parent image to another (same layout). */
static void copy_elements(const opnd *o, size_t es, unsigned char *dst, const unsigned char *src)
{
    for (size_t t = 0; t < o->n[0]; t++)
        for (size_t hh = 0; hh < o->n[1]; hh++) {
            const size_t at = o->off + (t * o->st[0] + hh * o->st[1]) * es;
            memcpy(dst + at, src + at, o->n[2] * es);
        }
}

/* Every byte of every parent that is not an element of an output of this call (the gate, v, pads,
 * guards, and k's buffers in a q-only call) must be as it was. Overwrites the outputs' elements of
 * got with the inputs' (so it runs last), then compares whole images. */
static bool rest_kept(const host_case *h, int call, unsigned char *const got[4], char *why, size_t n)
{
    for (int o = 1; o < 4; o += 2)
        if (h->g.o[o].par >= 0 && (call == CALL_QK || (call == CALL_Q) == (o == 1)))
            copy_elements(&h->g.o[o], h->es, got[h->g.o[o].par], h->init[h->g.o[o].par]);
    for (int i = 0; i < h->g.n_par; i++) {
        const long long bad = tst_bits_diff(got[i], h->init[i], h->g.bytes[i] + TST_GUARD);
        if (bad >= 0) {
            snprintf(why, n, "buffer %d byte %lld (of %zu used) outside the outputs changed: 0x%02x -> 0x%02x", i, bad,
                     h->g.bytes[i], h->init[i][bad], got[i][bad]);
            return false;
        }
    }
    return true;
}

/* Whether operand o's elements are the same bytes in two read-backs. */
static bool same_elements(const opnd *o, size_t es, unsigned char *const a[4], unsigned char *const b[4])
{
    for (size_t t = 0; t < o->n[0]; t++)
        for (size_t hh = 0; hh < o->n[1]; hh++) {
            const size_t at = o->off + (t * o->st[0] + hh * o->st[1]) * es;
            if (memcmp(a[o->par] + at, b[o->par] + at, o->n[2] * es) != 0)
                return false;
        }
    return true;
}

static bool hf_compare(const host_case *h, unsigned char *const got[4], char *msg, size_t n);

static unsigned char **alloc_images(const host_case *h)
{
    unsigned char **img = calloc(4, sizeof *img);
    for (int i = 0; img && i < h->g.n_par; i++)
        if (!(img[i] = malloc(h->g.bytes[i] + TST_GUARD))) {
            for (int k = 0; k < i; k++)
                free(img[k]);
            free(img);
            return NULL;
        }
    return img;
}

static void free_images(unsigned char **img)
{
    for (int i = 0; img && i < 4; i++)
        free(img[i]);
    free(img);
}

/* When set (test_long_prompts), the GPU opened with LMK_CUDA_BULK=0: every call must give it the
 * same bits as the device under test (the bulk kernel and the others share their arithmetic). */
static tst_dev *g_other_kernels;

/* Determinism (section 6): the call again gives the same bits; a q+k call of up to 257 tokens
 * equals q alone and k alone. Writes the first difference to why. */
static bool deterministic(tst_dev *d, const host_case *h, unsigned char *const got[4], char *why, size_t n)
{
    unsigned char **again = alloc_images(h);
    if (!again) {
        snprintf(why, n, "out of host memory");
        return false;
    }
    char side[128];
    const int first = h->c->has_k ? CALL_QK : CALL_Q;
    lmk_status st = exec(d, h, first, again, side, sizeof side);
    bool ok = st == LMK_OK;
    for (int i = 0; ok && i < h->g.n_par; i++)
        ok = memcmp(got[i], again[i], h->g.bytes[i] + TST_GUARD) == 0;
    if (!ok)
        snprintf(why, n, "a second identical call gave other bits (%s)", lmk_status_name(st));
    if (ok && g_other_kernels) {
        st = exec(g_other_kernels, h, first, again, side, sizeof side);
        ok = st == LMK_OK;
        for (int i = 0; ok && i < h->g.n_par; i++)
            ok = memcmp(got[i], again[i], h->g.bytes[i] + TST_GUARD) == 0;
        if (!ok)
            snprintf(why, n, "the call with LMK_CUDA_BULK=0 (the other prefill kernels) gave other bits (%s)",
                     lmk_status_name(st));
    }
    /* The split costs two more launches; prompt-length cases (seconds each) keep the repeat only. */
    for (int call = CALL_Q; ok && h->c->has_k && h->c->p.seq_len <= 257 && call <= CALL_K; call++) {
        st = exec(d, h, call, again, side, sizeof side);
        ok = st == LMK_OK && same_elements(&h->g.o[call == CALL_Q ? 1 : 3], h->es, got, again);
        if (!ok)
            snprintf(why, n, "the q+k call's %s differs from a %s-only call (%s \"%s\")", call == CALL_Q ? "q" : "k",
                     call == CALL_Q ? "q" : "k", lmk_status_name(st), st == LMK_OK ? "" : lmk_last_error());
    }
    free_images(again);
    return ok;
}

/* The precision figures of section 4 (f32 launches only): err is the launch's largest error. */
static void note_precision(const lmk_rope_args *a, double err)
{
    if (a->dtype != LMK_F32)
        return;
    const double m = fabs(a->angle.mscale);
    if (m <= 1.0) {
        g_fig.n_m1++;
        if (!(err <= g_fig.f32_max_m1))
            g_fig.f32_max_m1 = err;
    }
    g_fig.n_f32++;
    if (!(err / fmax(1.0, m) <= g_fig.f32_max_rel))
        g_fig.f32_max_rel = err / fmax(1.0, m);
}

/* All checks of a launch that returned LMK_OK; the first failing one is described in why. */
static bool check_launch(tst_dev *d, const host_case *h, unsigned char *const got[4], const char *side, char *why,
                         size_t n)
{
    const int call = h->c->has_k ? CALL_QK : CALL_Q;
    if (side[0]) {
        snprintf(why, n, "%s", side);
        return false;
    }
    const lmk_rope_args a = host_args(h, got);
    const void *const g[2] = {got[h->g.o[1].par] + h->g.o[1].off,
                              h->c->has_k ? (const void *)(got[h->g.o[3].par] + h->g.o[3].off) : NULL};
    tst_result res;
    if (!tst_rope_verify(&a, g, true, &res)) { /* the contract: f32 1e-5 * max(1, m), else 1 ulp + 1e-6 */
        snprintf(why, n, "against the float64 reference: %s", res.msg);
        return false;
    }
    note_precision(&a, res.max_err);
    char msg[512];
    if (h->c->hf) {
        const bool same = hf_compare(h, got, msg, sizeof msg);
        if (same == h->c->hf_must_differ) {
            snprintf(why, n, "%s", same ? "the negative control matched Hugging Face's untruncated YaRN" : msg);
            return false;
        }
    }
    return deterministic(d, h, got, why, n) && rest_kept(h, call, got, why, n);
}

static const char *mode_name(lmk_rope_mode m)
{
    return m == LMK_ROPE_NORMAL   ? "normal"
           : m == LMK_ROPE_NEOX   ? "neox"
           : m == LMK_ROPE_MROPE  ? "mrope"
           : m == LMK_ROPE_IMROPE ? "imrope"
           : m == LMK_ROPE_VISION ? "vision"
                                  : "mode?";
}

/* Appends to buf (of n bytes, *u used) while there is room. */
static void add(char *buf, size_t n, size_t *u, const char *fmt, ...) LMK_PRINTF(4, 5);
static void add(char *buf, size_t n, size_t *u, const char *fmt, ...)
{
    if (*u >= n)
        return;
    va_list ap;
    va_start(ap, fmt);
    const int k = vsnprintf(buf + *u, n - *u, fmt, ap);
    va_end(ap);
    *u += k > 0 ? (size_t)k : 0;
}

/* A case named the way ggml's test-backend-ops names cases, parameters first and the model after
 * "//": "rope neox hd=128 rd=128 nh=32/8 T=7 f32 half_rope base=500000 af=1 inplace-qkv ff
 * pos=i32:text[..] // llama-3.1-8B"; only the scaling fields that are set are shown. */
static char *case_name(char *buf, size_t n, const rcase *c)
{
    static const char *const pos_kind[3] = {"text", "random", "grid"};
    const lmk_rope_params *p = &c->p;
    size_t u = 0;
    add(buf, n, &u, "rope %s hd=%u rd=%u nh=%u", mode_name(p->mode), p->head_dim, p->rope_dim, p->n_heads);
    if (c->has_k)
        add(buf, n, &u, "/%u", p->n_k_heads);
    add(buf, n, &u, " T=%u %s %s base=%g", p->seq_len, lmk_dtype_name(c->dtype),
        p->mode == LMK_ROPE_NORMAL ? "adjacent" : p->pairing == LMK_ROPE_PAIR_HALF_HEAD ? "half_head" : "half_rope",
        (double)p->freq_base);
    if (is_multi(p->mode))
        add(buf, n, &u, " sections=%u,%u,%u,%u", p->sections[0], p->sections[1], p->sections[2], p->sections[3]);
    if (p->freq_scale != 0.0f)
        add(buf, n, &u, " fs=%g", (double)p->freq_scale);
    if (p->ext_factor != 0.0f)
        add(buf, n, &u, " ef=%g ctx=%u", (double)p->ext_factor, p->n_ctx_orig);
    if (p->beta_fast != 0.0f || p->beta_slow != 0.0f)
        add(buf, n, &u, " bf=%g bs=%g", (double)p->beta_fast, (double)p->beta_slow);
    if (p->attn_factor != 0.0f)
        add(buf, n, &u, " af=%g", (double)p->attn_factor);
    add(buf, n, &u, " %s%s pos=%s:%s[%" PRId64 ",%" PRId64 "]", k_lay_name[c->lay], c->ff_kind != FF_NONE ? " ff" : "",
        lmk_dtype_name(c->pos_dtype), pos_kind[c->pos_kind], c->pos_lo,
        c->pos_kind == POS_TEXT ? c->pos_lo + (int64_t)p->seq_len - 1 : c->pos_hi);
    if (c->comment)
        add(buf, n, &u, " // %s", c->comment);
    return buf;
}

/* One case: fresh inputs, one launch, every check, one verdict. */
static void run_case(tst_dev *d, const rcase *c)
{
    const uint64_t seed = tst_case_seed();
    tst_rng r = tst_rng_make(seed);
    char name[400], why[768] = "";
    case_name(name, sizeof name, c);
    if (c->progress) {
        printf("  %s [%s] ...\n", name, d->name);
        fflush(stdout);
    }
    host_case h;
    if (!make_host(&r, c, &h)) {
        VERDICT(false, "%s [%s]: out of host memory", name, d->name);
        return;
    }
    unsigned char **got = alloc_images(&h);
    char side[128] = "";
    const lmk_status st = got ? exec(d, &h, c->has_k ? CALL_QK : CALL_Q, got, side, sizeof side) : LMK_ERR_OUT_OF_MEMORY;
    g_fig.cases++;
    bool ok = st == LMK_OK;
    if (!ok) {
        snprintf(why, sizeof why, "%s \"%s\"", lmk_status_name(st), lmk_last_error());
        if (st == LMK_ERR_UNSUPPORTED && g_fig.unsupported++ == 0)
            snprintf(g_fig.unsupported_msg, sizeof g_fig.unsupported_msg, "%s", lmk_last_error());
    } else {
        ok = check_launch(d, &h, got, side, why, sizeof why);
    }
    g_fig.failed += !ok;
    VERDICT(ok, "%s [%s] seed 0x%016" PRIx64 ": %s", name, d->name, seed, why);
    free_images(got);
    free_host(&h);
}

/* ------------------------------------------------------------------------------------------------
 * 1. the matrix
 * ---------------------------------------------------------------------------------------------- */

typedef struct mode_variant {
    lmk_rope_mode mode;
    lmk_rope_pairing pairing;
    uint32_t head_dim, rope_dim; /* rope_dim: the partial one; every third case rotates the whole head */
    float base;
    uint32_t sections[3][4];
} mode_variant;

static const mode_variant k_modes[] = {
    {LMK_ROPE_NORMAL, LMK_ROPE_PAIR_HALF_ROPE, 24, 16, 1e4f, {{0}}},
    {LMK_ROPE_NEOX, LMK_ROPE_PAIR_HALF_ROPE, 32, 20, 5e5f, {{0}}},
    {LMK_ROPE_NEOX, LMK_ROPE_PAIR_HALF_HEAD, 32, 20, 1e6f, {{0}}},
    {LMK_ROPE_MROPE, LMK_ROPE_PAIR_HALF_ROPE, 32, 24, 1e6f, {{4, 3, 3, 2}, {3, 2, 2, 0}, {6, 3, 3, 0}}},
    {LMK_ROPE_MROPE, LMK_ROPE_PAIR_HALF_HEAD, 32, 24, 1e6f, {{4, 3, 3, 2}, {3, 2, 2, 0}, {6, 3, 3, 0}}},
    {LMK_ROPE_IMROPE, LMK_ROPE_PAIR_HALF_ROPE, 32, 24, 1e7f, {{4, 4, 4, 0}, {3, 3, 2, 1}, {11, 11, 10, 0}}},
    {LMK_ROPE_IMROPE, LMK_ROPE_PAIR_HALF_HEAD, 32, 20, 1e7f, {{4, 4, 4, 0}, {3, 3, 2, 1}, {11, 11, 10, 0}}},
    {LMK_ROPE_VISION, LMK_ROPE_PAIR_HALF_ROPE, 16, 16, 1e4f, {{4, 4, 0, 0}, {2, 2, 2, 2}, {3, 2, 2, 1}}},
};
#define N_MODES ((int)(sizeof k_modes / sizeof k_modes[0]))

enum { SC_NONE, SC_LINEAR, SC_YARN, SC_YARN_BETAS, SC_YARN_HALF, SC_FF, SC_YARN_FF, SC_COUNT };

/* The scaling fields of a matrix case. The YaRN ramps of these shapes cover the middle pairs
 * (e.g. rope_dim 24, base 1e4, n_ctx_orig 4096: pairs 3..9 of 12). */
static void set_scaling(lmk_rope_params *p, int sc)
{
    if (sc == SC_LINEAR)
        p->freq_scale = 0.25f;
    if (sc == SC_YARN || sc == SC_YARN_FF) {
        p->freq_scale = 0.125f;
        p->ext_factor = 1.0f;
        p->n_ctx_orig = 4096;
    }
    if (sc == SC_YARN_BETAS) {
        p->freq_scale = 1.0f / 16.0f;
        p->ext_factor = 1.0f;
        p->n_ctx_orig = 2048;
        p->beta_fast = 24.0f;
        p->beta_slow = 2.0f;
        p->attn_factor = 0.7f; /* m = 0.7 * (1 + 0.1 ln 16) < 1: counts for section 4 */
    }
    if (sc == SC_YARN_HALF) { /* a partial ramp: ext_factor scales it */
        p->freq_scale = 0.25f;
        p->ext_factor = 0.5f;
        p->n_ctx_orig = 8192;
    }
    if (sc == SC_FF)
        p->attn_factor = 1.3465736f; /* gpt-oss's 0.1 ln 32 + 1 */
}

/* The matrix's prompt lengths: mostly short (the CUDA decode kernel), every fifth case long enough
 * (past 2 blocks per SM of a 132-SM GPU with these few heads) that CUDA takes its prefill kernel,
 * so both kernels see every mode, scaling, dtype and layout. */
static uint32_t matrix_T(uint32_t idx)
{
    return idx % 5 == 2 ? 265 + (idx * 13) % 300 : 1 + (idx * 7) % 12;
}

static void test_matrix(tst_dev *d)
{
    const int before = g_fig.failed, cases = g_fig.cases;
    uint32_t idx = 0;
    for (int mv = 0; mv < N_MODES; mv++)
        for (int sc = 0; sc < SC_COUNT; sc++)
            for (int dt = 0; dt < 3; dt++)
                for (int lay = 0; lay < LAY_COUNT; lay++)
                    for (int k = 0; k < 2; k++)
                        for (int pd = 0; pd < 3; pd++, idx++) {
                            const mode_variant *m = &k_modes[mv];
                            const bool large = (lay + k + pd) % 2 == 1, full = idx % 3 == 0;
                            rcase c = {.has_k = k == 1, .hk = 1 + (idx / 4) % 2, .dtype = k_dtypes[dt],
                                       .pos_dtype = k_pos_dtypes[pd], .lay = lay,
                                       .ff_kind = sc == SC_FF || sc == SC_YARN_FF ? FF_RANDOM : FF_NONE};
                            c.p = (lmk_rope_params){.head_dim = m->head_dim,
                                                    .rope_dim = full ? m->head_dim : m->rope_dim,
                                                    .n_heads = 1 + idx % 4, .seq_len = matrix_T(idx),
                                                    .freq_base = m->base, .mode = m->mode, .pairing = m->pairing};
                            memcpy(c.p.sections, m->sections[(dt + lay) % 3], sizeof c.p.sections);
                            /* k's heads when k is given; anything (it is ignored) when not */
                            c.p.n_k_heads = c.has_k ? c.hk : idx % 2 ? 0u : 9u;
                            set_scaling(&c.p, sc);
                            if (large) {
                                c.pos_kind = POS_RANDOM, c.pos_lo = -(1 << 20), c.pos_hi = 1 << 20;
                            } else if (m->mode == LMK_ROPE_VISION) {
                                c.pos_kind = POS_GRID;
                            } else if (is_multi(m->mode)) {
                                c.pos_kind = POS_RANDOM, c.pos_lo = -64, c.pos_hi = 5000;
                            } else {
                                c.pos_kind = POS_TEXT, c.pos_lo = (int64_t)(idx * 977u % 10000u);
                            }
                            run_case(d, &c);
                        }
    printf("  [%s] matrix: %d cases, %d failed\n", d->name, g_fig.cases - cases, g_fig.failed - before);
}

/* ------------------------------------------------------------------------------------------------
 * 3 (used by 2). Hugging Face's inv_freq formulas, in float64
 * ---------------------------------------------------------------------------------------------- */

/* inv_freq[p] for p < dim/2 and the attention scaling of a Hugging Face rope configuration:
 * default 1 / base^(2p/dim); linear divides by factor; llama3 keeps wavelengths below
 * orig/high_freq_factor, divides those above orig/low_freq_factor by factor and blends in between;
 * yarn mixes interpolation 1/(factor base^(2p/dim)) and extrapolation 1/base^(2p/dim) by a linear
 * ramp over the correction range (floored and ceiled only when truncate), attention scaling
 * 0.1 ln(factor) + 1. */
static double hf_inv_freq(const hf_rope *hf, double base, uint32_t dim, double *inv)
{
    const uint32_t half = dim / 2;
    for (uint32_t p = 0; p < half; p++)
        inv[p] = 1.0 / pow(base, (double)(2 * p) / (double)dim);
    if (hf->type == HF_LINEAR)
        for (uint32_t p = 0; p < half; p++)
            inv[p] /= hf->factor;
    if (hf->type == HF_LLAMA3) {
        const double low_wavelen = hf->orig / hf->low_freq_factor, high_wavelen = hf->orig / hf->high_freq_factor;
        for (uint32_t p = 0; p < half; p++) {
            const double wavelen = 2.0 * k_pi / inv[p];
            if (wavelen > low_wavelen) {
                inv[p] /= hf->factor;
            } else if (!(wavelen < high_wavelen)) {
                const double s = (hf->orig / wavelen - hf->low_freq_factor) / (hf->high_freq_factor - hf->low_freq_factor);
                inv[p] = (1.0 - s) * inv[p] / hf->factor + s * inv[p];
            }
        }
    }
    if (hf->type != HF_YARN)
        return 1.0;
    /* find_correction_dim: the dimension at which num_rotations wavelengths fit the original context */
#define HF_CORR(rot) ((double)dim * log(hf->orig / ((rot) * 2.0 * k_pi)) / (2.0 * log(base)))
    double low = HF_CORR(hf->beta_fast), high = HF_CORR(hf->beta_slow);
#undef HF_CORR
    if (hf->truncate)
        low = floor(low), high = ceil(high);
    low = fmax(low, 0.0);
    high = fmin(high, (double)dim - 1.0);
    if (low == high)
        high += 0.001;
    for (uint32_t p = 0; p < half; p++) {
        const double ramp = fmin(fmax(((double)p - low) / (high - low), 0.0), 1.0);
        const double extrapolation = 1.0 - ramp, pos_freq = pow(base, (double)(2 * p) / (double)dim);
        inv[p] = 1.0 / (hf->factor * pos_freq) * (1.0 - extrapolation) + 1.0 / pos_freq * extrapolation;
    }
    return hf->factor <= 1.0 ? 1.0 : 0.1 * log(hf->factor) + 1.0;
}

/* lmk's fields for a Hugging Face configuration, as lmk.h maps them: linear and yarn with
 * truncation through freq_scale / ext_factor / n_ctx_orig; llama3 and yarn without truncation
 * through freq_factors[p] = base^(-2p/n) / inv_freq_HF[p] and attn_factor = attention scaling.
 * Returns whether ff (n_pairs entries) was filled. */
static bool hf_to_lmk(const hf_rope *hf, lmk_rope_params *p, float *ff)
{
    double inv[MAX_PAIRS];
    const double base = p->freq_base, att = hf_inv_freq(hf, base, p->rope_dim, inv);
    if (hf->type == HF_DEFAULT)
        return false;
    if (hf->type == HF_LINEAR || (hf->type == HF_YARN && hf->truncate)) {
        p->freq_scale = (float)(1.0 / hf->factor);
        if (hf->type == HF_YARN) {
            p->ext_factor = 1.0f;
            p->n_ctx_orig = hf->orig;
            p->beta_fast = (float)hf->beta_fast;
            p->beta_slow = (float)hf->beta_slow;
        }
        return false;
    }
    for (uint32_t k = 0; k < p->rope_dim / 2; k++)
        ff[k] = (float)(pow(base, -2.0 * k / (double)p->rope_dim) / inv[k]);
    p->attn_factor = (float)att;
    return true;
}

/* The axis Hugging Face gives pair p: t for text; Qwen3-VL's interleaved layout (h at p = 1, 4, ...
 * below 3*s1, w at p = 2, 5, ... below 3*s2, t elsewhere) for IMROPE. */
static int hf_axis(const lmk_rope_params *p, uint32_t pair)
{
    if (p->mode != LMK_ROPE_IMROPE)
        return 0;
    if (pair % 3 == 1 && pair < 3 * p->sections[1])
        return 1;
    if (pair % 3 == 2 && pair < 3 * p->sections[2])
        return 2;
    return 0;
}

/* One rotated pair of an HF comparison: want (a, b) against got, within the contract plus what the
 * f32 rounding of lmk's fields may add: an angle off by dtheta moves the pair by at most
 * |(a, b)| * m * dtheta, a scale off by dm by |(a, b)| * dm. Returns the error over tolerance (<= 0
 * when within). */
static double hf_pair_excess(lmk_dtype t, double m, double want, double got, double allow)
{
    const double tol = (t == LMK_F32 ? F32_TOL * fmax(1.0, m) : lmk_rope_tolerance(t, want)) + allow;
    const double err = fabs(got - want);
    return err <= tol ? err - tol : INFINITY;
}

/* Hugging Face's rotary embedding of each tensor in float64 (rotate_half on the first rope_dim
 * elements, cos and sin scaled by the attention scaling, the rest passed through) against what
 * lmk wrote. */
static bool hf_compare(const host_case *h, unsigned char *const got[4], char *msg, size_t n)
{
    const lmk_rope_params *p = &h->c->p;
    const uint32_t half = p->rope_dim / 2;
    double inv[MAX_PAIRS], dinv[MAX_PAIRS];
    const double att = hf_inv_freq(h->c->hf, p->freq_base, p->rope_dim, inv);
    const lmk_rope_args a = host_args(h, got);
    /* Only the f32 rounding of attn_factor = attention scaling is allowed for: lmk's own m
     * (1 + 0.1 ln(1 / freq_scale) for YaRN fields) must be HF's. */
    const double m = a.angle.mscale, dm = h->ff ? fabs((double)p->attn_factor - att) : 0.0;
    for (uint32_t k = 0; k < half; k++) /* lmk's own factor where freq_factors carry HF's */
        dinv[k] = h->ff ? fabs(pow(p->freq_base, -2.0 * k / (double)p->rope_dim) / (double)h->ff[k] - inv[k]) : 0.0;
    for (int ti = 0; ti < (h->c->has_k ? 2 : 1); ti++) {
        const opnd *in = &h->g.o[2 * ti], *out = &h->g.o[2 * ti + 1];
        for (size_t t = 0; t < in->n[0]; t++)
            for (size_t hh = 0; hh < in->n[1]; hh++) {
                const unsigned char *x = h->init[in->par] + in->off + (t * in->st[0] + hh * in->st[1]) * h->es;
                const unsigned char *y = got[out->par] + out->off + (t * out->st[0] + hh * out->st[1]) * h->es;
                for (uint32_t k = 0; k < half; k++) {
                    const int axis = hf_axis(p, k);
                    const double pos = (double)load_pos(h->c->pos_dtype, h->pos,
                                                        (is_multi(p->mode) ? (size_t)axis * p->seq_len : 0) + t);
                    const double th = pos * inv[k], c = cos(th) * att, s = sin(th) * att;
                    const double xa = tst_load(h->c->dtype, x, k), xb = tst_load(h->c->dtype, x, k + half);
                    const double allow = hypot(xa, xb) * (m * fabs(pos) * dinv[k] + dm);
                    const double ea = hf_pair_excess(h->c->dtype, m, xa * c - xb * s, tst_load(h->c->dtype, y, k), allow);
                    const double eb =
                        hf_pair_excess(h->c->dtype, m, xb * c + xa * s, tst_load(h->c->dtype, y, k + half), allow);
                    if (ea > 0.0 || eb > 0.0) {
                        snprintf(msg, n,
                                 "against Hugging Face's formula: tensor %d token %zu head %zu pair %u (pos %.0f, "
                                 "inv_freq %.9g): got %.9g %.9g, want %.9g %.9g",
                                 ti, t, hh, k, pos, inv[k], tst_load(h->c->dtype, y, k),
                                 tst_load(h->c->dtype, y, k + half), xa * c - xb * s, xb * c + xa * s);
                        return false;
                    }
                }
                if (memcmp(x + p->rope_dim * h->es, y + p->rope_dim * h->es, (p->head_dim - p->rope_dim) * h->es)) {
                    snprintf(msg, n, "tensor %d token %zu head %zu: a passed-through element changed", ti, t, hh);
                    return false;
                }
            }
    }
    return true;
}

/* ------------------------------------------------------------------------------------------------
 * 2. the real model shapes
 * ---------------------------------------------------------------------------------------------- */

typedef struct model {
    const char *name;
    uint32_t hq, hk, head_dim, rope_dim;
    float base;
    lmk_rope_mode mode;
    uint32_t sections[4];
    hf_rope hf;
    int lay;           /* the layout the model's attention hands to rope */
    int pos_kind;
    int64_t ctx;       /* text positions lie in [0, ctx) */
} model;

/* The configurations as initialisers (a const object is no constant expression in C). */
#define HF_NONE {.type = HF_DEFAULT}
#define HF_LLAMA3_8 {.type = HF_LLAMA3, .factor = 8, .low_freq_factor = 1, .high_freq_factor = 4, .orig = 8192}
#define HF_GPT_OSS {.type = HF_YARN, .factor = 32, .beta_fast = 32, .beta_slow = 1, .orig = 4096, .truncate = false}
#define HF_QWEN35_1M {.type = HF_YARN, .factor = 4, .beta_fast = 32, .beta_slow = 1, .orig = 262144, .truncate = true}
static const hf_rope k_hf_llama3 = HF_LLAMA3_8, k_hf_gpt_oss = HF_GPT_OSS, k_hf_qwen35_1m = HF_QWEN35_1M;

static const model k_models[] = {
    {"llama-3.1-8B", 32, 8, 128, 128, 5e5f, LMK_ROPE_NEOX, {0}, HF_LLAMA3_8, LAY_INPLACE_QKV, POS_TEXT, 131072},
    {"qwen3-8B", 32, 8, 128, 128, 1e6f, LMK_ROPE_NEOX, {0}, HF_NONE, LAY_DENSE, POS_TEXT, 40960},
    {"qwen3.5-27B", 24, 4, 256, 64, 1e7f, LMK_ROPE_IMROPE, {11, 11, 10, 0}, HF_NONE, LAY_QGATE, POS_TEXT, 262144},
    {"qwen3.5-27B yarn x4 (1M context)", 24, 4, 256, 64, 1e7f, LMK_ROPE_IMROPE, {11, 11, 10, 0}, HF_QWEN35_1M,
     LAY_QGATE, POS_TEXT, 1 << 20},
    {"gpt-oss-20B", 64, 8, 64, 64, 150000.0f, LMK_ROPE_NEOX, {0}, HF_GPT_OSS, LAY_INPLACE_QKV, POS_TEXT, 131072},
    {"gpt-j-6B", 16, 16, 256, 64, 1e4f, LMK_ROPE_NORMAL, {0}, HF_NONE, LAY_DENSE, POS_TEXT, 2048},
    {"qwen2-vl ViT", 16, 16, 80, 80, 1e4f, LMK_ROPE_VISION, {20, 20, 0, 0}, HF_NONE, LAY_QKV, POS_GRID, 0},
};
#define N_MODELS ((int)(sizeof k_models / sizeof k_models[0]))

/* A model's case at T tokens; ff receives its freq_factors (when its mapping uses them). */
static rcase model_case(const model *md, uint32_t T, lmk_dtype dt, int lay, float *ff, uint64_t start)
{
    rcase c = {.has_k = true, .hk = md->hk, .dtype = dt, .pos_dtype = LMK_I32, .lay = lay, .pos_kind = md->pos_kind,
               .comment = md->name};
    c.p = (lmk_rope_params){.head_dim = md->head_dim, .rope_dim = md->rope_dim, .n_heads = md->hq, .seq_len = T,
                            .freq_base = md->base, .mode = md->mode, .n_k_heads = md->hk};
    memcpy(c.p.sections, md->sections, sizeof c.p.sections);
    if (hf_to_lmk(&md->hf, &c.p, ff))
        c.ff_kind = FF_GIVEN, c.ff_given = ff;
    if (md->pos_kind == POS_TEXT) /* decode near the end of the context, prompts anywhere in it */
        c.pos_lo = md->ctx > (int64_t)T ? (int64_t)(start % (uint64_t)(md->ctx - T + 1)) : 0;
    return c;
}

static void test_models(tst_dev *d)
{
    const uint32_t big = tst_quick() ? 257 : 4106;
    const uint32_t Ts[3] = {1, 7, big};
    const int before = g_fig.failed, cases = g_fig.cases;
    float ff[MAX_PAIRS];
    tst_rng r = tst_rng_make(tst_case_seed());
    for (int mi = 0; mi < N_MODELS; mi++) {
        const model *md = &k_models[mi];
        for (int ti = 0; ti < 3; ti++)
            for (int dt = 0; dt < 3; dt++)
                for (int dense = 0; dense < 2; dense++) {
                    if (dense && md->lay == LAY_DENSE)
                        continue;
                    if (Ts[ti] == big && (dense || k_dtypes[dt] == LMK_F16))
                        continue; /* prompt length: the model's own layout, f32 and bf16 */
                    const uint64_t start = Ts[ti] == 1 ? (uint64_t)md->ctx - 1 - tst_rng_below(&r, 64) : tst_rng_u64(&r);
                    rcase c = model_case(md, Ts[ti], k_dtypes[dt], dense ? LAY_DENSE : md->lay, ff, start);
                    c.progress = Ts[ti] == big;
                    run_case(d, &c);
                }
    }
    printf("  [%s] model shapes: %d cases, %d failed\n", d->name, g_fig.cases - cases, g_fig.failed - before);
}

/* Long prompts on a GPU, in the launches sm_90 and later give the bulk kernel (docs/cuda.md, "rope:
 * the four kernels": out of place with rope_dim < head_dim). On an H200 (132 SMs,
 * 228 KB of shared memory an SM, 3 blocks an SM) each case reaches a different part of it: Qwen3.5-27B
 * q and k in bf16 (a token a tile, 5 stages: the ring wraps, stages refilled two tiles back), in f16
 * with i64 positions and random freq_factors, with YaRN's ramp and m (the 1M-context mapping); q
 * alone in f32 (24 KB a token: 3 stages, refilled one tile back); GPT-J's interleaved pairs (4
 * stages); and 4 heads of q alone in bf16 at 12001 tokens (8 tokens a tile: several tiles a block
 * and a short last tile). The strided ones take bulk tensor copies (a tensor map per side, mode
 * 3): q read out of q|gate and written into another (both sides), in f32 alone, with YaRN and i64
 * positions, and 4 heads at 12001 tokens (a short last tile: its box passes the tensor's end). Each
 * call is also run on the same GPU opened with LMK_CUDA_BULK=0 (the other prefill kernels), which
 * must give the same bits; tests/gpu_suite.sh also runs this whole program with LMK_CUDA_BULK=0. */
static void test_long_prompts(tst_dev *d)
{
    static const struct {
        int model; /* k_models: qwen3.5-27B, its yarn x4 mapping, gpt-j-6B */
        lmk_dtype dt;
        uint32_t T, q_heads; /* q_heads 0: the model's; with k */
        bool i64_ff, q_alone;
        int lay;
    } lp[] = {
        {2, LMK_BF16, 2711, 0, false, false, LAY_DENSE},  {2, LMK_F16, 2711, 0, true, false, LAY_DENSE},
        {3, LMK_BF16, 2711, 0, false, false, LAY_DENSE},  {2, LMK_F32, 2711, 0, false, true, LAY_DENSE},
        {5, LMK_BF16, 2711, 0, false, false, LAY_DENSE},  {5, LMK_F16, 2711, 0, true, false, LAY_DENSE},
        {2, LMK_BF16, 12001, 4, false, true, LAY_DENSE},  {2, LMK_BF16, 2711, 0, false, false, LAY_QGATE},
        {2, LMK_F32, 2711, 0, false, true, LAY_QGATE},    {3, LMK_F16, 2711, 0, true, false, LAY_QGATE},
        {2, LMK_BF16, 12001, 4, false, true, LAY_QGATE},
    };
    if (d->backend != LMK_BACKEND_CUDA)
        return;
    const char *was = getenv("LMK_CUDA_BULK");
    char saved[16] = "";
    if (was)
        snprintf(saved, sizeof saved, "%s", was);
    setenv("LMK_CUDA_BULK", "0", 1);
    tst_dev other = {.name = "cuda:0 LMK_CUDA_BULK=0", .backend = LMK_BACKEND_CUDA};
    lmk_status st = lmk_device_open(LMK_BACKEND_CUDA, 0, &other.dev);
    if (st == LMK_OK)
        st = lmk_stream_create(other.dev, &other.stream);
    if (was)
        setenv("LMK_CUDA_BULK", saved, 1);
    else
        unsetenv("LMK_CUDA_BULK");
    if (!TST_REQUIRE(st == LMK_OK, "cuda:0 with LMK_CUDA_BULK=0: %s: %s", lmk_status_name(st), lmk_last_error())) {
        if (other.dev)
            lmk_device_close(other.dev);
        return;
    }
    g_other_kernels = &other;
    const int before = g_fig.failed, cases = g_fig.cases;
    float ff[MAX_PAIRS];
    tst_rng r = tst_rng_make(tst_case_seed());
    for (int i = 0; i < (int)(sizeof lp / sizeof lp[0]); i++) {
        rcase c = model_case(&k_models[lp[i].model], lp[i].T, lp[i].dt, lp[i].lay, ff, tst_rng_u64(&r));
        if (lp[i].q_heads)
            c.p.n_heads = lp[i].q_heads;
        if (lp[i].i64_ff)
            c.pos_dtype = LMK_I64, c.ff_kind = FF_RANDOM;
        c.has_k = !lp[i].q_alone;
        c.progress = true;
        run_case(d, &c);
    }
    g_other_kernels = NULL;
    lmk_stream_destroy(other.stream);
    lmk_device_close(other.dev);
    printf("  [%s] long prompts: %d cases, %d failed\n", d->name, g_fig.cases - cases, g_fig.failed - before);
}

/* ------------------------------------------------------------------------------------------------
 * 3. against Hugging Face's formulas
 * ---------------------------------------------------------------------------------------------- */

static void test_hf(tst_dev *d)
{
    static const hf_rope linear4 = {.type = HF_LINEAR, .factor = 4};
    const struct {
        const char *what;
        int model;         /* k_models index: the shape and base */
        const hf_rope *hf;
        int64_t pos_hi;
    } cases[] = {
        {"HF linear factor 4 on qwen3-8B", 1, &linear4, 163840},
        {"HF llama3 (factor 8, 1, 4, 8192): llama-3.1-8B", 0, &k_hf_llama3, 131071},
        {"HF yarn truncate=true (factor 4, 262144): qwen3.5-27B 1M", 3, &k_hf_qwen35_1m, (1 << 20) - 1},
        {"HF yarn truncate=false (factor 32, 32, 1, 4096): gpt-oss-20B", 4, &k_hf_gpt_oss, 131071},
    };
    const int before = g_fig.failed, n0 = g_fig.cases;
    float ff[MAX_PAIRS];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int dt = 0; dt < 2; dt++) {
            model md = k_models[cases[i].model];
            md.hf = *cases[i].hf;
            rcase c = model_case(&md, 16, k_dtypes[dt], LAY_DENSE, ff, 0);
            c.hf = cases[i].hf;
            c.pos_kind = POS_RANDOM, c.pos_lo = 0, c.pos_hi = cases[i].pos_hi;
            c.comment = cases[i].what;
            run_case(d, &c);
        }
    /* Negative control: gpt-oss through lmk's truncated YaRN fields must not pass for HF's
     * untruncated YaRN (its ramp runs over pairs 8.09..17.4, not 8..18), or this check could not
     * tell the two apart. */
    model md = k_models[4];
    md.hf.truncate = true;
    rcase c = model_case(&md, 16, LMK_F32, LAY_DENSE, ff, 0);
    c.hf = &k_hf_gpt_oss;
    c.hf_must_differ = true;
    c.pos_kind = POS_RANDOM, c.pos_lo = 0, c.pos_hi = 131071;
    c.comment = "negative control: gpt-oss-20B through truncated YaRN fields vs HF truncate=false";
    run_case(d, &c);
    printf("  [%s] Hugging Face formulas: %d cases, %d failed\n", d->name, g_fig.cases - n0, g_fig.failed - before);
}

/* ------------------------------------------------------------------------------------------------
 * 5. validation
 * ---------------------------------------------------------------------------------------------- */

#define VMAX 128

/* The buffers of the validation calls, each with its contents, so that every rejected call can be
 * shown to have changed no byte anywhere. */
typedef struct vfix {
    tst_dev *d;
    lmk_device *other;       /* a second CPU device: another device than the stream's */
    lmk_buffer *b[VMAX];
    unsigned char *snap[VMAX];
    bool view[VMAX];
    int n;
} vfix;

static lmk_buffer *vf_track(vfix *f, lmk_buffer *b, bool view)
{
    if (!b)
        return NULL;
    if (f->n == VMAX) { /* VMAX holds every buffer of the validation calls below */
        TST_FAIL("[%s] more than %d validation buffers", f->d->name, VMAX);
        lmk_buffer_free(b);
        return NULL;
    }
    f->b[f->n] = b;
    f->view[f->n] = view;
    f->snap[f->n] = view ? NULL : tst_read_all(b);
    f->n++;
    return b;
}

/* A 1-D buffer of n elements: poisoned (an output), or inputs: floats in [-2, 2], integers 5, 6,
 * 7, ..., other types random bytes. */
static lmk_buffer *vf_new(vfix *f, lmk_device *dev, lmk_dtype t, size_t n, bool poison)
{
    const size_t es = lmk_dtype_size(t), shape[1] = {n};
    unsigned char *init = malloc(n * es);
    if (!init)
        return NULL;
    tst_rng r = tst_rng_make(tst_case_seed());
    tst_poison(init, n * es, TST_POISON);
    if (!poison && (t == LMK_F32 || t == LMK_BF16 || t == LMK_F16))
        tst_fill_float(&r, t, init, n, -2.0, 2.0);
    else if (!poison && (t == LMK_I32 || t == LMK_U32 || t == LMK_I64))
        for (size_t i = 0; i < n; i++)
            store_pos(t, init, i, 5 + (int64_t)i);
    else if (!poison)
        tst_fill_bytes(&r, init, n * es);
    lmk_buffer *b = tst_buf(dev, t, shape, 1, n * es, 0, init, n * es, -1);
    free(init);
    return vf_track(f, b, false);
}

static lmk_buffer *vf_view(vfix *f, lmk_buffer *parent, size_t off, lmk_dtype t, size_t n0, size_t n1, size_t n2,
                           size_t s0, size_t s1, size_t s2, int ndim)
{
    const size_t shape[3] = {n0, n1, n2}, strides[3] = {s0, s1, s2};
    lmk_buffer *v = NULL;
    if (!parent || lmk_buffer_view_strided(parent, off, t, shape, strides, ndim, &v) != LMK_OK) {
        TST_FAIL("[%s] a validation view: %s", f->d->name, lmk_last_error());
        return NULL;
    }
    return vf_track(f, v, true);
}

/* Index of the first buffer whose bytes differ from its snapshot, or -1. */
static int vf_changed(vfix *f)
{
    for (int i = 0; i < f->n; i++) {
        if (f->view[i])
            continue;
        unsigned char *now = tst_read_all(f->b[i]);
        const bool same = now && f->snap[i] && memcmp(now, f->snap[i], lmk_buffer_byte_len(f->b[i])) == 0;
        free(now);
        if (!same)
            return i;
    }
    return -1;
}

static void vf_resnap(vfix *f)
{
    for (int i = 0; i < f->n; i++)
        if (!f->view[i]) {
            free(f->snap[i]);
            f->snap[i] = tst_read_all(f->b[i]);
        }
}

static void vf_free(vfix *f)
{
    for (int i = f->n - 1; i >= 0; i--)
        if (f->view[i])
            lmk_buffer_free(f->b[i]);
    for (int i = f->n - 1; i >= 0; i--) {
        if (!f->view[i])
            lmk_buffer_free(f->b[i]);
        free(f->snap[i]);
    }
    lmk_device_close(f->other);
}

typedef struct vcall {
    lmk_stream *s;
    const lmk_buffer *qi, *ki, *pos, *ff;
    lmk_buffer *qo, *ko;
    lmk_rope_params p;
} vcall;

/* A call that must be rejected: INVALID_ARGUMENT, a message starting "rope:" and holding every
 * needle (the value and the rule), and no byte of any buffer changed. */
static void reject_at(vfix *f, int line, const char *what, const vcall *c, const char *n1, const char *n2,
                      const char *n3)
{
    lmk_clear_error();
    const lmk_status st = lmk_rope(c->s, c->qi, c->ki, c->pos, c->ff, c->qo, c->ko, &c->p);
    lmk_stream_sync(f->d->stream);
    const int changed = vf_changed(f);
    const bool ok = st == LMK_ERR_INVALID_ARGUMENT && strncmp(lmk_last_error(), "rope:", 5) == 0 &&
                    tst_msg_has(n1 ? n1 : "", n2, n3, NULL) && changed < 0;
    verdict_at(ok, line, "[%s] validation, %s: %s \"%s\" (want INVALID_ARGUMENT naming \"%s\" \"%s\" \"%s\")%s",
               f->d->name, what, lmk_status_name(st), lmk_last_error(), n1 ? n1 : "", n2 ? n2 : "", n3 ? n3 : "",
               changed < 0 ? "" : "; a buffer was written");
    if (changed >= 0)
        vf_resnap(f);
}

/* A call that must be accepted (and, on success, may write its outputs). */
static void accept_at(vfix *f, int line, const char *what, const vcall *c)
{
    lmk_status st = lmk_rope(c->s, c->qi, c->ki, c->pos, c->ff, c->qo, c->ko, &c->p);
    if (st == LMK_OK)
        st = lmk_stream_sync(f->d->stream);
    verdict_at(st == LMK_OK, line, "[%s] validation, %s must be accepted: %s \"%s\"", f->d->name, what,
               lmk_status_name(st), st == LMK_OK ? "" : lmk_last_error());
    vf_resnap(f);
}
#define REJECT(f, what, c, n1, n2, n3) reject_at(f, __LINE__, what, c, n1, n2, n3)
#define ACCEPT(f, what, c) accept_at(f, __LINE__, what, c)

/* The buffers every validation step draws on; T 3, 2 q heads, 1 k head, head_dim 8, rope_dim 4. */
typedef struct vbufs {
    lmk_buffer *qi, *qo, *ki, *ko, *pos, *pos4, *ff;
    lmk_buffer *qi_o, *qo_o, *ki_o, *ko_o, *pos_o, *ff_o; /* on the other device */
    vcall good;                                           /* NEOX, q+k, freq_factors: accepted */
} vbufs;

static bool make_vbufs(vfix *f, vbufs *v)
{
    lmk_device *dev = f->d->dev, *oth = f->other;
    v->qi = vf_new(f, dev, LMK_F32, 48, false), v->qo = vf_new(f, dev, LMK_F32, 48, true);
    v->ki = vf_new(f, dev, LMK_F32, 24, false), v->ko = vf_new(f, dev, LMK_F32, 24, true);
    v->pos = vf_new(f, dev, LMK_I32, 3, false), v->pos4 = vf_new(f, dev, LMK_I32, 12, false);
    v->ff = vf_new(f, dev, LMK_F32, 2, false);
    v->qi_o = vf_new(f, oth, LMK_F32, 48, false), v->qo_o = vf_new(f, oth, LMK_F32, 48, true);
    v->ki_o = vf_new(f, oth, LMK_F32, 24, false), v->ko_o = vf_new(f, oth, LMK_F32, 24, true);
    v->pos_o = vf_new(f, oth, LMK_I32, 3, false), v->ff_o = vf_new(f, oth, LMK_F32, 2, false);
    v->good = (vcall){.s = f->d->stream, .qi = v->qi, .ki = v->ki, .pos = v->pos, .ff = v->ff, .qo = v->qo,
                      .ko = v->ko,
                      .p = {.head_dim = 8, .rope_dim = 4, .n_heads = 2, .seq_len = 3, .freq_base = 1e4f,
                            .mode = LMK_ROPE_NEOX, .n_k_heads = 1}};
    return v->qi && v->qo && v->ki && v->ko && v->pos && v->pos4 && v->ff && v->qi_o && v->qo_o && v->ki_o &&
           v->ko_o && v->pos_o && v->ff_o;
}

/* R1-R14 in order: the first call breaks every rule it can at once, each step mends the rule just
 * reported, and every step must report the first rule still broken. */
static void validation_chain(vfix *f, const vbufs *v)
{
    lmk_device *dev = f->d->dev, *oth = f->other;
    lmk_buffer *qi47 = vf_new(f, dev, LMK_U8, 47, false), *qi_u8 = vf_new(f, dev, LMK_U8, 48, false);
    lmk_buffer *qo_u8 = vf_new(f, dev, LMK_U8, 48, true), *ki_u8 = vf_new(f, dev, LMK_U8, 24, false);
    lmk_buffer *ko_o_u8 = vf_new(f, oth, LMK_U8, 24, true), *pos_f32_5 = vf_new(f, dev, LMK_F32, 5, false);
    lmk_buffer *pos_f32 = vf_new(f, dev, LMK_F32, 3, false), *ff_f16 = vf_new(f, dev, LMK_F16, 2, false);
    lmk_buffer *ff1 = vf_new(f, dev, LMK_F32, 1, false), *arena = vf_new(f, dev, LMK_I32, 32, false);
    /* positions 5, 6, 7 at the arena's start; k_out from byte 8 overlaps the last of them */
    lmk_buffer *apos = vf_view(f, arena, 0, LMK_I32, 3, 0, 0, 1, 0, 0, 1);
    lmk_buffer *ko_ovl = vf_view(f, arena, 8, LMK_F32, 24, 0, 0, 1, 0, 0, 1);
    if (!qi47 || !qi_u8 || !qo_u8 || !ki_u8 || !ko_o_u8 || !pos_f32_5 || !pos_f32 || !ff_f16 || !ff1 || !apos ||
        !ko_ovl)
        return;
    vcall c = {.s = f->d->stream, .qi = qi47, .ki = v->ki, .pos = pos_f32_5, .ff = ff_f16, .qo = v->qo, .ko = NULL,
               .p = {.head_dim = 7, .rope_dim = 10, .n_heads = 0, .seq_len = 3, .freq_base = INFINITY,
                     .mode = (lmk_rope_mode)7, .pairing = (lmk_rope_pairing)5, .n_k_heads = 1, .freq_scale = -1.0f}};
    REJECT(f, "R1 k_in without k_out, R2-R14 broken too", &c, "k_in without k_out", NULL, NULL);
    c.ko = v->ko_o;
    REJECT(f, "R2 n_heads 0", &c, "n_heads=0", "> 0", NULL);
    c.p.n_heads = 2;
    REJECT(f, "R3 head_dim 7", &c, "head_dim=7", "even", NULL);
    c.p.head_dim = 8;
    REJECT(f, "R4 rope_dim 10 > head_dim 8", &c, "rope_dim=10", "head_dim=8", "<=");
    c.p.rope_dim = 4;
    REJECT(f, "R5 freq_base inf", &c, "freq_base", "inf", "finite");
    c.p.freq_base = 1e4f;
    REJECT(f, "R6 mode 7", &c, "mode 7", NULL, NULL);
    c.p.mode = LMK_ROPE_VISION;
    REJECT(f, "R7 VISION with rope_dim 4 != head_dim 8", &c, "VISION", "rope_dim=4", "head_dim=8");
    c.p.mode = LMK_ROPE_NORMAL;
    REJECT(f, "R8 pairing 5", &c, "pairing 5", NULL, NULL);
    c.p.pairing = LMK_ROPE_PAIR_HALF_HEAD;
    REJECT(f, "R8 NORMAL with HALF_HEAD", &c, "HALF_HEAD", "NORMAL", NULL);
    c.p.mode = LMK_ROPE_NEOX, c.p.pairing = LMK_ROPE_PAIR_HALF_ROPE;
    REJECT(f, "R9 freq_scale -1", &c, "freq_scale", "-1", "negative");
    c.p.freq_scale = 0.0f;
    REJECT(f, "R10 q_in of 47 elements", &c, "q_in", "47", "48");
    c.qi = qi_u8;
    REJECT(f, "R10 q_in u8, q_out f32", &c, "q_in/q_out", "u8", "f32");
    c.qo = qo_u8;
    REJECT(f, "R10 q u8, k f32", &c, "q and k", "u8", "f32");
    c.ki = ki_u8, c.ko = ko_o_u8;
    REJECT(f, "R10 dtype u8", &c, "u8", "f32, bf16 or f16", NULL);
    c.qi = v->qi, c.qo = v->qo, c.ki = v->ki, c.ko = v->ko_o;
    REJECT(f, "R11 NEOX with 5 positions", &c, "positions length 5", "seq_len(3) = 3", NULL);
    c.pos = pos_f32;
    REJECT(f, "R11 f32 positions", &c, "positions", "f32", "i32, u32 or i64");
    c.pos = apos;
    REJECT(f, "R12 f16 freq_factors", &c, "freq_factors", "f16", "f32");
    c.ff = ff1;
    REJECT(f, "R12 1 freq_factor for 2 pairs", &c, "freq_factors has 1", "2", NULL);
    c.ff = v->ff;
    REJECT(f, "R13 k_out on another device", &c, "device", NULL, NULL);
    c.ko = ko_ovl;
    REJECT(f, "R14 k_out over the positions", &c, "k_out overlaps positions", NULL, NULL);
    c.ko = v->ko;
    ACCEPT(f, "the mended call", &c);
}

/* R1-R9: each rule on its own, from the good call. */
static void validation_params(vfix *f, const vbufs *v)
{
    vcall c = v->good;
    const char *const req[5] = {"stream", "q_in", "q_out", "positions", "params"};
    for (int i = 0; i < 5; i++) {
        vcall n = c;
        if (i == 0)
            n.s = NULL;
        if (i == 1)
            n.qi = NULL;
        if (i == 2)
            n.qo = NULL;
        if (i == 3)
            n.pos = NULL;
        lmk_clear_error();
        const lmk_status st = i == 4 ? lmk_rope(n.s, n.qi, n.ki, n.pos, n.ff, n.qo, n.ko, NULL)
                                     : lmk_rope(n.s, n.qi, n.ki, n.pos, n.ff, n.qo, n.ko, &n.p);
        const int changed = vf_changed(f);
        VERDICT(st == LMK_ERR_INVALID_ARGUMENT && tst_msg_has("rope:", req[i], "NULL", NULL) && changed < 0,
                "[%s] validation, R1 NULL %s: %s \"%s\"", f->d->name, req[i], lmk_status_name(st), lmk_last_error());
    }
    c.ki = NULL;
    REJECT(f, "R1 k_out without k_in", &c, "k_out without k_in", NULL, NULL);
    static const char *const dims[4] = {"head_dim=0", "rope_dim=0", "n_heads=0", "seq_len=0"};
    for (int i = 0; i < 4; i++) {
        c = v->good;
        uint32_t *field[4] = {&c.p.head_dim, &c.p.rope_dim, &c.p.n_heads, &c.p.seq_len};
        *field[i] = 0;
        REJECT(f, "R2 a zero dimension", &c, dims[i], "> 0", NULL);
    }
    c = v->good, c.p.n_k_heads = 0;
    REJECT(f, "R2 n_k_heads 0 with k", &c, "n_k_heads", "> 0", NULL);
    c.ki = NULL, c.ko = NULL;
    ACCEPT(f, "n_k_heads 0 without k", &c);
    c = v->good, c.p.head_dim = 7;
    REJECT(f, "R3 odd head_dim", &c, "head_dim=7", "even", NULL);
    c = v->good, c.p.rope_dim = 3;
    REJECT(f, "R3 odd rope_dim", &c, "rope_dim=3", "even", NULL);
    c = v->good, c.p.rope_dim = 10;
    REJECT(f, "R4 rope_dim > head_dim", &c, "rope_dim=10", "head_dim=8", "<=");
    const struct {
        float v;
        const char *shown;
    } bases[] = {{0.0f, "got 0"}, {INFINITY, "inf"}, {-INFINITY, "-inf"}, {NAN, "nan"}, {-1.0f, "got -1"}};
    for (size_t i = 0; i < sizeof bases / sizeof bases[0]; i++) {
        c = v->good, c.p.freq_base = bases[i].v;
        REJECT(f, "R5 bad freq_base", &c, "freq_base", bases[i].shown, "finite and positive");
    }
    const int modes[] = {7, 1, 3, 16, 41, -2};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        char want[32];
        snprintf(want, sizeof want, "mode %d", modes[i]);
        c = v->good, c.p.mode = (lmk_rope_mode)modes[i];
        REJECT(f, "R6 unknown mode", &c, want, "unknown", NULL);
    }
    c = v->good, c.p.mode = LMK_ROPE_VISION, c.pos = v->pos4;
    REJECT(f, "R7 VISION with rope_dim != head_dim", &c, "VISION", "rope_dim=4", "head_dim=8");
    c.p.rope_dim = 8, c.ff = NULL; /* 4 pairs: the 2 freq_factors would break R12 */
    ACCEPT(f, "VISION with rope_dim == head_dim", &c);
    const int pairings[] = {5, 2, -1};
    for (size_t i = 0; i < sizeof pairings / sizeof pairings[0]; i++) {
        char want[32];
        snprintf(want, sizeof want, "pairing %d", pairings[i]);
        c = v->good, c.p.pairing = (lmk_rope_pairing)pairings[i];
        REJECT(f, "R8 unknown pairing", &c, want, "unknown", NULL);
    }
    c = v->good, c.p.mode = LMK_ROPE_NORMAL, c.p.pairing = LMK_ROPE_PAIR_HALF_HEAD;
    REJECT(f, "R8 NORMAL with HALF_HEAD", &c, "HALF_HEAD", "NORMAL", NULL);
}

/* R9: the scaling fields. */
static void validation_scaling(vfix *f, const vbufs *v)
{
    const struct {
        const char *what;
        int field; /* 0 freq_scale, 1 ext_factor, 2 attn_factor, 3 beta_fast, 4 beta_slow */
        float value;
        uint32_t ctx;
        const char *n1, *n2, *n3;
    } bad[] = {
        {"freq_scale -1", 0, -1.0f, 0, "freq_scale", "-1", "negative"},
        {"freq_scale inf", 0, INFINITY, 0, "freq_scale", "inf", "finite"},
        {"ext_factor nan", 1, NAN, 4096, "ext_factor", "nan", "finite"},
        {"attn_factor nan", 2, NAN, 0, "attn_factor", "nan", "finite"},
        {"attn_factor -0.5", 2, -0.5f, 0, "attn_factor", "-0.5", "negative"},
        {"beta_fast inf", 3, INFINITY, 0, "beta_fast", "inf", "finite"},
        {"beta_slow -1", 4, -1.0f, 0, "beta_slow", "-1", "negative"},
        {"ext_factor 1 with n_ctx_orig 0", 1, 1.0f, 0, "ext_factor", "n_ctx_orig", NULL},
        {"ext_factor -0.5 with n_ctx_orig 0", 1, -0.5f, 0, "ext_factor", "n_ctx_orig", NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        vcall c = v->good;
        float *field[5] = {&c.p.freq_scale, &c.p.ext_factor, &c.p.attn_factor, &c.p.beta_fast, &c.p.beta_slow};
        *field[bad[i].field] = bad[i].value;
        c.p.n_ctx_orig = bad[i].ctx;
        char what[96];
        snprintf(what, sizeof what, "R9 %s", bad[i].what);
        REJECT(f, what, &c, bad[i].n1, bad[i].n2, bad[i].n3);
    }
    vcall c = v->good;
    c.p.ext_factor = -0.5f, c.p.n_ctx_orig = 4096, c.p.freq_scale = 0.5f;
    ACCEPT(f, "a negative ext_factor with n_ctx_orig", &c);
}

/* R10: operand shapes, strides and dtypes. */
static void validation_operands(vfix *f, const vbufs *v)
{
    lmk_device *dev = f->d->dev;
    lmk_buffer *f47 = vf_new(f, dev, LMK_F32, 47, false), *o49 = vf_new(f, dev, LMK_F32, 49, true);
    lmk_buffer *o23 = vf_new(f, dev, LMK_F32, 23, true), *par = vf_new(f, dev, LMK_F32, 128, true);
    lmk_buffer *kpar = vf_new(f, dev, LMK_F32, 64, false);
    lmk_buffer *qo_s2 = vf_view(f, par, 0, LMK_F32, 3, 2, 8, 32, 16, 2, 3);   /* last stride 2 */
    lmk_buffer *qi_flat = vf_view(f, kpar, 0, LMK_F32, 3, 1, 16, 16, 16, 1, 3); /* dense, shape [3, 1, 16] */
    lmk_buffer *ki_bad = vf_view(f, kpar, 0, LMK_F32, 3, 2, 4, 16, 5, 1, 3);    /* [3, 2, 4]: not [3, 1, 8] */
    lmk_buffer *qo16 = vf_new(f, dev, LMK_F16, 48, true), *kbf = vf_new(f, dev, LMK_BF16, 24, false);
    lmk_buffer *kobf = vf_new(f, dev, LMK_BF16, 24, true);
    const lmk_dtype others[3] = {LMK_U8, LMK_I32, LMK_F8E4M3};
    lmk_buffer *oq[3][4];
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 4; k++)
            oq[i][k] = vf_new(f, dev, others[i], k < 2 ? 48 : 24, k % 2 == 1);
    if (!f47 || !o49 || !o23 || !qo_s2 || !qi_flat || !ki_bad || !qo16 || !kbf || !kobf)
        return;
    vcall c = v->good;
    c.qi = f47;
    REJECT(f, "R10 q_in of 47 elements", &c, "q_in", "47", "48");
    c = v->good, c.qo = o49;
    REJECT(f, "R10 q_out of 49 elements", &c, "q_out", "49", "48");
    c = v->good, c.ko = o23;
    REJECT(f, "R10 k_out of 23 elements", &c, "k_out", "23", "24");
    c = v->good, c.qo = qo_s2;
    REJECT(f, "R10 q_out with last stride 2", &c, "q_out", "shape [3, 2, 8]", "strides [32, 16, 2]");
    c = v->good, c.ki = ki_bad;
    REJECT(f, "R10 k_in strided [3, 2, 4]", &c, "k_in", "shape [3, 2, 4]", "strides [16, 5, 1]");
    c = v->good, c.qi = qi_flat;
    ACCEPT(f, "a dense q_in declared [3, 1, 16]", &c);
    c = v->good, c.qo = qo16;
    REJECT(f, "R10 q_in f32, q_out f16", &c, "q_in/q_out", "f32", "f16");
    c = v->good, c.ki = kbf, c.ko = kobf;
    REJECT(f, "R10 q f32, k bf16", &c, "q and k", "f32", "bf16");
    for (int i = 0; i < 3; i++) {
        if (!oq[i][0] || !oq[i][1] || !oq[i][2] || !oq[i][3])
            continue;
        c = v->good, c.qi = oq[i][0], c.qo = oq[i][1], c.ki = oq[i][2], c.ko = oq[i][3];
        REJECT(f, "R10 dtype not f32/bf16/f16", &c, lmk_dtype_name(others[i]), "f32, bf16 or f16", NULL);
    }
}

/* R11 and R12: positions by mode and dtype, freq_factors. */
static void validation_positions(vfix *f, const vbufs *v)
{
    lmk_device *dev = f->d->dev;
    lmk_buffer *pf32 = vf_new(f, dev, LMK_F32, 3, false), *pu16 = vf_new(f, dev, LMK_U16, 3, false);
    lmk_buffer *pi64 = vf_new(f, dev, LMK_I64, 3, false), *pu32 = vf_new(f, dev, LMK_U32, 3, false);
    lmk_buffer *ppar = vf_new(f, dev, LMK_I32, 8, false), *fpar = vf_new(f, dev, LMK_F32, 8, false);
    lmk_buffer *ps = vf_view(f, ppar, 0, LMK_I32, 3, 0, 0, 2, 0, 0, 1); /* strided positions */
    lmk_buffer *fs = vf_view(f, fpar, 0, LMK_F32, 2, 0, 0, 3, 0, 0, 1); /* strided freq_factors */
    lmk_buffer *f16 = vf_new(f, dev, LMK_F16, 2, false), *f1 = vf_new(f, dev, LMK_F32, 1, false);
    lmk_buffer *fi32 = vf_new(f, dev, LMK_I32, 2, false), *f5 = vf_new(f, dev, LMK_F32, 5, false);
    if (!pf32 || !pu16 || !pi64 || !pu32 || !ps || !fs || !f16 || !f1 || !fi32 || !f5)
        return;
    const struct {
        lmk_rope_mode mode;
        bool four;
    } modes[] = {{LMK_ROPE_NORMAL, false}, {LMK_ROPE_NEOX, false}, {LMK_ROPE_MROPE, true},
                 {LMK_ROPE_IMROPE, true},  {LMK_ROPE_VISION, true}};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        vcall c = v->good;
        c.p.mode = modes[i].mode;
        c.p.sections[0] = c.p.sections[1] = 1;
        if (modes[i].mode == LMK_ROPE_VISION)
            c.p.rope_dim = 8, c.ff = NULL;
        c.pos = modes[i].four ? v->pos : v->pos4;
        REJECT(f, "R11 positions length by mode", &c, modes[i].four ? "positions length 3" : "positions length 12",
               modes[i].four ? "4 * seq_len(3) = 12" : "seq_len(3) = 3", NULL);
        c.pos = modes[i].four ? v->pos4 : v->pos;
        ACCEPT(f, "positions of the mode's length", &c);
    }
    vcall c = v->good;
    c.pos = pf32;
    REJECT(f, "R11 f32 positions", &c, "positions", "f32", "i32, u32 or i64");
    c.pos = pu16;
    REJECT(f, "R11 u16 positions", &c, "positions", "u16", "i32, u32 or i64");
    c.pos = ps;
    REJECT(f, "R11 strided positions", &c, "positions", "dense", NULL);
    c.pos = pi64;
    ACCEPT(f, "i64 positions", &c);
    c.pos = pu32;
    ACCEPT(f, "u32 positions", &c);
    c = v->good, c.ff = f16;
    REJECT(f, "R12 f16 freq_factors", &c, "freq_factors", "f16", "f32");
    c.ff = fi32;
    REJECT(f, "R12 i32 freq_factors", &c, "freq_factors", "i32", "f32");
    c.ff = f1;
    REJECT(f, "R12 1 freq_factor for 2 pairs", &c, "freq_factors has 1", "2", NULL);
    c.ff = fs;
    REJECT(f, "R12 strided freq_factors", &c, "freq_factors", "strided", NULL);
    c.ff = f5;
    ACCEPT(f, "5 freq_factors for 2 pairs", &c);
    c.ff = NULL;
    ACCEPT(f, "no freq_factors", &c);
}

/* R13 (each buffer on another device) and R14 (overlaps). */
static void validation_devices_overlaps(vfix *f, const vbufs *v)
{
    const lmk_buffer *const other[6] = {v->qi_o, v->ki_o, v->pos_o, v->ff_o, v->qo_o, v->ko_o};
    static const char *const names[6] = {"q_in", "k_in", "positions", "freq_factors", "q_out", "k_out"};
    for (int i = 0; i < 6; i++) {
        vcall c = v->good;
        const lmk_buffer **in[4] = {&c.qi, &c.ki, &c.pos, &c.ff};
        if (i < 4)
            *in[i] = other[i];
        else if (i == 4)
            c.qo = v->qo_o;
        else
            c.ko = v->ko_o;
        char what[64];
        snprintf(what, sizeof what, "R13 %s on another device", names[i]);
        REJECT(f, what, &c, "device", NULL, NULL);
    }
    lmk_device *dev = f->d->dev;
    lmk_buffer *ar = vf_new(f, dev, LMK_F32, 256, false), *k48 = vf_new(f, dev, LMK_F32, 48, false);
    lmk_buffer *ko48 = vf_new(f, dev, LMK_F32, 48, true);
    lmk_buffer *qi_a = vf_view(f, ar, 0, LMK_F32, 48, 0, 0, 1, 0, 0, 1);
    lmk_buffer *qo_a = vf_view(f, ar, 4, LMK_F32, 48, 0, 0, 1, 0, 0, 1);         /* one element on */
    lmk_buffer *qo_wide = vf_view(f, ar, 0, LMK_F32, 3, 2, 8, 32, 8, 1, 3);       /* q_in's address */
    lmk_buffer *qo_self = vf_view(f, ar, 512, LMK_F32, 3, 2, 8, 16, 0, 1, 3);     /* head stride 0 */
    lmk_buffer *ff_a = vf_view(f, ar, 800, LMK_F32, 2, 0, 0, 1, 0, 0, 1);
    lmk_buffer *qo_ff = vf_view(f, ar, 612, LMK_F32, 48, 0, 0, 1, 0, 0, 1);       /* to byte 804: meets ff */
    if (!ar || !k48 || !ko48 || !qi_a || !qo_a || !qo_wide || !qo_self || !ff_a || !qo_ff)
        return;
    vcall c = v->good;
    c.qi = qi_a, c.qo = qo_a;
    REJECT(f, "R14 q_out one element past q_in", &c, "q_out overlaps q_in", NULL, NULL);
    c.qo = qo_wide;
    REJECT(f, "R14 q_out at q_in's address with other strides", &c, "q_out overlaps q_in", "exactly", NULL);
    c = v->good, c.qo = qo_self;
    REJECT(f, "R14 q_out with head stride 0", &c, "q_out", "overlapping elements", NULL);
    c = v->good, c.ff = ff_a, c.qo = qo_ff;
    REJECT(f, "R14 q_out over freq_factors", &c, "q_out overlaps freq_factors", NULL, NULL);
    c = v->good, c.p.n_k_heads = 2, c.ki = k48, c.ko = v->qo;
    REJECT(f, "R14 q_out == k_out", &c, "q_out overlaps k_out", NULL, NULL);
    c = v->good, c.p.n_k_heads = 2, c.ki = k48, c.qo = (lmk_buffer *)k48, c.ko = ko48;
    REJECT(f, "R14 q_out over k_in", &c, "q_out overlaps k_in", NULL, NULL);
    c = v->good, c.p.n_k_heads = 2, c.ki = v->qi, c.ko = ko48;
    ACCEPT(f, "k_in == q_in (inputs may overlap)", &c);
    c = v->good, c.qo = (lmk_buffer *)v->qi, c.ko = (lmk_buffer *)v->ki;
    ACCEPT(f, "q and k in place, one handle each", &c);
}

static void test_validation(tst_dev *d)
{
    vfix f = {.d = d};
    const lmk_status st = lmk_device_open(LMK_BACKEND_CPU, 0, &f.other);
    if (!TST_REQUIRE(st == LMK_OK, "[%s] a second cpu device: %s", d->name, lmk_last_error()))
        return;
    vbufs v;
    const int before = harness_failed;
    if (make_vbufs(&f, &v)) {
        validation_chain(&f, &v);
        validation_params(&f, &v);
        validation_scaling(&f, &v);
        validation_operands(&f, &v);
        validation_positions(&f, &v);
        validation_devices_overlaps(&f, &v);
    }
    printf("  [%s] validation: %d failed\n", d->name, harness_failed - before);
    vf_free(&f);
}

/* ------------------------------------------------------------------------------------------------
 * 4. the precision regression bound, and the device's figures
 * ---------------------------------------------------------------------------------------------- */

static void report_device(tst_dev *d)
{
    VERDICT(g_fig.n_m1 > 0 && g_fig.f32_max_m1 <= F32_REGRESSION,
            "[%s] precision regression: the largest f32 error of %d launches with m <= 1 is %.3g (bound %.0e; the "
            "contract allows 1e-5)",
            d->name, g_fig.n_m1, g_fig.f32_max_m1, F32_REGRESSION);
    printf("  [%s] max f32 error: %.3g over %d launches with m <= 1 (bound %.0e), %.3g x max(1, m) over %d f32 "
           "launches\n",
           d->name, g_fig.f32_max_m1, g_fig.n_m1, F32_REGRESSION, g_fig.f32_max_rel, g_fig.n_f32);
    if (g_fig.unsupported)
        printf("  [%s] %d of %d launches UNSUPPORTED, e.g. \"%s\"\n", d->name, g_fig.unsupported, g_fig.cases,
               g_fig.unsupported_msg);
}

int main(void)
{
    tst_program_seed();
    const double t0 = tst_now();
    tst_dev devs[TST_MAX_DEVS];
    const int n = tst_devs_open_isas(devs);
    for (int i = 0; i < n; i++) {
        printf("[%s] %s\n", devs[i].name, lmk_device_name(devs[i].dev));
        fflush(stdout);
        memset(&g_fig, 0, sizeof g_fig);
        test_validation(&devs[i]);
        test_matrix(&devs[i]);
        test_hf(&devs[i]);
        test_models(&devs[i]);
        test_long_prompts(&devs[i]);
        report_device(&devs[i]);
    }
    tst_devs_close(devs, n);
    if (g_unprinted)
        printf("%d more failures not printed (the first %d are above)\n", g_unprinted, MAX_PRINTED);
    printf("test_rope_modes: %.2f s\n", tst_now() - t0);
    return harness_summary();
}
