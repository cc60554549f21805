/*
 * kernel_common.cuh - the device code every op's kernels share (nvcc only): raw 16-byte units and
 * their loads and stores, the dtype traits with lmk's own narrowing, the rotary (cos, sin) of an
 * angle, a block's (tile, group), and programmatic dependent launch (the device side, pdl_enter,
 * and the launch helper lmk_cuda_start, with ceil_div for the host's planning). One copy, so that
 * rope and attn_prologue rotate by the same bits and move units the same way. Everything is in an
 * anonymous namespace: each op's translation unit gets its own instantiations, as it would from a
 * private copy.
 */
#ifndef LMK_CUDA_KERNEL_COMMON_CUH
#define LMK_CUDA_KERNEL_COMMON_CUH

#include "core/internal.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

/* A unit of NB bytes held as 32-bit words (NB < 4 uses the low bits of w[0]). */
template <int NB> struct Raw { uint32_t w[NB >= 4 ? NB / 4 : 1]; };

/* Loads are evict-first: an op's inputs are dead once read (ld.global.cs is coherent, so it is also
 * right in place). Stores are plain: the outputs are what the next op (attention) reads. */
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
        static_assert(NB == 2, "loads are of 2 to 16 bytes");
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
    else if constexpr (NB == 2)
        *reinterpret_cast<unsigned short *>(p) = (unsigned short)r.w[0];
    else
        *p = (unsigned char)r.w[0];
}

/* dtype traits (DT: LMK_F32, LMK_BF16, LMK_F16). narrow() is lmk_f32_to_bf16/f16 bit for bit
 * (nearest even; a NaN stays a quiet NaN with its sign). cvt2() packs two values (lo in the low
 * half) with one cvt instruction, which rounds as narrow() but returns a canonical NaN: callers
 * that may see NaNs use narrow2(), or redo a unit holding one with narrow(). */
template <int DT> struct Elem;

template <> struct Elem<LMK_F32> {
    static constexpr int size = 4;
    static __device__ __forceinline__ float widen(uint32_t b) { return __uint_as_float(b); }
};

template <> struct Elem<LMK_BF16> {
    static constexpr int size = 2;
    static __device__ __forceinline__ float widen(uint32_t b) { return __uint_as_float(b << 16); }
    static __device__ __forceinline__ uint32_t narrow(float f)
    {
        const uint32_t u = __float_as_uint(f);
        if ((u & 0x7fffffffu) > 0x7f800000u)
            return (u >> 16) | 0x0040u;
        return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    }
    static __device__ __forceinline__ uint32_t cvt2(float lo, float hi)
    {
        const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return (uint32_t)__bfloat16_as_ushort(v.x) | ((uint32_t)__bfloat16_as_ushort(v.y) << 16);
    }
    static __device__ __forceinline__ uint32_t narrow2(float lo, float hi)
    {
        return lo != lo || hi != hi ? narrow(lo) | (narrow(hi) << 16) : cvt2(lo, hi);
    }
};

template <> struct Elem<LMK_F16> {
    static constexpr int size = 2;
    static __device__ __forceinline__ float widen(uint32_t b)
    {
        return __half2float(__ushort_as_half((unsigned short)b));
    }
    /* cvt.rn.f16.f32 overflows to infinity like lmk_f32_to_f16; NaNs keep sign and top payload. */
    static __device__ __forceinline__ uint32_t narrow(float f)
    {
        const uint32_t u = __float_as_uint(f);
        if ((u & 0x7fffffffu) > 0x7f800000u)
            return ((u >> 16) & 0x8000u) | 0x7e00u | ((u >> 13) & 0x03ffu);
        return __half_as_ushort(__float2half_rn(f));
    }
    static __device__ __forceinline__ uint32_t cvt2(float lo, float hi)
    {
        const __half2 v = __floats2half2_rn(lo, hi);
        return (uint32_t)__half_as_ushort(v.x) | ((uint32_t)__half_as_ushort(v.y) << 16);
    }
    static __device__ __forceinline__ uint32_t narrow2(float lo, float hi)
    {
        return lo != lo || hi != hi ? narrow(lo) | (narrow(hi) << 16) : cvt2(lo, hi);
    }
};

/* Element i of an f32, bf16 or f16 array (dt an lmk_dtype), widened to f32 exactly. */
__device__ __forceinline__ float ld_f32(const void *p, int dt, uint64_t i)
{
    if (dt == LMK_F32)
        return static_cast<const float *>(p)[i];
    const uint32_t b = static_cast<const unsigned short *>(p)[i];
    return dt == LMK_BF16 ? Elem<LMK_BF16>::widen(b) : Elem<LMK_F16>::widen(b);
}

/* Element e of a unit of VE elements, widened to f32. */
template <int DT, int VE> __device__ __forceinline__ float elem(const Raw<VE * Elem<DT>::size> &r, int e)
{
    if constexpr (Elem<DT>::size == 4)
        return Elem<DT>::widen(r.w[e]);
    else
        return Elem<DT>::widen((r.w[e >> 1] >> (16 * (e & 1))) & 0xffffu);
}

/* The unit holding the values f[e], narrowed to the dtype (NaN-exact). */
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

/* (cos, sin) of theta. The quadrant reduction is in double: t = kRound + rint(theta*2/pi) in one
 * FMA (its low word holds the quadrant k mod 4), r = theta - k*pi/2 in two FMAs with pi/2 split in
 * two doubles (hi the double nearest pi/2, lo the double nearest pi/2 - hi), exact to ~1e-16 for
 * |theta| < 2^51. Then sin and cos of the f32 r (|r| <= pi/4) by two short polynomials (the minimax
 * ones of CUDA's own sincosf kernel; max error 7e-8 absolute, 1.5 ulp, measured against libm over
 * 4e7 angles with |theta| <= 2^20) and a quadrant swap: branch-free, no stack frame. The clamp only
 * matters for |theta| >= 2^51 (absurd bases), where it keeps the result finite and bounded; r is
 * NaN exactly when theta is not finite, and then both results are NaN. */
__device__ __forceinline__ float2 rope_cs(double theta)
{
    constexpr double kPiHalfHi = 1.57079632679489655800e+00;
    constexpr double kPiHalfLo = 6.12323399573676603587e-17;
    constexpr double kTwoOverPi = 6.36619772367581382433e-01;
    constexpr double kRound = 6755399441055744.0; /* 1.5 * 2^52: x + kRound rounds x to an integer */
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

/* The rotated pair (a, b) by (c, s) = m * (cos, sin)(theta): (a*c - b*s, a*s + b*c), each with one
 * rounding of the product and one of the fma (lmk.h's formula; rope's and attn_prologue's kernels
 * all rotate here, so the two ops round alike). */
__device__ __forceinline__ float2 rotate2(float a, float b, float c, float s)
{
    return make_float2(fmaf(a, c, -b * s), fmaf(a, s, b * c));
}

/* Programmatic dependent launch (sm_90 and later; docs/cuda.md, "Programmatic dependent launch").
 * Where the host launches with programmatic stream serialization (lmk_cuda_device.pdl), a kernel
 * may start while the previous kernel of the stream is still finishing. Every kernel calls this before its first global memory
 * access, read or write (a write must not land under a previous kernel still reading that buffer):
 * wait blocks until every prerequisite grid has completed and its writes are visible, so the early
 * start moves only the launch and the index arithmetic before it. Without a programmatic
 * prerequisite (a plain launch, the first in a stream, after a copy or an event) it returns at
 * once. launch_dependents lets the next kernel of the stream start early if it opted in likewise,
 * which obliges it to wait the same way before it reads our output. Code for sm_80 has no such
 * instruction, and the host then never sets the attribute. */
__device__ __forceinline__ void pdl_enter()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n\tgriddepcontrol.wait;" ::: "memory");
#endif
}

/* The Hopper bulk copies (sm_90 and later: the tensor memory accelerator without a tensor map) and
 * the shared-memory barriers that count their bytes. A bulk copy moves a contiguous run of bytes
 * (a multiple of 16, both ends 16-byte aligned) between global and shared memory without passing
 * through registers. Loads complete on an mbarrier (expect_tx adds the bytes a phase waits for,
 * each copy subtracts what it delivered); stores go in per-thread bulk groups, and a thread waits
 * for its own older groups to have read their shared memory before that memory is refilled.
 * Code for older GPUs compiles these to nothing and the host never launches a kernel using them
 * there (lmk_cuda_device.bulk). */
__device__ __forceinline__ uint32_t smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define LMK_CUDA_BULK_PTX(...) asm volatile(__VA_ARGS__)
#else
#define LMK_CUDA_BULK_PTX(...) ((void)0)
#endif

/* A barrier that completes a phase when `count` threads have arrived and its bytes have landed;
 * the init is made visible to the bulk copies' (async) proxy before any copy names it. */
__device__ __forceinline__ void mbar_init(uint64_t *bar, uint32_t count)
{
    LMK_CUDA_BULK_PTX("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_init_fence()
{
    LMK_CUDA_BULK_PTX("fence.mbarrier_init.release.cluster;\n\tfence.proxy.async.shared::cta;" ::: "memory");
}

/* This thread's arrival on the current phase, which also waits for `bytes` more bytes. */
__device__ __forceinline__ void mbar_arrive_bytes(uint64_t *bar, uint32_t bytes)
{
    LMK_CUDA_BULK_PTX("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
                      : "memory");
}

/* This thread's arrival, made when every cp.async it issued before has landed (.noinc: the
 * arrival is one of the `count` of mbar_init). */
__device__ __forceinline__ void mbar_arrive_cp_async(uint64_t *bar)
{
    LMK_CUDA_BULK_PTX("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_addr(bar)) : "memory");
}

/* Waits until the phase of the given parity has completed. */
__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    uint32_t done = 0;
    do {
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done)
                     : "r"(smem_addr(bar)), "r"(parity)
                     : "memory");
    } while (!done);
#else
    (void)bar, (void)parity;
#endif
}

/* bytes from global src to shared dst, completing on bar. */
__device__ __forceinline__ void bulk_load(void *dst, const void *src, uint32_t bytes, uint64_t *bar)
{
    LMK_CUDA_BULK_PTX("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                          smem_addr(dst)),
                      "l"(src), "r"(bytes), "r"(smem_addr(bar))
                      : "memory");
}

/* bytes from shared src to global dst, in this thread's current bulk group. */
__device__ __forceinline__ void bulk_store(void *dst, const void *src, uint32_t bytes)
{
    LMK_CUDA_BULK_PTX("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(smem_addr(src)),
                      "r"(bytes)
                      : "memory");
}

/* Bulk tensor copies (sm_90 and later): one copy moves a box of a 3-D tensor described by a tensor
 * map (the host's cuTensorMapEncodeTiled: dimension 0 contiguous, 1 and 2 at byte strides of their
 * own), {x, y, z} its first element, packed in shared memory dimension 0 fastest (smem 128-byte
 * aligned). The map is a kernel parameter (__grid_constant__), named by its generic address. A
 * load delivers the whole box, zeros where it passes the tensor's end, and completes on bar with
 * the box's bytes; a store writes only the elements inside the tensor, in this thread's current
 * bulk group. */
__device__ __forceinline__ void tensor_load3(void *dst, const void *map, int x, int y, int z, uint64_t *bar)
{
    LMK_CUDA_BULK_PTX("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                      " [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(smem_addr(dst)),
                      "l"(map), "r"(x), "r"(y), "r"(z), "r"(smem_addr(bar))
                      : "memory");
}

__device__ __forceinline__ void tensor_store3(const void *map, int x, int y, int z, const void *src)
{
    LMK_CUDA_BULK_PTX("cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3}], [%4];" ::"l"(
                          map),
                      "r"(x), "r"(y), "r"(z), "r"(smem_addr(src))
                      : "memory");
}

/* Closes this thread's current bulk group. */
__device__ __forceinline__ void bulk_commit()
{
    LMK_CUDA_BULK_PTX("cp.async.bulk.commit_group;" ::: "memory");
}

/* Waits until at most N of this thread's bulk groups still read shared memory (their writes to
 * global memory may still be in flight). */
template <int N> __device__ __forceinline__ void bulk_wait_read()
{
    LMK_CUDA_BULK_PTX("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

/* Waits until every bulk group of this thread has completed, writes included. */
__device__ __forceinline__ void bulk_wait_all()
{
    LMK_CUDA_BULK_PTX("cp.async.bulk.wait_group 0;" ::: "memory");
}

/* Orders this thread's earlier shared-memory writes before later bulk copies that read them. */
__device__ __forceinline__ void fence_async_shared()
{
    LMK_CUDA_BULK_PTX("fence.proxy.async.shared::cta;" ::: "memory");
}

/* 4 or 8 bytes from global to shared memory (cp.async, sm_80 and later; the 8-byte form needs an
 * 8-byte aligned source), or zeros when !present (nothing is read). Before sm_80, a load and a
 * store. */
__device__ __forceinline__ void stage_word(unsigned char *s, const void *g, bool wide, bool present)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const uint32_t sa = smem_addr(s), n = present ? (wide ? 8 : 4) : 0;
    if (wide)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(sa), "l"(g), "r"(n) : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(sa), "l"(g), "r"(n) : "memory");
#else
    if (wide)
        *reinterpret_cast<int64_t *>(s) = present ? *static_cast<const int64_t *>(g) : 0;
    else
        *reinterpret_cast<int32_t *>(s) = present ? *static_cast<const int32_t *>(g) : 0;
#endif
}

/* stage_word(dst, src, wide, true) without the zero-fill operand, for rope's bulk kernel, whose
 * positions are always present: the form that kernel's figures (docs/cuda.md, "rope: figures")
 * were taken with. stage_word there would change that kernel's instructions, so the two are merged
 * only together with a GPU measurement of the bulk kernel. */
__device__ __forceinline__ void cp_async_word(void *dst, const void *src, bool wide)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if (wide)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
#else
    (void)dst, (void)src, (void)wide;
#endif
}

/* A block's place in a grid of n_blocks = tiles * groups blocks (1-D, or 2-D past 2^31 - 1 blocks):
 * its group, its tile's first token t0 and the tile's tokens tt (the last tile may be short). */
struct TileGroup {
    uint64_t t0;
    uint32_t tt, group;
};

/* Block blk's place (blk < tiles * groups). The division is 32-bit when the index fits. */
__device__ __forceinline__ TileGroup tile_group_at(uint64_t blk, uint32_t groups, uint32_t tile, uint64_t seq)
{
    const uint64_t t = blk >> 32 ? blk / groups : (uint32_t)blk / groups;
    TileGroup tg;
    tg.group = (uint32_t)(blk - t * groups);
    tg.t0 = t * tile;
    tg.tt = (uint32_t)min((uint64_t)tile, seq - tg.t0);
    return tg;
}

/* This block's place; false for a block past n_blocks (the 2-D grid's last row). */
__device__ __forceinline__ bool tile_group(uint64_t n_blocks, uint32_t groups, uint32_t tile, uint64_t seq,
                                           TileGroup *tg)
{
    const uint64_t blk = (uint64_t)blockIdx.y * gridDim.x + blockIdx.x;
    if (blk >= n_blocks)
        return false;
    *tg = tile_group_at(blk, groups, tile, seq);
    return true;
}

/* ceil(a / b) for the launch planning (host). */
inline uint64_t ceil_div(uint64_t a, uint64_t b)
{
    return (a + b - 1) / b;
}

/* How many bytes around a miss a read of whole rows of row_b bytes may have L2 fill at once (host):
 * the widest of 256 and 128 that is no wider than a row, so that rows far apart fetch no bytes
 * between them (0: no wider fill). rope's bulk tensor copies take it for their maps' L2
 * promotion, attn_prologue's staging copies take .L2::256B where it is 256 (docs/cuda.md,
 * "attn_prologue: the three kernels"); a 256-byte fill around 128-byte spans 512 bytes apart would
 * fetch twice the bytes that are read. */
inline uint32_t l2_fill_bytes(uint64_t row_b)
{
    return row_b >= 256 ? 256 : row_b >= 128 ? 128 : 0;
}

/* Loads kernel k into the current device's context (its first launch, captured or not, then pays
 * no lazy module loading) and, with smem > 0, lets its launches ask for up to smem bytes of dynamic
 * shared memory; the first failure of a device's preloads is kept in *first. Host code, for the
 * ops' preloads (cuda_internal.h). */
template <class P> void lmk_cuda_preload(void (*k)(P), size_t smem, cudaError_t *first)
{
    cudaFuncAttributes attr;
    cudaError_t e = cudaFuncGetAttributes(&attr, k);
    if (e == cudaSuccess && smem > 0)
        e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess && *first == cudaSuccess)
        *first = e;
}

/* One launch of kernel(p), with the programmatic serialization attribute when pdl. Inside a stream
 * capture the attribute becomes a programmatic edge between kernel nodes: one node per launch and
 * the same ordering at replay. */
template <class P>
cudaError_t lmk_cuda_start(void (*kernel)(P), const P &p, dim3 blocks, dim3 threads, size_t smem, cudaStream_t st,
                           bool pdl)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = blocks;
    cfg.blockDim = threads;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, p);
}

} /* namespace */

#endif /* LMK_CUDA_KERNEL_COMMON_CUH */
