/*
 * rope_common.h - the parts of rope_multi's definition that every implementation shares: which
 * position axis a rotated pair reads, where the pair's second element sits, and the inverse
 * frequency. The reference, the CPU path and the CUDA kernels all include this file, so the
 * section rules live in exactly one place. Host and device (CUDA) code alike.
 */
#ifndef LMK_ROPE_COMMON_H
#define LMK_ROPE_COMMON_H

#include <stdint.h>

#if defined(__CUDACC__)
#define LMK_HD __host__ __device__ __forceinline__
#else
#define LMK_HD static inline
#endif

/* The position axis (0 t, 1 h, 2 w, 3 e) of rotated pair p. Sums and 3*s are 64-bit, so huge
 * sections never wrap: a section larger than rope_dim/2 simply covers every pair. mode is 8 (MROPE)
 * or 40 (IMROPE); validation rejects any other value before this is reached. */
LMK_HD int lmk_rope_axis(int mode, const uint32_t sections[4], uint32_t p)
{
    const uint64_t s0 = sections[0], s1 = sections[1], s2 = sections[2], s3 = sections[3];
    uint64_t sect = s0 + s1 + s2 + s3;
    if (sect == 0)
        sect = 1;
    const uint64_t sector = (uint64_t)p % sect;
    if (mode == 40) { /* IMROPE: t h w t h w ... */
        const uint64_t r = sector % 3;
        if (r == 0 && sector < 3 * s0) return 0;
        if (r == 1 && sector < 3 * s1) return 1;
        if (r == 2 && sector < 3 * s2) return 2;
        return 3;
    }
    /* MROPE: contiguous sections */
    if (sector < s0) return 0;
    if (sector < s0 + s1) return 1;
    if (sector < s0 + s1 + s2) return 2;
    return 3;
}

/* Distance from a pair's first element (index p) to its second: rope_dim/2 for the Hugging Face /
 * ggml pairing (0), head_dim/2 for the seed's pairing (1). */
LMK_HD uint32_t lmk_rope_pair_stride(int pairing, uint32_t head_dim, uint32_t rope_dim)
{
    return pairing == 1 ? head_dim / 2 : rope_dim / 2;
}

#endif /* LMK_ROPE_COMMON_H */
