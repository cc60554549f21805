/*
 * op.c - validation and dispatch of the GQA head broadcast: lmk_repeat_heads (tiled or block
 * layout, strided operands) and the 0.1 entry point lmk_repeat_tiled, which keeps its own rules
 * (byte-length checks that accept larger pooled dense buffers) and messages, and takes a strided
 * view as lmk_repeat_heads does.
 *
 *     src [seq, hg, k] -> dst [seq, h, k],   dst[t, i, j] = src[t, g(i), j]
 *
 * Every rule is checked here, in lmk.h's order, before a backend sees the call, so a rejected call
 * never touches a buffer. The backend receives raw pointers, sizes and element strides only.
 */
#include "core/internal.h"
#include "ops/repeat/repeat.h"

/* The rules the two entry points share: non-zero sizes, h a multiple of hg. */
static lmk_status check_sizes(const char *op, uint32_t seq, uint32_t hg, uint32_t h, uint32_t k)
{
    if (seq == 0 || hg == 0 || h == 0 || k == 0)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: seq (%u), hg (%u), h (%u), k (%u) must all be > 0", op, seq, hg,
                        h, k);
    if (h % hg != 0)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: h (%u) must be a multiple of hg (%u)", op, h, hg);
    return LMK_OK;
}

static lmk_status check_devices(const char *op, const lmk_stream *s, const lmk_buffer *src, const lmk_buffer *dst)
{
    if (src->dev != s->dev || dst->dev != s->dev)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: src and dst must be on the stream's device (%s)", op,
                        s->dev->name);
    return LMK_OK;
}

lmk_status lmk_repeat_heads(lmk_stream *s, const lmk_buffer *src, lmk_buffer *dst, const lmk_repeat_heads_params *p)
{
    static const char op[] = "repeat_heads";
    if (!s || !src || !dst || !p)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: %s must not be NULL", op,
                        !s ? "stream" : !src ? "src" : !dst ? "dst" : "params");
    lmk_status st = check_sizes(op, p->seq, p->hg, p->h, p->k);
    if (st == LMK_OK && p->layout != LMK_REPEAT_TILED && p->layout != LMK_REPEAT_BLOCK)
        st = lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: unknown layout %d (expected 0 TILED or 1 BLOCK)", op,
                      (int)p->layout);
    lmk_tensor3 t[2];
    if (st == LMK_OK)
        st = lmk_operand3(op, "src", src, p->seq, p->hg, p->k, &t[0]);
    if (st == LMK_OK)
        st = lmk_operand3(op, "dst", dst, p->seq, p->h, p->k, &t[1]);
    if (st == LMK_OK && src->dtype != dst->dtype)
        st = lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: src/dst dtype mismatch %s vs %s", op, lmk_dtype_name(src->dtype),
                      lmk_dtype_name(dst->dtype));
    if (st == LMK_OK)
        st = check_devices(op, s, src, dst);
    static const char *const names[2] = {"src", "dst"};
    static const int outs[1] = {1}, own[1] = {-1};
    if (st == LMK_OK)
        st = lmk_check_overlaps(op, t, names, 2, outs, own, 1);
    if (st != LMK_OK)
        return st;
    const lmk_repeat_args a = {
        .src = t[0].data, .dst = t[1].data, .seq = p->seq, .hg = p->hg, .h = p->h, .k = p->k,
        .elem_size = t[0].es, .src_tok = t[0].stride[0], .src_head = t[0].stride[1],
        .dst_tok = t[1].stride[0], .dst_head = t[1].stride[1], .layout = p->layout,
    };
    return lmk_dispatch(s, LMK_OP_repeat, op, &a);
}

lmk_status lmk_repeat_tiled(lmk_stream *s, const lmk_buffer *src, lmk_buffer *dst, const lmk_repeat_tiled_params *p)
{
    static const char op[] = "repeat_tiled";
    if (!s || !src || !dst || !p)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: %s must not be NULL", op,
                        !s ? "stream" : !src ? "src" : !dst ? "dst" : "params");
    lmk_status st = check_sizes(op, p->seq, p->hg, p->h, p->k);
    if (st != LMK_OK)
        return st;
    const size_t esize = lmk_dtype_size(src->dtype);
    size_t src_elems, dst_elems, src_bytes, dst_bytes;
    if (lmk_mul_overflows((size_t)p->seq * p->hg, p->k, &src_elems) || lmk_mul_overflows(src_elems, esize, &src_bytes))
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: seq*hg*k (%u*%u*%u) overflows size_t", op, p->seq, p->hg, p->k);
    if (lmk_mul_overflows((size_t)p->seq * p->h, p->k, &dst_elems) || lmk_mul_overflows(dst_elems, esize, &dst_bytes))
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: seq*h*k (%u*%u*%u) overflows size_t", op, p->seq, p->h, p->k);
    if (src->dtype != dst->dtype)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: src/dst dtype mismatch %s vs %s", op, lmk_dtype_name(src->dtype),
                        lmk_dtype_name(dst->dtype));
    /* 0.1 counts a dense buffer's bytes from its first byte, so a larger (pooled) buffer is
     * accepted. A strided view is an operand of lmk.h's "Operands" (b), shape exactly [seq, hg, k]
     * or [seq, h, k] with last stride 1, and its strides are honoured: its span is not its
     * elements (the gaps between its rows belong to other tensors). */
    lmk_tensor3 t[2];
    const lmk_buffer *b[2] = {src, dst};
    static const char *const names[2] = {"src", "dst"};
    const size_t need[2] = {src_bytes, dst_bytes}, heads[2] = {p->hg, p->h};
    for (int i = 0; i < 2; i++) {
        if (!b[i]->dense) {
            st = lmk_operand3(op, names[i], b[i], p->seq, heads[i], p->k, &t[i]);
            if (st != LMK_OK)
                return st;
            continue;
        }
        if (b[i]->byte_len < need[i])
            return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: %s buffer too small: need %zu bytes, have %zu", op, names[i],
                            need[i], b[i]->byte_len);
        t[i] = (lmk_tensor3){.data = b[i]->data, .n = {p->seq, heads[i], p->k},
                             .stride = {heads[i] * p->k, p->k, 1}, .es = esize};
    }
    st = check_devices(op, s, src, dst);
    if (st != LMK_OK)
        return st;
    if (src->dense && dst->dense) {
        if (lmk_ranges_overlap(src->data, src_bytes, dst->data, dst_bytes))
            return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: src and dst overlap", op);
    } else {
        static const int outs[1] = {1}, own[1] = {-1};
        st = lmk_check_overlaps(op, t, names, 2, outs, own, 1);
        if (st != LMK_OK)
            return st;
    }
    const lmk_repeat_args a = {
        .src = t[0].data, .dst = t[1].data, .seq = p->seq, .hg = p->hg, .h = p->h, .k = p->k, .elem_size = esize,
        .src_tok = t[0].stride[0], .src_head = t[0].stride[1], .dst_tok = t[1].stride[0], .dst_head = t[1].stride[1],
        .layout = LMK_REPEAT_TILED,
    };
    return lmk_dispatch(s, LMK_OP_repeat, op, &a);
}
