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
 * kRotBatch items), computes its angle, streams its copy units (kCopyBatch in flight; they need no
 * angle), and only then waits at the barrier and rotates and stores the pair units. So the angle
 * math is hidden behind memory traffic, and at decode all of a thread's loads start at once. Pair
 * and copy items are enumerated separately, so a warp runs one kind of work and does not diverge.
 * Rows with rope_dim/2 beyond the shared-memory table (kSmemPairs) are processed in chunks of pairs.
 * In place (in == out) there are no copy units: only the rotated elements are read and written.
 * Untouched elements move as raw integer words: bit-exact, NaN payloads included.
 *
 * Precision (SPEC.md: f32 within 1e-5 of float64 for |x| <= 2 up to |pos| = 2^20). The f32 seed
 * computes pos * powf(base, -2p/R) in f32, whose error at 2^20 is ~0.06 rad. Here:
 *   inv_freq(p) = exp2(p * log2_step) in double (log2_step = -2*log2(base)/R, from the host);
 *   theta = pos * inv_freq in double, reduced by 2*pi*rint(theta/2pi) with a two-constant
 *   Cody-Waite reduction in double (exact to ~1e-16 for |theta| <= 2^20);
 *   sincosf of the reduced f32 angle (|r| <= pi: sincosf's fast path, ~1 ulp).
 * The angle error is then ~1e-7 rad, so f32 results sit within ~1e-6 of float64 and bf16/f16
 * results within one ulp.
 */
#include "cuda/cuda_internal.h"
#include "ops/rope_common.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 256;
constexpr uint32_t kSmemPairs = 2048; /* (cos, sin) slots per block: 16 KB of shared memory */
constexpr int kRotBatch = 2;          /* pair items a thread loads (two units each) before storing */
constexpr int kCopyBatch = 4;         /* copy items a thread loads before storing */
constexpr uint32_t kBlockItems = 1024; /* work items a block aims for at prefill: 4 per thread */

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
    uint32_t sections[4];
    int mode;
    double log2_step;               /* -2*log2(base)/rope_dim: inv_freq(p) = exp2(p*log2_step) */
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

/* 2*pi split in two doubles for the Cody-Waite reduction: hi is the double nearest 2*pi and lo the
 * double nearest 2*pi - hi, so k*(hi + lo) is 2*pi*k to ~1e-32 relative for |k| < 2^20. */
constexpr double kTwoPiHi = 6.283185307179586232e+00;
constexpr double kTwoPiLo = 2.449293598294706414e-16;
constexpr double kInvTwoPi = 1.591549430918953456e-01;

/* (cos, sin) of pair `pair` of token t. */
__device__ __forceinline__ float2 rope_angle(const RopeParams &p, uint64_t t, uint32_t pair)
{
    const uint32_t sec[4] = {p.sections[0], p.sections[1], p.sections[2], p.sections[3]};
    const int axis = lmk_rope_axis(p.mode, sec, pair);
    const double pos = (double)__ldg(p.pos + (uint64_t)axis * p.seq + t);
    const double theta = pos * exp2((double)pair * p.log2_step);
    const double k = rint(theta * kInvTwoPi);
    const double red = fma(-k, kTwoPiLo, fma(-k, kTwoPiHi, theta));
    float s, c;
    sincosf((float)red, &s, &c);
    return make_float2(c, s);
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
template <int NB> struct RotBatch {
    Raw<NB> a[kRotBatch], b[kRotBatch];
    unsigned char *out[kRotBatch]; /* NULL: no item */
    uint32_t cs[kRotBatch];        /* index of the unit's first (cos, sin) in the table */
};

/* Loads the pair items i, i + kThreads, ... of this block's chunk. An item is (token tl of the
 * tile, row r_lo + rr, unit u of the chunk), u fastest so a warp reads contiguous units. */
template <int ES, int VE>
__device__ __forceinline__ void rot_load(const RopeParams &p, RotBatch<VE * ES> &bt, uint32_t i, uint32_t n_items,
                                         uint32_t nu, uint32_t nr, uint64_t t0, uint32_t r_lo, uint32_t c0,
                                         uint32_t cn)
{
#pragma unroll
    for (int k = 0; k < kRotBatch; k++) {
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

template <int DT, int VE>
__device__ __forceinline__ void rot_store(const RopeParams &p, const RotBatch<VE * Elem<DT>::size> &bt,
                                          const float2 *s_cs)
{
    constexpr int ES = Elem<DT>::size;
#pragma unroll
    for (int k = 0; k < kRotBatch; k++) {
        if (!bt.out[k])
            continue;
        float c[VE], sn[VE];
        if constexpr (VE == 1) {
            const float2 cs = s_cs[bt.cs[k]];
            c[0] = cs.x, sn[0] = cs.y;
        } else { /* two pairs per 16-byte shared load: bt.cs[k] is even */
#pragma unroll
            for (int e = 0; e < VE; e += 2) {
                const float4 q = *reinterpret_cast<const float4 *>(s_cs + bt.cs[k] + e);
                c[e] = q.x, sn[e] = q.y, c[e + 1] = q.z, sn[e + 1] = q.w;
            }
        }
        float oa[VE], ob[VE];
#pragma unroll
        for (int e = 0; e < VE; e++) {
            const float a = Elem<DT>::widen(get_bits<DT, VE>(bt.a[k], e));
            const float b = Elem<DT>::widen(get_bits<DT, VE>(bt.b[k], e));
            oa[e] = fmaf(a, c[e], -b * sn[e]);
            ob[e] = fmaf(a, sn[e], b * c[e]);
        }
        store<VE * ES>(bt.out[k], pack<DT, VE>(oa));
        store<VE * ES>(bt.out[k] + (size_t)p.stride * ES, pack<DT, VE>(ob));
    }
}

/* At most 80 registers, so 3 blocks of 256 threads fit an SM (ptxas -v, sm_80 and sm_90: 56-80
 * registers, no spills, with these batch sizes; docs/cuda_notes.md). A block is one
 * (tile, row group); the grid is 2-D only when there are more than 2^31 - 1 of them. There is no
 * grid-stride loop: one cost ptxas -v showed is ~30 registers of loop-carried state. */
template <int DT, int VE>
__global__ void __launch_bounds__(kThreads, 3) rope_multi_kernel(const RopeParams p)
{
    constexpr int ES = Elem<DT>::size, NB = VE * ES;
    __shared__ __align__(16) float2 s_cs[kSmemPairs];
    const uint64_t blk = (uint64_t)blockIdx.y * gridDim.x + blockIdx.x;
    if (blk >= p.n_blocks)
        return;
    const uint64_t tile = blk / p.groups;
    const uint32_t group = (uint32_t)(blk - tile * p.groups);
    const uint64_t t0 = tile * p.tile_tokens;
    const uint32_t tt = (uint32_t)min((uint64_t)p.tile_tokens, p.seq - t0);
    const uint32_t r_lo = group * p.rows_per_group;
    const uint32_t nr = min(p.rows_per_group, p.rows - r_lo);

    /* One chunk of pairs (usually all of them) at a time. Order within a block: the first batch of
     * pair items is loaded, the angles are computed, the copy items (which need no angle) stream
     * while the slowest angles finish, then the block syncs and rotates. So every phase's memory
     * traffic overlaps the angle math, and at decode all of a thread's loads start at once. */
    for (uint32_t c0 = 0; c0 < p.half; c0 += p.chunk) {
        const uint32_t cn = min(p.chunk, p.half - c0), nu = cn / VE;
        const uint32_t n_items = tt * nr * nu;
        RotBatch<NB> bt;
        uint32_t i = threadIdx.x;
        rot_load<ES, VE>(p, bt, i, n_items, nu, nr, t0, r_lo, c0, cn);
        if (c0 > 0)
            __syncthreads(); /* the previous chunk's readers of s_cs are done */
        for (uint32_t j = threadIdx.x; j < tt * cn; j += kThreads) {
            const uint32_t tl = j / cn;
            s_cs[j] = rope_angle(p, t0 + tl, c0 + (j - tl * cn));
        }
        if (c0 == 0) {
            /* Copy items (out of place): (token, row, copy unit), unit fastest. */
            const uint32_t n_copy = tt * nr * p.nc;
            for (uint32_t ci = threadIdx.x; ci < n_copy; ci += kCopyBatch * kThreads) {
                Raw<NB> v[kCopyBatch];
                unsigned char *dst[kCopyBatch];
#pragma unroll
                for (int k = 0; k < kCopyBatch; k++) {
                    const uint32_t item = ci + k * kThreads;
                    dst[k] = nullptr;
                    if (item < n_copy) {
                        const uint32_t c = item % p.nc, rr = item / p.nc;
                        const uint32_t tl = rr / nr, r = r_lo + (rr - tl * nr);
                        const RowRef ref = row_ref<ES>(p, t0 + tl, r);
                        if (ref.copy) {
                            const size_t off = (size_t)(c < p.nc1 ? p.c1 + c * VE : p.c2 + (c - p.nc1) * VE) * ES;
                            v[k] = load<NB>(ref.in + off);
                            dst[k] = ref.out + off;
                        }
                    }
                }
#pragma unroll
                for (int k = 0; k < kCopyBatch; k++)
                    if (dst[k])
                        store<NB>(dst[k], v[k]);
            }
        }
        __syncthreads();
        for (;;) {
            rot_store<DT, VE>(p, bt, s_cs);
            i += kRotBatch * kThreads;
            if (i >= n_items)
                break;
            rot_load<ES, VE>(p, bt, i, n_items, nu, nr, t0, r_lo, c0, cn);
        }
    }
}

template <int DT, int VE>
cudaError_t launch(const RopeParams &p, dim3 blocks, cudaStream_t st)
{
    rope_multi_kernel<DT, VE><<<blocks, kThreads, 0, st>>>(p);
    return cudaGetLastError();
}

/* The kernel instantiation for a dtype and unit width: 16, 8, 4 (and 2 for 16-bit types) bytes. */
cudaError_t launch_dtype(lmk_dtype dt, uint32_t ve, const RopeParams &p, dim3 blocks, cudaStream_t st)
{
    switch (dt) {
    case LMK_F32:
        return ve == 4 ? launch<LMK_F32, 4>(p, blocks, st)
             : ve == 2 ? launch<LMK_F32, 2>(p, blocks, st)
                       : launch<LMK_F32, 1>(p, blocks, st);
    case LMK_BF16:
        return ve == 8 ? launch<LMK_BF16, 8>(p, blocks, st)
             : ve == 4 ? launch<LMK_BF16, 4>(p, blocks, st)
             : ve == 2 ? launch<LMK_BF16, 2>(p, blocks, st)
                       : launch<LMK_BF16, 1>(p, blocks, st);
    default:
        return ve == 8 ? launch<LMK_F16, 8>(p, blocks, st)
             : ve == 4 ? launch<LMK_F16, 4>(p, blocks, st)
             : ve == 2 ? launch<LMK_F16, 2>(p, blocks, st)
                       : launch<LMK_F16, 1>(p, blocks, st);
    }
}

template <int DT, int VE> void preload_one(cudaError_t *first)
{
    cudaFuncAttributes attr;
    const cudaError_t e = cudaFuncGetAttributes(&attr, rope_multi_kernel<DT, VE>);
    if (e != cudaSuccess && *first == cudaSuccess)
        *first = e;
}

uint64_t ceil_div(uint64_t a, uint64_t b)
{
    return (a + b - 1) / b;
}

} /* namespace */

lmk_status lmk_cuda_rope_multi(lmk_stream *s, const lmk_rope_args *a)
{
    const lmk_cuda_device *d = lmk_cuda_dev(s->dev);
    lmk_status st = lmk_cuda_use(d->ordinal, "rope_multi: cudaSetDevice");
    if (st != LMK_OK)
        return st;

    const uint32_t es = a->dtype == LMK_F32 ? 4 : 2;
    const uint32_t D = a->head_dim, half = a->rope_dim / 2;
    const uint32_t stride = lmk_rope_pair_stride((int)a->pairing, D, a->rope_dim);
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

    RopeParams p;
    p.in0 = (const unsigned char *)a->t[0].in;
    p.out0 = (unsigned char *)a->t[0].out;
    p.in1 = two ? (const unsigned char *)a->t[1].in : p.in0;
    p.out1 = two ? (unsigned char *)a->t[1].out : p.out0;
    p.pos = a->positions;
    p.seq = a->seq_len;
    p.nh0 = a->t[0].n_heads;
    p.nh1 = two ? a->t[1].n_heads : 0;
    p.head_dim = D;
    p.stride = stride;
    p.half = half;
    p.copy0 = a->t[0].in != a->t[0].out;
    p.copy1 = two && a->t[1].in != a->t[1].out;
    if (a->pairing == LMK_ROPE_PAIR_HALF_HEAD) { /* untouched: [R/2, D/2) and [D/2 + R/2, D) */
        p.c1 = half, p.nc1 = (D / 2 - half) / ve;
        p.c2 = D / 2 + half;
    } else { /* untouched: [R, D) */
        p.c1 = a->rope_dim, p.nc1 = (D - a->rope_dim) / ve;
        p.c2 = D;
    }
    p.nc = (p.copy0 || p.copy1) ? (D - a->rope_dim) / ve : 0;
    for (int i = 0; i < 4; i++)
        p.sections[i] = a->sections[i];
    p.mode = (int)a->mode;
    p.log2_step = -2.0 * log2((double)a->freq_base) / (double)a->rope_dim;

    /* Rows of q and k. Validation bounds every tensor by memory, so heads fit comfortably in 32
     * bits; the sum is checked anyway because it indexes in 32 bits. */
    const uint64_t rows = (uint64_t)p.nh0 + p.nh1;
    if (rows > 0x7fffffffu)
        return lmk_fail(LMK_ERR_UNSUPPORTED, "rope_multi: %llu heads in one launch exceed the CUDA kernel's limit",
                        (unsigned long long)rows);
    p.rows = (uint32_t)rows;

    /* Tiles and row groups. A block's items are tile_tokens * rows_per_group * units; a tile holds
     * ~kBlockItems of them (a few per thread, fine-grained enough to balance the SMs). Groups > 1
     * only when the tiles alone cannot occupy the GPU (decode): then ~one item per thread, so a
     * call's latency is one angle plus one memory round trip. Items per block stay under 2^30. */
    p.chunk = half < kSmemPairs ? half : kSmemPairs - kSmemPairs % ve;
    const uint64_t units = (uint64_t)half / ve + p.nc;       /* per row */
    const uint64_t per_token = rows * units;
    uint64_t tile = ceil_div(kBlockItems, per_token);
    const uint64_t tile_max = kSmemPairs / p.chunk;
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

    const cudaError_t e = launch_dtype(a->dtype, ve, p, blocks, lmk_cuda_stream_of(s));
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
