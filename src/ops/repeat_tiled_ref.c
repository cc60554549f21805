/*
 * repeat_tiled_ref.c - the naive reference of repeat_tiled: the executable spec.
 *
 * One element at a time, straight from the definition dst[t, i, j] = src[t, i % hg, j]. Every fast
 * path is compared with this bit for bit.
 */
#include "core/internal.h"

#include <string.h>

void lmk_ref_repeat_tiled(const lmk_repeat_args *a)
{
    const unsigned char *src = a->src;
    unsigned char *dst = a->dst;
    const size_t es = a->elem_size;
    for (size_t t = 0; t < a->seq; t++)
        for (size_t i = 0; i < a->h; i++)
            for (size_t j = 0; j < a->k; j++) {
                const size_t from = (t * a->hg + i % a->hg) * a->k + j;
                const size_t to = (t * a->h + i) * a->k + j;
                memcpy(dst + to * es, src + from * es, es);
            }
}
