/*
 * test_attn_prologue.c - lmk_attn_prologue (lmk.h "attn_prologue": per-head RMSNorm + rope of q and
 * k, k to k_out and/or the KV cache through slots, v to its cache) on every backend against the
 * float64 reference.
 *
 * A case is a set of memory regions (a [q | gate] projection, a packed QKV buffer, a paged or a
 * combined KV cache, weights, positions, slots) and the operands, views into them laid out the way
 * an engine lays them out. The same regions and views are made on each device, and, wrapped
 * around the host images, on a CPU device where lmk_attn_prologue_prepare resolves the call and
 * lmk_ref_attn_prologue_token gives the float64 rows. Outputs are poisoned (0xFF: NaN in every
 * float type) before a run. After it every output element is checked (the precision contract of
 * lmk.h, or the input's bits for copies) and then put back to its bytes before the call; the
 * regions must then equal their images byte for byte, so an unwritten output, a write to a padding
 * slot's or an unused cache row, to the gate half of a projection or to v inside a packed QKV
 * all fail. Every device runs each case twice, the second time rounding upward with FTZ/DAZ set:
 * the two runs must be bit-identical (lmk.h, "Results are deterministic"). The reference's own
 * writer (lmk_ref_attn_prologue) is checked the same way on the shorter cases, and the reference
 * rows against lmk.h's norm-then-rope formula written out here.
 *
 * Cases: the model shapes (Qwen3.5-27B, Qwen3.5-35B-A3B, Qwen3-8B, Llama-3.1-8B) over T in {1, 5,
 * 64, 4106} (LMK_TEST_QUICK: 300 for the longest) and f32/bf16/f16, with caches in the input dtype
 * or f8e4m3, i32/i64 slots with padding, dense, paged and combined caches, k_out only, cache only
 * or both; edge shapes and modes (GPT-NeoX's [T, H, 3, D] and [rows, Hk, 2, D] caches with 65
 * and 128 heads); duplicate slots (the CPU keeps the last token's whole row); the public bugs of
 * other engines (SGLang #19636, #34446); the f8 cache quantised from the f32 result; every
 * validation rule of lmk.h in its order, with its message and no byte written, and a Dv past 32
 * bits rejected. Names follow ggml's test-backend-ops (parameters, then "// model");
 * only failures print them, each group ends with one line.
 */
#include "common.h"
#include "ops/attn_prologue/attn_prologue.h"

#include <fenv.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

HARNESS_DEFINE;

/* The CPU device the reference's host wraps live on, and a second one ("another device"). */
static lmk_device *g_ref, *g_other;

/* ---- a small generator of its own (splitmix64), so the cases depend only on the case seed ---- */

static uint64_t rnd(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rnd_uniform(uint64_t *s, double lo, double hi)
{
    return lo + (hi - lo) * ((double)(rnd(s) >> 11) / 9007199254740992.0);
}

static uint32_t rnd_below(uint64_t *s, uint32_t n)
{
    return (uint32_t)(rnd(s) % n);
}

/* ---- elements ---- */

static double get(lmk_dtype t, const void *base, size_t i)
{
    switch (t) {
    case LMK_F8E4M3:
        return lmk_f8e4m3_to_f32(((const uint8_t *)base)[i]);
    case LMK_I32: {
        int32_t v;
        memcpy(&v, (const char *)base + 4 * i, 4);
        return v;
    }
    case LMK_I64: {
        int64_t v;
        memcpy(&v, (const char *)base + 8 * i, 8);
        return (double)v;
    }
    default:
        return lmk_float_load(t, base, i);
    }
}

/* Stores v rounded to f32, then to t with the library's conversions. */
static void put(lmk_dtype t, void *base, size_t i, double v)
{
    const float f = (float)v;
    uint16_t h;
    switch (t) {
    case LMK_F32:
        memcpy((char *)base + 4 * i, &f, 4);
        break;
    case LMK_BF16:
    case LMK_F16:
        h = t == LMK_BF16 ? lmk_f32_to_bf16(f) : lmk_f32_to_f16(f);
        memcpy((char *)base + 2 * i, &h, 2);
        break;
    default:
        ((uint8_t *)base)[i] = lmk_f32_to_f8e4m3(f);
        break;
    }
}

static void put_int(lmk_dtype t, void *base, size_t i, int64_t v)
{
    if (t == LMK_I64) {
        memcpy((char *)base + 8 * i, &v, 8);
    } else {
        const int32_t w = (int32_t)v;
        memcpy((char *)base + 4 * i, &w, 4);
    }
}

/* lmk.h's f8 factor of a k_scale or v_scale, written out: 0 means 1, then 1.0f / scale in f32 (the
 * tests compute it in the default rounding mode, where the quotient is the nearest f32). */
static float inv_of(float scale)
{
    return 1.0f / (scale == 0.0f ? 1.0f : scale);
}

/* lmk.h's precision for an output of dtype t whose float64 result is want (f8: want already
 * multiplied by inv_of(scale); a result past +-448 saturates). */
static bool close_enough(lmk_dtype t, double got, double want)
{
    if (isnan(want))
        return isnan(got);
    if (!isfinite(got))
        return false;
    switch (t) {
    case LMK_F32:
        return fabs(got - want) <= 1e-5 * fmax(1.0, fabs(want));
    case LMK_F8E4M3: {
        const double w = fmin(448.0, fmax(-448.0, want));
        return fabs(got - w) <= lmk_ulp(LMK_F8E4M3, w);
    }
    default:
        return fabs(got - want) <= lmk_ulp(t, want) + 1e-6;
    }
}

/* ---- cases: regions and the operands that view them ---- */

enum { Q_IN, K_IN, V_IN, QW, KW, POS, FF, SLOTS, Q_OUT, K_OUT, K_CACHE, V_CACHE, N_OPS };
static const char *const k_op_names[N_OPS] = {"q_in",  "k_in",      "v_in",  "q_norm_w", "k_norm_w", "positions",
                                              "freq_factors", "slots", "q_out", "k_out",    "k_cache",  "v_cache"};

#define MAX_REG 12

enum { FILL_NONE, FILL_X, FILL_POISON, FILL_W0, FILL_W1 };

typedef struct region {
    lmk_dtype dt;
    size_t bytes;
    unsigned char *img; /* the bytes before the call */
    int fill;
    bool other;         /* made on another device (validation) */
} region;

enum { F_NONE, F_VIEW, F_STRIDED, F_SAME };

typedef struct operand {
    int form;                 /* F_NONE: NULL; F_VIEW: lmk_buffer_view; F_STRIDED: view_strided; F_SAME */
    int same;                 /* F_SAME: the operand whose handle this one is */
    int reg;
    lmk_dtype dt;
    size_t off;               /* in elements of dt from the region's start */
    int nd;                   /* the declared view */
    size_t shape[4], stride[4];
    size_t n[3], st[3];       /* the logical [rows, heads, dim] and its element strides */
} operand;

typedef struct ap_case {
    char name[400];
    lmk_rope_params rope;
    lmk_rms_norm_params norm;
    lmk_dtype dt;             /* q, k and v */
    float k_scale, v_scale;
    int n_reg;
    region reg[MAX_REG];
    operand op[N_OPS];
    bool null_stream, null_io, null_rope, null_norm; /* validation */
} ap_case;

static int region_add(ap_case *c, lmk_dtype dt, size_t n, int fill)
{
    region *r = &c->reg[c->n_reg];
    r->dt = dt;
    r->bytes = n * lmk_dtype_size(dt);
    r->img = calloc(r->bytes ? r->bytes : 1, 1);
    r->fill = fill;
    return c->n_reg++;
}

static void case_free(ap_case *c)
{
    for (int i = 0; i < c->n_reg; i++)
        free(c->reg[i].img);
    c->n_reg = 0;
}

static bool case_ok(const ap_case *c)
{
    for (int i = 0; i < c->n_reg; i++)
        if (!c->reg[i].img)
            return false;
    return true;
}

/* A 3-D strided view [n0, n1, n2] with strides [s0, s1, 1] (dense strides give a dense view). */
static void op_strided(ap_case *c, int w, int reg, size_t off, size_t n0, size_t n1, size_t n2, size_t s0, size_t s1)
{
    operand *o = &c->op[w];
    *o = (operand){.form = F_STRIDED, .reg = reg, .dt = c->reg[reg].dt, .off = off, .nd = 3,
                   .shape = {n0, n1, n2}, .stride = {s0, s1, 1}, .n = {n0, n1, n2}, .st = {s0, s1, 1}};
}

/* A dense view of a [n0, n1, n2] operand, declared with shape `shape` (nd axes; NULL: 3-D). */
static void op_dense(ap_case *c, int w, int reg, size_t off, size_t n0, size_t n1, size_t n2, const size_t *shape,
                     int nd)
{
    operand *o = &c->op[w];
    *o = (operand){.form = F_VIEW, .reg = reg, .dt = c->reg[reg].dt, .off = off, .nd = shape ? nd : 3,
                   .shape = {n0, n1, n2}, .n = {n0, n1, n2}, .st = {n1 * n2, n2, 1}};
    for (int i = 0; shape && i < nd; i++)
        o->shape[i] = shape[i];
}

/* A dense 1-D operand of `count` elements (weights, positions, freq_factors, slots). */
static void op_flat(ap_case *c, int w, int reg, size_t count)
{
    op_dense(c, w, reg, 0, 1, 1, count, &count, 1);
}

static void op_same(ap_case *c, int w, int target)
{
    c->op[w] = c->op[target];
    c->op[w].form = F_SAME;
    c->op[w].same = target;
}

static bool present(const ap_case *c, int w)
{
    return c->op[w].form != F_NONE;
}

static size_t op_es(const operand *o)
{
    return lmk_dtype_size(o->dt);
}

/* Element (r, h, i) of operand w: its index in its region. */
static size_t op_at(const operand *o, size_t r, size_t h, size_t i)
{
    return o->off + r * o->st[0] + h * o->st[1] + i;
}

/* Fills the regions: inputs uniform in [-2, 2), weights around 1 (offset 0) or in [0, 0.2)
 * (offset 1), outputs poison. Positions, slots and freq_factors are written by the builder. */
static void fill_regions(ap_case *c, uint64_t *s)
{
    for (int i = 0; i < c->n_reg; i++) {
        region *r = &c->reg[i];
        const size_t n = r->bytes / lmk_dtype_size(r->dt);
        if (r->fill == FILL_POISON)
            memset(r->img, 0xFF, r->bytes);
        for (size_t j = 0; j < n && r->fill != FILL_POISON && r->fill != FILL_NONE; j++) {
            const double lo = r->fill == FILL_X ? -2.0 : r->fill == FILL_W0 ? 0.8 : 0.0;
            const double hi = r->fill == FILL_X ? 2.0 : r->fill == FILL_W0 ? 1.2 : 0.2;
            put(r->dt, r->img, j, rnd_uniform(s, lo, hi));
        }
    }
}

/* Which elements of a row the rope rotates (lmk.h's pair table). */
static void rot_mask(const lmk_rope_params *p, bool *rot)
{
    const uint32_t d = p->head_dim, half = p->rope_dim / 2;
    const uint32_t stride = p->mode == LMK_ROPE_VISION || p->pairing == LMK_ROPE_PAIR_HALF_HEAD ? d / 2 : half;
    for (uint32_t i = 0; i < d; i++)
        rot[i] = p->mode == LMK_ROPE_NORMAL && i < p->rope_dim;
    for (uint32_t i = 0; i < half && p->mode != LMK_ROPE_NORMAL; i++)
        rot[i] = rot[i + stride] = true;
}

/* NaN payloads (quiet and signalling, both signs, never all poison bytes) in the elements of
 * operand w that are copied: outside the rotated pairs when rot is given, everywhere otherwise. */
static void add_nan_payloads(ap_case *c, int w, const bool *rot, uint64_t *s)
{
    const operand *o = &c->op[w];
    unsigned char *img = c->reg[o->reg].img;
    for (size_t r = 0; r < o->n[0]; r++)
        for (size_t h = 0; h < o->n[1]; h++)
            for (size_t i = 0; i < o->n[2]; i++) {
                if ((rot && rot[i]) || rnd_below(s, 3) != 0)
                    continue;
                const uint64_t bits = rnd(s);
                const size_t e = op_at(o, r, h, i);
                if (o->dt == LMK_F32) { /* bit 1 clear: never 0xFFFFFFFF */
                    const uint32_t v = 0x7f800000u | (uint32_t)(bits & 0x807ffffcu) | 1u;
                    memcpy(img + 4 * e, &v, 4);
                } else {
                    const unsigned exp = o->dt == LMK_BF16 ? 0x7f80u : 0x7c00u;
                    const unsigned man = o->dt == LMK_BF16 ? 0x7fu : 0x3ffu;
                    const uint16_t v = (uint16_t)(exp | ((bits >> 16) & 0x8000u) | ((bits & man & ~2u) | 1u));
                    memcpy(img + 2 * e, &v, 2);
                }
            }
}

/* ---- the buffers of a case on one device ---- */

typedef struct bufset {
    lmk_buffer *root[MAX_REG];
    lmk_buffer *view[N_OPS];
    bool own[N_OPS];
} bufset;

static void bufset_free(bufset *b)
{
    for (int i = N_OPS - 1; i >= 0; i--)
        if (b->own[i])
            lmk_buffer_free(b->view[i]);
    for (int i = MAX_REG - 1; i >= 0; i--)
        lmk_buffer_free(b->root[i]);
    memset(b, 0, sizeof *b);
}

/* The regions of c on dev: wraps of imgs[] when imgs is given (host memory of a CPU device), else
 * allocations holding a copy of the images; then every operand's view. */
static lmk_status bufset_make(const ap_case *c, lmk_device *dev, unsigned char *const *imgs, bufset *b, char *err,
                              size_t err_len)
{
    memset(b, 0, sizeof *b);
    lmk_status st = LMK_OK;
    for (int i = 0; i < c->n_reg && st == LMK_OK; i++) {
        const region *r = &c->reg[i];
        lmk_device *on = r->other && !imgs ? g_other : dev;
        st = imgs ? lmk_buffer_wrap(on, imgs[i], r->bytes, LMK_U8, NULL, 0, &b->root[i])
                  : lmk_buffer_alloc(on, r->bytes, LMK_U8, NULL, 0, &b->root[i]);
        if (st == LMK_OK && !imgs)
            st = lmk_buffer_write(b->root[i], 0, r->img, r->bytes);
    }
    for (int w = 0; w < N_OPS && st == LMK_OK; w++) {
        const operand *o = &c->op[w];
        const size_t off = o->off * op_es(o);
        if (o->form == F_VIEW)
            st = lmk_buffer_view(b->root[o->reg], off, o->dt, o->shape, o->nd, &b->view[w]);
        else if (o->form == F_STRIDED)
            st = lmk_buffer_view_strided(b->root[o->reg], off, o->dt, o->shape, o->stride, o->nd, &b->view[w]);
        b->own[w] = b->view[w] != NULL;
    }
    for (int w = 0; w < N_OPS; w++)
        if (c->op[w].form == F_SAME)
            b->view[w] = b->view[c->op[w].same];
    if (st != LMK_OK) {
        snprintf(err, err_len, "making the buffers: %s: %s", lmk_status_name(st), lmk_last_error());
        bufset_free(b);
    }
    return st;
}

static lmk_attn_prologue_io io_of(const ap_case *c, const bufset *b)
{
    return (lmk_attn_prologue_io){
        .q_in = b->view[Q_IN], .k_in = b->view[K_IN], .v_in = b->view[V_IN], .q_norm_w = b->view[QW],
        .k_norm_w = b->view[KW], .positions = b->view[POS], .freq_factors = b->view[FF], .slots = b->view[SLOTS],
        .q_out = b->view[Q_OUT], .k_out = b->view[K_OUT], .k_cache = b->view[K_CACHE], .v_cache = b->view[V_CACHE],
        .k_scale = c->k_scale, .v_scale = c->v_scale};
}

static lmk_status call_op(const ap_case *c, lmk_stream *s, const bufset *b)
{
    const lmk_attn_prologue_io io = io_of(c, b);
    return lmk_attn_prologue(c->null_stream ? NULL : s, c->null_io ? NULL : &io, c->null_rope ? NULL : &c->rope,
                             c->null_norm ? NULL : &c->norm);
}

static lmk_status read_regions(const ap_case *c, const bufset *b, unsigned char **got)
{
    lmk_status st = LMK_OK;
    for (int i = 0; i < c->n_reg && st == LMK_OK; i++)
        st = lmk_buffer_read(b->root[i], 0, got[i], c->reg[i].bytes);
    return st;
}

/* Runs c on device d: uploads the images, calls, syncs, reads every region back into got. */
static lmk_status run_on(const ap_case *c, const tst_dev *d, unsigned char **got, char *err, size_t err_len)
{
    bufset b;
    lmk_status st = bufset_make(c, d->dev, NULL, &b, err, err_len);
    if (st != LMK_OK)
        return st;
    st = call_op(c, d->stream, &b);
    if (st == LMK_OK)
        st = lmk_stream_sync(d->stream);
    if (st != LMK_OK)
        snprintf(err, err_len, "%s: \"%s\"", lmk_status_name(st), lmk_last_error());
    else if ((st = read_regions(c, &b, got)) != LMK_OK)
        snprintf(err, err_len, "reading back: %s: %s", lmk_status_name(st), lmk_last_error());
    bufset_free(&b);
    return st;
}

static uint64_t hash_regions(const ap_case *c, unsigned char *const *got)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < c->n_reg; i++) {
        size_t j = 0;
        for (uint64_t w; j + 8 <= c->reg[i].bytes; j += 8) {
            memcpy(&w, got[i] + j, 8);
            h = (h ^ w) * 0x100000001b3ull;
        }
        for (; j < c->reg[i].bytes; j++)
            h = (h ^ got[i][j]) * 0x100000001b3ull;
    }
    return h;
}

/* ---- the reference and the checks ---- */

/* The address of operand w's element [0, 0, 0] in the images imgs. */
static const void *op_ptr(const ap_case *c, int w, unsigned char *const *imgs)
{
    const operand *o = &c->op[w];
    return o->form == F_NONE ? NULL : imgs[o->reg] + o->off * op_es(o);
}

/* Whether strides a, b agree on an axis of length n (a stride of a length-1 axis is meaningless). */
static bool stride_eq(size_t n, size_t a, size_t b)
{
    return n <= 1 || a == b;
}

/* lmk_attn_prologue_prepare resolved every operand where the case laid it out: pointers, strides,
 * dtypes, the cache row counts and Dv, the resolved scales. */
static bool layout_ok(const ap_case *c, const lmk_attn_prologue_args *a, unsigned char *const *imgs, char *msg,
                      size_t len)
{
    const struct {
        int w;
        const void *p;
        size_t tok, head;
    } t[] = {{Q_IN, a->rope.t[0].in, a->rope.t[0].in_tok, a->rope.t[0].in_head},
             {Q_OUT, a->rope.t[0].out, a->rope.t[0].out_tok, a->rope.t[0].out_head},
             {K_IN, a->rope.t[1].in, a->rope.t[1].in_tok, a->rope.t[1].in_head},
             {K_OUT, a->rope.t[1].out, a->rope.t[1].out_tok, a->rope.t[1].out_head},
             {V_IN, a->v_in.data, a->v_in.tok, a->v_in.head},
             {K_CACHE, a->k_cache.data, a->k_cache.tok, a->k_cache.head},
             {V_CACHE, a->v_cache.data, a->v_cache.tok, a->v_cache.head},
             {QW, a->q_norm_w, 0, 0}, {KW, a->k_norm_w, 0, 0}, {POS, a->rope.angle.positions, 0, 0},
             {FF, a->rope.angle.freq_factors, 0, 0}, {SLOTS, a->slots, 0, 0}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        const operand *o = &c->op[t[i].w];
        const bool strides = i < 7 && present(c, t[i].w); /* the first seven are [rows, heads, dim] */
        if (t[i].p != op_ptr(c, t[i].w, imgs) ||
            (strides && (!stride_eq(o->n[0], o->st[0], t[i].tok) || !stride_eq(o->n[1], o->st[1], t[i].head)))) {
            snprintf(msg, len, "prepare resolved %s as %p strides [%zu, %zu], the case laid it out at %p [%zu, %zu]",
                     k_op_names[t[i].w], t[i].p, t[i].tok, t[i].head, op_ptr(c, t[i].w, imgs), o->st[0], o->st[1]);
            return false;
        }
    }
    const operand *kc = &c->op[K_CACHE], *vc = &c->op[V_CACHE];
    const bool ok = a->k_slots == (present(c, K_CACHE) ? kc->n[0] : 0) &&
                    a->v_slots == (present(c, V_CACHE) ? vc->n[0] : 0) &&
                    (!present(c, V_IN) || a->v_dim == c->op[V_IN].n[2]) &&
                    (!present(c, K_CACHE) || a->k_cache.dtype == kc->dt) &&
                    (!present(c, V_CACHE) || a->v_cache.dtype == vc->dt) &&
                    a->k_inv_scale == inv_of(c->k_scale) && a->v_inv_scale == inv_of(c->v_scale) &&
                    a->rope.dtype == c->dt;
    if (!ok)
        snprintf(msg, len, "prepare resolved k_slots %" PRIu64 " v_slots %" PRIu64 " Dv %u inverse scales %a %a",
                 a->k_slots, a->v_slots, a->v_dim, (double)a->k_inv_scale, (double)a->v_inv_scale);
    return ok;
}

/* One verification: got[] are the regions after a run. */
typedef struct vctx {
    const ap_case *c;
    unsigned char **got;
    const bool *kept;       /* per token: no later token names its slot (its cache rows are the ones kept) */
    size_t n_checked, n_bad;
    char first[360];
} vctx;

/* Output element (r, h, i) of operand w must be `want` within the precision of its dtype, or, when
 * bits is given, exactly those bytes. Then it is put back to its bytes before the call. */
static void expect(vctx *v, int w, size_t r, size_t h, size_t i, double want, const unsigned char *bits)
{
    const operand *o = &v->c->op[w];
    const size_t es = op_es(o), e = op_at(o, r, h, i);
    unsigned char *g = v->got[o->reg] + e * es;
    const bool ok = bits ? memcmp(g, bits, es) == 0 : close_enough(o->dt, get(o->dt, g, 0), want);
    v->n_checked++;
    if (!ok && v->n_bad++ == 0) {
        uint64_t gb = 0, wb = 0;
        memcpy(&gb, g, es);
        if (bits)
            memcpy(&wb, bits, es);
        snprintf(v->first, sizeof v->first, "%s[%zu, %zu, %zu] (%s) is %.9g (bits 0x%" PRIx64 "), want %s %.9g%s",
                 k_op_names[w], r, h, i, lmk_dtype_name(o->dt), get(o->dt, g, 0), gb,
                 bits ? "the input's bits" : "within the contract of", bits ? get(o->dt, bits, 0) : want,
                 bits ? "" : " (float64)");
        if (bits)
            snprintf(v->first + strlen(v->first), sizeof v->first - strlen(v->first), " 0x%" PRIx64, wb);
    }
    memcpy(g, v->c->reg[o->reg].img + e * es, es);
}

/* The bits of input operand w's element (r, h, i) in the images. */
static const unsigned char *in_bits(const ap_case *c, int w, size_t r, size_t h, size_t i)
{
    const operand *o = &c->op[w];
    return c->reg[o->reg].img + op_at(o, r, h, i) * op_es(o);
}

static long long slot_of(const ap_case *c, size_t t)
{
    const operand *o = &c->op[SLOTS];
    const unsigned char *p = c->reg[o->reg].img + (o->off + t) * op_es(o);
    if (o->dt == LMK_I64) {
        int64_t v;
        memcpy(&v, p, 8);
        return v;
    }
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* One k row (or q row, w == Q_OUT) of token t into output w at row r; inv: 1, or an f8 cache's
 * inv_of(scale). */
static void expect_row(vctx *v, int w, int in, size_t r, size_t t, size_t h, const double *row, const bool *rot,
                       float inv)
{
    const ap_case *c = v->c;
    const bool norm = present(c, in == Q_IN ? QW : KW), same_dt = c->op[w].dt == c->dt;
    for (size_t i = 0; i < c->rope.head_dim; i++)
        expect(v, w, r, h, i, row[i] * (double)inv, !norm && !rot[i] && same_dt ? in_bits(c, in, t, h, i) : NULL);
}

/* Every output element of token t: q_out, k_out, and the cache rows of its slot. */
static void verify_token(vctx *v, const lmk_attn_prologue_args *a, size_t t, double *q64, double *k64, const bool *rot)
{
    const ap_case *c = v->c;
    const size_t d = c->rope.head_dim;
    lmk_ref_attn_prologue_token(a, t, q64, k64);
    for (size_t h = 0; h < c->rope.n_heads; h++)
        expect_row(v, Q_OUT, Q_IN, t, t, h, q64 + h * d, rot, 1.0f);
    for (size_t h = 0; h < c->rope.n_k_heads && present(c, K_OUT); h++)
        expect_row(v, K_OUT, K_IN, t, t, h, k64 + h * d, rot, 1.0f);
    const long long slot = present(c, SLOTS) && v->kept[t] ? slot_of(c, t) : -1; /* a later token's row wins */
    const operand *kc = &c->op[K_CACHE], *vc = &c->op[V_CACHE];
    if (present(c, K_CACHE) && slot >= 0 && (unsigned long long)slot < kc->n[0]) {
        const float inv = kc->dt == LMK_F8E4M3 ? inv_of(c->k_scale) : 1.0f;
        for (size_t h = 0; h < c->rope.n_k_heads; h++)
            expect_row(v, K_CACHE, K_IN, (size_t)slot, t, h, k64 + h * d, rot, inv);
    }
    if (present(c, V_CACHE) && slot >= 0 && (unsigned long long)slot < vc->n[0]) {
        const float inv = inv_of(c->v_scale);
        for (size_t h = 0; h < c->rope.n_k_heads; h++)
            for (size_t i = 0; i < vc->n[2]; i++) { /* v is exact: its f8 code is lmk.h's formula, bit for bit */
                const unsigned char *b = in_bits(c, V_IN, t, h, i);
                const uint8_t code = lmk_f32_to_f8e4m3((float)get(c->dt, b, 0) * inv);
                expect(v, V_CACHE, (size_t)slot, h, i, 0.0, vc->dt == c->dt ? b : &code);
            }
    }
}

/* Token order of equal slots: by slot, then token. */
static const ap_case *g_sort_case;

static int by_slot(const void *x, const void *y)
{
    const size_t a = *(const size_t *)x, b = *(const size_t *)y;
    const long long sa = slot_of(g_sort_case, a), sb = slot_of(g_sort_case, b);
    return sa != sb ? (sa < sb ? -1 : 1) : (a > b) - (a < b);
}

/* kept[t]: no later token of the call names token t's slot, so the cache rows of that slot must
 * hold token t's rows (lmk.h: with duplicate slots the last token's row is kept). */
static bool slots_kept(const ap_case *c, bool *kept)
{
    const size_t T = c->rope.seq_len;
    size_t *order = malloc(T * sizeof *order);
    if (!order)
        return false;
    for (size_t t = 0; t < T; t++)
        order[t] = t, kept[t] = true;
    if (present(c, SLOTS)) {
        g_sort_case = c;
        qsort(order, T, sizeof *order, by_slot);
        for (size_t i = 0; i + 1 < T; i++)
            kept[order[i]] = slot_of(c, order[i]) != slot_of(c, order[i + 1]);
    }
    free(order);
    return true;
}

/* Checks the regions got[] after a run of c against the reference args a (over the images):
 * every output element, then every other byte unchanged. */
static bool verify(const ap_case *c, const lmk_attn_prologue_args *a, unsigned char **got, char *msg, size_t len)
{
    const size_t d = c->rope.head_dim;
    double *q64 = malloc(c->rope.n_heads * d * sizeof *q64), *k64 = malloc(c->rope.n_k_heads * d * sizeof *k64);
    bool *rot = malloc(d * sizeof *rot), *kept = malloc(c->rope.seq_len * sizeof *kept);
    if (!q64 || !k64 || !rot || !kept || !slots_kept(c, kept)) {
        free(q64), free(k64), free(rot), free(kept);
        snprintf(msg, len, "out of host memory");
        return false;
    }
    rot_mask(&c->rope, rot);
    vctx v = {.c = c, .got = got, .kept = kept};
    for (size_t t = 0; t < c->rope.seq_len; t++)
        verify_token(&v, a, t, q64, k64, rot);
    free(q64), free(k64), free(rot), free(kept);
    if (v.n_bad) {
        snprintf(msg, len, "%zu of %zu output elements wrong; first: %s", v.n_bad, v.n_checked, v.first);
        return false;
    }
    for (int i = 0; i < c->n_reg; i++) {
        const long long at = tst_bits_diff(got[i], c->reg[i].img, c->reg[i].bytes);
        if (at < 0)
            continue;
        const char *names = "";
        for (int w = 0; w < N_OPS && !*names; w++)
            if (present(c, w) && c->op[w].reg == i)
                names = k_op_names[w];
        snprintf(msg, len, "byte %lld of region %d (the memory of %s) changed although no output element lives there "
                           "(0x%02x, was 0x%02x)", at, i, names, got[i][at], c->reg[i].img[at]);
        return false;
    }
    snprintf(msg, len, "%zu output elements", v.n_checked);
    return true;
}

/* ---- running a case ---- */

/* The reference arguments of c over the images imgs: what lmk_attn_prologue_prepare resolves for a
 * CPU device on host wraps of them. */
static bool ref_args(const ap_case *c, unsigned char *const *imgs, lmk_attn_prologue_args *a, char *msg, size_t len)
{
    bufset b;
    if (bufset_make(c, g_ref, imgs, &b, msg, len) != LMK_OK)
        return false;
    const lmk_attn_prologue_io io = io_of(c, &b);
    const lmk_status st = lmk_attn_prologue_prepare(g_ref, &io, &c->rope, &c->norm, a);
    if (st != LMK_OK)
        snprintf(msg, len, "lmk_attn_prologue_prepare: %s: \"%s\"", lmk_status_name(st), lmk_last_error());
    bufset_free(&b);
    return st == LMK_OK;
}

static bool got_alloc(const ap_case *c, unsigned char **got)
{
    bool ok = true;
    for (int i = 0; i < c->n_reg; i++)
        ok &= (got[i] = malloc(c->reg[i].bytes ? c->reg[i].bytes : 1)) != NULL;
    return ok;
}

static void got_free(unsigned char **got)
{
    for (int i = 0; i < MAX_REG; i++)
        free(got[i]), got[i] = NULL;
}

/* Sets the calling thread's floating-point environment to what a -ffast-math program or a caller
 * that forgot fesetround leaves: rounding upward, and on x86 flush-to-zero and denormals-are-zero.
 * Returns the environment to restore. */
static fenv_t odd_fenv(void)
{
    fenv_t env;
    fegetenv(&env);
    fesetround(FE_UPWARD);
#if defined(__x86_64__) || defined(__i386__)
    _mm_setcsr(_mm_getcsr() | 0x8040u);
#endif
    return env;
}

static void restore_fenv(const fenv_t *env)
{
    fesetenv(env);
}

/* One device: two runs (bit-identical), then the checks. One CHECK. */
static bool run_device(const ap_case *c, const tst_dev *d, const lmk_attn_prologue_args *a, unsigned char **got,
                       uint64_t seed)
{
    char msg[640] = "";
    lmk_status st = run_on(c, d, got, msg, sizeof msg);
    const uint64_t h1 = st == LMK_OK ? hash_regions(c, got) : 0;
    if (st == LMK_OK) { /* the second run under another floating-point environment (lmk.h: same bits) */
        const fenv_t env = odd_fenv();
        st = run_on(c, d, got, msg, sizeof msg);
        restore_fenv(&env);
    }
    const bool same = st == LMK_OK && hash_regions(c, got) == h1;
    const bool good = same && verify(c, a, got, msg, sizeof msg);
    return CHECK(good, "%s [%s] seed 0x%016" PRIx64 ": %s", c->name, d->name, seed,
                 st != LMK_OK ? msg
                 : !same      ? "two runs (the second rounding upward, with FTZ/DAZ) are not bit-identical"
                              : msg);
}

/* Runs c on every device, and, with ref_writer, checks the reference's own writer
 * (lmk_ref_attn_prologue) the same way. Returns whether everything passed. */
static bool run_case(const ap_case *c, const tst_dev *devs, int n_dev, uint64_t seed, bool ref_writer)
{
    char msg[640] = "";
    unsigned char *imgs[MAX_REG] = {0}, *got[MAX_REG] = {0};
    for (int i = 0; i < c->n_reg; i++)
        imgs[i] = c->reg[i].img;
    lmk_attn_prologue_args a;
    if (!TST_REQUIRE(case_ok(c) && got_alloc(c, got), "%s: out of host memory", c->name)) {
        got_free(got);
        return false;
    }
    bool pass = ref_args(c, imgs, &a, msg, sizeof msg) && layout_ok(c, &a, imgs, msg, sizeof msg);
    if (!CHECK(pass, "%s seed 0x%016" PRIx64 ": %s", c->name, seed, msg)) {
        got_free(got);
        return false;
    }
    for (int i = 0; i < n_dev; i++)
        pass &= run_device(c, &devs[i], &a, got, seed);
    if (ref_writer) {
        lmk_attn_prologue_args w;
        for (int i = 0; i < c->n_reg; i++)
            memcpy(got[i], imgs[i], c->reg[i].bytes);
        bool good = ref_args(c, got, &w, msg, sizeof msg);
        if (good) {
            lmk_ref_attn_prologue(&w);
            good = verify(c, &a, got, msg, sizeof msg);
        }
        pass &= CHECK(good, "%s [reference writer lmk_ref_attn_prologue] seed 0x%016" PRIx64 ": %s", c->name, seed,
                      msg);
    }
    got_free(got);
    return pass;
}

/* ---- model shapes and the case builder ---- */

enum { L_DENSE, L_QGATE, L_QKV, L_NEOX };   /* q, k, v: dense, q in a [q | gate] projection, packed QKV,
                                             * GPT-NeoX's [T, H, 3, D] (q, k, v of a head side by side) */
enum { O_BOTH, O_CACHE, O_KOUT };           /* k to k_out and the cache, to the cache only, to k_out only */
enum { C_DENSE, C_PAGED, C_COMBINED, C_PADDED, C_HEADS };
static const char *const k_layout_names[] = {"dense", "q|gate", "qkv", "neox[T,H,3,D]"};
static const char *const k_out_names[] = {"k_out+cache", "cache", "k_out"};
static const char *const k_cache_names[] = {"dense", "paged", "kv_combined", "padded", "[rows,hk,2,D]"};

typedef struct model {
    const char *name;
    uint32_t hq, hk, d, r;
    lmk_rope_mode mode;
    uint32_t sections[4];
    float base;
    bool norm;
    float w_off;
    int layout;
    bool llama3;              /* Llama 3.1 rope scaling through freq_factors */
} model;

static const model k_models[] = {
    {"Qwen3.5-27B", 24, 4, 256, 64, LMK_ROPE_IMROPE, {11, 11, 10, 0}, 1e7f, true, 1.0f, L_QGATE, false},
    {"Qwen3.5-35B-A3B", 16, 2, 256, 64, LMK_ROPE_IMROPE, {11, 11, 10, 0}, 1e7f, true, 1.0f, L_QGATE, false},
    {"Qwen3-8B", 32, 8, 128, 128, LMK_ROPE_NEOX, {0}, 1e6f, true, 0.0f, L_QKV, false},
    {"Llama-3.1-8B", 32, 8, 128, 128, LMK_ROPE_NEOX, {0}, 5e5f, false, 0.0f, L_DENSE, true},
};
enum { M_Q35_27B, M_Q35_35B, M_Q3_8B, M_LLAMA31_8B, N_MODELS };

typedef struct spec {
    model m;                  /* a copy: edge cases change it */
    uint32_t T, dv;           /* dv 0: head_dim */
    lmk_dtype dt, w_dt, slot_dt, pos_dt;
    int outputs, cache;
    bool f8, no_v, no_k_cache, text_pos, padding, nan_payloads, q_norm_only, k_norm_only, in_place;
    bool far_pos;             /* positions within 4096 of +-(2^20 - 1), both signs (text positions) */
    bool w_off1;              /* norm weights one element into their buffers: not 16-byte aligned */
    float k_scale, v_scale;
    lmk_rope_pairing pairing;
    float freq_scale, ext_factor, attn_factor;
    uint32_t n_ctx_orig, extra_rows;
    const char *note;         /* after the model in the name */
} spec;

static spec spec_of(int model_index, uint32_t T, lmk_dtype dt)
{
    return (spec){.m = k_models[model_index], .T = T, .dt = dt, .w_dt = dt, .slot_dt = LMK_I32, .pos_dt = LMK_I32,
                  .k_scale = 0.5f, .v_scale = 2.0f, .extra_rows = 7};
}

static bool is_multi(lmk_rope_mode m)
{
    return m == LMK_ROPE_MROPE || m == LMK_ROPE_IMROPE || m == LMK_ROPE_VISION;
}

static const char *mode_name(lmk_rope_mode m)
{
    return m == LMK_ROPE_NORMAL ? "normal" : m == LMK_ROPE_NEOX ? "neox" : m == LMK_ROPE_MROPE ? "mrope"
         : m == LMK_ROPE_VISION ? "vision" : "imrope";
}

/* q, k and v inputs as the model's engine lays them out, and q_out / k_out. */
static void build_qkv(ap_case *c, const spec *s)
{
    const model *m = &s->m;
    const size_t T = s->T, hq = m->hq, hk = m->hk, d = m->d, dv = s->dv ? s->dv : d;
    const bool v = s->outputs != O_KOUT && !s->no_v;
    if (m->layout == L_QKV) { /* [T, (hq + hk) * d + hk * dv]; q and k rotated in place */
        const size_t row = (hq + hk) * d + hk * dv;
        const int r = region_add(c, s->dt, T * row, FILL_X);
        op_strided(c, Q_IN, r, 0, T, hq, d, row, d);
        op_strided(c, K_IN, r, hq * d, T, hk, d, row, d);
        if (v)
            op_strided(c, V_IN, r, (hq + hk) * d, T, hk, dv, row, dv);
        op_same(c, Q_OUT, Q_IN);
        if (s->outputs != O_CACHE)
            op_same(c, K_OUT, K_IN);
        return;
    }
    if (m->layout == L_NEOX) { /* [T, H, 3, D], hq == hk, dv == d; q and k rotated in place */
        const int r = region_add(c, s->dt, T * hq * 3 * d, FILL_X);
        op_strided(c, Q_IN, r, 0, T, hq, d, 3 * hq * d, 3 * d);
        op_strided(c, K_IN, r, d, T, hk, d, 3 * hq * d, 3 * d);
        if (v)
            op_strided(c, V_IN, r, 2 * d, T, hk, d, 3 * hq * d, 3 * d);
        op_same(c, Q_OUT, Q_IN);
        if (s->outputs != O_CACHE)
            op_same(c, K_OUT, K_IN);
        return;
    }
    if (m->layout == L_QGATE) /* [T, hq, 2d]: q is the first half of each head */
        op_strided(c, Q_IN, region_add(c, s->dt, T * hq * 2 * d, FILL_X), 0, T, hq, d, 2 * hq * d, 2 * d);
    else
        op_dense(c, Q_IN, region_add(c, s->dt, T * hq * d, FILL_X), 0, T, hq, d, NULL, 0);
    op_dense(c, K_IN, region_add(c, s->dt, T * hk * d, FILL_X), 0, T, hk, d, NULL, 0);
    if (v)
        op_dense(c, V_IN, region_add(c, s->dt, T * hk * dv, FILL_X), 0, T, hk, dv, NULL, 0);
    if (s->in_place) { /* another view at the input's address */
        c->op[Q_OUT] = c->op[Q_IN];
        if (s->outputs != O_CACHE)
            c->op[K_OUT] = c->op[K_IN];
        return;
    }
    op_dense(c, Q_OUT, region_add(c, s->dt, T * hq * d, FILL_POISON), 0, T, hq, d, NULL, 0);
    if (s->outputs != O_CACHE)
        op_dense(c, K_OUT, region_add(c, s->dt, T * hk * d, FILL_POISON), 0, T, hk, d, NULL, 0);
}

/* Llama 3.1's rope scaling (factor 8, low/high frequency factors 1 and 4, 8192 original
 * positions) as lmk.h maps it: freq_factors[p] = base^(-2p/n) / inv_freq_HF[p]. */
static double llama3_ff(double base, uint32_t n, uint32_t p)
{
    const double inv = pow(base, -2.0 * p / n), wavelen = 2.0 * 3.14159265358979323846 / inv;
    if (wavelen < 8192.0 / 4.0)
        return 1.0;
    if (wavelen > 8192.0 / 1.0)
        return 8.0;
    const double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
    return 1.0 / ((1.0 - smooth) / 8.0 + smooth);
}

/* Positions: text tokens (every axis start + i); IMROPE/MROPE with distinct t/h/w (a grid of
 * image patches); NEOX decode batches (T > 32 and not text) at scattered positions. */
static void build_positions(ap_case *c, const spec *s, uint64_t *r)
{
    const bool multi = is_multi(s->m.mode);
    const size_t T = s->T, n = multi ? 4 * T : T;
    const int reg = region_add(c, s->pos_dt, n, FILL_NONE);
    op_flat(c, POS, reg, n);
    if (!case_ok(c))
        return;
    const int64_t start = rnd_below(r, 1000);
    for (size_t i = 0; i < T; i++) {
        int64_t t = !s->text_pos && !multi && T > 32 ? (int64_t)rnd_below(r, 131072) : start + (int64_t)i;
        if (s->far_pos) { /* the edge of lmk.h's precision domain, |position| < 2^20, both signs */
            const int64_t mag = ((int64_t)1 << 20) - 1 - (int64_t)rnd_below(r, 4096);
            t = i % 2 ? -mag : mag;
        }
        put_int(s->pos_dt, c->reg[reg].img, i, t);
        for (size_t axis = 1; multi && axis < 4; axis++)
            put_int(s->pos_dt, c->reg[reg].img, axis * T + i,
                    s->text_pos ? t : axis == 3 ? 0 : (int64_t)rnd_below(r, 64));
    }
}

/* Slots: distinct random rows of `rows`; with padding, about one token in five gets a slot that
 * writes nothing (-1, rows, beyond, and for i64 values whose low 32 bits are a valid row). */
static void build_slots(ap_case *c, const spec *s, size_t rows, uint64_t *r)
{
    const int reg = region_add(c, s->slot_dt, s->T, FILL_NONE);
    op_flat(c, SLOTS, reg, s->T);
    uint32_t *perm = malloc(rows * sizeof *perm);
    if (!perm || !case_ok(c)) {
        free(perm);
        return;
    }
    for (size_t i = 0; i < rows; i++)
        perm[i] = (uint32_t)i;
    const int64_t pads[] = {-1, (int64_t)rows, (int64_t)rows + 7, INT32_MAX, INT32_MIN, ((int64_t)1 << 32) + 1,
                            INT64_MIN, INT64_MAX};
    const uint32_t n_pads = s->slot_dt == LMK_I64 ? 8 : 5;
    for (size_t i = 0; i < s->T; i++) {
        const size_t j = i + rnd_below(r, (uint32_t)(rows - i));
        const uint32_t x = perm[j];
        perm[j] = perm[i], perm[i] = x;
        const bool pad = s->padding && rnd_below(r, 5) == 0;
        put_int(s->slot_dt, c->reg[reg].img, i, pad ? pads[rnd_below(r, n_pads)] : (int64_t)x);
    }
    free(perm);
}

/* The k and v caches: [rows, hk, d] and [rows, hk, dv] in the layout s->cache, poisoned. */
static void build_caches(ap_case *c, const spec *s, size_t rows)
{
    const size_t hk = s->m.hk, d = s->m.d, dv = s->dv ? s->dv : d;
    const lmk_dtype cdt = s->f8 ? LMK_F8E4M3 : s->dt;
    const bool v = !s->no_v;
    switch (s->cache) {
    case C_PAGED: { /* vLLM / FlashInfer NHD blocks [n_blocks, 16, hk, d], seen as rows */
        const size_t ks[4] = {rows / 16, 16, hk, d}, vs[4] = {rows / 16, 16, hk, dv};
        op_dense(c, K_CACHE, region_add(c, cdt, rows * hk * d, FILL_POISON), 0, rows, hk, d, ks, 4);
        if (v)
            op_dense(c, V_CACHE, region_add(c, cdt, rows * hk * dv, FILL_POISON), 0, rows, hk, dv, vs, 4);
        break;
    }
    case C_COMBINED: { /* one [rows, 2, hk, d] buffer: k and v are strided views of its halves */
        const int r = region_add(c, cdt, rows * 2 * hk * d, FILL_POISON);
        op_strided(c, K_CACHE, r, 0, rows, hk, d, 2 * hk * d, d);
        if (v)
            op_strided(c, V_CACHE, r, hk * d, rows, hk, d, 2 * hk * d, d);
        break;
    }
    case C_HEADS: { /* one [rows, hk, 2, d] buffer: a head's k and v side by side (dv == d) */
        const int r = region_add(c, cdt, rows * hk * 2 * d, FILL_POISON);
        op_strided(c, K_CACHE, r, 0, rows, hk, d, 2 * hk * d, 2 * d);
        if (v)
            op_strided(c, V_CACHE, r, d, rows, hk, d, 2 * hk * d, 2 * d);
        break;
    }
    case C_PADDED: { /* heads and rows padded (aligned cache lines) */
        const size_t kh = d + 16, kr = hk * kh + 8, vh = dv + 16, vr = hk * vh + 8;
        op_strided(c, K_CACHE, region_add(c, cdt, rows * kr, FILL_POISON), 0, rows, hk, d, kr, kh);
        if (v)
            op_strided(c, V_CACHE, region_add(c, cdt, rows * vr, FILL_POISON), 0, rows, hk, dv, vr, vh);
        break;
    }
    default:
        op_dense(c, K_CACHE, region_add(c, cdt, rows * hk * d, FILL_POISON), 0, rows, hk, d, NULL, 0);
        if (v)
            op_dense(c, V_CACHE, region_add(c, cdt, rows * hk * dv, FILL_POISON), 0, rows, hk, dv, NULL, 0);
        break;
    }
}

static void case_name(ap_case *c, const spec *s)
{
    const model *m = &s->m;
    char extra[160] = "";
    if (s->freq_scale != 0.0f || s->ext_factor != 0.0f || s->attn_factor != 0.0f)
        snprintf(extra, sizeof extra, " fs=%g ef=%g af=%g ctx=%u", (double)s->freq_scale, (double)s->ext_factor,
                 (double)s->attn_factor, s->n_ctx_orig);
    char norm[48] = "no_norm";
    if (m->norm)
        snprintf(norm, sizeof norm, "norm=%s%s+%g", s->q_norm_only ? "q:" : s->k_norm_only ? "k:" : "",
                 lmk_dtype_name(s->w_dt), (double)m->w_off);
    char cache[96] = "";
    if (s->outputs != O_KOUT)
        snprintf(cache, sizeof cache, " cache=%s %s%s%s slots=%s%s", s->f8 ? "f8e4m3" : lmk_dtype_name(s->dt),
                 k_cache_names[s->cache], s->no_v ? " no_v" : s->no_k_cache ? " no_k" : "",
                 s->dv && s->dv != m->d ? " dv!=d" : "",
                 lmk_dtype_name(s->slot_dt), s->padding ? "+pad" : "");
    snprintf(c->name, sizeof c->name,
             "attn_prologue %s hd=%u rd=%u nh=%u nk=%u T=%u %s base=%g%s%s %s %s out=%s%s%s%s pos=%s%s // %s%s%s",
             mode_name(m->mode), m->d, m->r, m->hq, m->hk, s->T, lmk_dtype_name(s->dt), (double)m->base,
             m->llama3 ? " ff=llama3" : "", extra, norm, k_layout_names[m->layout], k_out_names[s->outputs],
             s->in_place || m->layout == L_QKV ? " in_place" : "", cache, s->nan_payloads ? " nan_payloads" : "",
             lmk_dtype_name(s->pos_dt), s->far_pos ? "(near 2^20)" : s->text_pos ? "(text)" : "", m->name,
             s->note ? " " : "",
             s->note ? s->note : "");
}

/* A whole case from its spec and seed. */
static void build_case(ap_case *c, const spec *s, uint64_t seed)
{
    const model *m = &s->m;
    uint64_t r = seed;
    memset(c, 0, sizeof *c);
    c->dt = s->dt;
    c->rope = (lmk_rope_params){.head_dim = m->d, .rope_dim = m->r, .n_heads = m->hq, .seq_len = s->T,
                                .freq_base = m->base, .mode = m->mode, .pairing = s->pairing, .n_k_heads = m->hk,
                                .freq_scale = s->freq_scale, .ext_factor = s->ext_factor,
                                .attn_factor = s->attn_factor, .n_ctx_orig = s->n_ctx_orig};
    memcpy(c->rope.sections, m->sections, sizeof m->sections);
    c->norm = (lmk_rms_norm_params){.eps = 1e-6f, .weight_offset = m->w_off};
    build_qkv(c, s);
    if (m->norm) {
        const int fill = m->w_off == 1.0f ? FILL_W1 : FILL_W0;
        const size_t o = s->w_off1 ? 1 : 0;
        if (!s->k_norm_only) {
            op_flat(c, QW, region_add(c, s->w_dt, m->d + o, fill), m->d);
            c->op[QW].off = o;
        }
        if (!s->q_norm_only) {
            op_flat(c, KW, region_add(c, s->w_dt, m->d + o, fill), m->d);
            c->op[KW].off = o;
        }
    }
    if (m->llama3)
        op_flat(c, FF, region_add(c, LMK_F32, m->r / 2, FILL_NONE), m->r / 2);
    build_positions(c, s, &r);
    size_t rows = (size_t)s->T + s->extra_rows;
    if (s->cache == C_PAGED)
        rows = (rows + 15) / 16 * 16;
    if (s->outputs != O_KOUT) {
        build_slots(c, s, rows, &r);
        build_caches(c, s, rows);
        if (s->no_k_cache) /* its region stays, poisoned: it must stay so */
            c->op[K_CACHE].form = F_NONE;
        c->k_scale = s->f8 ? s->k_scale : 0.0f;
        c->v_scale = s->f8 ? s->v_scale : 0.0f;
    }
    case_name(c, s);
    if (!case_ok(c))
        return;
    fill_regions(c, &r);
    for (uint32_t p = 0; m->llama3 && p < m->r / 2; p++)
        put(LMK_F32, c->reg[c->op[FF].reg].img, p, llama3_ff(m->base, m->r, p));
    bool *rot = malloc(m->d * sizeof *rot);
    if (s->nan_payloads && rot) {
        rot_mask(&c->rope, rot);
        if (!present(c, QW))
            add_nan_payloads(c, Q_IN, rot, &r);
        if (!present(c, KW))
            add_nan_payloads(c, K_IN, rot, &r);
        if (present(c, V_IN))
            add_nan_payloads(c, V_IN, NULL, &r);
    }
    free(rot);
}

/* Builds and runs one spec on every device. */
static bool run_spec(const spec *s, const tst_dev *devs, int n_dev, bool ref_writer)
{
    const uint64_t seed = tst_case_seed();
    ap_case c;
    build_case(&c, s, seed);
    const bool pass = run_case(&c, devs, n_dev, seed, ref_writer);
    case_free(&c);
    return pass;
}

/* A group's closing line: how many cases, how many failed, how long. */
static void group_line(const char *what, int n, int failed, int n_dev, double t0)
{
    printf("%-58s %3d cases x %d devices: %s (%.1f s)\n", what, n, n_dev, failed ? "FAILED" : "ok", tst_now() - t0);
    if (failed)
        printf("    %d of them failed (above)\n", failed);
}

/* ---- 1, 2: the model shapes ---- */

/* Every model at T = 1, 5, 64 (a decode batch: scattered slots in a large cache, scattered
 * positions) in f32, bf16 and f16, and 4106 (a prompt) in one of them per model (300 with
 * LMK_TEST_QUICK, in all three). The other
 * choices (k_out and/or cache, cache dtype and layout, slot dtype, weight dtype, text or image
 * positions) rotate with the case index so that every model meets each of them. */
static void test_models(const tst_dev *devs, int n_dev)
{
    const uint32_t Ts[] = {1, 5, 64, tst_quick() ? 300u : 4106u};
    const lmk_dtype dts[] = {LMK_F32, LMK_BF16, LMK_F16};
    const double t0 = tst_now();
    int n = 0, failed = 0;
    for (int m = 0; m < N_MODELS; m++)
        for (int ti = 0; ti < 4; ti++)
            for (int di = 0; di < 3; di++) {
                if (Ts[ti] > 300 && di != (m + 1) % 3)
                    continue; /* the prompt length in one dtype per model (bf16, f16, f32, bf16): time, memory */
                const unsigned k = (unsigned)(m * 12 + ti * 3 + di);
                spec s = spec_of(m, Ts[ti], dts[di]);
                s.outputs = (int)(k % 3);
                s.cache = (int)((k / 3) % 3);
                s.f8 = (k / 9 + k) % 2 == 1;
                s.slot_dt = (k / 2) % 2 ? LMK_I64 : LMK_I32;
                s.w_dt = dts[(di + k / 4) % 3];
                s.padding = Ts[ti] > 1 || k % 4 == 0;
                s.text_pos = is_multi(s.m.mode) && k % 2 == 0;
                s.extra_rows = Ts[ti] == 64 ? 64 * 15 : Ts[ti] > 64 ? 100 : 7;
                s.k_scale = k % 4 == 1 ? 0.0f : 0.5f; /* 0 means 1 */
                n++;
                failed += !run_spec(&s, devs, n_dev, Ts[ti] <= 64);
            }
    group_line("model shapes (Qwen3.5-27B/35B-A3B, Qwen3-8B, Llama-3.1-8B)", n, failed, n_dev, t0);
}

/* Every model at positions near +-2^20, the edge of lmk.h's precision domain (the angles there
 * are the largest the contract covers, and the CPU's vector sin/cos and the CUDA kernels reduce
 * them in float64 by different code), f32 and bf16, a decode batch and a short prompt, on every
 * device. */
static void test_far_positions(const tst_dev *devs, int n_dev)
{
    const uint32_t Ts[] = {5, 64};
    const lmk_dtype dts[] = {LMK_F32, LMK_BF16};
    const double t0 = tst_now();
    int n = 0, failed = 0;
    for (int m = 0; m < N_MODELS; m++)
        for (int ti = 0; ti < 2; ti++)
            for (int di = 0; di < 2; di++) {
                spec s = spec_of(m, Ts[ti], dts[di]);
                s.far_pos = true;
                s.text_pos = true;
                s.pos_dt = (m + ti + di) % 2 ? LMK_I64 : LMK_I32;
                s.f8 = (m + ti) % 2 == 1;
                s.padding = true;
                n++;
                failed += !run_spec(&s, devs, n_dev, true);
            }
    group_line("positions near +-2^20 (every model, f32 and bf16)", n, failed, n_dev, t0);
}

/* ---- 2: edge shapes, modes, scalings and layouts ---- */

static spec edge(int model_index, uint32_t T, lmk_dtype dt, const char *note)
{
    spec s = spec_of(model_index, T, dt);
    s.note = note;
    s.padding = T > 1;
    return s;
}

static void shape(spec *s, uint32_t hq, uint32_t hk, uint32_t d, uint32_t r, lmk_rope_mode mode, int layout)
{
    s->m.hq = hq, s->m.hk = hk, s->m.d = d, s->m.r = r, s->m.mode = mode, s->m.layout = layout;
}

/* The edge specs, into e (room for 40); returns how many. */
static int edge_specs(spec *e)
{
    int n = 0;
    spec s = edge(M_Q3_8B, 5, LMK_F32, "(GPT-J pairs, partial rope, padded cache)");
    shape(&s, 4, 2, 64, 32, LMK_ROPE_NORMAL, L_DENSE), s.cache = C_PADDED, s.w_dt = LMK_BF16, e[n++] = s;
    s = edge(M_Q3_8B, 6, LMK_BF16, "(half_head pairing, f8 kv_combined)");
    shape(&s, 8, 2, 128, 64, LMK_ROPE_NEOX, L_DENSE), s.pairing = LMK_ROPE_PAIR_HALF_HEAD, s.f8 = true;
    s.cache = C_COMBINED, e[n++] = s;
    s = edge(M_Q35_27B, 7, LMK_BF16, "(Qwen2-VL-7B shape: mrope [16,24,24,0])");
    shape(&s, 28, 4, 128, 128, LMK_ROPE_MROPE, L_DENSE), s.m.sections[0] = 16, s.m.sections[1] = 24;
    s.m.sections[2] = 24, s.m.sections[3] = 0, s.m.base = 1e6f, s.cache = C_PAGED, e[n++] = s;
    s = edge(M_LLAMA31_8B, 4, LMK_F16, "(ViT: vision [20,20,0,0], no norm, k_out only)");
    shape(&s, 16, 16, 80, 80, LMK_ROPE_VISION, L_DENSE), s.m.sections[0] = s.m.sections[1] = 20, s.m.llama3 = false;
    s.m.base = 1e4f, s.outputs = O_KOUT, e[n++] = s;
    s = edge(M_Q3_8B, 5, LMK_F32, "(YaRN x4, f8 cache)");
    shape(&s, 4, 2, 64, 64, LMK_ROPE_NEOX, L_DENSE), s.freq_scale = 0.25f, s.ext_factor = 1.0f;
    s.attn_factor = 0.7f, s.n_ctx_orig = 4096, s.f8 = true, s.k_scale = 0.0f, s.v_scale = 3.0f, e[n++] = s;
    s = edge(M_Q3_8B, 5, LMK_BF16, "(linear x2, attn_factor 1.5)");
    shape(&s, 4, 2, 64, 64, LMK_ROPE_NEOX, L_DENSE), s.freq_scale = 0.5f, s.attn_factor = 1.5f, e[n++] = s;
    s = edge(M_Q3_8B, 5, LMK_F16, "(Dv 64 != D 128, paged)");
    shape(&s, 8, 2, 128, 128, LMK_ROPE_NEOX, L_DENSE), s.dv = 64, s.cache = C_PAGED, e[n++] = s;
    s = edge(M_Q3_8B, 3, LMK_BF16, "(Dv 64 != D 128, packed qkv, f8)");
    shape(&s, 8, 2, 128, 128, LMK_ROPE_NEOX, L_QKV), s.dv = 64, s.f8 = true, e[n++] = s;
    const lmk_dtype dts[] = {LMK_F32, LMK_BF16, LMK_F16};
    for (int i = 0; i < 3; i++) { /* no norm, partial rope: copied elements carry NaN payloads */
        s = edge(M_LLAMA31_8B, 5, dts[i], "(no norm, partial rope, NaN payloads in copies)");
        shape(&s, 8, 2, 128, 64, LMK_ROPE_NEOX, i == 2 ? L_QKV : L_DENSE), s.nan_payloads = true;
        s.f8 = i == 1, s.cache = i == 2 ? C_PADDED : C_DENSE, s.outputs = O_BOTH, e[n++] = s;
    }
    s = edge(M_Q35_27B, 5, LMK_BF16, "(q norm only, f16 weights)");
    s.q_norm_only = true, s.w_dt = LMK_F16, e[n++] = s;
    s = edge(M_Q3_8B, 3, LMK_F32, "(130 q heads: more rows than the CPU's group)");
    shape(&s, 130, 2, 8, 8, LMK_ROPE_NEOX, L_DENSE), e[n++] = s;
    s = edge(M_Q3_8B, 3, LMK_F32, "(rope_dim 512: more pairs than the CPU's chunk)");
    shape(&s, 2, 1, 512, 512, LMK_ROPE_NEOX, L_DENSE), e[n++] = s;
    s = edge(M_Q3_8B, 2, LMK_BF16, "(head_dim 2048: fewer CUDA warps per block)");
    shape(&s, 2, 1, 2048, 2048, LMK_ROPE_NEOX, L_DENSE), s.f8 = true, e[n++] = s;
    s = edge(M_Q3_8B, 7, LMK_BF16, "(head_dim 2)");
    shape(&s, 1, 1, 2, 2, LMK_ROPE_NEOX, L_DENSE), e[n++] = s;
    s = edge(M_Q3_8B, 5, LMK_F16, "(head_dim 96, rope_dim 32)");
    shape(&s, 6, 3, 96, 32, LMK_ROPE_NEOX, L_QKV), s.cache = C_COMBINED, e[n++] = s;
    s = edge(M_LLAMA31_8B, 64, LMK_BF16, "(i64 positions and slots, decode batch)");
    s.pos_dt = LMK_I64, s.slot_dt = LMK_I64, s.extra_rows = 2000, s.cache = C_PAGED, e[n++] = s;
    s = edge(M_LLAMA31_8B, 5, LMK_F32, "(in place: other views at the inputs' addresses)");
    s.in_place = true, s.f8 = true, e[n++] = s;
    s = edge(M_Q35_35B, 5, LMK_BF16, "(q rotated in place inside q|gate)");
    s.in_place = true, e[n++] = s;
    s = edge(M_Q3_8B, 5, LMK_BF16, "(k cache without v)");
    s.no_v = true, e[n++] = s;
    s = edge(M_Q3_8B, 5, LMK_F16, "(v cache without k cache, k norm only)");
    s.no_k_cache = true, s.m.layout = L_DENSE, s.k_norm_only = true, s.f8 = true, e[n++] = s;
    s = edge(M_Q3_8B, 1, LMK_BF16, "(a cache of one row)");
    s.extra_rows = 0, s.cache = C_COMBINED, e[n++] = s;
    /* Interleaved layouts of more heads than operand.c once listed one by one (64): each was
     * reported as an overlap. GPT-NeoX's [T, H, 3, D] with q and k in place, and caches whose
     * head holds k and then v ([rows, Hk, 2, D]). */
    s = edge(M_Q3_8B, 5, LMK_BF16, "(65 heads: GPT-NeoX [T, H, 3, D] in place, [rows, Hk, 2, D] cache)");
    shape(&s, 65, 65, 32, 32, LMK_ROPE_NEOX, L_NEOX), s.cache = C_HEADS, s.outputs = O_BOTH, e[n++] = s;
    s = edge(M_Q3_8B, 3, LMK_F32, "(128 heads: GPT-NeoX [T, H, 3, D] in place, [rows, Hk, 2, D] f8 cache)");
    shape(&s, 128, 128, 16, 16, LMK_ROPE_NEOX, L_NEOX), s.cache = C_HEADS, s.f8 = true, e[n++] = s;
    s = edge(M_Q3_8B, 4, LMK_F16, "(65 kv heads in a [rows, Hk, 2, D] cache)");
    shape(&s, 8, 65, 32, 16, LMK_ROPE_NEOX, L_DENSE), s.cache = C_HEADS, e[n++] = s;
    /* CUDA's small-call fill reads weights in 16-byte units only where they are aligned to them */
    s = edge(M_Q35_27B, 1, LMK_BF16, "(norm weights not 16-byte aligned, decode)");
    s.w_off1 = true, e[n++] = s;
    s = edge(M_Q3_8B, 5, LMK_F32, "(norm weights not 16-byte aligned, f16 weights)");
    s.w_off1 = true, s.w_dt = LMK_F16, e[n++] = s;
    return n;
}

static void test_edges(const tst_dev *devs, int n_dev)
{
    spec e[40];
    const int n = edge_specs(e);
    const double t0 = tst_now();
    int failed = 0;
    for (int i = 0; i < n; i++)
        failed += !run_spec(&e[i], devs, n_dev, true);
    group_line("edge shapes, modes, scalings, layouts", n, failed, n_dev, t0);
}

/* The bench's prompts at their own length on the GPU only (the CPU's paths are the same as at T = 300,
 * and a CPU runs these for seconds): Qwen3.5-27B at T = 4106 with a bf16 and an f8 cache and in f32,
 * Qwen3-8B in place in the packed QKV, two shapes no model has: head_dim 1024 inside a q|gate
 * layout, and 4/1 heads at 12001 tokens with an f8 cache (tiles of 4 tokens, the last one short),
 * and a partial rope without a norm whose copied elements hold NaN payloads, at a length the
 * prefill kernel takes. */
static void test_gpu_prompts(const tst_dev *devs, int n_dev)
{
    tst_dev gpus[TST_MAX_DEVS];
    int n_gpu = 0;
    for (int i = 0; i < n_dev; i++)
        if (devs[i].backend == LMK_BACKEND_CUDA)
            gpus[n_gpu++] = devs[i];
    if (n_gpu == 0) {
        SKIP("long prompts at the bench's lengths: GPU only, and no CUDA device is open");
        return;
    }
    spec e[8];
    int n = 0;
    spec s = edge(M_Q35_27B, 4106, LMK_BF16, "(the bench prompt)");
    s.padding = false, s.text_pos = true, e[n++] = s;
    s.f8 = true, s.k_scale = 0.0625f, s.v_scale = 0.125f, s.note = "(the bench prompt, f8 cache)", e[n++] = s;
    s = edge(M_Q35_27B, 4106, LMK_F32, "(the bench prompt, f32)");
    s.padding = false, s.text_pos = true, e[n++] = s;
    s = edge(M_Q3_8B, 4106, LMK_BF16, "(the bench prompt, in place in packed QKV)");
    s.padding = false, e[n++] = s;
    s = edge(M_Q3_8B, 2003, LMK_BF16, "(head_dim 1024 in q|gate)");
    shape(&s, 4, 2, 1024, 128, LMK_ROPE_NEOX, L_QGATE), e[n++] = s;
    s = edge(M_Q3_8B, 12001, LMK_F16, "(4/1 heads, 12001 tokens)");
    shape(&s, 4, 1, 128, 128, LMK_ROPE_NEOX, L_DENSE), s.outputs = O_BOTH, s.f8 = true, e[n++] = s;
    for (int i = 0; i < 2; i++) { /* prefill rows of pair and copy items, NaNs in the copies: CUDA's MIX
                                   * prefill kernel (dense, no f8) and the one without MIX (f8) */
        s = edge(M_LLAMA31_8B, 3001, LMK_BF16, i ? "(no norm, partial rope, NaN payloads in copies, prompt, f8)"
                                                 : "(no norm, partial rope, NaN payloads in copies, prompt)");
        shape(&s, 8, 2, 128, 64, LMK_ROPE_NEOX, i ? L_QKV : L_DENSE), s.nan_payloads = true;
        s.f8 = i == 1, s.outputs = O_BOTH, e[n++] = s;
    }
    const double t0 = tst_now();
    int failed = 0;
    for (int i = 0; i < n; i++)
        failed += !run_spec(&e[i], gpus, n_gpu, false);
    group_line("long prompts at the bench's lengths (GPU only)", n, failed, n_gpu, t0);
}

/* Prompts long enough that CUDA's prefill kernel runs several of the plan's blocks in each block
 * of its grid (the grid holds only what fits the GPU at once: ~400 blocks on an H200), so that
 * both staging areas and both table copies are used, including at a last short tile: every model
 * (in place inside the packed QKV, q inside q|gate, f8 and paged caches, padding slots; f8 scales
 * that are powers of two, that are not, and one of each, which CUDA runs in different orders), a
 * shape with tiles of several tokens, two with several row groups per token (one with groups that
 * do not divide the grid), and one with more angles than threads and pairs past the angle table
 * the host passes (rope_dim 512). Every device runs them; the CPU's paths are the same as at
 * T = 300. */
static void test_long_prompts(const tst_dev *devs, int n_dev)
{
    spec e[8];
    int n = 0;
    spec s = edge(M_Q35_27B, 1201, LMK_BF16, "(long prompt, bf16 cache, i64 positions)");
    s.cache = C_PAGED, s.pos_dt = LMK_I64, e[n++] = s;
    s = edge(M_Q35_35B, 1401, LMK_F16, "(long prompt, f8 cache, q in place in q|gate)");
    s.f8 = true, s.in_place = true, s.outputs = O_CACHE, e[n++] = s;
    s = edge(M_Q3_8B, 1501, LMK_BF16, "(long prompt, in place in packed QKV, f8, calibrated scales)");
    s.f8 = true, s.slot_dt = LMK_I64, s.k_scale = 0.0173f, s.v_scale = 0.0291f, e[n++] = s;
    s = edge(M_LLAMA31_8B, 1499, LMK_F32, "(long prompt, no norm, f32)");
    s.cache = C_COMBINED, e[n++] = s;
    s = edge(M_Q3_8B, 4801, LMK_BF16, "(long prompt, 4/1 heads: tiles of 4 tokens)");
    shape(&s, 4, 1, 128, 128, LMK_ROPE_NEOX, L_DENSE), s.outputs = O_BOTH, e[n++] = s;
    s = edge(M_Q3_8B, 1003, LMK_F16, "(long prompt, 96/8 heads: row groups, f8 with v_scale 3)");
    shape(&s, 96, 8, 128, 64, LMK_ROPE_NEOX, L_QKV), s.f8 = true, s.v_scale = 3.0f, e[n++] = s;
    s = edge(M_Q3_8B, 3001, LMK_BF16, "(long prompt, rope_dim 512: pairs past CUDA's angle table)");
    shape(&s, 2, 1, 512, 512, LMK_ROPE_NEOX, L_DENSE), e[n++] = s;
    /* f32 rows of 16 items take 16 lanes, so 76 rows a token are 5 groups (the last of 12 rows):
     * CUDA's stream grid is then cut to a multiple of 5 (of ~400 blocks) */
    s = edge(M_Q35_27B, 1003, LMK_F32, "(long prompt, 60/8 heads in f32: 5 row groups, the last short)");
    shape(&s, 60, 8, 256, 64, LMK_ROPE_IMROPE, L_QGATE), e[n++] = s;
    const double t0 = tst_now();
    int failed = 0;
    for (int i = 0; i < n; i++)
        failed += !run_spec(&e[i], devs, n_dev, false);
    group_line("long prompts (CUDA blocks stream several tiles)", n, failed, n_dev, t0);
}

/* ---- 2, 3: named cases ---- */

/* Padding slots write nothing, k_out is still written: T = 1 with one padding value each, and
 * T = 5 with every token padding. The i64 values have low 32 bits that name a valid row. Also
 * with k to the cache only, where a padding token's k rows have nowhere to go. (A CPU row path
 * that read its unset destinations for such rows wrote into q_out in one clang build only, and
 * this group passed with it under gcc: undefined behaviour that no test here catches reliably;
 * fuzz/FINDINGS.md 3.) */
static void test_padding(const tst_dev *devs, int n_dev)
{
    static const struct {
        lmk_dtype dt;
        int64_t v;
        const char *note;
    } pads[] = {{LMK_I32, -1, "(padding slot -1)"},
                {LMK_I32, 8, "(padding slot == n_slots)"},
                {LMK_I32, INT32_MIN, "(padding slot INT32_MIN)"},
                {LMK_I64, ((int64_t)1 << 32) + 1, "(padding slot 2^32+1: row 1 if read as 32 bits)"},
                {LMK_I64, INT64_MIN, "(padding slot INT64_MIN)"}};
    const double t0 = tst_now();
    int n = 0, failed = 0;
    for (int kind = 0; kind < 4; kind++) /* T = 1 or 5 (all padding), with k_out or to the cache only */
        for (size_t i = 0; i < sizeof pads / sizeof pads[0]; i++) {
            const bool all = kind & 1;
            spec s = edge(i % 2 ? M_Q3_8B : M_LLAMA31_8B, all ? 5 : 1, kind & 2 ? LMK_F32 : LMK_BF16, pads[i].note);
            s.slot_dt = pads[i].dt, s.outputs = kind & 2 ? O_CACHE : O_BOTH, s.extra_rows = 8 - s.T, s.padding = false;
            s.f8 = i == 2;
            const uint64_t seed = tst_case_seed();
            ap_case c;
            build_case(&c, &s, seed);
            for (size_t t = 0; case_ok(&c) && t < s.T; t++)
                put_int(pads[i].dt, c.reg[c.op[SLOTS].reg].img, t, pads[i].v);
            n++;
            failed += !run_case(&c, devs, n_dev, seed, true);
            case_free(&c);
        }
    group_line("padding slots (nothing cached, k_out written where given)", n, failed, n_dev, t0);
}

/* The CPU devices of devs (into cpus); a visible skip for the others, with why. */
static int cpu_devs(const tst_dev *devs, int n_dev, tst_dev *cpus, const char *why_not_cuda)
{
    int n = 0;
    for (int i = 0; i < n_dev; i++)
        if (devs[i].backend == LMK_BACKEND_CPU)
            cpus[n++] = devs[i];
        else
            SKIP("[%s] %s", devs[i].name, why_not_cuda);
    return n;
}

/* Duplicate slots: the cache row holds the whole row of the last token naming it (lmk.h). Pairs
 * of tokens with one slot where the CPU's contiguous split of 64 tokens among 2, 3, 4 or 5
 * threads ends one share and starts the next (so that a split in which every token writes its
 * row has the earlier token, the end of a share, write last, and two threads write one row at
 * once), a pair inside one share, a slot named from three shares; then a call in which every slot
 * is named by four tokens in shuffled order. With bf16 and f8 caches, a padding token among them.
 * Last, distinct random rows of a cache larger than the CPU's hash of slots, some of which share
 * a bucket without being equal. CPU devices only: on CUDA, lmk.h asks for distinct slots. */
static void test_duplicate_slots(const tst_dev *devs, int n_dev)
{
    tst_dev cpus[TST_MAX_DEVS];
    const int n_cpu = cpu_devs(devs, n_dev, cpus, "duplicate slots: lmk.h asks for distinct slots on CUDA");
    static const struct {
        uint32_t T;
        lmk_dtype dt;
        bool f8, fours;
        const char *note;
    } cs[] = {
        {64, LMK_BF16, false, false, "(duplicate slots across the thread shares)"},
        {64, LMK_F32, true, false, "(duplicate slots across the thread shares, f8 cache)"},
        {64, LMK_F16, false, false, "(duplicate slots across the thread shares, i64 slots)"},
        {512, LMK_BF16, false, true, "(every slot named by 4 tokens, shuffled)"},
        {1024, LMK_BF16, false, false, "(distinct random rows of a 65536-row cache, padding)"},
    };
    static const uint32_t pairs[][2] = {{31, 32}, {20, 21}, {41, 42}, {15, 16}, {47, 48}, {11, 12}, {23, 24},
                                        {35, 36}, {2, 5}, {0, 33}, {0, 60}};
    const double t0 = tst_now();
    int failed = 0, n = 0;
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        spec s = edge(M_Q3_8B, cs[i].T, cs[i].dt, cs[i].note);
        s.padding = false, s.f8 = cs[i].f8, s.slot_dt = i == 2 ? LMK_I64 : LMK_I32;
        const bool distinct = i == 4; /* slots that share hash buckets without being equal */
        if (distinct) {
            shape(&s, 8, 1, 16, 16, LMK_ROPE_NEOX, L_DENSE);
            s.extra_rows = 65536 - s.T, s.padding = true;
        }
        const uint64_t seed = tst_case_seed();
        uint64_t r = seed ^ 0x5107u;
        ap_case c;
        build_case(&c, &s, seed);
        if (case_ok(&c)) {
            unsigned char *sl = c.reg[c.op[SLOTS].reg].img;
            if (cs[i].fours) { /* slot t / 4 for token t, shuffled */
                for (size_t t = 0; t < s.T; t++)
                    put_int(s.slot_dt, sl, t, (int64_t)(t / 4));
                for (size_t t = s.T - 1; t > 0; t--) {
                    const size_t j = rnd_below(&r, (uint32_t)t + 1);
                    const int64_t a = (int64_t)get(s.slot_dt, sl, t), b = (int64_t)get(s.slot_dt, sl, j);
                    put_int(s.slot_dt, sl, t, b), put_int(s.slot_dt, sl, j, a);
                }
            } else if (!distinct) {
                for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++)
                    put_int(s.slot_dt, sl, pairs[p][1], (int64_t)get(s.slot_dt, sl, pairs[p][0]));
                put_int(s.slot_dt, sl, 7, -1);
            }
        }
        n++;
        failed += !run_case(&c, cpus, n_cpu, seed, true);
        case_free(&c);
    }
    group_line("duplicate slots: the last token's whole row (CPU)", n, failed, n_cpu, t0);
}

/* The float64 rows of token t with args a: q (which 0) or k (1) into row. */
static void ref_rows(const ap_case *c, const lmk_attn_prologue_args *a, size_t t, int which, double *row)
{
    double *other = malloc((size_t)(which ? c->rope.n_heads : c->rope.n_k_heads) * c->rope.head_dim * sizeof *other);
    if (other)
        lmk_ref_attn_prologue_token(a, t, which ? other : row, which ? row : other);
    free(other);
}

/* How many elements of q (which 0) or k (1) differ by more than 0.01 between the reference with
 * args a and with args b (b NULL: the raw input). */
static size_t count_differ(const ap_case *c, const lmk_attn_prologue_args *a, const lmk_attn_prologue_args *b,
                           int which)
{
    const size_t heads = which ? c->rope.n_k_heads : c->rope.n_heads, d = c->rope.head_dim;
    double *x = malloc(heads * d * sizeof *x), *y = malloc(heads * d * sizeof *y);
    size_t n = 0;
    for (size_t t = 0; x && y && t < c->rope.seq_len; t++) {
        ref_rows(c, a, t, which, x);
        for (size_t i = 0; i < heads * d; i++)
            y[i] = get(c->dt, in_bits(c, which ? K_IN : Q_IN, t, i / d, i % d), 0);
        if (b)
            ref_rows(c, b, t, which, y);
        for (size_t i = 0; i < heads * d; i++)
            n += fabs(x[i] - y[i]) > 0.01;
    }
    free(x), free(y);
    return n;
}

/* A case whose reference must differ from the reference with other positions (the ones a broken
 * kernel would use) and, with raw_too, from the raw input: so that the run can catch that kernel.
 * pos_of(c, a, positions) rewrites a copy of the positions. */
static void run_sensitive(const char *what, const spec *s, int which, bool raw_too,
                          void (*pos_of)(const ap_case *c, void *pos), const tst_dev *devs, int n_dev)
{
    const uint64_t seed = tst_case_seed();
    ap_case c;
    build_case(&c, s, seed);
    unsigned char *imgs[MAX_REG] = {0};
    for (int i = 0; i < c.n_reg; i++)
        imgs[i] = c.reg[i].img;
    lmk_attn_prologue_args a, b;
    char msg[400] = "";
    const region *pr = &c.reg[c.op[POS].reg];
    void *pos = malloc(pr->bytes);
    if (TST_REQUIRE(pos && case_ok(&c) && ref_args(&c, imgs, &a, msg, sizeof msg), "%s: %s", what, msg)) {
        memcpy(pos, pr->img, pr->bytes);
        pos_of(&c, pos);
        b = a;
        b.rope.angle.positions = pos;
        const size_t vs_pos = count_differ(&c, &a, &b, which), vs_raw = raw_too ? count_differ(&c, &a, NULL, which) : 1;
        CHECK(vs_pos > 0 && vs_raw > 0,
              "%s: the case cannot tell the fix from the bug (%zu elements differ from the bug's positions, %zu from "
              "the raw input)", what, vs_pos, vs_raw);
        run_case(&c, devs, n_dev, seed, true);
    }
    free(pos);
    case_free(&c);
}

/* Every position 0: rope is the identity, the k a kernel that skips the rotation writes back. */
static void positions_zero(const ap_case *c, void *pos)
{
    memset(pos, 0, c->reg[c->op[POS].reg].bytes);
}

/* Axes h, w, e equal to t: the text positions a kernel that drops the h/w rows of MRoPE uses. */
static void positions_text(const ap_case *c, void *pos)
{
    const size_t T = c->rope.seq_len, es = op_es(&c->op[POS]);
    for (size_t axis = 1; axis < 4; axis++)
        memcpy((char *)pos + axis * T * es, pos, T * es);
}

/* SGLang #19636: a fused rope + cache write that forgot to write the rotated k back (k_out given
 * with k_cache must hold the rotated k). SGLang #34446: a fused Qwen3.5 kernel that dropped the
 * h/w rows of MRoPE (IMROPE with distinct t/h/w positions must match the reference, which differs
 * from the text-position result). SGLang #37315 is about bandwidth: not a correctness test. */
static void test_public_bugs(const tst_dev *devs, int n_dev)
{
    const double t0 = tst_now();
    const int before = harness_failed;
    for (int layout = 0; layout < 2; layout++) {
        spec s = edge(M_Q3_8B, 5, LMK_BF16, layout ? "SGLang #19636 (k_out over k_in in packed qkv + k_cache)"
                                                   : "SGLang #19636 (k_out + k_cache)");
        s.m.layout = layout ? L_QKV : L_DENSE, s.outputs = O_BOTH, s.cache = layout ? C_PAGED : C_DENSE;
        run_sensitive("SGLang #19636: k_out with k_cache holds the rotated k", &s, 1, true, positions_zero, devs,
                      n_dev);
    }
    const lmk_dtype dts[] = {LMK_BF16, LMK_F32};
    for (int i = 0; i < 2; i++) {
        spec s = edge(i ? M_Q35_35B : M_Q35_27B, 5, dts[i], "SGLang #34446 (imrope, distinct t/h/w)");
        s.text_pos = false, s.outputs = O_BOTH, s.f8 = i == 0;
        run_sensitive("SGLang #34446: IMROPE uses the h and w positions", &s, 0, false, positions_text, devs, n_dev);
        run_sensitive("SGLang #34446: IMROPE uses the h and w positions (k)", &s, 1, false, positions_text, devs,
                      n_dev);
    }
    group_line("public bugs: SGLang #19636, #34446", 6, harness_failed > before, n_dev, t0);
}

/* ---- the f8 cache quantises the f32 result, as x * (1 / scale) ---- */

/* k = [1, 1, 1, 1] (bf16), k_norm_w = 1.0655 (f32), offset 0, position 0 (rope is the identity): the
 * f32 result is 1.06549947 for every element. Times 1 / k_scale = 2 it is 2.131, which rounds to
 * the f8 value 2.25 (0x41); rounded to bf16 first it would be 1.0625 -> 2.125, the midpoint between
 * 2.0 and 2.25, which ties to even 2.0 (0x40). With k_scale 0 (1): 0x39 (1.125) against 0x38
 * (1.0). k_out (bf16) holds 1.0625 (0x3f88). v goes to an f8 cache: exactly
 * lmk_f32_to_f8e4m3(v * inv_of(v_scale)); with v_scale 1.7, v = 0.0249023438 (bf16 0x3ccc) times
 * 1 / 1.7f lands just below the tie 0.0146484375 -> 0x07, where the quotient v / 1.7f is the tie
 * itself -> 0x08: a backend that divides fails here. */
static void build_f8_case(ap_case *c, float k_scale, float v_scale)
{
    memset(c, 0, sizeof *c);
    c->dt = LMK_BF16;
    c->rope = (lmk_rope_params){.head_dim = 4, .rope_dim = 2, .n_heads = 1, .seq_len = 1, .freq_base = 1e4f,
                                .mode = LMK_ROPE_NEOX, .n_k_heads = 1};
    c->norm = (lmk_rms_norm_params){.eps = 1e-6f, .weight_offset = 0.0f};
    c->k_scale = k_scale, c->v_scale = v_scale;
    op_dense(c, Q_IN, region_add(c, LMK_BF16, 4, FILL_X), 0, 1, 1, 4, NULL, 0);
    op_dense(c, K_IN, region_add(c, LMK_BF16, 4, FILL_NONE), 0, 1, 1, 4, NULL, 0);
    op_dense(c, V_IN, region_add(c, LMK_BF16, 4, FILL_NONE), 0, 1, 1, 4, NULL, 0);
    op_flat(c, KW, region_add(c, LMK_F32, 4, FILL_NONE), 4);
    op_flat(c, POS, region_add(c, LMK_I32, 1, FILL_NONE), 1);
    op_flat(c, SLOTS, region_add(c, LMK_I32, 1, FILL_NONE), 1);
    op_dense(c, Q_OUT, region_add(c, LMK_BF16, 4, FILL_POISON), 0, 1, 1, 4, NULL, 0);
    op_dense(c, K_OUT, region_add(c, LMK_BF16, 4, FILL_POISON), 0, 1, 1, 4, NULL, 0);
    op_dense(c, K_CACHE, region_add(c, LMK_F8E4M3, 8, FILL_POISON), 0, 2, 1, 4, NULL, 0);
    op_dense(c, V_CACHE, region_add(c, LMK_F8E4M3, 8, FILL_POISON), 0, 2, 1, 4, NULL, 0);
    snprintf(c->name, sizeof c->name, "attn_prologue neox hd=4 rd=2 nh=1 nk=1 T=1 bf16 norm=f32+0 cache=f8e4m3 "
             "k_scale=%g v_scale=%g // f8 quantised from the f32 result, as x * (1 / scale)", (double)k_scale,
             (double)v_scale);
    if (!case_ok(c))
        return;
    uint64_t r = 1;
    fill_regions(c, &r);
    static const float v[4] = {0.0249023438f, -0.0249023438f, -3.0f, 100.0f};
    for (int i = 0; i < 4; i++) {
        put(LMK_BF16, c->reg[c->op[K_IN].reg].img, (size_t)i, 1.0);
        put(LMK_BF16, c->reg[c->op[V_IN].reg].img, (size_t)i, v[i]);
        put(LMK_F32, c->reg[c->op[KW].reg].img, (size_t)i, 1.0655f);
    }
    put_int(LMK_I32, c->reg[c->op[SLOTS].reg].img, 0, 1);
}

/* One device: k_cache row 1 all `want`, k_out all 0x3f88, v_cache row 1 lmk_f32_to_f8e4m3(v * inv). */
static void check_f8_codes(const ap_case *c, const tst_dev *d, uint8_t want, unsigned char **got)
{
    char msg[400] = "";
    const lmk_status st = run_on(c, d, got, msg, sizeof msg);
    const unsigned char *kc = got[c->op[K_CACHE].reg] + 4, *vc = got[c->op[V_CACHE].reg] + 4;
    uint16_t ko[4];
    memcpy(ko, got[c->op[K_OUT].reg], sizeof ko);
    uint8_t vw[4];
    bool ok = st == LMK_OK;
    for (int e = 0; e < 4; e++) {
        vw[e] = lmk_f32_to_f8e4m3((float)get(LMK_BF16, c->reg[c->op[V_IN].reg].img, (size_t)e) * inv_of(c->v_scale));
        ok = ok && kc[e] == want && ko[e] == 0x3f88 && vc[e] == vw[e];
    }
    CHECK(ok, "%s [%s]: %s k_cache row 1 = %02x %02x %02x %02x (want %02x each), k_out[0] = %04x (want 3f88), "
          "v_cache row 1 = %02x %02x %02x %02x (want %02x %02x %02x %02x)", c->name, d->name, msg, kc[0], kc[1],
          kc[2], kc[3], want, ko[0], vc[0], vc[1], vc[2], vc[3], vw[0], vw[1], vw[2], vw[3]);
}

static void test_f8_from_f32(const tst_dev *devs, int n_dev)
{
    TST_REQUIRE(lmk_f32_to_f8e4m3(1.06549947f / 0.5f) == 0x41 && lmk_f32_to_f8e4m3(1.0625f / 0.5f) == 0x40 &&
                    lmk_f32_to_f8e4m3(1.06549947f) == 0x39 && lmk_f32_to_f8e4m3(1.0625f) == 0x38 &&
                    lmk_f32_to_bf16(1.06549947f) == 0x3f88 && lmk_f32_to_f8e4m3(0.0249023438f / 1.7f) == 0x08 &&
                    lmk_f32_to_f8e4m3(0.0249023438f * (1.0f / 1.7f)) == 0x07,
                "the f8 case's construction no longer separates what it should");
    for (int variant = 0; variant < 2; variant++) {
        ap_case c;
        build_f8_case(&c, variant ? 0.0f : 0.5f, variant ? 1.7f : 2.0f);
        unsigned char *got[MAX_REG] = {0};
        const bool ready = case_ok(&c) && got_alloc(&c, got);
        for (int i = 0; i < n_dev && TST_REQUIRE(ready, "%s: out of host memory", c.name); i++)
            check_f8_codes(&c, &devs[i], variant ? 0x39 : 0x41, got);
        got_free(got);
        run_case(&c, devs, n_dev, 1, true);
        case_free(&c);
    }
}

/* The inverse scale every backend multiplies by (lmk_attn_prologue_inv_scale, formed on the
 * caller's thread): 1.0f / scale in the default rounding mode, and the same bits when the caller
 * rounds upward, downward or toward zero with FTZ/DAZ set. Scales: the range's ends, ones whose
 * upward quotient is not the nearest, and random bit patterns across the valid range. */
static void test_inv_scale(void)
{
    float scales[64] = {0.0f, 1.0f, 0x1p-126f, 0x1p126f, 0x1.fffffep125f, 0x1.000002p-126f,
                        3.0f, 1.7f, 0.0173f, 0.0291f};
    uint64_t x = 0x5851f42d4c957f2dull;
    for (int i = 10; i < 64; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        const uint32_t b = 0x00800000u + (uint32_t)(x % (0x7e800000u - 0x00800000u + 1u));
        memcpy(&scales[i], &b, 4);
    }
    static const int modes[] = {FE_UPWARD, FE_DOWNWARD, FE_TOWARDZERO};
    int bad = 0, upward_differs = 0;
    for (int i = 0; i < 64; i++) {
        const float want = inv_of(scales[i]);
        bool ok = lmk_attn_prologue_inv_scale(scales[i]) == want;
        for (int m = 0; m < 3; m++) {
            fenv_t env = odd_fenv();
            fesetround(modes[m]);
            /* volatile on both sides: the divide must run under this rounding mode, before restore_fenv
             * (without FENV_ACCESS a compiler may move a plain divide past the call: clang does) */
            const volatile float s = scales[i];
            const volatile float plain = 1.0f / (s == 0.0f ? 1.0f : s);
            const float got = lmk_attn_prologue_inv_scale(scales[i]);
            restore_fenv(&env);
            upward_differs += m == 0 && plain != want;
            ok = ok && got == want;
        }
        if (!ok && bad++ < 4)
            CHECK(0, "lmk_attn_prologue_inv_scale(%a): not %a (1.0f / scale to nearest) in every rounding mode",
                  (double)scales[i], (double)want);
    }
    CHECK(bad == 0 && upward_differs > 0, "the f8 inverse scale: %d of 64 scales wrong in some rounding mode; %d "
          "whose upward quotient differs (some must, or this test shows nothing)", bad, upward_differs);
}

/* The reference itself against lmk.h's formula, written out here: norm over the whole head
 * (x / sqrt(mean(x^2) + eps) * (w + weight_offset)), then rope (lmk_ref_rope_row). */
static void test_reference_norm(void)
{
    spec s = edge(M_Q35_27B, 2, LMK_F32, "(reference check)");
    ap_case c;
    build_case(&c, &s, tst_case_seed());
    unsigned char *imgs[MAX_REG] = {0};
    for (int i = 0; i < c.n_reg; i++)
        imgs[i] = c.reg[i].img;
    lmk_attn_prologue_args a;
    char msg[400] = "";
    const size_t d = c.rope.head_dim;
    double *q = malloc(c.rope.n_heads * d * sizeof *q), *k = malloc(c.rope.n_k_heads * d * sizeof *k);
    double *x = malloc(d * sizeof *x), worst = 0;
    if (TST_REQUIRE(q && k && x && case_ok(&c) && ref_args(&c, imgs, &a, msg, sizeof msg), "reference check: %s",
                    msg)) {
        lmk_ref_attn_prologue_token(&a, 1, q, k);
        for (size_t h = 0; h < c.rope.n_k_heads; h++) {
            double ss = 0;
            for (size_t i = 0; i < d; i++)
                x[i] = get(c.dt, in_bits(&c, K_IN, 1, h, i), 0), ss += x[i] * x[i];
            for (size_t i = 0; i < d; i++)
                x[i] = x[i] / sqrt(ss / (double)d + (double)c.norm.eps) *
                       (get(LMK_F32, c.reg[c.op[KW].reg].img, i) + (double)c.norm.weight_offset);
            lmk_ref_rope_row(&a.rope, 1, x, x);
            for (size_t i = 0; i < d; i++)
                worst = fmax(worst, fabs(x[i] - k[h * d + i]));
        }
        CHECK(worst <= 1e-12, "lmk_ref_attn_prologue_token's k rows differ from norm-then-rope by %g", worst);
    }
    free(q), free(k), free(x);
    case_free(&c);
}

/* ---- 4: validation ---- */

/* The valid call every rule breaks: T 3, 2 q and 2 k heads (so that q and k tensors are
 * interchangeable), D 16, R 8 NEOX, bf16, both norms (bf16, with room for a strided view), v,
 * bf16 caches of 5 rows, slots {3, -1, 0} (the slots region holds one more entry). */
static void build_valid(ap_case *c)
{
    memset(c, 0, sizeof *c);
    c->dt = LMK_BF16;
    c->rope = (lmk_rope_params){.head_dim = 16, .rope_dim = 8, .n_heads = 2, .seq_len = 3, .freq_base = 1e4f,
                                .mode = LMK_ROPE_NEOX, .n_k_heads = 2};
    c->norm = (lmk_rms_norm_params){.eps = 1e-6f, .weight_offset = 0.0f};
    op_dense(c, Q_IN, region_add(c, LMK_BF16, 96, FILL_X), 0, 3, 2, 16, NULL, 0);
    op_dense(c, K_IN, region_add(c, LMK_BF16, 96, FILL_X), 0, 3, 2, 16, NULL, 0);
    op_dense(c, V_IN, region_add(c, LMK_BF16, 96, FILL_X), 0, 3, 2, 16, NULL, 0);
    op_flat(c, QW, region_add(c, LMK_BF16, 32, FILL_W0), 16);
    op_flat(c, KW, region_add(c, LMK_BF16, 32, FILL_W0), 16);
    op_flat(c, POS, region_add(c, LMK_I32, 3, FILL_NONE), 3);
    op_flat(c, SLOTS, region_add(c, LMK_I32, 4, FILL_NONE), 3);
    op_dense(c, Q_OUT, region_add(c, LMK_BF16, 96, FILL_POISON), 0, 3, 2, 16, NULL, 0);
    op_dense(c, K_OUT, region_add(c, LMK_BF16, 96, FILL_POISON), 0, 3, 2, 16, NULL, 0);
    op_dense(c, K_CACHE, region_add(c, LMK_BF16, 160, FILL_POISON), 0, 5, 2, 16, NULL, 0);
    op_dense(c, V_CACHE, region_add(c, LMK_BF16, 160, FILL_POISON), 0, 5, 2, 16, NULL, 0);
    snprintf(c->name, sizeof c->name, "attn_prologue neox hd=16 rd=8 nh=2 nk=2 T=3 bf16 norm=bf16+0 cache=bf16 "
             "// validation baseline");
    if (!case_ok(c))
        return;
    uint64_t r = tst_case_seed();
    fill_regions(c, &r);
    const int32_t pos[3] = {5, 6, 7}, slots[4] = {3, -1, 0, 1};
    memcpy(c->reg[c->op[POS].reg].img, pos, sizeof pos);
    memcpy(c->reg[c->op[SLOTS].reg].img, slots, sizeof slots);
}

static void count_to(ap_case *c, int w, size_t n)
{
    c->op[w].shape[0] = n, c->op[w].n[2] = n;
}

/* A [rows, heads, D] dense view of the same region, keeping the operand's dtype. */
static void reshape(ap_case *c, int w, size_t rows, size_t heads)
{
    const lmk_dtype dt = c->op[w].dt;
    op_dense(c, w, c->op[w].reg, 0, rows, heads, 16, NULL, 0);
    c->op[w].dt = dt;
}

static void m_stream(ap_case *c) { c->null_stream = true; }
static void m_io(ap_case *c) { c->null_io = true; }
static void m_rope(ap_case *c) { c->null_rope = true; }
static void m_norm(ap_case *c) { c->null_norm = true; }
static void m_q_in(ap_case *c) { c->op[Q_IN].form = F_NONE; }
static void m_k_in(ap_case *c) { c->op[K_IN].form = F_NONE; }
static void m_pos(ap_case *c) { c->op[POS].form = F_NONE; }
static void m_q_out(ap_case *c) { c->op[Q_OUT].form = F_NONE; }
static void m_rope_dim(ap_case *c) { c->rope.rope_dim = 18; }
static void m_eps0(ap_case *c) { c->norm.eps = 0.0f; }
static void m_eps_neg(ap_case *c) { c->norm.eps = -1.0f; }
static void m_eps_nan(ap_case *c) { c->norm.eps = NAN; }
static void m_w_off(ap_case *c) { c->norm.weight_offset = INFINITY; }
static void m_no_k(ap_case *c) { c->op[K_OUT].form = c->op[K_CACHE].form = F_NONE; }
static void m_no_slots(ap_case *c) { c->op[SLOTS].form = F_NONE; }
static void m_no_v_cache(ap_case *c) { c->op[V_CACHE].form = F_NONE; }
static void m_no_v_in(ap_case *c) { c->op[V_IN].form = F_NONE; }
static void m_w_short(ap_case *c) { count_to(c, QW, 15); }
static void m_w_strided(ap_case *c)
{
    operand *o = &c->op[QW];
    o->form = F_STRIDED, o->nd = 1, o->shape[0] = 16, o->stride[0] = 2;
}
static void m_w_i32(ap_case *c) { c->op[KW].dt = LMK_I32; }
static void m_slots_u32(ap_case *c) { c->op[SLOTS].dt = LMK_U32; }
static void m_slots_long(ap_case *c) { count_to(c, SLOTS, 4); }
static void m_k_scale(ap_case *c) { c->k_scale = -1.0f; }
static void m_k_scale_tiny(ap_case *c) { c->k_scale = 0x1p-127f; } /* subnormal */
static void m_v_scale(ap_case *c) { c->v_scale = NAN; }
static void m_v_scale_huge(ap_case *c) { c->v_scale = 0x1p127f; } /* its inverse would be subnormal */
static void m_cache_f16(ap_case *c) { c->op[K_CACHE].dt = LMK_F16; }
static void m_k_cache_heads(ap_case *c) { reshape(c, K_CACHE, 1, 3); }
static void m_v_cache_heads(ap_case *c) { reshape(c, V_CACHE, 1, 3); }
static void m_other_dev(ap_case *c) { c->reg[c->op[QW].reg].other = true; }
static void m_k_out_q_in(ap_case *c) { c->op[K_OUT] = c->op[Q_IN]; }
static void m_k_cache_v_in(ap_case *c) { c->op[K_CACHE] = c->op[V_IN]; }
static void m_q_out_k_out(ap_case *c) { op_same(c, K_OUT, Q_OUT); }

typedef struct rule {
    void (*apply)(ap_case *c);
    int group;                /* rules of one group are not combined in the order check */
    const char *msg[3];       /* what the message must contain */
} rule;

/* lmk.h's order. */
static const rule k_rules[] = {
    {m_stream, 0, {"attn_prologue: stream must not be NULL"}},
    {m_io, 1, {"attn_prologue: io must not be NULL"}},
    {m_rope, 2, {"attn_prologue: rope params must not be NULL"}},
    {m_norm, 3, {"attn_prologue: norm params must not be NULL"}},
    {m_q_in, 4, {"attn_prologue: io->q_in must not be NULL"}},
    {m_k_in, 5, {"attn_prologue: io->k_in must not be NULL"}},
    {m_pos, 6, {"attn_prologue: io->positions must not be NULL"}},
    {m_q_out, 7, {"attn_prologue: io->q_out must not be NULL"}},
    {m_rope_dim, 8, {"attn_prologue: rope_dim must be <= head_dim", "rope_dim=18", "head_dim=16"}},
    {m_eps0, 9, {"attn_prologue: eps must be finite and > 0", "got 0"}},
    {m_eps_neg, 9, {"attn_prologue: eps must be finite and > 0", "got -1"}},
    {m_eps_nan, 9, {"attn_prologue: eps must be finite and > 0", "got nan"}},
    {m_w_off, 10, {"attn_prologue: weight_offset must be finite", "got inf"}},
    {m_no_k, 11, {"attn_prologue: k_out or k_cache must be given"}},
    {m_no_slots, 12, {"attn_prologue: k_cache needs slots"}},
    {m_no_v_cache, 13, {"attn_prologue: v_in and v_cache must be given together", "v_in without v_cache"}},
    {m_no_v_in, 13, {"attn_prologue: v_in and v_cache must be given together", "v_cache without v_in"}},
    {m_w_short, 14, {"attn_prologue: q_norm_w must be dense with exactly head_dim (16) elements", "got 15"}},
    {m_w_strided, 14, {"attn_prologue: q_norm_w must be dense with exactly head_dim (16)", "strided"}},
    {m_w_i32, 15, {"attn_prologue: k_norm_w must be f32, bf16 or f16", "got i32"}},
    {m_slots_u32, 16, {"attn_prologue: slots must be i32 or i64", "got u32"}},
    {m_slots_long, 16, {"attn_prologue: slots must be dense with exactly seq_len (3) entries", "got 4"}},
    {m_k_scale, 17, {"attn_prologue: k_scale must be finite and >= 0", "got -1"}},
    {m_k_scale_tiny, 17, {"attn_prologue: k_scale must be 0 or in [2^-126, 2^126]", "got 5.87747e-39"}},
    {m_v_scale, 18, {"attn_prologue: v_scale must be finite and >= 0", "got nan"}},
    {m_v_scale_huge, 18, {"attn_prologue: v_scale must be 0 or in [2^-126, 2^126]", "got 1.70141e+38"}},
    {m_cache_f16, 19, {"attn_prologue: k_cache dtype f16 must be the input dtype (bf16) or f8e4m3"}},
    {m_k_cache_heads, 20, {"attn_prologue: k_cache must be [rows, 2, 16]", "48 elements"}},
    {m_v_cache_heads, 20, {"attn_prologue: v_cache must be [rows, 2, 16]", "48 elements"}},
    {m_other_dev, 21, {"attn_prologue: q_norm_w is not on the stream's device"}},
    {m_k_out_q_in, 22, {"attn_prologue: k_out overlaps q_in"}},
    {m_k_cache_v_in, 22, {"attn_prologue: k_cache overlaps v_in"}},
    {m_q_out_k_out, 22, {"attn_prologue: q_out overlaps k_out"}},
};
enum { N_RULES = (int)(sizeof k_rules / sizeof k_rules[0]) };

/* Applies rules a (and b when >= 0) to the valid call on device d: INVALID_ARGUMENT with rule a's
 * message, and no byte of any region changed. */
static void check_rule(const ap_case *valid, const tst_dev *d, int a, int b)
{
    ap_case c = *valid; /* shares the images, which a run only reads */
    k_rules[a].apply(&c);
    if (b >= 0)
        k_rules[b].apply(&c);
    char err[400] = "";
    unsigned char *got[MAX_REG] = {0};
    bufset bs;
    lmk_clear_error();
    lmk_status st = got_alloc(&c, got) ? bufset_make(&c, d->dev, NULL, &bs, err, sizeof err) : LMK_ERR_OUT_OF_MEMORY;
    if (!TST_REQUIRE(st == LMK_OK, "[%s] rule %d: %s", d->name, a, err)) {
        got_free(got);
        return;
    }
    lmk_clear_error();
    st = call_op(&c, d->stream, &bs);
    const bool msg_ok = tst_msg_has(k_rules[a].msg[0], k_rules[a].msg[1], k_rules[a].msg[2], (const char *)NULL);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", lmk_last_error());
    lmk_stream_sync(d->stream);
    bool same = read_regions(&c, &bs, got) == LMK_OK;
    for (int i = 0; i < c.n_reg && same; i++)
        same = memcmp(got[i], c.reg[i].img, c.reg[i].bytes) == 0;
    CHECK(st == LMK_ERR_INVALID_ARGUMENT && msg_ok && same,
          "[%s] rule \"%s\"%s%s%s: got %s \"%s\"%s", d->name, k_rules[a].msg[0],
          b >= 0 ? " (with the later rule \"" : "", b >= 0 ? k_rules[b].msg[0] : "", b >= 0 ? "\" broken too)" : "",
          lmk_status_name(st), msg, same ? "" : "; a rejected call changed a byte");
    bufset_free(&bs);
    got_free(got);
}

static void test_validation(const tst_dev *devs, int n_dev)
{
    const double t0 = tst_now();
    const int before = harness_failed;
    ap_case valid;
    build_valid(&valid);
    if (!TST_REQUIRE(case_ok(&valid), "validation: out of host memory")) {
        case_free(&valid);
        return;
    }
    run_case(&valid, devs, n_dev, 0, true);
    for (int i = 0; i < n_dev; i++) {
        for (int a = 0; a < N_RULES; a++)
            check_rule(&valid, &devs[i], a, -1);
        for (int a = 0; a + 1 < N_RULES; a++) /* order: with the next rule broken too, this one is reported */
            if (k_rules[a].group != k_rules[a + 1].group)
                check_rule(&valid, &devs[i], a, a + 1);
    }
    case_free(&valid);
    group_line("validation: every rule in lmk.h's order", N_RULES, harness_failed > before, n_dev, t0);
}

/* v's head size Dv past 32 bits: [1, 1, 2^32 + 16] f16 v_in and v_cache (a lmk_attn_prologue_args
 * field once kept Dv in 32 bits, so the call copied 16 elements a row and returned LMK_OK). The
 * call must be rejected naming Dv before any byte is touched. The two 8 GiB buffers wrap address
 * space reserved without memory (MAP_NORESERVE): validation never reads a buffer, and a call that
 * ran would touch only the pages it copies, whose bytes are checked. CPU devices only (a CUDA
 * buffer must be device memory). */
static void test_huge_dv(const tst_dev *devs, int n_dev)
{
    tst_dev cpus[TST_MAX_DEVS];
    const int n_cpu = cpu_devs(devs, n_dev, cpus, "Dv past 32 bits: host address space stands in for the buffers");
    const size_t dv = ((size_t)1 << 32) + 16, bytes = dv * 2;
    unsigned char *vin = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    unsigned char *vc = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (vin == MAP_FAILED || vc == MAP_FAILED) {
        SKIP("Dv past 32 bits: cannot reserve 2 x %zu bytes of address space", bytes);
        if (vin != MAP_FAILED)
            munmap(vin, bytes);
        if (vc != MAP_FAILED)
            munmap(vc, bytes);
        return;
    }
    memset(vin, 0x3C, 4096); /* f16 1.0: a copy would show in the cache's first page */
    for (int i = 0; i < n_cpu; i++) {
        lmk_device *dev = cpus[i].dev;
        const size_t vshape[3] = {1, 1, dv}, qshape[3] = {1, 1, 16};
        uint16_t q[16] = {0}, k[16] = {0}, qo[16], ko[16];
        int32_t pos = 3, slot = 0;
        memset(qo, 0xFF, sizeof qo), memset(ko, 0xFF, sizeof ko);
        lmk_buffer *bq = NULL, *bk = NULL, *bqo = NULL, *bko = NULL, *bp = NULL, *bs = NULL, *bv = NULL, *bvc = NULL;
        lmk_status st = lmk_buffer_wrap(dev, q, sizeof q, LMK_F16, qshape, 3, &bq);
        if (st == LMK_OK)
            st = lmk_buffer_wrap(dev, k, sizeof k, LMK_F16, qshape, 3, &bk);
        if (st == LMK_OK)
            st = lmk_buffer_wrap(dev, qo, sizeof qo, LMK_F16, qshape, 3, &bqo);
        if (st == LMK_OK)
            st = lmk_buffer_wrap(dev, ko, sizeof ko, LMK_F16, qshape, 3, &bko);
        if (st == LMK_OK)
            st = lmk_buffer_wrap(dev, &pos, sizeof pos, LMK_I32, NULL, 0, &bp);
        if (st == LMK_OK)
            st = lmk_buffer_wrap(dev, &slot, sizeof slot, LMK_I32, NULL, 0, &bs);
        if (st == LMK_OK)
            st = lmk_buffer_wrap(dev, vin, bytes, LMK_F16, vshape, 3, &bv);
        if (st == LMK_OK)
            st = lmk_buffer_wrap(dev, vc, bytes, LMK_F16, vshape, 3, &bvc);
        if (TST_REQUIRE(st == LMK_OK, "[%s] Dv past 32 bits: buffers: %s", cpus[i].name, lmk_last_error())) {
            const lmk_attn_prologue_io io = {.q_in = bq, .k_in = bk, .v_in = bv, .positions = bp, .slots = bs,
                                             .q_out = bqo, .k_out = bko, .v_cache = bvc};
            const lmk_rope_params rp = {.head_dim = 16, .rope_dim = 16, .n_heads = 1, .seq_len = 1,
                                        .freq_base = 1e4f, .mode = LMK_ROPE_NEOX, .n_k_heads = 1};
            const lmk_rms_norm_params np = {.eps = 1e-6f};
            lmk_clear_error();
            st = lmk_attn_prologue(cpus[i].stream, &io, &rp, &np);
            lmk_stream_sync(cpus[i].stream);
            const bool untouched = tst_find_not(vc, 0, 4096, 0) < 0 && tst_find_not(qo, 0, sizeof qo, 0xFF) < 0;
            CHECK(st == LMK_ERR_INVALID_ARGUMENT && tst_msg_has("attn_prologue: ", "Dv", "4294967312", NULL) &&
                      untouched,
                  "[%s] v_in [1, 1, 2^32 + 16] f16: %s \"%s\" (want INVALID_ARGUMENT naming Dv 4294967312)%s",
                  cpus[i].name, lmk_status_name(st), lmk_last_error(), untouched ? "" : "; the call wrote outputs");
            memset(vc, 0, 4096);
        }
        lmk_buffer *all[] = {bq, bk, bqo, bko, bp, bs, bv, bvc};
        for (size_t j = 0; j < sizeof all / sizeof all[0]; j++)
            lmk_buffer_free(all[j]);
    }
    munmap(vin, bytes);
    munmap(vc, bytes);
}

int main(void)
{
    tst_program_seed();
    tst_dev devs[TST_MAX_DEVS];
    const int n_dev = tst_devs_open_isas(devs);
    const lmk_status st = lmk_device_open(LMK_BACKEND_CPU, 0, &g_ref);
    const lmk_status st2 = lmk_device_open(LMK_BACKEND_CPU, 0, &g_other);
    if (TST_REQUIRE(n_dev > 0 && st == LMK_OK && st2 == LMK_OK, "cannot open the devices: %s", lmk_last_error())) {
        test_reference_norm();
        test_validation(devs, n_dev);
        test_huge_dv(devs, n_dev);
        test_inv_scale();
        test_f8_from_f32(devs, n_dev);
        test_padding(devs, n_dev);
        test_duplicate_slots(devs, n_dev);
        test_public_bugs(devs, n_dev);
        test_edges(devs, n_dev);
        test_models(devs, n_dev);
        test_long_prompts(devs, n_dev);
        test_gpu_prompts(devs, n_dev);
        test_far_positions(devs, n_dev);
    }
    lmk_device_close(g_other);
    lmk_device_close(g_ref);
    tst_devs_close(devs, n_dev);
    return harness_summary();
}
