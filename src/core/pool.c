/*
 * pool.c - the operand shapes of the Gated DeltaNet ops (lmk.h, "Gated DeltaNet"): [T, C] operands
 * with a free token stride, and state pools of any strides.
 *
 * A state pool is read and written by the op, so its elements must be distinct; any strides are
 * accepted because engines hold the same state in several layouts (Hugging Face's [B, C, W-1]
 * convolution cache as a view of [B, W-1, C]; the recurrent state dv-fastest or dk-fastest). Its
 * overlap with the other operands is judged on extents, which is exact for pools kept in their own
 * allocation, as every engine keeps them.
 */
#include "core/internal.h"

lmk_status lmk_operand2(const char *op, const char *name, const lmk_buffer *b, size_t n0, size_t n1,
                        lmk_tensor3 *out)
{
    size_t count;
    if (lmk_mul_overflows(n0, n1, &count))
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: %s shape [%zu, %zu] overflows size_t", op, name, n0, n1);
    *out = (lmk_tensor3){.data = b->data, .n = {n0, 1, n1}, .stride = {n1, n1, 1}, .es = lmk_dtype_size(b->dtype)};
    if (b->ndim == 2 && b->shape[0] == n0 && b->shape[1] == n1 && (b->stride[1] == 1 || n1 == 1)) {
        out->stride[0] = b->stride[0];
        return LMK_OK;
    }
    if (b->dense && b->element_count == count)
        return LMK_OK;
    char shape[96], strides[96];
    lmk_format_dims(shape, sizeof shape, b->shape, b->ndim);
    lmk_format_dims(strides, sizeof strides, b->stride, b->ndim);
    if (b->dense)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT,
                        "%s: %s element count %zu != %zu * %zu = %zu (shape [%s]; a dense buffer must hold exactly "
                        "that many elements, or be a [%zu, %zu] view with last stride 1)",
                        op, name, b->element_count, n0, n1, count, shape, n0, n1);
    return lmk_fail(LMK_ERR_INVALID_ARGUMENT,
                    "%s: %s has shape [%s] and strides [%s]: a strided operand must have shape exactly [%zu, %zu] "
                    "with last stride 1",
                    op, name, shape, strides, n0, n1);
}

/* Whether two elements of the pool share a byte: with the axes sorted by stride, each stride must
 * step past everything the smaller ones reach (exact for nested layouts, conservative otherwise). */
static bool pool_self_overlaps(const lmk_pool *p)
{
    size_t n[LMK_POOL_MAX_DIMS], s[LMK_POOL_MAX_DIMS];
    int k = 0;
    for (int i = 0; i < p->ndim; i++)
        if (p->n[i] > 1)
            n[k] = p->n[i], s[k] = p->stride[i], k++;
    for (int i = 1; i < k; i++)
        for (int j = i; j > 0 && s[j] < s[j - 1]; j--) {
            size_t x = s[j]; s[j] = s[j - 1]; s[j - 1] = x;
            x = n[j]; n[j] = n[j - 1]; n[j - 1] = x;
        }
    size_t reach = 1;
    for (int i = 0; i < k; i++) {
        if (s[i] < reach)
            return true;
        reach = (n[i] - 1) * s[i] + reach;
    }
    return false;
}

lmk_status lmk_operand_pool(const char *op, const char *name, const lmk_buffer *b, int ndim, const size_t *n,
                            lmk_pool *out)
{
    char shape[128], strides[128], want[96];
    lmk_format_dims(shape, sizeof shape, b->shape, b->ndim);
    lmk_format_dims(strides, sizeof strides, b->stride, b->ndim);
    lmk_format_dims(want, sizeof want, n + 1, ndim - 1);
    bool ok = b->ndim == ndim;
    for (int i = 1; ok && i < ndim; i++)
        ok = b->shape[i] == n[i];
    if (!ok)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: %s has shape [%s]: it must be a %d-D pool [n_slots, %s]", op,
                        name, shape, ndim, want);
    *out = (lmk_pool){.data = b->data, .ndim = ndim, .es = lmk_dtype_size(b->dtype)};
    for (int i = 0; i < ndim; i++)
        out->n[i] = b->shape[i], out->stride[i] = b->stride[i];
    if (pool_self_overlaps(out))
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT,
                        "%s: %s has overlapping elements (shape [%s], strides [%s]): a state pool's elements must be "
                        "distinct",
                        op, name, shape, strides);
    return LMK_OK;
}

bool lmk_pool_overlaps(const lmk_pool *p, const lmk_tensor3 *t)
{
    size_t pl = 0, tl = 0;
    for (int i = 0; i < p->ndim; i++) {
        if (!p->n[i])
            return false;
        pl += (p->n[i] - 1) * p->stride[i];
    }
    for (int i = 0; i < 3; i++) {
        if (!t->n[i])
            return false;
        tl += (t->n[i] - 1) * t->stride[i];
    }
    return lmk_ranges_overlap(p->data, (pl + 1) * p->es, t->data, (tl + 1) * t->es);
}
