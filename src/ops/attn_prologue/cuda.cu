/*
 * cuda.cu - the CUDA kernel of attn_prologue (lmk.h "attn_prologue": per-head RMSNorm and rope of q
 * and k, the KV-cache write) and its launch planning. This comment is the current design;
 * docs/cuda.md ("attn_prologue") has its figures and docs/decisions.md the alternatives measured
 * against it.
 *
 * Rows and items. A row is one (token, head) vector: a q row (head_dim elements: normed, rotated,
 * to q_out), a k row (the same, to k_out and/or the k cache row of the token's slot) or a v row (Dv
 * elements, copied or quantised to the v cache row). Rows are cut into units of VE elements: 16
 * bytes when that divides head_dim, Dv and the pair layout's boundaries and every base address and
 * every byte stride that multiplies a nonzero index (an f8 cache's at one byte per element), else
 * one element (plan_units; 8- and 4-byte units are not instantiated). Units form items:
 *   - pair items (q, k): the a and b units of VE rotated pairs (half-split layouts: a at i*VE, b
 *     pair_stride elements on), or one unit of VE/2 whole pairs (NORMAL, "il"); NORMAL left with
 *     one-element units runs half-split with a at 2i and b at 2i + 1, as rope's kernels do;
 *   - copy items: untouched units c and c + nch (nch = half the row's copy units, rounded up), so
 *     that a team's lanes read contiguous units in both of their loads. v rows are copy items only.
 * A team of L lanes (a power of two <= 32) owns a row: lane l holds items l and l + L (16-byte
 * units, U = 2: 64 bytes in flight) or l, l + L, l + 2L, l + 3L (one-element units, U = 4) as raw
 * words in registers (plan_team; a decode call takes a lane per item, so that l + L is past the
 * row and each warp's instruction stream is halved; with an f8 cache its units are 4 elements,
 * plan_decode_units). Lanes exchange nothing but
 * the sum of squares (a butterfly of shuffles within the team), so every element is read and
 * written by one lane: in place (out == in) is safe by construction, and copies without a norm are
 * the input's raw words, bit-exact (NaN payloads included). A row longer than L*U items
 * (head_dim > 2048 bf16 or 1024 f32 with 16-byte units, > 256 with one-element units) is processed
 * in chunks of L*U items, in two passes: the sums of squares, then the chunks reloaded (the CHUNK
 * instantiation; its loop costs registers the others do not pay).
 *
 * Per element, in f32 with no rounding between norm and rope (lmk.h): x = widen(in); with a norm,
 * x = x * r * (w + weight_offset), r = rsqrt(sum(x^2) / D + eps) from the team's f32 sum; rotated
 * pairs out_a = fma(a, c, -b*s), out_b = fma(a, s, b*c) with (c, s) = (cos, sin)(theta) * m, the
 * formula and the sin/cos evaluation of rope's kernels (src/ops/rope/cuda.cu). The angle factor is
 * lmk_rope_freq's float64 value from the host, where rope's kernels evaluate exp2 on the
 * device: without a norm the two ops agree within an ulp of the angle, not bit for bit. Outputs:
 * q_out and k_out in the input dtype, two elements per conversion instruction (nearest even; a unit
 * holding a NaN is built again, out of line, with lmk's own narrowing, which keeps the NaN quiet
 * with its sign); caches in the input dtype or f8e4m3 from the f32 product x * inv (lmk.h's rule:
 * inv = 1 / scale rounded once in f32 on the host, lmk_attn_prologue_inv_scale, the value the CPU
 * and the reference use), two codes per cvt.rn.satfinite.e4m3x2.f32 on sm_89 and later (the same
 * codes as lmk_f8e4m3_from_f32_bits, the host's rounding, on every f32 input: test_f8), a pair
 * holding a NaN through lmk_f8e4m3_from_f32_bits unscaled so that its sign survives, VE codes per
 * store. Paths with and without a norm, with and without an f8 cache are separate code, chosen
 * once per row.
 *
 * Blocks. A block takes a tile of tokens and a group of rows of each (q rows, then k, then v), one
 * row per team (plan_launch). Each lane first issues the loads of its items; then the block fills
 * shared memory with what its rows share: the (cos, sin) of each (token, pair) of the tile (one
 * angle per thread), the norm weights as f32 (w + weight_offset), the tile's slots (at decode with
 * every load issued first: fill_plan, fill_issue, fill_finish); one barrier; then the team's sum of
 * squares, the outputs. Angles: the host tabulates each pair's position axis and angle factor
 * (rope_math.h's lmk_rope_axis_j and lmk_rope_freq with ff = 1, float64) and passes the table in
 * the kernel parameters (the decode fill reads it before the PDL wait); the device divides by
 * freq_factors[p] (device memory), multiplies by the position (float64), reduces by k*pi/2 in
 * float64 and evaluates sin and cos of the f32 remainder by polynomials (rope_cs,
 * kernel_common.cuh's, the one rope's kernels use). Pairs past the table's 128 (rope_dim > 256, no
 * real model) take rope_math.h's rules on the device, in a function of their own. Blocks have 256 threads, 128 when the call's rows fill
 * at most two 256-thread blocks per SM (decode: more, smaller blocks spread a call over more SMs).
 *
 * Three kernels run these blocks. prologue_decode_kernel (small calls with 16-byte units: decode):
 * one CUDA block per block of the plan, one item a lane, and only the code such a call needs.
 * prologue_kernel: one CUDA block per block of the plan (one-element units, chunked rows, small
 * calls of them). prologue_stream_kernel (prefill with 16-byte units): a grid of the blocks that
 * fit on the GPU at once, each taking the plan's blocks b, b + grid, ... with the units of the
 * next one already on their way into shared memory (cp.async) while it computes the current one,
 * its tables double-buffered, the weights, each thread's task and the angle factors formed once
 * (StreamRec, PairTab: a CUDA block keeps its group of rows), rows of 256 bytes or more staged with
 * 256-byte L2 fills, its tables formed one block ahead. A round trip of loads thus stays in flight
 * through every block's arithmetic, where one CUDA block per block of the plan has loads in flight only at its start
 * (docs/cuda.md, "attn_prologue: the three kernels"). Where q/k rows hold pair items and copy
 * items (a partial half-split rope: Qwen3.5), a team's first lanes hold pairs and the rest
 * copies, and the warp would run the pair code and the copy code one after the other; the decode
 * kernel and the prefill kernel without an f8 cache have MIX instantiations in which every lane
 * runs one path for both (emit_mixed), taken where they measure faster (LaunchPlan.mix,
 * plan_launch).
 * Every instantiation is a row of variants.h's table (kernel, unit width, f8 paths, MIX, CHUNK);
 * plan_call makes every one of these choices and returns the row (plan_variant), for the launch (a
 * switch over the table), for lmk_cuda_attn_prologue_route (route.h), through which
 * tests/test_cuda_routing.c checks them on the model shapes, and for the preload. The bench forces a
 * row (lmk_cuda_attn_prologue_force) to time it against the planner's choice.
 *
 * Launches use programmatic dependent launch where the device allows it (lmk_cuda_device.pdl,
 * kernel_common.cuh): a launch may start while the previous kernel of the stream finishes, and
 * pdl_enter waits for it before the kernel's first memory access (only parameter arithmetic runs
 * early).
 *
 * Everything travels by value in ApParams (no allocation, no copy, no sync: a call can be captured
 * into a CUDA graph). Offsets across rows are 64-bit; offsets within a row (head_dim, Dv <= 4096)
 * are 32-bit. Results depend on the inputs and on the shape and 16-byte alignment of the operands
 * (which fix the unit width and team size, and so the order of the sum of squares), never on the
 * GPU's scheduling: the same call gives the same bits.
 */
#include "core/f8.h"
#include "cuda/cuda_internal.h"
#include "cuda/kernel_common.cuh"
#include "ops/attn_prologue/attn_prologue.h"
#include "ops/attn_prologue/route.h"
#include "ops/attn_prologue/variants.h"
#include "ops/rope_math.h"

#include <atomic>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

namespace {

constexpr int kThreads = 256;          /* threads of a block (launch bound) */
constexpr int kSpreadThreads = 128;    /* threads of a block when rows are spread (small T) */
/* Items of a row a lane holds (U; two units each): 2 of 16-byte units (64 bytes in flight, 16
 * registers), 4 of one-element units. With four 16-byte items ptxas needed ~105 registers against
 * the 80 of 3 blocks per SM; with one, the per-row work (task, destinations, norm) was spread over
 * half as many elements. */
template <int NB> constexpr int kItems = NB == 16 ? 2 : 4;
constexpr uint32_t kMaxDim = 4096;     /* largest head_dim and Dv */
constexpr size_t kChunkSmem = 64 * 1024; /* shared memory a CHUNK kernel may take (preload_dtype) */
constexpr uint32_t kTabPairs = 128;    /* pairs whose angle factor the host tabulates */
constexpr int kFreqCache = 4;          /* host angle tables kept per thread */
constexpr uint32_t kMagicShift = 20;   /* task k < 1024 of a block: k / n = (k * magic) >> 20 */
constexpr uint32_t kDecodeF8Elems = 4;  /* prologue_decode_kernel's units with an f8 cache (plan_decode_units) */

/* ---------------------------------------------------------------------------------------------
 * Parameters.
 * ------------------------------------------------------------------------------------------- */

/* A [rows, heads, dim] tensor: element (r, h, i) at p + r*tok + h*head + i*element size (bytes). */
struct Tensor {
    unsigned char *p; /* nullptr: absent */
    uint64_t tok, head;
};

/* A cache: rows of the slots [0, rows); f8: stored = f8(x * inv). */
struct Cache {
    Tensor t;
    uint64_t rows;
    float inv; /* the call's k_inv_scale or v_inv_scale (lmk_attn_prologue_args) */
    int f8;
};

/* A row's kind (kind_of): what it reads and where it goes. q and k rows share one set of items
 * (ApParams.kind[QK_ITEMS]), v rows have their own (V_ITEMS); the caches are ApParams.cache[K_CACHE]
 * and [V_CACHE]. */
enum RowKind : int { ROW_Q, ROW_K, ROW_V };
enum ItemSet : int { QK_ITEMS, V_ITEMS };
enum CacheId : int { K_CACHE, V_CACHE };

__host__ __device__ constexpr ItemSet items_of(RowKind k)
{
    return k == ROW_V ? V_ITEMS : QK_ITEMS;
}

/* The items of a row kind (q and k rows share one; v rows have their own), offsets in elements. */
struct Kind {
    uint32_t npu;     /* pair items */
    uint32_t nc, nch; /* copy units; copy items (nch = ceil(nc / 2): item c holds c and c + nch) */
    uint32_t nc1;     /* copy units in the first untouched range */
    uint32_t c1, c2;  /* copy unit c starts at (c < nc1 ? c1 : c2) + c * VE */
    uint32_t items;   /* npu + nch */
    uint32_t chunks;  /* ceil(items / (L * U)) */
};

/* The angles: freq[i] = lmk_rope_freq(..., ff = 1) and axis[i] = lmk_rope_axis_j's axis of pair i
 * < kTabPairs (plan_angles); the rest of the fields serve pairs past the table and the position. */
struct AnglePlan {
    double freq[kTabPairs];
    unsigned char axis[kTabPairs];
    const float *ff;  /* freq_factors (device memory) or nullptr */
    const void *pos;
    uint64_t pos_axis_stride;
    int pos_dtype;
    float mscale;
    int mode;
    uint32_t sections[4];
    double freq_base, exp_n, freq_scale, ext_factor, ramp_low, ramp_high;
};

/* The launch (plan_launch): a block is (tile, group); its tasks k < tile * rpg are (token k / rpg,
 * row group * rpg + k % rpg), the division by magic. Shared memory: the (cos, sin) table at 0,
 * the weights at float w_at, the slots at byte slot_at. */
struct Plan {
    uint64_t seq, n_blocks;
    uint32_t tile, groups, rpg, magic;
    uint32_t l_log2;  /* L = 1 << l_log2 lanes per team */
    uint32_t w_at, slot_at;
    uint32_t batch_fill; /* small calls: fill_plan, fill_issue, fill_finish */
    uint32_t wq_u, wk_u; /* batch_fill: the q and k weights' 16-byte units (0: absent); both 0: by element */
    /* prologue_stream_kernel (prefill, 16-byte units): the second (cos, sin) table (float2 index),
     * the second slot table and the two staging areas (bytes) */
    uint32_t cs2_at, slot2_at, stage_at;
    uint32_t words_at; /* 16 bytes a thread: its staged position and slot (bytes) */
    uint32_t rec_at, pairs_at; /* its StreamRec a thread and its PairTab (bytes) */
    uint32_t fetch256;         /* its staging copies fill L2 256 bytes at a time (plan_launch) */
    uint64_t n_tiles;          /* ceil(seq / tile) */
};

struct ApParams {
    Tensor q_in, k_in, v_in, q_out, k_out;
    Cache cache[2];           /* K_CACHE, V_CACHE */
    const void *q_w, *k_w;    /* nullptr: no norm */
    int q_w_dt, k_w_dt;
    float w_off, eps, inv_d;
    uint32_t D, hq, hk, rows; /* rows of a token: hq + hk, + hk with v */
    uint32_t half;            /* rotated pairs */
    uint32_t ustep, pstride;  /* elements from pair item i's a unit to item i+1's; from a to b */
    int il;                   /* pair items are single units of VE/2 interleaved pairs */
    Kind kind[2];             /* QK_ITEMS, V_ITEMS */
    const void *slots;
    int slot_i64;
    AnglePlan a;
    Plan pl;
};
static_assert(sizeof(ApParams) <= 4000, "kernel parameters must stay under the 4 KB limit");

/* ---------------------------------------------------------------------------------------------
 * Device helpers: f8, the angle (raw units, dtypes and rope_cs are kernel_common.cuh's).
 * ------------------------------------------------------------------------------------------- */

/* Where a row goes: out (q_out or k_out) in the input dtype, and a cache row in the input dtype or
 * f8 (stored = f8(x * inv)). */
struct Dst {
    unsigned char *out, *cache; /* nullptr: not written */
    int f8;                     /* the cache row is f8 */
    CacheId ci;                 /* the cache (its inv in ApParams.cache) */
};

/* lmk.h's f8 factor: x * inv rounded once to f32 (__fmul_rn: never contracted into an fma), the
 * product the CPU and the reference round. */
__device__ __forceinline__ float f8_scaled(float x, const Cache &c)
{
    return __fmul_rn(x, c.inv);
}

/* lmk.h: stored = lmk_f32_to_f8e4m3(x * inv). A NaN goes in unscaled: GPU arithmetic returns the
 * canonical (positive) NaN, the host's keeps the operand's sign. */
__device__ __forceinline__ uint32_t f8_code(float x, const Cache &c)
{
    return lmk_f8e4m3_from_f32_bits(x != x ? __float_as_uint(x) : __float_as_uint(f8_scaled(x, c)));
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 890
/* The codes of x0 (low byte) and x1 (next byte) by lmk_f8e4m3_from_f32_bits, out of line: f8_pair's
 * path for a pair holding a NaN. */
__device__ __noinline__ uint32_t f8_pair_soft(float x0, float x1, const Cache &c)
{
    return f8_code(x0, c) | (f8_code(x1, c) << 8);
}
#endif

/* The codes of x0 (low byte) and x1: one hardware conversion on sm_89 and later, exact except for
 * a NaN, whose code has no sign there (callers rebuild a pair that held one with f8_pair); the
 * integer code before sm_89. */
__device__ __forceinline__ uint32_t f8_pair_fast(float x0, float x1, const Cache &c)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(f8_scaled(x1, c)), "f"(f8_scaled(x0, c)));
    return r;
#else
    return f8_code(x0, c) | (f8_code(x1, c) << 8);
#endif
}

/* The codes of x0 and x1. On sm_89 and later, cvt.rn.satfinite.e4m3x2.f32 converts both in one
 * instruction, nearest even, saturating to +-448 (infinities included) as lmk.h's rounding does;
 * its NaN is unsigned, so a pair holding a NaN takes the integer code. test_f8 compares the cache
 * write with lmk_f32_to_f8e4m3 on every f32 input (under LMK_TEST_QUICK, on the exponent fields
 * where the codes change, zeros and subnormals, infinities and NaNs). */
__device__ __forceinline__ uint32_t f8_pair(float x0, float x1, const Cache &c)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    return x0 == x0 && x1 == x1 ? f8_pair_fast(x0, x1, c) : f8_pair_soft(x0, x1, c);
#else
    return f8_pair_fast(x0, x1, c); /* the integer code, which keeps a NaN's sign */
#endif
}

/* One output unit, built two elements at a time so that few values are live at once: the words in
 * the dtype, for an f8 cache its VE codes, and whether a NaN went through a two-element conversion
 * (then the unit is built again with EXACT set: NaNs are rare, a branch per pair is not). */
template <int DT, int VE> struct Acc {
    Raw<VE * Elem<DT>::size> v;
    Raw<VE> q;
    bool nan;
};

/* Whether a unit built without EXACT must be built again: it held a NaN, and a 2-byte output or an
 * f8 code went through a hardware conversion (whose NaN has no sign). */
template <int DT, int VE, bool F8> __device__ __forceinline__ bool redo(const Acc<DT, VE> &o)
{
    return (Elem<DT>::size == 2 || F8) && VE > 1 && o.nan;
}

/* Puts values x0, x1 at elements e, e + 1 (e even; x1 ignored when VE == 1). F8: the row's cache is
 * f8 (the caller branches once per row, so the common path carries no f8 code). */
template <int DT, int VE, bool F8, bool EXACT>
__device__ __forceinline__ void acc2(const ApParams &p, const Dst &d, Acc<DT, VE> &o, int e, float x0, float x1)
{
    if constexpr (Elem<DT>::size == 4) {
        o.v.w[e] = __float_as_uint(x0);
        if constexpr (VE > 1)
            o.v.w[e + 1] = __float_as_uint(x1);
    } else if constexpr (VE == 1) {
        o.v.w[0] = Elem<DT>::narrow(x0);
    } else if constexpr (EXACT) {
        o.v.w[e >> 1] = Elem<DT>::narrow(x0) | (Elem<DT>::narrow(x1) << 16);
    } else {
        o.v.w[e >> 1] = Elem<DT>::cvt2(x0, x1);
        o.nan = o.nan || !(x0 == x0 && x1 == x1); /* one unordered compare per pair */
    }
    if constexpr (F8) {
        const Cache &c = p.cache[d.ci];
        if constexpr (VE == 1) {
            o.q.w[0] = f8_pair(x0, x0, c) & 0xffu;
        } else {
            /* without EXACT the pair's NaN test is the one above (2-byte types) or here (f32), and
             * a NaN rebuilds the unit with EXACT, where f8_pair takes the integer code */
            if constexpr (Elem<DT>::size == 4 && !EXACT)
                o.nan = o.nan || !(x0 == x0 && x1 == x1);
            const uint32_t q = (EXACT ? f8_pair(x0, x1, c) : f8_pair_fast(x0, x1, c)) << (8 * (e & 3));
            o.q.w[e >> 2] = (e & 3) ? o.q.w[e >> 2] | q : q; /* e even: both codes in one word */
        }
    }
}

/* Stores an output unit at element off of the row's destinations. */
template <int DT, int VE, bool F8> __device__ __forceinline__ void put(const Dst &d, uint32_t off, const Acc<DT, VE> &o)
{
    constexpr int ES = Elem<DT>::size;
    if (d.out)
        store<VE * ES>(d.out + (size_t)off * ES, o.v);
    if (d.cache) {
        if constexpr (F8)
            store<VE>(d.cache + off, o.q);
        else
            store<VE * ES>(d.cache + (size_t)off * ES, o.v);
    }
}

/* The f8 codes of a raw unit holding a NaN (out of line, as the other EXACT rebuilds below). */
template <int DT, int VE, bool F8>
__device__ __noinline__ Acc<DT, VE> raw_codes_exact(const ApParams &p, const Dst d, const Raw<VE * Elem<DT>::size> r)
{
    Acc<DT, VE> o{};
#pragma unroll
    for (int e = 0; e < VE; e += 2)
        acc2<DT, VE, F8, true>(p, d, o, e, elem<DT, VE>(r, e),
                                 VE > 1 ? elem<DT, VE>(r, e + 1 < VE ? e + 1 : e) : 0.0f);
    return o;
}

/* The same for a unit copied without a norm: the input's own words (bit-exact), or f8 codes of its
 * values. */
template <int DT, int VE, bool F8>
__device__ __forceinline__ void put_raw(const ApParams &p, const Dst &d, uint32_t off, const Raw<VE * Elem<DT>::size> &r)
{
    constexpr int ES = Elem<DT>::size;
    if (d.out)
        store<VE * ES>(d.out + (size_t)off * ES, r);
    if constexpr (F8) {
        if (d.cache) {
            Acc<DT, VE> o{};
#pragma unroll
            for (int e = 0; e < VE; e += 2) /* only the f8 codes are used */
                acc2<DT, VE, F8, false>(p, d, o, e, elem<DT, VE>(r, e),
                                          VE > 1 ? elem<DT, VE>(r, e + 1 < VE ? e + 1 : e) : 0.0f);
            if (redo<DT, VE, F8>(o))
                o = raw_codes_exact<DT, VE, F8>(p, d, r);
            store<VE>(d.cache + off, o.q);
        }
    } else if (d.cache) {
        store<VE * ES>(d.cache + (size_t)off * ES, r);
    }
}

/* The angle factor (ff = 1) and axis of a pair past the host's table: rope_math.h's rules on the
 * device (pow is an out-of-line call; kept out of the kernel's main line). Returned by value: an
 * axis passed back through a pointer put it in local memory on every thread's path. */
struct FarFreq {
    double freq;
    uint32_t axis;
};

__device__ __noinline__ FarFreq far_freq(const AnglePlan &a, uint32_t i)
{
    uint32_t j;
    const uint32_t axis = (uint32_t)lmk_rope_axis_j(a.mode, a.sections, i, &j);
    return FarFreq{lmk_rope_freq(a.freq_base, a.exp_n, a.freq_scale, a.ext_factor, a.ramp_low, a.ramp_high, i, j, 1.0),
                   axis};
}

/* (cos, sin)(theta) times m. */
__device__ __forceinline__ float2 scaled_cs(const AnglePlan &a, double theta)
{
    const float2 cs = rope_cs(theta);
    return make_float2(cs.x * a.mscale, cs.y * a.mscale);
}

/* The (cos, sin) of pair i at token t, times m. The freq_factor is loaded before the position: the
 * other order, with the decode fill calling fill_angles, made a decode call slower
 * (docs/decisions.md). */
__device__ __forceinline__ float2 angle_cs(const AnglePlan &a, uint64_t t, uint32_t i)
{
    double freq;
    uint32_t axis;
    if (i < kTabPairs) {
        freq = a.freq[i], axis = a.axis[i];
    } else {
        const FarFreq ff = far_freq(a, i);
        freq = ff.freq, axis = ff.axis;
    }
    if (a.ff)
        freq = freq / (double)__ldg(a.ff + i);
    return scaled_cs(a, lmk_rope_pos(a.pos, a.pos_dtype, (uint64_t)axis * a.pos_axis_stride + t) * freq);
}

/* Two weights (w + weight_offset) from shared memory at element off (even), or one. */
template <int VE> __device__ __forceinline__ float2 load_w2(const float *w, uint32_t off)
{
    if constexpr (VE == 1)
        return make_float2(w[off], 0.0f);
    else
        return *reinterpret_cast<const float2 *>(w + off);
}

__device__ __forceinline__ float widen_any(int dt, const void *p, uint32_t i)
{
    if (dt == LMK_F32)
        return __ldg(reinterpret_cast<const float *>(p) + i);
    const unsigned short h = __ldg(reinterpret_cast<const unsigned short *>(p) + i);
    return dt == LMK_BF16 ? __uint_as_float((uint32_t)h << 16) : __half2float(__ushort_as_half(h));
}

/* ---------------------------------------------------------------------------------------------
 * Rows, tasks and the block.
 * ------------------------------------------------------------------------------------------- */

/* What a block's rows share, in shared memory: the (cos, sin) of each (token of the tile, pair),
 * the weights (q at w, k at w + D) and the tile's slots. */
struct Shared {
    float2 *cs;
    float *w;
    int64_t *slot;
};

/* The tables of prologue_kernel and prologue_decode_kernel in their dynamic shared memory. */
__device__ __forceinline__ Shared block_shared(const Plan &pl, float4 *smem)
{
    return Shared{reinterpret_cast<float2 *>(smem), reinterpret_cast<float *>(smem) + pl.w_at,
                  reinterpret_cast<int64_t *>(reinterpret_cast<unsigned char *>(smem) + pl.slot_at)};
}

/* The block's tile and row group. */
struct Block {
    uint64_t t0;  /* first token */
    uint32_t tt;  /* tokens of the tile (the last tile may be short) */
    uint32_t r_lo, nr;
};

/* Task k of the block: token t0 + tl, row r (q rows, then k, then v). False past the block's rows. */
__device__ __forceinline__ bool task_of(const ApParams &p, const Block &bk, uint32_t k, uint32_t *tl, uint32_t *r)
{
    const uint32_t t = (k * p.pl.magic) >> kMagicShift, rr = k - t * p.pl.rpg;
    if (k >= p.pl.tile * p.pl.rpg || t >= bk.tt || rr >= bk.nr)
        return false;
    *tl = t, *r = bk.r_lo + rr;
    return true;
}

/* Row r's kind and head: q rows, then k, then v. */
__device__ __forceinline__ RowKind kind_of(const ApParams &p, uint32_t r, uint32_t *h)
{
    if (r < p.hq)
        return *h = r, ROW_Q;
    if (r < p.hq + p.hk)
        return *h = r - p.hq, ROW_K;
    return *h = r - p.hq - p.hk, ROW_V;
}

/* The row has a norm (q and k rows with their weights; v rows never). */
__device__ __forceinline__ bool has_norm(const ApParams &p, RowKind kind)
{
    return kind == ROW_Q ? p.q_w != nullptr : kind == ROW_K && p.k_w != nullptr;
}

__device__ __forceinline__ const unsigned char *row_in(const ApParams &p, RowKind kind, uint64_t t, uint32_t h)
{
    const Tensor &x = kind == ROW_Q ? p.q_in : kind == ROW_K ? p.k_in : p.v_in;
    return x.p + t * x.tok + (uint64_t)h * x.head;
}

/* A thread's row of a block of the plan (live: the team has one). */
struct RowTask {
    const unsigned char *in;
    uint32_t tl, h;
    RowKind kind;
    bool live;
};

__device__ __forceinline__ RowTask row_task(const ApParams &p, const Block &bk, uint32_t team)
{
    RowTask t{};
    uint32_t r = 0;
    t.live = task_of(p, bk, team, &t.tl, &r);
    t.kind = kind_of(p, r, &t.h);
    t.in = row_in(p, t.kind, bk.t0 + t.tl, t.h);
    return t;
}

/* Element offset of copy unit c. */
__device__ __forceinline__ uint32_t copy_at(const Kind &g, uint32_t c, uint32_t ve)
{
    return (c < g.nc1 ? g.c1 : g.c2) + c * ve;
}

/* Where item `item` of a row keeps its two units (element offsets oa, ob) and whether it has each:
 * a pair item's a at item * ustep and b pstride on (NORMAL's whole pairs: a only); a copy item's
 * copy units c and c + nch (c = item - npu; the second only when c + nch < nc); nothing past the
 * row's items. */
struct ItemUnits {
    uint32_t oa, ob;
    bool ha, hb;
};

template <int VE>
__device__ __forceinline__ ItemUnits item_units(const ApParams &p, const Kind &g, uint32_t item)
{
    ItemUnits u{0, 0, false, false};
    if (item < g.npu) {
        u.oa = item * p.ustep, u.ob = u.oa + p.pstride;
        u.ha = true, u.hb = !p.il;
    } else if (item < g.items) {
        const uint32_t c = item - g.npu;
        u.oa = copy_at(g, c, VE), u.ob = copy_at(g, c + g.nch, VE);
        u.ha = true, u.hb = c + g.nch < g.nc;
    }
    return u;
}

/* Loads the items base + u*L (u < U) of a row into a, b (zero where there is none). */
template <int ES, int VE, int U>
__device__ __forceinline__ void load_items(const ApParams &p, const Kind &g, const unsigned char *in, uint32_t base,
                                           uint32_t L, Raw<VE * ES> (&a)[U], Raw<VE * ES> (&b)[U])
{
#pragma unroll
    for (int u = 0; u < U; u++) {
        const ItemUnits iu = item_units<VE>(p, g, base + u * L);
        a[u] = Raw<VE * ES>{}, b[u] = Raw<VE * ES>{};
        if (iu.ha)
            a[u] = load<VE * ES>(in + (size_t)iu.oa * ES);
        if (iu.hb)
            b[u] = load<VE * ES>(in + (size_t)iu.ob * ES);
    }
}

/* The lane's sum of squares: one partial sum per unit (short dependency chains), added pairwise. */
template <int DT, int VE, int U>
__device__ __forceinline__ float sum_sq(const Raw<VE * Elem<DT>::size> (&a)[U], const Raw<VE * Elem<DT>::size> (&b)[U])
{
    float s[2 * U];
#pragma unroll
    for (int u = 0; u < U; u++) {
        s[2 * u] = s[2 * u + 1] = 0.0f;
#pragma unroll
        for (int e = 0; e < VE; e++) {
            const float x = elem<DT, VE>(a[u], e), y = elem<DT, VE>(b[u], e);
            s[2 * u] = fmaf(x, x, s[2 * u]);
            s[2 * u + 1] = fmaf(y, y, s[2 * u + 1]);
        }
    }
#pragma unroll
    for (int n = 1; n < 2 * U; n *= 2)
#pragma unroll
        for (int i = 0; i + n < 2 * U; i += 2 * n)
            s[i] += s[i + n];
    return s[0];
}

/* Elements e, e + 1 of a unit at element off, normed (W: the row has a norm; the widened input
 * without). */
template <int DT, int VE, bool W>
__device__ __forceinline__ float2 normed2(const Raw<VE * Elem<DT>::size> &r, int e, const float *w, float rn,
                                          uint32_t off)
{
    float2 x = make_float2(elem<DT, VE>(r, e), VE > 1 ? elem<DT, VE>(r, e + 1 < VE ? e + 1 : e) : 0.0f);
    if constexpr (W) {
        const float2 wv = load_w2<VE>(w, off + e);
        x.x = x.x * rn * wv.x, x.y = x.y * rn * wv.y;
    }
    return x;
}

/* The outputs of a half-split pair item: a holds the a halves of VE pairs at element off, b their b
 * halves at off + pstride; table entries item * VE on. */
template <int DT, int VE, bool F8, bool W, bool EXACT>
__device__ __forceinline__ void rotate_half(const ApParams &p, const Dst &d, const float *w, float rn,
                                            const float2 *cs, uint32_t item, uint32_t off,
                                            const Raw<VE * Elem<DT>::size> &a, const Raw<VE * Elem<DT>::size> &b,
                                            Acc<DT, VE> &oa, Acc<DT, VE> &ob)
{
#pragma unroll
    for (int e = 0; e < VE; e += 2) {
        const float2 xa = normed2<DT, VE, W>(a, e, w, rn, off), xb = normed2<DT, VE, W>(b, e, w, rn, off + p.pstride);
        float c0, s0, c1 = 0.0f, s1 = 0.0f;
        if constexpr (VE == 1) {
            const float2 q = cs[item];
            c0 = q.x, s0 = q.y;
        } else { /* two pairs per 16-byte load: item * VE + e is even */
            const float4 q = *reinterpret_cast<const float4 *>(cs + item * VE + e);
            c0 = q.x, s0 = q.y, c1 = q.z, s1 = q.w;
        }
        const float2 r0 = rotate2(xa.x, xb.x, c0, s0), r1 = rotate2(xa.y, xb.y, c1, s1);
        acc2<DT, VE, F8, EXACT>(p, d, oa, e, r0.x, r1.x);
        acc2<DT, VE, F8, EXACT>(p, d, ob, e, r0.y, r1.y);
    }
}

/* The outputs of an interleaved pair item: a holds VE/2 whole pairs; table entries item * VE/2 on. */
template <int DT, int VE, bool F8, bool W, bool EXACT>
__device__ __forceinline__ void rotate_il(const ApParams &p, const Dst &d, const float *w, float rn, const float2 *cs,
                                          uint32_t item, uint32_t off, const Raw<VE * Elem<DT>::size> &a,
                                          Acc<DT, VE> &o)
{
#pragma unroll
    for (int e = 0; e < VE; e += 2) {
        const float2 x = normed2<DT, VE, W>(a, e, w, rn, off), q = cs[item * (VE / 2) + e / 2];
        const float2 r = rotate2(x.x, x.y, q.x, q.y);
        acc2<DT, VE, F8, EXACT>(p, d, o, e, r.x, r.y);
    }
}

/* The redo of a unit that held a NaN (lmk's own narrowing, EXACT), out of line so that the code
 * every unit runs stays small (at decode every instruction is fetched cold). Everything goes by
 * value: an address of a local passed to a call would put that local in memory on every path. */
template <int DT, int VE> struct AccPair {
    Acc<DT, VE> a, b;
};

template <int DT, int VE, bool F8, bool W>
__device__ __noinline__ Acc<DT, VE> rotate_il_exact(const ApParams &p, const Dst d, const float *w, float rn,
                                                    const float2 *cs, uint32_t item, uint32_t off,
                                                    const Raw<VE * Elem<DT>::size> a)
{
    Acc<DT, VE> o{};
    rotate_il<DT, VE, F8, W, true>(p, d, w, rn, cs, item, off, a, o);
    return o;
}

template <int DT, int VE, bool F8, bool W>
__device__ __noinline__ AccPair<DT, VE> rotate_half_exact(const ApParams &p, const Dst d, const float *w, float rn,
                                                          const float2 *cs, uint32_t item, uint32_t off,
                                                          const Raw<VE * Elem<DT>::size> a,
                                                          const Raw<VE * Elem<DT>::size> b)
{
    AccPair<DT, VE> o{};
    rotate_half<DT, VE, F8, W, true>(p, d, w, rn, cs, item, off, a, b, o.a, o.b);
    return o;
}

/* A pair item (element off = item * ustep): rotates and stores. */
template <int DT, int VE, bool F8, bool W>
__device__ __forceinline__ void emit_pair(const ApParams &p, const Dst &d, const float *w, float rn, const float2 *cs,
                                          uint32_t item, const Raw<VE * Elem<DT>::size> &a,
                                          const Raw<VE * Elem<DT>::size> &b)
{
    const uint32_t off = item * p.ustep;
    if constexpr (VE >= 2) {
        if (p.il) {
            Acc<DT, VE> o{};
            rotate_il<DT, VE, F8, W, false>(p, d, w, rn, cs, item, off, a, o);
            if (redo<DT, VE, F8>(o))
                o = rotate_il_exact<DT, VE, F8, W>(p, d, w, rn, cs, item, off, a);
            put<DT, VE, F8>(d, off, o);
            return;
        }
    }
    Acc<DT, VE> oa{}, ob{};
    rotate_half<DT, VE, F8, W, false>(p, d, w, rn, cs, item, off, a, b, oa, ob);
    if (redo<DT, VE, F8>(oa) || redo<DT, VE, F8>(ob)) {
        const AccPair<DT, VE> o = rotate_half_exact<DT, VE, F8, W>(p, d, w, rn, cs, item, off, a, b);
        oa = o.a, ob = o.b;
    }
    put<DT, VE, F8>(d, off, oa);
    put<DT, VE, F8>(d, off + p.pstride, ob);
}

/* One copied unit at element off, normed. */
template <int DT, int VE, bool F8, bool EXACT>
__device__ __forceinline__ void norm_unit(const ApParams &p, const Dst &d, const float *w, float rn, uint32_t off,
                                          const Raw<VE * Elem<DT>::size> &a, Acc<DT, VE> &o)
{
#pragma unroll
    for (int e = 0; e < VE; e += 2) {
        const float2 x = normed2<DT, VE, true>(a, e, w, rn, off);
        acc2<DT, VE, F8, EXACT>(p, d, o, e, x.x, x.y);
    }
}

template <int DT, int VE, bool F8>
__device__ __noinline__ Acc<DT, VE> norm_unit_exact(const ApParams &p, const Dst d, const float *w, float rn,
                                                    uint32_t off, const Raw<VE * Elem<DT>::size> a)
{
    Acc<DT, VE> o{};
    norm_unit<DT, VE, F8, true>(p, d, w, rn, off, a, o);
    return o;
}

template <int DT, int VE, bool F8>
__device__ __forceinline__ void emit_norm(const ApParams &p, const Dst &d, const float *w, float rn, uint32_t off,
                                          const Raw<VE * Elem<DT>::size> &a)
{
    Acc<DT, VE> o{};
    norm_unit<DT, VE, F8, false>(p, d, w, rn, off, a, o);
    if (redo<DT, VE, F8>(o))
        o = norm_unit_exact<DT, VE, F8>(p, d, w, rn, off, a);
    put<DT, VE, F8>(d, off, o);
}

/* A copy item: units c and c + nch (the second only when c + nch < nc), normed (W), or raw. */
template <int DT, int VE, bool F8, bool W>
__device__ __forceinline__ void emit_copy(const ApParams &p, const Kind &g, const Dst &d, const float *w, float rn,
                                          uint32_t c, const Raw<VE * Elem<DT>::size> &a,
                                          const Raw<VE * Elem<DT>::size> &b)
{
    const uint32_t o1 = copy_at(g, c, VE), o2 = copy_at(g, c + g.nch, VE);
    const bool two = c + g.nch < g.nc;
    if constexpr (W) {
        emit_norm<DT, VE, F8>(p, d, w, rn, o1, a);
        if (two)
            emit_norm<DT, VE, F8>(p, d, w, rn, o2, b);
    } else {
        put_raw<DT, VE, F8>(p, d, o1, a);
        if (two)
            put_raw<DT, VE, F8>(p, d, o2, b);
    }
}

/* What a row's destinations need before its slot is known (parameters only): its output row, and
 * its head's place in the cache with the cache's row stride and rows. */
struct DstBase {
    unsigned char *out, *cache; /* nullptr: not written */
    uint64_t tok, rows;
    int f8; /* Dst.f8 */
    CacheId ci;
};

__device__ __forceinline__ DstBase dst_base(const ApParams &p, RowKind kind, uint64_t t, uint32_t h)
{
    const CacheId ci = kind == ROW_V ? V_CACHE : K_CACHE;
    const Cache &c = p.cache[ci];
    const Tensor &o = kind == ROW_Q ? p.q_out : p.k_out;
    DstBase b{nullptr, nullptr, c.t.tok, c.rows, c.f8, ci};
    if (kind != ROW_V && o.p)
        b.out = o.p + t * o.tok + (uint64_t)h * o.head;
    if (kind != ROW_Q && c.t.p)
        b.cache = c.t.p + (uint64_t)h * c.t.head;
    return b;
}

/* The destinations once the row's slot is in shared memory (read only where there is a cache): a
 * negative or out-of-range slot writes no cache row. */
__device__ __forceinline__ Dst dst_at(const DstBase &b, const int64_t *slot)
{
    Dst d{b.out, nullptr, 0, b.ci};
    if (b.cache) {
        const int64_t s = *slot;
        if (s >= 0 && (uint64_t)s < b.rows)
            d.cache = b.cache + (uint64_t)s * b.tok, d.f8 = b.f8;
    }
    return d;
}

/* The destinations of row (kind, h) of token t (block-local tl). */
__device__ __forceinline__ Dst dst_of(const ApParams &p, const Shared &sh, RowKind kind, uint64_t t, uint32_t tl,
                                      uint32_t h)
{
    return dst_at(dst_base(p, kind, t, h), sh.slot + tl);
}

/* An item of a row with both pair and copy items, by emit_pair's or emit_copy's code (out of line:
 * emit_mixed's path for a unit that held a NaN). */
template <int DT, int VE, bool F8, bool W>
__device__ __noinline__ void emit_item_apart(const ApParams &p, const Kind &g, const Dst d, const float *w, float rn,
                                             const float2 *cs, uint32_t item, const Raw<VE * Elem<DT>::size> a,
                                             const Raw<VE * Elem<DT>::size> b)
{
    if (item < g.npu)
        emit_pair<DT, VE, F8, W>(p, d, w, rn, cs, item, a, b);
    else
        emit_copy<DT, VE, F8, W>(p, g, d, w, rn, item - g.npu, a, b);
}

/* Item `item` (< g.items) of a half-split row that has pair items and copy items (LaunchPlan.mix), in
 * one code path for both, so that a team whose first lanes hold pairs and the rest copies does not
 * run emit_pair and emit_copy one after the other: every lane forms the rotation of its two units
 * (a copy lane with the table's first entries) and keeps it where it holds a pair, its normed (W)
 * or raw values where it holds copies. The values, words and codes are emit_pair's and
 * emit_copy's: the same arithmetic in the same order, a copy without a norm its input's own words;
 * a unit that held a NaN goes to emit_item_apart. */
template <int DT, int VE, bool F8, bool W>
__device__ __forceinline__ void emit_mixed(const ApParams &p, const Kind &g, const Dst &d, const float *w, float rn,
                                           const float2 *cs, uint32_t item, const Raw<VE * Elem<DT>::size> &a,
                                           const Raw<VE * Elem<DT>::size> &b)
{
    const bool pair = item < g.npu;
    const ItemUnits iu = item_units<VE>(p, g, item);
    /* A copy item without a second unit (a row of an odd number of copy units) forms rb from b = 0
     * and drops it; its weights are read at oa, since iu.ob is past the row and, with the k
     * weights last in shared memory (no slot table), past the block's allocation. */
    const uint32_t oa = iu.oa, ob = iu.hb ? iu.ob : iu.oa;
    const float2 *q = cs + (pair ? item * VE : 0);
    Acc<DT, VE> ra{}, rb{};
#pragma unroll
    for (int e = 0; e < VE; e += 2) {
        const float2 xa = normed2<DT, VE, W>(a, e, w, rn, oa), xb = normed2<DT, VE, W>(b, e, w, rn, ob);
        const float4 t = *reinterpret_cast<const float4 *>(q + e); /* (c, s) of two pairs */
        const float2 r0 = rotate2(xa.x, xb.x, t.x, t.y), r1 = rotate2(xa.y, xb.y, t.z, t.w);
        acc2<DT, VE, F8, false>(p, d, ra, e, pair ? r0.x : xa.x, pair ? r1.x : xa.y);
        acc2<DT, VE, F8, false>(p, d, rb, e, pair ? r0.y : xb.x, pair ? r1.y : xb.y);
    }
    if constexpr (!W) { /* emit_copy's put_raw: the input's words, f8 codes of its values */
        if (!pair)
            ra.v = a, rb.v = b;
    }
    if (redo<DT, VE, F8>(ra) || redo<DT, VE, F8>(rb)) {
        emit_item_apart<DT, VE, F8, W>(p, g, d, w, rn, cs, item, a, b);
        return;
    }
    put<DT, VE, F8>(d, oa, ra);
    if (iu.hb) /* a pair item's b unit (MIX rows are half-split), or a copy item's second */
        put<DT, VE, F8>(d, ob, rb);
}

/* The outputs of the items base + u*L (u < U) of a row. (A loop over u, not U unrolled copies:
 * the f8 paths' code stays small, which the f8 cases gain more from than the others lose.) MIX: the
 * kernel's q/k rows have pair and copy items (half-split), which take emit_mixed; its v rows have
 * copy items only. */
template <int DT, int VE, int U, bool F8, bool W, bool MIX>
__device__ __forceinline__ void emit_items(const ApParams &p, const Kind &g, const Dst &d, const float *w, float rn,
                                           const float2 *cs, uint32_t base, uint32_t L,
                                           const Raw<VE * Elem<DT>::size> (&a)[U], const Raw<VE * Elem<DT>::size> (&b)[U])
{
#pragma unroll
    for (int u = 0; u < U; u++) {
        const uint32_t item = base + u * L;
        if constexpr (MIX && VE >= 2) {
            if (item < g.items) {
                if (g.npu)
                    emit_mixed<DT, VE, F8, W>(p, g, d, w, rn, cs, item, a[u], b[u]);
                else
                    emit_copy<DT, VE, F8, W>(p, g, d, w, rn, item, a[u], b[u]);
            }
        } else if (item < g.npu)
            emit_pair<DT, VE, F8, W>(p, d, w, rn, cs, item, a[u], b[u]);
        else if (item < g.items)
            emit_copy<DT, VE, F8, W>(p, g, d, w, rn, item - g.npu, a[u], b[u]);
    }
}

/* The sum of v over the team (L lanes, a power of two, aligned within the warp), by a butterfly:
 * every lane gets the same bits. All 32 lanes of the warp must call it. */
__device__ __forceinline__ float team_sum(float v, uint32_t L)
{
#pragma unroll
    for (uint32_t o = 16; o > 0; o >>= 1)
        if (o < L)
            v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* team_sum without a branch per step: every shuffle runs, the steps past the team add nothing (the
 * same additions in the same order, so the same bits). prologue_decode_kernel takes it without an
 * f8 cache, where the branches are a measurable part of a decode warp's chain; with one it is the
 * slower form, and that kernel keeps team_sum (docs/decisions.md). */
__device__ __forceinline__ float team_sum_flat(float v, uint32_t L)
{
#pragma unroll
    for (uint32_t o = 16; o > 0; o >>= 1) {
        const float t = __shfl_xor_sync(0xffffffffu, v, o);
        v = o < L ? v + t : v;
    }
    return v;
}

/* The outputs of a row of kind `kind` of token t0 + tl to d, whose chunk 0 is in a, b; rn from the
 * norm. CHUNK: a row may be longer than one chunk of L*U items; every chunk is loaded again here (the
 * same lane reads and writes each element, so in place still holds). F8: the call may have an f8
 * cache (without, the f8 paths are not compiled in). */
template <int DT, int VE, int U, bool CHUNK, bool F8 = true, bool MIX = false>
__device__ __forceinline__ void emit_row(const ApParams &p, const Shared &sh, const Dst &d, uint32_t tl, RowKind kind,
                                         const unsigned char *in, bool norm, float rn, uint32_t lane, uint32_t L,
                                         Raw<VE * Elem<DT>::size> (&a)[U], Raw<VE * Elem<DT>::size> (&b)[U])
{
    const float *w = sh.w + (kind == ROW_K ? p.D : 0); /* read only with a norm */
    const Kind &g = p.kind[items_of(kind)];
    const float2 *cs = sh.cs + (size_t)tl * p.half;
    const uint32_t chunks = CHUNK ? g.chunks : 1;
    for (uint32_t c = 0; c < chunks; c++) {
        const uint32_t base = lane + c * L * U;
        if (CHUNK && chunks > 1)
            load_items<Elem<DT>::size, VE, U>(p, g, in, base, L, a, b);
        /* one path per (f8 cache row or not, norm): each carries only its own code */
        if (F8 && d.f8 && norm)
            emit_items<DT, VE, U, true, true, MIX>(p, g, d, w, rn, cs, base, L, a, b);
        else if (F8 && d.f8)
            emit_items<DT, VE, U, true, false, MIX>(p, g, d, w, rn, cs, base, L, a, b);
        else if (norm)
            emit_items<DT, VE, U, false, true, MIX>(p, g, d, w, rn, cs, base, L, a, b);
        else
            emit_items<DT, VE, U, false, false, MIX>(p, g, d, w, rn, cs, base, L, a, b);
    }
}

/* Weights (w + weight_offset) a thread of the small-call fill loads one by one before the block's
 * angle arithmetic, where they cannot go in 16-byte units (plan_weight_units): all of them when
 * 2 * head_dim <= kWBatch * threads, the rest after. */
constexpr uint32_t kWBatch = 4;

/* Weight j's pointer (nullptr where that tensor has none), dtype and index: q's at [0, D), k's at
 * [D, 2D) of the shared table. */
__device__ __forceinline__ const void *weight_src(const ApParams &p, uint32_t j, int *dt, uint32_t *idx)
{
    const bool k = j >= p.D;
    *dt = k ? p.k_w_dt : p.q_w_dt;
    *idx = k ? j - p.D : j;
    return k ? p.k_w : p.q_w;
}

/* Weight j of the shared table, or 0 where that tensor has none. */
__device__ __forceinline__ float weight_at(const ApParams &p, uint32_t j)
{
    const bool k = j >= p.D;
    const void *w = k ? p.k_w : p.q_w;
    return w ? widen_any(k ? p.k_w_dt : p.q_w_dt, w, k ? j - p.D : j) + p.w_off : 0.0f;
}

/* A weight's raw bits widened to f32: f32 bits, or a bf16/f16 value in the low half; by selects,
 * not a branch on the dtype (a branch compiles to a jump table per weight). */
__device__ __forceinline__ float widen_bits(int dt, uint32_t v)
{
    const float h = __half2float(__ushort_as_half((unsigned short)v));
    const float x = __uint_as_float(dt == LMK_F32 ? v : v << 16);
    return dt == LMK_F16 ? h : x;
}

__device__ __forceinline__ int64_t slot_at(const ApParams &p, uint64_t t)
{
    return p.slot_i64 ? __ldg(reinterpret_cast<const long long *>(p.slots) + t)
                      : (int64_t)__ldg(reinterpret_cast<const int32_t *>(p.slots) + t);
}

/* The (cos, sin) of each (token of the tile, pair), when the block has q or k rows: entries
 * threadIdx.x, threadIdx.x + blockDim.x, ..., the first skipped when skip_first (formed elsewhere).
 * (Starting the loop one entry later instead cost the stream kernel a spill.) */
__device__ __forceinline__ void fill_angles(const ApParams &p, const Block &bk, float2 *cs, bool skip_first)
{
    if (bk.r_lo < p.hq + p.hk) { /* v rows only: no angle */
        const uint32_t n = bk.tt * p.half;
        for (uint32_t j = threadIdx.x; j < n; j += blockDim.x) {
            const uint32_t tl = j / p.half;
            if (!skip_first || j != threadIdx.x)
                cs[j] = angle_cs(p.a, bk.t0 + tl, j - tl * p.half);
        }
    }
}

/* The norm weights as f32 (w + weight_offset): q's at w, k's at w + D. */
__device__ __forceinline__ void fill_weights(const ApParams &p, float *w)
{
    if (p.q_w || p.k_w)
        for (uint32_t j = threadIdx.x; j < 2 * p.D; j += blockDim.x)
            if (j < p.D ? p.q_w != nullptr : p.k_w != nullptr)
                w[j] = weight_at(p, j);
}

/* The tile's slots. */
__device__ __forceinline__ void fill_slots(const ApParams &p, const Block &bk, int64_t *slot)
{
    if (p.slots)
        for (uint32_t j = threadIdx.x; j < bk.tt; j += blockDim.x)
            slot[j] = slot_at(p, bk.t0 + j);
}

/* Fills shared memory for the block's rows: the angles and weights (when it has q or k rows), the
 * tile's slots, one table after the other (prefill: many blocks per SM hide the round trips). */
__device__ void fill_shared(const ApParams &p, const Block &bk, const Shared &sh)
{
    fill_angles(p, bk, sh.cs, false);
    if (bk.r_lo < p.hq + p.hk)
        fill_weights(p, sh.w);
    fill_slots(p, bk, sh.slot);
}

/* The same at decode (Plan.batch_fill), in three steps so that every global load a thread makes
 * for the tables is in flight before any is used. A small call is a few warps per SM, each a serial
 * chain: a load whose value is converted where it is loaded (a slot's sign extension, a weight's
 * widening, a position's conversion to float64) stalls the thread there, once per table if the
 * fill converted where it loads. fill_plan takes only the parameters (it runs before pdl_enter): the
 * thread's first (token, pair) entry j = threadIdx.x, its angle factor from the host's table (a
 * constant-bank read at a per-thread index, which the hardware serialises across the warp) and its
 * position's index. fill_issue loads raw words: the position, the freq_factor, the slot and the
 * thread's 16-byte unit of the weights (plan_weight_units; else up to kWBatch weights one by one).
 * fill_finish converts them, forms the angle (the arithmetic of angle_cs: the same bits) and
 * stores the tables; entries past the first (a tile of more tokens than threads per pair) and
 * weights past the first unit (or past kWBatch) go the plain way. */
struct FillPlan {
    double freq;     /* the entry's angle factor before the freq_factor */
    uint64_t pos_at; /* its position's index */
    uint32_t i;      /* its pair */
    uint32_t n, nw;  /* table entries (tile tokens x pairs, 0 without q/k rows) and weights */
};

struct FillRaw {
    unsigned long long pos, slot; /* raw: 32-bit values in the low word */
    uint32_t ff;
    uint32_t w[kWBatch]; /* f32 bits, or a 2-byte weight in the low half */
    uint4 wu;            /* with 16-byte weight units (Plan.wq_u, wk_u): the thread's unit */
};

__device__ __forceinline__ FillPlan fill_plan(const ApParams &p, const Block &bk)
{
    FillPlan f{};
    const bool qk = bk.r_lo < p.hq + p.hk; /* v rows only: no angle, no weight */
    f.n = qk ? bk.tt * p.half : 0;
    f.nw = qk && (p.q_w || p.k_w) ? 2 * p.D : 0;
    if (threadIdx.x < f.n) {
        const uint32_t tl = threadIdx.x / p.half;
        uint32_t axis;
        f.i = threadIdx.x - tl * p.half;
        if (f.i < kTabPairs) {
            f.freq = p.a.freq[f.i], axis = p.a.axis[f.i];
        } else {
            const FarFreq ff = far_freq(p.a, f.i);
            f.freq = ff.freq, axis = ff.axis;
        }
        f.pos_at = (uint64_t)axis * p.a.pos_axis_stride + bk.t0 + tl;
    }
    return f;
}

/* 16-byte unit u of the weights (Plan.wq_u q units, then Plan.wk_u k units). The units go to the
 * block's last threads, the angles to its first, so that no warp does both where the block has
 * threads for both (with both on warp 0 the block's barrier waits for that warp). */
__device__ __forceinline__ uint4 weight_unit(const ApParams &p, uint32_t u)
{
    const bool k = u >= p.pl.wq_u;
    return __ldg(reinterpret_cast<const uint4 *>(k ? p.k_w : p.q_w) + (k ? u - p.pl.wq_u : u));
}

/* Unit u's weights + weight_offset into the shared table (4 of f32, 8 of a 2-byte dtype): the
 * values of weight_at, two or one 16-byte stores. */
__device__ __forceinline__ void put_weight_unit(const ApParams &p, const Shared &sh, uint32_t u, uint4 v)
{
    const bool k = u >= p.pl.wq_u;
    const uint32_t uu = k ? u - p.pl.wq_u : u;
    const int dt = k ? p.k_w_dt : p.q_w_dt;
    const float o = p.w_off;
    float4 *at = reinterpret_cast<float4 *>(sh.w + (k ? p.D : 0));
    if (dt == LMK_F32) {
        at[uu] = make_float4(__uint_as_float(v.x) + o, __uint_as_float(v.y) + o, __uint_as_float(v.z) + o,
                             __uint_as_float(v.w) + o);
        return;
    }
    const uint32_t wd[4] = {v.x, v.y, v.z, v.w};
    float x[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const uint32_t h = (wd[i / 2] >> (16 * (i & 1))) & 0xffffu;
        x[i] = (dt == LMK_BF16 ? __uint_as_float(h << 16) : __half2float(__ushort_as_half((unsigned short)h))) + o;
    }
    at[2 * uu] = make_float4(x[0], x[1], x[2], x[3]);
    at[2 * uu + 1] = make_float4(x[4], x[5], x[6], x[7]);
}

__device__ __forceinline__ FillRaw fill_issue(const ApParams &p, const Block &bk, const FillPlan &f)
{
    const uint32_t tid = threadIdx.x, bd = blockDim.x;
    FillRaw r{};
    if (tid < f.n) {
        if (p.a.pos_dtype == LMK_I64)
            r.pos = __ldg(reinterpret_cast<const unsigned long long *>(p.a.pos) + f.pos_at);
        else
            r.pos = __ldg(reinterpret_cast<const unsigned *>(p.a.pos) + f.pos_at);
        if (p.a.ff)
            r.ff = __ldg(reinterpret_cast<const unsigned *>(p.a.ff) + f.i);
    }
    if (p.slots && tid < bk.tt) { /* tt <= threads (plan_launch) */
        if (p.slot_i64)
            r.slot = __ldg(reinterpret_cast<const unsigned long long *>(p.slots) + bk.t0 + tid);
        else
            r.slot = __ldg(reinterpret_cast<const unsigned *>(p.slots) + bk.t0 + tid);
    }
    if (p.pl.wq_u + p.pl.wk_u) {
        const uint32_t nu = p.pl.wq_u + p.pl.wk_u, u0 = bd > nu ? bd - nu : 0;
        if (f.nw && tid >= u0 && tid - u0 < nu)
            r.wu = weight_unit(p, tid - u0);
        return r;
    }
#pragma unroll
    for (uint32_t b = 0; b < kWBatch; b++) {
        int dt;
        uint32_t idx;
        const void *w = weight_src(p, tid + b * bd, &dt, &idx);
        if (tid + b * bd < f.nw && w) { /* a load of either width at one address: no branch */
            const unsigned char *at =
                reinterpret_cast<const unsigned char *>(w) + (size_t)idx * (dt == LMK_F32 ? 4 : 2);
            r.w[b] = dt == LMK_F32 ? __ldg(reinterpret_cast<const unsigned *>(at))
                                   : __ldg(reinterpret_cast<const unsigned short *>(at));
        }
    }
    return r;
}

/* fill_finish's weights without 16-byte units: kWBatch loaded by fill_issue, the rest here. */
__device__ __forceinline__ void put_weights_by_element(const ApParams &p, const Shared &sh, const FillPlan &f,
                                                       const FillRaw &r)
{
    const uint32_t tid = threadIdx.x, bd = blockDim.x;
#pragma unroll
    for (uint32_t b = 0; b < kWBatch; b++) {
        int dt;
        uint32_t idx;
        const void *w = weight_src(p, tid + b * bd, &dt, &idx);
        if (tid + b * bd < f.nw) {
            const float x = widen_bits(dt, r.w[b]);
            sh.w[tid + b * bd] = w ? x + p.w_off : 0.0f;
        }
    }
    for (uint32_t j = tid + kWBatch * bd; j < f.nw; j += bd)
        sh.w[j] = weight_at(p, j);
}

__device__ __forceinline__ void fill_finish(const ApParams &p, const Block &bk, const Shared &sh, const FillPlan &f,
                                            const FillRaw &r)
{
    const uint32_t tid = threadIdx.x, bd = blockDim.x;
    if (tid < f.n) {
        double freq = f.freq;
        if (p.a.ff)
            freq = freq / (double)__uint_as_float(r.ff);
        const double pos = p.a.pos_dtype == LMK_I64 ? (double)(long long)r.pos : (double)(int32_t)(uint32_t)r.pos;
        sh.cs[tid] = scaled_cs(p.a, pos * freq);
    }
    for (uint32_t j = tid + bd; j < f.n; j += bd) {
        const uint32_t tl = j / p.half;
        sh.cs[j] = angle_cs(p.a, bk.t0 + tl, j - tl * p.half);
    }
    if (p.pl.wq_u + p.pl.wk_u) {
        const uint32_t nu = f.nw ? p.pl.wq_u + p.pl.wk_u : 0, u0 = bd > nu ? bd - nu : 0;
        if (tid >= u0 && tid - u0 < nu)
            put_weight_unit(p, sh, tid - u0, r.wu);
        for (uint32_t u = tid - u0 + bd; tid >= u0 && u < nu; u += bd)
            put_weight_unit(p, sh, u, weight_unit(p, u));
    } else {
        put_weights_by_element(p, sh, f, r);
    }
    if (p.slots && tid < bk.tt)
        sh.slot[tid] = p.slot_i64 ? (int64_t)r.slot : (int64_t)(int32_t)(uint32_t)r.slot;
}

/* Block blk of the plan: its tile of tokens (kernel_common.cuh's tile_group_at) and group of rows. */
__device__ __forceinline__ Block block_of(const ApParams &p, uint64_t blk)
{
    const Plan &pl = p.pl;
    const TileGroup tg = tile_group_at(blk, pl.groups, pl.tile, pl.seq);
    Block bk;
    bk.t0 = tg.t0;
    bk.tt = tg.tt;
    bk.r_lo = tg.group * pl.rpg;
    bk.nr = min(pl.rpg, p.rows - bk.r_lo);
    return bk;
}

/* The kernel. A block is (tile, group) of the plan, one task (row) per team: team j takes task j.
 * Each lane loads its items, then the block fills the shared tables while those loads are in
 * flight (the angle math and the weight and slot loads overlap a memory round trip), one barrier;
 * then the team's sum of squares (every lane of the warp shuffles, rows without a norm with 0: the
 * shuffles stay converged), and the outputs. */
template <int DT, int VE, int U, bool CHUNK>
__global__ void __launch_bounds__(kThreads, CHUNK ? 2 : 3) prologue_kernel(const __grid_constant__ ApParams p)
{
    constexpr int ES = Elem<DT>::size;
    extern __shared__ __align__(16) float4 smem[];
    const Plan &pl = p.pl;
    const uint64_t blk = (uint64_t)blockIdx.y * gridDim.x + blockIdx.x;
    if (blk >= pl.n_blocks)
        return;
    const Block bk = block_of(p, blk);
    const Shared sh = block_shared(pl, smem);
    const uint32_t L = 1u << pl.l_log2, lane = threadIdx.x & (L - 1u);
    const RowTask t = row_task(p, bk, threadIdx.x >> pl.l_log2);
    const Kind &g = p.kind[items_of(t.kind)];
    Raw<VE * ES> a[U], b[U];
    const FillPlan fp = pl.batch_fill ? fill_plan(p, bk) : FillPlan{};
    pdl_enter(); /* everything above is parameter arithmetic; every memory access is below */
    if (pl.batch_fill) {
        const FillRaw fr = fill_issue(p, bk, fp);
        if (t.live)
            load_items<ES, VE, U>(p, g, t.in, lane, L, a, b);
        fill_finish(p, bk, sh, fp, fr);
    } else {
        if (t.live)
            load_items<ES, VE, U>(p, g, t.in, lane, L, a, b);
        fill_shared(p, bk, sh);
    }
    __syncthreads();
    const bool norm = t.live && has_norm(p, t.kind);
    float ss = 0.0f;
    if (norm) {
        ss = sum_sq<DT, VE, U>(a, b);
        if constexpr (CHUNK)
            for (uint32_t c = 1; c < g.chunks; c++) {
                load_items<ES, VE, U>(p, g, t.in, lane + c * L * U, L, a, b);
                ss += sum_sq<DT, VE, U>(a, b);
            }
    }
    ss = team_sum(ss, L);
    if (t.live)
        emit_row<DT, VE, U, CHUNK>(p, sh, dst_of(p, sh, t.kind, bk.t0 + t.tl, t.tl, t.h), t.tl, t.kind, t.in, norm,
                                   rsqrtf(fmaf(ss, p.inv_d, p.eps)), lane, L, a, b);
}

/* The small-call kernel (LaunchPlan.decode: 16-byte units, at most 32 items a row, few rows a
 * call): prologue_kernel with one item a lane (L = the row's items rounded up to a power of two, so
 * no chunks and no second item), the batched fill, and the f8 paths compiled in only when the call
 * has an f8 cache. A decode call is a few blocks whose warps each run one serial chain (a Qwen3-8B
 * T = 1 call is 3 blocks of 4 warps), so its time is the length of that chain; prologue_kernel's
 * carries two items a lane, the chunk loop and every (f8, norm) path. */
template <int DT, int VE, bool F8, bool MIX>
__global__ void __launch_bounds__(kSpreadThreads) prologue_decode_kernel(const __grid_constant__ ApParams p)
{
    constexpr int ES = Elem<DT>::size;
    extern __shared__ __align__(16) float4 smem[];
    const Plan &pl = p.pl;
    const Block bk = block_of(p, blockIdx.x); /* plan_launch: n_blocks < 2^31 here */
    const Shared sh = block_shared(pl, smem);
    const uint32_t L = 1u << pl.l_log2, lane = threadIdx.x & (L - 1u);
    const RowTask t = row_task(p, bk, threadIdx.x >> pl.l_log2);
    const Kind &g = p.kind[items_of(t.kind)];
    const DstBase db = dst_base(p, t.kind, bk.t0 + t.tl, t.h); /* before the wait: parameters only */
    Raw<VE * ES> a[1], b[1];
    const FillPlan fp = fill_plan(p, bk);
    pdl_enter(); /* everything above is parameter arithmetic; every memory access is below */
    const FillRaw fr = fill_issue(p, bk, fp);
    if (t.live)
        load_items<ES, VE, 1>(p, g, t.in, lane, L, a, b);
    fill_finish(p, bk, sh, fp, fr);
    __syncthreads();
    const bool norm = t.live && has_norm(p, t.kind);
    float ss = norm ? sum_sq<DT, VE, 1>(a, b) : 0.0f;
    ss = F8 ? team_sum(ss, L) : team_sum_flat(ss, L);
    if (t.live)
        emit_row<DT, VE, 1, false, F8, MIX>(p, sh, dst_at(db, sh.slot + t.tl), t.tl, t.kind, t.in, norm,
                                            rsqrtf(fmaf(ss, p.inv_d, p.eps)), lane, L, a, b);
}

/* ---------------------------------------------------------------------------------------------
 * The prefill kernel with 16-byte units: a block streams its blocks of the plan through shared
 * memory.
 * ------------------------------------------------------------------------------------------- */

/* 16 bytes from global to shared memory without passing through registers (cp.async, sm_80 and
 * later; before, a load and a store), or 16 zero bytes when !present (nothing is read). fetch256:
 * a miss fills the 256 aligned bytes around it into L2 (Plan.fetch256). */
__device__ __forceinline__ void stage16(unsigned char *s, const unsigned char *g, bool present, bool fetch256)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const uint32_t sa = (uint32_t)__cvta_generic_to_shared(s), n = present ? 16 : 0;
    if (fetch256)
        asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(sa), "l"(g), "r"(n) : "memory");
    else
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sa), "l"(g), "r"(n) : "memory");
#else
    (void)fetch256;
    *reinterpret_cast<uint4 *>(s) = present ? __ldcs(reinterpret_cast<const uint4 *>(g)) : make_uint4(0, 0, 0, 0);
#endif
}

/* Closes the group of the copies issued since the last call. */
__device__ __forceinline__ void stage_commit()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

/* Copies the units of the lane's items base + u*L (u < U) into its staging area: unit 2u (a) and
 * 2u + 1 (b) of thread tid at ((2u + ab) * nthr + tid) * 16 bytes, consecutive threads at
 * consecutive 16-byte words (no bank conflict when read back). A unit the item lacks is zeros, as
 * load_items leaves it. */
template <int VE, int U>
__device__ __forceinline__ void stage_items(const ApParams &p, const Kind &g, const unsigned char *in, uint32_t base,
                                            uint32_t L, unsigned char *st)
{
    constexpr int ES = 16 / VE;
    const uint32_t tid = threadIdx.x, nthr = blockDim.x;
#pragma unroll
    for (int u = 0; u < U; u++) {
        const ItemUnits iu = item_units<VE>(p, g, base + u * L);
        stage16(st + ((2 * u) * nthr + tid) * 16, iu.ha ? in + (size_t)iu.oa * ES : in, iu.ha, p.pl.fetch256);
        stage16(st + ((2 * u + 1) * nthr + tid) * 16, iu.hb ? in + (size_t)iu.ob * ES : in, iu.hb, p.pl.fetch256);
    }
}

/* The lane's units back from its staging area (its own copies: no barrier needed for them). */
template <int U>
__device__ __forceinline__ void unstage_items(const unsigned char *st, Raw<16> (&a)[U], Raw<16> (&b)[U])
{
    const uint32_t tid = threadIdx.x, nthr = blockDim.x;
#pragma unroll
    for (int u = 0; u < U; u++) {
        const uint4 va = *reinterpret_cast<const uint4 *>(st + ((2 * u) * nthr + tid) * 16);
        const uint4 vb = *reinterpret_cast<const uint4 *>(st + ((2 * u + 1) * nthr + tid) * 16);
        a[u].w[0] = va.x, a[u].w[1] = va.y, a[u].w[2] = va.z, a[u].w[3] = va.w;
        b[u].w[0] = vb.x, b[u].w[1] = vb.y, b[u].w[2] = vb.z, b[u].w[3] = vb.w;
    }
}

/* Waits until every copy this thread issued has landed. */
__device__ __forceinline__ void stage_wait_all()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
#endif
}

/* What a thread of prologue_stream_kernel keeps from one of its blocks to the next. Its grid is a
 * multiple of the row groups (launch), so a CUDA block keeps its group of rows in every block of
 * the plan it takes and each team keeps its task; only the tile moves. The record holds the row's
 * head h and, packed in info: bits 0-7 the team's token of the tile, 8-9 the row's kind, 10 the
 * team has a row, 11-18 and 19-30 the (token, pair) of the thread's first (cos, sin) entry
 * (threadIdx.x / half, threadIdx.x % half), 31 that entry's angle factor is in the block's
 * PairTab (the block has q or k rows, the entry is in the tile and its pair < kTabPairs).
 * Thread-private, in shared memory: the kernel is at its register bound, and forming these again
 * each block (run-time divisions by the groups and by half, the task's division, the angle
 * factor and axis by constant loads at a per-thread index, which a warp serialises) would be a
 * large share of its instructions. Pointers are formed from h each block: records of pointers or
 * offsets (32 bytes a thread) cost more than they save, and pointers read from shared memory
 * compile to generic stores (docs/decisions.md). */
struct StreamRec {
    uint32_t info, h;
};

/* A pair's angle factor with its freq_factor applied (as angle_cs) and its position's offset in
 * the positions (axis * pos_axis_stride): pairs < min(half, kTabPairs), formed once a block. */
struct PairTab {
    double freq;
    uint64_t pos_off;
};
static_assert(sizeof(StreamRec) == 8 && sizeof(PairTab) == 16, "shared-memory records (plan_launch)");
/* StreamRec.info's fields: a token of the tile (tile <= teams <= kThreads) and threadIdx.x / half
 * in 8 bits, a pair (< half <= kMaxDim / 2) in 12 */
static_assert(kThreads <= 256 && kMaxDim / 2 <= 4096, "StreamRec.info's packing");

__device__ __forceinline__ uint32_t rec_tl(uint32_t info)
{
    return info & 0xffu;
}

__device__ __forceinline__ RowKind rec_kind(uint32_t info)
{
    return (RowKind)(info >> 8 & 3u);
}

__device__ __forceinline__ uint32_t rec_angle_tl(uint32_t info)
{
    return info >> 11 & 0xffu;
}

__device__ __forceinline__ uint32_t rec_pair(uint32_t info)
{
    return info >> 19 & 0xfffu;
}

/* The team has a row in a block whose tile has tt tokens. */
__device__ __forceinline__ bool rec_live(uint32_t info, uint32_t tt)
{
    return (info >> 10 & 1u) && rec_tl(info) < tt;
}

/* Thread threadIdx.x's record in a block of group `group` (parameters only). tile <= 256 and
 * threads <= 256 (plan_launch), so each place fits its bits. */
__device__ __forceinline__ StreamRec stream_rec(const ApParams &p, uint32_t group, uint32_t team)
{
    const Plan &pl = p.pl;
    const uint32_t r_lo = group * pl.rpg, nr = min(pl.rpg, p.rows - r_lo);
    const uint32_t tl = (team * pl.magic) >> kMagicShift, rr = team - tl * pl.rpg;
    const bool has = team < pl.tile * pl.rpg && rr < nr;
    uint32_t h = 0;
    const RowKind kind = kind_of(p, r_lo + rr, &h);
    StreamRec r{};
    r.h = has ? h : 0u;
    const uint32_t tid = threadIdx.x, atl = tid / p.half, i = tid - atl * p.half;
    const bool tab = r_lo < p.hq + p.hk && tid < pl.tile * p.half && i < kTabPairs;
    r.info = (has ? tl : 0u) | (uint32_t)kind << 8 | (has ? 1u : 0u) << 10;
    if (tid < pl.tile * p.half)
        r.info |= atl << 11 | i << 19 | (tab ? 1u : 0u) << 31;
    return r;
}

/* The block's PairTab (after pdl_enter: freq_factors is device memory): the values angle_cs forms. */
__device__ __forceinline__ void fill_pair_tab(const ApParams &p, PairTab *pt)
{
    const uint32_t n = min(p.half, kTabPairs);
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
        const double f = p.a.freq[i];
        pt[i] = PairTab{p.a.ff ? f / (double)__ldg(p.a.ff + i) : f, (uint64_t)p.a.axis[i] * p.a.pos_axis_stride};
    }
}

/* Block (tile ti, group) of the plan. */
__device__ __forceinline__ Block stream_block(const ApParams &p, uint64_t ti, uint32_t group)
{
    const Plan &pl = p.pl;
    Block bk;
    bk.t0 = ti * pl.tile;
    bk.tt = (uint32_t)min((uint64_t)pl.tile, pl.seq - bk.t0);
    bk.r_lo = group * pl.rpg;
    bk.nr = min(pl.rpg, p.rows - bk.r_lo);
    return bk;
}

/* The record's input row at token t. */
__device__ __forceinline__ const unsigned char *rec_in(const ApParams &p, const StreamRec *r, RowKind kind, uint64_t t)
{
    return row_in(p, kind, t, r->h);
}

/* The record's destinations at token t (dst_base's), its slot at *slot (dst_at's rule). */
__device__ __forceinline__ Dst rec_dst(const ApParams &p, const StreamRec *r, RowKind kind, uint64_t t,
                                       const int64_t *slot)
{
    return dst_at(dst_base(p, kind, t, r->h), slot);
}

/* Block bk's (cos, sin) table: fill_angles's entries, the thread's first one from its record and
 * the PairTab (the same arithmetic as angle_cs: the same bits), any further one (more entries than
 * threads) as fill_angles forms it; the first skipped when skip_first (formed from a staged
 * position). */
__device__ __forceinline__ void fill_angles_rec(const ApParams &p, const PairTab *pt, const Block &bk, uint32_t info,
                                                float2 *cs, bool skip_first)
{
    if (bk.r_lo < p.hq + p.hk) { /* v rows only: no angle */
        const uint32_t n = bk.tt * p.half, tid = threadIdx.x;
        if (!skip_first && tid < n) {
            const uint32_t tl = rec_angle_tl(info), i = rec_pair(info);
            cs[tid] = info >> 31 ? scaled_cs(p.a, lmk_rope_pos(p.a.pos, p.a.pos_dtype, pt[i].pos_off + bk.t0 + tl) *
                                                      pt[i].freq)
                                 : angle_cs(p.a, bk.t0 + tl, i);
        }
        for (uint32_t j = tid + blockDim.x; j < n; j += blockDim.x) {
            const uint32_t tl = j / p.half;
            cs[j] = angle_cs(p.a, bk.t0 + tl, j - tl * p.half);
        }
    }
}

/* Stages what thread tid's part of block bk's tables reads: the position of its first (token,
 * pair) when that pair is in the PairTab (into ps, 8 bytes; an i32 in the low 4), and for tid < tt
 * its token's slot (into ps + 8). Returns whether the position was staged. */
__device__ __forceinline__ bool stage_table_words(const ApParams &p, const PairTab *pt, const Block &bk,
                                                  uint32_t info, unsigned char *ps)
{
    const uint32_t tid = threadIdx.x;
    const bool pos = (info >> 31) && rec_angle_tl(info) < bk.tt;
    if (pos) {
        const uint64_t at = pt[rec_pair(info)].pos_off + bk.t0 + rec_angle_tl(info);
        const bool wide = p.a.pos_dtype == LMK_I64;
        stage_word(ps, static_cast<const unsigned char *>(p.a.pos) + at * (wide ? 8 : 4), wide, true);
    }
    if (p.slots && tid < bk.tt)
        stage_word(ps + 8, static_cast<const unsigned char *>(p.slots) + (bk.t0 + tid) * (p.slot_i64 ? 8 : 4),
                   p.slot_i64 != 0, true);
    return pos;
}

/* Block bk's (cos, sin) and slot tables (after the thread's copies landed): thread tid's first
 * angle from its staged position, any other entry by fill_angles_rec, its token's slot from its
 * staged word. */
__device__ __forceinline__ void fill_tables_staged(const ApParams &p, const PairTab *pt, const Block &bk,
                                                   uint32_t info, const unsigned char *ps, bool staged, float2 *cs,
                                                   int64_t *slot)
{
    const uint32_t tid = threadIdx.x;
    if (staged) {
        const double pos = p.a.pos_dtype == LMK_I64 ? (double)*reinterpret_cast<const int64_t *>(ps)
                                                    : (double)*reinterpret_cast<const int32_t *>(ps);
        cs[tid] = scaled_cs(p.a, pos * pt[rec_pair(info)].freq);
    }
    fill_angles_rec(p, pt, bk, info, cs, staged);
    if (p.slots && tid < bk.tt)
        slot[tid] = p.slot_i64 ? *reinterpret_cast<const int64_t *>(ps + 8)
                               : (int64_t)*reinterpret_cast<const int32_t *>(ps + 8);
}

/* The prefill kernel for 16-byte units without chunks (plan_launch's stream plan). The grid is at
 * most the blocks that fit on the GPU at once, rounded down to a multiple of the row groups
 * (launch); CUDA block b takes the plan's blocks b, b + gridDim.x, ..., all of one group, and at
 * the top of block i's iteration every thread issues cp.async copies of block i + 1's units into
 * its own staging area, so that a memory round trip stays in flight through block i's arithmetic
 * (prologue_kernel's blocks load, fill, wait, compute and exit: their loads are in flight only at
 * the start). A thread forms its StreamRec once, and the block its PairTab; each block of the plan
 * then costs a thread a few products of its token. The tables are formed one block ahead
 * (docs/cuda.md, "attn_prologue: the three kernels"): the thread also stages the position and slot
 * its part of block i + 1's tables reads; it computes block i from tables the previous iteration
 * formed, then waits for its copies (they had the whole computation to land), forms block i + 1's
 * (cos, sin) and slot tables, and the block meets at its one barrier: no load and no angle runs
 * between a barrier and the work behind it. The tables are double-buffered (iteration i writes one
 * block's tables while slower warps may still read the other's; the readers of the one it
 * overwrites are past the previous barrier); the staged units and words and the records are
 * thread-private; the weights and the PairTab are filled once. Per row the work is
 * prologue_kernel's: the same sums, the same outputs, the same bits. F8: the call has an f8 cache
 * (plan_launch); without one the rows are compiled without the f8 paths (about a third of the
 * code). */
template <int DT, int VE, int U, bool F8, bool MIX>
__global__ void __launch_bounds__(kThreads, 3) prologue_stream_kernel(const __grid_constant__ ApParams p)
{
    static_assert(VE * Elem<DT>::size == 16, "the staging copies are 16 bytes");
    extern __shared__ __align__(16) float4 smem[];
    const Plan &pl = p.pl;
    unsigned char *const sm = reinterpret_cast<unsigned char *>(smem);
    const uint32_t stage_b = 2 * U * blockDim.x * 16; /* bytes of one staging area */
    float *const w = reinterpret_cast<float *>(smem) + pl.w_at;
    unsigned char *const ps = sm + pl.words_at + threadIdx.x * 16; /* the thread's staged words */
    StreamRec *const rec = reinterpret_cast<StreamRec *>(sm + pl.rec_at) + threadIdx.x;
    PairTab *const pt = reinterpret_cast<PairTab *>(sm + pl.pairs_at);
    const uint32_t L = 1u << pl.l_log2, lane = threadIdx.x & (L - 1u);
    const uint32_t group = blockIdx.x % pl.groups, step = gridDim.x / pl.groups;
    uint64_t ti = blockIdx.x / pl.groups; /* the tile of the plan's block */
    *rec = stream_rec(p, group, threadIdx.x >> pl.l_log2);
    pdl_enter(); /* everything above is parameter arithmetic; every global memory access is below */
    {
        const Block bk = stream_block(p, ti, group);
        const uint32_t info = rec->info;
        if (rec_live(info, bk.tt)) {
            const RowKind kind = rec_kind(info);
            stage_items<VE, U>(p, p.kind[items_of(kind)], rec_in(p, rec, kind, bk.t0 + rec_tl(info)), lane, L,
                               sm + pl.stage_at);
        }
        fill_pair_tab(p, pt);
        fill_weights(p, w);
        __syncthreads(); /* the PairTab */
        const bool staged = stage_table_words(p, pt, bk, info, ps);
        stage_commit();
        stage_wait_all();
        fill_tables_staged(p, pt, bk, info, ps, staged, reinterpret_cast<float2 *>(smem),
                           reinterpret_cast<int64_t *>(sm + pl.slot_at));
        __syncthreads();
    }
    for (uint32_t s = 0;; s ^= 1) {
        const uint64_t nt = ti + step;
        const bool more = nt < pl.n_tiles;
        bool staged = false;
        if (more) {
            const Block nbk = stream_block(p, nt, group);
            const uint32_t info = rec->info;
            if (rec_live(info, nbk.tt)) {
                const RowKind kind = rec_kind(info);
                stage_items<VE, U>(p, p.kind[items_of(kind)], rec_in(p, rec, kind, nbk.t0 + rec_tl(info)), lane,
                                   L, sm + pl.stage_at + (s ^ 1) * stage_b);
            }
            staged = stage_table_words(p, pt, nbk, info, ps);
            stage_commit();
        }
        const Block bk = stream_block(p, ti, group);
        const uint32_t info = rec->info;
        const Shared sh{reinterpret_cast<float2 *>(smem) + (s ? pl.cs2_at : 0), w,
                        reinterpret_cast<int64_t *>(sm + (s ? pl.slot2_at : pl.slot_at))};
        const bool live = rec_live(info, bk.tt);
        const RowKind kind = rec_kind(info);
        const uint32_t tl = rec_tl(info);
        Raw<16> a[U], b[U];
        const bool norm = live && has_norm(p, kind);
        float ss = 0.0f;
        if (live) {
            unstage_items<U>(sm + pl.stage_at + s * stage_b, a, b);
            if (norm)
                ss = sum_sq<DT, VE, U>(a, b);
        }
        ss = team_sum(ss, L);
        if (live) /* the input row is read only by chunks, which this kernel has not */
            emit_row<DT, VE, U, false, F8, MIX>(p, sh, rec_dst(p, rec, kind, bk.t0 + tl, sh.slot + tl), tl,
                                                kind, nullptr, norm, rsqrtf(fmaf(ss, p.inv_d, p.eps)), lane, L,
                                                a, b);
        if (!more)
            break;
        stage_wait_all();
        fill_tables_staged(p, pt, stream_block(p, nt, group), info, ps, staged,
                           reinterpret_cast<float2 *>(smem) + (s ? 0 : pl.cs2_at),
                           reinterpret_cast<int64_t *>(sm + (s ? pl.slot_at : pl.slot2_at)));
        __syncthreads();
        ti = nt;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Launch: the variants table's rows (variants.h) as kernels, for each dtype.
 * ------------------------------------------------------------------------------------------- */

struct LaunchPlan {
    dim3 blocks, threads;
    size_t smem;
    bool pdl;    /* programmatic stream serialization (lmk_cuda_device.pdl; kernel_common.cuh) */
    bool stream; /* prologue_stream_kernel, on at most the blocks that fit the GPU at once */
    bool f8;     /* the call has an f8 cache */
    bool decode; /* prologue_decode_kernel (plan_team) */
    bool mix;    /* the MIX instantiation (emit_items; plan_launch) */
    int sm_count;
    lmk_ap_variant variant; /* the row launched (plan_variant) */
};

using ApKernel = void (*)(ApParams);

/* The kernel of a row of the table for dtype DT: its template arguments (variants.h) in the
 * kernel's terms. 16-byte units are VE = 16 / element size with U = 2 items a lane, one-element
 * units U = 4 (plan_team), the decode kernel's a lane per item. */
template <int DT, lmk_ap_kernel K, lmk_ap_units UN, bool F8, bool MIX, bool CHUNK> ApKernel kernel_of()
{
    constexpr int VE = UN == LMK_AP_U1 ? 1 : UN == LMK_AP_U4 ? (int)kDecodeF8Elems : 16 / Elem<DT>::size;
    if constexpr (K == LMK_AP_K_STREAM) {
        static_assert(UN == LMK_AP_U16 && !CHUNK, "the stream kernel stages 16-byte units, whole rows");
        return prologue_stream_kernel<DT, VE, kItems<16>, F8, MIX>;
    } else if constexpr (K == LMK_AP_K_DECODE) {
        static_assert(UN != LMK_AP_U1 && !CHUNK, "the decode kernel: a lane per 16-byte or 4-element unit");
        return prologue_decode_kernel<DT, VE, F8, MIX>;
    } else {
        static_assert(F8 && !MIX, "prologue_kernel carries the f8 paths and no MIX");
        return prologue_kernel<DT, VE, UN == LMK_AP_U1 ? kItems<Elem<DT>::size> : kItems<16>, CHUNK>;
    }
}

/* prologue_stream_kernel on the blocks that fit the GPU at once, rounded down to a multiple of the
 * row groups (n_blocks is one), so that each CUDA block keeps its group. */
cudaError_t start_stream(ApKernel k, const ApParams &p, const LaunchPlan &L, cudaStream_t st)
{
    int per_sm = 0;
    const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, (int)L.threads.x, L.smem);
    if (e != cudaSuccess)
        return e;
    uint64_t n = (uint64_t)(per_sm > 0 ? per_sm : 1) * (uint64_t)(L.sm_count > 0 ? L.sm_count : 1);
    n = n < p.pl.n_blocks ? n : p.pl.n_blocks;
    n = n < p.pl.groups ? p.pl.groups : n - n % p.pl.groups;
    return lmk_cuda_start(k, p, dim3((unsigned)n, 1, 1), L.threads, L.smem, st, L.pdl);
}

template <int DT, lmk_ap_kernel K, lmk_ap_units UN, bool F8, bool MIX, bool CHUNK>
cudaError_t launch_row(const ApParams &p, const LaunchPlan &L, cudaStream_t st)
{
    const ApKernel k = kernel_of<DT, K, UN, F8, MIX, CHUNK>();
    if constexpr (K == LMK_AP_K_STREAM)
        return start_stream(k, p, L, st);
    return lmk_cuda_start(k, p, L.blocks, L.threads, L.smem, st, L.pdl);
}

/* The launch of row L.variant: a switch over the table. */
template <int DT> cudaError_t launch_variant(const ApParams &p, const LaunchPlan &L, cudaStream_t st)
{
    switch (L.variant) {
#define AP_LAUNCH(id, name, kernel, units, f8, mix, chunk, reason, bench)                                             \
    case id:                                                                                                           \
        return launch_row<DT, kernel, units, f8, mix, chunk>(p, L, st);
        LMK_AP_VARIANTS(AP_LAUNCH)
#undef AP_LAUNCH
    case LMK_AP_N_VARIANTS:
        break;
    }
    return cudaErrorInvalidValue; /* plan_variant returns rows of the table only */
}

cudaError_t launch_dtype(lmk_dtype dt, const ApParams &p, const LaunchPlan &L, cudaStream_t st)
{
    switch (dt) {
    case LMK_F32:
        return launch_variant<LMK_F32>(p, L, st);
    case LMK_BF16:
        return launch_variant<LMK_BF16>(p, L, st);
    default:
        return launch_variant<LMK_F16>(p, L, st);
    }
}

/* Every row of the table is loaded (lmk_cuda_preload); the CHUNK ones (the only ones whose shared
 * memory can pass 48 KB: head_dim 4096 with a full rope, both norms and slots needs 48 KB + 8
 * bytes) may use up to kChunkSmem, set here once per device rather than in an op call. With f32
 * the U4 rows are the U16 rows' kernels, loaded twice (harmless). */
template <int DT> void preload_dtype(cudaError_t *first)
{
#define AP_PRELOAD(id, name, kernel, units, f8, mix, chunk, reason, bench)                                            \
    lmk_cuda_preload(kernel_of<DT, kernel, units, f8, mix, chunk>(), chunk ? kChunkSmem : 0, first);
    LMK_AP_VARIANTS(AP_PRELOAD)
#undef AP_PRELOAD
}

/* ---------------------------------------------------------------------------------------------
 * Planning (host): units, row kinds, teams, angles, launch.
 * ------------------------------------------------------------------------------------------- */

uint32_t pow2_ceil(uint64_t n)
{
    uint32_t v = 1;
    while (v < n && v < 0x80000000u)
        v <<= 1;
    return v;
}

/* Address bits of a tensor whose element size is es: base, and the byte strides of its axes that
 * are longer than 1 (the others never multiply a nonzero index). */
uint64_t tensor_bits(const void *base, uint64_t rows, uint64_t tok, uint64_t heads, uint64_t head, uint64_t es)
{
    return (uint64_t)(uintptr_t)base | (rows > 1 ? tok * es : 0) | (heads > 1 ? head * es : 0);
}

/* The unit plan: VE of 16 bytes when it divides head_dim, Dv and the layout's boundaries (rope_dim/2
 * and pair_stride half-split, rope_dim interleaved) and 16 bytes (an f8 cache: VE bytes) divide
 * every address and stride in play; else one element. */
uint32_t plan_units(const lmk_attn_prologue_args *a)
{
    const lmk_rope_args *r = &a->rope;
    const uint64_t es = r->dtype == LMK_F32 ? 4 : 2, T = r->seq_len, hk = r->t[1].n_heads;
    uint64_t bits = 0, bits8 = 0;
    for (int i = 0; i < 2; i++) {
        const lmk_rope_tensor *t = &r->t[i];
        bits |= tensor_bits(t->in, T, t->in_tok, t->n_heads, t->in_head, es);
        if (t->out)
            bits |= tensor_bits(t->out, T, t->out_tok, t->n_heads, t->out_head, es);
    }
    if (a->v_in.data)
        bits |= tensor_bits(a->v_in.data, T, a->v_in.tok, hk, a->v_in.head, es);
    const lmk_rows *caches[2] = {&a->k_cache, &a->v_cache};
    const uint64_t rows[2] = {a->k_slots, a->v_slots};
    for (int i = 0; i < 2; i++)
        if (caches[i]->data) {
            const bool f8 = caches[i]->dtype == LMK_F8E4M3;
            (f8 ? bits8 : bits) |= tensor_bits(caches[i]->data, rows[i], caches[i]->tok, hk, caches[i]->head, f8 ? 1 : es);
        }
    const uint32_t D = r->head_dim, R = r->rope_dim, half = R / 2, S = r->pair_stride;
    const uint32_t ve = (uint32_t)(16 / es);
    const bool layout = r->interleaved ? R % ve == 0 : half % ve == 0 && S % ve == 0;
    return layout && D % ve == 0 && (!a->v_in.data || a->v_dim % ve == 0) && (bits & (ve * es - 1)) == 0 &&
                   (bits8 & (ve - 1)) == 0
               ? ve
               : 1;
}

/* The items of q/k rows and of v rows for unit width ve; p->il, ustep, pstride. The untouched
 * ranges: interleaved [R, D); half-split with pair stride s and h pairs, [h, s) and [s + h, D). */
void plan_kinds(const lmk_attn_prologue_args *a, uint32_t ve, ApParams *p)
{
    const lmk_rope_args *r = &a->rope;
    const uint32_t D = r->head_dim, R = r->rope_dim, half = R / 2, s = r->pair_stride;
    Kind &g = p->kind[QK_ITEMS];
    p->il = r->interleaved && ve >= 2;
    if (r->interleaved) {
        g.npu = p->il ? R / ve : half;
        p->ustep = p->il ? ve : 2;
        p->pstride = p->il ? 0 : 1;
        g.nc1 = (D - R) / ve, g.c1 = R, g.c2 = R, g.nc = g.nc1;
    } else {
        g.npu = half / ve;
        p->ustep = ve;
        p->pstride = s;
        g.nc1 = (s - half) / ve, g.c1 = half, g.c2 = s + half - g.nc1 * ve;
        g.nc = g.nc1 + (D - s - half) / ve;
    }
    g.nch = (g.nc + 1) / 2, g.items = g.npu + g.nch;
    Kind &v = p->kind[V_ITEMS];
    v = Kind{};
    if (a->v_cache.data) {
        v.nc = a->v_dim / ve, v.nc1 = v.nc, v.nch = (v.nc + 1) / 2, v.items = v.nch;
    }
}

/* Lanes per team: the fewest (a power of two, up to 32) whose U items each cover the widest row;
 * rows beyond 32 * U items go in chunks. A small call (its rows at U items a lane fill at most two
 * 256-thread blocks per SM: decode) of at most 32 items a row takes a lane per item instead: each
 * warp runs about half the instructions, and at T = 1 a warp's serial instruction stream is most
 * of the call. With 16-byte units such a call runs prologue_decode_kernel (*decode), f32 included;
 * with one-element units f32 keeps U items a lane, since in prologue_kernel a lane per f32 item
 * is the slower form. */
uint32_t max_items(const ApParams *p)
{
    return p->kind[QK_ITEMS].items > p->kind[V_ITEMS].items ? p->kind[QK_ITEMS].items : p->kind[V_ITEMS].items;
}

void set_lanes(ApParams *p, uint32_t L, uint32_t u)
{
    uint32_t lg = 0;
    while ((1u << lg) < L)
        lg++;
    p->pl.l_log2 = lg;
    for (Kind &g : p->kind)
        g.chunks = (uint32_t)ceil_div(g.items, L * u);
}

/* decode_ok: the decode kernel may run the call (false where a forced row names another kernel: the
 * call is then planned as it was before that kernel existed, prologue_kernel's small-call form). */
void plan_team(ApParams *p, uint32_t u, uint64_t seq, int sm_count, bool two_byte, bool units16, bool decode_ok,
               bool *chunk, bool *decode)
{
    const uint32_t items = max_items(p);
    uint32_t L = pow2_ceil(ceil_div(items, u));
    const uint64_t sms = (uint64_t)(sm_count > 0 ? sm_count : 1);
    const bool small = items <= 32 && seq * p->rows * L <= 2 * sms * kThreads;
    *decode = small && units16 && decode_ok;
    if (small && (two_byte || *decode))
        L = pow2_ceil(items);
    L = L > 32 ? 32 : L;
    *chunk = (uint64_t)L * u < items;
    set_lanes(p, L, u);
}

/* A decode call (plan_team's *decode) with an f8 cache narrows its units to kDecodeF8Elems
 * elements (kDecodeF8Elems codes a cache store), or as near as a row stays within 32 items: each
 * lane then holds fewer elements and a row more lanes, which shortens the chain of an f8 row's
 * scale and code conversion. Without an f8 cache narrower units are the slower form, so those calls
 * keep 16-byte units (docs/decisions.md). narrow_ok false (a forced 16-byte row) keeps them too.
 * Returns the unit width (elements). */
uint32_t plan_decode_units(const lmk_attn_prologue_args *a, uint32_t ve, bool narrow_ok, ApParams *p)
{
    const uint32_t target = (p->cache[K_CACHE].f8 || p->cache[V_CACHE].f8) && narrow_ok ? kDecodeF8Elems : ve;
    uint32_t best = ve;
    for (uint32_t v = ve / 2; v >= target; v /= 2) {
        plan_kinds(a, v, p);
        if (max_items(p) > 32)
            break;
        best = v;
    }
    plan_kinds(a, best, p);
    set_lanes(p, pow2_ceil(max_items(p)), 1);
    return best;
}

/* The host's angle tables, one per recent configuration of this thread. n == 0: empty. */
struct FreqTable {
    int mode;
    uint32_t sections[4];
    uint32_t n;
    double key[6]; /* freq_base, exp_n, freq_scale, ext_factor, ramp_low, ramp_high */
    double freq[kTabPairs];
    unsigned char axis[kTabPairs];
};
thread_local FreqTable t_freq[kFreqCache];
thread_local unsigned t_freq_next;

/* The table of pairs [0, n) (n <= kTabPairs): lmk_rope_axis_j and lmk_rope_freq (ff = 1) of each,
 * from this thread's cache when the parameters match bit for bit (a pow() per pair would be a
 * large part of a decode call's host time). */
const FreqTable &freq_table(const lmk_rope_angle *g, uint32_t n)
{
    const double key[6] = {g->freq_base, g->exp_n, g->freq_scale, g->ext_factor, g->ramp_low, g->ramp_high};
    for (int i = 0; i < kFreqCache; i++) {
        const FreqTable &tb = t_freq[i];
        if (tb.n == n && tb.mode == (int)g->mode && memcmp(tb.sections, g->sections, sizeof tb.sections) == 0 &&
            memcmp(tb.key, key, sizeof key) == 0)
            return tb;
    }
    FreqTable &tb = t_freq[t_freq_next++ % kFreqCache];
    tb.mode = (int)g->mode;
    memcpy(tb.sections, g->sections, sizeof tb.sections);
    memcpy(tb.key, key, sizeof key);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t j;
        tb.axis[i] = (unsigned char)lmk_rope_axis_j((int)g->mode, g->sections, i, &j);
        tb.freq[i] = lmk_rope_freq(g->freq_base, g->exp_n, g->freq_scale, g->ext_factor, g->ramp_low, g->ramp_high, i,
                                   j, 1.0);
    }
    tb.n = n;
    return tb;
}

void plan_angles(const lmk_rope_angle *g, AnglePlan *ap)
{
    const uint32_t n = g->n_pairs < kTabPairs ? g->n_pairs : kTabPairs;
    const FreqTable &tb = freq_table(g, n);
    memcpy(ap->freq, tb.freq, n * sizeof(double));
    memcpy(ap->axis, tb.axis, n);
    ap->ff = g->freq_factors;
    ap->pos = g->positions;
    ap->pos_axis_stride = g->pos_axis_stride;
    ap->pos_dtype = (int)g->pos_dtype;
    ap->mscale = (float)g->mscale;
    ap->mode = (int)g->mode;
    memcpy(ap->sections, g->sections, sizeof ap->sections);
    ap->freq_base = g->freq_base, ap->exp_n = g->exp_n, ap->freq_scale = g->freq_scale;
    ap->ext_factor = g->ext_factor, ap->ramp_low = g->ramp_low, ap->ramp_high = g->ramp_high;
}

Cache cache_of(const lmk_rows &r, uint64_t rows, float inv)
{
    Cache c{};
    const uint64_t es = lmk_dtype_size(r.dtype);
    c.t = Tensor{(unsigned char *)r.data, r.tok * es, r.head * es};
    c.rows = rows;
    c.f8 = r.dtype == LMK_F8E4M3;
    c.inv = inv;
    return c;
}

Tensor tensor_of(const void *data, size_t tok, size_t head, uint64_t es)
{
    return Tensor{(unsigned char *)data, tok * es, head * es};
}

/* The operands, norms and row kinds of the call. */
void plan_operands(const lmk_attn_prologue_args *a, ApParams *p)
{
    const lmk_rope_args *r = &a->rope;
    const uint64_t es = r->dtype == LMK_F32 ? 4 : 2;
    const lmk_rope_tensor *q = &r->t[0], *k = &r->t[1];
    p->q_in = tensor_of(q->in, q->in_tok, q->in_head, es);
    p->q_out = tensor_of(q->out, q->out_tok, q->out_head, es);
    p->k_in = tensor_of(k->in, k->in_tok, k->in_head, es);
    p->k_out = tensor_of(k->out, k->out_tok, k->out_head, es);
    p->v_in = tensor_of(a->v_in.data, a->v_in.tok, a->v_in.head, es);
    p->cache[K_CACHE] = cache_of(a->k_cache, a->k_slots, a->k_inv_scale);
    p->cache[V_CACHE] = cache_of(a->v_cache, a->v_slots, a->v_inv_scale);
    p->q_w = a->q_norm_w, p->k_w = a->k_norm_w;
    p->q_w_dt = (int)a->q_norm_dtype, p->k_w_dt = (int)a->k_norm_dtype;
    p->w_off = (float)a->weight_offset, p->eps = (float)a->eps, p->inv_d = 1.0f / (float)r->head_dim;
    p->D = r->head_dim, p->hq = q->n_heads, p->hk = k->n_heads;
    p->rows = p->hq + p->hk + (a->v_cache.data ? p->hk : 0);
    p->half = r->rope_dim / 2;
    p->slots = a->slots, p->slot_i64 = a->slot_dtype == LMK_I64;
}

/* The small-call fill takes the weights in 16-byte units when every present weight tensor starts
 * 16-byte aligned and its D elements are whole units (every model: D a multiple of 8): one load and
 * two shared stores a unit, by the last threads of the block (weight_unit), instead of kWBatch
 * element loads and widenings by every thread. Otherwise (and outside the small-call fill)
 * Plan.wq_u = wk_u = 0 and the fill goes by element. */
void plan_weight_units(ApParams *p)
{
    Plan &pl = p->pl;
    pl.wq_u = pl.wk_u = 0;
    if (!pl.batch_fill)
        return;
    const void *w[2] = {p->q_w, p->k_w};
    const int dt[2] = {p->q_w_dt, p->k_w_dt};
    uint32_t u[2] = {0, 0};
    for (int i = 0; i < 2; i++) {
        if (!w[i])
            continue;
        const uint64_t bytes = (uint64_t)p->D * (dt[i] == LMK_F32 ? 4 : 2);
        if ((uintptr_t)w[i] % 16 != 0 || bytes % 16 != 0)
            return;
        u[i] = (uint32_t)(bytes / 16);
    }
    pl.wq_u = u[0], pl.wk_u = u[1];
}

/* The table's rows (variants.h), for the planner. */
struct VariantRow {
    lmk_ap_kernel kernel;
    lmk_ap_units units;
    bool f8, mix, chunk;
    const char *name;
};
constexpr VariantRow kRows[] = {
#define AP_ROW(id, name, kernel, units, f8, mix, chunk, reason, bench) {kernel, units, f8, mix, chunk, name},
    LMK_AP_VARIANTS(AP_ROW)
#undef AP_ROW
};
static_assert(sizeof kRows / sizeof kRows[0] == LMK_AP_N_VARIANTS, "one row per id");
constexpr const char *kKernelNames[] = {"prologue_stream_kernel", "prologue_decode_kernel", "prologue_kernel"};

/* The row the bench forces every call onto (lmk_cuda_attn_prologue_force), or -1. */
std::atomic<int> g_forced{-1};

/* Prefill with 16-byte units: prologue_stream_kernel where its shared memory fits 48 KB: two (cos,
 * sin) tables of cs_bytes, the weights, two slot tables, two staging areas of 2 * U 16-byte units a
 * thread, 16 bytes a thread for its staged position and slot, its StreamRec and the PairTab. Past
 * 48 KB (head_dim near 1024 with a full rope) the blocks stay prologue_kernel's (allowing them 64
 * KB bought nothing). Where every row is 256 bytes or more (each is read whole), the staging copies
 * fill L2 256 bytes at a time (fewer, larger fills for the same bytes; a 256-byte fill around a
 * shorter row would also fetch bytes nobody reads). */
void plan_stream(ApParams *p, uint64_t cs_bytes, uint64_t w_bytes, uint64_t tile, LaunchPlan *L)
{
    Plan &pl = p->pl;
    const uint64_t slot_bytes = p->slots ? ceil_div(tile * sizeof(int64_t), 16) * 16 : 0;
    const uint64_t stage_bytes = 2ull * kItems<16> * L->threads.x * 16;
    const uint64_t rec_bytes = sizeof(StreamRec) * L->threads.x;
    const uint64_t pair_bytes = sizeof(PairTab) * (p->half < kTabPairs ? p->half : kTabPairs);
    const uint64_t total = 2 * cs_bytes + w_bytes + 2 * slot_bytes + 2 * stage_bytes + 16ull * L->threads.x +
                           rec_bytes + pair_bytes;
    if (total > 48 * 1024)
        return;
    L->stream = true;
    pl.cs2_at = (uint32_t)(cs_bytes / sizeof(float2));
    pl.w_at = (uint32_t)(2 * cs_bytes / sizeof(float));
    pl.slot_at = (uint32_t)(2 * cs_bytes + w_bytes);
    pl.slot2_at = (uint32_t)(pl.slot_at + slot_bytes);
    pl.stage_at = (uint32_t)(pl.slot2_at + slot_bytes);
    pl.words_at = (uint32_t)(pl.stage_at + 2 * stage_bytes);
    pl.rec_at = (uint32_t)(pl.words_at + 16ull * L->threads.x);
    pl.pairs_at = (uint32_t)(pl.rec_at + rec_bytes);
    pl.n_tiles = ceil_div(pl.seq, tile);
    const Kind &g = p->kind[QK_ITEMS];
    const uint64_t qk_b = ((p->il ? 1ull : 2ull) * g.npu + g.nc) * 16;
    const uint64_t v_b = (uint64_t)p->kind[V_ITEMS].nc * 16;
    pl.fetch256 = l2_fill_bytes(qk_b) == 256 && (v_b == 0 || l2_fill_bytes(v_b) == 256);
    L->smem = (size_t)total;
}

/* The launch: one row per team; 256-thread blocks, or 128 when the rows fill at most 2 blocks of
 * 256 per SM (decode: more, smaller blocks spread a call over more SMs). A block takes a tile of
 * whole tokens (one angle per thread at most) or, when a token has more rows than a block has
 * teams, a group of a token's rows. Every block has at least one row; tasks per block <= 256. A
 * forced row (plan_call) decides whether the stream kernel may run the call and whether rows with
 * pair and copy items take MIX, in place of the measured rule below. */
void plan_launch(ApParams *p, int sm_count, bool units16, const VariantRow *forced, LaunchPlan *L)
{
    Plan &pl = p->pl;
    const uint64_t lanes = 1u << pl.l_log2, seq = pl.seq, rows = p->rows;
    const uint64_t sms = (uint64_t)(sm_count > 0 ? sm_count : 1);
    const bool spread = L->decode || seq * rows * lanes <= 2 * sms * kThreads;
    pl.batch_fill = spread;
    plan_weight_units(p);
    const uint64_t cap = (spread ? kSpreadThreads : kThreads) / lanes; /* teams per block */
    uint64_t tile = 1, groups = 1;
    if (rows <= cap) {
        const uint64_t angle_cap = p->half >= kThreads ? 1 : kThreads / p->half;
        tile = cap / rows;
        tile = tile > angle_cap ? angle_cap : tile;
        tile = tile > seq ? seq : tile;
    } else {
        groups = ceil_div(rows, cap);
    }
    pl.rpg = (uint32_t)ceil_div(rows, groups);
    groups = ceil_div(rows, pl.rpg);
    pl.groups = (uint32_t)groups;
    pl.tile = (uint32_t)tile;
    pl.magic = (uint32_t)(((1u << kMagicShift) + pl.rpg - 1) / pl.rpg);
    pl.n_blocks = ceil_div(seq, tile) * groups;
    L->threads = dim3((unsigned)(ceil_div(tile * pl.rpg * lanes, 32) * 32), 1, 1);
    L->blocks = dim3((unsigned)pl.n_blocks, 1, 1);
    if (pl.n_blocks > 0x7fffffffu) /* T near 2^32 with one token per tile */
        L->blocks = dim3(1u << 30, (unsigned)ceil_div(pl.n_blocks, 1u << 30), 1);
    /* Shared memory: (cos, sin) of tile x half pairs, 2 x D weights, tile slots. */
    const uint64_t cs_bytes = ceil_div(tile * p->half * sizeof(float2), 16) * 16;
    const uint64_t w_bytes = (p->q_w || p->k_w) ? 2ull * p->D * sizeof(float) : 0;
    pl.w_at = (uint32_t)(cs_bytes / sizeof(float));
    pl.slot_at = (uint32_t)(cs_bytes + w_bytes);
    L->smem = (size_t)(cs_bytes + w_bytes + (p->slots ? tile * sizeof(int64_t) : 0));
    L->stream = false;
    L->f8 = p->cache[K_CACHE].f8 || p->cache[V_CACHE].f8;
    L->sm_count = sm_count;
    if (!spread && units16 && (!forced || forced->kernel == LMK_AP_K_STREAM)) /* (spread whenever L->decode) */
        plan_stream(p, cs_bytes, w_bytes, tile, L);
    /* Rows with pair and copy items (a partial half-split rope: Qwen3.5) take the MIX instantiation
     * where it measures faster than the kernels without it (docs/decisions.md): decode with an f8
     * cache, decode without one when the call is at most a block per SM (beyond, it is slower),
     * and prompts without an f8 cache. With an f8 cache the prompt kernel's MIX instance spills,
     * so it is not built. tests/test_cuda_routing.c holds the line on the model shapes. */
    const bool mixed_rows = !p->il && p->kind[QK_ITEMS].npu && p->kind[QK_ITEMS].nc;
    const bool measured = L->decode ? L->f8 || pl.n_blocks <= sms : L->stream && !L->f8;
    L->mix = mixed_rows && (forced ? forced->mix : measured);
}

/* The row of the plan: its kernel, its unit width ve (elements; es bytes each), chunk, and the
 * instantiation's switches. The f8 paths go in where the call has an f8 cache (prologue_kernel
 * always has them) or where a forced row has them (they run a call without one correctly). Returns
 * the row, or LMK_AP_N_VARIANTS where a forced row differs from the plan it led to (the call cannot
 * run it). */
lmk_ap_variant plan_variant(const LaunchPlan &L, uint32_t ve, uint32_t es, bool chunk, const VariantRow *forced)
{
    VariantRow v{};
    v.kernel = L.decode ? LMK_AP_K_DECODE : L.stream ? LMK_AP_K_STREAM : LMK_AP_K_BLOCK;
    v.units = ve == 1 ? LMK_AP_U1 : ve * es == 16 ? LMK_AP_U16 : LMK_AP_U4;
    v.f8 = v.kernel == LMK_AP_K_BLOCK || L.f8 || (forced && forced->f8);
    v.mix = v.kernel != LMK_AP_K_BLOCK && L.mix;
    v.chunk = chunk;
    for (int i = 0; i < LMK_AP_N_VARIANTS; i++) {
        const VariantRow &r = kRows[i];
        if (r.kernel == v.kernel && r.units == v.units && r.f8 == v.f8 && r.mix == v.mix && r.chunk == v.chunk)
            return !forced || forced == &r ? (lmk_ap_variant)i : LMK_AP_N_VARIANTS;
    }
    return LMK_AP_N_VARIANTS;
}

/* The whole plan of a call: parameters, unit width, CHUNK, the launch and its row of the table
 * (L->variant). Both lmk_cuda_attn_prologue and lmk_cuda_attn_prologue_route plan through here. A
 * forced row steers the choices it names (the kernel, 16-byte or 4-element decode units, MIX) and
 * must then be the plan's row. */
lmk_status plan_call(const lmk_attn_prologue_args *a, const lmk_cuda_device *d, ApParams *p, LaunchPlan *L,
                     uint32_t *ve_out)
{
    static const char op[] = "attn_prologue";
    const lmk_rope_args *r = &a->rope;
    if (r->head_dim > kMaxDim || a->v_dim > kMaxDim)
        return lmk_fail(LMK_ERR_UNSUPPORTED, "%s: head_dim (%u) and Dv (%u) must be <= %u on CUDA", op, r->head_dim,
                        a->v_dim, kMaxDim);
    const uint64_t rows = (uint64_t)r->t[0].n_heads + 2ull * r->t[1].n_heads;
    if (rows > 0x7fffffffu) /* rows of a token are 32-bit in the kernel; validation bounds heads by memory */
        return lmk_fail(LMK_ERR_UNSUPPORTED, "%s: %llu heads per token (q, k and v) exceed the CUDA kernel's limit of "
                        "2^31 - 1", op, (unsigned long long)rows);
    const int forced_id = g_forced.load(std::memory_order_relaxed);
    const VariantRow *forced = forced_id >= 0 ? &kRows[forced_id] : nullptr;
    plan_operands(a, p);
    uint32_t ve = plan_units(a);
    bool chunk = false;
    plan_kinds(a, ve, p);
    plan_team(p, ve == 1 ? (r->dtype == LMK_F32 ? kItems<4> : kItems<2>) : kItems<16>, r->seq_len, d->sm_count,
              r->dtype != LMK_F32, ve > 1, !forced || forced->kernel == LMK_AP_K_DECODE, &chunk, &L->decode);
    if (L->decode)
        ve = plan_decode_units(a, ve, !forced || forced->units == LMK_AP_U4, p);
    plan_angles(&r->angle, &p->a);
    p->pl.seq = r->seq_len;
    plan_launch(p, d->sm_count, ve > 1 && !chunk, forced, L);
    L->pdl = d->pdl;
    if (L->smem > (chunk ? kChunkSmem : 48 * 1024)) /* cannot happen for head_dim, Dv <= 4096 */
        return lmk_fail(LMK_ERR_UNSUPPORTED, "%s: %zu bytes of shared memory exceed the CUDA kernel's limit", op,
                        L->smem);
    L->variant = plan_variant(*L, ve, r->dtype == LMK_F32 ? 4 : 2, chunk, forced);
    if (L->variant == LMK_AP_N_VARIANTS)
        return lmk_fail(LMK_ERR_UNSUPPORTED, "%s: the forced variant %s cannot run this call", op,
                        forced ? forced->name : "(none)");
    *ve_out = ve;
    return LMK_OK;
}

} /* namespace */

lmk_status lmk_cuda_attn_prologue(lmk_stream *s, const void *args)
{
    const lmk_attn_prologue_args *a = (const lmk_attn_prologue_args *)args;
    const lmk_cuda_device *d = lmk_cuda_dev(s->dev);
    lmk_status st = lmk_cuda_use(d->ordinal, "attn_prologue: cudaSetDevice");
    if (st != LMK_OK)
        return st;
    ApParams p{};
    LaunchPlan L;
    uint32_t ve = 0;
    if ((st = plan_call(a, d, &p, &L, &ve)) != LMK_OK)
        return st;
    const cudaError_t e = launch_dtype(a->rope.dtype, p, L, lmk_cuda_stream_of(s));
    return e == cudaSuccess ? LMK_OK
                            : lmk_cuda_fail(e, L.stream ? "attn_prologue: kernel launch (or its occupancy query)"
                                                        : "attn_prologue: kernel launch");
}

extern "C" lmk_status lmk_cuda_attn_prologue_route(const lmk_cuda_device *d, const lmk_attn_prologue_args *a,
                                                   lmk_cuda_route *r)
{
    ApParams p{};
    LaunchPlan L;
    uint32_t ve = 0;
    const lmk_status st = plan_call(a, d, &p, &L, &ve);
    if (st != LMK_OK)
        return st;
    const VariantRow &row = kRows[L.variant];
    *r = lmk_cuda_route{};
    r->variant = L.variant;
    r->variant_name = row.name;
    r->kernel = kKernelNames[row.kernel];
    r->unit_bytes = ve * (a->rope.dtype == LMK_F32 ? 4 : 2);
    r->blocks = L.blocks.x * L.blocks.y * L.blocks.z;
    r->threads = L.threads.x;
    r->smem = L.smem;
    return LMK_OK;
}

extern "C" lmk_status lmk_cuda_attn_prologue_force(int variant)
{
    if (variant < -1 || variant >= LMK_AP_N_VARIANTS)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "attn_prologue: variant (%d) must be -1 or a row of the variants "
                        "table, < %d", variant, (int)LMK_AP_N_VARIANTS);
    g_forced.store(variant, std::memory_order_relaxed);
    return LMK_OK;
}

cudaError_t lmk_cuda_attn_prologue_preload(void)
{
    cudaError_t first = cudaSuccess;
    preload_dtype<LMK_F32>(&first);
    preload_dtype<LMK_BF16>(&first);
    preload_dtype<LMK_F16>(&first);
    return first;
}
