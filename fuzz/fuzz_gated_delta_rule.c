/*
 * fuzz_gated_delta_rule.c - libFuzzer harness for lmk_gated_delta_rule (lmk.h "gated_delta_rule"):
 * the gates, the L2 norm, the delta-rule recurrence over a state pool and the gated output norm of
 * the Gated DeltaNet layers, over sequences packed along T.
 *
 * One input is one call, read from the input's bytes and then from a stream seeded by their hash
 * (so that short inputs make rich calls too), on a CPU device capped at the scalar level, at AVX2,
 * or at the best level. Parameters: small valid ones (T up to 64, Hk up to 4, Hv = Hk * 1..4,
 * k_dim and v_dim up to 32, both head maps, scale 0 or given, the L2 norm on or off, raw gates or
 * g and beta, the gated norm or none, weight_offset 0 or 1; one call in eight with heads of 16-32
 * square, 64-256 sequences and a state, large enough for the worker pool's head split), or wild
 * ones (0, huge, k_dim 257, Hv not a multiple of Hk, unknown head_map and flags, NaN/inf scale,
 * eps and weight_offset).
 * Operands: q, k and v as slices of one packed row (the convolution's output), dense in any
 * declared shape of the right count, padded or with loose head and token strides (a head stride 0
 * broadcasts one head), q and k the same buffer, made every way fuzz_common.h offers (allocations,
 * wraps, views of the shared arena, so operands may overlap, views inside allocations, wrong
 * counts, another device, NULL); a and b dense or views of one packed [T, 2*Hv] projection; z the
 * second half of [T, Hv, 2*dv] rows; out dense, padded, beside v in the packed row, or over q,
 * v, z or the state (must be rejected); a state pool [n_slots, Hv, dk, dv] f32 or bf16, dv fastest
 * or dk fastest, padded, in any nesting order or with loose (possibly overlapping) strides, in an
 * allocation of its own or in the arena; cu_seqlens and state_slots i32 or i64. Hostile device
 * data: cu_seqlens valid (empty sequences, decode batches), perturbed (non-monotone, c0 != 0, past
 * T) or wild (negative, INT_MIN, INT64_MIN, 2^32 + small); slots distinct, duplicated, or padding
 * (-1, n_slots, huge, INT_MIN, INT64_MIN, values whose low 32 bits name a row). Inputs meant to be
 * invalid break one to three rules on top.
 *
 * An oracle written from lmk.h (not from op.c) decides: valid, invalid, or "may reject" (lmk.h
 * lets lmk reject a layout it cannot prove disjoint: extents that meet without shared bytes,
 * other than tensors side by side in one row, and state pools, whose overlap lmk judges on
 * extents). Then:
 *   valid:   LMK_OK. The results are compared with lmk_ref_gated_delta_rule run over the snapshot
 *            with lmk_gdn_args built from the same buffers. With a valid cu_seqlens (0 = c0 <= ...
 *            <= cn = T) and inputs in the domain of the contract (finite, bounded, decays <= 1,
 *            without the L2 norm keys of norm <= 1): every out row of every (token, head) and every
 *            stored state row of every head within lmk.h's norm-wise precision (1e-4 relative for
 *            f32 inputs and an f32 or no state, else 4e-3) plus the norm of one ulp of the stored
 *            dtype per element (the call's rounding and the reference's), a row formed by
 *            cancellation within that tolerance of the magnitude of its terms ("the condition of a
 *            row" below); pool rows that no sequence stores, or whose storing sequence is empty,
 *            keep their bytes. With a hostile cu_seqlens (unspecified outputs) only the out
 *            elements and the pool rows some sequence names may change. Every other byte anywhere
 *            is unchanged. A rerun from the snapshot on a stream of another thread count gives the
 *            same bytes (lmk.h).
 *   invalid: LMK_ERR_INVALID_ARGUMENT, a message naming gated_delta_rule, and no byte changed;
 *   always:  no crash, no heap allocation inside the call, no leak after freeing the buffers.
 */
#include "fuzz_common.h"
#include "ops/gated_delta_rule/gated_delta_rule.h"
#include "ops/varlen.h"

#include <float.h>

enum { Q, K, V, A, B, A_LOG, DT_BIAS, CU, SLOTS, STATE, Z, NORM_W, OUT, N_OPS };
static const char *const k_names[N_OPS] = {"q", "k", "v", "a", "b", "A_log", "dt_bias", "cu_seqlens",
                                           "state_slots", "state", "z", "norm_w", "out"};
enum { VALID, INVALID, MAY_REJECT };
enum { CU_VALID, CU_PERTURBED, CU_WILD };                 /* what cu_seqlens is filled with */
enum { SLOTS_DISTINCT, SLOTS_DUPLICATE, SLOTS_PADDING };  /* what state_slots is filled with */

#define GD_BYTES 512               /* bytes one call is read from (the input, then its hash's stream) */
#define GD_MAX_T 64
#define GD_ARENA_BUDGET (40u << 10) /* q, k, v, z, out, a, b together, so the rest fits beside them */

/* ---- one call ---- */

typedef struct gd_call {
    lmk_gdn_params p;
    bool null_p, null_io;
    lmk_stream *s;
    fz_env *e;
    lmk_buffer *op[N_OPS];
    size_t bump;                 /* next free byte of the arena */
    size_t T, Hk, Hv, dk, dv;    /* the sizes the operands were built for (the params may be wild) */
    unsigned cu_fill, slot_fill, seq_mode;
    bool packed;                 /* q, k and v slices of one packed row */
    bool big;                    /* sized for the worker pool */
} gd_call;

/* Room for more buffers and regions (fz_call holds FZ_MAX_BUFS and FZ_MAX_REGIONS). */
static bool room(const fz_call *fc)
{
    return fc->n_bufs < FZ_MAX_BUFS - 4 && fc->world.n < FZ_MAX_REGIONS - 3;
}

/* `bytes` of the arena after the last placed operand, at a 64-byte boundary plus a random gap
 * (and now and then a start that is only element-aligned); SIZE_MAX when full. */
static size_t place(fz_in *in, gd_call *c, size_t bytes, size_t es)
{
    size_t off = (c->bump + 63) / 64 * 64 + 64 * fz_pick(in, 3);
    if (fz_pick(in, 4) == 0)
        off += es * (1 + fz_pick(in, 7));
    if (bytes > FZ_ARENA_BYTES || off > FZ_ARENA_BYTES - bytes)
        return SIZE_MAX;
    c->bump = off + bytes;
    return off;
}

/* A view of the call's arena at byte `off` (strides NULL: dense). */
static lmk_buffer *arena_view(fz_call *fc, const gd_call *c, size_t off, lmk_dtype t, int nd, const size_t *shape,
                              const size_t *strides)
{
    if (!room(fc))
        return NULL;
    lmk_buffer *b = NULL;
    const lmk_status st = strides ? lmk_buffer_view_strided(c->e->parent, off, t, shape, strides, nd, &b)
                                  : lmk_buffer_view(c->e->parent, off, t, shape, nd, &b);
    FZ_CHECK(st == LMK_OK, "harness: arena view at %zu (%s, %d-D) failed: %s", off, lmk_dtype_name(t), nd,
             lmk_last_error());
    fz_call_keep(fc, b);
    fz_world_add(&fc->world, c->e->arena, FZ_ARENA_BYTES);
    return b;
}

/* A dense operand of a*b*d elements, declared [a*b*d], [a, b*d], [a, b, d] or [b, a, d]: lmk.h
 * counts a dense buffer's elements whatever its shape. */
static lmk_buffer *dense3(fz_in *in, fz_call *fc, gd_call *c, lmk_dtype t, size_t a, size_t b, size_t d)
{
    const size_t es = lmk_dtype_size(t), off = place(in, c, a * b * d * es, es);
    if (off == SIZE_MAX)
        return NULL;
    size_t shape[3] = {a, b, d};
    switch (fz_pick(in, 5)) {
    case 0:
        shape[0] = a * b * d;
        return arena_view(fc, c, off, t, 1, shape, NULL);
    case 1:
        shape[1] = b * d;
        return arena_view(fc, c, off, t, 2, shape, NULL);
    case 2:
        shape[0] = b, shape[1] = a;
        return arena_view(fc, c, off, t, 3, shape, NULL);
    default:
        return arena_view(fc, c, off, t, 3, shape, NULL);
    }
}

/* A [n0, n1, n2] view with strides {s0, s1, 1} at arena byte off (n1 1 and 2-D when two_d). */
static lmk_buffer *view3(fz_call *fc, gd_call *c, size_t off, lmk_dtype t, const size_t n[3], size_t s0, size_t s1,
                         bool two_d)
{
    if (two_d) {
        const size_t shape[2] = {n[0], n[2]}, strides[2] = {s0, 1};
        return arena_view(fc, c, off, t, 2, shape, strides);
    }
    const size_t strides[3] = {s0, s1, 1};
    return arena_view(fc, c, off, t, 3, n, strides);
}

/* A [n0, n1, n2] view placed on its own with strides {s0, s1, 1}. */
static lmk_buffer *strided3(fz_in *in, fz_call *fc, gd_call *c, lmk_dtype t, const size_t n[3], size_t s0, size_t s1,
                            bool two_d)
{
    const size_t es = lmk_dtype_size(t);
    const size_t off = place(in, c, ((n[0] - 1) * s0 + (n[1] - 1) * s1 + n[2]) * es, es);
    return off == SIZE_MAX ? NULL : view3(fc, c, off, t, n, s0, s1, two_d);
}

/* A buffer made by fz_make_buffer (any way, any count when not sane), or a dense one when the
 * call's tables are nearly full or the buffer would exceed FZ_BUF_CAP. */
static lmk_buffer *made(fz_in *in, fz_call *fc, gd_call *c, lmk_dtype t, size_t elems)
{
    if (!room(fc) || fc->n_bufs > FZ_MAX_BUFS - 8 || elems * lmk_dtype_size(t) > FZ_BUF_CAP)
        return dense3(in, fc, c, t, elems, 1, 1);
    return fz_make_buffer(c->e, fc, in, t, elems);
}

/* The arena offset of b's first element, or SIZE_MAX when b lives elsewhere. */
static size_t arena_off(const gd_call *c, const lmk_buffer *b)
{
    const uintptr_t p = (uintptr_t)lmk_buffer_data(b), a = (uintptr_t)c->e->arena;
    return b && p >= a && p < a + FZ_ARENA_BYTES ? (size_t)(p - a) : SIZE_MAX;
}

/* ---- the operands of a call ---- */

static const lmk_dtype k_floats[3] = {LMK_F32, LMK_BF16, LMK_F16};

/* Head and token strides that may overlap heads (0: one head read for all) or leave gaps. */
static void loose_strides(fz_in *in, size_t H, size_t d, size_t *ts, size_t *hs)
{
    switch (fz_pick(in, 5)) {
    case 0: *hs = 0; break;
    case 1: *hs = d > 1 ? d - 1 : 1; break;
    case 2: *hs = d / 2; break;
    default: *hs = d + fz_pick(in, 4); break;
    }
    const size_t wide = 2 * H * d + 1;
    *ts = fz_pick(in, 4) ? H * (*hs > d ? *hs : d) + fz_pick(in, 3) : fz_pick(in, (unsigned)(wide < 256 ? wide : 256));
}

/* q, k, v (and sometimes out) as slices of one packed row [T, 2*Hk*dk + Hv*dv (+ Hv*dv)]. */
static void build_packed(fz_in *in, fz_call *fc, gd_call *c, lmk_dtype dt)
{
    const size_t T = c->T, hk = c->Hk, hv = c->Hv, dk = c->dk, dv = c->dv, es = lmk_dtype_size(dt);
    const size_t nq[3] = {T, hk, dk}, nv[3] = {T, hv, dv};
    const bool with_out = fz_pick(in, 3) == 0;
    const size_t used = 2 * hk * dk + hv * dv * (with_out ? 2 : 1), row = used + fz_pick(in, 3);
    const size_t off = place(in, c, ((T - 1) * row + used) * es, es);
    if (off == SIZE_MAX)
        return;
    c->op[Q] = view3(fc, c, off, dt, nq, row, dk, false);
    c->op[K] = view3(fc, c, off + hk * dk * es, dt, nq, row, dk, false);
    c->op[V] = view3(fc, c, off + 2 * hk * dk * es, dt, nv, row, dv, false);
    if (with_out)
        c->op[OUT] = view3(fc, c, off + (2 * hk * dk + hv * dv) * es, dt, nv, row, dv, false);
    c->packed = true;
}

/* q, k and v: packed, dense, padded, made every way, q and k one buffer, loose strides. */
static void build_qkv(fz_in *in, fz_call *fc, gd_call *c, lmk_dtype dt)
{
    const size_t T = c->T, hk = c->Hk, hv = c->Hv, dk = c->dk, dv = c->dv;
    const size_t nq[3] = {T, hk, dk}, nv[3] = {T, hv, dv};
    const unsigned how = fz_pick(in, 8);
    for (int w = Q; w <= V && how >= 2 && how <= 5; w++) {
        const size_t *n = w == V ? nv : nq, H = n[1], d = n[2];
        size_t hs = d + fz_pick(in, 4), ts = H * hs + fz_pick(in, 5);
        if (how == 3) {
            c->op[w] = made(in, fc, c, dt, T * H * d);
            continue;
        }
        if (how == 4) {
            c->op[w] = w == K ? c->op[Q] : dense3(in, fc, c, dt, T, H, d);
            continue;
        }
        if (how == 5)
            loose_strides(in, H, d, &ts, &hs);
        c->op[w] = strided3(in, fc, c, dt, n, ts, hs, false);
    }
    if (how < 2)
        build_packed(in, fc, c, dt);
    for (int w = Q; w <= V; w++)
        if (!c->op[w])
            c->op[w] = dense3(in, fc, c, dt, T, w == V ? hv : hk, w == V ? dv : dk);
}

/* a and b [T, Hv]: dense (each its own dtype), views of one packed [T, 2*Hv], padded, made. */
static void build_ab(fz_in *in, fz_call *fc, gd_call *c)
{
    const size_t T = c->T, hv = c->Hv, nab[3] = {T, 1, hv};
    const lmk_dtype ta = k_floats[fz_pick(in, 3)], tb = fz_pick(in, 2) ? ta : k_floats[fz_pick(in, 3)];
    const size_t es = lmk_dtype_size(ta);
    switch (fz_pick(in, 5)) {
    case 0:
        if (ta == tb) {
            const size_t off = place(in, c, ((T - 1) * 2 * hv + 2 * hv) * es, es);
            if (off != SIZE_MAX) {
                c->op[A] = view3(fc, c, off, ta, nab, 2 * hv, hv, true);
                c->op[B] = view3(fc, c, off + hv * es, tb, nab, 2 * hv, hv, true);
            }
        }
        break;
    case 1:
        c->op[A] = strided3(in, fc, c, ta, nab, hv + fz_pick(in, 5), hv, true);
        c->op[B] = strided3(in, fc, c, tb, nab, hv + fz_pick(in, 5), hv, true);
        break;
    case 2:
        c->op[A] = made(in, fc, c, ta, T * hv);
        c->op[B] = made(in, fc, c, tb, T * hv);
        break;
    default:
        break;
    }
    if (!c->op[A])
        c->op[A] = dense3(in, fc, c, ta, T, hv, 1);
    if (!c->op[B])
        c->op[B] = dense3(in, fc, c, tb, T, hv, 1);
}

/* A_log and dt_bias (both or neither); z and norm_w (both or neither), z dense or the second
 * half of [T, Hv, 2*dv] rows; out when the packed row has not placed it. */
static void build_rest(fz_in *in, fz_call *fc, gd_call *c, lmk_dtype dt)
{
    const size_t T = c->T, hv = c->Hv, dv = c->dv, nv[3] = {T, hv, dv};
    if (fz_pick(in, 3)) {
        c->op[A_LOG] = dense3(in, fc, c, k_floats[fz_pick(in, 3)], hv, 1, 1);
        c->op[DT_BIAS] = dense3(in, fc, c, k_floats[fz_pick(in, 3)], hv, 1, 1);
    }
    if (fz_pick(in, 2)) {
        const lmk_dtype tz = k_floats[fz_pick(in, 3)];
        const size_t es = lmk_dtype_size(tz);
        if (fz_pick(in, 2)) {
            const size_t off = place(in, c, (T * hv * 2 * dv) * es, es);
            if (off != SIZE_MAX)
                c->op[Z] = view3(fc, c, off + dv * es, tz, nv, hv * 2 * dv, 2 * dv, false);
        }
        if (!c->op[Z])
            c->op[Z] = dense3(in, fc, c, tz, T, hv, dv);
        c->op[NORM_W] = dense3(in, fc, c, k_floats[fz_pick(in, 3)], dv, 1, 1);
    }
    if (c->op[OUT])
        return;
    size_t hs = dv + fz_pick(in, 4), ts = hv * hs + fz_pick(in, 5);
    switch (fz_pick(in, 6)) {
    case 0: c->op[OUT] = strided3(in, fc, c, dt, nv, ts, hs, false); break;
    case 1: c->op[OUT] = made(in, fc, c, dt, T * hv * dv); break;
    case 2:
        loose_strides(in, hv, dv, &ts, &hs);
        c->op[OUT] = strided3(in, fc, c, dt, nv, ts, hs, false);
        break;
    default: c->op[OUT] = dense3(in, fc, c, dt, T, hv, dv); break;
    }
}

/* A strided view of `span` bytes in an allocation of its own (at a small offset), or in the arena. */
static lmk_buffer *own_or_arena(fz_in *in, fz_call *fc, gd_call *c, lmk_dtype t, int nd, const size_t *n,
                                const size_t *st, size_t span)
{
    const size_t es = lmk_dtype_size(t);
    if (fz_pick(in, 4) == 0 || !room(fc)) {
        const size_t off = place(in, c, span, es);
        return off == SIZE_MAX ? NULL : arena_view(fc, c, off, t, nd, n, st);
    }
    lmk_buffer *parent = NULL, *b = NULL;
    const size_t pre = es * fz_pick(in, 4);
    FZ_CHECK(lmk_buffer_alloc(c->e->dev, pre + span + fz_pick(in, 16), LMK_U8, NULL, 0, &parent) == LMK_OK,
             "harness: pool allocation of %zu bytes failed: %s", pre + span, lmk_last_error());
    fz_call_keep(fc, parent);
    fz_world_add(&fc->world, lmk_buffer_data(parent), lmk_buffer_byte_len(parent));
    FZ_CHECK(lmk_buffer_view_strided(parent, pre, t, n, st, nd, &b) == LMK_OK, "harness: pool view failed: %s",
             lmk_last_error());
    fz_call_keep(fc, b);
    return b;
}

/* Strides of a pool of shape n[0..nd): nested in some order of the axes (dense, dv fastest; the
 * last two swapped, dk fastest; any order), each level padded or not; or loose: any strides,
 * overlapping elements included. */
static void pool_strides(fz_in *in, bool sane, const size_t *n, int nd, size_t *st)
{
    int order[4]; /* order[0]: the innermost axis */
    for (int i = 0; i < nd; i++)
        order[i] = nd - 1 - i;
    const unsigned how = fz_pick(in, sane ? 12 : 14);
    if (how < 4) { /* the last two axes swapped */
        const int x = order[0];
        order[0] = order[1], order[1] = x;
    } else if (how < 6) {
        for (int i = nd - 1; i > 0; i--) {
            const unsigned j = fz_pick(in, (unsigned)i + 1);
            const int x = order[i];
            order[i] = order[j], order[j] = x;
        }
    } else if (how >= 11) { /* loose */
        for (int i = 0; i < nd; i++)
            st[i] = fz_pick(in, 4) == 0 ? 0 : fz_pick(in, 64);
        return;
    }
    const bool pad = how == 1 || how == 4 || how == 7 || how == 8;
    size_t reach = 1;
    for (int k = 0; k < nd; k++) {
        const int a = order[k];
        st[a] = reach + (pad && k > 0 && fz_pick(in, 2) ? fz_pick(in, 6) : 0);
        reach = (n[a] ? n[a] - 1 : 0) * st[a] + reach;
    }
}

/* A state pool [rows, Hv, dk, dv] of dtype t. */
static lmk_buffer *make_pool(fz_in *in, fz_call *fc, gd_call *c, lmk_dtype t, const size_t n[4])
{
    size_t st[4];
    pool_strides(in, fc->sane, n, 4, st);
    size_t last = 0;
    for (int i = 0; i < 4; i++)
        last += (n[i] ? n[i] - 1 : 0) * st[i];
    const size_t span = n[0] && n[1] && n[2] && n[3] ? (last + 1) * lmk_dtype_size(t) : 0;
    return own_or_arena(in, fc, c, t, 4, n, st, span);
}

/* cu_seqlens, the state pool and state_slots. seq_mode 0: no cu_seqlens; 1: a few sequences;
 * 2: a decode batch (T one-token sequences, then empty ones); 3: up to 2T + 3 sequences. A big
 * call has 64-256 sequences (most of them empty) and a state. */
static void build_seqs(fz_in *in, fz_call *fc, gd_call *c)
{
    size_t n_seq = 1;
    c->seq_mode = c->big ? 2 + fz_pick(in, 2) : fz_pick(in, 4);
    if (c->seq_mode) {
        n_seq = c->seq_mode == 1 ? 1 + fz_pick(in, 6)
                : c->big         ? 64 + fz_pick(in, 193)
                : c->seq_mode == 2 ? c->T + fz_pick(in, 3) : 1 + fz_pick(in, (unsigned)(2 * c->T + 3));
        c->op[CU] = dense3(in, fc, c, fz_pick(in, 2) ? LMK_I64 : LMK_I32, n_seq + 1, 1, 1);
    }
    const unsigned k = fz_pick(in, 16);
    c->cu_fill = k < 12 ? CU_VALID : k < 14 ? CU_PERTURBED : CU_WILD;
    c->slot_fill = fz_pick(in, 3);
    if (!c->big && fz_pick(in, 4) == 0)
        return;
    const size_t row_bytes = c->Hv * c->dk * c->dv * 4;
    size_t rows = fz_pick(in, 8) == 0 ? 0 : 1 + fz_pick(in, 6);
    if (c->seq_mode >= 2 && fz_pick(in, 2)) { /* a row for every sequence, and rows no sequence names */
        const size_t want = n_seq + fz_pick(in, 3);
        rows = want < 64 ? want : 64;
    }
    while (rows > 1 && rows * row_bytes > ((size_t)512 << 10))
        rows /= 2;
    const size_t n[4] = {rows, c->Hv, c->dk, c->dv};
    c->op[STATE] = make_pool(in, fc, c, fz_pick(in, 2) ? LMK_F32 : LMK_BF16, n);
    if (fz_pick(in, 3))
        c->op[SLOTS] = dense3(in, fc, c, fz_pick(in, 2) ? LMK_I64 : LMK_I32, n_seq, 1, 1);
}

static float wild_float(fz_in *in)
{
    static const float v[] = {NAN, INFINITY, -INFINITY, FLT_MAX, -FLT_MAX, 0.0f, -0.0f, 1e-45f, -1.0f, 1e30f};
    return v[fz_pick(in, 10)];
}

/* Breaks one parameter rule (or, for some values, none: the oracle decides). */
static void wild_param(fz_in *in, lmk_gdn_params *p)
{
    uint32_t *dims[] = {&p->seq_len, &p->n_k_heads, &p->n_v_heads, &p->k_dim, &p->v_dim};
    switch (fz_pick(in, 8)) {
    case 0: *dims[fz_pick(in, 5)] = fz_dim(in); break;
    case 1: *dims[3 + fz_pick(in, 2)] = fz_pick(in, 2) ? 257 : 256 + fz_pick(in, 3); break;
    case 2: p->n_v_heads = p->n_k_heads * (1 + fz_pick(in, 3)) + 1 + fz_pick(in, 2); break;
    case 3: p->head_map = (lmk_repeat_layout)(int32_t)(fz_pick(in, 2) ? fz_u32(in) : 2 + fz_pick(in, 2)); break;
    case 4: p->flags = fz_pick(in, 2) ? fz_u32(in) : 2u << fz_pick(in, 31); break;
    case 5: p->scale = wild_float(in); break;
    case 6: p->norm.eps = wild_float(in); break;
    default: p->norm.weight_offset = wild_float(in); break;
    }
}

/* Parameters; *big: a call large enough for the worker pool (heads of 256 state elements or
 * more, and with build_seqs's many sequences and a state, over the bytes at which
 * lmk_cpu_parallel splits). */
static void pick_params(fz_in *in, bool sane, lmk_gdn_params *p, bool *big)
{
    static const uint32_t dims[] = {1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 24, 31, 32};
    static const float scales[] = {0.0f, 0.0f, 0.5f, -0.25f, 1.0f, 2.0f};
    static const float eps[] = {1e-6f, 1e-5f, 1e-3f, 0.25f};
    p->seq_len = fz_pick(in, 8) < 5 ? 1 + fz_pick(in, 16) : 1 + fz_pick(in, GD_MAX_T);
    p->n_k_heads = 1 + fz_pick(in, 4);
    p->n_v_heads = p->n_k_heads * (1 + fz_pick(in, 4));
    p->k_dim = fz_pick(in, 2) ? dims[fz_pick(in, 15)] : 1 + fz_pick(in, 32);
    p->v_dim = fz_pick(in, 2) ? dims[fz_pick(in, 15)] : 1 + fz_pick(in, 32);
    p->head_map = (lmk_repeat_layout)fz_pick(in, 2);
    p->scale = scales[fz_pick(in, 6)];
    p->flags = fz_pick(in, 3) == 0 ? LMK_GDN_NO_L2NORM : 0;
    p->norm.eps = eps[fz_pick(in, 4)];
    p->norm.weight_offset = fz_pick(in, 2) ? 1.0f : 0.0f;
    *big = fz_pick(in, 8) == 0;
    if (*big) {
        p->n_v_heads = p->n_k_heads * (2 + fz_pick(in, 3));
        p->k_dim = 16 + fz_pick(in, 17);
        p->v_dim = 16 + fz_pick(in, 17);
    }
    if (!sane)
        wild_param(in, p);
}

static size_t clamp_dim(uint32_t v, size_t hi)
{
    return v == 0 ? 1 : v > hi ? hi : v;
}

/* Everything of a call, for sizes that fit the arena (wild parameters get operands of capped
 * sizes, which the oracle then finds wrong). */
static void build(fz_in *in, fz_call *fc, gd_call *c)
{
    pick_params(in, fc->sane, &c->p, &c->big);
    const lmk_gdn_params *p = &c->p;
    c->T = clamp_dim(p->seq_len, GD_MAX_T), c->Hk = clamp_dim(p->n_k_heads, 8), c->Hv = clamp_dim(p->n_v_heads, 32);
    c->dk = clamp_dim(p->k_dim, 32), c->dv = clamp_dim(p->v_dim, 32);
    const lmk_dtype dt = k_floats[fz_pick(in, 3)];
    const size_t es = lmk_dtype_size(dt);
    while (c->T > 1 && c->T * (es * (2 * c->Hk * c->dk + 3 * c->Hv * c->dv) + 8 * c->Hv) > GD_ARENA_BUDGET)
        c->T /= 2;
    if (c->p.seq_len >= 1 && c->p.seq_len <= GD_MAX_T)
        c->p.seq_len = (uint32_t)c->T;
    c->bump = 64 * fz_pick(in, 8);
    build_qkv(in, fc, c, dt);
    build_ab(in, fc, c);
    build_rest(in, fc, c, dt);
    build_seqs(in, fc, c);
}

/* ---- breaking rules ---- */

/* Another 1-D view of b's first bytes: dtype t, n elements, dense or with stride 2 (b itself when
 * it cannot be made). */
static lmk_buffer *review(fz_call *fc, gd_call *c, lmk_buffer *b, lmk_dtype t, size_t n, bool strided)
{
    if (!b || !room(fc))
        return b;
    const size_t es = lmk_dtype_size(t), two = 2, need = strided ? (n ? (n - 1) * 2 + 1 : 0) * es : n * es;
    const size_t aoff = arena_off(c, b);
    const lmk_buffer *parent = aoff != SIZE_MAX ? c->e->parent : b;
    const size_t off = aoff != SIZE_MAX ? aoff : 0;
    if (off % es || off > lmk_buffer_byte_len(parent) || need > lmk_buffer_byte_len(parent) - off)
        return b;
    lmk_buffer *v = NULL;
    const lmk_status st = strided ? lmk_buffer_view_strided(parent, off, t, &n, &two, 1, &v)
                                  : lmk_buffer_view(parent, off, t, &n, 1, &v);
    if (st != LMK_OK)
        return b;
    fz_call_keep(fc, v);
    return v;
}

/* A dense copy of b's shape on the other device (its memory joins the world). */
static lmk_buffer *on_other_device(fz_call *fc, gd_call *c, lmk_buffer *b)
{
    if (!b || !room(fc))
        return b;
    lmk_buffer *o = NULL;
    const size_t n = lmk_buffer_element_count(b);
    const lmk_dtype t = lmk_buffer_dtype(b);
    FZ_CHECK(lmk_buffer_alloc(c->e->other, n * lmk_dtype_size(t), t, &n, 1, &o) == LMK_OK, "harness: alloc on other");
    fz_call_keep(fc, o);
    fz_world_add(&fc->world, lmk_buffer_data(o), n * lmk_dtype_size(t));
    return o;
}

/* out as a dense [T, Hv, dv] view over another operand's first bytes (shifted by 0-3 elements):
 * out aliasing q, v, z, a, the state... */
static void out_over(fz_in *in, fz_call *fc, gd_call *c, const lmk_buffer *w)
{
    const lmk_dtype t = c->op[OUT] ? lmk_buffer_dtype(c->op[OUT]) : lmk_buffer_dtype(c->op[Q]);
    const size_t es = lmk_dtype_size(t), n = c->T * c->Hv * c->dv;
    size_t off = arena_off(c, w);
    if (off == SIZE_MAX)
        return;
    off += es * fz_pick(in, 4);
    off -= off % es;
    lmk_buffer *v = off <= FZ_ARENA_BYTES && n * es <= FZ_ARENA_BYTES - off ? arena_view(fc, c, off, t, 1, &n, NULL)
                                                                            : NULL;
    if (v)
        c->op[OUT] = v;
}

/* The state pool moved over another operand, given a wrong shape, or overlapping elements. */
static void state_wrong(fz_in *in, fz_call *fc, gd_call *c, const lmk_buffer *w)
{
    const lmk_buffer *s = c->op[STATE];
    if (!s || lmk_buffer_ndim(s) != 4)
        return;
    size_t n[5] = {0, 0, 0, 0, 2}, st[5] = {0, 0, 0, 0, 1};
    for (int i = 0; i < 4; i++)
        n[i] = lmk_buffer_dim(s, i), st[i] = lmk_buffer_stride(s, i);
    size_t off = arena_off(c, s);
    int nd = 4;
    switch (fz_pick(in, 4)) {
    case 0: off = arena_off(c, w); break;                                          /* over another operand */
    case 1: st[fz_pick(in, 4)] = fz_pick(in, 2) ? 0 : st[fz_pick(in, 4)]; break;   /* overlapping elements */
    case 2: n[1 + fz_pick(in, 3)] += fz_pick(in, 2) ? 1 : (size_t)-1; break;        /* a wrong dimension */
    default: nd = fz_pick(in, 2) ? 5 : 3; break;                                   /* 5-D or 3-D */
    }
    for (int i = 1; i < 4; i++)
        if (n[i] == (size_t)-1)
            return;
    size_t last = 0;
    for (int i = 0; i < nd; i++)
        last += (n[i] ? n[i] - 1 : 0) * st[i];
    const lmk_dtype t = lmk_buffer_dtype(s);
    const size_t es = lmk_dtype_size(t);
    if (off == SIZE_MAX || off % es || (last + 1) * es > FZ_ARENA_BYTES - off || !room(fc))
        return;
    lmk_buffer *b = NULL;
    if (lmk_buffer_view_strided(c->e->parent, off, t, n, st, nd, &b) == LMK_OK) {
        fz_call_keep(fc, b);
        fz_world_add(&fc->world, c->e->arena, FZ_ARENA_BYTES);
        c->op[STATE] = b;
    }
}

/* Gives a missing A_log or dt_bias, z or norm_w (one of a pair is invalid, both valid). */
static void complete_pair(fz_in *in, fz_call *fc, gd_call *c)
{
    const int w = (int)(fz_pick(in, 2) ? A_LOG + fz_pick(in, 2) : fz_pick(in, 2) ? Z : NORM_W);
    if (c->op[w])
        return;
    c->op[w] = w == Z ? dense3(in, fc, c, k_floats[fz_pick(in, 3)], c->T, c->Hv, c->dv)
                      : dense3(in, fc, c, k_floats[fz_pick(in, 3)], w == NORM_W ? c->dv : c->Hv, 1, 1);
}

/* Breaks one rule of lmk.h (or, by chance, none: the oracle decides). */
static void corrupt(fz_in *in, fz_call *fc, gd_call *c)
{
    static const lmk_dtype any[] = {LMK_F32, LMK_F16, LMK_BF16, LMK_U8, LMK_U16, LMK_U32, LMK_I32, LMK_I64, LMK_F8E4M3};
    const int w = (int)fz_pick(in, N_OPS);
    lmk_buffer *b = c->op[w];
    const size_t count = lmk_buffer_element_count(b);
    switch (fz_pick(in, 18)) {
    case 0: c->s = NULL; break;
    case 1: if (fz_pick(in, 2)) c->null_io = true; else c->null_p = true; break;
    case 2: case 3: c->op[w] = NULL; break;
    case 4: c->op[w] = review(fc, c, b, any[fz_pick(in, 9)], count, false); break;
    case 5: c->op[w] = review(fc, c, b, b ? lmk_buffer_dtype(b) : LMK_F32, count + fz_pick(in, 3) - 1, false); break;
    case 6: c->op[w] = review(fc, c, b, b ? lmk_buffer_dtype(b) : LMK_F32, count, true); break;
    case 7: c->op[w] = on_other_device(fc, c, b); break;
    case 8: out_over(in, fc, c, fz_pick(in, 2) ? c->op[Q] : b); break;
    case 9: c->op[OUT] = c->op[fz_pick(in, 2) ? V : fz_pick(in, 2) ? Q : Z]; break;
    case 10: case 11: state_wrong(in, fc, c, b ? b : c->op[OUT]); break;
    case 12: c->op[STATE] = NULL; break;
    case 13: c->op[w] = c->op[fz_pick(in, N_OPS)]; break;
    case 14: c->op[w] = made(in, fc, c, any[fz_pick(in, 9)], b ? count : 1 + fz_pick(in, 9)); break;
    case 15:
        if (c->op[CU])
            c->op[CU] = review(fc, c, c->op[CU], lmk_buffer_dtype(c->op[CU]), fz_pick(in, 2), fz_pick(in, 2));
        break;
    case 16: complete_pair(in, fc, c); break;
    default: wild_param(in, &c->p); break;
    }
}
/* ---- values ---- */

/* cu_seqlens: a valid partition of T (decode batches: one token a sequence, then empty ones),
 * the same with one entry broken, or wild values. */
static void fill_cu(fz_in *in, const gd_call *c, const lmk_buffer *b, uint64_t *r)
{
    const size_t n = lmk_buffer_element_count(b);
    if (!n || !lmk_buffer_is_contiguous(b))
        return;
    const int64_t T = c->p.seq_len;
    int64_t *v = malloc(n * sizeof *v);
    FZ_CHECK(v != NULL, "harness: out of memory");
    for (size_t i = 0; i < n; i++)
        v[i] = c->seq_mode == 2 ? ((int64_t)i < T ? (int64_t)i : T) : (int64_t)(fz_rand(r) % (uint64_t)(T + 1));
    v[0] = 0, v[n - 1] = T;
    fz_sort_i64(v, n);
    const int64_t wild[] = {-1, 0, T, T + 1, T / 2, INT32_MIN, INT32_MAX, INT64_MIN, INT64_MAX,
                            (int64_t)1 << 32, ((int64_t)1 << 32) + 1, -((int64_t)1 << 32), T + 1000};
    const size_t k = fz_pick(in, (unsigned)(n < 256 ? n : 256));
    if (c->cu_fill == CU_PERTURBED) {
        switch (fz_pick(in, 4)) {
        case 0: v[k] += fz_pick(in, 2) ? 1 + fz_pick(in, 3) : -1 - (int64_t)fz_pick(in, 3); break;
        case 1: v[0] = 1 + fz_pick(in, 3); break;
        case 2: v[n - 1] = fz_pick(in, 2) ? T + 1 : T - 1; break;
        default: { const int64_t x = v[k]; v[k] = v[n - 1 - k], v[n - 1 - k] = x; break; }
        }
    } else if (c->cu_fill == CU_WILD) {
        for (size_t i = 0; i < n; i++)
            v[i] = fz_pick(in, 3) ? wild[fz_pick(in, 13)] : (int64_t)(fz_rand(r) % (uint64_t)(T + 7)) - 3;
    }
    for (size_t i = 0; i < n; i++)
        fz_put_index(b, i, v[i]);
    free(v);
}

/* state_slots: distinct rows, rows with duplicates, or padding; some entries padding in every
 * kind (-1, rows, huge, INT_MIN, INT64_MIN, and for i64 values whose low 32 bits name a row). */
static void fill_slots(fz_in *in, const gd_call *c, const lmk_buffer *b, uint64_t rows, uint64_t *r)
{
    const size_t n = lmk_buffer_element_count(b);
    if (!lmk_buffer_is_contiguous(b))
        return;
    uint64_t next = rows ? fz_rand(r) % rows : 0, used = 0;
    for (size_t i = 0; i < n; i++) {
        const uint64_t x = fz_rand(r);
        const int64_t pads[] = {-1, (int64_t)rows, (int64_t)rows + 5, INT32_MIN, INT32_MAX, INT64_MIN, INT64_MAX,
                                ((int64_t)1 << 32) + (int64_t)(rows ? x % rows : 0), -((int64_t)1 << 32) + 1};
        int64_t v = pads[(x >> 8) % 9];
        if (c->slot_fill == SLOTS_DISTINCT && (x & 3) && used < rows)
            v = (int64_t)(next++ % rows), used++;
        else if (c->slot_fill == SLOTS_DUPLICATE && (x & 3) && rows)
            v = (int64_t)((x >> 16) % (rows < 3 ? rows : 3 + fz_pick(in, 2) * (rows - 3)));
        fz_put_index(b, i, v);
    }
}

/* Every value of the call, in the ranges models hold (lmk.h's precision domain): q, k, v, z in
 * [-2, 2) (q and k within 0.5/sqrt(dk) without the L2 norm, so the recurrence contracts), A_log in
 * [-2, 1), dt_bias in [-4, 0), a and b in [-2, 2) (or g in [-3, 0) and beta in [0, 1)), norm_w
 * around 1 - weight_offset, the state in [-2, 2)/sqrt(dk). Operands may share bytes: later fills
 * win, and the snapshot taken after is what the call starts from (the oracle reads it). */
static void fill_all(fz_in *in, fz_call *fc, gd_call *c, uint64_t *r)
{
    for (int i = 0; i < fc->world.n; i++) /* random bytes everywhere: what an op must not touch */
        for (size_t j = 0; j < fc->world.r[i].len; j += 8) {
            const uint64_t x = fz_rand(r);
            memcpy(fc->world.r[i].base + j, &x, fc->world.r[i].len - j < 8 ? fc->world.r[i].len - j : 8);
        }
    const bool s = fc->sane, raw = c->op[A_LOG] != NULL;
    const double st = 2.0 / sqrt((double)c->dk), wo = c->p.norm.weight_offset == 1.0f ? 1.0 : 0.0;
    const double qk = c->p.flags & LMK_GDN_NO_L2NORM ? 0.5 / sqrt((double)c->dk) : 2.0;
    fz_fill_values(in, s, c->op[STATE], r, -st, st);
    fz_fill_values(in, s, c->op[A_LOG], r, -2.0, 1.0);
    fz_fill_values(in, s, c->op[DT_BIAS], r, -4.0, 0.0);
    fz_fill_values(in, s, c->op[NORM_W], r, 0.5 - wo, 1.5 - wo);
    fz_fill_values(in, s, c->op[A], r, raw ? -2.0 : -3.0, raw ? 2.0 : 0.0);
    fz_fill_values(in, s, c->op[B], r, raw ? -2.0 : 0.0, raw ? 2.0 : 1.0);
    fz_fill_values(in, s, c->op[Z], r, -2.0, 2.0);
    fz_fill_values(in, s, c->op[V], r, -2.0, 2.0);
    fz_fill_values(in, s, c->op[K], r, -qk, qk);
    fz_fill_values(in, s, c->op[Q], r, -qk, qk);
    if (c->op[CU])
        fill_cu(in, c, c->op[CU], r);
    const lmk_buffer *p = c->op[STATE];
    if (c->op[SLOTS])
        fill_slots(in, c, c->op[SLOTS], p && lmk_buffer_ndim(p) == 4 ? lmk_buffer_dim(p, 0) : 4, r);
}

/* ---- lmk.h's rules: the oracle ---- */

/* The call as lmk.h resolves it. */
typedef struct gd_view {
    lmk_tensor3 t[N_OPS]; /* [T, H, d] operands; a and b [T, 1, Hv]; vectors flat; STATE: data and es */
    size_t pn[4], ps[4];  /* the pool's shape and strides */
    size_t n_seq;
} gd_view;

/* A dense float vector of exactly n elements (A_log, dt_bias, norm_w). */
static bool vector_ok(const lmk_buffer *b, size_t n)
{
    return fz_is_float(lmk_buffer_dtype(b)) && lmk_buffer_is_contiguous(b) && lmk_buffer_element_count(b) == n;
}

/* A dense i32/i64 index array of exactly n entries (at least n when at_least). */
static bool index_ok(const lmk_buffer *b, size_t n, bool at_least)
{
    const lmk_dtype t = lmk_buffer_dtype(b);
    const size_t have = lmk_buffer_element_count(b);
    return (t == LMK_I32 || t == LMK_I64) && lmk_buffer_is_contiguous(b) && (at_least ? have >= n : have == n);
}

/* The rules on the call's numbers (lmk.h's order up to the operands' shapes). */
static bool params_ok(const gd_call *c)
{
    const lmk_gdn_params *p = &c->p;
    lmk_buffer *const *o = c->op;
    if (!c->s || c->null_io || c->null_p || !o[Q] || !o[K] || !o[V] || !o[A] || !o[B] || !o[OUT])
        return false;
    if (!p->seq_len || !p->n_k_heads || !p->n_v_heads || !p->k_dim || !p->v_dim)
        return false;
    if (p->k_dim > 256 || p->v_dim > 256 || p->n_v_heads % p->n_k_heads)
        return false;
    if ((p->head_map != LMK_REPEAT_TILED && p->head_map != LMK_REPEAT_BLOCK) || (p->flags & ~LMK_GDN_NO_L2NORM) ||
        !isfinite(p->scale))
        return false;
    if (!o[A_LOG] != !o[DT_BIAS] || !o[Z] != !o[NORM_W])
        return false;
    return !o[Z] || (isfinite(p->norm.eps) && p->norm.eps > 0.0f && isfinite(p->norm.weight_offset));
}

/* Shapes, dtypes, sequences, the pool and devices. */
static bool operands_ok(const gd_call *c, gd_view *v)
{
    const lmk_gdn_params *p = &c->p;
    lmk_buffer *const *o = c->op;
    const size_t T = p->seq_len, hk = p->n_k_heads, hv = p->n_v_heads, dk = p->k_dim, dv = p->v_dim;
    if (!fz_operand3(o[Q], T, hk, dk, &v->t[Q]) || !fz_operand3(o[K], T, hk, dk, &v->t[K]) ||
        !fz_operand3(o[V], T, hv, dv, &v->t[V]) || !fz_operand3(o[OUT], T, hv, dv, &v->t[OUT]) ||
        (o[Z] && !fz_operand3(o[Z], T, hv, dv, &v->t[Z])))
        return false;
    if (!fz_operand2(o[A], T, hv, &v->t[A]) || !fz_operand2(o[B], T, hv, &v->t[B]))
        return false;
    if ((o[A_LOG] && !vector_ok(o[A_LOG], hv)) || (o[DT_BIAS] && !vector_ok(o[DT_BIAS], hv)) ||
        (o[NORM_W] && !vector_ok(o[NORM_W], dv)))
        return false;
    const lmk_dtype dt = lmk_buffer_dtype(o[Q]);
    if (!fz_is_float(dt) || lmk_buffer_dtype(o[K]) != dt || lmk_buffer_dtype(o[V]) != dt ||
        lmk_buffer_dtype(o[OUT]) != dt || !fz_is_float(lmk_buffer_dtype(o[A])) || !fz_is_float(lmk_buffer_dtype(o[B])) ||
        (o[Z] && !fz_is_float(lmk_buffer_dtype(o[Z]))))
        return false;
    const lmk_buffer *s = o[STATE];
    if (s && lmk_buffer_dtype(s) != LMK_F32 && lmk_buffer_dtype(s) != LMK_BF16)
        return false;
    if (o[CU] && !index_ok(o[CU], 2, true))
        return false;
    v->n_seq = o[CU] ? lmk_buffer_element_count(o[CU]) - 1 : 1;
    if (o[SLOTS] && (!s || !index_ok(o[SLOTS], v->n_seq, false)))
        return false;
    if (s && (lmk_buffer_ndim(s) != 4 || lmk_buffer_dim(s, 1) != hv || lmk_buffer_dim(s, 2) != dk ||
              lmk_buffer_dim(s, 3) != dv))
        return false;
    for (int i = 0; s && i < 4; i++)
        v->pn[i] = lmk_buffer_dim(s, i), v->ps[i] = lmk_buffer_stride(s, i);
    for (int i = 0; i < N_OPS; i++)
        if (o[i] && lmk_buffer_device(o[i]) != lmk_stream_device(c->s))
            return false;
    return true;
}

/* Marks: for every byte of every region, the operands whose elements hold it (bit per operand),
 * and the operands that hold a byte twice. */
typedef struct gd_marks {
    uint16_t *m[FZ_MAX_REGIONS];
    bool self[16];
} gd_marks;

static void marks_init(gd_marks *mk, const fz_world *w)
{
    memset(mk, 0, sizeof *mk);
    for (int r = 0; r < w->n; r++) {
        mk->m[r] = calloc(w->r[r].len + 1, sizeof(uint16_t));
        FZ_CHECK(mk->m[r] != NULL, "harness: out of memory");
    }
}

static void marks_free(gd_marks *mk)
{
    for (int r = 0; r < FZ_MAX_REGIONS; r++)
        free(mk->m[r]);
}

/* Marks the elements of an nd-axis layout (nd <= 4) with bit `op` (< 16). */
static void mark_nd(fz_world *w, gd_marks *mk, const unsigned char *base, const size_t *n, const size_t *st, int nd,
                    size_t es, int op)
{
    size_t count = 1;
    for (int i = 0; i < nd; i++)
        count *= n[i];
    for (size_t k = 0; k < count; k++) {
        size_t rest = k, off = 0;
        for (int a = nd - 1; a >= 0; a--)
            off += rest % n[a] * st[a], rest /= n[a];
        const unsigned char *p = base + off * es;
        const fz_region *r = fz_world_find(w, p);
        FZ_CHECK(r != NULL && fz_world_find(w, p + es - 1) == r, "harness: an element (mark %d, %s) outside every "
                 "region", op, op < N_OPS ? k_names[op] : "?");
        uint16_t *m = mk->m[r - w->r] + (p - r->base);
        for (size_t i = 0; i < es; i++) {
            mk->self[op] |= (m[i] >> op & 1) != 0;
            m[i] |= (uint16_t)(1u << op);
        }
    }
}

/* The operands (bit per operand) that share a byte with operand `a`. */
static unsigned marks_sharing(const fz_world *w, const gd_marks *mk, int a)
{
    unsigned with = 0;
    for (int r = 0; r < w->n; r++)
        for (size_t i = 0; i < w->r[r].len; i++)
            if (mk->m[r][i] >> a & 1)
                with |= mk->m[r][i];
    return with & ~(1u << a);
}

/* The byte extent [lo, hi) of an operand (the pool: of its shape and strides). */
static void extent(const gd_view *v, int op, uintptr_t *lo, uintptr_t *hi)
{
    const bool pool = op == STATE;
    const int nd = pool ? 4 : 3;
    const size_t *n = pool ? v->pn : v->t[op].n, *st = pool ? v->ps : v->t[op].stride;
    size_t last = 0;
    bool empty = false;
    for (int i = 0; i < nd; i++) {
        empty |= n[i] == 0;
        last += (n[i] ? n[i] - 1 : 0) * st[i];
    }
    *lo = (uintptr_t)v->t[op].data;
    *hi = empty ? *lo : *lo + (last + 1) * v->t[op].es;
}

/* Output `out` (out or the pool) against every other operand: INVALID when it shares a byte with
 * one or holds a byte twice; MAY_REJECT when extents meet without shared bytes (except side by
 * side in one row) or its layout is not nested; else VALID. */
static int judge_output(const fz_world *w, const gd_marks *mk, const gd_call *c, const gd_view *v, int out)
{
    if (mk->self[out])
        return INVALID;
    int verdict = VALID;
    if (out == STATE ? !fz_nested(v->pn, v->ps, 4) : !fz_nested(v->t[out].n, v->t[out].stride, 3))
        verdict = MAY_REJECT;
    uintptr_t lo, hi;
    extent(v, out, &lo, &hi);
    const unsigned shared = marks_sharing(w, mk, out);
    for (int i = 0; i < N_OPS; i++) {
        if (i == out || !c->op[i])
            continue;
        if (shared >> i & 1)
            return INVALID;
        uintptr_t l2, h2;
        extent(v, i, &l2, &h2);
        if (lo < h2 && l2 < hi && (out == STATE || i == STATE || !fz_side_by_side(&v->t[out], &v->t[i])))
            verdict = MAY_REJECT;
    }
    return verdict;
}

/* The overlap rules on the element bytes (the call's other rules already hold). */
static int overlaps(fz_world *w, const gd_call *c, gd_view *v)
{
    lmk_buffer *const *o = c->op;
    const int flat[] = {A_LOG, DT_BIAS, CU, SLOTS, NORM_W};
    for (int i = 0; i < 5; i++)
        if (o[flat[i]])
            v->t[flat[i]] = fz_flat3(o[flat[i]]);
    if (o[STATE])
        v->t[STATE] =
            (lmk_tensor3){.data = lmk_buffer_data(o[STATE]), .es = lmk_dtype_size(lmk_buffer_dtype(o[STATE]))};
    gd_marks mk;
    marks_init(&mk, w);
    for (int i = 0; i < N_OPS; i++)
        if (o[i] && i != STATE)
            mark_nd(w, &mk, v->t[i].data, v->t[i].n, v->t[i].stride, 3, v->t[i].es, i);
    if (o[STATE])
        mark_nd(w, &mk, v->t[STATE].data, v->pn, v->ps, 4, v->t[STATE].es, STATE);
    const int vo = judge_output(w, &mk, c, v, OUT), vs = o[STATE] ? judge_output(w, &mk, c, v, STATE) : VALID;
    marks_free(&mk);
    return vo == INVALID || vs == INVALID ? INVALID : vo == MAY_REJECT || vs == MAY_REJECT ? MAY_REJECT : VALID;
}

static int oracle(fz_world *w, const gd_call *c, gd_view *v)
{
    return params_ok(c) && operands_ok(c, v) ? overlaps(w, c, v) : INVALID;
}

/* The reference's arguments over the call's buffers, as lmk.h resolves them. */
static lmk_gdn_args args_of(const gd_call *c, const gd_view *v)
{
    lmk_buffer *const *o = c->op;
    const lmk_gdn_params *p = &c->p;
    const lmk_tensor3 *t = v->t;
    return (lmk_gdn_args){
        .q = t[Q].data, .k = t[K].data, .v = t[V].data, .out = t[OUT].data, .dtype = lmk_buffer_dtype(o[Q]),
        .T = p->seq_len, .Hk = p->n_k_heads, .Hv = p->n_v_heads, .dk = p->k_dim, .dv = p->v_dim,
        .q_tok = t[Q].stride[0], .q_head = t[Q].stride[1], .k_tok = t[K].stride[0], .k_head = t[K].stride[1],
        .v_tok = t[V].stride[0], .v_head = t[V].stride[1], .o_tok = t[OUT].stride[0], .o_head = t[OUT].stride[1],
        .a = t[A].data, .b = t[B].data, .a_dtype = lmk_buffer_dtype(o[A]), .b_dtype = lmk_buffer_dtype(o[B]),
        .a_tok = t[A].stride[0], .b_tok = t[B].stride[0],
        .A_log = o[A_LOG] ? lmk_buffer_data(o[A_LOG]) : NULL,
        .dt_bias = o[DT_BIAS] ? lmk_buffer_data(o[DT_BIAS]) : NULL,
        .A_dtype = o[A_LOG] ? lmk_buffer_dtype(o[A_LOG]) : LMK_F32,
        .dt_dtype = o[DT_BIAS] ? lmk_buffer_dtype(o[DT_BIAS]) : LMK_F32,
        .z = o[Z] ? t[Z].data : NULL, .z_dtype = o[Z] ? lmk_buffer_dtype(o[Z]) : LMK_F32,
        .z_tok = o[Z] ? t[Z].stride[0] : 0, .z_head = o[Z] ? t[Z].stride[1] : 0,
        .norm_w = o[NORM_W] ? lmk_buffer_data(o[NORM_W]) : NULL,
        .nw_dtype = o[NORM_W] ? lmk_buffer_dtype(o[NORM_W]) : LMK_F32,
        .cu_seqlens = o[CU] ? lmk_buffer_data(o[CU]) : NULL, .cu_is64 = o[CU] && lmk_buffer_dtype(o[CU]) == LMK_I64,
        .slots = o[SLOTS] ? lmk_buffer_data(o[SLOTS]) : NULL,
        .slots_is64 = o[SLOTS] && lmk_buffer_dtype(o[SLOTS]) == LMK_I64, .n_seq = v->n_seq,
        .state = o[STATE] ? lmk_buffer_data(o[STATE]) : NULL,
        .state_dtype = o[STATE] ? lmk_buffer_dtype(o[STATE]) : LMK_F32, .n_slots = o[STATE] ? v->pn[0] : 0,
        .s_slot = v->ps[0], .s_head = v->ps[1], .s_k = v->ps[2], .s_v = v->ps[3],
        .head_map = p->head_map,
        .scale = p->scale != 0.0f ? p->scale : 1.0f / sqrtf((float)p->k_dim), /* lmk.h: 0 means 1/sqrt(k_dim) */
        .l2norm = !(p->flags & LMK_GDN_NO_L2NORM), .eps = p->norm.eps, .weight_offset = p->norm.weight_offset,
    };
}

/* ---- checking a call ---- */

/* Whether cu_seqlens (as the snapshot holds it) is what lmk.h specifies: NULL, or 0 = c0 <= ...
 * <= cn = T. Anything else makes the outputs unspecified. */
static bool cu_valid(const lmk_gdn_args *a)
{
    if (!a->cu_seqlens)
        return true;
    int64_t prev = 0;
    for (size_t i = 0; i <= a->n_seq; i++) {
        const int64_t x = lmk_index_at(a->cu_seqlens, a->cu_is64, i);
        if ((i == 0 && x != 0) || x < prev)
            return false;
        prev = x;
    }
    return prev == (int64_t)a->T;
}

/* Whether every element of a [n0, n1, n2] tensor lies in [lo, hi] (false for NaN). */
static bool all_in(lmk_dtype t, const void *base, size_t n0, size_t n1, size_t n2, size_t s0, size_t s1, double lo,
                   double hi)
{
    for (size_t i = 0; i < n0; i++)
        for (size_t j = 0; j < n1; j++)
            for (size_t e = 0; e < n2; e++) {
                const double x = lmk_float_load(t, base, i * s0 + j * s1 + e);
                if (!(x >= lo && x <= hi))
                    return false;
            }
    return true;
}

/* Without the L2 norm: every k row of norm at most 1, so beta k k^T keeps the recurrence a
 * contraction (beyond it the float64 and f32 evaluations part however exact each step is). */
static bool keys_contract(const lmk_gdn_args *a)
{
    for (size_t t = 0; !a->l2norm && t < a->T; t++)
        for (size_t h = 0; h < a->Hk; h++) {
            double ss = 0.0;
            for (size_t i = 0; i < a->dk; i++) {
                const double x = lmk_float_load(a->dtype, a->k, t * a->k_tok + h * a->k_head + i);
                ss += x * x;
            }
            if (!(ss <= 1.0))
                return false;
        }
    return true;
}

/* The pool rows (each head a [dk, dv] matrix) finite and at most 2 in magnitude. */
static bool state_tame(const lmk_gdn_args *a)
{
    for (size_t r = 0; a->state && r < a->n_slots; r++)
        for (size_t h = 0; h < a->Hv; h++)
            for (size_t i = 0; i < a->dk; i++)
                for (size_t j = 0; j < a->dv; j++) {
                    const size_t at = r * a->s_slot + h * a->s_head + i * a->s_k + j * a->s_v;
                    if (!(fabs(lmk_float_load(a->state_dtype, a->state, at)) <= 2.0))
                        return false;
                }
    return true;
}

/* The domain where the precision contract is checked (outside it only determinism and the
 * untouched bytes are): finite inputs of the magnitudes models hold, decays at most 1 and betas
 * in [0, 1] when g and beta are given, keys that contract without the L2 norm. */
static bool precise_domain(const lmk_gdn_args *a)
{
    const size_t T = a->T;
    if (!(fabsf(a->scale) <= 4.0f) || (a->z && (!(a->eps <= 1.0f) || !(fabsf(a->weight_offset) <= 2.0f))))
        return false;
    if (!all_in(a->dtype, a->q, T, a->Hk, a->dk, a->q_tok, a->q_head, -2, 2) ||
        !all_in(a->dtype, a->k, T, a->Hk, a->dk, a->k_tok, a->k_head, -2, 2) ||
        !all_in(a->dtype, a->v, T, a->Hv, a->dv, a->v_tok, a->v_head, -2, 2) ||
        (a->z && !all_in(a->z_dtype, a->z, T, a->Hv, a->dv, a->z_tok, a->z_head, -2, 2)) ||
        (a->norm_w && !all_in(a->nw_dtype, a->norm_w, 1, 1, a->dv, 0, 0, -2, 2)))
        return false;
    const bool raw = a->A_log != NULL;
    if (!all_in(a->a_dtype, a->a, T, 1, a->Hv, a->a_tok, 0, raw ? -4 : -10, raw ? 4 : 0) ||
        !all_in(a->b_dtype, a->b, T, 1, a->Hv, a->b_tok, 0, raw ? -10 : 0, raw ? 10 : 1))
        return false;
    if (raw && (!all_in(a->A_dtype, a->A_log, 1, 1, a->Hv, 0, 0, -3, 2) ||
                !all_in(a->dt_dtype, a->dt_bias, 1, 1, a->Hv, 0, 0, -5, 5)))
        return false;
    return keys_contract(a) && state_tame(a);
}

/* ---- the condition of a row ----
 *
 * lmk.h bounds the error of an out row and of a final state relative to their own norms. An f32
 * evaluation (any order) errs relative to the magnitudes of the terms that form a value, so where
 * those terms cancel (o = S^T qn much smaller than |S|^T |qn|, u = beta (v - S^T kn) with
 * S^T kn close to v, an output norm over such an o) no f32 implementation meets that bound. The
 * pass below runs lmk.h's formulas in double on the signed values and, alongside, on the
 * magnitudes of every term (|S| <- d |S| + |kn| |u|, |u| = |beta| (|v| + |S|^T |kn|),
 * |o| = |S|^T |qn|), giving each row the magnitude its rounding errors scale with. A row that
 * misses the contract's bound is still accepted when it is ill-conditioned (magnitude over ten
 * times its norm) and within the same tolerance relative to its magnitude; a well-conditioned row
 * never is. */

typedef struct gd_cond {
    double *S, *M;               /* [dk * dv]: the state and its magnitudes, row i at i * dv */
    double *qn, *qa, *kn, *ka;   /* [dk] */
    double *u, *ua, *o, *oa;     /* [dv] */
    double *row_mag;             /* [T * Hv]: the magnitude each out row's error scales with */
    double *state_mag;           /* [n_slots * Hv]: ||M|| of each stored (row, head) */
} gd_cond;

/* The decay exp(g) and beta of token t, head h (lmk.h's gates). */
static void cond_gates(const lmk_gdn_args *a, size_t t, size_t h, double *decay, double *beta)
{
    const double x = lmk_float_load(a->a_dtype, a->a, t * a->a_tok + h);
    const double y = lmk_float_load(a->b_dtype, a->b, t * a->b_tok + h);
    if (!a->A_log) {
        *decay = exp(x), *beta = y;
        return;
    }
    const double z = x + lmk_float_load(a->dt_dtype, a->dt_bias, h);
    const double softplus = z > 0.0 ? z + log1p(exp(-z)) : log1p(exp(z));
    *decay = exp(-exp(lmk_float_load(a->A_dtype, a->A_log, h)) * softplus);
    *beta = 1.0 / (1.0 + exp(-y));
}

/* Head `kh` of token t of q or k, L2-normalised when asked, times mul; and its magnitudes. */
static void cond_row(const lmk_gdn_args *a, const void *base, size_t tok, size_t head, size_t t, size_t kh,
                     double mul, double *row, double *mag)
{
    double ss = 0.0;
    for (size_t i = 0; i < a->dk; i++) {
        row[i] = lmk_float_load(a->dtype, base, t * tok + kh * head + i);
        ss += row[i] * row[i];
    }
    const double r = (a->l2norm ? 1.0 / sqrt(ss + 1e-6) : 1.0) * mul;
    for (size_t i = 0; i < a->dk; i++)
        row[i] *= r, mag[i] = fabs(row[i]);
}

/* The magnitude of out row (t, h) from o and |o|: ||oa|| without z; with z the output norm can
 * at most double the relative error of o, then w * silu(z) scales it. */
static double cond_out(const lmk_gdn_args *a, const gd_cond *w, size_t t, size_t h)
{
    double oo = 0.0, aa = 0.0, wmax = 0.0;
    for (size_t j = 0; j < a->dv; j++)
        oo += w->o[j] * w->o[j], aa += w->oa[j] * w->oa[j];
    if (!a->z)
        return sqrt(aa);
    for (size_t j = 0; j < a->dv; j++) {
        const double z = lmk_float_load(a->z_dtype, a->z, t * a->z_tok + h * a->z_head + j);
        const double g = (lmk_float_load(a->nw_dtype, a->norm_w, j) + (double)a->weight_offset) * z / (1.0 + exp(-z));
        wmax = fmax(wmax, fabs(g));
    }
    return 2.0 * sqrt(aa) * wmax / sqrt(oo / (double)a->dv + (double)a->eps);
}

/* One token of head h: the recurrence on S and on its magnitudes M, then the row's magnitude. */
static void cond_step(const lmk_gdn_args *a, gd_cond *w, size_t t, size_t h)
{
    const size_t dk = a->dk, dv = a->dv, kh = lmk_gdn_k_head(a, h);
    double d, beta;
    cond_gates(a, t, h, &d, &beta);
    cond_row(a, a->q, a->q_tok, a->q_head, t, kh, (double)a->scale, w->qn, w->qa);
    cond_row(a, a->k, a->k_tok, a->k_head, t, kh, 1.0, w->kn, w->ka);
    for (size_t e = 0; e < dk * dv; e++)
        w->S[e] *= d, w->M[e] *= d;
    for (size_t j = 0; j < dv; j++) {
        double su = 0.0, sa = 0.0;
        for (size_t i = 0; i < dk; i++)
            su += w->S[i * dv + j] * w->kn[i], sa += w->M[i * dv + j] * w->ka[i];
        const double v = lmk_float_load(a->dtype, a->v, t * a->v_tok + h * a->v_head + j);
        w->u[j] = beta * (v - su), w->ua[j] = fabs(beta) * (fabs(v) + sa);
    }
    for (size_t j = 0; j < dv; j++) {
        w->o[j] = w->oa[j] = 0.0;
        for (size_t i = 0; i < dk; i++) {
            w->S[i * dv + j] += w->kn[i] * w->u[j], w->M[i * dv + j] += w->ka[i] * w->ua[j];
            w->o[j] += w->S[i * dv + j] * w->qn[i], w->oa[j] += w->M[i * dv + j] * w->qa[i];
        }
    }
    w->row_mag[t * a->Hv + h] = cond_out(a, w, t, h);
}

/* Sequence s, head h, from its state row (the snapshot's values, zeros without a row). */
static void cond_head(const lmk_gdn_args *a, gd_cond *w, size_t s, size_t h)
{
    size_t lo, hi;
    lmk_seq_bounds(a->cu_seqlens, a->cu_is64, s, a->T, &lo, &hi);
    const int64_t row = a->state ? lmk_seq_slot(a->slots, a->slots_is64, s, a->n_slots) : -1;
    for (size_t i = 0; i < a->dk; i++)
        for (size_t j = 0; j < a->dv; j++) {
            const size_t at = (size_t)row * a->s_slot + h * a->s_head + i * a->s_k + j * a->s_v;
            w->S[i * a->dv + j] = row >= 0 ? lmk_float_load(a->state_dtype, a->state, at) : 0.0;
            w->M[i * a->dv + j] = fabs(w->S[i * a->dv + j]);
        }
    for (size_t t = lo; t < hi; t++)
        cond_step(a, w, t, h);
    if (hi > lo && lmk_seq_stores(a->slots, a->slots_is64, s, a->n_seq, a->n_slots, row)) {
        double mm = 0.0;
        for (size_t e = 0; e < a->dk * a->dv; e++)
            mm += w->M[e] * w->M[e];
        w->state_mag[(size_t)row * a->Hv + h] = sqrt(mm);
    }
}

/* The pass over every sequence and head (call it on the snapshot, before the reference runs). */
static void cond_run(const lmk_gdn_args *a, gd_cond *w)
{
    const size_t dk = a->dk, dv = a->dv;
    double *all = calloc(2 * dk * dv + 4 * dk + 4 * dv + a->T * a->Hv + a->n_slots * a->Hv + 1, sizeof *all);
    FZ_CHECK(all != NULL, "harness: out of memory");
    w->S = all, w->M = w->S + dk * dv, w->qn = w->M + dk * dv, w->qa = w->qn + dk, w->kn = w->qa + dk;
    w->ka = w->kn + dk, w->u = w->ka + dk, w->ua = w->u + dv, w->o = w->ua + dv, w->oa = w->o + dv;
    w->row_mag = w->oa + dv, w->state_mag = w->row_mag + a->T * a->Hv;
    for (size_t s = 0; s < a->n_seq; s++)
        for (size_t h = 0; h < a->Hv; h++)
            cond_head(a, w, s, h);
}

/* What a valid call is checked with: the regions as the call left them (memory holds the
 * reference's result by then), the tolerance, the first failure. */
typedef struct gd_check {
    fz_world *w;
    unsigned char *got[FZ_MAX_REGIONS];
    double tol;
    gd_cond cond;
    size_t n_bad, n_ill;
    char first[320];
} gd_check;

static const unsigned char *got_at(const gd_check *k, const void *p)
{
    const fz_region *r = fz_world_find(k->w, p);
    return k->got[r - k->w->r] + ((const unsigned char *)p - r->base);
}

/* Sums of one row's comparison: ||got - ref||^2, ||ref||^2, and the squared ulps of the stored
 * dtype at each element (half an ulp for the call's rounding, half for the reference's). */
typedef struct row_sum {
    double err2, ref2, round2;
    bool bad; /* a non-finite element */
} row_sum;

static void row_add(row_sum *x, lmk_dtype t, const void *got_p, const void *ref_p)
{
    const double got = lmk_float_load(t, got_p, 0), ref = lmk_float_load(t, ref_p, 0);
    const double d = got - ref, u = lmk_ulp(t, fmax(fabs(ref), fabs(got)));
    x->bad |= !isfinite(got) || !isfinite(ref);
    x->err2 += d * d, x->ref2 += ref * ref, x->round2 += u * u;
}

/* lmk.h's norm-wise bound on one row, or for an ill-conditioned row (magnitude `mag` over ten
 * times its norm) the same tolerance relative to its magnitude; the first failure is described
 * as `what`. */
static void row_check(gd_check *k, const row_sum *x, double mag, const char *what, size_t i0, size_t i1)
{
    const double err = sqrt(x->err2), norm = sqrt(x->ref2), round = sqrt(x->round2);
    if (!x->bad && err <= k->tol * norm + round)
        return;
    if (!x->bad && mag > 10.0 * norm && err <= k->tol * mag + round) {
        k->n_ill++;
        return;
    }
    if (k->n_bad++ == 0)
        snprintf(k->first, sizeof k->first, "%s %zu, head %zu: ||got - ref|| %.3g > %.0e * ||ref|| (%.3g) + rounding "
                 "%.3g%s (magnitude of its terms %.3g)", what, i0, i1, err, k->tol, norm, round,
                 x->bad ? " (non-finite)" : "", mag);
}

/* Every out row (a valid cu_seqlens covers each token once). */
static void check_out(gd_check *k, const lmk_gdn_args *a)
{
    const size_t es = lmk_dtype_size(a->dtype);
    for (size_t t = 0; t < a->T; t++)
        for (size_t h = 0; h < a->Hv; h++) {
            row_sum x = {0};
            for (size_t j = 0; j < a->dv; j++) {
                const unsigned char *p = (const unsigned char *)a->out + (t * a->o_tok + h * a->o_head + j) * es;
                row_add(&x, a->dtype, got_at(k, p), p);
            }
            row_check(k, &x, k->cond.row_mag[t * a->Hv + h], "out of token", t, h);
        }
}

/* The sequence that stores pool row r (the last naming it), or -1. */
static int64_t storer(const lmk_gdn_args *a, int64_t r)
{
    int64_t by = -1;
    for (size_t s = 0; s < a->n_seq; s++)
        if (lmk_seq_slot(a->slots, a->slots_is64, s, a->n_slots) == r &&
            lmk_seq_stores(a->slots, a->slots_is64, s, a->n_seq, a->n_slots, r))
            by = (int64_t)s;
    return by;
}

/* Every pool row of every head: stored by a sequence with tokens, within the bound of the
 * reference's row (precise calls); stored by an empty sequence or by none, its bytes unchanged. */
static void check_state(gd_check *k, const lmk_gdn_args *a, bool precise)
{
    const size_t es = lmk_dtype_size(a->state_dtype);
    for (size_t r = 0; r < a->n_slots; r++) {
        const int64_t by = storer(a, (int64_t)r);
        size_t lo = 0, hi = 0;
        if (by >= 0)
            lmk_seq_bounds(a->cu_seqlens, a->cu_is64, (size_t)by, a->T, &lo, &hi);
        const bool stored = hi > lo;
        for (size_t h = 0; h < a->Hv && (precise || !stored); h++) {
            row_sum x = {0};
            bool same = true;
            for (size_t i = 0; i < a->dk; i++)
                for (size_t j = 0; j < a->dv; j++) {
                    const size_t at = r * a->s_slot + h * a->s_head + i * a->s_k + j * a->s_v;
                    const unsigned char *p = (const unsigned char *)a->state + at * es;
                    if (stored)
                        row_add(&x, a->state_dtype, got_at(k, p), p);
                    else
                        same &= memcmp(got_at(k, p), fz_world_before(k->w, p), es) == 0;
                }
            if (stored)
                row_check(k, &x, k->cond.state_mag[r * a->Hv + h], "state row", r, h);
            else if (!same && k->n_bad++ == 0)
                snprintf(k->first, sizeof k->first, "state row %zu, head %zu changed, stored by %s", r, h,
                         by >= 0 ? "an empty sequence" : "no sequence");
        }
    }
}

static lmk_status call_op(const gd_call *c, lmk_stream *s)
{
    const lmk_gdn_io io = {.q = c->op[Q], .k = c->op[K], .v = c->op[V], .a = c->op[A], .b = c->op[B],
                           .A_log = c->op[A_LOG], .dt_bias = c->op[DT_BIAS], .cu_seqlens = c->op[CU],
                           .state_slots = c->op[SLOTS], .state = c->op[STATE], .z = c->op[Z],
                           .norm_w = c->op[NORM_W], .out = c->op[OUT]};
    return lmk_gated_delta_rule(s, c->null_io ? NULL : &io, c->null_p ? NULL : &c->p);
}

static void describe(const gd_call *c, char *buf, size_t n)
{
    const lmk_gdn_params *p = &c->p;
    snprintf(buf, n, "gated_delta_rule(T %u, Hk %u, Hv %u, dk %u, dv %u, map %d, scale %g, flags 0x%x, eps %g, "
             "offset %g, %s, gates %s, z %s, cu %s, slots %s, state %s) on %s", p->seq_len, p->n_k_heads,
             p->n_v_heads, p->k_dim, p->v_dim, (int)p->head_map, (double)p->scale, p->flags, (double)p->norm.eps,
             (double)p->norm.weight_offset, c->op[Q] ? lmk_dtype_name(lmk_buffer_dtype(c->op[Q])) : "q NULL",
             c->op[A_LOG] ? "raw" : "g, beta", c->op[Z] ? "given" : "NULL", c->op[CU] ? "given" : "NULL",
             c->op[SLOTS] ? "given" : "NULL",
             c->op[STATE] ? lmk_dtype_name(lmk_buffer_dtype(c->op[STATE])) : "NULL",
             c->s ? lmk_device_name(lmk_stream_device(c->s)) : "no stream");
}

/* Every byte outside the out elements: pool elements, with a hostile cu_seqlens, unchanged unless
 * some sequence names their row (with a valid one check_state judges them); any other byte
 * unchanged. */
static void check_bytes(const gd_check *k, const gd_marks *may, bool cu_ok, const char *what)
{
    for (int r = 0; r < k->w->n; r++) {
        const fz_region *g = &k->w->r[r];
        for (size_t j = 0; j < g->len; j++) {
            const uint16_t m = may->m[r][j];
            const unsigned char got = k->got[r][j];
            const bool ok = (m & 1) || ((m & 2) && (cu_ok || (m & 4))) || got == g->snap[j];
            FZ_CHECK(ok, "%s: byte %zu of region %d (%s) is 0x%02x; before the call 0x%02x, the reference 0x%02x", what,
                     j, r, (m & 2) ? "a pool element" : "no output element", got, g->snap[j], g->base[j]);
        }
    }
}

/* The bytes the call may change: bit 0 the out elements, bit 1 the pool's elements, bit 2 the
 * elements of pool rows some sequence names. */
static void may_change(fz_world *w, gd_marks *may, const lmk_gdn_args *a, const gd_view *v)
{
    mark_nd(w, may, a->out, v->t[OUT].n, v->t[OUT].stride, 3, lmk_dtype_size(a->dtype), 0);
    if (!a->state)
        return;
    const size_t es = lmk_dtype_size(a->state_dtype), n_row[4] = {1, v->pn[1], v->pn[2], v->pn[3]};
    mark_nd(w, may, a->state, v->pn, v->ps, 4, es, 1);
    for (size_t s = 0; s < a->n_seq; s++) {
        const int64_t row = lmk_seq_slot(a->slots, a->slots_is64, s, a->n_slots);
        if (row >= 0)
            mark_nd(w, may, (const unsigned char *)a->state + (size_t)row * a->s_slot * es, n_row, v->ps, 4, es, 2);
    }
}

/* A second run from the snapshot on a stream of another thread count gives the same bytes. */
static void check_rerun(fz_call *fc, const gd_call *c, const gd_check *k, lmk_stream *alt, const char *what)
{
    fz_world_restore(&fc->world);
    FZ_CHECK(call_op(c, alt) == LMK_OK && lmk_stream_sync(alt) == LMK_OK, "%s: the rerun failed", what);
    for (int r = 0; r < fc->world.n; r++) {
        const long long d = tst_bits_diff(fc->world.r[r].base, k->got[r], fc->world.r[r].len);
        FZ_CHECK(d < 0, "%s is not deterministic: byte %lld of region %d differs on a stream of %d threads", what, d, r,
                 lmk_device_threads(lmk_stream_device(alt)));
    }
    fz_stat("valid calls rerun on another thread count");
}

/* A call that returned LMK_OK: the reference's results (where specified), nothing else changed,
 * and (rerun) the same bytes on another thread count. */
static void check_valid(fz_call *fc, const gd_call *c, const gd_view *v, lmk_stream *alt, bool rerun)
{
    char what[384];
    describe(c, what, sizeof what);
    gd_check k = {.w = &fc->world};
    for (int r = 0; r < fc->world.n; r++) {
        k.got[r] = malloc(fc->world.r[r].len + 1);
        FZ_CHECK(k.got[r] != NULL, "harness: out of memory");
        memcpy(k.got[r], fc->world.r[r].base, fc->world.r[r].len);
    }
    fz_world_restore(&fc->world);
    const lmk_gdn_args a = args_of(c, v);
    const bool cu_ok = cu_valid(&a), precise = cu_ok && precise_domain(&a);
    k.tol = a.dtype == LMK_F32 && (!a.state || a.state_dtype == LMK_F32) ? 1e-4 : 4e-3;
    if (precise)
        cond_run(&a, &k.cond);
    lmk_ref_gated_delta_rule(&a);
    gd_marks may;
    marks_init(&may, &fc->world);
    may_change(&fc->world, &may, &a, v);
    check_bytes(&k, &may, cu_ok, what);
    marks_free(&may);
    if (precise)
        check_out(&k, &a);
    if (cu_ok && a.state)
        check_state(&k, &a, precise);
    FZ_CHECK(k.n_bad == 0, "%s: %zu rows outside lmk.h's precision or changed; first: %s", what, k.n_bad, k.first);
    if (k.n_ill)
        fz_stat("valid calls with ill-conditioned rows (bound relative to their terms)");
    free(k.cond.S);
    fz_stat(!cu_ok ? "valid calls with hostile cu_seqlens" : precise ? "valid calls checked against the reference"
                                                                     : "valid calls with wild values");
    if (rerun)
        check_rerun(fc, c, &k, alt, what);
    for (int r = 0; r < fc->world.n; r++)
        free(k.got[r]);
}

/* A rejected call: INVALID_ARGUMENT naming the op, and nothing changed. */
static void check_rejected(fz_world *w, const gd_call *c, lmk_status st, int verdict)
{
    char what[384];
    describe(c, what, sizeof what);
    fz_stat(verdict == INVALID ? "invalid calls" : "calls lmk may reject, rejected");
    FZ_CHECK(st == LMK_ERR_INVALID_ARGUMENT, "%s %s returned %s (\"%s\")", verdict == INVALID ? "invalid" : "rejected",
             what, lmk_status_name(st), lmk_last_error());
    FZ_CHECK(fz_message_names("gated_delta_rule"), "message \"%s\" does not name gated_delta_rule", lmk_last_error());
    FZ_CHECK(fz_world_changed(w, NULL, NULL, 0) == NULL, "a rejected %s changed a byte", what);
}

static void tally(const gd_call *c, int verdict)
{
    fz_stat("inputs");
    if (verdict == INVALID)
        return;
    if (c->packed)
        fz_stat("calls with q, k, v slices of one packed row");
    if (c->op[SLOTS] && c->slot_fill == SLOTS_DUPLICATE)
        fz_stat("calls with duplicate slots");
    if (c->op[STATE] && lmk_buffer_stride(c->op[STATE], 2) < lmk_buffer_stride(c->op[STATE], 3))
        fz_stat("calls with a dk-fastest pool");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t buf[GD_BYTES];
    fz_in in = fz_extend(data, size, buf, GD_BYTES);
    fz_level *lv = fz_level_get(fz_pick(&in, 3));
    const long live_before = atomic_load(&fz_n_live);
    fz_call fc;
    memset(&fc, 0, sizeof fc);
    uint64_t r = fz_u64(&in);
    fc.rng = tst_rng_make(r);
    fc.sane = fz_pick(&in, 2) == 0;
    gd_call c;
    memset(&c, 0, sizeof c);
    c.e = &lv->env, c.s = lv->env.stream;
    build(&in, &fc, &c);
    for (unsigned k = fc.sane ? 0 : 1 + fz_pick(&in, 3); k > 0; k--)
        corrupt(&in, &fc, &c);
    fz_world_add(&fc.world, c.e->arena, FZ_ARENA_BYTES);
    fill_all(&in, &fc, &c, &r);
    fz_world_snapshot(&fc.world);
    gd_view v;
    memset(&v, 0, sizeof v);
    const int verdict = oracle(&fc.world, &c, &v);

    lmk_clear_error();
    const long allocs_before = atomic_load(&fz_n_allocs);
    const lmk_status st = call_op(&c, c.s);
    if (st == LMK_OK)
        FZ_CHECK(lmk_stream_sync(c.s) == LMK_OK, "lmk_stream_sync after a valid gated_delta_rule");
    FZ_CHECK(atomic_load(&fz_n_allocs) == allocs_before, "gated_delta_rule allocated %ld times",
             atomic_load(&fz_n_allocs) - allocs_before);
    tally(&c, verdict);
    if (verdict == VALID || (verdict == MAY_REJECT && st == LMK_OK)) {
        char what[384];
        describe(&c, what, sizeof what);
        FZ_CHECK(st == LMK_OK, "valid %s returned %s (\"%s\")", what, lmk_status_name(st), lmk_last_error());
        if (verdict == MAY_REJECT)
            fz_stat("calls lmk may reject, accepted");
        check_valid(&fc, &c, &v, lv->alt[fz_pick(&in, 2)], fz_pick(&in, 2) == 0);
    } else {
        check_rejected(&fc.world, &c, st, verdict);
    }
    fz_call_end(&fc, live_before);
    return 0;
}
