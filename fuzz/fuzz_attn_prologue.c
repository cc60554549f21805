/*
 * fuzz_attn_prologue.c - libFuzzer harness for lmk_attn_prologue (lmk.h "attn_prologue": per-head
 * RMSNorm + rope of q and k, k to k_out and/or the KV cache through slots, v to its cache).
 *
 * One input is one call, read from the input's bytes and then from a stream seeded by their hash
 * (so that short inputs make rich calls too). The bytes pick the rope (every mode, pairing,
 * sections, freq_base, YaRN/linear scaling, freq_factors), the norm (weights or none, their dtype,
 * eps, weight_offset), the dtype, the layout of q, k and v (dense, q inside a [q | gate]
 * projection, q/k/v inside a packed QKV buffer, q and k in place or out of place), k_out, the
 * caches (input dtype or f8e4m3 with scales; dense, paged 4-D, combined [rows, 2, Hk, D], padded
 * strided), the slots (i32/i64, distinct rows and padding values) and the positions
 * (i32/u32/i64). Every operand is a view of one host arena, so operands can overlap and the world
 * snapshot (fuzz_common.h) sees every byte. Inputs meant to be invalid break one to three rules on
 * top: NULLs, wild parameters, missing operands, wrong dtypes, counts and shapes, a buffer on
 * another device, outputs over other operands.
 *
 * An oracle written from lmk.h (not from op.c) decides: valid, invalid, or "may reject" (lmk.h lets
 * the op reject a layout it cannot prove disjoint when extents meet without shared bytes). Then:
 *   valid:   LMK_OK; no byte changes outside q_out, k_out and the cache rows of valid slots; copies
 *            are the input's bits (no norm; v in its dtype), f8 copies exactly lmk_f32_to_f8e4m3(x /
 *            scale); every other element within lmk.h's precision of the float64 reference
 *            (lmk_attn_prologue_prepare + lmk_ref_attn_prologue_token, computed before the call) when
 *            |x| <= 2 and the angles are small; sometimes a second run must give the same bytes;
 *   invalid: LMK_ERR_INVALID_ARGUMENT, a message naming attn_prologue, no byte changed;
 *   always:  no crash, no heap allocation inside the call, no leak after freeing the call's buffers.
 * Duplicate slots are never generated: lmk.h does not say which token's row wins.
 */
#include "fuzz_common.h"
#include "core/internal.h"
#include "ops/attn_prologue/attn_prologue.h"

#include <float.h>

enum { Q_IN, K_IN, V_IN, QW, KW, POS, FF, SLOTS, Q_OUT, K_OUT, K_CACHE, V_CACHE, N_OPS };
static const char *const k_names[N_OPS] = {"q_in", "k_in", "v_in", "q_norm_w", "k_norm_w", "positions",
                                           "freq_factors", "slots", "q_out", "k_out", "k_cache", "v_cache"};
enum { VALID, INVALID, MAY_REJECT };

/* One call: its parameters, operands and what the harness knows about them. */
typedef struct ap_call {
    lmk_rope_params rope;
    lmk_rms_norm_params norm;
    lmk_buffer *op[N_OPS];
    lmk_stream *s;
    bool null_io, null_rope, null_norm;
    float k_scale, v_scale;
    lmk_dtype dt;
    uint32_t dv;              /* v's head size as built */
    size_t bump;              /* next free byte of the arena */
    bool precise;             /* inputs in the precision contract's domain (decided while filling) */
} ap_call;

static lmk_attn_prologue_io io_of(const ap_call *c)
{
    return (lmk_attn_prologue_io){.q_in = c->op[Q_IN], .k_in = c->op[K_IN], .v_in = c->op[V_IN],
                                  .q_norm_w = c->op[QW], .k_norm_w = c->op[KW], .positions = c->op[POS],
                                  .freq_factors = c->op[FF], .slots = c->op[SLOTS], .q_out = c->op[Q_OUT],
                                  .k_out = c->op[K_OUT], .k_cache = c->op[K_CACHE], .v_cache = c->op[V_CACHE],
                                  .k_scale = c->k_scale, .v_scale = c->v_scale};
}

static lmk_status call_op(const ap_call *c)
{
    const lmk_attn_prologue_io io = io_of(c);
    return lmk_attn_prologue(c->s, c->null_io ? NULL : &io, c->null_rope ? NULL : &c->rope,
                             c->null_norm ? NULL : &c->norm);
}

/* ---- making views in the arena ---- */

/* `bytes` of the arena at the next 64-byte boundary plus a random gap; SIZE_MAX when full. */
static size_t place(fz_in *in, ap_call *c, size_t bytes)
{
    const size_t off = (c->bump + 63) / 64 * 64 + 64 * fz_pick(in, 3);
    if (bytes > FZ_ARENA_BYTES || off > FZ_ARENA_BYTES - bytes)
        return SIZE_MAX;
    c->bump = off + bytes;
    return off;
}

/* A view of the arena at byte `off`: dense with the declared shape (strides NULL), or strided. */
static lmk_buffer *view(fz_env *e, fz_call *fc, size_t off, lmk_dtype t, int nd, const size_t *shape,
                        const size_t *strides)
{
    lmk_buffer *b = NULL;
    const lmk_status st = strides ? lmk_buffer_view_strided(e->parent, off, t, shape, strides, nd, &b)
                                  : lmk_buffer_view(e->parent, off, t, shape, nd, &b);
    FZ_CHECK(st == LMK_OK, "harness: view at %zu (%s, %d-D) failed: %s", off, lmk_dtype_name(t), nd,
             lmk_last_error());
    fz_call_keep(fc, b);
    return b;
}

/* A dense [n0, n1, n2] operand at its own place, declared 3-D, 1-D or 2-D. NULL when full. */
static lmk_buffer *dense3(fz_in *in, fz_env *e, fz_call *fc, ap_call *c, lmk_dtype t, size_t n0, size_t n1, size_t n2)
{
    const size_t off = place(in, c, n0 * n1 * n2 * lmk_dtype_size(t));
    if (off == SIZE_MAX)
        return NULL;
    size_t shape[3] = {n0, n1, n2};
    switch (fz_pick(in, 3)) {
    case 1:
        shape[0] = n0 * n1 * n2;
        return view(e, fc, off, t, 1, shape, NULL);
    case 2:
        shape[1] = n1 * n2;
        return view(e, fc, off, t, 2, shape, NULL);
    default:
        return view(e, fc, off, t, 3, shape, NULL);
    }
}

/* A strided [n0, n1, n2] view with strides [s0, s1, 1] at arena byte off. */
static lmk_buffer *strided3(fz_env *e, fz_call *fc, size_t off, lmk_dtype t, size_t n0, size_t n1, size_t n2,
                            size_t s0, size_t s1)
{
    const size_t shape[3] = {n0, n1, n2}, strides[3] = {s0, s1, 1};
    return view(e, fc, off, t, 3, shape, strides);
}

/* Bytes from element [0,0,0] to the end of the last element of a [n0, n1, n2] / [s0, s1, 1] view. */
static size_t span3(size_t n0, size_t n1, size_t n2, size_t s0, size_t s1, size_t es)
{
    return ((n0 - 1) * s0 + (n1 - 1) * s1 + n2) * es;
}

/* The byte offset of b in the arena, or SIZE_MAX when b lives elsewhere (another device). */
static size_t arena_off(const fz_env *e, const lmk_buffer *b)
{
    const uintptr_t p = (uintptr_t)lmk_buffer_data(b), a = (uintptr_t)e->arena;
    return b && p >= a && p < a + FZ_ARENA_BYTES ? (size_t)(p - a) : SIZE_MAX;
}

/* ---- the parameters ---- */

static float pick_base(fz_in *in)
{
    static const float bases[] = {1e4f, 1e6f, 1e7f, 5e5f, 10.0f, 2.0f, 1.0f, 0.5f};
    return bases[fz_pick(in, 8)];
}

static void pick_scaling(fz_in *in, lmk_rope_params *p)
{
    if (fz_pick(in, 3) != 0)
        return;
    static const float fs[] = {0.0f, 0.25f, 0.5f, 1.0f, 2.0f, 1.0f / 32.0f};
    static const float ef[] = {0.0f, 1.0f, 0.5f, -0.25f};
    static const float af[] = {0.0f, 0.7f, 1.5f, 1.0f};
    static const float bf[] = {0.0f, 32.0f, 16.0f}, bs[] = {0.0f, 1.0f, 2.0f};
    static const uint32_t ctx[] = {4096, 8192, 32768, 1};
    p->freq_scale = fs[fz_pick(in, 6)];
    p->ext_factor = ef[fz_pick(in, 4)];
    p->attn_factor = af[fz_pick(in, 4)];
    p->beta_fast = bf[fz_pick(in, 3)];
    p->beta_slow = bs[fz_pick(in, 3)];
    p->n_ctx_orig = p->ext_factor != 0.0f ? ctx[fz_pick(in, 4)] : 0;
}

/* A valid rope and norm of small size (the arena holds every operand). */
static void pick_params(fz_in *in, ap_call *c)
{
    static const uint32_t dims[] = {2, 4, 6, 8, 12, 16, 24, 32, 48, 64};
    static const lmk_rope_mode modes[] = {LMK_ROPE_NORMAL, LMK_ROPE_NEOX, LMK_ROPE_MROPE, LMK_ROPE_IMROPE,
                                          LMK_ROPE_VISION};
    lmk_rope_params *p = &c->rope;
    p->head_dim = dims[fz_pick(in, 10)];
    p->rope_dim = fz_pick(in, 3) == 0 ? p->head_dim : 2 * (1 + fz_pick(in, p->head_dim / 2));
    p->seq_len = 1 + fz_pick(in, p->head_dim > 24 ? 3 : 6);
    p->n_heads = 1 + fz_pick(in, 4);
    p->n_k_heads = 1 + fz_pick(in, 3);
    p->mode = modes[fz_pick(in, 5)];
    if (p->mode == LMK_ROPE_VISION)
        p->rope_dim = p->head_dim;
    for (int i = 0; i < 4; i++) {
        const unsigned k = fz_pick(in, 8);
        p->sections[i] = k == 0 ? UINT32_MAX - fz_pick(in, 3) : k == 1 ? 0 : fz_pick(in, 12);
    }
    p->pairing = p->mode != LMK_ROPE_NORMAL && fz_pick(in, 3) == 0 ? LMK_ROPE_PAIR_HALF_HEAD : LMK_ROPE_PAIR_HALF_ROPE;
    p->freq_base = pick_base(in);
    pick_scaling(in, p);
    static const float eps[] = {1e-6f, 1e-5f, 1e-3f, 1e-12f};
    c->norm.eps = eps[fz_pick(in, 4)];
    c->norm.weight_offset = fz_pick(in, 2) ? 1.0f : 0.0f;
    static const lmk_dtype dts[] = {LMK_F32, LMK_BF16, LMK_F16};
    c->dt = dts[fz_pick(in, 3)];
}

static bool is_multi(lmk_rope_mode m)
{
    return m == LMK_ROPE_MROPE || m == LMK_ROPE_IMROPE || m == LMK_ROPE_VISION;
}

/* ---- the operands of a valid call ---- */

/* An output for input `src`: the same handle, another view of the same elements, or its own. */
static lmk_buffer *output_for(fz_in *in, fz_env *e, fz_call *fc, ap_call *c, lmk_buffer *src, size_t n0, size_t n1,
                              size_t n2)
{
    const unsigned how = fz_pick(in, 3);
    if (how == 0)
        return src;
    if (how == 1 && lmk_buffer_ndim(src) == 3 && lmk_buffer_stride(src, 2) == 1)
        return strided3(e, fc, arena_off(e, src), c->dt, n0, n1, n2,
                        lmk_buffer_stride(src, 0), lmk_buffer_stride(src, 1));
    return dense3(in, e, fc, c, c->dt, n0, n1, n2);
}

/* q, k and v: dense, q in a [q | gate] projection, or all three in a packed QKV buffer. */
static bool build_qkv(fz_in *in, fz_env *e, fz_call *fc, ap_call *c, bool want_v, uint32_t dv)
{
    const size_t T = c->rope.seq_len, hq = c->rope.n_heads, hk = c->rope.n_k_heads, d = c->rope.head_dim;
    const size_t es = lmk_dtype_size(c->dt);
    switch (fz_pick(in, 3)) {
    case 1: { /* [T, hq, 2d] */
        const size_t off = place(in, c, T * hq * 2 * d * es);
        if (off == SIZE_MAX)
            return false;
        c->op[Q_IN] = strided3(e, fc, off, c->dt, T, hq, d, 2 * hq * d, 2 * d);
        c->op[K_IN] = dense3(in, e, fc, c, c->dt, T, hk, d);
        c->op[V_IN] = want_v ? dense3(in, e, fc, c, c->dt, T, hk, dv) : NULL;
        break;
    }
    case 2: { /* [T, (hq + hk) d + hk dv] */
        const size_t row = (hq + hk) * d + (want_v ? hk * dv : 0), off = place(in, c, T * row * es);
        if (off == SIZE_MAX)
            return false;
        c->op[Q_IN] = strided3(e, fc, off, c->dt, T, hq, d, row, d);
        c->op[K_IN] = strided3(e, fc, off + hq * d * es, c->dt, T, hk, d, row, d);
        c->op[V_IN] = want_v ? strided3(e, fc, off + (hq + hk) * d * es, c->dt, T, hk, dv, row, dv) : NULL;
        break;
    }
    default:
        c->op[Q_IN] = dense3(in, e, fc, c, c->dt, T, hq, d);
        c->op[K_IN] = dense3(in, e, fc, c, c->dt, T, hk, d);
        c->op[V_IN] = want_v ? dense3(in, e, fc, c, c->dt, T, hk, dv) : NULL;
        break;
    }
    if (!c->op[Q_IN] || !c->op[K_IN] || (want_v && !c->op[V_IN]))
        return false;
    c->op[Q_OUT] = output_for(in, e, fc, c, c->op[Q_IN], T, hq, d);
    const unsigned k_how = fz_pick(in, 4);
    c->op[K_OUT] = k_how == 0 ? NULL : output_for(in, e, fc, c, c->op[K_IN], T, hk, d);
    return c->op[Q_OUT] != NULL && (k_how == 0 || c->op[K_OUT] != NULL);
}

/* The k and v caches of `rows` rows: dense, paged (4-D blocks of 2), combined, padded. */
static bool build_caches(fz_in *in, fz_env *e, fz_call *fc, ap_call *c, bool want_k, bool want_v, uint32_t dv,
                         size_t rows)
{
    const size_t hk = c->rope.n_k_heads, d = c->rope.head_dim;
    const lmk_dtype cdt = fz_pick(in, 3) == 0 ? LMK_F8E4M3 : c->dt;
    const size_t es = lmk_dtype_size(cdt);
    const unsigned layout = fz_pick(in, 4);
    if (layout == 2 && dv == d && want_k && want_v) { /* [rows, 2, hk, d] */
        const size_t off = place(in, c, rows * 2 * hk * d * es);
        if (off == SIZE_MAX)
            return false;
        c->op[K_CACHE] = strided3(e, fc, off, cdt, rows, hk, d, 2 * hk * d, d);
        c->op[V_CACHE] = strided3(e, fc, off + hk * d * es, cdt, rows, hk, d, 2 * hk * d, d);
        return true;
    }
    for (int kv = 0; kv < 2; kv++) {
        const size_t dim = kv ? dv : d;
        if (!(kv ? want_v : want_k))
            continue;
        lmk_buffer *b = NULL;
        if (layout == 3) { /* padded heads and rows */
            const size_t hs = dim + 1 + fz_pick(in, 4), ts = hk * hs + fz_pick(in, 5);
            const size_t off = place(in, c, span3(rows, hk, dim, ts, hs, es));
            b = off == SIZE_MAX ? NULL : strided3(e, fc, off, cdt, rows, hk, dim, ts, hs);
        } else if (layout == 1 && rows % 2 == 0) { /* [rows / 2, 2, hk, dim] */
            const size_t off = place(in, c, rows * hk * dim * es), shape[4] = {rows / 2, 2, hk, dim};
            b = off == SIZE_MAX ? NULL : view(e, fc, off, cdt, 4, shape, NULL);
        } else {
            b = dense3(in, e, fc, c, cdt, rows, hk, dim);
        }
        if (!b)
            return false;
        c->op[kv ? V_CACHE : K_CACHE] = b;
    }
    return true;
}

static lmk_buffer *flat(fz_in *in, fz_env *e, fz_call *fc, ap_call *c, lmk_dtype t, size_t n)
{
    const size_t off = place(in, c, n * lmk_dtype_size(t));
    return off == SIZE_MAX ? NULL : view(e, fc, off, t, 1, &n, NULL);
}

/* Everything of a valid call. false when the arena is too small for it. */
static bool build_valid(fz_in *in, fz_env *e, fz_call *fc, ap_call *c)
{
    pick_params(in, c);
    c->s = e->stream;
    const lmk_rope_params *p = &c->rope;
    const unsigned kv = fz_pick(in, 6); /* 0: k_out only; 1: k cache, no v; 2: v cache only; else both */
    const bool want_v = kv >= 2, want_kc = kv == 1 || kv >= 3;
    const uint32_t dv = c->dv = fz_pick(in, 4) == 0 ? 2 * (1 + fz_pick(in, 16)) : p->head_dim;
    if (!build_qkv(in, e, fc, c, want_v, dv))
        return false;
    if (!c->op[K_OUT] && !want_kc) /* k must go somewhere */
        c->op[K_OUT] = dense3(in, e, fc, c, c->dt, p->seq_len, p->n_k_heads, p->head_dim);
    if ((want_kc || want_v) && !build_caches(in, e, fc, c, want_kc, want_v, dv, p->seq_len + fz_pick(in, 6)))
        return false;
    if (want_kc || want_v)
        c->op[SLOTS] = flat(in, e, fc, c, fz_pick(in, 2) ? LMK_I64 : LMK_I32, p->seq_len);
    static const lmk_dtype pos_dts[] = {LMK_I32, LMK_U32, LMK_I64};
    c->op[POS] = flat(in, e, fc, c, pos_dts[fz_pick(in, 3)], (is_multi(p->mode) ? 4 : 1) * (size_t)p->seq_len);
    static const lmk_dtype w_dts[] = {LMK_F32, LMK_BF16, LMK_F16};
    if (fz_pick(in, 4) != 0)
        c->op[QW] = flat(in, e, fc, c, w_dts[fz_pick(in, 3)], p->head_dim);
    if (fz_pick(in, 4) != 0)
        c->op[KW] = flat(in, e, fc, c, w_dts[fz_pick(in, 3)], p->head_dim);
    if (fz_pick(in, 4) == 0)
        c->op[FF] = flat(in, e, fc, c, LMK_F32, p->rope_dim / 2 + fz_pick(in, 3));
    static const float scales[] = {0.0f, 0.5f, 2.0f, 1.7f, 0.3f, 1.0f};
    c->k_scale = scales[fz_pick(in, 6)];
    c->v_scale = scales[fz_pick(in, 6)];
    return c->op[POS] && (!(want_kc || want_v) || c->op[SLOTS]) && (p->head_dim == 0 || c->bump <= FZ_ARENA_BYTES);
}

/* ---- breaking rules ---- */

/* Another view of b's first bytes: dtype t, count n (dense, 1-D), or stride 2 when strided. */
static lmk_buffer *review(fz_env *e, fz_call *fc, const lmk_buffer *b, lmk_dtype t, size_t n, bool strided)
{
    const size_t off = arena_off(e, b), es = lmk_dtype_size(t);
    const size_t stride = 2, need = strided ? ((n ? n - 1 : 0) * 2 + 1) * es : n * es;
    if (off == SIZE_MAX || off % es != 0 || need > FZ_ARENA_BYTES - off)
        return NULL;
    return view(e, fc, off, t, 1, &n, strided ? &stride : NULL);
}

/* A copy of operand w on the other device (same dtype and shape; its memory joins the world). */
static lmk_buffer *on_other_device(fz_env *e, fz_call *fc, const lmk_buffer *b)
{
    lmk_buffer *o = NULL;
    const size_t n = lmk_buffer_element_count(b), shape[1] = {n};
    const lmk_dtype t = lmk_buffer_dtype(b);
    FZ_CHECK(lmk_buffer_alloc(e->other, n * lmk_dtype_size(t), t, shape, 1, &o) == LMK_OK, "harness: alloc on other");
    fz_call_keep(fc, o);
    fz_world_add(&fc->world, lmk_buffer_data(o), n * lmk_dtype_size(t));
    return o;
}

static float wild_float(fz_in *in)
{
    static const float v[] = {0.0f, -1.0f, NAN, INFINITY, -INFINITY, -0.0f, 1e-45f, FLT_MAX, 3.0f};
    return v[fz_pick(in, 9)];
}

/* Breaks one rule of lmk.h (or, by chance, none: the oracle decides). */
static void corrupt(fz_in *in, fz_env *e, fz_call *fc, ap_call *c)
{
    static const lmk_dtype any[] = {LMK_F32, LMK_F16, LMK_BF16, LMK_U8, LMK_U16, LMK_U32, LMK_I32, LMK_I64, LMK_F8E4M3};
    lmk_rope_params *p = &c->rope;
    const int w = (int)fz_pick(in, N_OPS);
    lmk_buffer *b = c->op[w];
    switch (fz_pick(in, 16)) {
    case 0: c->s = NULL; break;
    case 1: c->null_io = true; break;
    case 2: if (fz_bool(in)) c->null_rope = true; else c->null_norm = true; break;
    case 3: c->op[w] = NULL; break;
    case 4: { /* a wild dimension */
        uint32_t *dims[] = {&p->head_dim, &p->rope_dim, &p->n_heads, &p->n_k_heads, &p->seq_len};
        *dims[fz_pick(in, 5)] = fz_dim(in);
        break;
    }
    case 5: p->mode = (lmk_rope_mode)(int32_t)fz_u32(in), p->pairing = (lmk_rope_pairing)fz_pick(in, 3); break;
    case 6: {
        float *f[] = {&p->freq_base, &p->freq_scale, &p->ext_factor, &p->attn_factor, &p->beta_fast, &p->beta_slow,
                      &c->norm.eps, &c->norm.weight_offset, &c->k_scale, &c->v_scale};
        *f[fz_pick(in, 10)] = wild_float(in);
        break;
    }
    case 7: p->n_ctx_orig = 0, p->ext_factor = 1.0f; break;
    case 8: /* another dtype */
        if (b)
            c->op[w] = review(e, fc, b, any[fz_pick(in, 9)], lmk_buffer_element_count(b), false);
        break;
    case 9: /* another count */
        if (b)
            c->op[w] = review(e, fc, b, lmk_buffer_dtype(b), lmk_buffer_element_count(b) + fz_pick(in, 3) - 1, false);
        break;
    case 10: /* strided */
        if (b)
            c->op[w] = review(e, fc, b, lmk_buffer_dtype(b), lmk_buffer_element_count(b), true);
        break;
    case 11:
        if (b)
            c->op[w] = on_other_device(e, fc, b);
        break;
    case 12: { /* an output over another operand (or over itself shifted) */
        static const int outs[] = {Q_OUT, K_OUT, K_CACHE, V_CACHE};
        const int o = outs[fz_pick(in, 4)];
        if (arena_off(e, b) != SIZE_MAX && c->op[o]) {
            const size_t es = lmk_dtype_size(lmk_buffer_dtype(c->op[o]));
            size_t off = arena_off(e, b) + es * fz_pick(in, 4);
            off -= off % es;
            const size_t n = lmk_buffer_element_count(c->op[o]);
            if (off <= FZ_ARENA_BYTES && n * es <= FZ_ARENA_BYTES - off)
                c->op[o] = view(e, fc, off, lmk_buffer_dtype(c->op[o]), 1, &n, NULL);
        }
        break;
    }
    case 13: { /* a cache with heads that overlap (head stride < row), or one head too many */
        const int kv = fz_bool(in) ? V_CACHE : K_CACHE;
        lmk_buffer *cb = c->op[kv];
        if (cb && lmk_buffer_ndim(cb) == 3 && arena_off(e, cb) != SIZE_MAX && lmk_buffer_dim(cb, 2) >= 2) {
            const size_t n0 = lmk_buffer_dim(cb, 0), n1 = lmk_buffer_dim(cb, 1), n2 = lmk_buffer_dim(cb, 2);
            const size_t off = arena_off(e, cb);
            c->op[kv] = fz_bool(in) ? strided3(e, fc, off, lmk_buffer_dtype(cb), n0, n1, n2, n1 * n2, n2 / 2 + 1)
                                    : n0 > 1 ? strided3(e, fc, off, lmk_buffer_dtype(cb), n0 - 1, n1 + 1, n2,
                                                        lmk_buffer_stride(cb, 0), n2)
                                             : cb;
        }
        break;
    }
    case 14: c->op[K_OUT] = c->op[K_CACHE] = NULL; break;
    default: c->op[w] = c->op[(w + 1 + fz_pick(in, N_OPS - 1)) % N_OPS]; break; /* an operand in two roles */
    }
}

/* ---- lmk.h's rules: the oracle ---- */

/* lmk.h's operand rule: a 3-D buffer of shape [n0, n1, n2] with last stride 1, or a dense buffer of
 * exactly n0*n1*n2 elements (whatever its declared shape). */
static bool operand3(const lmk_buffer *b, size_t n0, size_t n1, size_t n2, lmk_tensor3 *t)
{
    size_t count;
    if (__builtin_mul_overflow(n0, n1, &count) || __builtin_mul_overflow(count, n2, &count))
        return false;
    *t = (lmk_tensor3){.data = lmk_buffer_data(b), .n = {n0, n1, n2}, .es = lmk_dtype_size(lmk_buffer_dtype(b))};
    if (lmk_buffer_ndim(b) == 3 && lmk_buffer_dim(b, 0) == n0 && lmk_buffer_dim(b, 1) == n1 &&
        lmk_buffer_dim(b, 2) == n2 && (lmk_buffer_stride(b, 2) == 1 || n2 == 1)) {
        t->stride[0] = lmk_buffer_stride(b, 0), t->stride[1] = lmk_buffer_stride(b, 1), t->stride[2] = 1;
        return true;
    }
    if (!lmk_buffer_is_contiguous(b) || lmk_buffer_element_count(b) != count)
        return false;
    t->stride[0] = n1 * n2, t->stride[1] = n2, t->stride[2] = 1;
    return true;
}

/* A cache: [rows, heads, dim] with rows from a 3-D shape, or from a dense buffer's count. */
static bool cache3(const lmk_buffer *b, size_t heads, size_t dim, lmk_tensor3 *t)
{
    if (lmk_buffer_ndim(b) == 3 && lmk_buffer_dim(b, 1) == heads && lmk_buffer_dim(b, 2) == dim)
        return operand3(b, lmk_buffer_dim(b, 0), heads, dim, t);
    const size_t n = lmk_buffer_element_count(b);
    return lmk_buffer_is_contiguous(b) && heads != 0 && dim != 0 && n % (heads * dim) == 0 &&
           operand3(b, n / (heads * dim), heads, dim, t);
}

/* A dense buffer of dtype in {t0, t1, t2} with `n` elements (at least n when at_least). */
static bool flat_ok(const lmk_buffer *b, lmk_dtype t0, lmk_dtype t1, lmk_dtype t2, size_t n, bool at_least)
{
    const lmk_dtype t = lmk_buffer_dtype(b);
    const size_t have = lmk_buffer_element_count(b);
    return lmk_buffer_is_contiguous(b) && (t == t0 || t == t1 || t == t2) && (at_least ? have >= n : have == n);
}

/* lmk_rope's R2-R9 (dimensions, freq_base, mode, pairing, scaling), as lmk.h writes them. */
static bool rope_params_ok(const lmk_rope_params *p)
{
    const lmk_rope_mode m = p->mode;
    if (!p->head_dim || !p->rope_dim || !p->n_heads || !p->seq_len || !p->n_k_heads)
        return false;
    if (p->head_dim % 2 || p->rope_dim % 2 || p->rope_dim > p->head_dim)
        return false;
    if (!isfinite(p->freq_base) || !(p->freq_base > 0.0f))
        return false;
    if (m != LMK_ROPE_NORMAL && m != LMK_ROPE_NEOX && !is_multi(m))
        return false;
    if ((m == LMK_ROPE_VISION && p->rope_dim != p->head_dim) ||
        (p->pairing != LMK_ROPE_PAIR_HALF_ROPE && p->pairing != LMK_ROPE_PAIR_HALF_HEAD) ||
        (m == LMK_ROPE_NORMAL && p->pairing == LMK_ROPE_PAIR_HALF_HEAD))
        return false;
    const float f[] = {p->freq_scale, p->ext_factor, p->attn_factor, p->beta_fast, p->beta_slow};
    for (int i = 0; i < 5; i++)
        if (!isfinite(f[i]) || (i != 1 && f[i] < 0.0f))
            return false;
    return p->ext_factor == 0.0f || p->n_ctx_orig != 0;
}

/* k_scale / v_scale: finite, not negative, and 0 (meaning 1) or in [2^-126, 2^126] (lmk.h). */
static bool scale_ok(float v)
{
    return isfinite(v) && v >= 0.0f && (v == 0.0f || (v >= 0x1p-126f && v <= 0x1p126f));
}

/* The operands' rules, in lmk.h's order after the NULL checks; t gets every operand resolved. */
static bool operands_ok(const ap_call *c, lmk_tensor3 *t, uint32_t *dv)
{
    const lmk_rope_params *p = &c->rope;
    const size_t T = p->seq_len, hq = p->n_heads, hk = p->n_k_heads, d = p->head_dim;
    lmk_buffer *const *o = c->op;
    if (!operand3(o[Q_IN], T, hq, d, &t[Q_IN]) || !operand3(o[Q_OUT], T, hq, d, &t[Q_OUT]) ||
        !operand3(o[K_IN], T, hk, d, &t[K_IN]) || (o[K_OUT] && !operand3(o[K_OUT], T, hk, d, &t[K_OUT])))
        return false;
    const lmk_dtype dt = lmk_buffer_dtype(o[Q_IN]);
    if (lmk_buffer_dtype(o[Q_OUT]) != dt || lmk_buffer_dtype(o[K_IN]) != dt ||
        (o[K_OUT] && lmk_buffer_dtype(o[K_OUT]) != dt) || !fz_is_float(dt))
        return false;
    if (!flat_ok(o[POS], LMK_I32, LMK_U32, LMK_I64, (is_multi(p->mode) ? 4 : 1) * T, false) ||
        (o[FF] && !flat_ok(o[FF], LMK_F32, LMK_F32, LMK_F32, p->rope_dim / 2, true)))
        return false;
    if (!isfinite(c->norm.eps) || !(c->norm.eps > 0.0f) || !isfinite(c->norm.weight_offset))
        return false;
    if ((!o[K_OUT] && !o[K_CACHE]) || ((o[K_CACHE] || o[V_CACHE]) && !o[SLOTS]) || !o[V_IN] != !o[V_CACHE])
        return false;
    if ((o[QW] && !flat_ok(o[QW], LMK_F32, LMK_BF16, LMK_F16, d, false)) ||
        (o[KW] && !flat_ok(o[KW], LMK_F32, LMK_BF16, LMK_F16, d, false)) ||
        (o[SLOTS] && !flat_ok(o[SLOTS], LMK_I32, LMK_I64, LMK_I64, T, false)))
        return false;
    if (!scale_ok(c->k_scale) || !scale_ok(c->v_scale))
        return false;
    for (int w = K_CACHE; w <= V_CACHE; w++)
        if (o[w] && lmk_buffer_dtype(o[w]) != dt && lmk_buffer_dtype(o[w]) != LMK_F8E4M3)
            return false;
    if (o[K_CACHE] && !cache3(o[K_CACHE], hk, d, &t[K_CACHE]))
        return false;
    if (o[V_IN]) { /* Dv: v_in's last axis when 3-D [T, hk, Dv], else its count / (T * hk) */
        const lmk_buffer *v = o[V_IN];
        const bool shaped = lmk_buffer_ndim(v) == 3 && lmk_buffer_dim(v, 0) == T && lmk_buffer_dim(v, 1) == hk;
        if (!shaped && (!lmk_buffer_is_contiguous(v) || lmk_buffer_element_count(v) % (T * hk) != 0))
            return false;
        const size_t n = shaped ? lmk_buffer_dim(v, 2) : lmk_buffer_element_count(v) / (T * hk);
        *dv = (uint32_t)n;
        if (n == 0 || n > UINT32_MAX || lmk_buffer_dtype(v) != dt || !operand3(v, T, hk, n, &t[V_IN]) ||
            !cache3(o[V_CACHE], hk, n, &t[V_CACHE]))
            return false;
    }
    for (int w = 0; w < N_OPS; w++)
        if (o[w] && lmk_buffer_device(o[w]) != lmk_stream_device(c->s))
            return false;
    return true;
}

/* Marks: for every arena byte, the operands whose elements hold it (bit per operand). */
static uint16_t g_marks[FZ_ARENA_BYTES];

static size_t t3_span(const lmk_tensor3 *t)
{
    if (!t->n[0] || !t->n[1] || !t->n[2])
        return 0;
    return ((t->n[0] - 1) * t->stride[0] + (t->n[1] - 1) * t->stride[1] + t->n[2]) * t->es;
}

/* Marks t's element bytes with bit w; returns whether two of its elements share a byte. */
static bool mark(const fz_env *e, const lmk_tensor3 *t, int w)
{
    bool self = false;
    const size_t base = (size_t)((uintptr_t)t->data - (uintptr_t)e->arena), row = t->n[2] * t->es;
    for (size_t a = 0; a < t->n[0]; a++)
        for (size_t h = 0; h < t->n[1]; h++) {
            const size_t lo = base + (a * t->stride[0] + h * t->stride[1]) * t->es;
            for (size_t i = 0; i < row; i++) {
                self |= (g_marks[lo + i] >> w & 1u) != 0;
                g_marks[lo + i] |= (uint16_t)(1u << w);
            }
        }
    return self;
}

/* Whether the layout is nested (each stride, sorted, steps past everything inside it): the layouts
 * whose distinct elements lmk can prove distinct. */
static bool nested(const lmk_tensor3 *t)
{
    size_t n[3], s[3], k = 0, reach = 1;
    for (int i = 0; i < 3; i++)
        if (t->n[i] > 1)
            n[k] = t->n[i], s[k] = t->stride[i], k++;
    for (size_t i = 1; i < k; i++)
        for (size_t j = i; j > 0 && s[j] < s[j - 1]; j--) {
            size_t x = s[j]; s[j] = s[j - 1]; s[j - 1] = x;
            x = n[j]; n[j] = n[j - 1]; n[j - 1] = x;
        }
    for (size_t i = 0; i < k; i++) {
        if (s[i] < reach)
            return false;
        reach += (n[i] - 1) * s[i];
    }
    return true;
}

/* Tensors side by side in one row (packed QKV, q|gate, a combined KV cache): token-major with one
 * token stride, each token's elements inside it. lmk.h's overlap rule is exact for them: disjoint
 * elements must be accepted however their extents interleave. */
static bool side_by_side(const lmk_tensor3 *a, const lmk_tensor3 *b)
{
    const size_t ta = a->n[0] > 1 ? a->stride[0] * a->es : 0, tb = b->n[0] > 1 ? b->stride[0] * b->es : 0;
    const size_t period = ta ? ta : tb;
    if (!period || (ta && tb && ta != tb))
        return false;
    const size_t fa = ((a->n[1] - 1) * a->stride[1] + a->n[2]) * a->es;
    const size_t fb = ((b->n[1] - 1) * b->stride[1] + b->n[2]) * b->es;
    return fa <= period && fb <= period && a->stride[1] * a->es >= a->n[2] * a->es &&
           b->stride[1] * b->es >= b->n[2] * b->es;
}

/* lmk.h's overlap rule on the element bytes: an output shares no byte with another operand, except
 * that q_out / k_out may be exactly their input; its own elements are distinct. Where elements are
 * disjoint but extents meet (or a layout is not nested), lmk may reject: MAY_REJECT. */
static int overlaps(const fz_env *e, const ap_call *c, lmk_tensor3 *t)
{
    memset(g_marks, 0, sizeof g_marks);
    static const int outs[4] = {Q_OUT, K_OUT, K_CACHE, V_CACHE}, own[4] = {Q_IN, K_IN, -1, -1};
    for (int w = 0; w < N_OPS; w++)
        if (c->op[w] && (w == QW || w == KW || w == POS || w == FF || w == SLOTS))
            t[w] = (lmk_tensor3){.data = lmk_buffer_data(c->op[w]), .n = {1, 1, lmk_buffer_element_count(c->op[w])},
                                 .stride = {0, 0, 1}, .es = lmk_dtype_size(lmk_buffer_dtype(c->op[w]))};
    bool self[N_OPS] = {false};
    for (int w = 0; w < N_OPS; w++)
        if (c->op[w])
            self[w] = mark(e, &t[w], w);
    int verdict = VALID;
    for (int k = 0; k < 4; k++) {
        const int o = outs[k];
        if (!c->op[o] || !t3_span(&t[o]))
            continue;
        if (self[o])
            return INVALID;
        if (!nested(&t[o]))
            verdict = MAY_REJECT;
        const uintptr_t lo = (uintptr_t)t[o].data, hi = lo + t3_span(&t[o]);
        for (int w = 0; w < N_OPS; w++) {
            if (w == o || !c->op[w] || (w == own[k] && fz_same3(&t[o], &t[w])))
                continue;
            const uintptr_t wlo = (uintptr_t)t[w].data, whi = wlo + t3_span(&t[w]);
            bool shared = false;
            for (uintptr_t b = lo > wlo ? lo : wlo; b < (hi < whi ? hi : whi) && !shared; b++)
                shared = (g_marks[b - (uintptr_t)e->arena] >> o & 1u) && (g_marks[b - (uintptr_t)e->arena] >> w & 1u);
            if (shared)
                return INVALID;
            if (lo < whi && wlo < hi && !side_by_side(&t[o], &t[w]))
                verdict = MAY_REJECT;
        }
    }
    return verdict;
}

/* The oracle: VALID, INVALID or MAY_REJECT; t gets the resolved operands of a call that is not
 * INVALID, dv the head size of v. */
static int oracle(const fz_env *e, const ap_call *c, lmk_tensor3 *t, uint32_t *dv)
{
    if (!c->s || c->null_io || c->null_rope || c->null_norm || !c->op[Q_IN] || !c->op[K_IN] || !c->op[POS] ||
        !c->op[Q_OUT])
        return INVALID;
    if (!rope_params_ok(&c->rope) || !operands_ok(c, t, dv))
        return INVALID;
    return overlaps(e, c, t);
}

/* ---- values ---- */

typedef struct fill_ctx {
    uint64_t *r;
    unsigned cls;
    double lo, hi;
} fill_ctx;

/* Class 0-4: uniform in [lo, hi]; 5: specials among them; 6: raw bits; 7: large. */
static void fill_one(unsigned char *p, lmk_dtype t, void *vctx)
{
    fill_ctx *x = vctx;
    static const float specials[] = {NAN, INFINITY, -INFINITY, -0.0f, 1e-40f, 3e38f, 65504.0f, 1e5f};
    const uint64_t bits = fz_rand(x->r);
    if (x->cls == 6)
        memcpy(p, &bits, lmk_dtype_size(t) < 8 ? lmk_dtype_size(t) : 8);
    else if (x->cls == 5 && (bits & 15) == 0)
        fz_put_float(p, t, specials[(bits >> 4) % 8]);
    else
        fz_put_float(p, t, x->cls == 7 ? fz_uniform(x->r, -1e4, 1e4) : fz_uniform(x->r, x->lo, x->hi));
}

static void fill_values(fz_in *in, lmk_buffer *b, uint64_t *r, double lo, double hi)
{
    if (!b || !fz_is_float(lmk_buffer_dtype(b)))
        return;
    fill_ctx x = {r, fz_pick(in, 8), lo, hi};
    if (x.cls < 5 || fz_pick(in, 2))
        x.cls = 0;
    fz_for_each(b, fill_one, &x);
}

/* Positions: text (start + i), random up to 5000, extremes, or raw. */
static void fill_positions(fz_in *in, lmk_buffer *b, uint32_t T, uint64_t *r)
{
    if (!b || !lmk_buffer_is_contiguous(b))
        return;
    const lmk_dtype t = lmk_buffer_dtype(b);
    const unsigned cls = fz_pick(in, 6);
    const int64_t start = fz_pick(in, 200) * (fz_pick(in, 2) ? 1 : 300);
    static const int64_t ext[] = {INT32_MIN, INT32_MAX, -1, 1 << 20, (int64_t)1 << 40, INT64_MIN};
    for (size_t i = 0; i < lmk_buffer_element_count(b); i++) {
        const uint64_t x = fz_rand(r);
        const int64_t v = cls == 4 ? ext[x % 6] : cls == 5 ? (int64_t)x : cls == 3 ? (int64_t)(x % 5000)
                                                                          : start + (int64_t)(T ? i % T : i);
        if (t == LMK_I64)
            memcpy((char *)lmk_buffer_data(b) + 8 * i, &v, 8);
        else if (lmk_dtype_size(t) == 4) {
            const int32_t w = (int32_t)v;
            memcpy((char *)lmk_buffer_data(b) + 4 * i, &w, 4);
        }
    }
}

/* The rows of a cache buffer as the harness laid it out (0 when absent or unknown). */
static size_t rows_of(const lmk_buffer *b, size_t heads, size_t dim)
{
    if (!b || !heads || !dim)
        return 0;
    if (lmk_buffer_ndim(b) == 3)
        return lmk_buffer_dim(b, 0);
    if (lmk_buffer_ndim(b) == 4)
        return lmk_buffer_dim(b, 0) * lmk_buffer_dim(b, 1);
    return lmk_buffer_element_count(b) / (heads * dim);
}

/* Slots: distinct rows of [0, rows), and about one in four a padding value (for i64, some whose
 * low 32 bits name a valid row). No two tokens ever name one row, even where `rows` is off (a
 * corrupted cache): rows and rows + 3 pad at most once each, the other pads are never rows. */
static void fill_slots(lmk_buffer *b, size_t rows, uint64_t *r)
{
    if (!b || !lmk_buffer_is_contiguous(b))
        return;
    const lmk_dtype t = lmk_buffer_dtype(b);
    const size_t n = lmk_buffer_element_count(b);
    const int64_t pads[] = {-1, INT32_MIN, INT32_MAX, (int64_t)rows, (int64_t)rows + 3, ((int64_t)1 << 32) + 1,
                            INT64_MIN, INT64_MAX};
    bool used[8] = {false};
    size_t next = rows ? fz_rand(r) % rows : 0, valid = 0;
    for (size_t i = 0; i < n; i++) {
        const uint64_t x = fz_rand(r);
        const unsigned k = (unsigned)((x >> 2) % (t == LMK_I64 ? 8 : 5));
        int64_t v = -1;
        if ((x & 3) != 0 && valid < rows)
            v = (int64_t)(next++ % rows), valid++;
        else if (k < 3 || k > 4 || !used[k])
            v = pads[k], used[k] = true;
        if (t == LMK_I64)
            memcpy((char *)lmk_buffer_data(b) + 8 * i, &v, 8);
        else if (lmk_dtype_size(t) == 4) {
            const int32_t w = (int32_t)v;
            memcpy((char *)lmk_buffer_data(b) + 4 * i, &w, 4);
        }
    }
}

/* Every value of the call. Operands may share bytes: later fills win, and the snapshot taken after
 * is what the call starts from. */
static void fill_all(fz_in *in, fz_env *e, ap_call *c, uint64_t *r)
{
    for (size_t i = 0; i < FZ_ARENA_BYTES; i += 8) {
        const uint64_t x = fz_rand(r);
        memcpy(e->arena + i, &x, 8);
    }
    fill_values(in, c->op[Q_IN], r, -2.0, 2.0);
    fill_values(in, c->op[K_IN], r, -2.0, 2.0);
    fill_values(in, c->op[V_IN], r, -2.0, 2.0);
    fill_values(in, c->op[QW], r, -0.5, 1.5);
    fill_values(in, c->op[KW], r, -0.5, 1.5);
    if (c->op[FF] && lmk_buffer_dtype(c->op[FF]) == LMK_F32)
        for (size_t i = 0; i < lmk_buffer_element_count(c->op[FF]); i++)
            fz_put_float((unsigned char *)lmk_buffer_data(c->op[FF]) + 4 * i, LMK_F32,
                         fz_pick(in, 16) == 15 ? (double)wild_float(in) : fz_uniform(r, 0.5, 8.0));
    fill_positions(in, c->op[POS], c->rope.seq_len, r);
    const size_t hk = c->rope.n_k_heads, d = c->rope.head_dim;
    const size_t rk = rows_of(c->op[K_CACHE], hk, d), rv = rows_of(c->op[V_CACHE], hk, c->dv);
    fill_slots(c->op[SLOTS], rk > rv ? rk : rv, r);
}

/* ---- checking a valid call ---- */

/* Whether the call's inputs lie where lmk.h promises precision: |x| <= 2 and finite (q, k, the
 * weights and weight_offset: a finite offset near FLT_MAX is valid, but its f32 products overflow
 * where float64 does not), small positions (|pos| <= 2^14) and tame angle factors (base >= 0.5,
 * freq_factors >= 0.25, freq_scale <= 4, |ext_factor| <= 1), so every |angle| is at most 2^20. */
static bool precise_domain(const ap_call *c, const lmk_tensor3 *t)
{
    const lmk_rope_params *p = &c->rope;
    const int ws[4] = {Q_IN, K_IN, QW, KW};
    for (int k = 0; k < 4; k++) {
        const int w = ws[k];
        for (size_t a = 0; c->op[w] && a < t[w].n[0]; a++)
            for (size_t h = 0; h < t[w].n[1]; h++)
                for (size_t i = 0; i < t[w].n[2]; i++) {
                    const double x = lmk_float_load(lmk_buffer_dtype(c->op[w]), t[w].data,
                                                    a * t[w].stride[0] + h * t[w].stride[1] + i);
                    if (!(fabs(x) <= 2.0))
                        return false;
                }
    }
    const unsigned char *pos = lmk_buffer_data(c->op[POS]);
    for (size_t i = 0; i < lmk_buffer_element_count(c->op[POS]); i++) {
        int64_t v;
        int32_t v32;
        if (lmk_buffer_dtype(c->op[POS]) == LMK_I64)
            memcpy(&v, pos + 8 * i, 8);
        else
            memcpy(&v32, pos + 4 * i, 4), v = v32; /* u32 is read as i32 (lmk.h) */
        if (v > 16384 || v < -16384)
            return false;
    }
    for (size_t i = 0; c->op[FF] && i < p->rope_dim / 2; i++) {
        const float f = ((const float *)lmk_buffer_data(c->op[FF]))[i];
        if (!(f >= 0.25f && f <= 16.0f))
            return false;
    }
    return p->freq_base >= 0.5f && p->freq_scale <= 4.0f && fabsf(p->ext_factor) <= 1.0f && p->attn_factor <= 4.0f &&
           fabsf(c->norm.weight_offset) <= 2.0f;
}

typedef struct chk {
    const fz_world *world;
    bool precise;
    size_t n_checked, n_bad;
    char first[320];
} chk;

static uint8_t g_may[FZ_ARENA_BYTES]; /* bytes a valid call may change */

static bool close_enough(lmk_dtype t, double got, double want)
{
    if (isnan(want))
        return isnan(got);
    if (!isfinite(got))
        return false;
    if (t == LMK_F32)
        return fabs(got - want) <= 1e-5 * fmax(1.0, fabs(want));
    if (t == LMK_F8E4M3) {
        const double w = fmin(448.0, fmax(-448.0, want));
        return fabs(got - w) <= lmk_ulp(LMK_F8E4M3, w);
    }
    return fabs(got - want) <= lmk_ulp(t, want) + 1e-6;
}

/* Element (r, h, i) of output tensor t (dtype dt) must be `bits` exactly, or (precise calls) within
 * lmk.h's precision of want. Its bytes join the ones the call may change. */
static void expect(chk *x, const fz_env *e, const char *what, const lmk_tensor3 *t, lmk_dtype dt, size_t r, size_t h,
                   size_t i, double want, const unsigned char *bits)
{
    const unsigned char *g = t->data + (r * t->stride[0] + h * t->stride[1] + i) * t->es;
    memset(g_may + ((uintptr_t)g - (uintptr_t)e->arena), 1, t->es);
    if (!bits && !x->precise)
        return;
    const double got = dt == LMK_F8E4M3 ? lmk_f8e4m3_to_f32(*g) : lmk_float_load(dt, g, 0);
    const bool ok = bits ? memcmp(g, bits, t->es) == 0 : close_enough(dt, got, want);
    x->n_checked++;
    if (!ok && x->n_bad++ == 0)
        snprintf(x->first, sizeof x->first, "%s[%zu, %zu, %zu] (%s) is %.9g, want %s %.9g", what, r, h, i,
                 lmk_dtype_name(dt), got, bits ? "the bits of" : "within the contract of",
                 bits ? (dt == LMK_F8E4M3 ? lmk_f8e4m3_to_f32(*bits) : lmk_float_load(dt, bits, 0)) : want);
}

static bool rotated(const lmk_rope_params *p, size_t i)
{
    const size_t half = p->rope_dim / 2;
    const size_t stride = p->mode == LMK_ROPE_VISION || p->pairing == LMK_ROPE_PAIR_HALF_HEAD ? p->head_dim / 2 : half;
    return p->mode == LMK_ROPE_NORMAL ? i < p->rope_dim : i < half || (i >= stride && i < stride + half);
}

static long long slot_at(const fz_world *w, const ap_call *c, size_t token)
{
    const unsigned char *p = fz_world_before((fz_world *)w, (const char *)lmk_buffer_data(c->op[SLOTS]) +
                                                                token * lmk_dtype_size(lmk_buffer_dtype(c->op[SLOTS])));
    if (lmk_buffer_dtype(c->op[SLOTS]) == LMK_I64) {
        int64_t v;
        memcpy(&v, p, 8);
        return v;
    }
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* One head row of q or k (row64: the reference) into output `o` at row r: copies (no norm, outside
 * the pairs) are the input's bits, or for an f8 output exactly lmk_f32_to_f8e4m3(x * inv). */
static void expect_qk_row(chk *x, const fz_env *e, const ap_call *c, const lmk_tensor3 *t, int o, int in, size_t r,
                          size_t token, size_t h, const double *row64, float inv)
{
    const lmk_dtype dt = lmk_buffer_dtype(c->op[o]);
    const bool norm = c->op[in == Q_IN ? QW : KW] != NULL;
    for (size_t i = 0; i < c->rope.head_dim; i++) {
        const unsigned char *src = fz_world_before((fz_world *)x->world, t[in].data + (token * t[in].stride[0] +
                                                                         h * t[in].stride[1] + i) * t[in].es);
        uint8_t code = 0;
        const unsigned char *bits = NULL;
        if (!norm && !rotated(&c->rope, i)) {
            code = lmk_f32_to_f8e4m3((float)lmk_float_load(c->dt, src, 0) * inv);
            bits = dt == LMK_F8E4M3 ? &code : src;
        }
        expect(x, e, k_names[o], &t[o], dt, r, h, i, row64[i] * (dt == LMK_F8E4M3 ? inv : 1.0f), bits);
    }
}

/* v of one token into its cache row: the bits, or exactly lmk_f32_to_f8e4m3(v * inv). */
static void expect_v_row(chk *x, const fz_env *e, const ap_call *c, const lmk_tensor3 *t, size_t r, size_t token,
                         uint32_t dv, float inv)
{
    const lmk_dtype cdt = lmk_buffer_dtype(c->op[V_CACHE]);
    for (size_t h = 0; h < c->rope.n_k_heads; h++)
        for (size_t i = 0; i < dv; i++) {
            const size_t at = token * t[V_IN].stride[0] + h * t[V_IN].stride[1] + i;
            const unsigned char *src = fz_world_before((fz_world *)x->world, t[V_IN].data + at * t[V_IN].es);
            const uint8_t code = lmk_f32_to_f8e4m3((float)lmk_float_load(c->dt, src, 0) * inv);
            expect(x, e, "v_cache", &t[V_CACHE], cdt, r, h, i, 0.0, cdt == LMK_F8E4M3 ? &code : src);
        }
}

/* Every output element of a valid call, then every other byte unchanged. q64/k64: the reference
 * rows of every token, computed before the call. */
static void check_outputs(const fz_env *e, fz_world *w, const ap_call *c, const lmk_tensor3 *t, uint32_t dv,
                          const double *q64, const double *k64, bool precise)
{
    const lmk_rope_params *p = &c->rope;
    const size_t d = p->head_dim, hq = p->n_heads, hk = p->n_k_heads;
    /* lmk.h's f8 factors: 1.0f / scale (0 means 1), to nearest (the oracle runs in the default mode) */
    const float ks = 1.0f / (c->k_scale == 0.0f ? 1.0f : c->k_scale), vs = 1.0f / (c->v_scale == 0.0f ? 1.0f : c->v_scale);
    chk x = {.world = w, .precise = precise};
    memset(g_may, 0, sizeof g_may);
    for (size_t tok = 0; tok < p->seq_len; tok++) {
        for (size_t h = 0; h < hq; h++)
            expect_qk_row(&x, e, c, t, Q_OUT, Q_IN, tok, tok, h, q64 + (tok * hq + h) * d, 1.0f);
        for (size_t h = 0; c->op[K_OUT] && h < hk; h++)
            expect_qk_row(&x, e, c, t, K_OUT, K_IN, tok, tok, h, k64 + (tok * hk + h) * d, 1.0f);
        const long long slot = c->op[SLOTS] ? slot_at(w, c, tok) : -1;
        if (c->op[K_CACHE] && slot >= 0 && (unsigned long long)slot < t[K_CACHE].n[0])
            for (size_t h = 0; h < hk; h++)
                expect_qk_row(&x, e, c, t, K_CACHE, K_IN, (size_t)slot, tok, h, k64 + (tok * hk + h) * d, ks);
        if (c->op[V_CACHE] && slot >= 0 && (unsigned long long)slot < t[V_CACHE].n[0])
            expect_v_row(&x, e, c, t, (size_t)slot, tok, dv, vs);
    }
    FZ_CHECK(x.n_bad == 0, "attn_prologue(%s hd=%u rd=%u nh=%u nk=%u T=%u mode %d pairing %d base %g fs %g ef %g af %g "
             "%s): %zu of %zu elements wrong; first: %s", lmk_dtype_name(c->dt), p->head_dim, p->rope_dim, p->n_heads,
             p->n_k_heads, p->seq_len, (int)p->mode, (int)p->pairing, (double)p->freq_base, (double)p->freq_scale,
             (double)p->ext_factor, (double)p->attn_factor, precise ? "precise" : "not precise", x.n_bad, x.n_checked,
             x.first);
    for (int i = 0; i < w->n; i++) {
        const fz_region *r = &w->r[i];
        const bool arena = r->base == e->arena;
        for (size_t b = 0; b < r->len; b++)
            FZ_CHECK(r->base[b] == r->snap[b] || (arena && g_may[b]), "attn_prologue wrote byte %zu of %s, which "
                     "holds no output element (0x%02x, was 0x%02x)", b, arena ? "the arena" : "another region",
                     r->base[b], r->snap[b]);
    }
}

/* prepare's resolution agrees with the oracle's (pointers, strides, rows, Dv). */
static void check_args(const ap_call *c, const lmk_tensor3 *t, uint32_t dv, const lmk_attn_prologue_args *a)
{
    const struct {
        int w;
        const void *p;
        size_t tok, head;
    } r[] = {{Q_IN, a->rope.t[0].in, a->rope.t[0].in_tok, a->rope.t[0].in_head},
             {Q_OUT, a->rope.t[0].out, a->rope.t[0].out_tok, a->rope.t[0].out_head},
             {K_IN, a->rope.t[1].in, a->rope.t[1].in_tok, a->rope.t[1].in_head},
             {K_OUT, a->rope.t[1].out, a->rope.t[1].out_tok, a->rope.t[1].out_head},
             {V_IN, a->v_in.data, a->v_in.tok, a->v_in.head},
             {K_CACHE, a->k_cache.data, a->k_cache.tok, a->k_cache.head},
             {V_CACHE, a->v_cache.data, a->v_cache.tok, a->v_cache.head}};
    for (int i = 0; i < 7; i++) {
        const lmk_tensor3 *x = &t[r[i].w];
        const bool present = c->op[r[i].w] != NULL;
        FZ_CHECK(r[i].p == (present ? (const void *)x->data : NULL) &&
                     (!present || ((x->n[0] <= 1 || x->stride[0] == r[i].tok) &&
                                   (x->n[1] <= 1 || x->stride[1] == r[i].head))),
                 "prepare resolved %s as %p [%zu, %zu]; lmk.h's operand rule gives %p [%zu, %zu]", k_names[r[i].w],
                 r[i].p, r[i].tok, r[i].head, present ? (const void *)x->data : NULL, x->stride[0], x->stride[1]);
    }
    const size_t rk = c->op[K_CACHE] ? t[K_CACHE].n[0] : 0, rv = c->op[V_CACHE] ? t[V_CACHE].n[0] : 0;
    FZ_CHECK(a->k_slots == rk && a->v_slots == rv && (!c->op[V_IN] || a->v_dim == dv),
             "prepare resolved k rows %llu, v rows %llu, Dv %u; lmk.h gives %zu, %zu, %u", (unsigned long long)a->k_slots,
             (unsigned long long)a->v_slots, a->v_dim, rk, rv, dv);
}

/* A rejected call: INVALID_ARGUMENT naming the op, and nothing changed. */
static void check_rejected(fz_world *w, const ap_call *c, lmk_status st, int verdict)
{
    fz_stat(verdict == INVALID ? "invalid calls" : "calls lmk may reject, rejected");
    FZ_CHECK(st == LMK_ERR_INVALID_ARGUMENT, "%s attn_prologue (hd %u rd %u nh %u nk %u T %u mode %d) returned %s",
             verdict == INVALID ? "an invalid" : "a rejected", c->rope.head_dim, c->rope.rope_dim, c->rope.n_heads,
             c->rope.n_k_heads, c->rope.seq_len, (int)c->rope.mode, lmk_status_name(st));
    FZ_CHECK(fz_message_names("attn_prologue"), "message \"%s\" does not name attn_prologue", lmk_last_error());
    FZ_CHECK(fz_world_changed(w, NULL, NULL, 0) == NULL, "a rejected attn_prologue changed a byte");
}

/* A second run from the snapshot must give the same bytes everywhere. */
static void check_rerun(fz_env *e, fz_world *w, const ap_call *c)
{
    unsigned char *first = malloc(FZ_ARENA_BYTES);
    FZ_CHECK(first != NULL, "harness: out of memory");
    memcpy(first, e->arena, FZ_ARENA_BYTES);
    fz_world_restore(w);
    FZ_CHECK(call_op(c) == LMK_OK && lmk_stream_sync(c->s) == LMK_OK, "the second run of a valid call failed");
    FZ_CHECK(memcmp(first, e->arena, FZ_ARENA_BYTES) == 0, "attn_prologue is not deterministic");
    free(first);
    fz_stat("valid calls run twice");
}

/* The bytes a call is read from: the input, then (an input is rarely long enough for the dozens
 * of choices of one call, and reads past the end would all give 0, the same poor call) bytes drawn
 * from a generator seeded with a hash of the input. Every input is still one deterministic call. */
#define AP_BYTES 512

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t buf[AP_BYTES];
    fz_in in = fz_extend(data, size, buf, AP_BYTES);
    fz_env *e = fz_env_get();
    const long live_before = atomic_load(&fz_n_live);
    fz_call fc;
    memset(&fc, 0, sizeof fc);
    uint64_t r = fz_u32(&in);
    const bool sane = fz_pick(&in, 2) == 0;
    ap_call c;
    memset(&c, 0, sizeof c);
    fz_stat("inputs");
    if (!build_valid(&in, e, &fc, &c)) {
        fz_call_end(&fc, live_before);
        return 0;
    }
    for (unsigned k = sane ? 0 : 1 + fz_pick(&in, 3); k > 0; k--)
        corrupt(&in, e, &fc, &c);
    fz_world_add(&fc.world, e->arena, FZ_ARENA_BYTES);
    fill_all(&in, e, &c, &r);
    fz_world_snapshot(&fc.world);
    lmk_tensor3 t[N_OPS];
    memset(t, 0, sizeof t);
    uint32_t dv = 0;
    int verdict = oracle(e, &c, t, &dv);

    /* The reference rows, from the inputs as the call will see them. */
    lmk_attn_prologue_args a;
    double *q64 = NULL, *k64 = NULL;
    if (verdict != INVALID) {
        const lmk_attn_prologue_io io = io_of(&c);
        const lmk_status pst = lmk_attn_prologue_prepare(e->dev, &io, &c.rope, &c.norm, &a);
        FZ_CHECK(pst == LMK_OK || verdict == MAY_REJECT, "lmk.h makes this call valid; prepare says \"%s\"",
                 lmk_last_error());
        if (pst != LMK_OK)
            verdict = INVALID;
    }
    const bool precise = verdict != INVALID && precise_domain(&c, t);
    if (verdict != INVALID) {
        check_args(&c, t, dv, &a);
        const size_t T = c.rope.seq_len, d = c.rope.head_dim;
        q64 = malloc(T * c.rope.n_heads * d * sizeof *q64);
        k64 = malloc(T * c.rope.n_k_heads * d * sizeof *k64);
        FZ_CHECK(q64 && k64, "harness: out of memory");
        for (size_t tok = 0; tok < T; tok++)
            lmk_ref_attn_prologue_token(&a, tok, q64 + tok * c.rope.n_heads * d, k64 + tok * c.rope.n_k_heads * d);
    }

    lmk_clear_error();
    const long allocs_before = atomic_load(&fz_n_allocs);
    const lmk_status st = call_op(&c);
    if (st == LMK_OK)
        FZ_CHECK(lmk_stream_sync(c.s) == LMK_OK, "lmk_stream_sync after a valid attn_prologue");
    FZ_CHECK(atomic_load(&fz_n_allocs) == allocs_before, "attn_prologue allocated %ld times",
             atomic_load(&fz_n_allocs) - allocs_before);
    FZ_CHECK(st == LMK_OK || verdict != VALID, "a valid attn_prologue (hd %u rd %u nh %u nk %u T %u mode %d) returned "
             "%s", c.rope.head_dim, c.rope.rope_dim, c.rope.n_heads, c.rope.n_k_heads, c.rope.seq_len, (int)c.rope.mode,
             lmk_status_name(st));
    if (verdict == INVALID || st != LMK_OK) {
        check_rejected(&fc.world, &c, st, verdict);
    } else {
        fz_stat(verdict == VALID ? "valid calls" : "calls lmk may reject, accepted");
        if (precise)
            fz_stat("valid calls checked against the precision contract");
        check_outputs(e, &fc.world, &c, t, dv, q64, k64, precise);
        if (!precise || fz_pick(&in, 4) == 0)
            check_rerun(e, &fc.world, &c);
    }
    free(q64);
    free(k64);
    fz_call_end(&fc, live_before);
    return 0;
}
