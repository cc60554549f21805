/*
 * fuzz_causal_conv1d.c - libFuzzer harness for lmk_causal_conv1d (lmk.h "causal_conv1d"): the
 * depthwise causal convolution of the Gated DeltaNet layers, over sequences packed along T, with
 * its state pool.
 *
 * One input is one call, read from the input's bytes and then from a stream seeded by their hash
 * (so that short inputs make rich calls too), on a CPU device capped at the scalar level, at AVX2,
 * or at the best level. Parameters: small valid ones (T up to 64, C up to 64, every width 2..8,
 * SiLU or none; one call in eight 96-160 channels, width 6-8, 128-256 sequences and a state, large
 * enough for the worker pool and a channel split of several shares), or wild ones (0, huge, width
 * 0/1/9/2^32-1, unknown activations). Operands: dense
 * buffers declared in any shape of the right count, [T, C] views with padded, loose or zero token
 * strides, x and y side by side in one packed row, y == x in place (the same handle or another
 * view of the same elements), buffers made every way fuzz_common.h offers (allocations, wraps,
 * views of the shared arena, so operands may overlap, views inside allocations, wrong counts,
 * another device, NULL); a state pool [n_slots, W-1, C] dense, in Hugging Face's [B, C, W-1]
 * layout, padded, in any nesting order or with loose (possibly overlapping) strides, in an
 * allocation of its own or in the arena; cu_seqlens and state_slots i32 or i64. Hostile device
 * data: cu_seqlens valid (empty sequences, decode batches of one-token sequences), perturbed
 * (non-monotone, c0 != 0, past T) or wild (negative, INT_MIN, INT64_MIN, 2^32 + small); slots
 * distinct, duplicated, or padding (-1, n_slots, huge, INT_MIN, INT64_MIN, values whose low 32
 * bits name a row). Inputs meant to be invalid break one to three rules on top.
 *
 * An oracle written from lmk.h (not from op.c) decides: valid, invalid, or "may reject" (lmk.h
 * lets lmk reject a layout it cannot prove disjoint: extents that meet without shared bytes,
 * other than tensors side by side in one row, and state pools, whose overlap lmk judges on
 * extents). Then:
 *   valid:   LMK_OK. The call's results are compared with lmk_ref_causal_conv1d run over the
 *            snapshot with lmk_causal_conv1d_args built from the same buffers. With a valid
 *            cu_seqlens (0 = c0 <= ... <= cn = T): every pool element the reference's bits (the
 *            state is a bit copy), every y element within lmk.h's precision (one ulp of y's dtype
 *            plus 1e-6 * (|bias| + sum |weight * xx|) of the float64 result, plus the half ulp of
 *            the reference's own rounding) when every input is finite and |v| <= 4; with a hostile
 *            cu_seqlens (unspecified outputs) only the y elements and the pool rows some sequence
 *            names may change. Every other byte anywhere is unchanged. A rerun from the snapshot
 *            on a stream of another thread count gives the same bytes (lmk.h: deterministic).
 *   invalid: LMK_ERR_INVALID_ARGUMENT, a message naming causal_conv1d, and no byte changed;
 *   always:  no crash, no heap allocation inside the call, no leak after freeing the buffers.
 */
#include "fuzz_common.h"
#include "ops/causal_conv1d/causal_conv1d.h"
#include "ops/varlen.h"

#include <float.h>

enum { X, WEIGHT, BIAS, CU, SLOTS, STATE, Y, N_OPS };
static const char *const k_names[N_OPS] = {"x", "weight", "bias", "cu_seqlens", "state_slots", "conv_state", "y"};
enum { VALID, INVALID, MAY_REJECT };
enum { CU_VALID, CU_PERTURBED, CU_WILD };                 /* what cu_seqlens is filled with */
enum { SLOTS_DISTINCT, SLOTS_DUPLICATE, SLOTS_PADDING };  /* what state_slots is filled with */

#define CV_BYTES 512            /* bytes one call is read from (the input, then its hash's stream) */
#define CV_MAX_T 64
#define CV_MAX_C 160
#define CV_ARENA_BUDGET (40u << 10) /* x and y together, so the other operands fit beside them */

/* ---- one call ---- */

typedef struct cv_call {
    lmk_causal_conv1d_params p;
    bool null_p;
    lmk_stream *s;
    fz_level *lv;
    fz_env *e;
    lmk_buffer *op[N_OPS];
    size_t bump;          /* next free byte of the arena */
    size_t T, C, W;       /* the sizes the operands were built for (the params may be wild) */
    unsigned cu_fill, slot_fill, seq_mode;
    bool packed;          /* x and y built side by side in one row */
    bool big;             /* sized for the worker pool */
} cv_call;

/* Room for more buffers and regions (fz_call holds FZ_MAX_BUFS and FZ_MAX_REGIONS). */
static bool room(const fz_call *fc)
{
    return fc->n_bufs < FZ_MAX_BUFS - 4 && fc->world.n < FZ_MAX_REGIONS - 3;
}

/* `bytes` of the arena after the last placed operand, at a 64-byte boundary plus a random gap
 * (and now and then a start that is only element-aligned); SIZE_MAX when full. */
static size_t place(fz_in *in, cv_call *c, size_t bytes, size_t es)
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
static lmk_buffer *arena_view(fz_call *fc, const cv_call *c, size_t off, lmk_dtype t, int nd, const size_t *shape,
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

/* A dense operand of a*b elements, declared [a*b], [a, b], [b, a] or [a, 1, b]: lmk.h counts a
 * dense buffer's elements whatever its shape. */
static lmk_buffer *dense2(fz_in *in, fz_call *fc, cv_call *c, lmk_dtype t, size_t a, size_t b)
{
    const size_t es = lmk_dtype_size(t), off = place(in, c, a * b * es, es);
    if (off == SIZE_MAX)
        return NULL;
    size_t shape[3] = {a, b, 0};
    switch (fz_pick(in, 5)) {
    case 0:
        shape[0] = a * b;
        return arena_view(fc, c, off, t, 1, shape, NULL);
    case 1:
        shape[0] = b, shape[1] = a;
        return arena_view(fc, c, off, t, 2, shape, NULL);
    case 2:
        shape[1] = 1, shape[2] = b;
        return arena_view(fc, c, off, t, 3, shape, NULL);
    default:
        return arena_view(fc, c, off, t, 2, shape, NULL);
    }
}

/* A [T, C] view with token stride ts at arena byte off. */
static lmk_buffer *tc_view(fz_call *fc, cv_call *c, size_t off, lmk_dtype t, size_t T, size_t C, size_t ts)
{
    const size_t shape[2] = {T, C}, strides[2] = {ts, 1};
    return arena_view(fc, c, off, t, 2, shape, strides);
}

/* A [T, C] view placed on its own with token stride ts. */
static lmk_buffer *strided2(fz_in *in, fz_call *fc, cv_call *c, lmk_dtype t, size_t T, size_t C, size_t ts)
{
    const size_t es = lmk_dtype_size(t), off = place(in, c, ((T - 1) * ts + C) * es, es);
    return off == SIZE_MAX ? NULL : tc_view(fc, c, off, t, T, C, ts);
}

/* A token stride that may make rows overlap (below C, 0) or leave gaps. */
static size_t loose_stride(fz_in *in, size_t C)
{
    switch (fz_pick(in, 5)) {
    case 0: return 0;
    case 1: return C > 1 ? C - 1 : 1;
    case 2: return C / 2;
    case 3: return C + 1 + fz_pick(in, 8);
    default: return fz_pick(in, (unsigned)(2 * C + 1 < 256 ? 2 * C + 1 : 256));
    }
}

/* A buffer made by fz_make_buffer (any way, any count when not sane), or a dense one when the
 * call's tables are nearly full or a sane buffer would exceed FZ_BUF_CAP. */
static lmk_buffer *made(fz_in *in, fz_call *fc, cv_call *c, lmk_dtype t, size_t elems)
{
    if (!room(fc) || fc->n_bufs > FZ_MAX_BUFS - 8 || elems * lmk_dtype_size(t) > FZ_BUF_CAP)
        return dense2(in, fc, c, t, elems, 1);
    return fz_make_buffer(c->e, fc, in, t, elems);
}

/* Another view of b's elements with b's layout: in place through another handle. */
static lmk_buffer *twin(fz_call *fc, cv_call *c, const lmk_buffer *b, size_t T, size_t C)
{
    const uintptr_t p = (uintptr_t)lmk_buffer_data(b), a = (uintptr_t)c->e->arena;
    if (p < a || p >= a + FZ_ARENA_BYTES)
        return NULL;
    const size_t ts = lmk_buffer_ndim(b) == 2 && lmk_buffer_dim(b, 0) == T ? lmk_buffer_stride(b, 0) : C;
    return tc_view(fc, c, (size_t)(p - a), lmk_buffer_dtype(b), T, C, ts);
}

/* ---- the operands of a call ---- */

static const lmk_dtype k_floats[3] = {LMK_F32, LMK_BF16, LMK_F16};

/* x and y: separate, padded, side by side in one row, in place, made every way, loose strides. */
static void build_xy(fz_in *in, fz_call *fc, cv_call *c, lmk_dtype dt)
{
    const size_t T = c->T, C = c->C, es = lmk_dtype_size(dt);
    switch (fz_pick(in, 9)) {
    case 1: /* padded token strides */
        c->op[X] = strided2(in, fc, c, dt, T, C, C + fz_pick(in, 9));
        c->op[Y] = fz_pick(in, 2) ? strided2(in, fc, c, dt, T, C, C + fz_pick(in, 9)) : NULL;
        break;
    case 2: { /* [x | gap | y] or [y | gap | x] rows of one packed buffer */
        const size_t gap = fz_pick(in, 3) ? 0 : fz_pick(in, 5), row = 2 * C + gap + fz_pick(in, 4);
        const size_t off = place(in, c, ((T - 1) * row + 2 * C + gap) * es, es);
        if (off == SIZE_MAX)
            break;
        const bool y_first = fz_pick(in, 2);
        c->op[X] = tc_view(fc, c, off + (y_first ? (C + gap) * es : 0), dt, T, C, row);
        c->op[Y] = tc_view(fc, c, off + (y_first ? 0 : (C + gap) * es), dt, T, C, row);
        c->packed = c->op[X] && c->op[Y];
        break;
    }
    case 3: /* in place, one handle */
        c->op[X] = fz_pick(in, 2) ? dense2(in, fc, c, dt, T, C) : strided2(in, fc, c, dt, T, C, C + fz_pick(in, 5));
        c->op[Y] = c->op[X];
        break;
    case 4: /* in place through another view of the same elements */
        c->op[X] = fz_pick(in, 2) ? dense2(in, fc, c, dt, T, C) : strided2(in, fc, c, dt, T, C, C + fz_pick(in, 5));
        c->op[Y] = c->op[X] ? twin(fc, c, c->op[X], T, C) : NULL;
        break;
    case 5: /* made every way: they may overlap each other and anything else */
        c->op[X] = made(in, fc, c, dt, T * C);
        c->op[Y] = made(in, fc, c, dt, T * C);
        break;
    case 6: /* an input whose rows overlap or leave gaps */
        c->op[X] = strided2(in, fc, c, dt, T, C, loose_stride(in, C));
        break;
    case 7: /* an output with loose token strides: overlapping rows are invalid */
        c->op[Y] = strided2(in, fc, c, dt, T, C, loose_stride(in, C));
        break;
    default:
        break;
    }
    if (!c->op[X])
        c->op[X] = dense2(in, fc, c, dt, T, C);
    if (!c->op[Y])
        c->op[Y] = dense2(in, fc, c, dt, T, C);
}

/* A strided view of `bytes` in an allocation of its own (offset `pre`), or in the arena. */
static lmk_buffer *own_or_arena(fz_in *in, fz_call *fc, cv_call *c, lmk_dtype t, int nd, const size_t *n,
                                const size_t *st, size_t span)
{
    const size_t es = lmk_dtype_size(t);
    if (fz_pick(in, 3) == 0 || !room(fc)) {
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

/* Strides of a pool of shape n[0..nd): nested in some order of the axes (dense; the last two
 * swapped, as Hugging Face's conv cache; any order), each level padded or not; or loose: any
 * strides, overlapping elements included. */
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
            st[i] = fz_pick(in, 4) == 0 ? 0 : fz_pick(in, 40);
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

/* A state pool [rows, n[1], n[2]] of dtype t. */
static lmk_buffer *make_pool(fz_in *in, fz_call *fc, cv_call *c, lmk_dtype t, const size_t n[3])
{
    size_t st[3];
    pool_strides(in, fc->sane, n, 3, st);
    size_t last = 0;
    for (int i = 0; i < 3; i++)
        last += (n[i] ? n[i] - 1 : 0) * st[i];
    const size_t span = n[0] && n[1] && n[2] ? (last + 1) * lmk_dtype_size(t) : 0;
    return own_or_arena(in, fc, c, t, 3, n, st, span);
}

/* cu_seqlens, the state pool and state_slots. seq_mode 0: no cu_seqlens; 1: a few sequences;
 * 2: a decode batch (T one-token sequences, then empty ones); 3: up to 2T + 3 sequences. A big
 * call has 128-256 sequences (most of them empty) and a state. */
static void build_seqs(fz_in *in, fz_call *fc, cv_call *c, lmk_dtype dt)
{
    size_t n_seq = 1;
    c->seq_mode = c->big ? 2 + fz_pick(in, 2) : fz_pick(in, 4);
    if (c->seq_mode) {
        n_seq = c->seq_mode == 1 ? 1 + fz_pick(in, 6)
                : c->big         ? 128 + fz_pick(in, 129)
                : c->seq_mode == 2 ? c->T + fz_pick(in, 3) : 1 + fz_pick(in, (unsigned)(2 * c->T + 3));
        c->op[CU] = dense2(in, fc, c, fz_pick(in, 2) ? LMK_I64 : LMK_I32, n_seq + 1, 1);
    }
    const unsigned k = fz_pick(in, 16);
    c->cu_fill = k < 12 ? CU_VALID : k < 14 ? CU_PERTURBED : CU_WILD;
    c->slot_fill = fz_pick(in, 3);
    if (!c->big && fz_pick(in, 4) == 0)
        return;
    size_t rows = fz_pick(in, 8) == 0 ? 0 : 1 + fz_pick(in, 6);
    if (c->seq_mode >= 2 && fz_pick(in, 2)) { /* a row for every sequence, and rows no sequence names */
        const size_t want = n_seq + fz_pick(in, 3);
        rows = want < 64 ? want : 64;
    }
    const size_t n[3] = {rows, c->W - 1, c->C};
    c->op[STATE] = make_pool(in, fc, c, dt, n);
    if (fz_pick(in, 3))
        c->op[SLOTS] = dense2(in, fc, c, fz_pick(in, 2) ? LMK_I64 : LMK_I32, n_seq, 1);
}

/* Parameters; *big: a call large enough for the worker pool (many channels, wide, and with
 * build_seqs's many sequences and a state, over the bytes at which lmk_cpu_parallel splits). */
static void pick_params(fz_in *in, bool sane, lmk_causal_conv1d_params *p, bool *big)
{
    const unsigned size = fz_pick(in, 8);
    *big = size == 7;
    p->seq_len = size < 5 ? 1 + fz_pick(in, 16) : 1 + fz_pick(in, CV_MAX_T);
    p->channels = *big ? 96 + fz_pick(in, CV_MAX_C - 95) : 1 + fz_pick(in, 64);
    p->width = *big ? 6 + fz_pick(in, 3) : 2 + fz_pick(in, 7);
    p->activation = (lmk_activation)fz_pick(in, 2);
    if (sane)
        return;
    static const uint32_t widths[] = {0, 1, 9, 16, 255, UINT32_MAX, 0x80000002u, 2, 8};
    switch (fz_pick(in, 5)) {
    case 0: p->seq_len = fz_dim(in); break;
    case 1: p->channels = fz_dim(in); break;
    case 2: p->width = widths[fz_pick(in, 9)]; break;
    case 3: p->activation = (lmk_activation)(int32_t)(fz_pick(in, 2) ? fz_u32(in) : 2 + fz_pick(in, 3)); break;
    default: break;
    }
}

/* Everything of a call, for sizes that fit the arena (wild parameters get operands of capped
 * sizes, which the oracle then finds wrong). */
static void build(fz_in *in, fz_call *fc, cv_call *c)
{
    pick_params(in, fc->sane, &c->p, &c->big);
    c->T = c->p.seq_len ? (c->p.seq_len < CV_MAX_T ? c->p.seq_len : CV_MAX_T) : 1;
    c->C = c->p.channels ? (c->p.channels < CV_MAX_C ? c->p.channels : CV_MAX_C) : 1;
    c->W = c->p.width < 2 ? 2 : c->p.width > 8 ? 8 : c->p.width;
    const lmk_dtype dt = k_floats[fz_pick(in, 3)];
    while (c->T > 1 && 2 * c->T * c->C * lmk_dtype_size(dt) > CV_ARENA_BUDGET)
        c->T /= 2;
    if (c->p.seq_len >= 1 && c->p.seq_len <= CV_MAX_T)
        c->p.seq_len = (uint32_t)c->T;
    c->bump = 64 * fz_pick(in, 8);
    build_xy(in, fc, c, dt);
    const size_t wshape = fz_pick(in, 3);
    c->op[WEIGHT] = fz_pick(in, 8) == 0 ? made(in, fc, c, k_floats[fz_pick(in, 3)], c->C * c->W)
                    : wshape == 0       ? dense2(in, fc, c, k_floats[fz_pick(in, 3)], c->C, c->W)
                                        : dense2(in, fc, c, k_floats[fz_pick(in, 3)], c->C * c->W, 1);
    if (fz_pick(in, 3))
        c->op[BIAS] = dense2(in, fc, c, k_floats[fz_pick(in, 3)], c->C, 1);
    build_seqs(in, fc, c, dt);
}

/* ---- breaking rules ---- */

/* The arena offset of b's first element, or SIZE_MAX when b lives elsewhere. */
static size_t arena_off(const cv_call *c, const lmk_buffer *b)
{
    const uintptr_t p = (uintptr_t)lmk_buffer_data(b), a = (uintptr_t)c->e->arena;
    return b && p >= a && p < a + FZ_ARENA_BYTES ? (size_t)(p - a) : SIZE_MAX;
}

/* Another 1-D view of b's first bytes: dtype t, n elements, dense or with stride 2 (b itself when
 * it cannot be made). */
static lmk_buffer *review(fz_call *fc, cv_call *c, lmk_buffer *b, lmk_dtype t, size_t n, bool strided)
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
static lmk_buffer *on_other_device(fz_call *fc, cv_call *c, lmk_buffer *b)
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

/* y as a dense [T, C] view over another operand's first bytes (shifted by 0-3 elements). */
static void y_over(fz_in *in, fz_call *fc, cv_call *c, const lmk_buffer *w)
{
    const lmk_dtype t = lmk_buffer_dtype(c->op[Y]);
    const size_t es = lmk_dtype_size(t), n = c->T * c->C;
    size_t off = arena_off(c, w);
    if (off == SIZE_MAX)
        return;
    off += es * fz_pick(in, 4);
    off -= off % es;
    lmk_buffer *v = off <= FZ_ARENA_BYTES && n * es <= FZ_ARENA_BYTES - off ? arena_view(fc, c, off, t, 1, &n, NULL)
                                                                            : NULL;
    if (v)
        c->op[Y] = v;
}

/* The state pool moved over another operand, given a wrong shape, or overlapping elements. */
static void state_wrong(fz_in *in, fz_call *fc, cv_call *c, lmk_buffer *w)
{
    const lmk_buffer *s = c->op[STATE];
    if (!s || lmk_buffer_ndim(s) != 3)
        return;
    size_t n[4] = {lmk_buffer_dim(s, 0), lmk_buffer_dim(s, 1), lmk_buffer_dim(s, 2), 2};
    size_t st[4] = {lmk_buffer_stride(s, 0), lmk_buffer_stride(s, 1), lmk_buffer_stride(s, 2), 1};
    const lmk_dtype t = lmk_buffer_dtype(s);
    size_t off = arena_off(c, s);
    int nd = 3;
    switch (fz_pick(in, 4)) {
    case 0: /* over another operand */
        off = arena_off(c, w);
        break;
    case 1: /* an axis of stride 0, or two axes of one stride */
        st[fz_pick(in, 3)] = fz_pick(in, 2) ? 0 : st[fz_pick(in, 3)];
        break;
    case 2: /* one row more or less in the middle axes */
        n[1 + fz_pick(in, 2)] += fz_pick(in, 2) ? 1 : (size_t)-1;
        break;
    default: /* 4-D or 2-D */
        nd = fz_pick(in, 2) ? 4 : 2;
        break;
    }
    if (off == SIZE_MAX || n[1] == (size_t)-1 || n[2] == (size_t)-1)
        return;
    size_t last = 0;
    for (int i = 0; i < nd; i++)
        last += (n[i] ? n[i] - 1 : 0) * st[i];
    const size_t es = lmk_dtype_size(t);
    if (off % es == 0 && (last + 1) * es <= FZ_ARENA_BYTES - off && room(fc)) {
        lmk_buffer *b = NULL;
        if (lmk_buffer_view_strided(c->e->parent, off, t, n, st, nd, &b) == LMK_OK) {
            fz_call_keep(fc, b);
            fz_world_add(&fc->world, c->e->arena, FZ_ARENA_BYTES);
            c->op[STATE] = b;
        }
    }
}

/* Breaks one rule of lmk.h (or, by chance, none: the oracle decides). */
static void corrupt(fz_in *in, fz_call *fc, cv_call *c)
{
    static const lmk_dtype any[] = {LMK_F32, LMK_F16, LMK_BF16, LMK_U8, LMK_U16, LMK_U32, LMK_I32, LMK_I64, LMK_F8E4M3};
    const int w = (int)fz_pick(in, N_OPS);
    lmk_buffer *b = c->op[w];
    switch (fz_pick(in, 16)) {
    case 0: c->s = NULL; break;
    case 1: c->null_p = true; break;
    case 2: case 3: c->op[w] = NULL; break;
    case 4: c->op[w] = review(fc, c, b, any[fz_pick(in, 9)], lmk_buffer_element_count(b), false); break;
    case 5: c->op[w] = review(fc, c, b, lmk_buffer_dtype(b), lmk_buffer_element_count(b) + fz_pick(in, 3) - 1, false);
        break;
    case 6: c->op[w] = review(fc, c, b, lmk_buffer_dtype(b), lmk_buffer_element_count(b), true); break;
    case 7: c->op[w] = on_other_device(fc, c, b); break;
    case 8: if (b) y_over(in, fc, c, b); break;
    case 9: case 10: state_wrong(in, fc, c, b ? b : c->op[X]); break;
    case 11: /* y over x with another token stride or one element on */
        if (arena_off(c, c->op[X]) != SIZE_MAX) {
            const size_t es = lmk_dtype_size(lmk_buffer_dtype(c->op[X]));
            const size_t off = arena_off(c, c->op[X]) + (fz_pick(in, 2) ? es : 0);
            const size_t ts = c->C + fz_pick(in, 3), span = ((c->T - 1) * ts + c->C) * es;
            lmk_buffer *v = NULL;
            if (span <= FZ_ARENA_BYTES - off)
                v = tc_view(fc, c, off, lmk_buffer_dtype(c->op[X]), c->T, c->C, ts);
            if (v)
                c->op[Y] = v;
        }
        break;
    case 12: c->op[STATE] = NULL; break;
    case 13: c->op[w] = c->op[fz_pick(in, N_OPS)]; break;
    case 14: c->op[w] = made(in, fc, c, any[fz_pick(in, 9)], b ? lmk_buffer_element_count(b) : 1 + fz_pick(in, 9));
        break;
    default: /* cu_seqlens of one entry, or strided */
        if (c->op[CU])
            c->op[CU] = review(fc, c, c->op[CU], lmk_buffer_dtype(c->op[CU]), fz_pick(in, 2), fz_pick(in, 2));
        break;
    }
}

/* ---- values ---- */

/* cu_seqlens: a valid partition of T (decode batches: one token a sequence, then empty ones),
 * the same with one entry broken, or wild values. */
static void fill_cu(fz_in *in, const cv_call *c, const lmk_buffer *b, uint64_t *r)
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
static void fill_slots(fz_in *in, const cv_call *c, const lmk_buffer *b, uint64_t rows, uint64_t *r)
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

/* Every value of the call. Operands may share bytes: later fills win, and the snapshot taken
 * after is what the call starts from (the oracle reads the values from it). */
static void fill_all(fz_in *in, fz_call *fc, cv_call *c, uint64_t *r)
{
    for (int i = 0; i < fc->world.n; i++) /* random bytes everywhere: what an op must not touch */
        for (size_t j = 0; j < fc->world.r[i].len; j += 8) {
            const uint64_t x = fz_rand(r);
            memcpy(fc->world.r[i].base + j, &x, fc->world.r[i].len - j < 8 ? fc->world.r[i].len - j : 8);
        }
    fz_fill_values(in, fc->sane, c->op[STATE], r, -2.0, 2.0);
    fz_fill_values(in, fc->sane, c->op[WEIGHT], r, -1.0, 1.0);
    fz_fill_values(in, fc->sane, c->op[BIAS], r, -1.0, 1.0);
    fz_fill_values(in, fc->sane, c->op[X], r, -2.0, 2.0);
    if (c->op[CU])
        fill_cu(in, c, c->op[CU], r);
    const lmk_buffer *s = c->op[STATE];
    if (c->op[SLOTS])
        fill_slots(in, c, c->op[SLOTS], s && lmk_buffer_ndim(s) == 3 ? lmk_buffer_dim(s, 0) : 4, r);
}

/* ---- lmk.h's rules: the oracle ---- */

/* The call as lmk.h resolves it. */
typedef struct cv_view {
    lmk_tensor3 t[N_OPS]; /* x and y [T, 1, C]; weight, bias, cu, slots flat; STATE unused */
    size_t pn[3], ps[3];  /* the pool's shape and strides */
    size_t n_seq;
} cv_view;

/* A dense buffer of one of the dtypes in `ok` (a float vector or an index array) with exactly n
 * elements, or at least n when at_least. */
static bool flat_ok(const lmk_buffer *b, bool floats, size_t n, bool at_least)
{
    const lmk_dtype t = lmk_buffer_dtype(b);
    const size_t have = lmk_buffer_element_count(b);
    const bool dtype_ok = floats ? fz_is_float(t) : t == LMK_I32 || t == LMK_I64;
    return dtype_ok && lmk_buffer_is_contiguous(b) && (at_least ? have >= n : have == n);
}

/* Every rule but the overlaps, as lmk.h lists them. */
static bool rules_ok(const cv_call *c, cv_view *v)
{
    const lmk_causal_conv1d_params *p = &c->p;
    lmk_buffer *const *o = c->op;
    if (!c->s || c->null_p || !o[X] || !o[WEIGHT] || !o[Y])
        return false;
    if (!p->seq_len || !p->channels || p->width < 2 || p->width > 8 ||
        (p->activation != LMK_ACT_NONE && p->activation != LMK_ACT_SILU))
        return false;
    const size_t T = p->seq_len, C = p->channels, W = p->width;
    if (!fz_operand2(o[X], T, C, &v->t[X]) || !fz_operand2(o[Y], T, C, &v->t[Y]))
        return false;
    const lmk_dtype dt = lmk_buffer_dtype(o[X]);
    if (lmk_buffer_dtype(o[Y]) != dt || !fz_is_float(dt))
        return false;
    if (!flat_ok(o[WEIGHT], true, C * W, false) || (o[BIAS] && !flat_ok(o[BIAS], true, C, false)))
        return false;
    if (o[CU] && !flat_ok(o[CU], false, 2, true))
        return false;
    v->n_seq = o[CU] ? lmk_buffer_element_count(o[CU]) - 1 : 1;
    if (o[SLOTS] && (!o[STATE] || !flat_ok(o[SLOTS], false, v->n_seq, false)))
        return false;
    if (o[STATE]) {
        const lmk_buffer *s = o[STATE];
        if (lmk_buffer_ndim(s) != 3 || lmk_buffer_dim(s, 1) != W - 1 || lmk_buffer_dim(s, 2) != C ||
            lmk_buffer_dtype(s) != dt)
            return false;
        for (int i = 0; i < 3; i++)
            v->pn[i] = lmk_buffer_dim(s, i), v->ps[i] = lmk_buffer_stride(s, i);
    }
    for (int i = 0; i < N_OPS; i++)
        if (o[i] && lmk_buffer_device(o[i]) != lmk_stream_device(c->s))
            return false;
    return true;
}

/* Marks: for every byte of every region, the operands whose elements hold it (bit per operand),
 * and the operands that hold a byte twice. */
typedef struct cv_marks {
    uint8_t *m[FZ_MAX_REGIONS];
    bool self[8];
} cv_marks;

static void marks_init(cv_marks *mk, const fz_world *w)
{
    memset(mk, 0, sizeof *mk);
    for (int r = 0; r < w->n; r++) {
        mk->m[r] = calloc(w->r[r].len + 1, 1);
        FZ_CHECK(mk->m[r] != NULL, "harness: out of memory");
    }
}

static void marks_free(cv_marks *mk)
{
    for (int r = 0; r < FZ_MAX_REGIONS; r++)
        free(mk->m[r]);
}

/* Marks the elements of an nd-axis layout (nd <= 3) with bit `op` (< 8). */
static void mark_nd(fz_world *w, cv_marks *mk, const unsigned char *base, const size_t *n, const size_t *st, int nd,
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
                 "region", op, k_names[op]);
        uint8_t *m = mk->m[r - w->r] + (p - r->base);
        for (size_t i = 0; i < es; i++) {
            mk->self[op] |= (m[i] >> op & 1) != 0;
            m[i] |= (uint8_t)(1u << op);
        }
    }
}

/* The operands (bit per operand) that share a byte with operand `a`. */
static unsigned marks_sharing(const fz_world *w, const cv_marks *mk, int a)
{
    unsigned with = 0;
    for (int r = 0; r < w->n; r++)
        for (size_t i = 0; i < w->r[r].len; i++)
            if (mk->m[r][i] >> a & 1)
                with |= mk->m[r][i];
    return with & ~(1u << a);
}

/* The byte extent [lo, hi) of an operand (the pool: of its shape and strides). */
static void extent(const cv_view *v, int op, uintptr_t *lo, uintptr_t *hi)
{
    const bool pool = op == STATE;
    const size_t *n = pool ? v->pn : v->t[op].n, *st = pool ? v->ps : v->t[op].stride;
    size_t last = 0;
    bool empty = false;
    for (int i = 0; i < 3; i++) {
        empty |= n[i] == 0;
        last += (n[i] ? n[i] - 1 : 0) * st[i];
    }
    *lo = (uintptr_t)v->t[op].data;
    *hi = empty ? *lo : *lo + (last + 1) * v->t[op].es;
}

/* Output `out` (y or the pool) against every other operand: INVALID when it shares a byte with
 * one (y may be exactly x) or holds a byte twice; MAY_REJECT when extents meet without shared
 * bytes (except side by side in one row) or its layout is not nested; else VALID. */
static int judge_output(const fz_world *w, const cv_marks *mk, const cv_call *c, const cv_view *v, int out)
{
    if (mk->self[out])
        return INVALID;
    int verdict = VALID;
    if (out == STATE ? !fz_nested(v->pn, v->ps, 3) : !fz_nested(v->t[out].n, v->t[out].stride, 3))
        verdict = MAY_REJECT;
    uintptr_t lo, hi;
    extent(v, out, &lo, &hi);
    const unsigned shared = marks_sharing(w, mk, out);
    for (int i = 0; i < N_OPS; i++) {
        if (i == out || !c->op[i] || (out == Y && i == X && fz_same3(&v->t[Y], &v->t[X])))
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

/* The overlap rules on the element bytes (the call's rules already hold). */
static int overlaps(fz_world *w, const cv_call *c, cv_view *v)
{
    lmk_buffer *const *o = c->op;
    for (int i = WEIGHT; i <= SLOTS; i++)
        if (o[i])
            v->t[i] = fz_flat3(o[i]);
    if (o[STATE])
        v->t[STATE] =
            (lmk_tensor3){.data = lmk_buffer_data(o[STATE]), .es = lmk_dtype_size(lmk_buffer_dtype(o[STATE]))};
    cv_marks mk;
    marks_init(&mk, w);
    for (int i = 0; i < N_OPS; i++)
        if (o[i] && i != STATE)
            mark_nd(w, &mk, v->t[i].data, v->t[i].n, v->t[i].stride, 3, v->t[i].es, i);
    if (o[STATE])
        mark_nd(w, &mk, v->t[STATE].data, v->pn, v->ps, 3, v->t[STATE].es, STATE);
    const int vy = judge_output(w, &mk, c, v, Y), vs = o[STATE] ? judge_output(w, &mk, c, v, STATE) : VALID;
    marks_free(&mk);
    return vy == INVALID || vs == INVALID ? INVALID : vy == MAY_REJECT || vs == MAY_REJECT ? MAY_REJECT : VALID;
}

static int oracle(fz_world *w, const cv_call *c, cv_view *v)
{
    return rules_ok(c, v) ? overlaps(w, c, v) : INVALID;
}

/* The reference's arguments over the call's buffers, as lmk.h resolves them. */
static lmk_causal_conv1d_args args_of(const cv_call *c, const cv_view *v)
{
    lmk_buffer *const *o = c->op;
    return (lmk_causal_conv1d_args){
        .x = v->t[X].data, .y = v->t[Y].data, .dtype = lmk_buffer_dtype(o[X]),
        .T = c->p.seq_len, .C = c->p.channels, .W = c->p.width,
        .x_tok = v->t[X].stride[0], .y_tok = v->t[Y].stride[0], .in_place = fz_same3(&v->t[X], &v->t[Y]),
        .weight = lmk_buffer_data(o[WEIGHT]), .w_dtype = lmk_buffer_dtype(o[WEIGHT]),
        .bias = o[BIAS] ? lmk_buffer_data(o[BIAS]) : NULL, .bias_dtype = o[BIAS] ? lmk_buffer_dtype(o[BIAS]) : LMK_F32,
        .cu_seqlens = o[CU] ? lmk_buffer_data(o[CU]) : NULL, .cu_is64 = o[CU] && lmk_buffer_dtype(o[CU]) == LMK_I64,
        .slots = o[SLOTS] ? lmk_buffer_data(o[SLOTS]) : NULL,
        .slots_is64 = o[SLOTS] && lmk_buffer_dtype(o[SLOTS]) == LMK_I64, .n_seq = v->n_seq,
        .state = o[STATE] ? lmk_buffer_data(o[STATE]) : NULL, .n_slots = o[STATE] ? v->pn[0] : 0,
        .st_slot = v->ps[0], .st_row = v->ps[1], .st_ch = v->ps[2], .act = c->p.activation,
    };
}

/* ---- checking a call ---- */

/* Whether cu_seqlens (as the snapshot holds it) is what lmk.h specifies: NULL, or 0 = c0 <= ...
 * <= cn = T. Anything else makes the outputs unspecified. */
static bool cu_valid(const lmk_causal_conv1d_args *a)
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

static bool tame(lmk_dtype t, const void *base, size_t i)
{
    return fabs(lmk_float_load(t, base, i)) <= 4.0; /* false for NaN too */
}

/* Whether every input value is finite and at most 4 in magnitude: the domain where the precision
 * contract is checked (outside it only determinism and the untouched bytes are). */
static bool precise_domain(const lmk_causal_conv1d_args *a)
{
    for (size_t t = 0; t < a->T; t++)
        for (size_t ch = 0; ch < a->C; ch++)
            if (!tame(a->dtype, a->x, t * a->x_tok + ch))
                return false;
    for (size_t i = 0; i < a->C * a->W; i++)
        if (!tame(a->w_dtype, a->weight, i) || (a->bias && i < a->C && !tame(a->bias_dtype, a->bias, i)))
            return false;
    for (size_t r = 0; a->state && r < a->n_slots; r++)
        for (size_t i = 0; i + 1 < a->W; i++)
            for (size_t ch = 0; ch < a->C; ch++)
                if (!tame(a->dtype, a->state, r * a->st_slot + i * a->st_row + ch * a->st_ch))
                    return false;
    return true;
}

/* What a valid call is checked with: the regions as the call left them, the snapshot's values. */
typedef struct cv_check {
    fz_world *w;
    unsigned char *got[FZ_MAX_REGIONS];
    size_t n_bad;
    char first[256];
} cv_check;

/* The byte at address p as the call left it (memory holds the reference's result by then). */
static const unsigned char *got_at(const cv_check *k, const void *p)
{
    const fz_region *r = fz_world_find(k->w, p);
    return k->got[r - k->w->r] + ((const unsigned char *)p - r->base);
}

/* Element i of xx (lmk.h: the sequence's W-1 state rows, then its inputs) of channel ch for a
 * sequence of tokens from lo with state row `row` (-1: zeros), from the snapshot; i counts from
 * the first state row, so token t is i = t - lo + W - 1. */
static double xx_at(const cv_check *k, const lmk_causal_conv1d_args *a, size_t lo, int64_t row, size_t i, size_t ch)
{
    const size_t es = lmk_dtype_size(a->dtype);
    if (i + 1 >= a->W)
        return lmk_float_load(a->dtype, fz_world_before(k->w, (const unsigned char *)a->x +
                                                                  ((lo + i - (a->W - 1)) * a->x_tok + ch) * es), 0);
    if (row < 0)
        return 0.0;
    const size_t at = (size_t)row * a->st_slot + i * a->st_row + ch * a->st_ch;
    return lmk_float_load(a->dtype, fz_world_before(k->w, (const unsigned char *)a->state + at * es), 0);
}

/* y[t, ch] against the reference (memory): one ulp plus 1e-6 * (|bias| + sum |weight * xx|)
 * (lmk.h), plus half an ulp for the reference's own rounding to y's dtype. */
static void check_y(cv_check *k, const lmk_causal_conv1d_args *a, size_t lo, int64_t row, size_t t, size_t ch)
{
    const size_t es = lmk_dtype_size(a->dtype);
    double mag = a->bias ? fabs(lmk_float_load(a->bias_dtype, a->bias, ch)) : 0.0;
    for (size_t j = 0; j < a->W; j++)
        mag += fabs(lmk_float_load(a->w_dtype, a->weight, ch * a->W + j) * xx_at(k, a, lo, row, t - lo + j, ch));
    const unsigned char *p = (const unsigned char *)a->y + (t * a->y_tok + ch) * es;
    const double got = lmk_float_load(a->dtype, got_at(k, p), 0), want = lmk_float_load(a->dtype, p, 0);
    const double tol = 1.5 * lmk_ulp(a->dtype, fmax(fabs(got), fabs(want))) + 1e-6 * mag;
    if (fabs(got - want) <= tol)
        return;
    if (k->n_bad++ == 0)
        snprintf(k->first, sizeof k->first, "y[%zu, %zu] is %.9g, the reference %.9g (tolerance %.3g)", t, ch, got,
                 want, tol);
}

/* Every y element of every sequence (a valid cu_seqlens covers each token once). */
static void check_ys(cv_check *k, const lmk_causal_conv1d_args *a)
{
    for (size_t s = 0; s < a->n_seq; s++) {
        size_t lo, hi;
        lmk_seq_bounds(a->cu_seqlens, a->cu_is64, s, a->T, &lo, &hi);
        const int64_t row = a->state ? lmk_seq_slot(a->slots, a->slots_is64, s, a->n_slots) : -1;
        for (size_t t = lo; t < hi; t++)
            for (size_t ch = 0; ch < a->C; ch++)
                check_y(k, a, lo, row, t, ch);
    }
}

static lmk_status call_op(const cv_call *c, lmk_stream *s)
{
    return lmk_causal_conv1d(s, c->op[X], c->op[WEIGHT], c->op[BIAS], c->op[CU], c->op[SLOTS], c->op[STATE], c->op[Y],
                             c->null_p ? NULL : &c->p);
}

static void describe(const cv_call *c, char *buf, size_t n)
{
    snprintf(buf, n, "causal_conv1d(T %u, C %u, W %u, act %d, %s, cu %s, slots %s, state %s%s) on %s",
             c->p.seq_len, c->p.channels, c->p.width, (int)c->p.activation,
             c->op[X] ? lmk_dtype_name(lmk_buffer_dtype(c->op[X])) : "x NULL", c->op[CU] ? "given" : "NULL",
             c->op[SLOTS] ? "given" : "NULL", c->op[STATE] ? "given" : "NULL", c->op[X] == c->op[Y] ? ", y == x" : "",
             c->s ? lmk_device_name(lmk_stream_device(c->s)) : "no stream");
}

/* Every byte outside the y elements: pool elements the reference's bits (valid cu_seqlens) or,
 * with a hostile one, unchanged unless some sequence names their row; any other byte unchanged. */
static void check_bytes(const cv_check *k, const cv_marks *may, bool cu_ok, const char *what)
{
    for (int r = 0; r < k->w->n; r++) {
        const fz_region *g = &k->w->r[r];
        for (size_t j = 0; j < g->len; j++) {
            const uint8_t m = may->m[r][j], got = k->got[r][j];
            const bool ok = (m & 1) ? true : (m & 2) ? (cu_ok ? got == g->base[j] : (m & 4) || got == g->snap[j])
                                                    : got == g->snap[j];
            FZ_CHECK(ok, "%s: byte %zu of region %d (%s) is 0x%02x; before the call 0x%02x, the reference 0x%02x", what,
                     j, r, (m & 2) ? "a pool element" : "no output element", got, g->snap[j], g->base[j]);
        }
    }
}

/* The bytes the call may change: bit 0 the y elements, bit 1 the pool's elements, bit 2 the
 * elements of pool rows some sequence names. */
static void may_change(fz_world *w, cv_marks *may, const lmk_causal_conv1d_args *a, const cv_view *v)
{
    const size_t es = lmk_dtype_size(a->dtype);
    mark_nd(w, may, a->y, v->t[Y].n, v->t[Y].stride, 3, es, 0);
    if (!a->state)
        return;
    mark_nd(w, may, a->state, v->pn, v->ps, 3, es, 1);
    const size_t n_row[3] = {1, v->pn[1], v->pn[2]};
    for (size_t s = 0; s < a->n_seq; s++) {
        const int64_t row = lmk_seq_slot(a->slots, a->slots_is64, s, a->n_slots);
        if (row >= 0)
            mark_nd(w, may, (const unsigned char *)a->state + (size_t)row * a->st_slot * es, n_row, v->ps, 3, es, 2);
    }
}

/* A second run from the snapshot on a stream of another thread count gives the same bytes. */
static void check_rerun(fz_call *fc, const cv_call *c, const cv_check *k, lmk_stream *alt, const char *what)
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
static void check_valid(fz_call *fc, const cv_call *c, const cv_view *v, lmk_stream *alt, bool rerun)
{
    char what[256];
    describe(c, what, sizeof what);
    cv_check k = {.w = &fc->world};
    for (int r = 0; r < fc->world.n; r++) {
        k.got[r] = malloc(fc->world.r[r].len + 1);
        FZ_CHECK(k.got[r] != NULL, "harness: out of memory");
        memcpy(k.got[r], fc->world.r[r].base, fc->world.r[r].len);
    }
    fz_world_restore(&fc->world);
    const lmk_causal_conv1d_args a = args_of(c, v);
    const bool cu_ok = cu_valid(&a), precise = cu_ok && precise_domain(&a);
    lmk_ref_causal_conv1d(&a);
    cv_marks may;
    marks_init(&may, &fc->world);
    may_change(&fc->world, &may, &a, v);
    check_bytes(&k, &may, cu_ok, what);
    marks_free(&may);
    if (precise)
        check_ys(&k, &a);
    FZ_CHECK(k.n_bad == 0, "%s: %zu y elements outside lmk.h's precision; first: %s", what, k.n_bad, k.first);
    fz_stat(!cu_ok ? "valid calls with hostile cu_seqlens" : precise ? "valid calls checked against the reference"
                                                                     : "valid calls with wild values");
    if (rerun)
        check_rerun(fc, c, &k, alt, what);
    for (int r = 0; r < fc->world.n; r++)
        free(k.got[r]);
}

/* A rejected call: INVALID_ARGUMENT naming the op, and nothing changed. */
static void check_rejected(fz_world *w, const cv_call *c, lmk_status st, int verdict)
{
    char what[256];
    describe(c, what, sizeof what);
    fz_stat(verdict == INVALID ? "invalid calls" : "calls lmk may reject, rejected");
    FZ_CHECK(st == LMK_ERR_INVALID_ARGUMENT, "%s %s returned %s (\"%s\")", verdict == INVALID ? "invalid" : "rejected",
             what, lmk_status_name(st), lmk_last_error());
    FZ_CHECK(fz_message_names("causal_conv1d"), "message \"%s\" does not name causal_conv1d", lmk_last_error());
    FZ_CHECK(fz_world_changed(w, NULL, NULL, 0) == NULL, "a rejected %s changed a byte", what);
}

static void tally(const cv_call *c, const cv_view *v, int verdict)
{
    fz_stat("inputs");
    if (verdict == INVALID)
        return;
    if (fz_same3(&v->t[X], &v->t[Y]))
        fz_stat("in-place calls (y == x)");
    if (c->packed)
        fz_stat("calls with x and y side by side in one row");
    if (c->op[SLOTS] && c->slot_fill == SLOTS_DUPLICATE)
        fz_stat("calls with duplicate slots");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t buf[CV_BYTES];
    fz_in in = fz_extend(data, size, buf, CV_BYTES);
    fz_level *lv = fz_level_get(fz_pick(&in, 3));
    const long live_before = atomic_load(&fz_n_live);
    fz_call fc;
    memset(&fc, 0, sizeof fc);
    uint64_t r = fz_u64(&in);
    fc.rng = tst_rng_make(r);
    fc.sane = fz_pick(&in, 2) == 0;
    cv_call c;
    memset(&c, 0, sizeof c);
    c.lv = lv, c.e = &lv->env, c.s = lv->env.stream;
    build(&in, &fc, &c);
    for (unsigned k = fc.sane ? 0 : 1 + fz_pick(&in, 3); k > 0; k--)
        corrupt(&in, &fc, &c);
    fz_world_add(&fc.world, c.e->arena, FZ_ARENA_BYTES);
    fill_all(&in, &fc, &c, &r);
    fz_world_snapshot(&fc.world);
    cv_view v;
    memset(&v, 0, sizeof v);
    const int verdict = oracle(&fc.world, &c, &v);

    lmk_clear_error();
    const long allocs_before = atomic_load(&fz_n_allocs);
    const lmk_status st = call_op(&c, c.s);
    if (st == LMK_OK)
        FZ_CHECK(lmk_stream_sync(c.s) == LMK_OK, "lmk_stream_sync after a valid causal_conv1d");
    FZ_CHECK(atomic_load(&fz_n_allocs) == allocs_before, "causal_conv1d allocated %ld times",
             atomic_load(&fz_n_allocs) - allocs_before);
    tally(&c, &v, verdict);
    if (verdict == VALID || (verdict == MAY_REJECT && st == LMK_OK)) {
        char what[256];
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
