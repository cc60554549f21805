/*
 * fuzz_rope_multi.c - libFuzzer harness for lmk_rope_multi and the fused lmk_rope_multi_qk.
 *
 * One input is one call of either entry. Parameters: realistic shapes most of the time, and wild
 * ones (0, odd, rope_dim > head_dim, huge) otherwise; freq_base from NaN, +-inf, 0, -1, denormals,
 * tiny and huge values; unknown modes and pairings; huge sections (they must not overflow); wrong
 * element counts; positions of the wrong dtype or length and with extreme values (INT32_MIN/MAX);
 * outputs in place, at the same offset through another view, or partially overlapping the input,
 * the positions or the other tensor of the fused call. An oracle written from lmk.h decides whether
 * the call is valid. Then:
 *   valid:   LMK_OK; copied elements equal the input bit for bit; rotated elements are within
 *            lmk.h's tolerance of the float64 reference when every |x| <= 2 and the largest angle
 *            is at most 2^20 (|pos| <= 2^20 with freq_base >= 1); otherwise the call must only be
 *            deterministic (a second run gives the same bits). No byte outside the outputs changes.
 *   invalid: LMK_ERR_INVALID_ARGUMENT, a message naming "rope_multi", and no byte changed;
 *   always:  no heap allocation inside the call, no leak after freeing the call's buffers.
 */
#include "fuzz_common.h"

#include <float.h>

typedef struct rope_case {
    lmk_rope_multi_params p;
    bool qk;
    uint32_t n_k_heads;
    lmk_buffer *q_in, *q_out, *k_in, *k_out, *pos;
    lmk_stream *s;
    const lmk_rope_multi_params *pp;
} rope_case;

static bool params_valid(const lmk_rope_multi_params *p)
{
    if (!p->head_dim || !p->rope_dim || !p->n_heads || !p->seq_len)
        return false;
    if (p->head_dim % 2 || p->rope_dim % 2 || p->rope_dim > p->head_dim)
        return false;
    if (!isfinite(p->freq_base) || !(p->freq_base > 0))
        return false;
    if (p->mode != LMK_ROPE_MROPE && p->mode != LMK_ROPE_IMROPE)
        return false;
    return p->pairing == LMK_ROPE_PAIR_HALF_ROPE || p->pairing == LMK_ROPE_PAIR_HALF_HEAD;
}

static bool tensor_valid(const rope_case *c, uint32_t n_heads, const lmk_buffer *in, const lmk_buffer *out)
{
    const lmk_rope_multi_params *p = c->pp;
    size_t elems;
    if (__builtin_mul_overflow((size_t)p->seq_len * n_heads, p->head_dim, &elems))
        return false;
    if (lmk_buffer_element_count(in) != elems || lmk_buffer_element_count(out) != elems)
        return false;
    const lmk_dtype t = lmk_buffer_dtype(in);
    if (t != lmk_buffer_dtype(out) || (t != LMK_F32 && t != LMK_BF16 && t != LMK_F16))
        return false;
    if (lmk_buffer_element_count(c->pos) != 4 * (size_t)p->seq_len)
        return false;
    return lmk_buffer_dtype(c->pos) == LMK_I32 || lmk_buffer_dtype(c->pos) == LMK_U32;
}

/* An output may be its own input exactly (same address); any other shared byte is an error. */
static bool output_clear(const lmk_buffer *out, const lmk_buffer *own_in, const lmk_buffer *const *others, int n)
{
    if (lmk_buffer_data(out) != lmk_buffer_data(own_in) && fz_overlap(out, fz_used(out), own_in, fz_used(own_in)))
        return false;
    for (int i = 0; i < n; i++)
        if (fz_overlap(out, fz_used(out), others[i], fz_used(others[i])))
            return false;
    return true;
}

/* lmk.h's contract: whether the call is valid. Inputs (and the positions) may share bytes, since
 * they are only read; an output may share none with another operand, except that it may be its
 * own input exactly (in place). */
static bool rope_valid(const rope_case *c)
{
    if (!c->s || !c->q_in || !c->q_out || !c->pos || !c->pp)
        return false;
    if (c->qk && (!c->k_in || !c->k_out || c->n_k_heads == 0))
        return false;
    if (!params_valid(c->pp) || !tensor_valid(c, c->pp->n_heads, c->q_in, c->q_out))
        return false;
    const lmk_device *d = lmk_stream_device(c->s);
    if (lmk_buffer_device(c->q_in) != d || lmk_buffer_device(c->q_out) != d || lmk_buffer_device(c->pos) != d)
        return false;
    if (!c->qk) {
        const lmk_buffer *others[] = {c->pos};
        return output_clear(c->q_out, c->q_in, others, 1);
    }
    if (!tensor_valid(c, c->n_k_heads, c->k_in, c->k_out))
        return false;
    if (lmk_buffer_dtype(c->q_in) != lmk_buffer_dtype(c->k_in))
        return false;
    if (lmk_buffer_device(c->k_in) != d || lmk_buffer_device(c->k_out) != d)
        return false;
    const lmk_buffer *q_others[] = {c->k_in, c->k_out, c->pos};
    const lmk_buffer *k_others[] = {c->q_in, c->q_out, c->pos};
    return output_clear(c->q_out, c->q_in, q_others, 3) && output_clear(c->k_out, c->k_in, k_others, 3);
}

static float pick_base(fz_in *in)
{
    static const float bases[] = {1e4f, 1e6f, 1e7f, 5e6f, 1e4f, 2.0f, 1.0f, 10.0f, 0.5f, 1e-30f, FLT_MAX, 0.0f,
                                  -0.0f, -1.0f, 1e-45f, FLT_MIN, 0};
    const unsigned i = fz_pick(in, sizeof bases / sizeof bases[0] + 4);
    if (i < sizeof bases / sizeof bases[0] - 1)
        return bases[i];
    switch (i - (sizeof bases / sizeof bases[0] - 1)) {
    case 0:
        return NAN;
    case 1:
        return INFINITY;
    case 2:
        return -INFINITY;
    case 3:
        return (float)(1 + fz_u16(in));
    default:
        return fz_f32_bits(fz_u32(in));
    }
}

static void pick_params(fz_in *in, bool sane, lmk_rope_multi_params *p, uint32_t *n_k_heads)
{
    static const uint32_t head_dims[] = {2, 4, 8, 16, 32, 64, 128, 256};
    if (sane || fz_pick(in, 4) != 3) { /* realistic: valid dimensions that fit the buffer cap */
        p->head_dim = fz_pick(in, 2) ? head_dims[fz_pick(in, 8)] : 2 * (1 + fz_pick(in, 80));
        p->rope_dim = fz_pick(in, 3) == 0 ? p->head_dim : 2 * (1 + fz_pick(in, p->head_dim / 2));
        const uint32_t rows = (uint32_t)(FZ_BUF_CAP / 4 / p->head_dim);
        p->seq_len = 1 + fz_pick(in, rows < 8 ? rows : 8);
        const uint32_t max_heads = rows / p->seq_len ? rows / p->seq_len : 1;
        p->n_heads = 1 + fz_pick(in, max_heads < 8 ? max_heads : 8);
        *n_k_heads = 1 + fz_pick(in, max_heads < 4 ? max_heads : 4);
    } else { /* wild */
        p->head_dim = fz_dim(in);
        p->rope_dim = fz_pick(in, 2) ? fz_dim(in) : p->head_dim + 2 * fz_pick(in, 3);
        p->n_heads = fz_dim(in);
        p->seq_len = fz_dim(in);
        *n_k_heads = fz_dim(in);
    }
    p->freq_base = pick_base(in);
    if (sane && !(isfinite(p->freq_base) && p->freq_base > 0))
        p->freq_base = 1e4f;
    switch (sane ? 0 : fz_pick(in, 12)) {
    case 9:
        p->mode = (lmk_rope_mode)0;
        break;
    case 10:
        p->mode = (lmk_rope_mode)(int32_t)fz_u32(in);
        break;
    case 11:
        p->mode = (lmk_rope_mode)-1;
        break;
    default:
        p->mode = fz_pick(in, 2) ? LMK_ROPE_IMROPE : LMK_ROPE_MROPE;
        break;
    }
    for (int i = 0; i < 4; i++)
        switch (fz_pick(in, 8)) {
        case 0:
            p->sections[i] = UINT32_MAX - fz_pick(in, 3);
            break;
        case 1:
            p->sections[i] = fz_u32(in);
            break;
        case 2:
            p->sections[i] = 0;
            break;
        default:
            p->sections[i] = fz_pick(in, 40);
            break;
        }
    switch (sane ? 0 : fz_pick(in, 12)) {
    case 10:
        p->pairing = (lmk_rope_pairing)(2 + fz_pick(in, 100));
        break;
    case 11:
        p->pairing = (lmk_rope_pairing)-1;
        break;
    default:
        p->pairing = fz_pick(in, 2) ? LMK_ROPE_PAIR_HALF_HEAD : LMK_ROPE_PAIR_HALF_ROPE;
        break;
    }
}

static size_t elems_of(uint32_t seq, uint32_t heads, uint32_t head_dim)
{
    size_t n;
    if (__builtin_mul_overflow((size_t)seq * heads, head_dim, &n) || n > FZ_BUF_CAP)
        return 6;
    return n;
}

static lmk_dtype pick_dtype(fz_in *in, bool sane)
{
    static const lmk_dtype t[] = {LMK_F32, LMK_F32, LMK_BF16, LMK_F16};
    return !sane && fz_pick(in, 16) == 15 ? (lmk_dtype)fz_pick(in, LMK_DTYPE_COUNT) : t[fz_pick(in, 4)];
}

/* An output for `in`: in place (same handle or another view at the same address), or its own. */
static lmk_buffer *make_output(fz_env *e, fz_call *c, fz_in *in, unsigned how, lmk_buffer *input, lmk_dtype t,
                               size_t elems)
{
    if (input && how == 1)
        return input;
    if (input && how == 2 && fz_world_find(&c->world, lmk_buffer_data(input)) &&
        fz_in_range(lmk_buffer_data(input), e->arena, FZ_ARENA_BYTES)) {
        lmk_buffer *b = NULL;
        const size_t shape[1] = {lmk_buffer_element_count(input)};
        const size_t off = (size_t)((unsigned char *)lmk_buffer_data(input) - e->arena);
        if (lmk_buffer_view(e->parent, off, lmk_buffer_dtype(input), shape, 1, &b) == LMK_OK) {
            fz_call_keep(c, b);
            return b;
        }
    }
    return fz_make_buffer(e, c, in, t, elems);
}

/* Input values: mostly |x| <= 2, sometimes specials (NaN, inf, -0, denormals, huge) or raw bits. */
static void fill_values(fz_call *c, fz_in *in, lmk_buffer *b)
{
    if (!b)
        return;
    const lmk_dtype t = lmk_buffer_dtype(b);
    if (t != LMK_F32 && t != LMK_BF16 && t != LMK_F16)
        return;
    static const float specials[] = {NAN, INFINITY, -INFINITY, -0.0f, 1e-40f, 3e38f, 65504.0f, 1e5f};
    const unsigned cls = fz_pick(in, 8);
    const size_t n = lmk_buffer_element_count(b);
    unsigned char *d = lmk_buffer_data(b);
    for (size_t i = 0; i < n; i++) {
        float v;
        uint32_t bits = (uint32_t)tst_rng_u64(&c->rng);
        if (cls == 6) {
            v = fz_f32_bits(bits);
        } else if (cls == 5 && (bits & 15) == 0) {
            v = specials[(bits >> 4) % 8];
        } else if (cls == 7) {
            v = fz_rand_sym(&c->rng, 1e4f);
        } else {
            v = fz_rand_sym(&c->rng, 2.0f);
        }
        if (t == LMK_F32) {
            memcpy(d + 4 * i, &v, 4);
        } else {
            const uint16_t h = cls == 6 ? (uint16_t)bits : t == LMK_BF16 ? lmk_f32_to_bf16(v) : lmk_f32_to_f16(v);
            memcpy(d + 2 * i, &h, 2);
        }
    }
}

/* Positions: text positions, random ones up to 2^20, extremes (INT32_MIN/MAX) or raw bits. */
static void fill_positions(fz_call *c, fz_in *in, lmk_buffer *b, uint32_t seq_len)
{
    if (!b || (lmk_buffer_dtype(b) != LMK_I32 && lmk_buffer_dtype(b) != LMK_U32))
        return;
    static const int32_t extremes[] = {INT32_MIN, INT32_MAX, 0, -1, 1 << 20, -(1 << 20), 1 << 24, INT32_MIN + 1};
    const unsigned cls = fz_pick(in, 8);
    const int32_t base = (int32_t)fz_pick(in, 200) * (fz_pick(in, 2) ? 1 : 5000);
    const size_t n = lmk_buffer_element_count(b);
    int32_t *d = lmk_buffer_data(b);
    for (size_t i = 0; i < n; i++) {
        const uint64_t r = tst_rng_u64(&c->rng);
        int32_t v;
        switch (cls) {
        case 4:
            v = (int32_t)(r % (2u << 20)) - (1 << 20);
            break;
        case 5:
            v = (r & 3) ? (int32_t)(r % 1000) : extremes[(r >> 2) % 8];
            break;
        case 6:
            v = (int32_t)(uint32_t)r;
            break;
        case 7:
            v = (int32_t)(r % 65536);
            break;
        default:
            v = base + (int32_t)(seq_len ? i % seq_len : i);
            break;
        }
        d[i] = v;
    }
}

static lmk_status call(const rope_case *rc)
{
    if (rc->qk)
        return lmk_rope_multi_qk(rc->s, rc->q_in, rc->q_out, rc->k_in, rc->k_out, rc->pos, rc->pp, rc->n_k_heads);
    return lmk_rope_multi(rc->s, rc->q_in, rc->q_out, rc->pos, rc->pp);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in in = {data, size};
    fz_env *e = fz_env_get();
    const long live_before = atomic_load(&fz_n_live);
    fz_call c = {.rng = tst_rng_make(fz_u32(&in))};
    c.sane = fz_pick(&in, 2) == 0;
    rope_case rc = {0};
    rc.qk = fz_pick(&in, 3) == 2;
    const unsigned q_out_how = fz_pick(&in, 4), k_out_how = fz_pick(&in, 4); /* 1: same handle, 2: same address */

    pick_params(&in, c.sane, &rc.p, &rc.n_k_heads);
    const lmk_dtype t = pick_dtype(&in, c.sane);
    const lmk_dtype t_out = !c.sane && fz_pick(&in, 16) == 15 ? pick_dtype(&in, false) : t;
    const lmk_dtype t_k = !c.sane && fz_pick(&in, 16) == 15 ? pick_dtype(&in, false) : t;
    const lmk_dtype t_pos = !c.sane && fz_pick(&in, 16) == 15 ? (lmk_dtype)fz_pick(&in, LMK_DTYPE_COUNT)
                                                              : fz_pick(&in, 4) ? LMK_I32 : LMK_U32;
    const size_t q_elems = elems_of(rc.p.seq_len, rc.p.n_heads, rc.p.head_dim);
    const size_t k_elems = elems_of(rc.p.seq_len, rc.n_k_heads, rc.p.head_dim);
    size_t pos_elems = 4 * (size_t)rc.p.seq_len;
    if (pos_elems > FZ_BUF_CAP / 4)
        pos_elems = 8;

    rc.q_in = fz_make_buffer(e, &c, &in, t, q_elems);
    rc.q_out = make_output(e, &c, &in, q_out_how, rc.q_in, t_out, q_elems);
    if (rc.qk) {
        rc.k_in = fz_make_buffer(e, &c, &in, t_k, k_elems);
        rc.k_out = make_output(e, &c, &in, k_out_how, rc.k_in, t_k, k_elems);
    }
    rc.pos = fz_make_buffer(e, &c, &in, t_pos, pos_elems);
    rc.s = !c.sane && fz_pick(&in, 64) == 63 ? NULL : e->stream;
    rc.pp = !c.sane && fz_pick(&in, 64) == 63 ? NULL : &rc.p;

    /* Everything is filled in order, so overlapping operands see the last writer's values; the
     * snapshot after filling is what the call must start from. */
    fz_fill_regions(&c);
    fill_values(&c, &in, rc.q_in);
    if (rc.qk)
        fill_values(&c, &in, rc.k_in);
    fill_positions(&c, &in, rc.pos, rc.p.seq_len);
    fz_world_snapshot(&c.world);
    const bool valid = rope_valid(&rc);

    lmk_clear_error();
    const long allocs_before = atomic_load(&fz_n_allocs);
    const lmk_status st = call(&rc);
    if (st == LMK_OK)
        FZ_CHECK(lmk_stream_sync(rc.s) == LMK_OK, "lmk_stream_sync after a valid rope_multi");
    FZ_CHECK(atomic_load(&fz_n_allocs) == allocs_before, "rope_multi allocated %ld times",
             atomic_load(&fz_n_allocs) - allocs_before);
    const lmk_rope_multi_params *p = &rc.p;
    fz_stat("inputs");
    fz_stat(rc.qk ? "qk" : "single");

    if (!valid) {
        fz_stat("invalid calls");
        FZ_CHECK(st == LMK_ERR_INVALID_ARGUMENT,
                 "invalid rope_multi%s(head_dim %u, rope_dim %u, n_heads %u, seq %u, base %g, mode %d, pairing %d) "
                 "returned %s", rc.qk ? "_qk" : "", p->head_dim, p->rope_dim, p->n_heads, p->seq_len,
                 (double)p->freq_base, (int)p->mode, (int)p->pairing, lmk_status_name(st));
        FZ_CHECK(fz_message_names(rc.qk ? "rope_multi_qk" : "rope_multi"), "message \"%s\" does not name the op",
                 lmk_last_error());
        FZ_CHECK(fz_world_changed(&c.world, NULL, NULL, 0) == NULL, "a rejected rope_multi changed a byte");
        fz_call_end(&c, live_before);
        return 0;
    }
    FZ_CHECK(st == LMK_OK,
             "valid rope_multi%s(head_dim %u, rope_dim %u, n_heads %u, n_k_heads %u, seq %u, base %g, mode %d, "
             "pairing %d, %s) returned %s", rc.qk ? "_qk" : "", p->head_dim, p->rope_dim, p->n_heads, rc.n_k_heads,
             p->seq_len, (double)p->freq_base, (int)p->mode, (int)p->pairing, lmk_dtype_name(t), lmk_status_name(st));

    /* The reference over the snapshot (the test kit's comparison: copies bit for bit, rotated
     * elements within the contract when `precise`). */
    const int32_t *pos = fz_world_before(&c.world, lmk_buffer_data(rc.pos));
    const lmk_rope_args a =
        tst_rope_host_args(p, rc.qk ? rc.n_k_heads : 0, rc.qk ? 2 : 1, t,
                           fz_world_before(&c.world, lmk_buffer_data(rc.q_in)),
                           rc.qk ? fz_world_before(&c.world, lmk_buffer_data(rc.k_in)) : NULL, pos);
    lmk_buffer *outs[2] = {rc.q_out, rc.k_out};
    /* The precision promise's domain, measured on what the call read (operands may share bytes). */
    bool small = true;
    for (int i = 0; i < a.n_tensors; i++)
        for (size_t j = 0; j < lmk_buffer_element_count(outs[i]); j++)
            small = small && fabs(tst_load(t, a.t[i].in, j)) <= 2.0;
    double max_pos = 0;
    for (size_t j = 0; j < 4 * (size_t)p->seq_len; j++)
        max_pos = fmax(max_pos, fabs((double)pos[j]));
    const double max_angle = max_pos * (p->freq_base >= 1.0f ? 1.0 : 1.0 / (double)p->freq_base);
    const bool precise = small && max_angle <= 1048576.0;
    fz_stat("valid calls");
    if (precise)
        fz_stat("valid calls checked against the tolerance");
    if (lmk_buffer_data(rc.q_in) == lmk_buffer_data(rc.q_out) ||
        (rc.qk && lmk_buffer_data(rc.k_in) == lmk_buffer_data(rc.k_out)))
        fz_stat("valid calls in place");
    if (rc.qk && fz_overlap(rc.q_in, fz_used(rc.q_in), rc.k_in, fz_used(rc.k_in)))
        fz_stat("valid qk calls whose inputs overlap");
    const void *got[2] = {lmk_buffer_data(rc.q_out), rc.qk ? lmk_buffer_data(rc.k_out) : NULL};
    tst_result res;
    FZ_CHECK(tst_rope_verify(&a, got, precise, &res),
             "rope_multi%s(head_dim %u, rope_dim %u, seq %u, base %g, mode %d, sections [%u,%u,%u,%u], pairing %d, "
             "%s): %s",
             rc.qk ? "_qk" : "", p->head_dim, p->rope_dim, p->seq_len, (double)p->freq_base, (int)p->mode,
             p->sections[0], p->sections[1], p->sections[2], p->sections[3], (int)p->pairing, lmk_dtype_name(t),
             res.msg);
    const void *skip[2] = {lmk_buffer_data(rc.q_out), rc.qk ? lmk_buffer_data(rc.k_out) : NULL};
    const size_t skip_len[2] = {fz_used(rc.q_out), rc.qk ? fz_used(rc.k_out) : 0};
    FZ_CHECK(fz_world_changed(&c.world, skip, skip_len, 2) == NULL, "rope_multi wrote outside its outputs");

    /* Determinism: where precision is not promised, a second run must give the same bits. */
    if (!precise || fz_pick(&in, 8) == 7) {
        unsigned char *first[2] = {NULL, NULL};
        for (int i = 0; i < a.n_tensors; i++) {
            first[i] = malloc(skip_len[i] + 1);
            FZ_CHECK(first[i] != NULL, "harness: out of memory");
            memcpy(first[i], skip[i], skip_len[i]);
        }
        fz_stat("valid calls checked for determinism");
        fz_world_restore(&c.world);
        FZ_CHECK(call(&rc) == LMK_OK && lmk_stream_sync(rc.s) == LMK_OK, "second run of a valid rope_multi failed");
        for (int i = 0; i < a.n_tensors; i++) {
            FZ_CHECK(memcmp(first[i], skip[i], skip_len[i]) == 0, "rope_multi is not deterministic (%s)",
                     i ? "k" : "q");
            free(first[i]);
        }
    }
    fz_call_end(&c, live_before);
    return 0;
}
