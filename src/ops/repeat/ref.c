/*
 * ref.c - the naive reference of repeat_heads: the executable spec.
 *
 * One element at a time, straight from the definition dst[t, i, j] = src[t, g(i), j] with
 * g(i) = i % hg (tiled) or i / (h / hg) (block), through the element strides. Every fast path is
 * compared with this bit for bit.
 */
#include "core/internal.h"
#include "ops/repeat/repeat.h"

#include <string.h>

void lmk_ref_repeat(const lmk_repeat_args *a)
{
    const unsigned char *src = a->src;
    unsigned char *dst = a->dst;
    const size_t es = a->elem_size;
    for (size_t t = 0; t < a->seq; t++)
        for (size_t i = 0; i < a->h; i++) {
            const size_t g = a->layout == LMK_REPEAT_BLOCK ? i / (a->h / a->hg) : i % a->hg;
            for (size_t j = 0; j < a->k; j++)
                memcpy(dst + (t * a->dst_tok + i * a->dst_head + j) * es, src + (t * a->src_tok + g * a->src_head + j) * es,
                       es);
        }
}
