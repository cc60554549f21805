/*
 * rope_multi.c - validation and dispatch of the multi-section rotary embedding.
 *
 * Both entry points (one tensor, and the fused q+k of an attention layer) are validated here by
 * the same two functions, in SPEC.md section 2's order, before any backend sees the call. The
 * backend receives an lmk_rope_args of raw pointers; a rejected call never touches a buffer.
 */
#include "core/internal.h"

#include <math.h>

/* SPEC.md rules 1-4, and the mode and pairing: the parameters alone. */
static lmk_status check_params(const char *op, const lmk_rope_multi_params *p)
{
    if (p->head_dim == 0 || p->rope_dim == 0 || p->n_heads == 0 || p->seq_len == 0)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT,
                        "%s: head_dim, rope_dim, n_heads, seq_len must all be > 0 "
                        "(got head_dim=%u, rope_dim=%u, n_heads=%u, seq_len=%u)",
                        op, p->head_dim, p->rope_dim, p->n_heads, p->seq_len);
    if (p->head_dim % 2 != 0 || p->rope_dim % 2 != 0)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: head_dim and rope_dim must be even (got head_dim=%u, rope_dim=%u)",
                        op, p->head_dim, p->rope_dim);
    if (p->rope_dim > p->head_dim)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: rope_dim must be <= head_dim (got rope_dim=%u, head_dim=%u)", op,
                        p->rope_dim, p->head_dim);
    if (!isfinite(p->freq_base) || p->freq_base <= 0.0f)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: freq_base must be finite and positive, got %g", op,
                        (double)p->freq_base);
    return LMK_OK;
}

/* SPEC.md rules 5-10 for one tensor of n_heads heads; `which` is "" or "q "/"k ". */
static lmk_status check_buffers(const char *op, const char *which, const lmk_rope_multi_params *p, uint32_t n_heads,
                                const lmk_buffer *in, const lmk_buffer *out, const lmk_buffer *pos)
{
    size_t elements;
    if (lmk_mul_overflows((size_t)p->seq_len * n_heads, p->head_dim, &elements))
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: %sseq_len(%u) * n_heads(%u) * head_dim(%u) overflows size_t", op,
                        which, p->seq_len, n_heads, p->head_dim);
    if (in->element_count != elements)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT,
                        "%s: %sinput element count %zu != seq_len(%u) * n_heads(%u) * head_dim(%u) = %zu", op, which,
                        in->element_count, p->seq_len, n_heads, p->head_dim, elements);
    if (out->element_count != elements)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: %soutput element count %zu != %zu", op, which,
                        out->element_count, elements);
    if (in->dtype != out->dtype)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: %sinput/output dtype mismatch %s vs %s", op, which,
                        lmk_dtype_name(in->dtype), lmk_dtype_name(out->dtype));
    if (pos->element_count != 4 * (size_t)p->seq_len)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: positions length %zu != 4 * seq_len(%u) = %zu", op,
                        pos->element_count, p->seq_len, 4 * (size_t)p->seq_len);
    if (pos->dtype != LMK_I32 && pos->dtype != LMK_U32)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: positions must be i32 or u32 (got %s)", op,
                        lmk_dtype_name(pos->dtype));
    if (in->dtype != LMK_F32 && in->dtype != LMK_BF16 && in->dtype != LMK_F16)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: unsupported dtype %s (expected f32, bf16 or f16)", op,
                        lmk_dtype_name(in->dtype));
    return LMK_OK;
}

/* Rules past the spec's ten: mode, pairing, devices, overlaps. */
static lmk_status check_rest(const char *op, const lmk_rope_multi_params *p, const lmk_stream *s,
                             const lmk_buffer *const *bufs, int n_bufs)
{
    if (p->mode != LMK_ROPE_MROPE && p->mode != LMK_ROPE_IMROPE)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: unknown mode %d (expected 8 MROPE or 40 IMROPE)", op,
                        (int)p->mode);
    if (p->pairing != LMK_ROPE_PAIR_HALF_ROPE && p->pairing != LMK_ROPE_PAIR_HALF_HEAD)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: unknown pairing %d (expected 0 HALF_ROPE or 1 HALF_HEAD)", op,
                        (int)p->pairing);
    for (int i = 0; i < n_bufs; i++)
        if (bufs[i]->dev != s->dev)
            return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: every buffer must be on the stream's device (%s)", op,
                            s->dev->name);
    return LMK_OK;
}

/* The bytes of a buffer an op touches: its shape's, not its whole (pooled) length. */
static size_t used_bytes(const lmk_buffer *b)
{
    return b->element_count * lmk_dtype_size(b->dtype);
}

/* An output may equal an input exactly (in place) but must share no byte with anything else. */
static lmk_status check_output_overlap(const char *op, const char *name, const lmk_buffer *out,
                                       const lmk_buffer *own_in, const lmk_buffer *const *others, int n_others)
{
    if (out->data != own_in->data && lmk_ranges_overlap(out->data, used_bytes(out), own_in->data, used_bytes(own_in)))
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT,
                        "%s: %s overlaps its input partially (in place needs the same memory and offset)", op, name);
    for (int i = 0; i < n_others; i++)
        if (lmk_ranges_overlap(out->data, used_bytes(out), others[i]->data, used_bytes(others[i])))
            return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: %s overlaps another operand", op, name);
    return LMK_OK;
}

static lmk_rope_args make_args(const lmk_rope_multi_params *p, const lmk_buffer *in, const lmk_buffer *positions)
{
    lmk_rope_args a = {
        .dtype = in->dtype, .head_dim = p->head_dim, .rope_dim = p->rope_dim, .seq_len = p->seq_len,
        .freq_base = p->freq_base, .mode = p->mode, .pairing = p->pairing,
        .positions = (const int32_t *)(const void *)positions->data,
    };
    for (int i = 0; i < 4; i++)
        a.sections[i] = p->sections[i];
    return a;
}

lmk_status lmk_rope_multi(lmk_stream *s, const lmk_buffer *input, lmk_buffer *output, const lmk_buffer *positions,
                          const lmk_rope_multi_params *p)
{
    static const char op[] = "rope_multi";
    if (!s || !input || !output || !positions || !p)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: stream, input, output, positions and params must not be NULL",
                        op);
    lmk_status st = check_params(op, p);
    if (st == LMK_OK)
        st = check_buffers(op, "", p, p->n_heads, input, output, positions);
    const lmk_buffer *bufs[] = {input, output, positions};
    if (st == LMK_OK)
        st = check_rest(op, p, s, bufs, 3);
    if (st == LMK_OK)
        st = check_output_overlap(op, "output", output, input, &positions, 1);
    if (st != LMK_OK)
        return st;

    lmk_rope_args a = make_args(p, input, positions);
    a.n_tensors = 1;
    a.t[0] = (lmk_rope_tensor){.in = input->data, .out = output->data, .n_heads = p->n_heads};
    return s->dev->ops->rope_multi(s, &a);
}

lmk_status lmk_rope_multi_qk(lmk_stream *s, const lmk_buffer *q_in, lmk_buffer *q_out, const lmk_buffer *k_in,
                             lmk_buffer *k_out, const lmk_buffer *positions, const lmk_rope_multi_params *p,
                             uint32_t n_k_heads)
{
    static const char op[] = "rope_multi_qk";
    if (!s || !q_in || !q_out || !k_in || !k_out || !positions || !p)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT,
                        "%s: stream, q_in, q_out, k_in, k_out, positions and params must not be NULL", op);
    lmk_status st = check_params(op, p);
    if (st == LMK_OK && n_k_heads == 0)
        st = lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: n_k_heads must be > 0", op);
    if (st == LMK_OK)
        st = check_buffers(op, "q ", p, p->n_heads, q_in, q_out, positions);
    if (st == LMK_OK)
        st = check_buffers(op, "k ", p, n_k_heads, k_in, k_out, positions);
    if (st == LMK_OK && q_in->dtype != k_in->dtype)
        st = lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: q and k dtype mismatch %s vs %s", op, lmk_dtype_name(q_in->dtype),
                      lmk_dtype_name(k_in->dtype));
    const lmk_buffer *bufs[] = {q_in, q_out, k_in, k_out, positions};
    if (st == LMK_OK)
        st = check_rest(op, p, s, bufs, 5);
    const lmk_buffer *q_others[] = {k_in, k_out, positions};
    const lmk_buffer *k_others[] = {q_in, q_out, positions};
    if (st == LMK_OK)
        st = check_output_overlap(op, "q output", q_out, q_in, q_others, 3);
    if (st == LMK_OK)
        st = check_output_overlap(op, "k output", k_out, k_in, k_others, 3);
    if (st != LMK_OK)
        return st;

    lmk_rope_args a = make_args(p, q_in, positions);
    a.n_tensors = 2;
    a.t[0] = (lmk_rope_tensor){.in = q_in->data, .out = q_out->data, .n_heads = p->n_heads};
    a.t[1] = (lmk_rope_tensor){.in = k_in->data, .out = k_out->data, .n_heads = n_k_heads};
    return s->dev->ops->rope_multi(s, &a);
}
