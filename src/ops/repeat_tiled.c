/*
 * repeat_tiled.c - validation and dispatch of the tiled GQA head broadcast.
 *
 *     src [seq, hg, k] -> dst [seq, h, k],   dst[t, i, j] = src[t, i % hg, j]
 *
 * Every rule of SPEC.md section 1 is checked here, in its order, before a backend sees the call,
 * so a rejected call never touches a buffer. The backend receives raw pointers and sizes only.
 */
#include "core/internal.h"

#define OP "repeat_tiled"

lmk_status lmk_repeat_tiled(lmk_stream *s, const lmk_buffer *src, lmk_buffer *dst, const lmk_repeat_tiled_params *p)
{
    if (!s || !src || !dst || !p)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, OP ": stream, src, dst and params must not be NULL");
    if (p->seq == 0 || p->hg == 0 || p->h == 0 || p->k == 0)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT,
                        OP ": seq (%u), hg (%u), h (%u), k (%u) must all be > 0", p->seq, p->hg, p->h, p->k);
    if (p->h % p->hg != 0)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, OP ": h (%u) must be a multiple of hg (%u)", p->h, p->hg);

    const size_t esize = lmk_dtype_size(src->dtype);
    size_t src_elems, dst_elems, src_bytes, dst_bytes;
    if (lmk_mul_overflows((size_t)p->seq * p->hg, p->k, &src_elems) || lmk_mul_overflows(src_elems, esize, &src_bytes))
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, OP ": seq*hg*k (%u*%u*%u) overflows size_t", p->seq, p->hg, p->k);
    if (lmk_mul_overflows((size_t)p->seq * p->h, p->k, &dst_elems) || lmk_mul_overflows(dst_elems, esize, &dst_bytes))
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, OP ": seq*h*k (%u*%u*%u) overflows size_t", p->seq, p->h, p->k);
    if (src->dtype != dst->dtype)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, OP ": src/dst dtype mismatch %s vs %s", lmk_dtype_name(src->dtype),
                        lmk_dtype_name(dst->dtype));
    if (src->byte_len < src_bytes)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, OP ": src buffer too small: need %zu bytes, have %zu", src_bytes,
                        src->byte_len);
    if (dst->byte_len < dst_bytes)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, OP ": dst buffer too small: need %zu bytes, have %zu", dst_bytes,
                        dst->byte_len);
    if (src->dev != s->dev || dst->dev != s->dev)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, OP ": src and dst must be on the stream's device (%s)",
                        s->dev->name);
    if (lmk_ranges_overlap(src->data, src_bytes, dst->data, dst_bytes))
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, OP ": src and dst overlap");

    const lmk_repeat_args a = {
        .src = src->data, .dst = dst->data, .seq = p->seq, .hg = p->hg, .h = p->h, .k = p->k, .elem_size = esize,
    };
    return s->dev->ops->repeat_tiled(s, &a);
}
