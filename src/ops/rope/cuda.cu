/*
 * cuda.cu - the CUDA kernels of rope (lmk.h's lmk_rope; lmk_rope_multi and lmk_rope_multi_qk reach
 * them through the same lmk_rope_args) and their launch planning. Every mode (NORMAL, NEOX, MROPE,
 * IMROPE, VISION) and pairing, every scaling (freq_scale, the YaRN ramp, freq_factors, attn_factor),
 * i32/u32/i64 positions, strided operands with their own token and head strides per tensor, one
 * tensor or q and k in one launch, each out of place or in place. docs/cuda_notes.md has the
 * measured history; this comment is the current design.
 *
 * Work. A row is one (token, head) vector of head_dim elements. It is cut into units of VE elements
 * (NB = VE * element size bytes; 16 when every address, stride and range boundary allows, else 8, 4
 * or 2 bytes, down to one element; plan_units):
 *   - pair units rotate whole pairs. Half-split layouts (NEOX, MROPE, IMROPE, VISION: pair p is
 *     (x[p], x[p + pair_stride])): unit u holds pairs [u*VE, u*VE + VE), its a halves in the vector
 *     at element u*VE and its b halves in the vector at u*VE + pair_stride. Interleaved (NORMAL:
 *     pair p is (x[2p], x[2p+1])): unit u is the one vector at u*VE holding VE/2 whole pairs (IL);
 *     when only one-element units fit, NORMAL runs as a half-split layout whose a vectors are two
 *     elements apart and whose b vector is the next element.
 *   - copy units (only for a tensor that is out of place) move the untouched elements as raw
 *     words, bit-exact, NaN payloads included, never scaled (the ranges: plan_geometry). In place
 *     there is nothing to copy: only rotated elements are read and written.
 * Rows of q come first, then rows of k; each tensor has its own base, token stride and head stride
 * (q inside a [q | gate] projection, q and k inside a packed QKV buffer), all byte offsets across
 * rows are 64-bit. Offsets within a row are 32-bit: rows over 4 GiB are rejected (UNSUPPORTED).
 *
 * Angles. theta(token, pair) = position * freq(pair); m (attn_factor, or YaRN's m) is folded into
 * the shared table's cos and sin, so copies never see it, and m = 1 multiplies by 1.0f, which
 * changes no bit. Each angle is formed on the device from a few uniform kernel parameters
 * (plan_angles): the pair's position axis and exponent index by rope_common.h's rule itself
 * (lmk_rope_axis_at, its sums taken once on the host by lmk_rope_axes_of: no copy of the rule
 * here), and its factor by lmk_rope_freq's formula with theta_e = exp2(j * log2_step) in float64
 * (pair_freq; pow() is an out-of-line call on the device), checked against lmk_rope_freq on the
 * host (docs/cuda_notes.md, version 9). v8 tabulated both per pair on the host and passed the table
 * in the parameters (1.4 KB); run 10 measured it against this form and found no gain that the
 * table itself explains (docs/cuda_notes.md). A launch rotates at most kSlicePairs
 * = 128 pairs: rope_dim <= 256 (every model we know) is one launch, a larger one takes a launch per
 * slice of 128 pairs, each rotating its own pairs (the first also copies the untouched elements).
 * freq_factors live in device memory, which the host cannot read without a sync: the device
 * divides the factor by ff[p] (lmk.h's theta is linear in theta_e and ff only divides theta_e, so
 * lmk_rope_freq(ff) = lmk_rope_freq(1) / ff up to two float64 roundings). Positions are read by
 * lmk_rope_pos's rule. The angle is reduced in float64 and its sin/cos evaluated in f32 (rope_cs).
 * An angle's loads (position, freq_factor) are issued before the data's and its arithmetic runs
 * while they are in flight (angle_begin, angle_end).
 *
 * Two kernels, both reading the (cos, sin) of a block's (token, pair) angles from a shared-memory
 * table that the block computes once (one angle per thread) for all its rows of q and k:
 *   rope_multi_kernel (prefill): a block takes a tile of `tile_tokens` tokens and a group of rows.
 *     A thread issues its angle's loads, loads its first batch of pair units and of copy units,
 *     finishes its angle, stores the copies and streams the rest, then waits at the barrier and
 *     rotates its pair units, so the angle overlaps a memory round trip. Pair and copy items are
 *     enumerated separately (a warp runs one kind). plan_tiles.
 *   rope_decode_kernel (small T): one token per block, whole rows per block, one item per thread
 *     (threadIdx.x is the item of the row, threadIdx.y the row) and at most one angle per thread,
 *     no loop, no run-time division. Chosen when its grid is at most 2 blocks per SM, where the
 *     prefill kernel cannot fill the GPU either. plan_decode.
 * On sm_90 and later both launch with programmatic dependent launch (pdl_enter, pdl_on): a launch
 * may start while the previous kernel of the stream finishes and waits for it before its first
 * memory access (run 10: decode 2.1 -> 1.4 us per call in a graph; prefill equal or better).
 * Everything a launch needs travels by value in RopeParams (no allocation, no copy, no sync): a
 * call can be captured into a CUDA graph. lmk_cuda_rope plans in named steps: plan_units (VE and
 * layout), plan_geometry (rows, strides, untouched ranges), then per slice of pairs plan_slice,
 * plan_angles (the angle constants), and plan_decode or else plan_tiles (the launch shape).
 *
 * Precision (lmk.h: f32 within 1e-5 * max(1, m) of float64 for |x| <= 2 and |angle| <= 2^20): the
 * angle is pos * freq in float64 and reduced by k*pi/2 in float64 (exact to ~1e-16 for |theta| <=
 * 2^20); sin and cos of the reduced f32 angle (|r| <= pi/4) come from minimax polynomials (rope_cs,
 * 1.5 ulp). The angle error is ~1e-7 rad, so f32 results sit within ~1e-6 of float64 and bf16/f16
 * results within one ulp. A non-finite angle (a freq_factor of 0 or inf) gives NaN, as cos(inf).
 */
#include "cuda/cuda_internal.h"
#include "ops/rope/rope.h"
#include "ops/rope/rope_common.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <atomic>
#include <math.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 256;
/* Items a thread loads before it stores them, the most that fit 80 registers without spills. Pair
 * items (two units each): 1 in the kernel with copy items (there a block of the model shapes has
 * fewer pair items than threads: Qwen3.5, 224), 4 in the one without (in place, or rope_dim ==
 * head_dim). Copy items: 5, so a Qwen3.5 block's 1344 copy items are one batch of every thread and
 * a sixth item for 64 threads (v8's 4 left 320 items to a second round). */
template <bool COPY> constexpr int kRotBatch = COPY ? 1 : 4;
constexpr int kCopyBatch = 5;
constexpr uint32_t kBlockItems = 1024; /* work items a prefill block aims for */
/* The small-T kernel: threads a block aims for (whole rows of one token, one item per thread) and
 * the most items per row it takes (one row per block at most); wider rows (head_dim >= 512 with
 * narrow units) go to the prefill kernel. */
constexpr uint32_t kDecThreads = 256;
constexpr uint32_t kDecMaxItems = 512;
/* Up to this many rows in a launch (T x heads), 2-byte types take 8-byte units instead of 16: then
 * bf16 gets f32's items, threads and blocks at decode (docs/cuda_notes.md, v7). */
constexpr uint64_t kDecNarrowRows = 64;
/* The most pairs one launch rotates (a block computes at most kThreads angles, one per thread, and
 * a tile of one token holds every pair of its slice): rope_dim <= 256, every model we know, is one
 * launch; beyond, one launch per slice of kSlicePairs pairs. A multiple of 8: a slice holds whole
 * units of up to 8 pairs. */
constexpr uint32_t kSlicePairs = 128;
static_assert(kSlicePairs % 8 == 0 && kSlicePairs <= kThreads, "a slice holds whole units; one angle per thread");
/* Blocks of the prefill kernel resident per SM (its launch bounds): 80 registers a thread. */
constexpr uint32_t kPrefillBlocksPerSM = 3;

/* The rows and units of a launch (plan_geometry). Byte strides are 64-bit; offsets within a row
 * (ustep_b, stride_b, c1_b, c2_b and everything built from them) fit 32 bits. */
struct Geom {
    const unsigned char *in0, *in1;  /* q (or the only tensor) and k; in1 = in0 with one tensor */
    unsigned char *out0, *out1;
    uint64_t in_tok0, in_head0, out_tok0, out_head0; /* bytes */
    uint64_t in_tok1, in_head1, out_tok1, out_head1;
    uint32_t nh0, rows;              /* heads of q; rows of a token: heads of q + heads of k */
    uint32_t copy0, copy1;           /* tensor j is out of place: copy its untouched elements */
    uint32_t half;                   /* pairs of this launch's slice (at most kSlicePairs) */
    uint32_t npu;                    /* pair units per row in the slice */
    uint32_t pair_b;                 /* byte offset of the slice's first pair unit in a row */
    uint32_t ustep_b;                /* bytes from one pair unit's a vector to the next one's */
    uint32_t stride_b;               /* bytes from a pair unit's a vector to its b vector (half-split) */
    uint32_t nc, nc1;                /* copy units per row (0 when no tensor is copied), nc1 in range 1 */
    uint32_t c1_b, c2_b;             /* copy unit c starts at (c < nc1 ? c1_b : c2_b) + c * NB */
};

/* What the device needs to form the angles of the slice's pairs p0 + i, i < Geom.half (plan_angles):
 * rope_common.h's axis rule with its sums taken on the host (lmk_rope_axes), and lmk_rope_freq's
 * factor with theta_e = exp2(j * log2_step) in float64. All uniform across a warp: every thread
 * reads the same parameter words, so no read is serialized (a per-pair table in the parameters,
 * v8, is read with a different address by every thread of a warp). */
struct AnglePlan {
    const float *ff;                 /* freq_factors + p0 (device memory), or NULL */
    const void *pos;
    uint64_t pos_axis_stride;
    double log2_step;                /* -2 log2(freq_base) / exp_n */
    double freq_scale, ext_factor;   /* ext_factor 0: no ramp */
    double ramp_low, ramp_span;      /* span: max(ramp_high - ramp_low, 0.001), as lmk_rope_freq */
    lmk_rope_axes axes;              /* lmk_rope_axes_of(mode, sections) */
    uint32_t p0;                     /* the slice's first pair */
    int pos_dtype;
    float mscale;
};

/* The prefill kernel's blocks (plan_tiles). */
struct TilePlan {
    uint64_t seq, n_blocks;          /* tokens; tiles * groups */
    uint32_t tile_tokens;
    uint32_t groups, rows_per_group;
};

/* Everything a launch needs, passed by value (kernel parameter space: no allocation, no copy). */
struct RopeParams {
    Geom g;
    AnglePlan a;
    TilePlan tp;
};
static_assert(sizeof(RopeParams) <= 4000, "kernel parameters must stay under the 4 KB limit");

/* How a launch is shaped. */
struct LaunchPlan {
    bool decode;
    bool pdl;                        /* programmatic stream serialization (pdl_on) */
    dim3 blocks, threads;
    size_t smem;
};

/* ---------------------------------------------------------------------------------------------
 * Device helpers: raw units, dtypes, the angle.
 * ------------------------------------------------------------------------------------------- */

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

/* pi/2 split in two doubles for the Cody-Waite reduction: hi is the double nearest pi/2 and lo the
 * double nearest pi/2 - hi, so k*(hi + lo) is k*pi/2 to ~1e-33 relative for |k| < 2^51. */
constexpr double kPiHalfHi = 1.57079632679489655800e+00;
constexpr double kPiHalfLo = 6.12323399573676603587e-17;
constexpr double kTwoOverPi = 6.36619772367581382433e-01;
constexpr double kRound = 6755399441055744.0; /* 1.5 * 2^52: x + kRound rounds x to an integer */

/* (cos, sin) of theta. The quadrant reduction is in double: t = kRound + rint(theta*2/pi) in one
 * FMA (its low word holds the quadrant k mod 4), r = theta - k*pi/2 in two FMAs, exact to ~1e-16
 * for |theta| < 2^51. Then sin and cos of the f32 r (|r| <= pi/4) by two short polynomials (the
 * minimax ones of CUDA's own sincosf kernel; max error 7e-8 absolute, 1.5 ulp, measured against
 * libm over 4e7 angles with |theta| <= 2^20) and a quadrant swap: branch-free, no stack frame. The
 * clamp only matters for |theta| >= 2^51 (absurd bases), where it keeps the result finite and
 * bounded; r is NaN exactly when theta is not finite, and then both results are NaN. */
__device__ __forceinline__ float2 rope_cs(double theta)
{
    const double t = fma(theta, kTwoOverPi, kRound);
    const double k = t - kRound;
    const float r = (float)fma(-k, kPiHalfLo, fma(-k, kPiHalfHi, theta));
    const float x = fminf(fmaxf(r, -1.0f), 1.0f);
    const uint32_t q = (uint32_t)__double2loint(t);
    const float x2 = x * x;
    const float ps = fmaf(fmaf(fmaf(-1.95152959e-4f, x2, 8.33216087e-3f), x2, -1.66666546e-1f), x2 * x, x);
    const float pc =
        fmaf(fmaf(fmaf(fmaf(2.44331571e-5f, x2, -1.38873163e-3f), x2, 4.16666457e-2f), x2, -0.5f), x2, 1.0f);
    float sn = (q & 1) ? pc : ps, cs = (q & 1) ? -ps : pc;
    if (q & 2)
        sn = -sn, cs = -cs;
    if (r != r)
        sn = cs = __int_as_float(0x7fc00000);
    return make_float2(cs, sn);
}

/* lmk_rope_freq(..., p, j, ff = 1) with theta_e = exp2(j * log2_step) instead of pow(freq_base,
 * -2j / exp_n) (pow is an out-of-line call on the device; the two differ by an ulp or so, ~2e-15
 * relative: an angle error under 2e-9 rad at |pos| = 2^20). The ramp is lmk_rope_freq's, operation
 * for operation. */
__host__ __device__ __forceinline__ double pair_freq(const AnglePlan &a, uint32_t p, uint32_t j)
{
    const double e = exp2((double)j * a.log2_step);
    if (a.ext_factor == 0.0)
        return e * a.freq_scale;
    double y = ((double)p - a.ramp_low) / a.ramp_span;
    y = y < 0.0 ? 0.0 : y > 1.0 ? 1.0 : y;
    const double ramp = (1.0 - y) * a.ext_factor;
    return e * a.freq_scale * (1.0 - ramp) + e * ramp;
}

/* An angle in two halves, so that its loads are issued before the data's and its arithmetic runs
 * while they are in flight: angle_begin loads the position of the slice's pair i at token t
 * (lmk_rope_pos's rule: LMK_I64 reads 64 bits, i32 and u32 read 32 bits as i32) and its
 * freq_factor; angle_end forms the factor (freq_factors divide theta_e, and theta is linear in
 * theta_e, so dividing the factor equals lmk_rope_freq(ff) up to two float64 roundings) and
 * returns (cos, sin) times m. Only the loaded values are kept in between (3 registers: the batches
 * of the prefill kernel are live across them). */
struct AngleIn {
    int64_t pos;
    float ff;
};

__device__ __forceinline__ AngleIn angle_begin(const AnglePlan &a, uint64_t t, uint32_t i)
{
    uint32_t j;
    const uint64_t at = (uint64_t)lmk_rope_axis_at(&a.axes, a.p0 + i, &j) * a.pos_axis_stride + t;
    AngleIn in;
    in.pos = a.pos_dtype == LMK_I64 ? (int64_t)__ldg((const long long *)a.pos + at)
                                    : (int64_t)__ldg((const int *)a.pos + at);
    in.ff = a.ff ? __ldg(a.ff + i) : 1.0f;
    return in;
}

__device__ __forceinline__ float2 angle_end(const AnglePlan &a, uint32_t i, const AngleIn &in)
{
    uint32_t j;
    (void)lmk_rope_axis_at(&a.axes, a.p0 + i, &j);
    double freq = pair_freq(a, a.p0 + i, j);
    if (a.ff)
        freq = freq / (double)in.ff;
    const float2 cs = rope_cs((double)in.pos * freq);
    return make_float2(cs.x * a.mscale, cs.y * a.mscale);
}

/* Where row r (q for r < nh0, else k) of token t starts, in and out, and whether its tensor is
 * copied (out of place). 64-bit offsets. */
struct RowRef {
    const unsigned char *in;
    unsigned char *out;
    bool copy;
};
__device__ __forceinline__ RowRef row_ref(const Geom &g, uint64_t t, uint32_t r)
{
    const bool k = r >= g.nh0;
    const uint64_t h = k ? r - g.nh0 : r;
    const unsigned char *in = k ? g.in1 : g.in0;
    unsigned char *out = k ? g.out1 : g.out0;
    const uint64_t it = k ? g.in_tok1 : g.in_tok0, ih = k ? g.in_head1 : g.in_head0;
    const uint64_t ot = k ? g.out_tok1 : g.out_tok0, oh = k ? g.out_head1 : g.out_head0;
    return RowRef{in + t * it + h * ih, out + t * ot + h * oh, (k ? g.copy1 : g.copy0) != 0};
}

/* The (cos, sin) of NP consecutive pairs from the table; two pairs per 16-byte shared load when NP
 * is even (cs_at is then 16-byte aligned: every table index of such a unit is even). */
template <int NP> __device__ __forceinline__ void load_cs(const float2 *cs_at, float (&c)[NP], float (&s)[NP])
{
    if constexpr (NP % 2 != 0) {
#pragma unroll
        for (int e = 0; e < NP; e++) {
            const float2 q = cs_at[e];
            c[e] = q.x, s[e] = q.y;
        }
    } else {
#pragma unroll
        for (int e = 0; e < NP; e += 2) {
            const float4 q = *reinterpret_cast<const float4 *>(cs_at + e);
            c[e] = q.x, s[e] = q.y, c[e + 1] = q.z, s[e + 1] = q.w;
        }
    }
}

/* Rotates one pair unit and stores it. Half-split: ra holds the a halves and rb the b halves of VE
 * pairs, stored at out and out + stride_b. IL: ra holds VE/2 whole pairs (a, b adjacent), rb is
 * unused, stored at out. Both kernels use this, so their results are bit-identical, and every
 * element's result depends only on its inputs and its (cos, sin): not on VE or the launch. */
template <int DT, int VE, bool IL>
__device__ __forceinline__ void rotate_store(const Raw<VE * Elem<DT>::size> &ra, const Raw<VE * Elem<DT>::size> &rb,
                                             const float2 *cs_at, unsigned char *out, uint32_t stride_b)
{
    constexpr int ES = Elem<DT>::size, NP = IL ? VE / 2 : VE;
    float c[NP], sn[NP];
    load_cs<NP>(cs_at, c, sn);
    if constexpr (IL) {
        float o[VE];
#pragma unroll
        for (int k = 0; k < NP; k++) {
            const float a = Elem<DT>::widen(get_bits<DT, VE>(ra, 2 * k));
            const float b = Elem<DT>::widen(get_bits<DT, VE>(ra, 2 * k + 1));
            o[2 * k] = fmaf(a, c[k], -b * sn[k]);
            o[2 * k + 1] = fmaf(a, sn[k], b * c[k]);
        }
        store<VE * ES>(out, pack<DT, VE>(o));
    } else {
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
}

/* ---------------------------------------------------------------------------------------------
 * The prefill kernel.
 * ------------------------------------------------------------------------------------------- */

/* One batch of pair items of a thread: the loaded a and b units, and the item's row and (token of
 * the tile, unit) from which rot_store recomputes the output address and the table index. Keeping
 * two 32-bit words instead of an output pointer and a table index is what keeps the 16-byte
 * kernels within 80 registers now that in and out rows have their own strides (ptxas spilled
 * 24-48 bytes otherwise). tl < 256 and u < 128 (a tile holds at most kThreads angles, a slice at
 * most kSlicePairs pairs), so both fit 16 bits. */
template <int NB, int RB> struct RotBatch {
    Raw<NB> a[RB], b[RB];
    uint32_t r[RB];         /* row; ~0u: no item */
    uint32_t key[RB];       /* tl << 16 | u */
};

/* Loads the pair items i, i + kThreads, ... of this block. An item is (token tl of the tile, row
 * r_lo + rr, unit u of the slice), u fastest so a warp reads contiguous units; a unit holds PPU
 * pairs, and the table holds g.half pairs per token. */
template <int ES, int VE, bool IL, int RB>
__device__ __forceinline__ void rot_load(const Geom &g, RotBatch<VE * ES, RB> &bt, uint32_t i, uint32_t n_items,
                                         uint32_t nr, uint64_t t0, uint32_t r_lo)
{
#pragma unroll
    for (int k = 0; k < RB; k++) {
        const uint32_t item = i + k * kThreads;
        bt.r[k] = ~0u;
        if (item < n_items) {
            const uint32_t u = item % g.npu, rr = item / g.npu;
            const uint32_t tl = rr / nr, r = r_lo + (rr - tl * nr);
            const RowRef ref = row_ref(g, t0 + tl, r);
            const uint32_t off = g.pair_b + u * g.ustep_b;
            bt.a[k] = load<VE * ES>(ref.in + off);
            if constexpr (!IL)
                bt.b[k] = load<VE * ES>(ref.in + off + g.stride_b);
            bt.r[k] = r;
            bt.key[k] = tl << 16 | u;
        }
    }
}

template <int DT, int VE, bool IL, int RB>
__device__ __forceinline__ void rot_store(const Geom &g, const RotBatch<VE * Elem<DT>::size, RB> &bt,
                                          const float2 *s_cs, uint64_t t0)
{
    constexpr uint32_t PPU = IL ? VE / 2 : VE;
#pragma unroll
    for (int k = 0; k < RB; k++)
        if (bt.r[k] != ~0u) {
            const uint32_t tl = bt.key[k] >> 16, u = bt.key[k] & 0xffffu;
            const RowRef ref = row_ref(g, t0 + tl, bt.r[k]);
            rotate_store<DT, VE, IL>(bt.a[k], bt.b[k], s_cs + tl * g.half + u * PPU,
                                     ref.out + g.pair_b + u * g.ustep_b, g.stride_b);
        }
}

/* One batch of copy items of a thread (out of place): the loaded units. Item k of the batch at ci is
 * ci + k * kThreads, an item is (token tl, row r_lo + rr, copy unit c), c fastest; copy_store finds
 * each item's address again from its index instead of keeping it (a pointer per item, 10 registers
 * for the batch of 5, made the 16-byte kernels spill). */
template <int NB> struct CopyBatch {
    Raw<NB> v[kCopyBatch];
};

/* Where copy item `item` of the block is read and written (its row's start and the offset in the
 * row), and whether its tensor is copied. */
template <int NB>
__device__ __forceinline__ RowRef copy_at(const Geom &g, uint32_t item, uint32_t nr, uint64_t t0, uint32_t r_lo,
                                          uint32_t &off)
{
    const uint32_t c = item % g.nc, rr = item / g.nc;
    const uint32_t tl = rr / nr, r = r_lo + (rr - tl * nr);
    off = (c < g.nc1 ? g.c1_b : g.c2_b) + c * NB;
    return row_ref(g, t0 + tl, r);
}

template <int NB>
__device__ __forceinline__ void copy_load(const Geom &g, CopyBatch<NB> &cb, uint32_t ci, uint32_t n_copy, uint32_t nr,
                                          uint64_t t0, uint32_t r_lo)
{
#pragma unroll
    for (int k = 0; k < kCopyBatch; k++) {
        const uint32_t item = ci + k * kThreads;
        if (item < n_copy) {
            uint32_t off;
            const RowRef ref = copy_at<NB>(g, item, nr, t0, r_lo, off);
            if (ref.copy)
                cb.v[k] = load<NB>(ref.in + off);
        }
    }
}

template <int NB>
__device__ __forceinline__ void copy_store(const Geom &g, const CopyBatch<NB> &cb, uint32_t ci, uint32_t n_copy,
                                           uint32_t nr, uint64_t t0, uint32_t r_lo)
{
#pragma unroll
    for (int k = 0; k < kCopyBatch; k++) {
        const uint32_t item = ci + k * kThreads;
        if (item < n_copy) {
            uint32_t off;
            const RowRef ref = copy_at<NB>(g, item, nr, t0, r_lo, off);
            if (ref.copy)
                store<NB>(ref.out + off, cb.v[k]);
        }
    }
}

/* Programmatic dependent launch (sm_90 and later): where the host launches with programmatic
 * stream serialization (pdl_on), a launch may start while the previous kernel of the stream is
 * still finishing. Both kernels call this before their first global memory access, read or write
 * (a write must not land under a previous kernel still reading that buffer): wait blocks until
 * every prerequisite grid has completed and its writes are visible, so the early start moves only
 * the launch and the index arithmetic that precede it. Without a programmatic prerequisite (a
 * plain launch, the first in a stream, a launch after a copy or an event) it returns at once.
 * launch_dependents lets the next kernel of the stream start early if it opted in likewise, which
 * obliges it to wait the same way before reading our output; placed first, as measured (run 10).
 * Code for sm_80 has no such instruction, and the host then never sets the attribute (pdl_on). */
__device__ __forceinline__ void pdl_enter()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n\tgriddepcontrol.wait;" ::: "memory");
#endif
}

/* At most 80 registers, so 3 blocks of 256 threads fit an SM (ptxas -v, sm_90: see
 * docs/cuda_notes.md). A block is one (tile, row group); the grid is 2-D only when there are more
 * than 2^31 - 1 of them. There is no grid-stride loop: one cost ptxas -v showed is ~30 registers of
 * loop-carried state. COPY: the launch has copy items (g.nc > 0); without them the copy code is
 * left out and a thread keeps four times as many pair items in flight. The (cos, sin) table is
 * dynamic shared memory of tile_tokens * half entries (at most kThreads: 2 KB).
 * Order within a block: the angles' loads are issued (one angle per thread at most: the host sizes
 * the tile so), then the first batch of pair items and the first batch of copy items are loaded,
 * the angles are finished into shared memory, the copy items are stored and the rest of them
 * streamed, then the block syncs and rotates. So the angle chain overlaps a memory round trip
 * instead of delaying one. Copy items are dealt from the last thread down, so the first warps,
 * which compute the angles, get the fewest. */
template <int DT, int VE, bool IL, bool COPY>
__global__ void __launch_bounds__(kThreads, kPrefillBlocksPerSM) rope_multi_kernel(const __grid_constant__ RopeParams p)
{
    constexpr int ES = Elem<DT>::size, NB = VE * ES, RB = kRotBatch<COPY>;
    extern __shared__ __align__(16) float2 s_cs[];
    const Geom &g = p.g;
    const TilePlan &tp = p.tp;
    const uint64_t blk = (uint64_t)blockIdx.y * gridDim.x + blockIdx.x;
    if (blk >= tp.n_blocks)
        return;
    const uint64_t tile = blk >> 32 ? blk / tp.groups : (uint32_t)blk / tp.groups; /* 32-bit divide if it fits */
    const uint32_t group = (uint32_t)(blk - tile * tp.groups);
    const uint64_t t0 = tile * tp.tile_tokens;
    const uint32_t tt = (uint32_t)min((uint64_t)tp.tile_tokens, tp.seq - t0);
    const uint32_t r_lo = group * tp.rows_per_group;
    const uint32_t nr = min(tp.rows_per_group, g.rows - r_lo);
    const uint32_t n_items = tt * nr * g.npu;
    pdl_enter();

    const bool angle = threadIdx.x < tt * g.half;
    const uint32_t a_tl = threadIdx.x / g.half, a_i = threadIdx.x - a_tl * g.half;
    AngleIn ain{};
    if (angle)
        ain = angle_begin(p.a, t0 + a_tl, a_i);
    RotBatch<NB, RB> bt;
    uint32_t i = threadIdx.x;
    rot_load<ES, VE, IL, RB>(g, bt, i, n_items, nr, t0, r_lo);
    [[maybe_unused]] CopyBatch<NB> cb;
    [[maybe_unused]] uint32_t ci = kThreads - 1 - threadIdx.x;
    [[maybe_unused]] const uint32_t n_copy = tt * nr * g.nc;
    if constexpr (COPY)
        copy_load<NB>(g, cb, ci, n_copy, nr, t0, r_lo);
    if (angle)
        s_cs[threadIdx.x] = angle_end(p.a, a_i, ain);
    if constexpr (COPY) {
        for (;;) {
            copy_store<NB>(g, cb, ci, n_copy, nr, t0, r_lo);
            ci += kCopyBatch * kThreads;
            if (ci >= n_copy)
                break;
            copy_load<NB>(g, cb, ci, n_copy, nr, t0, r_lo);
        }
    }
    __syncthreads();
    for (;;) {
        rot_store<DT, VE, IL, RB>(g, bt, s_cs, t0);
        i += RB * kThreads;
        if (i >= n_items)
            break;
        rot_load<ES, VE, IL, RB>(g, bt, i, n_items, nr, t0, r_lo);
    }
}

/* ---------------------------------------------------------------------------------------------
 * The small-T (decode) kernel.
 * ------------------------------------------------------------------------------------------- */

/* One token per block (blockIdx.x) and a few rows (blockIdx.y * blockDim.y + threadIdx.y), one
 * item per thread (threadIdx.x: [0, npu) pair units, then copy units), no loop over tiles and no
 * run-time division. The first `half` threads issue their angle's loads, every thread its data
 * loads (a pair item: its a and b units; a copy item: its unit), then the first `half` threads
 * finish the (cos, sin) of the token's pairs into shared memory (once per block, shared by all its
 * rows of q and k), copy items store, the block syncs, pair items rotate and store. Threads of rows
 * past the last (the last row group, or rows added so that every pair has a thread: plan_decode)
 * load and store nothing but still reach the barrier. COPY: the launch has copy items (g.nc > 0). */
template <int DT, int VE, bool IL, bool COPY>
__global__ void __launch_bounds__(kDecMaxItems) rope_decode_kernel(const __grid_constant__ RopeParams p)
{
    constexpr int ES = Elem<DT>::size, NB = VE * ES;
    constexpr uint32_t PPU = IL ? VE / 2 : VE;
    extern __shared__ __align__(16) float2 s_cs[];
    const Geom &g = p.g;
    const uint32_t x = threadIdx.x, t = blockIdx.x;
    const uint32_t r = blockIdx.y * blockDim.y + threadIdx.y;
    const bool live = r < g.rows;
    const bool pair = !COPY || x < g.npu;
    uint32_t off = g.pair_b + x * g.ustep_b;
    if (COPY && !pair) {
        const uint32_t c = x - g.npu;
        off = (c < g.nc1 ? g.c1_b : g.c2_b) + c * NB;
    }
    const RowRef ref = row_ref(g, t, live ? r : 0);
    const bool do_copy = COPY && !pair && live && ref.copy;
    const uint32_t j = threadIdx.y * blockDim.x + x; /* this thread's angle, if j < half */
    pdl_enter();
    AngleIn ain{};
    if (j < g.half)
        ain = angle_begin(p.a, t, j);
    Raw<NB> a{}, b{};
    if (live && pair) {
        a = load<NB>(ref.in + off);
        if constexpr (!IL)
            b = load<NB>(ref.in + off + g.stride_b);
    } else if (do_copy) {
        a = load<NB>(ref.in + off);
    }
    if (j < g.half)
        s_cs[j] = angle_end(p.a, j, ain);
    if (do_copy)
        store<NB>(ref.out + off, a);
    __syncthreads();
    if (live && pair)
        rotate_store<DT, VE, IL>(a, b, s_cs + x * PPU, ref.out + off, g.stride_b);
}

/* ---------------------------------------------------------------------------------------------
 * Launch: the instantiation for a dtype, unit width and layout.
 * ------------------------------------------------------------------------------------------- */

/* Whether launches on device `ordinal` use programmatic stream serialization: the device is sm_90
 * or later, and the code it runs of these kernels comes from compute_90 or later PTX, so it holds
 * pdl_enter's wait (a build for sm_80 alone, JIT-compiled on an H100, has none and must not start
 * early). Asked once per ordinal and cached: the preload asks at device open, outside any capture;
 * an ordinal past kPdlOrdinals, or a failed query, gets plain launches, which are always correct. */
constexpr int kPdlOrdinals = 64;
std::atomic<int> g_pdl[kPdlOrdinals]; /* 0 not asked yet, 1 plain, 2 programmatic */

bool pdl_on(int ordinal)
{
    if (ordinal < 0 || ordinal >= kPdlOrdinals)
        return false;
    int v = g_pdl[ordinal].load(std::memory_order_relaxed);
    if (v == 0) {
        int major = 0;
        cudaFuncAttributes fa;
        const bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ordinal) == cudaSuccess &&
                        cudaFuncGetAttributes(&fa, rope_decode_kernel<LMK_F32, 4, false, true>) == cudaSuccess;
        if (!ok)
            (void)cudaGetLastError(); /* the failed query is no launch error: the launch check must not see it */
        v = ok && major >= 9 && fa.ptxVersion >= 90 ? 2 : 1;
        g_pdl[ordinal].store(v, std::memory_order_relaxed);
    }
    return v == 2;
}

/* One launch, with the programmatic serialization attribute when L.pdl (then it may overlap the
 * previous kernel's end, and pdl_enter orders it). Inside a stream capture the attribute becomes a
 * programmatic edge of the graph between kernel nodes: the graph keeps one node per launch and the
 * same ordering at replay. */
cudaError_t start(void (*kernel)(RopeParams), const RopeParams &p, const LaunchPlan &L, cudaStream_t st)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = L.blocks;
    cfg.blockDim = L.threads;
    cfg.dynamicSmemBytes = L.smem;
    cfg.stream = st;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = L.pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, p);
}

template <int DT, int VE, bool IL>
cudaError_t launch(const RopeParams &p, const LaunchPlan &L, cudaStream_t st)
{
    const bool copy = p.g.nc > 0;
    if (L.decode)
        return start(copy ? rope_decode_kernel<DT, VE, IL, true> : rope_decode_kernel<DT, VE, IL, false>, p, L, st);
    return start(copy ? rope_multi_kernel<DT, VE, IL, true> : rope_multi_kernel<DT, VE, IL, false>, p, L, st);
}

/* IL exists only for units of two or more elements (plan_units never asks for it otherwise). */
template <int DT, int VE> cudaError_t launch_layout(bool il, const RopeParams &p, const LaunchPlan &L, cudaStream_t st)
{
    if constexpr (VE >= 2) {
        if (il)
            return launch<DT, VE, true>(p, L, st);
    }
    return launch<DT, VE, false>(p, L, st);
}

template <int DT> cudaError_t launch_ve(uint32_t ve, bool il, const RopeParams &p, const LaunchPlan &L, cudaStream_t st)
{
    if constexpr (Elem<DT>::size == 2) {
        if (ve == 8)
            return launch_layout<DT, 8>(il, p, L, st);
    }
    return ve == 4 ? launch_layout<DT, 4>(il, p, L, st)
         : ve == 2 ? launch_layout<DT, 2>(il, p, L, st)
                   : launch_layout<DT, 1>(il, p, L, st);
}

cudaError_t launch_dtype(lmk_dtype dt, uint32_t ve, bool il, const RopeParams &p, const LaunchPlan &L, cudaStream_t st)
{
    switch (dt) {
    case LMK_F32:
        return launch_ve<LMK_F32>(ve, il, p, L, st);
    case LMK_BF16:
        return launch_ve<LMK_BF16>(ve, il, p, L, st);
    default:
        return launch_ve<LMK_F16>(ve, il, p, L, st);
    }
}

template <int DT, int VE, bool IL> void preload_layout(cudaError_t *first)
{
    cudaFuncAttributes attr;
    cudaError_t e = cudaFuncGetAttributes(&attr, rope_multi_kernel<DT, VE, IL, true>);
    if (e == cudaSuccess)
        e = cudaFuncGetAttributes(&attr, rope_multi_kernel<DT, VE, IL, false>);
    if (e == cudaSuccess)
        e = cudaFuncGetAttributes(&attr, rope_decode_kernel<DT, VE, IL, true>);
    if (e == cudaSuccess)
        e = cudaFuncGetAttributes(&attr, rope_decode_kernel<DT, VE, IL, false>);
    if (e != cudaSuccess && *first == cudaSuccess)
        *first = e;
}

template <int DT, int VE> void preload_ve(cudaError_t *first)
{
    preload_layout<DT, VE, false>(first);
    if constexpr (VE >= 2)
        preload_layout<DT, VE, true>(first);
}

template <int DT> void preload_dtype(cudaError_t *first)
{
    if constexpr (Elem<DT>::size == 2)
        preload_ve<DT, 8>(first);
    preload_ve<DT, 4>(first);
    preload_ve<DT, 2>(first);
    preload_ve<DT, 1>(first);
}

/* ---------------------------------------------------------------------------------------------
 * Planning (host): units, geometry, angles, then the decode or the tile plan.
 * ------------------------------------------------------------------------------------------- */

uint64_t ceil_div(uint64_t a, uint64_t b)
{
    return (a + b - 1) / b;
}

/* The unit plan: the widest unit (16 bytes down to one element) such that no unit straddles a
 * rotated and an untouched range and every access is aligned: VE divides head_dim and the layout's
 * boundaries (rope_dim/2 and pair_stride half-split, rope_dim interleaved), and VE * element size
 * divides every base address and every byte stride that multiplies a nonzero index (a stride of an
 * axis of length 1 never does). IL: interleaved pairs whole in a unit (VE >= 2); an interleaved
 * layout left with one-element units runs half-split (plan_geometry). Small launches of 2-byte
 * types take 8-byte units instead of 16 (kDecNarrowRows). */
uint32_t plan_units(const lmk_rope_args *a, bool *il)
{
    const uint32_t es = a->dtype == LMK_F32 ? 4 : 2;
    const uint32_t D = a->head_dim, R = a->rope_dim, half = R / 2, stride = a->pair_stride;
    uint64_t bits = 0, rows = 0;
    for (int i = 0; i < a->n_tensors; i++) {
        const lmk_rope_tensor *t = &a->t[i];
        bits |= (uintptr_t)t->in | (uintptr_t)t->out;
        if (a->seq_len > 1)
            bits |= (uint64_t)t->in_tok * es | (uint64_t)t->out_tok * es;
        if (t->n_heads > 1)
            bits |= (uint64_t)t->in_head * es | (uint64_t)t->out_head * es;
        rows += t->n_heads;
    }
    uint32_t ve = 16 / es;
    for (; ve > 1; ve >>= 1) {
        const bool layout = a->interleaved ? R % ve == 0 : half % ve == 0 && stride % ve == 0;
        if (layout && D % ve == 0 && (bits & (ve * es - 1)) == 0)
            break;
    }
    if (es == 2 && ve == 8 && (uint64_t)a->seq_len * rows <= kDecNarrowRows)
        ve = 4;
    *il = a->interleaved && ve >= 2;
    return ve;
}

/* The geometry of the whole row: rows, unit steps and the untouched ranges (plan_slice then picks
 * the pairs of one launch). Half-split with pair stride s and h pairs, the untouched elements are
 * [h, s) and [s + h, D) (the first empty for HALF_ROPE: then [R, D)); interleaved, [R, D). Rows over
 * 4 GiB (offsets within a row are 32-bit) and more than 2^31 - 1 rows in one launch are
 * UNSUPPORTED; validation bounds every tensor by memory, so no real shape comes near either.
 * Returns the copy units of a row through *nc_row. */
lmk_status plan_geometry(const lmk_rope_args *a, uint32_t ve, bool il, Geom *g, uint32_t *nc_row)
{
    const uint32_t es = a->dtype == LMK_F32 ? 4 : 2, nb = ve * es;
    const uint64_t D = a->head_dim, R = a->rope_dim, half = R / 2, s = a->pair_stride;
    const bool two = a->n_tensors == 2;
    const uint64_t rows = (uint64_t)a->t[0].n_heads + (two ? a->t[1].n_heads : 0);
    if (D * es > 0xffffffffu)
        return lmk_fail(LMK_ERR_UNSUPPORTED, "rope: head_dim %llu (%llu bytes per row) exceeds the CUDA kernels' "
                        "4 GiB row limit", (unsigned long long)D, (unsigned long long)(D * es));
    if (rows > 0x7fffffffu)
        return lmk_fail(LMK_ERR_UNSUPPORTED,
                        "rope: %llu heads in one launch exceed the CUDA kernels' limit of 2^31 - 1",
                        (unsigned long long)rows);
    const lmk_rope_tensor *t0 = &a->t[0], *t1 = &a->t[two ? 1 : 0];
    g->in0 = (const unsigned char *)t0->in, g->out0 = (unsigned char *)t0->out;
    g->in1 = (const unsigned char *)t1->in, g->out1 = (unsigned char *)t1->out;
    g->in_tok0 = t0->in_tok * es, g->in_head0 = t0->in_head * es;
    g->out_tok0 = t0->out_tok * es, g->out_head0 = t0->out_head * es;
    g->in_tok1 = t1->in_tok * es, g->in_head1 = t1->in_head * es;
    g->out_tok1 = t1->out_tok * es, g->out_head1 = t1->out_head * es;
    g->nh0 = t0->n_heads;
    g->rows = (uint32_t)rows;
    g->copy0 = t0->in != t0->out;
    g->copy1 = two && t1->in != t1->out;
    uint64_t c1, c2, nc1, nc;
    if (a->interleaved) {
        g->ustep_b = il ? nb : 2 * es; /* one-element units: a at 2p, b at 2p+1 */
        g->stride_b = il ? 0 : es;
        c1 = R, nc1 = (D - R) / ve, c2 = D, nc = nc1; /* range 2 is empty */
    } else {
        g->ustep_b = nb;
        g->stride_b = (uint32_t)(s * es);
        c1 = half, nc1 = (s - half) / ve, c2 = s + half, nc = nc1 + (D - s - half) / ve;
    }
    g->nc1 = (uint32_t)nc1;
    g->c1_b = (uint32_t)(c1 * es);
    g->c2_b = (uint32_t)(c2 * es - nc1 * nb); /* >= c1_b: range 2 starts nc1 units past c1 or later */
    *nc_row = (g->copy0 || g->copy1) ? (uint32_t)nc : 0;
    return LMK_OK;
}

/* The slice plan: the pairs [p0, p0 + n) one launch rotates (n <= kSlicePairs; both multiples of ppu,
 * the pairs of a unit), and the copy units, which the first launch alone moves. */
void plan_slice(Geom *g, uint32_t p0, uint32_t n, uint32_t ppu, uint32_t nc_row)
{
    g->half = n;
    g->npu = n / ppu;
    g->pair_b = p0 / ppu * g->ustep_b;
    g->nc = p0 == 0 ? nc_row : 0;
}

/* The angle plan of pairs [p0, p0 + n): the constants of lmk_rope_axis_at and pair_freq, and what the
 * device needs to finish the angle. One log2 per call; nothing per pair. */
void plan_angles(const lmk_rope_angle *g, uint32_t p0, AnglePlan *ap)
{
    ap->axes = lmk_rope_axes_of((int)g->mode, g->sections);
    ap->p0 = p0;
    ap->log2_step = -2.0 * log2(g->freq_base) / g->exp_n;
    ap->freq_scale = g->freq_scale;
    ap->ext_factor = g->ext_factor;
    ap->ramp_low = g->ramp_low;
    ap->ramp_span = g->ramp_high - g->ramp_low > 0.001 ? g->ramp_high - g->ramp_low : 0.001;
    ap->ff = g->freq_factors ? g->freq_factors + p0 : NULL;
    ap->pos = g->positions;
    ap->pos_axis_stride = g->pos_axis_stride;
    ap->pos_dtype = (int)g->pos_dtype;
    ap->mscale = (float)g->mscale;
}

/* The decode plan, when it applies: blockDim (items per row, rows per block) with the rows
 * balanced over the groups and at least `half` threads (one angle each), a grid of (tokens,
 * groups) of at most 2 blocks per SM. */
bool plan_decode(const Geom &g, uint64_t seq, int sm_count, LaunchPlan *L)
{
    const uint64_t ipr = (uint64_t)g.npu + g.nc; /* items per row */
    if (ipr > kDecMaxItems)
        return false;
    uint64_t rpb = kDecThreads / ipr;
    rpb = rpb < 1 ? 1 : rpb > g.rows ? g.rows : rpb;
    const uint64_t groups = ceil_div(g.rows, rpb);
    if (seq * groups > 2 * (uint64_t)sm_count)
        return false;
    rpb = ceil_div(g.rows, groups);
    /* One angle per thread: rows past the last (idle but for their angle) until there are `half`
     * threads. At most ceil(half / ipr) rows of fewer than half items: under 2 * kSlicePairs threads. */
    const uint64_t rpb_angles = ceil_div(g.half, ipr);
    rpb = rpb < rpb_angles ? rpb_angles : rpb;
    L->decode = true;
    L->blocks = dim3((unsigned)seq, (unsigned)groups, 1);
    L->threads = dim3((unsigned)ipr, (unsigned)rpb, 1);
    L->smem = (size_t)g.half * sizeof(float2);
    return true;
}

/* The tile plan of the prefill kernel. A block's items are tile_tokens * rows_per_group * units; a
 * tile holds ~kBlockItems of them (a few per thread, fine-grained enough to balance the SMs). Groups
 * > 1 only when the tiles alone cannot occupy the GPU: then ~one item per thread. Items per block
 * stay under 2^30. */
void plan_tiles(const Geom &g, uint64_t seq, int sm_count, TilePlan *tp, LaunchPlan *L)
{
    tp->seq = seq;
    const uint64_t units = (uint64_t)g.npu + g.nc, per_token = (uint64_t)g.rows * units;
    /* With copy items, ~kBlockItems per block (rounded up); without, at most what one batch of
     * every thread holds (rounded down), so each thread loads all its items before the barrier. */
    const uint64_t batch_items = (uint64_t)kRotBatch<false> * kThreads;
    uint64_t tile = g.nc ? ceil_div(kBlockItems, per_token) : batch_items / per_token;
    /* One angle per thread at most (the kernel computes exactly one): half <= kSlicePairs <= kThreads. */
    const uint64_t tile_max = kThreads / g.half;
    tile = tile < 1 ? 1 : tile > tile_max ? tile_max : tile;
    tile = tile > seq ? seq : tile;
    const uint64_t tiles = ceil_div(seq, tile);
    uint64_t groups = ceil_div(tile * per_token, (uint64_t)1 << 30);
    if (tiles < 2 * (uint64_t)sm_count) {
        const uint64_t gmin = ceil_div(tile * per_token, kThreads);
        groups = gmin > groups ? gmin : groups;
    }
    groups = groups > g.rows ? g.rows : groups;
    tp->rows_per_group = (uint32_t)ceil_div(g.rows, groups);
    tp->groups = (uint32_t)ceil_div(g.rows, tp->rows_per_group); /* no empty group */
    tp->tile_tokens = (uint32_t)tile;
    tp->n_blocks = tiles * tp->groups;
    L->decode = false;
    L->blocks = dim3((unsigned)tp->n_blocks, 1, 1);
    if (tp->n_blocks > 0x7fffffffu) /* T near 2^32 with one token per tile */
        L->blocks = dim3(1u << 30, (unsigned)ceil_div(tp->n_blocks, 1u << 30), 1);
    L->threads = dim3(kThreads, 1, 1);
    L->smem = (size_t)tp->tile_tokens * g.half * sizeof(float2);
}

} /* namespace */

/* One launch per slice of kSlicePairs pairs (one for rope_dim <= 256), each planned from scratch:
 * every launch is a pure function of its parameters, so slices never depend on each other. */
lmk_status lmk_cuda_rope(lmk_stream *s, const void *args)
{
    const lmk_rope_args *a = (const lmk_rope_args *)args;
    const lmk_cuda_device *d = lmk_cuda_dev(s->dev);
    lmk_status st = lmk_cuda_use(d->ordinal, "rope: cudaSetDevice");
    if (st != LMK_OK)
        return st;
    const bool pdl = pdl_on(d->ordinal);
    bool il;
    const uint32_t ve = plan_units(a, &il), ppu = il ? ve / 2 : ve, half = a->rope_dim / 2;
    RopeParams p{};
    uint32_t nc_row;
    st = plan_geometry(a, ve, il, &p.g, &nc_row);
    for (uint32_t p0 = 0; st == LMK_OK && p0 < half; p0 += kSlicePairs) {
        const uint32_t n = half - p0 < kSlicePairs ? half - p0 : kSlicePairs;
        plan_slice(&p.g, p0, n, ppu, nc_row);
        plan_angles(&a->angle, p0, &p.a);
        LaunchPlan L;
        if (!plan_decode(p.g, a->seq_len, d->sm_count, &L))
            plan_tiles(p.g, a->seq_len, d->sm_count, &p.tp, &L);
        L.pdl = pdl;
        const cudaError_t e = launch_dtype(a->dtype, ve, il, p, L, lmk_cuda_stream_of(s));
        if (e != cudaSuccess)
            st = lmk_cuda_fail(e, "rope: kernel launch");
    }
    return st;
}

cudaError_t lmk_cuda_rope_preload(void)
{
    cudaError_t first = cudaSuccess;
    preload_dtype<LMK_F32>(&first);
    preload_dtype<LMK_BF16>(&first);
    preload_dtype<LMK_F16>(&first);
    int ordinal = -1;
    if (first == cudaSuccess) { /* cached now, so no launch (captured or not) makes the queries */
        if (cudaGetDevice(&ordinal) == cudaSuccess)
            (void)pdl_on(ordinal);
        else
            (void)cudaGetLastError();
    }
    return first;
}
