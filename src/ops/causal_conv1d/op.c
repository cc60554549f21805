/*
 * op.c - validation and dispatch of lmk_causal_conv1d: the depthwise causal convolution of the
 * Gated DeltaNet layers, with its state pool (lmk.h, "causal_conv1d").
 *
 * Every rule is checked here, in lmk.h's order, before a backend sees the call, so a rejected call
 * never touches a buffer. x and y are [T, C] operands (dense, or 2-D with a free token stride);
 * the state pool takes any strides with distinct elements. cu_seqlens and state_slots are device
 * data: only their dtypes and counts are checked here, their values are read by the backends
 * through src/ops/varlen.h, which keeps any value inside the operands.
 */
#include "core/internal.h"
#include "ops/causal_conv1d/causal_conv1d.h"

static const char k_op[] = "causal_conv1d";

/* Operands in the order of the overlap check. */
enum { X, WEIGHT, BIAS, CU, SLOTS, Y, N_OPS };
static const char *const k_names[N_OPS] = {"x", "weight", "bias", "cu_seqlens", "state_slots", "y"};

static bool is_float(lmk_dtype t)
{
    return t == LMK_F32 || t == LMK_BF16 || t == LMK_F16;
}

static lmk_status check_params(const lmk_causal_conv1d_params *p)
{
    if (p->seq_len == 0 || p->channels == 0)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: seq_len (%u) and channels (%u) must be > 0", k_op, p->seq_len,
                        p->channels);
    if (p->width < 2 || p->width > 8)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: width (%u) must be in 2..8", k_op, p->width);
    if (p->activation != LMK_ACT_NONE && p->activation != LMK_ACT_SILU)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: unknown activation %d (expected 0 NONE or 1 SILU)", k_op,
                        (int)p->activation);
    return LMK_OK;
}

/* x and y as [T, C] operands of one float dtype. */
static lmk_status check_xy(const lmk_buffer *x, const lmk_buffer *y, const lmk_causal_conv1d_params *p,
                           lmk_tensor3 *t)
{
    lmk_status st = lmk_operand2(k_op, "x", x, p->seq_len, p->channels, &t[X]);
    if (st == LMK_OK)
        st = lmk_operand2(k_op, "y", y, p->seq_len, p->channels, &t[Y]);
    if (st == LMK_OK && y->dtype != x->dtype)
        st = lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: y dtype %s differs from x's %s", k_op, lmk_dtype_name(y->dtype),
                      lmk_dtype_name(x->dtype));
    if (st == LMK_OK && !is_float(x->dtype))
        st = lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: x has unsupported dtype %s (expected f32, bf16 or f16)", k_op,
                      lmk_dtype_name(x->dtype));
    return st;
}

/* A dense float vector of exactly n elements (weight, bias). */
static lmk_status check_dense_float(const char *name, const lmk_buffer *b, size_t n, const char *what)
{
    if (!is_float(b->dtype))
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: %s must be f32, bf16 or f16 (got %s)", k_op, name,
                        lmk_dtype_name(b->dtype));
    if (!b->dense || b->element_count != n)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: %s must be dense with exactly %s (%zu) elements (got %zu%s)", k_op,
                        name, what, n, b->element_count, b->dense ? "" : ", strided");
    return LMK_OK;
}

/* A dense i32/i64 index array of at least `min` (exact: exactly) entries. */
static lmk_status check_index(const char *name, const lmk_buffer *b, size_t n, bool exact, const char *what)
{
    if (b->dtype != LMK_I32 && b->dtype != LMK_I64)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: %s must be i32 or i64 (got %s)", k_op, name,
                        lmk_dtype_name(b->dtype));
    if (!b->dense || (exact ? b->element_count != n : b->element_count < n))
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: %s must be dense with %s %s (%zu) entries (got %zu%s)", k_op,
                        name, exact ? "exactly" : "at least", what, n, b->element_count, b->dense ? "" : ", strided");
    return LMK_OK;
}

/* cu_seqlens, state_slots and conv_state; *n_seq from cu_seqlens. */
static lmk_status check_seqs(const lmk_buffer *cu, const lmk_buffer *slots, const lmk_buffer *state,
                             const lmk_buffer *x, const lmk_causal_conv1d_params *p, size_t *n_seq, lmk_pool *pool)
{
    lmk_status st = cu ? check_index("cu_seqlens", cu, 2, false, "n_seq + 1 >= 2") : LMK_OK;
    if (st != LMK_OK)
        return st;
    *n_seq = cu ? cu->element_count - 1 : 1;
    if (slots && !state)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: state_slots given without conv_state (slots name rows of it)",
                        k_op);
    if (slots && (st = check_index("state_slots", slots, *n_seq, true, "n_seq")) != LMK_OK)
        return st;
    if (!state)
        return LMK_OK;
    const size_t n[3] = {0, (size_t)p->width - 1, p->channels};
    st = lmk_operand_pool(k_op, "conv_state", state, 3, n, pool);
    if (st == LMK_OK && state->dtype != x->dtype)
        st = lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: conv_state dtype %s differs from x's %s", k_op,
                      lmk_dtype_name(state->dtype), lmk_dtype_name(x->dtype));
    return st;
}

/* Devices, then overlaps: y against every operand but x (which it may equal exactly), the state
 * pool against every operand. */
static lmk_status check_placement(const lmk_stream *s, const lmk_buffer *const *all, const lmk_buffer *state,
                                  lmk_tensor3 *t, const lmk_pool *pool)
{
    for (int i = 0; i < N_OPS; i++)
        if (all[i] && all[i]->dev != s->dev)
            return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: %s is not on the stream's device (%s)", k_op, k_names[i],
                            s->dev->name);
    if (state && state->dev != s->dev)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: conv_state is not on the stream's device (%s)", k_op,
                        s->dev->name);
    for (int i = WEIGHT; i <= SLOTS; i++)
        if (all[i])
            t[i] = lmk_operand_flat(all[i]);
    static const int outs[1] = {Y}, own[1] = {X};
    lmk_status st = lmk_check_overlaps(k_op, t, k_names, N_OPS, outs, own, 1);
    for (int i = 0; i < N_OPS && st == LMK_OK && state; i++)
        if (t[i].data && lmk_pool_overlaps(pool, &t[i]))
            st = lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: conv_state overlaps %s (the state pool must share no byte "
                          "with another operand)", k_op, k_names[i]);
    return st;
}

/* Validation's tables stay off the stack while the backend runs (the calling thread runs a share of
 * the work, within lmk.h's stack bound). */
#if defined(__GNUC__)
#define CONV_NOINLINE __attribute__((noinline))
#else
#define CONV_NOINLINE
#endif

/* Every rule of lmk.h in its order; on success the backend's arguments. */
CONV_NOINLINE static lmk_status prepare(const lmk_stream *s, const lmk_buffer *x, const lmk_buffer *weight,
                                       const lmk_buffer *bias, const lmk_buffer *cu_seqlens,
                                       const lmk_buffer *state_slots, const lmk_buffer *conv_state, const lmk_buffer *y,
                                       const lmk_causal_conv1d_params *p, lmk_causal_conv1d_args *a)
{
    if (!s || !x || !weight || !y || !p)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: %s must not be NULL", k_op,
                        !s ? "stream" : !x ? "x" : !weight ? "weight" : !y ? "y" : "params");
    lmk_tensor3 t[N_OPS] = {{0}};
    lmk_pool pool = {0};
    size_t n_seq = 1;
    lmk_status st = check_params(p);
    if (st == LMK_OK)
        st = check_xy(x, y, p, t);
    if (st == LMK_OK)
        st = check_dense_float("weight", weight, (size_t)p->channels * p->width, "channels * width");
    if (st == LMK_OK && bias)
        st = check_dense_float("bias", bias, p->channels, "channels");
    if (st == LMK_OK)
        st = check_seqs(cu_seqlens, state_slots, conv_state, x, p, &n_seq, &pool);
    const lmk_buffer *const all[N_OPS] = {x, weight, bias, cu_seqlens, state_slots, y};
    if (st == LMK_OK)
        st = check_placement(s, all, conv_state, t, &pool);
    if (st != LMK_OK)
        return st;
    *a = (lmk_causal_conv1d_args){
        .x = t[X].data, .y = t[Y].data, .dtype = x->dtype,
        .T = p->seq_len, .C = p->channels, .W = p->width,
        .x_tok = t[X].stride[0], .y_tok = t[Y].stride[0], .in_place = lmk_tensor3_same(&t[X], &t[Y]),
        .weight = weight->data, .w_dtype = weight->dtype,
        .bias = bias ? bias->data : NULL, .bias_dtype = bias ? bias->dtype : LMK_F32,
        .cu_seqlens = cu_seqlens ? cu_seqlens->data : NULL, .cu_is64 = cu_seqlens && cu_seqlens->dtype == LMK_I64,
        .slots = state_slots ? state_slots->data : NULL, .slots_is64 = state_slots && state_slots->dtype == LMK_I64,
        .n_seq = n_seq,
        .state = conv_state ? pool.data : NULL, .n_slots = conv_state ? pool.n[0] : 0,
        .st_slot = pool.stride[0], .st_row = pool.stride[1], .st_ch = pool.stride[2],
        .act = p->activation,
    };
    return LMK_OK;
}

lmk_status lmk_causal_conv1d(lmk_stream *s, const lmk_buffer *x, const lmk_buffer *weight, const lmk_buffer *bias,
                             const lmk_buffer *cu_seqlens, const lmk_buffer *state_slots, lmk_buffer *conv_state,
                             lmk_buffer *y, const lmk_causal_conv1d_params *p)
{
    lmk_causal_conv1d_args a;
    const lmk_status st = prepare(s, x, weight, bias, cu_seqlens, state_slots, conv_state, y, p, &a);
    return st == LMK_OK ? lmk_dispatch(s, LMK_OP_causal_conv1d, k_op, &a) : st;
}
