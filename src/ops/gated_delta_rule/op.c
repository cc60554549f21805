/*
 * op.c - validation and dispatch of lmk_gated_delta_rule: gates, L2 norm, the delta-rule recurrence
 * over a state pool and the gated output norm in one op (lmk.h, "gated_delta_rule"), and
 * lmk_gated_delta_rule_workspace, the bytes of scratch its chunked form uses (the layout is
 * lmk_gdn_chunk_plan's, shared with the CUDA kernels).
 *
 * Every rule is checked here, in lmk.h's order, before a backend sees the call, so a rejected call
 * never touches a buffer. cu_seqlens and state_slots are device data: only their dtype and length
 * are checked, and the backends read their values through src/ops/varlen.h, which keeps any value
 * inside the operands. The backend receives raw pointers, sizes and element strides only.
 */
#include "core/internal.h"
#include "ops/gated_delta_rule/gated_delta_rule.h"

#include <math.h>

static const char k_op[] = "gated_delta_rule";

/* The operands in the order of the overlap check (state, a pool, is checked on its own). */
enum { Q, K, V, A, B, A_LOG, DT_BIAS, CU, SLOTS, Z, NORM_W, OUT, N_OPS };
static const char *const k_names[N_OPS] = {"q", "k", "v", "a", "b", "A_log", "dt_bias", "cu_seqlens",
                                           "state_slots", "z", "norm_w", "out"};

static bool float_dtype(lmk_dtype t)
{
    return t == LMK_F32 || t == LMK_BF16 || t == LMK_F16;
}

/* The rules on the call's numbers, before any operand is looked at. */
static lmk_status check_params(const lmk_gdn_io *io, const lmk_gdn_params *p)
{
    if (!p->seq_len || !p->n_k_heads || !p->n_v_heads || !p->k_dim || !p->v_dim)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT,
                        "%s: seq_len (%u), n_k_heads (%u), n_v_heads (%u), k_dim (%u), v_dim (%u) must all be > 0",
                        k_op, p->seq_len, p->n_k_heads, p->n_v_heads, p->k_dim, p->v_dim);
    if (p->k_dim > LMK_GDN_MAX_DIM || p->v_dim > LMK_GDN_MAX_DIM)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: %s (%u) must be <= %d", k_op,
                        p->k_dim > LMK_GDN_MAX_DIM ? "k_dim" : "v_dim",
                        p->k_dim > LMK_GDN_MAX_DIM ? p->k_dim : p->v_dim, LMK_GDN_MAX_DIM);
    if (p->n_v_heads % p->n_k_heads)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: n_v_heads (%u) must be a multiple of n_k_heads (%u)", k_op,
                        p->n_v_heads, p->n_k_heads);
    if (p->head_map != LMK_REPEAT_TILED && p->head_map != LMK_REPEAT_BLOCK)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: unknown head_map %d (expected 0 TILED or 1 BLOCK)", k_op,
                        (int)p->head_map);
    if (p->flags & ~LMK_GDN_NO_L2NORM)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: unknown flags 0x%x (known: LMK_GDN_NO_L2NORM 0x%x)", k_op,
                        p->flags & ~LMK_GDN_NO_L2NORM, LMK_GDN_NO_L2NORM);
    if (!isfinite(p->scale))
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: scale must be finite (0 means 1/sqrt(k_dim)), got %g", k_op,
                        (double)p->scale);
    if (!io->A_log != !io->dt_bias)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT,
                        "%s: A_log and dt_bias must be given together (got %s; both NULL: a holds g and b holds beta)",
                        k_op, io->A_log ? "A_log without dt_bias" : "dt_bias without A_log");
    if (!io->z != !io->norm_w)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: z and norm_w must be given together (got %s)", k_op,
                        io->z ? "z without norm_w" : "norm_w without z");
    if (io->z && (!isfinite(p->norm.eps) || p->norm.eps <= 0.0f))
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: norm.eps must be finite and > 0 when z is given, got %g", k_op,
                        (double)p->norm.eps);
    if (io->z && !isfinite(p->norm.weight_offset))
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: norm.weight_offset must be finite when z is given, got %g",
                        k_op, (double)p->norm.weight_offset);
    return LMK_OK;
}

/* A dense operand of exactly `count` elements ([Hv] gate parameters, the [dv] norm weight). */
static lmk_status check_vector(const char *name, const lmk_buffer *b, size_t count, const char *what)
{
    if (!b)
        return LMK_OK;
    if (!b->dense || b->element_count != count)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: %s must be dense with exactly %s (%zu) elements (got %zu%s)",
                        k_op, name, what, count, b->element_count, b->dense ? "" : ", strided");
    return LMK_OK;
}

/* Shapes of every operand but the state (lmk.h's order: q, k, v, z, out; a, b; A_log, dt_bias;
 * norm_w). */
static lmk_status check_shapes(const lmk_gdn_io *io, const lmk_gdn_params *p, lmk_tensor3 *t)
{
    const size_t T = p->seq_len, hk = p->n_k_heads, hv = p->n_v_heads, dk = p->k_dim, dv = p->v_dim;
    lmk_status st = lmk_operand3(k_op, "q", io->q, T, hk, dk, &t[Q]);
    if (st == LMK_OK)
        st = lmk_operand3(k_op, "k", io->k, T, hk, dk, &t[K]);
    if (st == LMK_OK)
        st = lmk_operand3(k_op, "v", io->v, T, hv, dv, &t[V]);
    if (st == LMK_OK && io->z)
        st = lmk_operand3(k_op, "z", io->z, T, hv, dv, &t[Z]);
    if (st == LMK_OK)
        st = lmk_operand3(k_op, "out", io->out, T, hv, dv, &t[OUT]);
    if (st == LMK_OK)
        st = lmk_operand2(k_op, "a", io->a, T, hv, &t[A]);
    if (st == LMK_OK)
        st = lmk_operand2(k_op, "b", io->b, T, hv, &t[B]);
    if (st == LMK_OK)
        st = check_vector("A_log", io->A_log, hv, "n_v_heads");
    if (st == LMK_OK)
        st = check_vector("dt_bias", io->dt_bias, hv, "n_v_heads");
    if (st == LMK_OK)
        st = check_vector("norm_w", io->norm_w, dv, "v_dim");
    return st;
}

/* q, k, v and out one of f32/bf16/f16; a, b, A_log, dt_bias, z, norm_w each f32/bf16/f16; the
 * state f32 or bf16. */
static lmk_status check_dtypes(const lmk_gdn_io *io)
{
    const lmk_dtype dt = io->q->dtype;
    const lmk_buffer *same[] = {io->k, io->v, io->out};
    static const char *const same_names[] = {"k", "v", "out"};
    for (int i = 0; i < 3; i++)
        if (same[i]->dtype != dt)
            return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: %s dtype %s differs from q's %s (q, k, v and out share one)",
                            k_op, same_names[i], lmk_dtype_name(same[i]->dtype), lmk_dtype_name(dt));
    if (!float_dtype(dt))
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: q has unsupported dtype %s (expected f32, bf16 or f16)", k_op,
                        lmk_dtype_name(dt));
    const lmk_buffer *own[] = {io->a, io->b, io->A_log, io->dt_bias, io->z, io->norm_w};
    static const char *const own_names[] = {"a", "b", "A_log", "dt_bias", "z", "norm_w"};
    for (int i = 0; i < 6; i++)
        if (own[i] && !float_dtype(own[i]->dtype))
            return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: %s has unsupported dtype %s (expected f32, bf16 or f16)",
                            k_op, own_names[i], lmk_dtype_name(own[i]->dtype));
    if (io->state && io->state->dtype != LMK_F32 && io->state->dtype != LMK_BF16)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: state has unsupported dtype %s (expected f32 or bf16)", k_op,
                        lmk_dtype_name(io->state->dtype));
    return LMK_OK;
}

static bool index_dtype(lmk_dtype t)
{
    return t == LMK_I32 || t == LMK_I64;
}

/* cu_seqlens and state_slots (their values are device data: only dtype and length), then the
 * state pool. *n_seq: the call's sequences. */
static lmk_status check_sequences(const lmk_gdn_io *io, const lmk_gdn_params *p, size_t *n_seq, lmk_pool *pool)
{
    const lmk_buffer *cu = io->cu_seqlens, *slots = io->state_slots;
    if (cu && (!index_dtype(cu->dtype) || !cu->dense || cu->element_count < 2))
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT,
                        "%s: cu_seqlens must be dense i32 or i64 with at least 2 entries (got %s, %zu entries%s)", k_op,
                        lmk_dtype_name(cu->dtype), cu->element_count, cu->dense ? "" : ", strided");
    *n_seq = cu ? cu->element_count - 1 : 1;
    if (slots && !io->state)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT,
                        "%s: state_slots is given without a state (the rows it names belong to the state pool)", k_op);
    if (slots && (!index_dtype(slots->dtype) || !slots->dense || slots->element_count != *n_seq))
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT,
                        "%s: state_slots must be dense i32 or i64 with exactly n_seq (%zu) entries (got %s, %zu "
                        "entries%s)",
                        k_op, *n_seq, lmk_dtype_name(slots->dtype), slots->element_count,
                        slots->dense ? "" : ", strided");
    if (!io->state)
        return LMK_OK;
    const size_t n[4] = {0, p->n_v_heads, p->k_dim, p->v_dim};
    return lmk_operand_pool(k_op, "state", io->state, 4, n, pool);
}

/* Every buffer on the stream's device. */
static lmk_status check_devices(const lmk_device *dev, const lmk_gdn_io *io)
{
    const lmk_buffer *all[N_OPS + 1] = {io->q, io->k, io->v, io->a, io->b, io->A_log, io->dt_bias,
                                        io->cu_seqlens, io->state_slots, io->z, io->norm_w, io->out, io->state};
    for (int i = 0; i <= N_OPS; i++)
        if (all[i] && all[i]->dev != dev)
            return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: %s is not on the stream's device (%s)", k_op,
                            i < N_OPS ? k_names[i] : "state", dev->name);
    return LMK_OK;
}

/* out against every other operand (no in place: out is written while q, k, v and z are still
 * read), then the state pool against every operand. */
static lmk_status check_overlaps(const lmk_gdn_io *io, lmk_tensor3 *t, const lmk_pool *pool)
{
    const lmk_buffer *flat[] = {io->A_log, io->dt_bias, io->cu_seqlens, io->state_slots, io->norm_w};
    const int flat_idx[] = {A_LOG, DT_BIAS, CU, SLOTS, NORM_W};
    for (int i = 0; i < 5; i++)
        if (flat[i])
            t[flat_idx[i]] = lmk_operand_flat(flat[i]);
    static const int outs[1] = {OUT}, own[1] = {-1};
    lmk_status st = lmk_check_overlaps(k_op, t, k_names, N_OPS, outs, own, 1);
    for (int i = 0; i < N_OPS && st == LMK_OK && io->state; i++)
        if (t[i].data && lmk_pool_overlaps(pool, &t[i]))
            st = lmk_fail(LMK_ERR_INVALID_ARGUMENT,
                          "%s: state overlaps %s (a state pool must share no byte with another operand)", k_op,
                          k_names[i]);
    return st;
}

static lmk_gdn_args make_args(const lmk_gdn_io *io, const lmk_gdn_params *p, const lmk_tensor3 *t,
                              const lmk_pool *pool, size_t n_seq)
{
    const lmk_buffer *cu = io->cu_seqlens, *slots = io->state_slots;
    lmk_gdn_args a = {
        .q = t[Q].data, .k = t[K].data, .v = t[V].data, .out = t[OUT].data, .dtype = io->q->dtype,
        .T = p->seq_len, .Hk = p->n_k_heads, .Hv = p->n_v_heads, .dk = p->k_dim, .dv = p->v_dim,
        .q_tok = t[Q].stride[0], .q_head = t[Q].stride[1], .k_tok = t[K].stride[0], .k_head = t[K].stride[1],
        .v_tok = t[V].stride[0], .v_head = t[V].stride[1], .o_tok = t[OUT].stride[0], .o_head = t[OUT].stride[1],
        .a = t[A].data, .b = t[B].data, .a_dtype = io->a->dtype, .b_dtype = io->b->dtype,
        .a_tok = t[A].stride[0], .b_tok = t[B].stride[0],
        .A_log = io->A_log ? io->A_log->data : NULL, .dt_bias = io->dt_bias ? io->dt_bias->data : NULL,
        .A_dtype = io->A_log ? io->A_log->dtype : LMK_F32, .dt_dtype = io->dt_bias ? io->dt_bias->dtype : LMK_F32,
        .z = io->z ? t[Z].data : NULL, .z_dtype = io->z ? io->z->dtype : LMK_F32,
        .z_tok = io->z ? t[Z].stride[0] : 0, .z_head = io->z ? t[Z].stride[1] : 0,
        .norm_w = io->norm_w ? io->norm_w->data : NULL, .nw_dtype = io->norm_w ? io->norm_w->dtype : LMK_F32,
        .cu_seqlens = cu ? cu->data : NULL, .cu_is64 = cu && cu->dtype == LMK_I64,
        .slots = slots ? slots->data : NULL, .slots_is64 = slots && slots->dtype == LMK_I64, .n_seq = n_seq,
        .state = io->state ? pool->data : NULL, .state_dtype = io->state ? io->state->dtype : LMK_F32,
        .n_slots = io->state ? pool->n[0] : 0,
        .head_map = p->head_map,
        /* lmk.h: scale 0 means 1/sqrt(k_dim), resolved once here in f32 for every backend. */
        .scale = p->scale != 0.0f ? p->scale : 1.0f / sqrtf((float)p->k_dim),
        .l2norm = !(p->flags & LMK_GDN_NO_L2NORM),
        .eps = p->norm.eps, .weight_offset = p->norm.weight_offset,
    };
    if (io->state)
        a.s_slot = pool->stride[0], a.s_head = pool->stride[1], a.s_k = pool->stride[2], a.s_v = pool->stride[3];
    return a;
}

/* Every rule of lmk.h but the workspace's, in its order; *a: the backend's arguments (workspace
 * NULL), t and pool: the resolved operands. */
static lmk_status validate(lmk_stream *s, const lmk_gdn_io *io, const lmk_gdn_params *p, lmk_gdn_args *a,
                           lmk_tensor3 *t, lmk_pool *pool)
{
    const void *req[] = {s, io, p};
    static const char *const req_names[] = {"stream", "io", "params"};
    for (int i = 0; i < 3; i++)
        if (!req[i])
            return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: %s must not be NULL", k_op, req_names[i]);
    const lmk_buffer *bufs[] = {io->q, io->k, io->v, io->a, io->b, io->out};
    static const char *const buf_names[] = {"q", "k", "v", "a", "b", "out"};
    for (int i = 0; i < 6; i++)
        if (!bufs[i])
            return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: io->%s must not be NULL", k_op, buf_names[i]);
    size_t n_seq = 0;
    lmk_status st = check_params(io, p);
    if (st == LMK_OK)
        st = check_shapes(io, p, t);
    if (st == LMK_OK)
        st = check_dtypes(io);
    if (st == LMK_OK)
        st = check_sequences(io, p, &n_seq, pool);
    if (st == LMK_OK)
        st = check_devices(s->dev, io);
    if (st == LMK_OK)
        st = check_overlaps(io, t, pool);
    if (st == LMK_OK)
        *a = make_args(io, p, t, pool, n_seq);
    return st;
}

/* The workspace the call uses (lmk.h): the chunked form's layout on CUDA, for the dtypes and dims
 * its kernels take; 0 elsewhere. Depends on T, n_seq, the heads, the dims and the dtypes only. */
static size_t workspace_bytes(const lmk_stream *s, const lmk_gdn_args *a)
{
    if (s->dev->backend != LMK_BACKEND_CUDA || (a->dtype != LMK_BF16 && a->dtype != LMK_F16) || a->dk != a->dv ||
        (a->dk != 64 && a->dk != 128))
        return 0;
    return lmk_gdn_chunk_plan(a->T, a->n_seq, a->Hk, a->Hv, a->dk, a->dv).total;
}

/* io->workspace: a dense u8 buffer on the stream's device, of at least `need` bytes, sharing no
 * byte with any operand. */
static lmk_status check_workspace(const lmk_stream *s, const lmk_gdn_io *io, const lmk_tensor3 *t,
                                  const lmk_pool *pool, size_t need)
{
    const lmk_buffer *w = io->workspace;
    if (w->dtype != LMK_U8 || !w->dense)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: workspace must be a dense u8 buffer (got %s%s)", k_op,
                        lmk_dtype_name(w->dtype), w->dense ? "" : ", strided");
    if (w->dev != s->dev)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: workspace is not on the stream's device (%s)", k_op,
                        s->dev->name);
    if (w->element_count < need)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT,
                        "%s: workspace has %zu bytes, this call needs at least %zu (lmk_gated_delta_rule_workspace)",
                        k_op, w->element_count, need);
    const lmk_tensor3 ws = lmk_operand_flat(w);
    for (int i = 0; i < N_OPS; i++)
        if (t[i].data && lmk_tensor3_overlap(&ws, &t[i]))
            return lmk_fail(LMK_ERR_INVALID_ARGUMENT,
                            "%s: workspace overlaps %s (it must share no byte with any operand)", k_op, k_names[i]);
    if (io->state && lmk_pool_overlaps(pool, &ws))
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT,
                        "%s: workspace overlaps state (it must share no byte with any operand)", k_op);
    return LMK_OK;
}

lmk_status lmk_gated_delta_rule(lmk_stream *s, const lmk_gdn_io *io, const lmk_gdn_params *p)
{
    lmk_tensor3 t[N_OPS] = {{0}};
    lmk_pool pool = {0};
    lmk_gdn_args a;
    lmk_status st = validate(s, io, p, &a, t, &pool);
    if (st == LMK_OK && io->workspace) {
        const size_t need = workspace_bytes(s, &a);
        st = check_workspace(s, io, t, &pool, need);
        a.workspace = io->workspace->data, a.workspace_bytes = io->workspace->element_count;
    }
    return st == LMK_OK ? lmk_dispatch(s, LMK_OP_gated_delta_rule, k_op, &a) : st;
}

lmk_status lmk_gated_delta_rule_workspace(lmk_stream *s, const lmk_gdn_io *io, const lmk_gdn_params *p,
                                          size_t *bytes)
{
    if (!bytes)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: bytes must not be NULL", k_op);
    lmk_tensor3 t[N_OPS] = {{0}};
    lmk_pool pool = {0};
    lmk_gdn_args a;
    const lmk_status st = validate(s, io, p, &a, t, &pool);
    if (st == LMK_OK)
        *bytes = workspace_bytes(s, &a);
    return st;
}
