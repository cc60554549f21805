/*
 * varlen.h - sequences packed along T and rows of a state pool, as the Gated DeltaNet ops read them
 * (lmk.h, "Gated DeltaNet": cu_seqlens and state_slots). C and CUDA: the references, the CPU paths
 * and the kernels call the same functions, so every backend reads hostile arrays the same way.
 *
 * cu_seqlens and state_slots are device data that validation cannot see. Whatever they hold, a
 * sequence's tokens are clamped into [0, T] (a decreasing offset ends the sequence empty) and a
 * slot outside [0, n_slots) means no row, so no value of either array leads outside the operands.
 */
#ifndef LMK_OPS_VARLEN_H
#define LMK_OPS_VARLEN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define LMK_HD __host__ __device__ __forceinline__
#else
#define LMK_HD static inline
#endif

/* Entry i of an i32 (is64 0) or i64 index array, widened. */
LMK_HD int64_t lmk_index_at(const void *base, int is64, size_t i)
{
    return is64 ? ((const int64_t *)base)[i] : (int64_t)((const int32_t *)base)[i];
}

/* Sequence s's tokens [*lo, *hi), 0 <= *lo <= *hi <= T whatever cu_seqlens holds; NULL cu_seqlens:
 * one sequence [0, T). */
LMK_HD void lmk_seq_bounds(const void *cu_seqlens, int is64, size_t s, size_t T, size_t *lo, size_t *hi)
{
    if (!cu_seqlens) {
        *lo = 0, *hi = T;
        return;
    }
    const int64_t a = lmk_index_at(cu_seqlens, is64, s), b = lmk_index_at(cu_seqlens, is64, s + 1);
    const size_t l = a <= 0 ? 0 : (uint64_t)a >= T ? T : (size_t)a;
    const size_t h = b <= (int64_t)l ? l : (uint64_t)b >= T ? T : (size_t)b;
    *lo = l, *hi = h;
}

/* Sequence s's state row, or -1 for none (no pool, a negative slot, or one >= n_slots). NULL
 * slots: row s. */
LMK_HD int64_t lmk_seq_slot(const void *slots, int is64, size_t s, size_t n_slots)
{
    const int64_t r = slots ? lmk_index_at(slots, is64, s) : (int64_t)s;
    return r >= 0 && (uint64_t)r < n_slots ? r : -1;
}

/* Whether sequence s stores its row: it has one, and no later sequence of the call names the same
 * row (the last of several sequences naming one row is the one that stores it; lmk.h). */
LMK_HD int lmk_seq_stores(const void *slots, int is64, size_t s, size_t n_seq, size_t n_slots, int64_t row)
{
    if (row < 0 || (uint64_t)row >= n_slots)
        return 0;
    if (slots)
        for (size_t j = s + 1; j < n_seq; j++)
            if (lmk_index_at(slots, is64, j) == row)
                return 0;
    return 1;
}

#ifdef __CUDACC__
/* lmk_seq_stores for a whole block: whether sequence s stores its row `row` (>= 0), the scan of the
 * later slots shared by the block's threads. Every thread of the block calls it (a barrier). */
__device__ __forceinline__ bool lmk_block_seq_stores(const void *slots, int is64, uint64_t s, uint64_t n_seq,
                                                     int64_t row)
{
    int dup = 0;
    if (slots)
        for (uint64_t j = s + 1 + threadIdx.x; j < n_seq; j += blockDim.x)
            dup |= lmk_index_at(slots, is64, j) == row;
    return !__syncthreads_or(dup);
}
#endif

#endif /* LMK_OPS_VARLEN_H */
