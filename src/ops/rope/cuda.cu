/*
 * rope_multi.cu - the CUDA kernel of rope_multi (MROPE / IMROPE rotary embedding) and its launcher.
 * One launch rotates one tensor (lmk_rope_multi) or the queries and keys of a layer together
 * (lmk_rope_multi_qk), so a decode step pays one launch and computes each angle once for q and k.
 *
 * Work split. A row is one (token, head) vector of head_dim elements, cut into units of VE elements
 * (16 bytes when the shape and addresses allow: 4 f32 or 8 bf16/f16; else 8, 4 or 2 bytes):
 *   - pair units: unit u rotates pairs [u*VE, u*VE+VE), i.e. the vector at u*VE (the a halves) with
 *     the vector at stride + u*VE (the b halves);
 *   - copy units (out of place only): the untouched elements, [rope_dim, head_dim) for the Hugging
 *     Face pairing, [R/2, D/2) and [D/2+R/2, D) for the seed's pairing.
 * A block takes a tile of `tile_tokens` consecutive tokens and a range of rows (q rows then k rows;
 * all of them unless T is too small to fill the GPU, when the rows are split among `groups` blocks).
 * It first computes the (cos, sin) of every (token, pair) of its tile into shared memory, one angle
 * per thread, so each angle is computed once and read by all 28 heads of q and k (once per row group
 * at decode). The order within a block: a thread loads its first batch of pair units (16-byte loads,
 * kRotBatch items) and its first batch of copy units (kCopyBatch; they need no angle), computes its
 * angle, stores the copy units and streams the rest, and only then waits at the barrier and rotates
 * and stores the pair units. So the angle chain overlaps a memory round trip instead of delaying
 * one, and at decode all of a thread's loads start at once. Pair and copy items are enumerated
 * separately, so a warp runs one kind of work and does not diverge.
 * Rows with rope_dim/2 beyond the shared-memory table (kSmemPairs) are processed in chunks of pairs.
 * In place (in == out) there are no copy units: only the rotated elements are read and written.
 * Small T (decode): when T x row groups is at most 2 blocks per SM, a second kernel
 * (rope_decode_kernel) does the same work with one token per block, one item per thread and every
 * index precomputed by the host; see its comment and docs/cuda_notes.md (v6).
 * Untouched elements move as raw integer words: bit-exact, NaN payloads included.
 *
 * Precision (SPEC.md: f32 within 1e-5 of float64 for |x| <= 2 up to |pos| = 2^20). The f32 seed
 * computes pos * powf(base, -2p/R) in f32, whose error at 2^20 is ~0.06 rad. Here:
 *   inv_freq(p) = exp2(p * log2_step) in double (log2_step = -2*log2(base)/R, from the host);
 *   theta = pos * inv_freq in double, reduced by k*pi/2, k = rint(theta*2/pi), with a two-constant
 *   Cody-Waite reduction in double (exact to ~1e-16 for |theta| <= 2^20);
 *   sin and cos of the reduced f32 angle (|r| <= pi/4) by minimax polynomials (rope_cs: 1.5 ulp).
 * The angle error is then ~1e-7 rad, so f32 results sit within ~1e-6 of float64 and bf16/f16
 * results within one ulp.
 */
#include "cuda/cuda_internal.h"
#include "ops/rope/rope.h"
#include "ops/rope/rope_common.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 256;
constexpr uint32_t kSmemPairs = 2048; /* most (cos, sin) slots of a block: 16 KB of shared memory */
/* Items a thread loads before it stores them, the most that fit 80 registers without spills. Pair
 * items (two units each): 1 in the kernel with copy items (there a block of the model shapes has
 * fewer pair items than threads: Qwen3.5, 224), 4 in the one without (in place, or rope_dim ==
 * head_dim). Copy items: 5 (a Qwen3.5 block has 1344: one batch, and a sixth item for 64 threads). */
template <bool COPY> constexpr int kRotBatch = COPY ? 1 : 4;
constexpr int kCopyBatch = 5;
constexpr uint32_t kBlockItems = 1024; /* work items a block aims for at prefill: 4 per thread */
/* The small-T kernel: threads a block aims for (whole rows of one token, one item per thread), the
 * most pairs per row (its (cos, sin) table: 8 KB) and items per row (one row per block at most:
 * 1024 threads) it takes. It is chosen when its grid, T x row groups, is at most 2 blocks per SM:
 * there the general kernel cannot fill the GPU either. */
constexpr uint32_t kDecThreads = 256;
constexpr uint32_t kDecMaxPairs = 1024;
constexpr uint32_t kDecMaxItems = 1024;
/* Up to this many rows in a launch (T x heads), 2-byte types take 8-byte units instead of 16. A
 * decode launch is a handful of blocks whose time grows with the work each does: 16-byte bf16
 * units gave Qwen3.5-27B's q+k 4 blocks against f32's 7 and cost 1.78 us per call against f32's
 * 1.62. 8-byte units give bf16 the same items, threads and blocks as f32. */
constexpr uint64_t kDecNarrowRows = 64;

/* Everything a launch needs, passed by value (kernel parameter space: no allocation, no copy). */
struct RopeParams {
    const unsigned char *in0, *in1; /* q (or the only tensor) and k; in1 = in0 with one tensor */
    unsigned char *out0, *out1;
    const int32_t *pos;             /* 4*seq, axis-major */
    uint64_t seq;
    uint64_t n_blocks;              /* tiles * groups */
    uint32_t nh0, nh1;              /* heads of tensor 0 and 1 (nh1 = 0 with one tensor) */
    uint32_t rows;                  /* nh0 + nh1 */
    uint32_t head_dim, stride;      /* elements; stride: a pair's b element minus its a element */
    uint32_t half;                  /* rope_dim / 2: pairs per row */
    uint32_t chunk;                 /* pairs per shared-memory pass (a multiple of VE) */
    uint32_t nc, nc1;               /* copy units per row (0 in place), of which nc1 in range 1 */
    uint32_t c1, c2;                /* first element of untouched range 1 and 2 */
    uint32_t tile_tokens;           /* tokens per block */
    uint32_t groups, rows_per_group;
    uint32_t copy0, copy1;          /* tensor j is out of place: copy its untouched elements */
    uint32_t sect;                  /* sections' sum (0 -> 1), capped at 2^32 - 1 (no pair reaches it) */
    uint32_t lim[3];                /* rope_axis: sector bounds of axes t, h, w (capped likewise) */
    int mode;
    double log2_step;               /* -2*log2(base)/rope_dim: inv_freq(p) = exp2(p*log2_step) */
};

/* The small-T (decode) kernel's launch: everything the kernel would otherwise derive with run-time
 * divisions is computed by the host. A block is (token blockIdx.x, rows blockIdx.y * blockDim.y +
 * threadIdx.y); threadIdx.x is the item of the row: [0, npu) pair units, then copy units. */
struct DecParams {
    const unsigned char *in0, *in1;
    unsigned char *out0, *out1;
    const int32_t *pos;
    uint32_t seq;                   /* T (small: at most 2 blocks per SM in all) */
    uint32_t nh0, nh1, rows;
    uint32_t row_bytes, stride_b;   /* head_dim * ES; pair stride * ES */
    uint32_t npu;                   /* pair units per row (half / VE) */
    uint32_t nc1;                   /* copy units in untouched range 1 */
    uint32_t c1_b, c2_b;            /* byte offset of copy unit c: c1_b + c*NB (c < nc1), else c2_b + c*NB */
    uint32_t half, n_threads;       /* pairs per row; threads per block */
    uint32_t copy0, copy1;
    uint32_t sect;
    uint32_t lim[3];
    int mode;
    double log2_step;
};

/* A unit of NB bytes held as 32-bit words (NB = 2 uses the low half of w[0]). */
template <int NB> struct Raw { uint32_t w[NB >= 4 ? NB / 4 : 1]; };

/* Loads are evict-first (the input is dead once read); ld.global.cs is coherent, so it is also
 * right in place. Stores are plain: the output is what the next op (attention) reads. */
template <int NB> __device__ __forceinline__ Raw<NB> load(const unsigned char *p)
{
    Raw<NB> r;
    if constexpr (NB == 16) {
        const uint4 v = __ldcs(reinterpret_cast<const uint4 *>(p));
        r.w[0] = v.x, r.w[1] = v.y, r.w[2] = v.z, r.w[3] = v.w;
    } else if constexpr (NB == 8) {
        const uint2 v = __ldcs(reinterpret_cast<const uint2 *>(p));
        r.w[0] = v.x, r.w[1] = v.y;
    } else if constexpr (NB == 4) {
        r.w[0] = __ldcs(reinterpret_cast<const unsigned *>(p));
    } else {
        r.w[0] = __ldcs(reinterpret_cast<const unsigned short *>(p));
    }
    return r;
}

template <int NB> __device__ __forceinline__ void store(unsigned char *p, const Raw<NB> &r)
{
    if constexpr (NB == 16)
        *reinterpret_cast<uint4 *>(p) = make_uint4(r.w[0], r.w[1], r.w[2], r.w[3]);
    else if constexpr (NB == 8)
        *reinterpret_cast<uint2 *>(p) = make_uint2(r.w[0], r.w[1]);
    else if constexpr (NB == 4)
        *reinterpret_cast<unsigned *>(p) = r.w[0];
    else
        *reinterpret_cast<unsigned short *>(p) = (unsigned short)r.w[0];
}

/* dtype traits: DT is the lmk_dtype value (LMK_F32, LMK_F16, LMK_BF16). */
template <int DT> struct Elem;

template <> struct Elem<LMK_F32> {
    static constexpr int size = 4;
    static __device__ __forceinline__ float widen(uint32_t b) { return __uint_as_float(b); }
    static __device__ __forceinline__ uint32_t narrow(float f) { return __float_as_uint(f); }
};

template <> struct Elem<LMK_BF16> {
    static constexpr int size = 2;
    static __device__ __forceinline__ float widen(uint32_t b) { return __uint_as_float(b << 16); }
    /* Round to nearest even; a NaN stays a quiet NaN with its sign (lmk_f32_to_bf16). */
    static __device__ __forceinline__ uint32_t narrow(float f)
    {
        const uint32_t u = __float_as_uint(f);
        if ((u & 0x7fffffffu) > 0x7f800000u)
            return (u >> 16) | 0x0040u;
        return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    }
    /* Two values packed (lo in the low half): one cvt.rn.bf16x2.f32, which rounds to nearest even
     * like narrow() but returns a canonical NaN, so NaNs take narrow(). */
    static __device__ __forceinline__ uint32_t narrow2(float lo, float hi)
    {
        if (lo != lo || hi != hi)
            return narrow(lo) | (narrow(hi) << 16);
        const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return (uint32_t)__bfloat16_as_ushort(v.x) | ((uint32_t)__bfloat16_as_ushort(v.y) << 16);
    }
};

template <> struct Elem<LMK_F16> {
    static constexpr int size = 2;
    static __device__ __forceinline__ float widen(uint32_t b)
    {
        return __half2float(__ushort_as_half((unsigned short)b));
    }
    /* cvt.rn.f16.f32 rounds to nearest even and overflows to infinity; a NaN is kept as a quiet
     * NaN with its sign and top payload bits (lmk_f32_to_f16), not cvt's canonical NaN. */
    static __device__ __forceinline__ uint32_t narrow(float f)
    {
        const uint32_t u = __float_as_uint(f);
        if ((u & 0x7fffffffu) > 0x7f800000u)
            return ((u >> 16) & 0x8000u) | 0x7e00u | ((u >> 13) & 0x03ffu);
        return __half_as_ushort(__float2half_rn(f));
    }
    /* Two values packed (lo in the low half): one cvt.rn.f16x2.f32; NaNs take narrow(). */
    static __device__ __forceinline__ uint32_t narrow2(float lo, float hi)
    {
        if (lo != lo || hi != hi)
            return narrow(lo) | (narrow(hi) << 16);
        const __half2 v = __floats2half2_rn(lo, hi);
        return (uint32_t)__half_as_ushort(v.x) | ((uint32_t)__half_as_ushort(v.y) << 16);
    }
};

template <int DT, int VE> __device__ __forceinline__ uint32_t get_bits(const Raw<VE * Elem<DT>::size> &r, int e)
{
    if constexpr (Elem<DT>::size == 4)
        return r.w[e];
    else
        return (r.w[e >> 1] >> (16 * (e & 1))) & 0xffffu;
}

/* The unit holding the values f[e], rounded to the dtype. */
template <int DT, int VE> __device__ __forceinline__ Raw<VE * Elem<DT>::size> pack(const float (&f)[VE])
{
    Raw<VE * Elem<DT>::size> r;
    if constexpr (Elem<DT>::size == 4) {
#pragma unroll
        for (int e = 0; e < VE; e++)
            r.w[e] = __float_as_uint(f[e]);
    } else if constexpr (VE == 1) {
        r.w[0] = Elem<DT>::narrow(f[0]);
    } else {
#pragma unroll
        for (int e = 0; e < VE; e += 2)
            r.w[e >> 1] = Elem<DT>::narrow2(f[e], f[e + 1]);
    }
    return r;
}

/* The position axis of a pair: lmk_rope_axis (rope_common.h) with its sums precomputed by the host
 * (lim: 3*s0, 3*s1, 3*s2 for IMROPE; s0, s0+s1, s0+s1+s2 for MROPE; all capped at 2^32 - 1, which no
 * sector reaches, so the caps change no comparison). The same rule, but in 32 bits and with no
 * division when pair < sect (Qwen: always): the shared version's two 64-bit remainders are
 * ~100-cycle subroutines, and they sat in front of the position load on every angle's critical path. */
template <class P> __device__ __forceinline__ uint32_t rope_axis(const P &p, uint32_t pair)
{
    const uint32_t sector = pair < p.sect ? pair : pair % p.sect;
    if (p.mode == LMK_ROPE_IMROPE) {
        const uint32_t r = sector % 3u;
        const uint32_t lim = r == 0 ? p.lim[0] : r == 1 ? p.lim[1] : p.lim[2]; /* no indexed parameter */
        return sector < lim ? r : 3u;
    }
    return sector < p.lim[0] ? 0u : sector < p.lim[1] ? 1u : sector < p.lim[2] ? 2u : 3u;
}

/* pi/2 split in two doubles for the Cody-Waite reduction: hi is the double nearest pi/2 and lo the
 * double nearest pi/2 - hi, so k*(hi + lo) is k*pi/2 to ~1e-33 relative for |k| < 2^51. */
constexpr double kPiHalfHi = 1.57079632679489655800e+00;
constexpr double kPiHalfLo = 6.12323399573676603587e-17;
constexpr double kTwoOverPi = 6.36619772367581382433e-01;
constexpr double kRound = 6755399441055744.0; /* 1.5 * 2^52: x + kRound rounds x to an integer */

/* (cos, sin) of theta = pos * inv_freq. The quadrant reduction is in double: t = kRound +
 * rint(theta*2/pi) in one FMA (its low word holds the quadrant k mod 4), r = theta - k*pi/2 in two
 * FMAs, exact to ~1e-16 for |theta| < 2^51. Then sin and cos of the f32 r (|r| <= pi/4) by two short
 * polynomials (the minimax ones of CUDA's own sincosf kernel; max error 7e-8 absolute, 1.5 ulp,
 * measured against libm over 4e7 angles with |theta| <= 2^20) and a quadrant swap: branch-free, no
 * stack frame, ~12 dependent instructions after the position arrives. The clamp only matters for
 * |theta| >= 2^51 (absurd bases), where it keeps the result finite and bounded. */
__device__ __forceinline__ float2 rope_cs(int32_t pos, double inv_freq)
{
    const double theta = (double)pos * inv_freq;
    const double t = fma(theta, kTwoOverPi, kRound);
    const double k = t - kRound;
    float x = (float)fma(-k, kPiHalfLo, fma(-k, kPiHalfHi, theta));
    x = fminf(fmaxf(x, -1.0f), 1.0f);
    const uint32_t q = (uint32_t)__double2loint(t);
    const float x2 = x * x;
    const float ps = fmaf(fmaf(fmaf(-1.95152959e-4f, x2, 8.33216087e-3f), x2, -1.66666546e-1f), x2 * x, x);
    const float pc = fmaf(fmaf(fmaf(fmaf(2.44331571e-5f, x2, -1.38873163e-3f), x2, 4.16666457e-2f), x2, -0.5f), x2, 1.0f);
    float sn = (q & 1) ? pc : ps, cs = (q & 1) ? -ps : pc;
    if (q & 2)
        sn = -sn, cs = -cs;
    return make_float2(cs, sn);
}

/* The position of angle j of the block's table (token t0 + j / cn, pair c0 + j % cn), and its pair. */
__device__ __forceinline__ int32_t angle_pos(const RopeParams &p, uint64_t t0, uint32_t j, uint32_t c0, uint32_t cn,
                                             uint32_t &pair)
{
    const uint32_t tl = j / cn;
    pair = c0 + (j - tl * cn);
    return __ldg(p.pos + (uint64_t)rope_axis(p, pair) * p.seq + t0 + tl);
}

/* Where row r (q for r < nh0, else k) of token t starts, in and out, and whether its tensor is
 * copied (out of place). */
struct RowRef {
    const unsigned char *in;
    unsigned char *out;
    bool copy;
};
template <int ES>
__device__ __forceinline__ RowRef row_ref(const RopeParams &p, uint64_t t, uint32_t r)
{
    const bool k = r >= p.nh0;
    const uint64_t row = k ? t * p.nh1 + (r - p.nh0) : t * p.nh0 + r;
    const uint64_t byte = row * p.head_dim * ES;
    return RowRef{(k ? p.in1 : p.in0) + byte, (k ? p.out1 : p.out0) + byte, (k ? p.copy1 : p.copy0) != 0};
}

/* One batch of pair items of a thread: the loaded a and b units, where to store them, and where
 * their angles sit in the shared table. */
template <int NB, int RB> struct RotBatch {
    Raw<NB> a[RB], b[RB];
    unsigned char *out[RB]; /* NULL: no item */
    uint32_t cs[RB];        /* index of the unit's first (cos, sin) in the table */
};

/* Loads the pair items i, i + kThreads, ... of this block's chunk. An item is (token tl of the
 * tile, row r_lo + rr, unit u of the chunk), u fastest so a warp reads contiguous units. */
template <int ES, int VE, int RB>
__device__ __forceinline__ void rot_load(const RopeParams &p, RotBatch<VE * ES, RB> &bt, uint32_t i, uint32_t n_items,
                                         uint32_t nu, uint32_t nr, uint64_t t0, uint32_t r_lo, uint32_t c0,
                                         uint32_t cn)
{
#pragma unroll
    for (int k = 0; k < RB; k++) {
        const uint32_t item = i + k * kThreads;
        bt.out[k] = nullptr;
        if (item < n_items) {
            const uint32_t u = item % nu, rr = item / nu;
            const uint32_t tl = rr / nr, r = r_lo + (rr - tl * nr);
            const RowRef ref = row_ref<ES>(p, t0 + tl, r);
            const size_t off = (size_t)(c0 + u * VE) * ES;
            bt.a[k] = load<VE * ES>(ref.in + off);
            bt.b[k] = load<VE * ES>(ref.in + off + (size_t)p.stride * ES);
            bt.out[k] = ref.out + off;
            bt.cs[k] = tl * cn + u * VE;
        }
    }
}

/* Rotates one pair item (a and b units, the (cos, sin) of its VE pairs at cs) and stores it at out
 * and out + stride_b. Both kernels use this, so their results are bit-identical. */
template <int DT, int VE>
__device__ __forceinline__ void rotate_store(const Raw<VE * Elem<DT>::size> &ra, const Raw<VE * Elem<DT>::size> &rb,
                                             const float2 *cs_at, unsigned char *out, size_t stride_b)
{
    constexpr int ES = Elem<DT>::size;
    float c[VE], sn[VE];
    if constexpr (VE == 1) {
        const float2 cs = cs_at[0];
        c[0] = cs.x, sn[0] = cs.y;
    } else { /* two pairs per 16-byte shared load: cs_at is 16-byte aligned */
#pragma unroll
        for (int e = 0; e < VE; e += 2) {
            const float4 q = *reinterpret_cast<const float4 *>(cs_at + e);
            c[e] = q.x, sn[e] = q.y, c[e + 1] = q.z, sn[e + 1] = q.w;
        }
    }
    float oa[VE], ob[VE];
#pragma unroll
    for (int e = 0; e < VE; e++) {
        const float a = Elem<DT>::widen(get_bits<DT, VE>(ra, e));
        const float b = Elem<DT>::widen(get_bits<DT, VE>(rb, e));
        oa[e] = fmaf(a, c[e], -b * sn[e]);
        ob[e] = fmaf(a, sn[e], b * c[e]);
    }
    store<VE * ES>(out, pack<DT, VE>(oa));
    store<VE * ES>(out + stride_b, pack<DT, VE>(ob));
}

template <int DT, int VE, int RB>
__device__ __forceinline__ void rot_store(const RopeParams &p, const RotBatch<VE * Elem<DT>::size, RB> &bt,
                                          const float2 *s_cs)
{
    constexpr int ES = Elem<DT>::size;
#pragma unroll
    for (int k = 0; k < RB; k++)
        if (bt.out[k]) /* bt.cs[k] is even for VE >= 2 */
            rotate_store<DT, VE>(bt.a[k], bt.b[k], s_cs + bt.cs[k], bt.out[k], (size_t)p.stride * ES);
}

/* One batch of copy items of a thread (out of place): the loaded units and where they go. An item
 * is (token tl, row r_lo + rr, copy unit c), c fastest. */
template <int NB> struct CopyBatch {
    Raw<NB> v[kCopyBatch];
    unsigned char *dst[kCopyBatch]; /* NULL: no item */
};

template <int ES, int VE>
__device__ __forceinline__ void copy_load(const RopeParams &p, CopyBatch<VE * ES> &cb, uint32_t ci, uint32_t n_copy,
                                          uint32_t nr, uint64_t t0, uint32_t r_lo)
{
#pragma unroll
    for (int k = 0; k < kCopyBatch; k++) {
        const uint32_t item = ci + k * kThreads;
        cb.dst[k] = nullptr;
        if (item < n_copy) {
            const uint32_t c = item % p.nc, rr = item / p.nc;
            const uint32_t tl = rr / nr, r = r_lo + (rr - tl * nr);
            const RowRef ref = row_ref<ES>(p, t0 + tl, r);
            if (ref.copy) {
                const size_t off = (size_t)(c < p.nc1 ? p.c1 + c * VE : p.c2 + (c - p.nc1) * VE) * ES;
                cb.v[k] = load<VE * ES>(ref.in + off);
                cb.dst[k] = ref.out + off;
            }
        }
    }
}

template <int NB> __device__ __forceinline__ void copy_store(const CopyBatch<NB> &cb)
{
#pragma unroll
    for (int k = 0; k < kCopyBatch; k++)
        if (cb.dst[k])
            store<NB>(cb.dst[k], cb.v[k]);
}

/* At most 80 registers, so 3 blocks of 256 threads fit an SM (ptxas -v, sm_90: see
 * docs/cuda_notes.md). A block is one (tile, row group); the grid is 2-D only when there are more
 * than 2^31 - 1 of them. There is no grid-stride loop: one cost ptxas -v showed is ~30 registers of
 * loop-carried state. COPY: the launch has copy items (p.nc > 0); without them the copy code is
 * left out and a thread keeps twice as many pair items in flight. The (cos, sin) table is dynamic
 * shared memory of tile_tokens * chunk entries (at most kSmemPairs; 256 B at decode). */
template <int DT, int VE, bool COPY>
__global__ void __launch_bounds__(kThreads, 3) rope_multi_kernel(const RopeParams p)
{
    constexpr int ES = Elem<DT>::size, NB = VE * ES, RB = kRotBatch<COPY>;
    extern __shared__ __align__(16) float2 s_cs[];
    const uint64_t blk = (uint64_t)blockIdx.y * gridDim.x + blockIdx.x;
    if (blk >= p.n_blocks)
        return;
    const uint64_t tile = blk >> 32 ? blk / p.groups : (uint32_t)blk / p.groups; /* 32-bit divide if it fits */
    const uint32_t group = (uint32_t)(blk - tile * p.groups);
    const uint64_t t0 = tile * p.tile_tokens;
    const uint32_t tt = (uint32_t)min((uint64_t)p.tile_tokens, p.seq - t0);
    const uint32_t r_lo = group * p.rows_per_group;
    const uint32_t nr = min(p.rows_per_group, p.rows - r_lo);

    /* One chunk of pairs (usually all of them) at a time. Order within a block: the first batch of
     * pair items and the first batch of copy items are loaded, the angles are computed (one per
     * thread at most: the host sizes the tiles so), the copy items are stored and the rest of them
     * streamed, then the block syncs and rotates. So the angle chain overlaps a memory round trip
     * instead of delaying one, and at decode every load of a thread starts at once. Copy items are
     * dealt from the last thread down, so the first warps, which compute the angles, get the fewest. */
    for (uint32_t c0 = 0; c0 < p.half; c0 += p.chunk) {
        const uint32_t cn = min(p.chunk, p.half - c0), nu = cn / VE;
        const uint32_t n_items = tt * nr * nu, n_ang = tt * cn;
        RotBatch<NB, RB> bt;
        uint32_t i = threadIdx.x;
        rot_load<ES, VE, RB>(p, bt, i, n_items, nu, nr, t0, r_lo, c0, cn);
        [[maybe_unused]] CopyBatch<NB> cb;
        [[maybe_unused]] uint32_t ci = kThreads - 1 - threadIdx.x;
        [[maybe_unused]] const uint32_t n_copy = c0 == 0 ? tt * nr * p.nc : 0;
        if constexpr (COPY)
            copy_load<ES, VE>(p, cb, ci, n_copy, nr, t0, r_lo);
        if (c0 > 0)
            __syncthreads(); /* the previous chunk's readers of s_cs are done */
        for (uint32_t j = threadIdx.x; j < n_ang; j += kThreads) {
            uint32_t pr;
            const int32_t x = angle_pos(p, t0, j, c0, cn, pr);
            s_cs[j] = rope_cs(x, exp2((double)pr * p.log2_step));
        }
        if constexpr (COPY) {
            for (;;) {
                copy_store<NB>(cb);
                ci += kCopyBatch * kThreads;
                if (ci >= n_copy)
                    break;
                copy_load<ES, VE>(p, cb, ci, n_copy, nr, t0, r_lo);
            }
        }
        __syncthreads();
        for (;;) {
            rot_store<DT, VE, RB>(p, bt, s_cs);
            i += RB * kThreads;
            if (i >= n_items)
                break;
            rot_load<ES, VE, RB>(p, bt, i, n_items, nu, nr, t0, r_lo, c0, cn);
        }
    }
}

/* The small-T kernel (decode): one token per block (blockIdx.x) and a few rows (blockIdx.y), one
 * item per thread, no loops over tiles, no run-time division. Each thread issues its loads first
 * (a pair item: its a and b units; a copy item: its unit), the first `half` threads then compute
 * the (cos, sin) of the token's pairs into shared memory (once per block, shared by all its rows of
 * q and k), copy items store, the block syncs, pair items rotate and store. Threads of rows past
 * the last (the last row group) load and store nothing but still reach the barrier.
 * COPY: the launch has copy items (blockDim.x > npu). */
template <int DT, int VE, bool COPY>
__global__ void __launch_bounds__(1024) rope_decode_kernel(const DecParams p)
{
    constexpr int ES = Elem<DT>::size, NB = VE * ES;
    extern __shared__ __align__(16) float2 s_cs[];
    const uint32_t x = threadIdx.x, t = blockIdx.x;
    const uint32_t r = blockIdx.y * blockDim.y + threadIdx.y;
    const bool live = r < p.rows, kk = r >= p.nh0;
    const uint32_t row = kk ? t * p.nh1 + (r - p.nh0) : t * p.nh0 + r;
    const bool pair = !COPY || x < p.npu;
    uint32_t off = x * NB;
    if (COPY && !pair) {
        const uint32_t c = x - p.npu;
        off = (c < p.nc1 ? p.c1_b : p.c2_b) + c * NB;
    }
    const size_t at = (size_t)row * p.row_bytes + off;
    const unsigned char *src = (kk ? p.in1 : p.in0) + at;
    unsigned char *dst = (kk ? p.out1 : p.out0) + at;
    const bool do_copy = COPY && !pair && live && (kk ? p.copy1 : p.copy0) != 0;
    Raw<NB> a{}, b{};
    if (live && pair) {
        a = load<NB>(src);
        b = load<NB>(src + p.stride_b);
    } else if (do_copy) {
        a = load<NB>(src);
    }
    for (uint32_t j = threadIdx.y * blockDim.x + x; j < p.half; j += p.n_threads) {
        const int32_t ps = __ldg(p.pos + rope_axis(p, j) * p.seq + t);
        s_cs[j] = rope_cs(ps, exp2((double)j * p.log2_step));
    }
    if (do_copy)
        store<NB>(dst, a);
    __syncthreads();
    if (live && pair)
        rotate_store<DT, VE>(a, b, s_cs + x * VE, dst, p.stride_b);
}

template <int DT, int VE>
cudaError_t launch(const RopeParams &p, const DecParams *dp, dim3 blocks, dim3 threads, cudaStream_t st)
{
    if (dp) {
        const size_t smem = (size_t)dp->half * sizeof(float2);
        if (threads.x > dp->npu)
            rope_decode_kernel<DT, VE, true><<<blocks, threads, smem, st>>>(*dp);
        else
            rope_decode_kernel<DT, VE, false><<<blocks, threads, smem, st>>>(*dp);
        return cudaGetLastError();
    }
    const size_t smem = (size_t)p.tile_tokens * p.chunk * sizeof(float2);
    if (p.nc)
        rope_multi_kernel<DT, VE, true><<<blocks, kThreads, smem, st>>>(p);
    else
        rope_multi_kernel<DT, VE, false><<<blocks, kThreads, smem, st>>>(p);
    return cudaGetLastError();
}

/* The kernel instantiation for a dtype and unit width: 16, 8, 4 (and 2 for 16-bit types) bytes. */
cudaError_t launch_dtype(lmk_dtype dt, uint32_t ve, const RopeParams &p, const DecParams *dp, dim3 blocks,
                         dim3 threads, cudaStream_t st)
{
    switch (dt) {
    case LMK_F32:
        return ve == 4 ? launch<LMK_F32, 4>(p, dp, blocks, threads, st)
             : ve == 2 ? launch<LMK_F32, 2>(p, dp, blocks, threads, st)
                       : launch<LMK_F32, 1>(p, dp, blocks, threads, st);
    case LMK_BF16:
        return ve == 8 ? launch<LMK_BF16, 8>(p, dp, blocks, threads, st)
             : ve == 4 ? launch<LMK_BF16, 4>(p, dp, blocks, threads, st)
             : ve == 2 ? launch<LMK_BF16, 2>(p, dp, blocks, threads, st)
                       : launch<LMK_BF16, 1>(p, dp, blocks, threads, st);
    default:
        return ve == 8 ? launch<LMK_F16, 8>(p, dp, blocks, threads, st)
             : ve == 4 ? launch<LMK_F16, 4>(p, dp, blocks, threads, st)
             : ve == 2 ? launch<LMK_F16, 2>(p, dp, blocks, threads, st)
                       : launch<LMK_F16, 1>(p, dp, blocks, threads, st);
    }
}

template <int DT, int VE> void preload_one(cudaError_t *first)
{
    cudaFuncAttributes attr;
    cudaError_t e = cudaFuncGetAttributes(&attr, rope_multi_kernel<DT, VE, true>);
    if (e == cudaSuccess)
        e = cudaFuncGetAttributes(&attr, rope_multi_kernel<DT, VE, false>);
    if (e == cudaSuccess)
        e = cudaFuncGetAttributes(&attr, rope_decode_kernel<DT, VE, true>);
    if (e == cudaSuccess)
        e = cudaFuncGetAttributes(&attr, rope_decode_kernel<DT, VE, false>);
    if (e != cudaSuccess && *first == cudaSuccess)
        *first = e;
}

uint64_t ceil_div(uint64_t a, uint64_t b)
{
    return (a + b - 1) / b;
}

} /* namespace */

lmk_status lmk_cuda_rope(lmk_stream *s, const void *args)
{
    const lmk_rope_args *a = (const lmk_rope_args *)args;
    {
        const lmk_rope_angle *g = &a->angle;
        bool ok = (g->mode == LMK_ROPE_MROPE || g->mode == LMK_ROPE_IMROPE) && !a->interleaved &&
                  g->freq_scale == 1.0 && g->ext_factor == 0.0 && g->mscale == 1.0 && !g->freq_factors &&
                  g->pos_dtype != LMK_I64;
        for (int i = 0; i < a->n_tensors; i++) {
            const lmk_rope_tensor *t = &a->t[i];
            ok = ok && t->in_head == a->head_dim && t->out_head == a->head_dim &&
                 t->in_tok == (size_t)t->n_heads * a->head_dim && t->out_tok == t->in_tok;
        }
        if (!ok)
            return lmk_fail(LMK_ERR_UNSUPPORTED, "rope: this mode, scaling or layout is not yet on CUDA");
    }
    const lmk_cuda_device *d = lmk_cuda_dev(s->dev);
    lmk_status st = lmk_cuda_use(d->ordinal, "rope_multi: cudaSetDevice");
    if (st != LMK_OK)
        return st;

    const uint32_t es = a->dtype == LMK_F32 ? 4 : 2;
    const uint32_t D = a->head_dim, half = a->rope_dim / 2;
    const uint32_t stride = a->pair_stride;
    const bool two = a->n_tensors == 2;

    /* Widest unit (16 bytes down to one element) that divides the rotated half, the pair stride
     * and the row, and to which every base address is aligned: then no unit straddles a rotated
     * and an untouched range and every access is aligned. */
    uintptr_t addr_bits = (uintptr_t)a->t[0].in | (uintptr_t)a->t[0].out;
    if (two)
        addr_bits |= (uintptr_t)a->t[1].in | (uintptr_t)a->t[1].out;
    uint32_t ve = 16 / es;
    while (ve > 1 && (half % ve || stride % ve || D % ve || (addr_bits & (ve * es - 1))))
        ve >>= 1;
    const uint64_t launch_rows = (uint64_t)a->seq_len * (a->t[0].n_heads + (two ? (uint64_t)a->t[1].n_heads : 0));
    if (es == 2 && ve == 8 && launch_rows <= kDecNarrowRows)
        ve = 4;

    RopeParams p;
    p.in0 = (const unsigned char *)a->t[0].in;
    p.out0 = (unsigned char *)a->t[0].out;
    p.in1 = two ? (const unsigned char *)a->t[1].in : p.in0;
    p.out1 = two ? (unsigned char *)a->t[1].out : p.out0;
    p.pos = (const int32_t *)a->angle.positions;
    p.seq = a->seq_len;
    p.nh0 = a->t[0].n_heads;
    p.nh1 = two ? a->t[1].n_heads : 0;
    p.head_dim = D;
    p.stride = stride;
    p.half = half;
    p.copy0 = a->t[0].in != a->t[0].out;
    p.copy1 = two && a->t[1].in != a->t[1].out;
    if (stride != half) { /* untouched: [R/2, D/2) and [D/2 + R/2, D) */
        p.c1 = half, p.nc1 = (D / 2 - half) / ve;
        p.c2 = D / 2 + half;
    } else { /* untouched: [R, D) */
        p.c1 = a->rope_dim, p.nc1 = (D - a->rope_dim) / ve;
        p.c2 = D;
    }
    p.nc = (p.copy0 || p.copy1) ? (D - a->rope_dim) / ve : 0;
    /* rope_axis's bounds (the sums of lmk_rope_axis, in 64 bits, capped at 2^32 - 1). */
    {
        const uint32_t *sec = a->angle.sections;
        const uint64_t s0 = sec[0], s1 = sec[1], s2 = sec[2], s3 = sec[3];
        const uint64_t sect = s0 + s1 + s2 + s3, cap = 0xffffffffu;
        const bool im = a->angle.mode == LMK_ROPE_IMROPE;
        const uint64_t lim[3] = {im ? 3 * s0 : s0, im ? 3 * s1 : s0 + s1, im ? 3 * s2 : s0 + s1 + s2};
        p.sect = sect == 0 ? 1 : (uint32_t)(sect < cap ? sect : cap);
        for (int i = 0; i < 3; i++)
            p.lim[i] = (uint32_t)(lim[i] < cap ? lim[i] : cap);
    }
    p.mode = (int)a->angle.mode;
    p.log2_step = -2.0 * log2(a->angle.freq_base) / (double)a->rope_dim;

    /* Rows of q and k. Validation bounds every tensor by memory, so heads fit comfortably in 32
     * bits; the sum is checked anyway because it indexes in 32 bits. */
    const uint64_t rows = (uint64_t)p.nh0 + p.nh1;
    if (rows > 0x7fffffffu)
        return lmk_fail(LMK_ERR_UNSUPPORTED, "rope_multi: %llu heads in one launch exceed the CUDA kernel's limit",
                        (unsigned long long)rows);
    p.rows = (uint32_t)rows;

    /* The small-T kernel when its grid is small: blockDim (items per row, rows per block), the rows
     * balanced over the groups. */
    const uint64_t ipr = (uint64_t)half / ve + p.nc; /* items per row */
    if (half <= kDecMaxPairs && ipr <= kDecMaxItems) {
        uint64_t rpb = kDecThreads / ipr;
        rpb = rpb < 1 ? 1 : rpb > rows ? rows : rpb;
        const uint64_t groups = ceil_div(rows, rpb);
        if (a->seq_len * groups <= 2 * (uint64_t)d->sm_count) {
            rpb = ceil_div(rows, groups);
            DecParams q;
            q.in0 = p.in0, q.in1 = p.in1, q.out0 = p.out0, q.out1 = p.out1;
            q.pos = p.pos;
            q.seq = (uint32_t)a->seq_len;
            q.nh0 = p.nh0, q.nh1 = p.nh1, q.rows = p.rows;
            q.row_bytes = D * es;
            q.stride_b = stride * es;
            q.npu = half / ve;
            q.nc1 = p.nc1;
            q.c1_b = p.c1 * es;
            q.c2_b = p.c2 * es - p.nc1 * ve * es; /* >= 0: range 2 starts nc1 units past c1 or later */
            q.half = half;
            q.n_threads = (uint32_t)(ipr * rpb);
            q.copy0 = p.copy0, q.copy1 = p.copy1;
            q.sect = p.sect;
            for (int i = 0; i < 3; i++)
                q.lim[i] = p.lim[i];
            q.mode = p.mode;
            q.log2_step = p.log2_step;
            const cudaError_t e = launch_dtype(a->dtype, ve, p, &q, dim3((unsigned)a->seq_len, (unsigned)groups, 1),
                                               dim3((unsigned)ipr, (unsigned)rpb, 1), lmk_cuda_stream_of(s));
            return e == cudaSuccess ? LMK_OK : lmk_cuda_fail(e, "rope_multi: kernel launch");
        }
    }

    /* Tiles and row groups. A block's items are tile_tokens * rows_per_group * units; a tile holds
     * ~kBlockItems of them (a few per thread, fine-grained enough to balance the SMs). Groups > 1
     * only when the tiles alone cannot occupy the GPU (decode): then ~one item per thread, so a
     * call's latency is one angle plus one memory round trip. Items per block stay under 2^30. */
    p.chunk = half < kSmemPairs ? half : kSmemPairs - kSmemPairs % ve;
    const uint64_t units = (uint64_t)half / ve + p.nc;       /* per row */
    const uint64_t per_token = rows * units;
    /* With copy items, ~kBlockItems per block (rounded up); without, at most what one batch of
     * every thread holds (rounded down), so each thread loads all its items before the barrier. */
    uint64_t tile = p.nc ? ceil_div(kBlockItems, per_token) : (uint64_t)kRotBatch<false> * kThreads / per_token;
    /* At most one angle per thread (the position loads of a second would wait behind the first),
     * which also keeps the tile within the shared table (kThreads <= kSmemPairs). */
    const uint64_t tile_max = kThreads >= p.chunk ? kThreads / p.chunk : 1;
    tile = tile < 1 ? 1 : tile > tile_max ? tile_max : tile;
    if (tile > p.seq)
        tile = p.seq;
    const uint64_t tiles = ceil_div(p.seq, tile);
    uint64_t groups = ceil_div(tile * per_token, (uint64_t)1 << 30);
    if (tiles < 2 * (uint64_t)d->sm_count) {
        const uint64_t g = ceil_div(tile * per_token, kThreads);
        groups = g > groups ? g : groups;
    }
    if (groups > rows)
        groups = rows;
    p.rows_per_group = (uint32_t)ceil_div(rows, groups);
    p.groups = (uint32_t)ceil_div(rows, p.rows_per_group); /* no empty group */
    p.tile_tokens = (uint32_t)tile;
    p.n_blocks = tiles * p.groups;
    dim3 blocks((unsigned)p.n_blocks, 1, 1);
    if (p.n_blocks > 0x7fffffffu) /* T near 2^32 with one token per tile */
        blocks = dim3(1u << 30, (unsigned)ceil_div(p.n_blocks, 1u << 30), 1);

    const cudaError_t e = launch_dtype(a->dtype, ve, p, nullptr, blocks, dim3(kThreads, 1, 1), lmk_cuda_stream_of(s));
    return e == cudaSuccess ? LMK_OK : lmk_cuda_fail(e, "rope_multi: kernel launch");
}

cudaError_t lmk_cuda_rope_preload(void)
{
    cudaError_t first = cudaSuccess;
    preload_one<LMK_F32, 4>(&first);
    preload_one<LMK_F32, 2>(&first);
    preload_one<LMK_F32, 1>(&first);
    preload_one<LMK_BF16, 8>(&first);
    preload_one<LMK_BF16, 4>(&first);
    preload_one<LMK_BF16, 2>(&first);
    preload_one<LMK_BF16, 1>(&first);
    preload_one<LMK_F16, 8>(&first);
    preload_one<LMK_F16, 4>(&first);
    preload_one<LMK_F16, 2>(&first);
    preload_one<LMK_F16, 1>(&first);
    return first;
}
