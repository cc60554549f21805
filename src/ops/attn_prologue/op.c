/*
 * op.c - validation and dispatch of lmk_attn_prologue: per-head RMSNorm and rope of q and k, k to
 * k_out and/or the KV cache through slots, v to its cache, in one pass (lmk.h, "attn_prologue").
 *
 * The rope rules are lmk_rope's own functions (rope.h), so the prologue accepts exactly the
 * rotations lmk_rope accepts; the rest follows lmk.h's order. The caches' row counts and v's head
 * size come from the operands' shapes. A rejected call never touches a buffer.
 */
#include "core/internal.h"
#include "ops/attn_prologue/attn_prologue.h"

#include <math.h>
#include <string.h>

static const char k_op[] = "attn_prologue";

/* Operands in the order of the overlap check. */
enum { Q_IN, K_IN, V_IN, QW, KW, POS, FF, SLOTS, Q_OUT, K_OUT, K_CACHE, V_CACHE, N_OPS };
static const char *const k_names[N_OPS] = {"q_in", "k_in", "v_in", "q_norm_w", "k_norm_w", "positions",
                                           "freq_factors", "slots", "q_out", "k_out", "k_cache", "v_cache"};

/* The rows of a [rows, heads, dim] operand whose heads and dim are known: a 3-D buffer of shape
 * [rows, heads, dim] with last stride 1, or a dense buffer whose element count is a multiple of
 * heads * dim. */
static lmk_status resolve_rows(const char *name, const lmk_buffer *b, size_t heads, size_t dim, lmk_tensor3 *t)
{
    size_t rows;
    if (b->ndim == 3 && b->shape[1] == heads && b->shape[2] == dim)
        rows = b->shape[0];
    else if (b->dense && heads != 0 && dim != 0 && b->element_count % (heads * dim) == 0)
        rows = b->element_count / (heads * dim);
    else
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT,
                        "%s: %s must be [rows, %zu, %zu] (3-D with last stride 1, or dense with a multiple of %zu "
                        "elements; got %d-D with %zu elements)",
                        k_op, name, heads, dim, heads * dim, b->ndim, b->element_count);
    return lmk_operand3(k_op, name, b, rows, heads, dim, t);
}

/* v's head size: v_in's last axis when 3-D, else element count / (T * heads). */
static lmk_status v_dim_of(const lmk_buffer *v, size_t seq, size_t heads, size_t *dim)
{
    if (v->ndim == 3 && v->shape[0] == seq && v->shape[1] == heads)
        *dim = v->shape[2];
    else if (v->dense && v->element_count % (seq * heads) == 0)
        *dim = v->element_count / (seq * heads);
    else
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT,
                        "%s: v_in must be [%zu, %zu, Dv] (got %d-D with %zu elements)", k_op, seq, heads, v->ndim,
                        v->element_count);
    if (*dim == 0)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: v_in's head size Dv must be > 0", k_op);
    /* Backends take Dv as a 32-bit value (lmk_attn_prologue_args.v_dim), like head_dim. */
    if (*dim > UINT32_MAX)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: v_in's head size Dv (%zu) must be at most %u (head_dim's range)",
                        k_op, *dim, UINT32_MAX);
    return LMK_OK;
}

static lmk_status check_weight(const char *name, const lmk_buffer *w, uint32_t head_dim)
{
    if (!w)
        return LMK_OK;
    if (w->dtype != LMK_F32 && w->dtype != LMK_BF16 && w->dtype != LMK_F16)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: %s must be f32, bf16 or f16 (got %s)", k_op, name,
                        lmk_dtype_name(w->dtype));
    if (!w->dense || w->element_count != head_dim)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: %s must be dense with exactly head_dim (%u) elements (got %zu%s)",
                        k_op, name, head_dim, w->element_count, w->dense ? "" : ", strided");
    return LMK_OK;
}

/* A nonzero scale must have a normal f32 inverse (lmk_attn_prologue_inv_scale): past 2^126 it would
 * be subnormal (several ulps off), below 2^-126 it could overflow. The range is checked on the
 * bits (positive floats order as their bits), so that a caller's denormals-are-zero mode cannot
 * pass a subnormal scale. */
static lmk_status check_scale(const char *name, float v)
{
    if (!isfinite(v) || v < 0.0f)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: %s must be finite and >= 0 (0 means 1), got %g", k_op, name,
                        (double)v);
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    if ((bits & 0x7fffffffu) != 0 && (bits < 0x00800000u || bits > 0x7e800000u)) /* [2^-126, 2^126] */
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT,
                        "%s: %s must be 0 or in [2^-126, 2^126] (f8 caches multiply by 1 / %s), got %g", k_op, name,
                        name, (double)v);
    return LMK_OK;
}

static lmk_status check_cache_dtype(const char *name, const lmk_buffer *c, lmk_dtype in)
{
    if (c && c->dtype != in && c->dtype != LMK_F8E4M3)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: %s dtype %s must be the input dtype (%s) or f8e4m3", k_op, name,
                        lmk_dtype_name(c->dtype), lmk_dtype_name(in));
    return LMK_OK;
}

/* The rope rules (lmk_rope's R1-R12) for q and k. */
static lmk_status check_rope(const lmk_attn_prologue_io *io, const lmk_rope_params *p, lmk_tensor3 *t)
{
    lmk_status st = lmk_rope_check_params(k_op, p, true);
    if (st == LMK_OK)
        st = lmk_operand3(k_op, "q_in", io->q_in, p->seq_len, p->n_heads, p->head_dim, &t[Q_IN]);
    if (st == LMK_OK)
        st = lmk_operand3(k_op, "q_out", io->q_out, p->seq_len, p->n_heads, p->head_dim, &t[Q_OUT]);
    if (st == LMK_OK)
        st = lmk_operand3(k_op, "k_in", io->k_in, p->seq_len, p->n_k_heads, p->head_dim, &t[K_IN]);
    if (st == LMK_OK && io->k_out)
        st = lmk_operand3(k_op, "k_out", io->k_out, p->seq_len, p->n_k_heads, p->head_dim, &t[K_OUT]);
    const lmk_dtype dt = io->q_in->dtype;
    const lmk_buffer *same[] = {io->q_out, io->k_in, io->k_out, io->v_in};
    static const char *const same_names[] = {"q_out", "k_in", "k_out", "v_in"};
    for (int i = 0; i < 4 && st == LMK_OK; i++)
        if (same[i] && same[i]->dtype != dt)
            st = lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: %s dtype %s differs from q_in's %s", k_op, same_names[i],
                          lmk_dtype_name(same[i]->dtype), lmk_dtype_name(dt));
    if (st == LMK_OK && dt != LMK_F32 && dt != LMK_BF16 && dt != LMK_F16)
        st = lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: q_in has unsupported dtype %s (expected f32, bf16 or f16)", k_op,
                      lmk_dtype_name(dt));
    if (st == LMK_OK)
        st = lmk_rope_check_inputs(k_op, p, io->positions, io->freq_factors);
    return st;
}

/* The prologue's own rules, in lmk.h's order, after the rope rules. */
static lmk_status check_rest(const lmk_attn_prologue_io *io, const lmk_rope_params *p, const lmk_rms_norm_params *n,
                             lmk_tensor3 *t, size_t *v_dim)
{
    if (!isfinite(n->eps) || n->eps <= 0.0f)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: eps must be finite and > 0, got %g", k_op, (double)n->eps);
    if (!isfinite(n->weight_offset))
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: weight_offset must be finite, got %g", k_op,
                        (double)n->weight_offset);
    if (!io->k_out && !io->k_cache)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: k_out or k_cache must be given (the rotated k goes nowhere)",
                        k_op);
    if ((io->k_cache || io->v_cache) && !io->slots)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: %s needs slots (the cache row of each token)", k_op,
                        io->k_cache ? "k_cache" : "v_cache");
    if (!io->v_in != !io->v_cache)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: v_in and v_cache must be given together (got %s)", k_op,
                        io->v_in ? "v_in without v_cache" : "v_cache without v_in");
    lmk_status st = check_weight("q_norm_w", io->q_norm_w, p->head_dim);
    if (st == LMK_OK)
        st = check_weight("k_norm_w", io->k_norm_w, p->head_dim);
    if (st != LMK_OK)
        return st;
    if (io->slots) {
        if (io->slots->dtype != LMK_I32 && io->slots->dtype != LMK_I64)
            return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: slots must be i32 or i64 (got %s)", k_op,
                            lmk_dtype_name(io->slots->dtype));
        if (!io->slots->dense || io->slots->element_count != p->seq_len)
            return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: slots must be dense with exactly seq_len (%u) entries (got %zu)",
                            k_op, p->seq_len, io->slots->element_count);
    }
    st = check_scale("k_scale", io->k_scale);
    if (st == LMK_OK)
        st = check_scale("v_scale", io->v_scale);
    if (st == LMK_OK)
        st = check_cache_dtype("k_cache", io->k_cache, io->q_in->dtype);
    if (st == LMK_OK)
        st = check_cache_dtype("v_cache", io->v_cache, io->q_in->dtype);
    if (st == LMK_OK && io->k_cache)
        st = resolve_rows("k_cache", io->k_cache, p->n_k_heads, p->head_dim, &t[K_CACHE]);
    if (st == LMK_OK && io->v_in)
        st = v_dim_of(io->v_in, p->seq_len, p->n_k_heads, v_dim);
    if (st == LMK_OK && io->v_in)
        st = lmk_operand3(k_op, "v_in", io->v_in, p->seq_len, p->n_k_heads, *v_dim, &t[V_IN]);
    if (st == LMK_OK && io->v_cache)
        st = resolve_rows("v_cache", io->v_cache, p->n_k_heads, *v_dim, &t[V_CACHE]);
    return st;
}

static lmk_rows rows_of(const lmk_tensor3 *t, const lmk_buffer *b)
{
    return (lmk_rows){.data = b ? t->data : NULL, .tok = t->stride[0], .head = t->stride[1],
                      .dtype = b ? b->dtype : LMK_F32};
}

static lmk_attn_prologue_args make_args(const lmk_attn_prologue_io *io, const lmk_rope_params *p,
                                        const lmk_rms_norm_params *n, const lmk_tensor3 *t, size_t v_dim)
{
    const lmk_tensor3 rt[4] = {t[Q_IN], t[Q_OUT], t[K_IN], io->k_out ? t[K_OUT] : t[K_IN]};
    lmk_attn_prologue_args a = {
        .rope = lmk_rope_args_for(p, io->q_in->dtype, rt, true, io->positions->data, io->positions->dtype,
                                  io->freq_factors ? (const float *)(const void *)io->freq_factors->data : NULL),
        .q_norm_w = io->q_norm_w ? io->q_norm_w->data : NULL,
        .k_norm_w = io->k_norm_w ? io->k_norm_w->data : NULL,
        .q_norm_dtype = io->q_norm_w ? io->q_norm_w->dtype : LMK_F32,
        .k_norm_dtype = io->k_norm_w ? io->k_norm_w->dtype : LMK_F32,
        .eps = (double)n->eps,
        .weight_offset = (double)n->weight_offset,
        .v_in = rows_of(&t[V_IN], io->v_in),
        .v_dim = (uint32_t)v_dim, /* <= UINT32_MAX: v_dim_of */
        .slots = io->slots ? io->slots->data : NULL,
        .slot_dtype = io->slots ? io->slots->dtype : LMK_I32,
        .k_cache = rows_of(&t[K_CACHE], io->k_cache),
        .v_cache = rows_of(&t[V_CACHE], io->v_cache),
        .k_slots = io->k_cache ? t[K_CACHE].n[0] : 0,
        .v_slots = io->v_cache ? t[V_CACHE].n[0] : 0,
        .k_inv_scale = lmk_attn_prologue_inv_scale(io->k_scale),
        .v_inv_scale = lmk_attn_prologue_inv_scale(io->v_scale),
    };
    if (!io->k_out)
        a.rope.t[1].out = NULL;
    return a;
}

/* The one place the f8 factor is formed: the f32 nearest to 1 / scale. This runs on the caller's
 * thread, under its rounding mode (lmk.h: results do not depend on it), where 1.0f / s is only
 * within an ulp of that value; of it and its two neighbours the nearest is the one whose product
 * with s is nearest 1, and those products and their distances to 1 are exact in double (24-bit
 * factors; a difference of two doubles within a factor 2 of each other), so the choice is the
 * same in every mode. No tie exists: 1 / s halfway between two floats would make s times a
 * 25-bit odd significand a power of two. */
float lmk_attn_prologue_inv_scale(float scale)
{
    const float s = scale == 0.0f ? 1.0f : scale;
    float inv = 1.0f / s;
    const float next[2] = {nextafterf(inv, 0.0f), nextafterf(inv, INFINITY)};
    for (int i = 0; i < 2; i++)
        if (fabs((double)next[i] * (double)s - 1.0) < fabs((double)inv * (double)s - 1.0))
            inv = next[i];
    return inv;
}

lmk_status lmk_attn_prologue_prepare(const lmk_device *dev, const lmk_attn_prologue_io *io,
                                     const lmk_rope_params *rope, const lmk_rms_norm_params *norm,
                                     lmk_attn_prologue_args *out)
{
    const void *req[] = {dev, io, rope, norm};
    static const char *const req_names[] = {"device", "io", "rope params", "norm params"};
    for (int i = 0; i < 4; i++)
        if (!req[i])
            return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: %s must not be NULL", k_op, req_names[i]);
    const void *bufs_req[] = {io->q_in, io->k_in, io->positions, io->q_out};
    static const char *const bufs_names[] = {"q_in", "k_in", "positions", "q_out"};
    for (int i = 0; i < 4; i++)
        if (!bufs_req[i])
            return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: io->%s must not be NULL", k_op, bufs_names[i]);

    lmk_tensor3 t[N_OPS] = {{0}};
    size_t v_dim = 0;
    lmk_status st = check_rope(io, rope, t);
    if (st == LMK_OK)
        st = check_rest(io, rope, norm, t, &v_dim);
    const lmk_buffer *all[N_OPS] = {io->q_in, io->k_in, io->v_in, io->q_norm_w, io->k_norm_w, io->positions,
                                    io->freq_factors, io->slots, io->q_out, io->k_out, io->k_cache, io->v_cache};
    for (int i = 0; i < N_OPS && st == LMK_OK; i++)
        if (all[i] && all[i]->dev != dev)
            st = lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: %s is not on the stream's device (%s)", k_op, k_names[i],
                          dev->name);
    if (st != LMK_OK)
        return st;
    /* Dense operands (weights, positions, freq_factors, slots) as flat tensors for the overlap rule. */
    const int flat[] = {QW, KW, POS, FF, SLOTS};
    for (int i = 0; i < 5; i++)
        if (all[flat[i]])
            t[flat[i]] = lmk_operand_flat(all[flat[i]]);
    static const int outs[4] = {Q_OUT, K_OUT, K_CACHE, V_CACHE}, own[4] = {Q_IN, K_IN, -1, -1};
    st = lmk_check_overlaps(k_op, t, k_names, N_OPS, outs, own, 4);
    if (st != LMK_OK)
        return st;
    *out = make_args(io, rope, norm, t, v_dim);
    return LMK_OK;
}

lmk_status lmk_attn_prologue(lmk_stream *s, const lmk_attn_prologue_io *io, const lmk_rope_params *rope,
                             const lmk_rms_norm_params *norm)
{
    if (!s)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: stream must not be NULL", k_op);
    lmk_attn_prologue_args a;
    const lmk_status st = lmk_attn_prologue_prepare(s->dev, io, rope, norm, &a);
    return st == LMK_OK ? lmk_dispatch(s, LMK_OP_attn_prologue, k_op, &a) : st;
}
