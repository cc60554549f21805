/*
 * op.c - validation and dispatch of rope: lmk_rope (every mode and scaling, strided operands) and
 * the 0.1 entry points lmk_rope_multi and lmk_rope_multi_qk, which are thin wrappers that keep
 * their own rules and message order (lmk.h documents both).
 *
 * Each rule is one small function; lmk_rope runs them in the order of lmk.h's R1-R14, the wrappers
 * in rope_multi's order. Both end in make_args, which resolves every default, so a backend (and
 * the reference) receives plain values. A rejected call never touches a buffer.
 */
#include "core/internal.h"
#include "ops/rope/rope.h"

#include <fenv.h>
#include <math.h>

static const double k_pi = 3.14159265358979323846;

static bool is_multi(lmk_rope_mode m)
{
    return m == LMK_ROPE_MROPE || m == LMK_ROPE_IMROPE || m == LMK_ROPE_VISION;
}

/* R2-R5 (rope_multi rules 1-4): the dimensions and freq_base. n_k is 0 when there is no k. */
static lmk_status check_dims(const char *op, const lmk_rope_params *p, bool has_k)
{
    if (p->head_dim == 0 || p->rope_dim == 0 || p->n_heads == 0 || p->seq_len == 0)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT,
                        "%s: head_dim, rope_dim, n_heads, seq_len must all be > 0 "
                        "(got head_dim=%u, rope_dim=%u, n_heads=%u, seq_len=%u)",
                        op, p->head_dim, p->rope_dim, p->n_heads, p->seq_len);
    if (has_k && p->n_k_heads == 0)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: n_k_heads must be > 0 when k is given", op);
    if (p->head_dim % 2 != 0 || p->rope_dim % 2 != 0)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT,
                        "%s: head_dim and rope_dim must be even (got head_dim=%u, rope_dim=%u)", op, p->head_dim,
                        p->rope_dim);
    if (p->rope_dim > p->head_dim)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: rope_dim must be <= head_dim (got rope_dim=%u, head_dim=%u)",
                        op, p->rope_dim, p->head_dim);
    if (!isfinite(p->freq_base) || p->freq_base <= 0.0f)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: freq_base must be finite and positive, got %g", op,
                        (double)p->freq_base);
    return LMK_OK;
}

/* R6-R8: the mode, VISION's rope_dim, the pairing. `multi_only`: the rope_multi entry points. */
static lmk_status check_mode(const char *op, const lmk_rope_params *p, bool multi_only)
{
    const lmk_rope_mode m = p->mode;
    if (multi_only && m != LMK_ROPE_MROPE && m != LMK_ROPE_IMROPE)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: unknown mode %d (expected 8 MROPE or 40 IMROPE)", op, (int)m);
    if (m != LMK_ROPE_NORMAL && m != LMK_ROPE_NEOX && !is_multi(m))
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT,
                        "%s: unknown mode %d (expected 0 NORMAL, 2 NEOX, 8 MROPE, 24 VISION or 40 IMROPE)", op,
                        (int)m);
    if (m == LMK_ROPE_VISION && p->rope_dim != p->head_dim)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: VISION needs rope_dim == head_dim (got rope_dim=%u, head_dim=%u)",
                        op, p->rope_dim, p->head_dim);
    if (p->pairing != LMK_ROPE_PAIR_HALF_ROPE && p->pairing != LMK_ROPE_PAIR_HALF_HEAD)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: unknown pairing %d (expected 0 HALF_ROPE or 1 HALF_HEAD)", op,
                        (int)p->pairing);
    if (m == LMK_ROPE_NORMAL && p->pairing == LMK_ROPE_PAIR_HALF_HEAD)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT,
                        "%s: pairing HALF_HEAD has no meaning for NORMAL (its pairs are adjacent elements)", op);
    return LMK_OK;
}

/* R9: the scaling fields. */
static lmk_status check_scaling(const char *op, const lmk_rope_params *p)
{
    const struct {
        const char *name;
        float v;
        bool may_be_negative;
    } f[] = {{"freq_scale", p->freq_scale, false}, {"ext_factor", p->ext_factor, true},
             {"attn_factor", p->attn_factor, false}, {"beta_fast", p->beta_fast, false},
             {"beta_slow", p->beta_slow, false}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        if (!isfinite(f[i].v))
            return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: %s must be finite, got %g", op, f[i].name, (double)f[i].v);
        if (!f[i].may_be_negative && f[i].v < 0.0f)
            return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: %s must not be negative, got %g", op, f[i].name,
                            (double)f[i].v);
    }
    if (p->ext_factor != 0.0f && p->n_ctx_orig == 0)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: ext_factor (%g) != 0 needs n_ctx_orig > 0", op,
                        (double)p->ext_factor);
    return LMK_OK;
}

/* The resolved operands of a call: q, and k when given. */
typedef struct rope_operands {
    lmk_tensor3 t[4]; /* q_in, q_out, k_in, k_out */
    bool has_k;
} rope_operands;

/* One tensor's input and output (R10, rope_multi rules 5-7): shapes, then equal dtypes. */
static lmk_status check_pair(const char *op, const char *in_name, const char *out_name, const lmk_rope_params *p,
                             uint32_t n_heads, const lmk_buffer *in, const lmk_buffer *out, lmk_tensor3 *tin,
                             lmk_tensor3 *tout)
{
    lmk_status st = lmk_operand3(op, in_name, in, p->seq_len, n_heads, p->head_dim, tin);
    if (st == LMK_OK)
        st = lmk_operand3(op, out_name, out, p->seq_len, n_heads, p->head_dim, tout);
    if (st == LMK_OK && in->dtype != out->dtype)
        st = lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: %s/%s dtype mismatch %s vs %s", op, in_name, out_name,
                      lmk_dtype_name(in->dtype), lmk_dtype_name(out->dtype));
    return st;
}

static lmk_status check_float_dtype(const char *op, const char *name, lmk_dtype t)
{
    if (t != LMK_F32 && t != LMK_BF16 && t != LMK_F16)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: %s has unsupported dtype %s (expected f32, bf16 or f16)", op,
                        name, lmk_dtype_name(t));
    return LMK_OK;
}

/* R11 (rope_multi rules 8-9): positions length and dtype. */
static lmk_status check_positions(const char *op, const lmk_rope_params *p, const lmk_buffer *pos, bool multi_only)
{
    const bool four = multi_only || is_multi(p->mode), allow_i64 = !multi_only;
    const size_t want = (four ? 4 : 1) * (size_t)p->seq_len;
    if (!pos->dense)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: positions must be a dense buffer", op);
    if (pos->element_count != want)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: positions length %zu != %sseq_len(%u) = %zu", op,
                        pos->element_count, four ? "4 * " : "", p->seq_len, want);
    if (pos->dtype != LMK_I32 && pos->dtype != LMK_U32 && !(allow_i64 && pos->dtype == LMK_I64))
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: positions must be %s (got %s)", op,
                        allow_i64 ? "i32, u32 or i64" : "i32 or u32", lmk_dtype_name(pos->dtype));
    return LMK_OK;
}

/* R12: freq_factors, when given. */
static lmk_status check_freq_factors(const char *op, const lmk_rope_params *p, const lmk_buffer *ff)
{
    if (!ff)
        return LMK_OK;
    const size_t want = p->rope_dim / 2;
    if (!ff->dense || ff->dtype != LMK_F32)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: freq_factors must be a dense f32 buffer (got %s%s)", op,
                        lmk_dtype_name(ff->dtype), ff->dense ? "" : ", strided");
    if (ff->element_count < want)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: freq_factors has %zu entries, fewer than the %zu rotated pairs",
                        op, ff->element_count, want);
    return LMK_OK;
}

/* R13: every buffer on the stream's device. */
static lmk_status check_devices(const char *op, const lmk_stream *s, const lmk_buffer *const *bufs, int n)
{
    for (int i = 0; i < n; i++)
        if (bufs[i] && bufs[i]->dev != s->dev)
            return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: every buffer must be on the stream's device (%s)", op,
                            s->dev->name);
    return LMK_OK;
}

/* R14: outputs against everything (q_out, k_out; positions and freq_factors are inputs). */
static lmk_status check_overlap(const char *op, const rope_operands *o, const char *const names[6],
                                const lmk_buffer *pos, const lmk_buffer *ff)
{
    lmk_tensor3 all[6] = {o->t[0], o->t[1], {0}, {0}, lmk_operand_flat(pos), {0}};
    if (o->has_k)
        all[2] = o->t[2], all[3] = o->t[3];
    if (ff)
        all[5] = lmk_operand_flat(ff);
    static const int outs[2] = {1, 3}, own[2] = {0, 2};
    return lmk_check_overlaps(op, all, names, 6, outs, own, o->has_k ? 2 : 1);
}

static lmk_rope_tensor tensor_args(const lmk_tensor3 *in, const lmk_tensor3 *out, uint32_t n_heads)
{
    return (lmk_rope_tensor){.in = in->data, .out = out->data, .n_heads = n_heads, .in_tok = in->stride[0],
                             .in_head = in->stride[1], .out_tok = out->stride[0], .out_head = out->stride[1]};
}

lmk_rope_args lmk_rope_args_for(const lmk_rope_params *p, lmk_dtype dtype, const lmk_tensor3 t[4], bool has_k,
                                const void *positions, lmk_dtype pos_dtype, const float *freq_factors)
{
    const bool vision = p->mode == LMK_ROPE_VISION;
    lmk_rope_args a = {
        .dtype = dtype, .head_dim = p->head_dim, .rope_dim = p->rope_dim, .seq_len = p->seq_len,
        .interleaved = p->mode == LMK_ROPE_NORMAL,
        .pair_stride = p->mode == LMK_ROPE_NORMAL ? 1
                       : vision || p->pairing == LMK_ROPE_PAIR_HALF_HEAD ? p->head_dim / 2
                                                                         : p->rope_dim / 2,
        .n_tensors = has_k ? 2 : 1,
    };
    lmk_rope_angle *g = &a.angle;
    g->mode = p->mode;
    for (int i = 0; i < 4; i++)
        g->sections[i] = p->sections[i];
    g->n_pairs = p->rope_dim / 2;
    g->freq_base = (double)p->freq_base;
    g->exp_n = vision ? (double)(p->head_dim / 2) : (double)p->rope_dim;
    g->freq_scale = p->freq_scale == 0.0f ? 1.0 : (double)p->freq_scale;
    g->ext_factor = (double)p->ext_factor;
    g->beta_fast = p->beta_fast == 0.0f ? 32.0 : (double)p->beta_fast;
    g->beta_slow = p->beta_slow == 0.0f ? 1.0 : (double)p->beta_slow;
    g->n_ctx_orig = p->n_ctx_orig;
    g->attn_factor = p->attn_factor == 0.0f ? 1.0 : (double)p->attn_factor;
    g->mscale = g->attn_factor;
    if (g->ext_factor != 0.0) {
        /* ggml's rope_yarn_corr_dims, in float64; fmax/fmin also turn a NaN (freq_base 1) into the
         * clamp's bound. Under round-to-nearest whatever the caller set: log's last bit, and so the
         * CUDA path's m, must not depend on the caller's rounding mode (lmk.h, determinism). */
        const int mode = fegetround();
        if (mode != FE_TONEAREST)
            fesetround(FE_TONEAREST);
        const double n = g->exp_n, lb = 2.0 * log(g->freq_base), ctx = (double)p->n_ctx_orig;
        g->ramp_low = fmax(0.0, floor(n * log(ctx / (2.0 * k_pi * g->beta_fast)) / lb));
        g->ramp_high = fmin(n - 1.0, ceil(n * log(ctx / (2.0 * k_pi * g->beta_slow)) / lb));
        g->mscale = g->attn_factor * (1.0 + 0.1 * log(1.0 / g->freq_scale));
        if (mode != FE_TONEAREST)
            fesetround(mode);
    }
    g->freq_factors = freq_factors;
    g->positions = positions;
    g->pos_dtype = pos_dtype;
    g->pos_axis_stride = is_multi(p->mode) ? p->seq_len : 0;
    a.t[0] = tensor_args(&t[0], &t[1], p->n_heads);
    if (has_k)
        a.t[1] = tensor_args(&t[2], &t[3], p->n_k_heads);
    return a;
}

static lmk_rope_args make_args(const lmk_rope_params *p, const rope_operands *o, lmk_dtype dtype,
                               const lmk_buffer *pos, const lmk_buffer *ff)
{
    return lmk_rope_args_for(p, dtype, o->t, o->has_k, pos->data, pos->dtype,
                             ff ? (const float *)(const void *)ff->data : NULL);
}

lmk_status lmk_rope(lmk_stream *s, const lmk_buffer *q_in, const lmk_buffer *k_in, const lmk_buffer *positions,
                    const lmk_buffer *freq_factors, lmk_buffer *q_out, lmk_buffer *k_out, const lmk_rope_params *p)
{
    static const char op[] = "rope";
    static const char *const names[6] = {"q_in", "q_out", "k_in", "k_out", "positions", "freq_factors"};
    const void *req[] = {s, q_in, q_out, positions, p};
    static const char *const req_names[] = {"stream", "q_in", "q_out", "positions", "params"};
    for (int i = 0; i < 5; i++)
        if (!req[i])
            return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: %s must not be NULL", op, req_names[i]);
    if (!k_in != !k_out)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: k_in and k_out must both be given or both be NULL (got %s)", op,
                        k_in ? "k_in without k_out" : "k_out without k_in");
    rope_operands o = {.has_k = k_in != NULL};
    lmk_status st = check_dims(op, p, o.has_k);
    if (st == LMK_OK)
        st = check_mode(op, p, false);
    if (st == LMK_OK)
        st = check_scaling(op, p);
    if (st == LMK_OK)
        st = check_pair(op, "q_in", "q_out", p, p->n_heads, q_in, q_out, &o.t[0], &o.t[1]);
    if (st == LMK_OK && o.has_k)
        st = check_pair(op, "k_in", "k_out", p, p->n_k_heads, k_in, k_out, &o.t[2], &o.t[3]);
    if (st == LMK_OK && o.has_k && q_in->dtype != k_in->dtype)
        st = lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: q and k dtype mismatch %s vs %s", op, lmk_dtype_name(q_in->dtype),
                      lmk_dtype_name(k_in->dtype));
    if (st == LMK_OK)
        st = check_float_dtype(op, "q_in", q_in->dtype);
    if (st == LMK_OK)
        st = check_positions(op, p, positions, false);
    if (st == LMK_OK)
        st = check_freq_factors(op, p, freq_factors);
    const lmk_buffer *bufs[] = {q_in, q_out, k_in, k_out, positions, freq_factors};
    if (st == LMK_OK)
        st = check_devices(op, s, bufs, 6);
    if (st == LMK_OK)
        st = check_overlap(op, &o, names, positions, freq_factors);
    if (st != LMK_OK)
        return st;
    const lmk_rope_args a = make_args(p, &o, q_in->dtype, positions, freq_factors);
    return lmk_dispatch(s, LMK_OP_rope, op, &a);
}

/* ---- the 0.1 entry points ---- */

static lmk_rope_params from_multi(const lmk_rope_multi_params *m, uint32_t n_k_heads)
{
    lmk_rope_params p = {.head_dim = m->head_dim, .rope_dim = m->rope_dim, .n_heads = m->n_heads,
                         .seq_len = m->seq_len, .freq_base = m->freq_base, .mode = m->mode,
                         .pairing = m->pairing, .n_k_heads = n_k_heads};
    for (int i = 0; i < 4; i++)
        p.sections[i] = m->sections[i];
    return p;
}

/* rope_multi's order: rules 1-4, then per tensor rules 5-10, then mode, pairing, devices, overlap. */
static lmk_status multi_call(lmk_stream *s, const char *op, const char *const names[6], const lmk_buffer *q_in,
                             lmk_buffer *q_out, const lmk_buffer *k_in, lmk_buffer *k_out, const lmk_buffer *positions,
                             const lmk_rope_params *p)
{
    rope_operands o = {.has_k = k_in != NULL};
    lmk_status st = check_dims(op, p, o.has_k);
    if (st == LMK_OK)
        st = check_pair(op, names[0], names[1], p, p->n_heads, q_in, q_out, &o.t[0], &o.t[1]);
    if (st == LMK_OK)
        st = check_positions(op, p, positions, true);
    if (st == LMK_OK)
        st = check_float_dtype(op, names[0], q_in->dtype);
    if (st == LMK_OK && o.has_k) {
        st = check_pair(op, names[2], names[3], p, p->n_k_heads, k_in, k_out, &o.t[2], &o.t[3]);
        if (st == LMK_OK && q_in->dtype != k_in->dtype)
            st = lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: q and k dtype mismatch %s vs %s", op,
                          lmk_dtype_name(q_in->dtype), lmk_dtype_name(k_in->dtype));
    }
    if (st == LMK_OK)
        st = check_mode(op, p, true);
    const lmk_buffer *bufs[] = {q_in, q_out, k_in, k_out, positions};
    if (st == LMK_OK)
        st = check_devices(op, s, bufs, 5);
    if (st == LMK_OK)
        st = check_overlap(op, &o, names, positions, NULL);
    if (st != LMK_OK)
        return st;
    const lmk_rope_args a = make_args(p, &o, q_in->dtype, positions, NULL);
    return lmk_dispatch(s, LMK_OP_rope, op, &a);
}

lmk_status lmk_rope_multi(lmk_stream *s, const lmk_buffer *input, lmk_buffer *output, const lmk_buffer *positions,
                          const lmk_rope_multi_params *p)
{
    static const char *const names[6] = {"input", "output", "", "", "positions", ""};
    if (!s || !input || !output || !positions || !p)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "rope_multi: %s must not be NULL",
                        !s ? "stream" : !input ? "input" : !output ? "output" : !positions ? "positions" : "params");
    const lmk_rope_params rp = from_multi(p, 0);
    return multi_call(s, "rope_multi", names, input, output, NULL, NULL, positions, &rp);
}

lmk_status lmk_rope_multi_qk(lmk_stream *s, const lmk_buffer *q_in, lmk_buffer *q_out, const lmk_buffer *k_in,
                             lmk_buffer *k_out, const lmk_buffer *positions, const lmk_rope_multi_params *p,
                             uint32_t n_k_heads)
{
    static const char *const names[6] = {"q input", "q output", "k input", "k output", "positions", ""};
    const void *req[] = {s, q_in, q_out, k_in, k_out, positions, p};
    static const char *const req_names[] = {"stream", "q_in", "q_out", "k_in", "k_out", "positions", "params"};
    for (int i = 0; i < 7; i++)
        if (!req[i])
            return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "rope_multi_qk: %s must not be NULL", req_names[i]);
    const lmk_rope_params rp = from_multi(p, n_k_heads);
    return multi_call(s, "rope_multi_qk", names, q_in, q_out, k_in, k_out, positions, &rp);
}

/* ---- rules shared with fused ops (rope.h) ---- */

lmk_status lmk_rope_check_params(const char *op, const lmk_rope_params *p, bool has_k)
{
    lmk_status st = check_dims(op, p, has_k);
    if (st == LMK_OK)
        st = check_mode(op, p, false);
    if (st == LMK_OK)
        st = check_scaling(op, p);
    return st;
}

lmk_status lmk_rope_check_inputs(const char *op, const lmk_rope_params *p, const lmk_buffer *positions,
                                 const lmk_buffer *freq_factors)
{
    lmk_status st = check_positions(op, p, positions, false);
    if (st == LMK_OK)
        st = check_freq_factors(op, p, freq_factors);
    return st;
}
