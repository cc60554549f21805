/*
 * cpu_vec.h - lmk_rope's row kernels at one vector width (cpu/vec.h, bound by cpu/vec_width.h):
 * src/ops/rope/cpu.c includes this file once with LMK_VEC_W 8 (AVX2) and once with 16 (AVX-512),
 * so each loop is written once and both levels run the same operations on each element that a
 * vector step takes (the rest, fewer than a vector's pairs, take cpu.c's portable loop).
 *
 * Split pairs (x[p], x[p + pair_stride]) rotate a vector of a's against a vector of b's (VW pairs
 * a step); NORMAL's adjacent pairs (x[2p], x[2p+1]) rotate one vector of both (VW / 2 pairs), with
 * cos/sin duplicated into lane pairs and the pair swapped in-lane. bf16 goes 2 VW values a step in
 * even/odd order (cpu/bf16_simd.h): each block is one load, widened to its even and odd elements
 * without a shuffle, and leaves as one store (a streamed segment starts on a cache line, so those
 * stores are aligned). Split pairs meet cos/sin lane by lane, so rope_task puts each whole block
 * of the token's table in that order (eo_table); adjacent pairs are the even and odd elements
 * themselves and read the table as it is. Each value meets the same operands in the same order as
 * in the element-order steps: the same bits. The element-order steps take the rest (the table's
 * tail stays in pair order) and the other dtypes.
 * dt, nt and il are constants in every instantiation (rows_split, rows_adjacent).
 */
#include "cpu/vec_width.h"

/* Split pairs [0, n) of one row, as many as whole vectors hold. Returns the pairs done. */
LMK_CPU_STEP V_TARGET size_t VN(split)(lmk_dtype dt, int nt, size_t es, const unsigned char *ia,
                                       const unsigned char *ib, unsigned char *oa, unsigned char *ob,
                                       const float *cs, const float *sn, size_t n)
{
    size_t i = 0;
    VF ae, ao, be, bo, yae, yao, ybe, ybo;
    for (; dt == LMK_BF16 && i + 2 * VW <= n; i += 2 * VW) {
        V(bf16_widen_eo)(ia + 2 * i, &ae, &ao);
        V(bf16_widen_eo)(ib + 2 * i, &be, &bo);
        V(rotate)(ae, be, cs + i, sn + i, &yae, &ybe);
        V(rotate)(ao, bo, cs + i + VW, sn + i + VW, &yao, &ybo);
        V(store_bf16_eo)(oa + 2 * i, yae, yao, nt);
        V(store_bf16_eo)(ob + 2 * i, ybe, ybo, nt);
    }
    for (; i + VW <= n; i += VW) {
        V(rotate)(V(load)(dt, ia + i * es), V(load)(dt, ib + i * es), cs + i, sn + i, &yae, &ybe);
        V(store)(dt, nt, oa + i * es, yae);
        V(store)(dt, nt, ob + i * es, ybe);
    }
    return i;
}

/* Adjacent pairs [0, n) of one row, as many as whole vectors hold. Returns the pairs done. */
LMK_CPU_STEP V_TARGET size_t VN(adjacent)(lmk_dtype dt, int nt, size_t es, const unsigned char *ia,
                                          unsigned char *oa, const float *cs, const float *sn, size_t n)
{
    size_t i = 0;
    VF a, b, ya, yb;
    for (; dt == LMK_BF16 && i + VW <= n; i += VW) { /* elements 2i .. 2i + 2 VW: a the even ones, b the odd */
        V(bf16_widen_eo)(ia + 4 * i, &a, &b);
        V(rotate_eo)(a, b, cs + i, sn + i, &ya, &yb);
        V(store_bf16_eo)(oa + 4 * i, ya, yb, nt);
    }
    for (; i + VW / 2 <= n; i += VW / 2)
        V(store)(dt, nt, oa + 2 * i * es, V(rotate_adjacent)(V(load)(dt, ia + 2 * i * es), cs + i, sn + i));
    return i;
}

LMK_INLINE V_TARGET void VN(rows)(lmk_dtype dt, int nt, int il, size_t es, const rope_rows *r)
{
    rope_prefetch pf = r->pf;
    for (size_t k = 0; k < r->n_rows; k++) {
        if (r->prefetch)
            prefetch_ahead(&pf);
        const unsigned char *ia = r->in + k * r->in_rb + r->a0, *ib = ia + r->b_bytes;
        unsigned char *oa = r->out + k * r->out_rb + r->a0, *ob = oa + r->b_bytes;
        const size_t i = il ? VN(adjacent)(dt, nt, es, ia, oa, r->c, r->s, r->n)
                            : VN(split)(dt, nt, es, ia, ib, oa, ob, r->c, r->s, r->n);
        if (i < r->n) /* never with nt: its segments are whole cache lines */
            rotate_scalar(dt, il, ia, ib, oa, ob, r->c, r->s, i, r->n);
        if (r->copy)
            copy_gaps(r, k, nt);
    }
}

V_TARGET static void VN(rows_split)(lmk_dtype dt, const rope_rows *r)
{
    if (dt == LMK_F32)
        r->nt ? VN(rows)(LMK_F32, 1, 0, 4, r) : VN(rows)(LMK_F32, 0, 0, 4, r);
    else if (dt == LMK_BF16)
        r->nt ? VN(rows)(LMK_BF16, 1, 0, 2, r) : VN(rows)(LMK_BF16, 0, 0, 2, r);
    else
        r->nt ? VN(rows)(LMK_F16, 1, 0, 2, r) : VN(rows)(LMK_F16, 0, 0, 2, r);
}

V_TARGET static void VN(rows_adjacent)(lmk_dtype dt, const rope_rows *r)
{
    if (dt == LMK_F32)
        r->nt ? VN(rows)(LMK_F32, 1, 1, 4, r) : VN(rows)(LMK_F32, 0, 1, 4, r);
    else if (dt == LMK_BF16)
        r->nt ? VN(rows)(LMK_BF16, 1, 1, 2, r) : VN(rows)(LMK_BF16, 0, 1, 2, r);
    else
        r->nt ? VN(rows)(LMK_F16, 1, 1, 2, r) : VN(rows)(LMK_F16, 0, 1, 2, r);
}

/* The whole blocks of 2 VW of a token's split-pair table into even/odd order (split's bf16 steps). */
V_TARGET static void VN(eo_table)(float *cs, float *sn, size_t n)
{
    for (size_t i = 0; i + 2 * VW <= n; i += 2 * VW) {
        V(eo)(cs + i);
        V(eo)(sn + i);
    }
}

#undef LMK_VEC_W
#include "cpu/vec_width.h"
