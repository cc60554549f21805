/*
 * fuzz_rope.c - libFuzzer harness for lmk_rope: every mode and scaling, dense and strided operands.
 *
 * One input is one call. Parameters: realistic shapes most of the time, wild ones otherwise (0,
 * odd, rope_dim > head_dim, huge); every mode (NORMAL, NEOX, MROPE, VISION, IMROPE) and unknown
 * ones; pairings, NORMAL with HALF_HEAD; freq_base NaN, +-inf, 0, negative, tiny, huge; every
 * scaling field (freq_scale, ext_factor, attn_factor, beta_fast, beta_slow, n_ctx_orig) from sane
 * values, zeros, negatives and non-finite ones. Operands: dense buffers made every way
 * (fuzz_common.h), q read out of a [q | gate] projection, q and k inside one packed QKV buffer
 * (rotated in place), views with random token and head strides (0 too: a broadcast input), in
 * place through the same handle or another view of the same layout, outputs overlapping an input
 * or each other (also within themselves); positions i32, u32, i64 (or any dtype), of T or 4T
 * entries (or any); freq_factors absent, with enough entries, too few, or not dense f32.
 *
 * An oracle written from lmk.h (R1-R14, "Operands") decides: valid, invalid, or (for a layout whose
 * elements are disjoint but not side by side in one row, which lmk.h lets lmk reject) either. Then:
 *   valid:   LMK_OK; elements outside the rotated pairs equal the input bit for bit; rotated ones
 *            are within lmk.h's tolerance of the float64 reference when every |x| <= 2 and every
 *            angle stays within 2^20 (else a second run must give the same bits); no byte outside
 *            the output elements changes (gaps of strided outputs included);
 *   invalid: LMK_ERR_INVALID_ARGUMENT, a message naming "rope", and no byte changed;
 *   always:  no heap allocation inside the call, no leak after freeing the call's buffers.
 * Overlap is judged on the bytes each operand's elements occupy (fuzz_common.h's marks), not on
 * extents.
 */
#include "fuzz_common.h"

#include <float.h>

enum { QI, QO, KI, KO, POS, FF, N_OPS };

typedef struct rope_call {
    lmk_rope_params p;
    const lmk_rope_params *pp;
    lmk_stream *s;
    lmk_buffer *b[N_OPS];
    int group[N_OPS];   /* > 0: views of one packed projection, side by side in each row */
    bool loose[N_OPS];  /* a view with random strides: disjoint but not provably so (lmk may reject) */
} rope_call;

/* ---- parameters ---- */

static float pick_float(fz_in *in, const float *common, unsigned n_common)
{
    static const float odd[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, -1.0f, 1e-30f, FLT_MAX, 1e-45f};
    const unsigned i = fz_pick(in, n_common + 10);
    if (i < n_common)
        return common[i];
    if (i < n_common + 9)
        return odd[i - n_common];
    return fz_f32_bits(fz_u32(in));
}

static void pick_scaling(fz_in *in, bool sane, lmk_rope_params *p)
{
    static const float scales[] = {0.0f, 0.0f, 1.0f, 0.25f, 1.0f / 32, 0.5f};
    static const float exts[] = {0.0f, 0.0f, 0.0f, 1.0f, 0.5f, -0.25f};
    static const float attns[] = {0.0f, 0.0f, 1.0f, 2.0f, 0.5f};
    static const float betas[] = {0.0f, 0.0f, 32.0f, 1.0f, 4.0f};
    if (sane) {
        p->freq_scale = scales[fz_pick(in, 6)];
        p->ext_factor = exts[fz_pick(in, 6)];
        p->attn_factor = attns[fz_pick(in, 5)];
        p->beta_fast = betas[fz_pick(in, 5)];
        p->beta_slow = betas[fz_pick(in, 5)];
    } else {
        p->freq_scale = pick_float(in, scales, 6);
        p->ext_factor = pick_float(in, exts, 6);
        p->attn_factor = pick_float(in, attns, 5);
        p->beta_fast = pick_float(in, betas, 5);
        p->beta_slow = pick_float(in, betas, 5);
    }
    p->n_ctx_orig = fz_pick(in, 4) ? 4096 : sane ? 1 + fz_u16(in) : fz_u32(in) % 3;
}

static void pick_params(fz_in *in, bool sane, lmk_rope_params *p)
{
    static const lmk_rope_mode modes[] = {LMK_ROPE_NORMAL, LMK_ROPE_NEOX, LMK_ROPE_MROPE, LMK_ROPE_VISION,
                                          LMK_ROPE_IMROPE};
    static const float bases[] = {1e4f, 1e6f, 1e7f, 5e5f, 1.5e5f, 2.0f, 1.0f, 10000.5f};
    if (sane || fz_pick(in, 4) != 3) { /* realistic: fits the arena */
        p->head_dim = 2 * (1 + fz_pick(in, 64));
        p->rope_dim = fz_pick(in, 3) == 0 ? p->head_dim : 2 * (1 + fz_pick(in, p->head_dim / 2));
        p->seq_len = 1 + fz_pick(in, 6);
        p->n_heads = 1 + fz_pick(in, 6);
        p->n_k_heads = fz_pick(in, 3) ? 1 + fz_pick(in, 4) : 0;
    } else {
        p->head_dim = fz_dim(in);
        p->rope_dim = fz_pick(in, 2) ? fz_dim(in) : p->head_dim + 2 * fz_pick(in, 3);
        p->seq_len = fz_dim(in);
        p->n_heads = fz_dim(in);
        p->n_k_heads = fz_dim(in);
    }
    p->freq_base = sane ? bases[fz_pick(in, 8)] : pick_float(in, bases, 8);
    const unsigned m = fz_pick(in, sane ? 5 : 7);
    p->mode = m < 5 ? modes[m] : m == 5 ? (lmk_rope_mode)(int32_t)fz_u32(in) : (lmk_rope_mode)1;
    if (p->mode == LMK_ROPE_VISION && (sane || fz_pick(in, 2)))
        p->rope_dim = p->head_dim;
    for (int i = 0; i < 4; i++)
        p->sections[i] = fz_pick(in, 8) == 0 ? UINT32_MAX - fz_pick(in, 3) : fz_pick(in, 40);
    p->pairing = fz_pick(in, 2) ? LMK_ROPE_PAIR_HALF_ROPE : LMK_ROPE_PAIR_HALF_HEAD;
    if (sane && p->mode == LMK_ROPE_NORMAL)
        p->pairing = LMK_ROPE_PAIR_HALF_ROPE;
    else if (!sane && fz_pick(in, 12) == 11)
        p->pairing = (lmk_rope_pairing)(2 + fz_pick(in, 100));
    pick_scaling(in, sane, p);
}

/* ---- operands ---- */

static size_t elems3(const lmk_rope_params *p, uint32_t heads)
{
    size_t n;
    if (__builtin_mul_overflow((size_t)p->seq_len * heads, p->head_dim, &n) || n > FZ_BUF_CAP)
        return 6;
    return n;
}

/* A [T, heads, D] view of the arena at a random element offset with strides {ts, hs, 1}; NULL
 * when it would not fit. */
static lmk_buffer *arena_view(fz_env *e, fz_call *c, fz_in *in, lmk_dtype t, const lmk_rope_params *p, uint32_t heads,
                              size_t ts, size_t hs, size_t base_off)
{
    const size_t es = lmk_dtype_size(t), n[3] = {p->seq_len, heads, p->head_dim}, st[3] = {ts, hs, 1};
    if (!n[0] || !n[1] || !n[2] || n[0] > 4096 || n[1] > 4096 || n[2] > 4096)
        return NULL;
    const size_t span = tst_span(n, st, es);
    if (span == 0 || span + base_off > FZ_ARENA_BYTES)
        return NULL;
    size_t off = base_off ? base_off : (fz_u16(in) % (FZ_ARENA_BYTES - span + 1));
    off -= off % es;
    lmk_buffer *b = NULL;
    if (lmk_buffer_view_strided(e->parent, off, t, n, st, 3, &b) != LMK_OK)
        return NULL;
    fz_call_keep(c, b);
    fz_world_add(&c->world, e->arena, FZ_ARENA_BYTES);
    return b;
}

/* q_in and k_in (k only when n_k_heads > 0 or the input wants one anyway): dense buffers, q from a
 * [q | gate] projection, q and k in one packed QKV buffer, or random strides. */
static void make_inputs(fz_env *e, fz_call *c, fz_in *in, rope_call *rc, lmk_dtype t, lmk_dtype tk, bool has_k)
{
    const lmk_rope_params *p = &rc->p;
    const size_t d = p->head_dim;
    const unsigned how = fz_pick(in, 8);
    if (how == 5 && has_k && t == tk) { /* packed [T, (Hq + 2Hk) D]: q then k then v */
        const size_t row = ((size_t)p->n_heads + 2 * p->n_k_heads) * d;
        rc->b[QI] = arena_view(e, c, in, t, p, p->n_heads, row, d, 0);
        if (rc->b[QI]) {
            const size_t off = (size_t)((unsigned char *)lmk_buffer_data(rc->b[QI]) - e->arena);
            rc->b[KI] = arena_view(e, c, in, t, p, p->n_k_heads, row, d, off + (size_t)p->n_heads * d * lmk_dtype_size(t));
            if (rc->b[KI])
                rc->group[QI] = rc->group[KI] = 1;
        }
    } else if (how == 6) { /* q of [T, Hq, 2D] */
        rc->b[QI] = arena_view(e, c, in, t, p, p->n_heads, (size_t)p->n_heads * 2 * d, 2 * d, 0);
    } else if (how == 7) { /* random strides, 0 included: an input may read one head for many */
        const size_t hs = fz_pick(in, 4) ? d + fz_pick(in, 5) : fz_pick(in, 2 * (unsigned)d + 1);
        const size_t ts = fz_pick(in, 4) ? p->n_heads * hs + fz_pick(in, 9) : fz_pick(in, 300);
        rc->b[QI] = arena_view(e, c, in, t, p, p->n_heads, ts, hs, 0);
        rc->loose[QI] = true;
    }
    if (!rc->b[QI])
        rc->b[QI] = fz_make_buffer(e, c, in, t, elems3(p, p->n_heads));
    if (has_k && !rc->b[KI])
        rc->b[KI] = fz_make_buffer(e, c, in, tk, elems3(p, p->n_k_heads));
}

/* An output for `input`: in place (same handle, or another view of the same layout), an output of
 * its own (dense or strided), or (not sane) anything that may overlap. */
static lmk_buffer *make_output(fz_env *e, fz_call *c, fz_in *in, rope_call *rc, int which, lmk_dtype t, uint32_t heads)
{
    lmk_buffer *input = rc->b[which - 1];
    const unsigned how = fz_pick(in, 6);
    if (input && (how == 1 || rc->group[which - 1])) {
        rc->group[which] = rc->group[which - 1];
        return input;
    }
    if (input && how == 2 && fz_in_range(lmk_buffer_data(input), e->arena, FZ_ARENA_BYTES)) {
        lmk_buffer *b = NULL;
        const size_t n[3] = {lmk_buffer_dim(input, 0), lmk_buffer_dim(input, 1), lmk_buffer_dim(input, 2)};
        const size_t st[3] = {lmk_buffer_stride(input, 0), lmk_buffer_stride(input, 1), lmk_buffer_stride(input, 2)};
        const size_t off = (size_t)((unsigned char *)lmk_buffer_data(input) - e->arena);
        const int nd = lmk_buffer_ndim(input);
        if (nd == 3 && lmk_buffer_view_strided(e->parent, off, lmk_buffer_dtype(input), n, st, 3, &b) == LMK_OK) {
            fz_call_keep(c, b);
            rc->loose[which] = rc->loose[which - 1];
            return b;
        }
    }
    if (how == 3) { /* strided output: padded heads and tokens, or (rarely) a self-overlapping one */
        const size_t d = rc->p.head_dim;
        const size_t hs = fz_pick(in, 8) ? d + fz_pick(in, 4) : fz_pick(in, (unsigned)d + 1);
        lmk_buffer *b = arena_view(e, c, in, t, &rc->p, heads, heads * hs + fz_pick(in, 5), hs, 0);
        rc->loose[which] = true;
        if (b)
            return b;
    }
    return fz_make_buffer(e, c, in, t, elems3(&rc->p, heads));
}

/* ---- the oracle ---- */

static bool is_float(lmk_dtype t)
{
    return t == LMK_F32 || t == LMK_BF16 || t == LMK_F16;
}

static bool multi(lmk_rope_mode m)
{
    return m == LMK_ROPE_MROPE || m == LMK_ROPE_IMROPE || m == LMK_ROPE_VISION;
}

/* R1-R13: everything but the overlaps. */
static bool rules_valid(const rope_call *rc, lmk_tensor3 t[N_OPS])
{
    const lmk_rope_params *p = rc->pp;
    const bool has_k = rc->b[KI] != NULL;
    if (!rc->s || !rc->b[QI] || !rc->b[QO] || !rc->b[POS] || !p || !rc->b[KI] != !rc->b[KO])
        return false;
    if (!p->head_dim || !p->rope_dim || !p->n_heads || !p->seq_len || (has_k && !p->n_k_heads))
        return false;
    if (p->head_dim % 2 || p->rope_dim % 2 || p->rope_dim > p->head_dim || !isfinite(p->freq_base) || !(p->freq_base > 0))
        return false;
    if (p->mode != LMK_ROPE_NORMAL && p->mode != LMK_ROPE_NEOX && !multi(p->mode))
        return false;
    if ((p->mode == LMK_ROPE_VISION && p->rope_dim != p->head_dim) ||
        (p->pairing != LMK_ROPE_PAIR_HALF_ROPE && p->pairing != LMK_ROPE_PAIR_HALF_HEAD) ||
        (p->mode == LMK_ROPE_NORMAL && p->pairing == LMK_ROPE_PAIR_HALF_HEAD))
        return false;
    const float f[5] = {p->freq_scale, p->ext_factor, p->attn_factor, p->beta_fast, p->beta_slow};
    for (int i = 0; i < 5; i++)
        if (!isfinite(f[i]) || (i != 1 && f[i] < 0))
            return false;
    if (p->ext_factor != 0 && p->n_ctx_orig == 0)
        return false;
    const uint32_t heads[4] = {p->n_heads, p->n_heads, p->n_k_heads, p->n_k_heads};
    for (int i = 0; i < (has_k ? 4 : 2); i++)
        if (!fz_operand3(rc->b[i], p->seq_len, heads[i], p->head_dim, &t[i]))
            return false;
    const lmk_dtype dt = lmk_buffer_dtype(rc->b[QI]);
    for (int i = 1; i < (has_k ? 4 : 2); i++)
        if (lmk_buffer_dtype(rc->b[i]) != dt)
            return false;
    if (!is_float(dt))
        return false;
    const lmk_buffer *pos = rc->b[POS], *ff = rc->b[FF];
    const lmk_dtype pt = lmk_buffer_dtype(pos);
    if (!lmk_buffer_is_contiguous(pos) || (pt != LMK_I32 && pt != LMK_U32 && pt != LMK_I64) ||
        lmk_buffer_element_count(pos) != (multi(p->mode) ? 4 : 1) * (size_t)p->seq_len)
        return false;
    if (ff && (!lmk_buffer_is_contiguous(ff) || lmk_buffer_dtype(ff) != LMK_F32 ||
               lmk_buffer_element_count(ff) < p->rope_dim / 2))
        return false;
    const lmk_device *d = lmk_stream_device(rc->s);
    for (int i = 0; i < N_OPS; i++)
        if (rc->b[i] && lmk_buffer_device(rc->b[i]) != d)
            return false;
    t[POS] = fz_flat3(pos);
    if (ff)
        t[FF] = fz_flat3(ff);
    return true;
}

enum { INVALID, VALID, EITHER };

/* R14 on the element bytes: each output's elements distinct, and sharing none with any other
 * operand but its own input taken exactly (in place). Disjoint layouts lmk cannot be asked to
 * prove (random strides whose extents meet) may go either way. */
static int overlap_verdict(const rope_call *rc, const lmk_tensor3 t[N_OPS], fz_world *w, fz_marks *mk)
{
    for (int i = 0; i < N_OPS; i++)
        if (t[i].data)
            fz_mark(w, mk, &t[i], i);
    int verdict = VALID;
    const int outs[2] = {QO, KO};
    for (int o = 0; o < 2; o++) {
        const int out = outs[o], own = out - 1;
        if (!t[out].data)
            continue;
        if (mk->self_overlap[out])
            return INVALID;
        if (rc->loose[out])
            verdict = EITHER; /* distinct, but maybe not provably (interleaved strides) */
        for (int i = 0; i < N_OPS; i++) {
            if (i == out || !t[i].data || (i == own && fz_same3(&t[out], &t[i])))
                continue;
            if (fz_marks_share(w, mk, out, i))
                return INVALID;
            const bool side_by_side = rc->group[out] && rc->group[out] == rc->group[i];
            if (fz_spans_meet(&t[out], &t[i]) && !side_by_side)
                verdict = EITHER;
        }
    }
    return verdict;
}

/* ---- filling ---- */

/* Element values through the operand's strides: mostly |x| <= 2, sometimes specials or raw bits. */
static void fill_tensor(fz_call *c, fz_in *in, const lmk_tensor3 *t, lmk_dtype dt)
{
    if (!t->data || !is_float(dt))
        return;
    static const float specials[] = {NAN, INFINITY, -INFINITY, -0.0f, 1e-40f, 3e38f, 65504.0f, 1e5f};
    const unsigned cls = fz_pick(in, 8);
    for (size_t a = 0; a < t->n[0]; a++)
        for (size_t h = 0; h < t->n[1]; h++) {
            unsigned char *row = t->data + (a * t->stride[0] + h * t->stride[1]) * t->es;
            for (size_t i = 0; i < t->n[2]; i++) {
                const uint32_t bits = (uint32_t)tst_rng_u64(&c->rng);
                float v = cls == 6 ? fz_f32_bits(bits) : cls == 7 ? fz_rand_sym(&c->rng, 1e4f)
                                                                  : fz_rand_sym(&c->rng, 2.0f);
                if (cls == 5 && (bits & 15) == 0)
                    v = specials[(bits >> 4) % 8];
                tst_store(dt, row, i, v);
            }
        }
}

/* Positions: text, up to 2^20 either way, extremes, or raw bits; freq_factors in [0.25, 8). */
static void fill_pos_ff(fz_call *c, fz_in *in, const rope_call *rc)
{
    const lmk_buffer *pos = rc->b[POS];
    const lmk_dtype pt = pos ? lmk_buffer_dtype(pos) : LMK_U8;
    if (pt == LMK_I32 || pt == LMK_U32 || pt == LMK_I64) {
        const unsigned cls = fz_pick(in, 6);
        unsigned char *d = lmk_buffer_data(pos);
        for (size_t i = 0; i < lmk_buffer_element_count(pos); i++) {
            const uint64_t r = tst_rng_u64(&c->rng);
            int64_t v = cls == 1 ? (int64_t)(r % (2u << 20)) - (1 << 20)
                        : cls == 2 ? (int64_t)(r % 65536)
                        : cls == 3 ? (int64_t)r
                                   : (int64_t)(i % (rc->p.seq_len ? rc->p.seq_len : 1)) + 17;
            if (pt == LMK_I64) {
                memcpy(d + 8 * i, &v, 8);
            } else {
                const int32_t v32 = (int32_t)v;
                memcpy(d + 4 * i, &v32, 4);
            }
        }
    }
    const lmk_buffer *ff = rc->b[FF];
    if (ff && lmk_buffer_dtype(ff) == LMK_F32) {
        float *f = lmk_buffer_data(ff);
        for (size_t i = 0; i < lmk_buffer_element_count(ff); i++)
            f[i] = (float)tst_rng_uniform(&c->rng, 0.25, 8.0);
    }
}

/* ---- after a valid call ---- */

/* Whether lmk.h's precision promise covers this call: inputs |x| <= 2, angles within 2^20. */
static bool in_domain(const lmk_rope_args *a, const lmk_rope_params *p)
{
    for (int ti = 0; ti < a->n_tensors; ti++)
        for (size_t tok = 0; tok < a->seq_len; tok++)
            for (size_t h = 0; h < a->t[ti].n_heads; h++)
                for (size_t i = 0; i < a->head_dim; i++)
                    if (!(fabs(tst_load(a->dtype, a->t[ti].in, tok * a->t[ti].in_tok + h * a->t[ti].in_head + i)) <= 2.0))
                        return false;
    const size_t n_pos = (multi(p->mode) ? 4 : 1) * (size_t)p->seq_len;
    for (size_t i = 0; i < n_pos; i++) {
        const double v = a->angle.pos_dtype == LMK_I64 ? (double)((const int64_t *)a->angle.positions)[i]
                                                       : (double)((const int32_t *)a->angle.positions)[i];
        if (fabs(v) > 1048576.0)
            return false;
    }
    for (uint32_t i = 0; a->angle.freq_factors && i < p->rope_dim / 2; i++)
        if (!(a->angle.freq_factors[i] >= 1.0f))
            return false;
    return p->freq_base >= 1.0f && a->angle.freq_scale <= 1.0 && a->angle.ext_factor >= 0.0 &&
           a->angle.ext_factor <= 1.0 && a->angle.mscale <= 64.0;
}

static lmk_status call(const rope_call *rc)
{
    return lmk_rope(rc->s, rc->b[QI], rc->b[KI], rc->b[POS], rc->b[FF], rc->b[QO], rc->b[KO], rc->pp);
}

static void check_valid(fz_call *c, fz_in *in, const rope_call *rc, const lmk_tensor3 t[N_OPS], const fz_marks *mk)
{
    const lmk_rope_params *p = &rc->p;
    const bool has_k = rc->b[KI] != NULL;
    lmk_tensor3 host[4] = {t[QI], t[QO], t[KI], t[KO]};
    for (int i = 0; i < 4; i++)
        if (host[i].data)
            host[i].data = (unsigned char *)(uintptr_t)fz_world_before(&c->world, host[i].data);
    const lmk_rope_args a =
        lmk_rope_args_for(p, lmk_buffer_dtype(rc->b[QI]), host, has_k, fz_world_before(&c->world, t[POS].data),
                          lmk_buffer_dtype(rc->b[POS]), t[FF].data ? fz_world_before(&c->world, t[FF].data) : NULL);
    const bool precise = in_domain(&a, p);
    const void *got[2] = {t[QO].data, has_k ? t[KO].data : NULL};
    tst_result res;
    FZ_CHECK(tst_rope_verify(&a, got, precise, &res),
             "rope(mode %d, head_dim %u, rope_dim %u, heads %u/%u, seq %u, base %g, sections [%u,%u,%u,%u], pairing %d, "
             "fs %g ext %g af %g beta %g/%g ctx %u, %s): %s",
             (int)p->mode, p->head_dim, p->rope_dim, p->n_heads, p->n_k_heads, p->seq_len, (double)p->freq_base,
             p->sections[0], p->sections[1], p->sections[2], p->sections[3], (int)p->pairing, (double)p->freq_scale,
             (double)p->ext_factor, (double)p->attn_factor, (double)p->beta_fast, (double)p->beta_slow, p->n_ctx_orig,
             lmk_dtype_name(a.dtype), res.msg);
    FZ_CHECK(fz_changed_outside(&c->world, mk, (1u << QO) | (1u << KO)) == NULL, "rope wrote outside its outputs");
    fz_stat(precise ? "valid calls checked against the tolerance" : "valid calls outside the precision domain");
    if (!precise || fz_pick(in, 8) == 7) { /* the same bits a second time */
        fz_world *w = &c->world;
        unsigned char *first[FZ_MAX_REGIONS] = {NULL};
        for (int r = 0; r < w->n; r++) {
            first[r] = malloc(w->r[r].len + 1);
            FZ_CHECK(first[r] != NULL, "harness: out of memory");
            memcpy(first[r], w->r[r].base, w->r[r].len);
        }
        fz_world_restore(w);
        FZ_CHECK(call(rc) == LMK_OK && lmk_stream_sync(rc->s) == LMK_OK, "second run of a valid rope failed");
        for (int r = 0; r < w->n; r++) {
            FZ_CHECK(memcmp(first[r], w->r[r].base, w->r[r].len) == 0, "rope is not deterministic (region %d)", r);
            free(first[r]);
        }
        fz_stat("valid calls run twice, the same bits");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in in = {data, size};
    fz_env *e = fz_env_get();
    const long live_before = atomic_load(&fz_n_live);
    fz_call c = {.rng = tst_rng_make(fz_u32(&in))};
    c.sane = fz_pick(&in, 2) == 0;
    rope_call rc = {0};
    pick_params(&in, c.sane, &rc.p);
    static const lmk_dtype fl[] = {LMK_F32, LMK_F32, LMK_BF16, LMK_F16};
    const lmk_dtype t = !c.sane && fz_pick(&in, 16) == 15 ? (lmk_dtype)fz_pick(&in, LMK_DTYPE_COUNT) : fl[fz_pick(&in, 4)];
    const lmk_dtype tk = !c.sane && fz_pick(&in, 16) == 15 ? fl[fz_pick(&in, 4)] : t;
    const bool has_k = c.sane ? rc.p.n_k_heads > 0 : fz_pick(&in, 3) != 0;

    make_inputs(e, &c, &in, &rc, t, tk, has_k);
    rc.b[QO] = make_output(e, &c, &in, &rc, QO, !c.sane && fz_pick(&in, 16) == 15 ? tk : t, rc.p.n_heads);
    if (rc.b[KI] || (!c.sane && fz_pick(&in, 16) == 15))
        rc.b[KO] = make_output(e, &c, &in, &rc, KO, tk, rc.p.n_k_heads);
    static const lmk_dtype pts[] = {LMK_I32, LMK_I32, LMK_U32, LMK_I64};
    const lmk_dtype pt = !c.sane && fz_pick(&in, 16) == 15 ? (lmk_dtype)fz_pick(&in, LMK_DTYPE_COUNT) : pts[fz_pick(&in, 4)];
    size_t n_pos = (multi(rc.p.mode) ? 4 : 1) * (size_t)rc.p.seq_len;
    rc.b[POS] = fz_make_buffer(e, &c, &in, pt, n_pos > FZ_BUF_CAP / 8 ? 8 : n_pos);
    if (fz_pick(&in, 4) == 0)
        rc.b[FF] = fz_make_buffer(e, &c, &in, !c.sane && fz_pick(&in, 8) == 7 ? LMK_F16 : LMK_F32,
                                  rc.p.rope_dim / 2 + fz_pick(&in, 3) > FZ_BUF_CAP / 4 ? 4
                                                                                       : rc.p.rope_dim / 2 + fz_pick(&in, 3));
    rc.s = !c.sane && fz_pick(&in, 64) == 63 ? NULL : e->stream;
    rc.pp = !c.sane && fz_pick(&in, 64) == 63 ? NULL : &rc.p;

    /* Filled in order (overlapping operands see the last writer), then the snapshot. */
    fz_fill_regions(&c);
    lmk_tensor3 tt[N_OPS] = {{0}};
    const bool rules = rules_valid(&rc, tt);
    if (rules) {
        fill_tensor(&c, &in, &tt[QI], t);
        fill_tensor(&c, &in, &tt[KI], t);
    }
    fill_pos_ff(&c, &in, &rc);
    fz_world_snapshot(&c.world);
    fz_marks mk;
    fz_marks_init(&mk, &c.world);
    const int verdict = rules ? overlap_verdict(&rc, tt, &c.world, &mk) : INVALID;

    lmk_clear_error();
    const long allocs_before = atomic_load(&fz_n_allocs);
    const lmk_status st = call(&rc);
    if (st == LMK_OK)
        FZ_CHECK(lmk_stream_sync(rc.s) == LMK_OK, "lmk_stream_sync after a valid rope");
    FZ_CHECK(atomic_load(&fz_n_allocs) == allocs_before, "rope allocated %ld times",
             atomic_load(&fz_n_allocs) - allocs_before);
    fz_stat("inputs");
    if (rc.group[QI])
        fz_stat("calls on a packed QKV buffer");

    if (st == LMK_ERR_UNSUPPORTED && verdict != INVALID) {
        fz_stat("valid calls the CPU does not support yet");
        FZ_CHECK(fz_world_changed(&c.world, NULL, NULL, 0) == NULL, "an unsupported rope changed a byte");
    } else if (verdict == VALID || (verdict == EITHER && st == LMK_OK)) {
        FZ_CHECK(st == LMK_OK, "valid rope (mode %d, head_dim %u, rope_dim %u, heads %u/%u, seq %u, %s) returned %s",
                 (int)rc.p.mode, rc.p.head_dim, rc.p.rope_dim, rc.p.n_heads, rc.p.n_k_heads, rc.p.seq_len,
                 lmk_dtype_name(t), lmk_status_name(st));
        check_valid(&c, &in, &rc, tt, &mk);
        if (verdict == EITHER)
            fz_stat("valid calls on layouts lmk may reject, accepted");
    } else {
        fz_stat(verdict == EITHER ? "calls on layouts lmk may reject, rejected" : "invalid calls");
        FZ_CHECK(st == LMK_ERR_INVALID_ARGUMENT,
                 "invalid rope (mode %d, head_dim %u, rope_dim %u, heads %u/%u, seq %u, base %g) returned %s",
                 (int)rc.p.mode, rc.p.head_dim, rc.p.rope_dim, rc.p.n_heads, rc.p.n_k_heads, rc.p.seq_len,
                 (double)rc.p.freq_base, lmk_status_name(st));
        FZ_CHECK(fz_message_names("rope"), "message \"%s\" does not name rope", lmk_last_error());
        FZ_CHECK(fz_world_changed(&c.world, NULL, NULL, 0) == NULL, "a rejected rope changed a byte");
    }
    fz_marks_free(&mk);
    fz_call_end(&c, live_before);
    return 0;
}
