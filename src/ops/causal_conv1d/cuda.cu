/*
 * cuda.cu - the CUDA kernels of causal_conv1d (lmk.h, "causal_conv1d") and their launch planning:
 * the depthwise causal convolution of width W (2..8) over sequences packed along T, each starting
 * from its row of the state pool (or zeros) and leaving the last W-1 inputs there, SiLU or none,
 * in place or not, any state strides.
 *
 * Work. A channel unit is NB bytes of one token row: 16 (VE = 16 / element size channels) when
 * x, y, C and the token strides allow, else one element (the scalar fallback, same code). Every
 * output unit is act(bias + sum over the W taps of weight * input), computed in f32 (fmaf, bias
 * first, then the oldest input to the current one), SiLU as v / (1 + expf(-v)), rounded once by
 * kernel_common's pack (lmk's narrowing, NaN-exact). State rows are moved as raw bits: lmk.h says
 * the state is a bit copy of the inputs.
 *
 * In place (y == x) is the layer's normal call, and it is what shapes the kernels: output row t
 * overwrites input row t, which outputs t+1 .. t+W-1 still need. So every input row is read into
 * registers or shared memory before the y row at its address is written, and a row that another
 * block needs (the W-1 rows before a token range) is read before any block can write it.
 *
 * Two kernels (plan: T <= kWalkTokens * n_seq takes the first):
 *   conv_walk_kernel (decode: one token a sequence, or a few): a thread owns one unit of one
 *     sequence and walks its tokens in order, its last W-1 inputs in registers (in[1..W-1]), so a
 *     decode step is one pass reading state + x and writing y + state. The x row of the next token
 *     is loaded before the current y row is stored (different rows, so right in place). A block is
 *     (channel slice, every gridDim/slices-th sequence): its slice's weights and bias are staged
 *     once per block into shared memory as f32, row d holding the weight d tokens back, read as
 *     16-byte units of the slice's contiguous run of weights (W scalar loads per channel, strided
 *     by W, were more instructions than the unit's own data) and shared by the block's sequences.
 *   conv_tile_kernel (prefill): a block owns (sequence, channel slice of kSliceBytes, segment) and
 *     walks the segment's tokens through a ring of kTileStages stages of kTileRows rows in shared
 *     memory, filled by cp.async kTileAhead stages ahead (the NB = 2 fallback copies through
 *     registers). Ring row of a token = its offset from the segment start, modulo the ring, so the
 *     W-1 rows before a stage are the tail of the previous stage, and the segment's W-1 halo rows
 *     (the state rows, or the x rows before the segment) sit just below row 0. A stage is
 *     overwritten only after the barrier that ends the computation reading it, and an x row is
 *     copied in before its own y row is written, so the walk is right in place. Threads compute
 *     RL consecutive rows of one unit from the ring and store y straight from registers.
 *     A sequence is split into `segs` segments (plan_tile) where (sequence, slice) items alone
 *     would leave SMs idle. Segment r >= 1 starts at token W-1 or later, so only segment 0 reads
 *     the state rows. Out of place, x is never written, so segments read their halo from x
 *     directly, and segment 0 writes the final state (from x where its own ring lacks the rows):
 *     the one block reading the row is the one writing it, after its read. In place the halo rows
 *     belong to the previous segment, which overwrites them: there the segments of a sequence are
 *     one thread block cluster (sm_90), every block reads its halo, then a cluster barrier, then
 *     any writes; the last non-empty segment, whose ring holds the last W-1 inputs, writes the
 *     state. Without clusters (sm_80) an in-place sequence is one segment.
 * Both kernels loop over their work items with a grid stride (grids of at most kGridCap blocks,
 * 1-D), so any T and any number of sequences launch.
 *
 * Sequences and slots are device data: lmk_seq_bounds and lmk_seq_slot (varlen.h) clamp them, so
 * no value leads outside the operands. A state row is stored only by the last sequence naming it
 * (lmk_seq_stores, evaluated by the whole block: lmk_block_seq_stores), from the row as it was read at
 * that sequence's start; an empty sequence reads and writes nothing. Deterministic: every output
 * is one thread's fixed sequence of operations, there are no atomics.
 *
 * Everything a launch needs travels by value in ConvParams (no allocation, no copy, no sync), so
 * a call can be captured into a CUDA graph; launches use programmatic dependent launch where the
 * device has it (pdl_enter before the first global access).
 */
#include "cuda/cuda_internal.h"
#include "cuda/kernel_common.cuh"
#include "ops/causal_conv1d/causal_conv1d.h"
#include "ops/varlen.h"

#include <math.h>
#include <stdint.h>

namespace {

constexpr int kMaxWidth = 8;             /* lmk.h: W in 2..8 */
constexpr uint32_t kWalkThreads = 128;   /* most threads (units) of a walk block */
constexpr uint64_t kWalkTokens = 4;      /* tokens a sequence up to which the walk kernel runs */
constexpr uint32_t kTileThreads = 256;
constexpr uint32_t kSliceBytes = 128;    /* bytes of a token row a tile block owns: one L2 line */
constexpr uint32_t kTileRows = 64;       /* rows a stage */
constexpr uint32_t kTileStages = 4;      /* stages in the ring */
constexpr uint32_t kTileAhead = kTileStages - 2; /* stages in flight while one is computed */
constexpr uint32_t kRingRows = kTileRows * kTileStages;
constexpr uint32_t kRingMask = kRingRows - 1;
constexpr uint32_t kMaxClusterSegs = 8; /* the portable cluster size */
constexpr uint32_t kMaxSegs = 64;
constexpr uint32_t kTileBlocksPerSm = 3; /* resident tile blocks an SM (registers); the plan fills one wave */
constexpr uint64_t kGridCap = 1u << 30;
static_assert((kRingRows & kRingMask) == 0, "the ring is a power of two rows");
static_assert(kTileRows >= kMaxWidth - 1, "the W-1 rows before a stage are in the previous stage");

/* A tile block's thread geometry for units of NB bytes: G units a row (kSliceBytes), lanes token
 * lanes, each computing RL consecutive rows of a stage. */
template <int NB> struct Tile {
    static constexpr uint32_t G = kSliceBytes / NB;
    static constexpr uint32_t lanes = kTileThreads / G;
    static constexpr uint32_t RL = kTileRows / lanes;
    static_assert(G * lanes == kTileThreads && RL * lanes == kTileRows, "tile geometry");
};

struct ConvParams {
    const unsigned char *x;
    unsigned char *y;
    const void *weight, *bias;
    const void *cu_seqlens, *slots;
    unsigned char *state;
    uint64_t T, n_seq, n_slots;
    uint64_t x_tok_b, y_tok_b;        /* token strides in bytes */
    uint64_t st_slot, st_row, st_ch;  /* state strides in elements */
    uint64_t n_units;                 /* units of a token row: C * es / NB */
    uint64_t n_items;                 /* tile: n_seq * n_slices */
    uint32_t W, n_slices, segs;
    int w_dtype, b_dtype, cu_is64, slots_is64;
    bool silu;
    bool st_vec;  /* state units load and store as one NB-byte access (channel stride 1, aligned) */
    bool cluster; /* tile: the segments of a sequence are a cluster and sync after their halo reads */
};

/* Raw bits of element e of a unit (ES bytes an element), and the unit with element e set. */
template <int ES, int NB> __device__ __forceinline__ uint32_t raw_get(const Raw<NB> &r, int e)
{
    if constexpr (ES == 4)
        return r.w[e];
    else
        return (r.w[e >> 1] >> (16 * (e & 1))) & 0xffffu;
}

template <int ES, int NB> __device__ __forceinline__ void raw_set(Raw<NB> &r, int e, uint32_t b)
{
    if constexpr (ES == 4)
        r.w[e] = b;
    else if (e & 1)
        r.w[e >> 1] = (r.w[e >> 1] & 0xffffu) | (b << 16);
    else
        r.w[e >> 1] = (r.w[e >> 1] & 0xffff0000u) | b;
}

template <int NB> __device__ __forceinline__ Raw<NB> raw_zero()
{
    Raw<NB> r;
#pragma unroll
    for (int i = 0; i < (NB >= 4 ? NB / 4 : 1); i++)
        r.w[i] = 0;
    return r;
}

/* A unit of the state: row `r` of pool row `row`, channels c0 .. c0 + VE - 1. */
template <int ES, int NB>
__device__ __forceinline__ unsigned char *state_at(const ConvParams &p, int64_t row, uint32_t r, uint64_t c0)
{
    return p.state + ((uint64_t)row * p.st_slot + (uint64_t)r * p.st_row + c0 * p.st_ch) * ES;
}

template <int ES, int NB> __device__ __forceinline__ Raw<NB> state_load(const ConvParams &p, const unsigned char *b)
{
    if constexpr (NB == ES)
        return load<NB>(b);
    if (p.st_vec)
        return load<NB>(b);
    Raw<NB> u = raw_zero<NB>();
#pragma unroll
    for (int e = 0; e < NB / ES; e++) {
        const unsigned char *q = b + (uint64_t)e * p.st_ch * ES;
        raw_set<ES, NB>(u, e, ES == 4 ? *reinterpret_cast<const uint32_t *>(q) : *reinterpret_cast<const unsigned short *>(q));
    }
    return u;
}

template <int ES, int NB> __device__ __forceinline__ void state_store(const ConvParams &p, unsigned char *b, const Raw<NB> &u)
{
    if constexpr (NB == ES) {
        store<NB>(b, u);
        return;
    }
    if (p.st_vec) {
        store<NB>(b, u);
        return;
    }
#pragma unroll
    for (int e = 0; e < NB / ES; e++) {
        unsigned char *q = b + (uint64_t)e * p.st_ch * ES;
        if constexpr (ES == 4)
            *reinterpret_cast<uint32_t *>(q) = raw_get<ES, NB>(u, e);
        else
            *reinterpret_cast<unsigned short *>(q) = (unsigned short)raw_get<ES, NB>(u, e);
    }
}

/* Stages the weights and bias of channels c_lo .. c_lo + nch - 1 into s_w as f32: s_w[d * pitch +
 * c] is the weight of channel c_lo + c for the input d tokens back (weight[c, W-1-d]), row W the
 * bias (0 without one). The slice's weights are one contiguous run; where it starts 16-byte
 * aligned (an aligned weight buffer: slices are whole multiples of 32 channels) consecutive
 * threads read consecutive 16-byte units, the tail one element each. The caller syncs. */
__device__ void stage_weights(const ConvParams &p, float *s_w, uint32_t pitch, uint64_t c_lo, uint32_t nch)
{
    const uint32_t W = p.W, n = nch * W;
    const uint32_t wes = p.w_dtype == LMK_F32 ? 4 : 2, per = 16 / wes;
    const unsigned char *base = static_cast<const unsigned char *>(p.weight) + c_lo * W * wes;
    const uint32_t n_vec = (uintptr_t)base % 16 == 0 ? n / per : 0;
    for (uint32_t u = threadIdx.x; u < n_vec; u += blockDim.x) {
        const uint4 raw = *reinterpret_cast<const uint4 *>(base + (uint64_t)u * 16);
        const uint32_t w4[4] = {raw.x, raw.y, raw.z, raw.w};
        uint32_t c = u * per / W, j = u * per - c * W;
#pragma unroll
        for (uint32_t e = 0; e < 8; e++) {
            if (e >= per)
                break;
            float v;
            if (wes == 4)
                v = __uint_as_float(w4[e & 3]);
            else {
                const uint32_t h = (w4[e >> 1] >> (16 * (e & 1))) & 0xffffu;
                v = p.w_dtype == LMK_BF16 ? Elem<LMK_BF16>::widen(h) : Elem<LMK_F16>::widen(h);
            }
            s_w[(W - 1 - j) * pitch + c] = v;
            if (++j == W)
                j = 0, c++;
        }
    }
    for (uint32_t i = n_vec * per + threadIdx.x; i < n; i += blockDim.x) {
        const uint32_t c = i / W, j = i - c * W;
        s_w[(W - 1 - j) * pitch + c] = ld_f32(p.weight, p.w_dtype, c_lo * W + i);
    }
    for (uint32_t c = threadIdx.x; c < nch; c += blockDim.x)
        s_w[W * pitch + c] = p.bias ? ld_f32(p.bias, p.b_dtype, c_lo + c) : 0.0f;
}

/* VE consecutive f32 of shared memory (16-byte aligned where VE is a multiple of 4: pitch and
 * the unit's offset are). */
template <int VE> __device__ __forceinline__ void lds_f32(float (&v)[VE], const float *p)
{
    if constexpr (VE % 4 == 0) {
#pragma unroll
        for (int e = 0; e < VE; e += 4) {
            const float4 f = *reinterpret_cast<const float4 *>(p + e);
            v[e] = f.x, v[e + 1] = f.y, v[e + 2] = f.z, v[e + 3] = f.w;
        }
    } else {
#pragma unroll
        for (int e = 0; e < VE; e++)
            v[e] = p[e];
    }
}

/* One output unit: act(bias + sum_{d < W} w_d * in[d]) with in[d] the input d tokens back, the
 * oldest first; w_col points at the unit's first channel in s_w. */
template <int DT, int NB>
__device__ __forceinline__ Raw<NB> conv_unit(const Raw<NB> (&in)[kMaxWidth], const float *w_col, uint32_t pitch,
                                             uint32_t W, bool silu)
{
    constexpr int VE = NB / Elem<DT>::size;
    float acc[VE];
    lds_f32<VE>(acc, w_col + W * pitch);
#pragma unroll
    for (int d = kMaxWidth - 1; d >= 0; d--) {
        if (d < (int)W) {
            float wd[VE];
            lds_f32<VE>(wd, w_col + d * pitch);
#pragma unroll
            for (int e = 0; e < VE; e++)
                acc[e] = fmaf(wd[e], elem<DT, VE>(in[d], e), acc[e]);
        }
    }
    if (silu) {
#pragma unroll
        for (int e = 0; e < VE; e++)
            acc[e] = acc[e] / (1.0f + expf(-acc[e]));
    }
    return pack<DT, VE>(acc);
}

/* ---------------------------------------------------------------------------------------------
 * The walk kernel (decode).
 * ------------------------------------------------------------------------------------------- */

/* Sequence [lo, hi) for the unit at channel c0: in[d] holds the input d tokens back (state rows
 * W-1-d before the first token), the next token's x is loaded before this token's y is stored. */
template <int DT, int NB>
__device__ void walk_sequence(const ConvParams &p, uint64_t lo, uint64_t hi, int64_t row, bool stores, uint64_t c0,
                              const float *w_col, uint32_t pitch)
{
    constexpr int ES = Elem<DT>::size;
    const uint32_t W = p.W;
    Raw<NB> in[kMaxWidth];
#pragma unroll
    for (int d = 0; d < kMaxWidth; d++)
        in[d] = raw_zero<NB>();
    if (row >= 0) {
#pragma unroll
        for (int d = 1; d < kMaxWidth; d++)
            if (d < (int)W)
                in[d] = state_load<ES, NB>(p, state_at<ES, NB>(p, row, W - 1 - d, c0));
    }
    const unsigned char *xp = p.x + lo * p.x_tok_b + c0 * ES;
    unsigned char *yp = p.y + lo * p.y_tok_b + c0 * ES;
    Raw<NB> next = load<NB>(xp);
    for (uint64_t t = lo; t < hi; t++) {
        in[0] = next;
        if (t + 1 < hi)
            next = load<NB>(xp + p.x_tok_b);
        store<NB>(yp, conv_unit<DT, NB>(in, w_col, pitch, W, p.silu));
#pragma unroll
        for (int d = kMaxWidth - 1; d > 0; d--)
            in[d] = in[d - 1];
        xp += p.x_tok_b;
        yp += p.y_tok_b;
    }
    /* in[d] is now xx[L + W-1 - d]: state row W-1-d, as loaded. */
    if (stores) {
#pragma unroll
        for (int d = 1; d < kMaxWidth; d++)
            if (d < (int)W)
                state_store<ES, NB>(p, state_at<ES, NB>(p, row, W - 1 - d, c0), in[d]);
    }
}

/* Block b: channel slice b % n_slices (blockDim units), sequences b / n_slices + k * (gridDim /
 * n_slices). Dynamic shared memory: the slice's weights, (W + 1) rows of pitch floats. */
template <int DT, int NB>
__global__ void __launch_bounds__(kWalkThreads) conv_walk_kernel(const __grid_constant__ ConvParams p)
{
    constexpr int VE = NB / Elem<DT>::size;
    extern __shared__ __align__(16) float s_w[];
    const uint32_t nt = blockDim.x, tid = threadIdx.x;
    const uint32_t slice = blockIdx.x % p.n_slices;
    const uint64_t u0 = (uint64_t)slice * nt;
    const uint32_t gu = (uint32_t)min((uint64_t)nt, p.n_units - u0);
    const uint32_t pitch = nt * VE + 4;
    pdl_enter();
    stage_weights(p, s_w, pitch, u0 * VE, gu * VE);
    __syncthreads();
    const uint64_t c0 = (u0 + tid) * VE;
    const uint64_t step = gridDim.x / p.n_slices;
    for (uint64_t s = blockIdx.x / p.n_slices; s < p.n_seq; s += step) {
        size_t lo, hi;
        lmk_seq_bounds(p.cu_seqlens, p.cu_is64, s, p.T, &lo, &hi);
        if (lo == hi)
            continue; /* block-uniform: an empty sequence reads and writes nothing */
        const int64_t row = p.state ? lmk_seq_slot(p.slots, p.slots_is64, s, p.n_slots) : -1;
        const bool stores = row >= 0 && lmk_block_seq_stores(p.slots, p.slots_is64, s, p.n_seq, row);
        if (tid < gu)
            walk_sequence<DT, NB>(p, lo, hi, row, stores, c0, s_w + tid * VE, pitch);
    }
}

/* ---------------------------------------------------------------------------------------------
 * The tile kernel (prefill).
 * ------------------------------------------------------------------------------------------- */

__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;" ::: "memory");
}

template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* NB bytes from global src to shared dst: cp.async (16 bytes bypass L1), or for 2-byte units
 * (cp.async has none) a load and a shared store, complete on return. */
template <int NB> __device__ __forceinline__ void copy_unit(unsigned char *dst, const unsigned char *src)
{
    const uint32_t sa = smem_addr(dst);
    const uint64_t ga = (uint64_t)__cvta_generic_to_global(src);
    if constexpr (NB == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa), "l"(ga) : "memory");
    else if constexpr (NB == 8)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(sa), "l"(ga) : "memory");
    else if constexpr (NB == 4)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(sa), "l"(ga) : "memory");
    else
        *reinterpret_cast<unsigned short *>(dst) = __ldcs(reinterpret_cast<const unsigned short *>(src));
}

template <int NB> __device__ __forceinline__ Raw<NB> lds(const unsigned char *p)
{
    Raw<NB> r;
    if constexpr (NB == 16) {
        const uint4 v = *reinterpret_cast<const uint4 *>(p);
        r.w[0] = v.x, r.w[1] = v.y, r.w[2] = v.z, r.w[3] = v.w;
    } else if constexpr (NB == 8) {
        const uint2 v = *reinterpret_cast<const uint2 *>(p);
        r.w[0] = v.x, r.w[1] = v.y;
    } else if constexpr (NB == 4) {
        r.w[0] = *reinterpret_cast<const uint32_t *>(p);
    } else {
        r.w[0] = *reinterpret_cast<const unsigned short *>(p);
    }
    return r;
}

/* Every thread of the cluster arrives after its earlier memory accesses (release) and waits for
 * all (acquire): the halo reads of every segment happen before any segment's writes. sm_90 only;
 * the host asks for clusters only where the device runs sm_90 code. */
__device__ __forceinline__ void cluster_sync()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

/* Segment r of K of a sequence of L tokens: offsets [seg_bound(r), seg_bound(r + 1)). Segments
 * after the first start at W-1 or later, so none but the first reads state rows. */
__device__ __forceinline__ uint64_t seg_bound(uint64_t L, uint32_t r, uint32_t K, uint32_t W)
{
    if (r == 0)
        return 0;
    if (r >= K)
        return L;
    uint64_t b = L * r / K;
    b = b < W - 1 ? W - 1 : b;
    return b < L ? b : L;
}

/* What a tile block works on: the sequence's tokens, its row, its segment, its slice's units. */
struct TileItem {
    uint64_t s, lo, L;      /* the sequence's index and tokens [lo, lo + L) */
    uint64_t s0, s1;        /* the segment's offsets [s0, s1) in the sequence */
    uint64_t u0;            /* the slice's first unit */
    int64_t row;
    uint32_t gu;            /* the slice's units (<= G) */
};

/* The unit of xx index i (the sequence's inputs after its W-1 state rows) as held by the ring,
 * whose row 0 is xx index s0 + W-1. */
template <int NB, uint32_t G>
__device__ __forceinline__ unsigned char *ring_at(unsigned char *ring, uint32_t rel, uint32_t g)
{
    return ring + ((rel & kRingMask) * G + g) * NB;
}

/* The segment's W-1 halo rows (xx indices s0 .. s0 + W-2) into the ring below row 0: state rows
 * (zeros without a row) for indices below W-1, else x rows. Plain loads, complete before the
 * barrier that follows (and, in a cluster, before the cluster barrier). */
template <int DT, int NB>
__device__ void load_halo(const ConvParams &p, const TileItem &it, unsigned char *ring)
{
    constexpr int ES = Elem<DT>::size, VE = NB / ES;
    constexpr uint32_t G = Tile<NB>::G;
    const uint32_t W = p.W;
    for (uint32_t q = threadIdx.x; q < (W - 1) * G; q += blockDim.x) {
        const uint32_t hr = q / G, g = q % G;
        if (g >= it.gu)
            continue;
        const uint64_t i = it.s0 + hr, c0 = (it.u0 + g) * VE;
        Raw<NB> u = raw_zero<NB>();
        if (i >= W - 1)
            u = load<NB>(p.x + (it.lo + i - (W - 1)) * p.x_tok_b + c0 * ES);
        else if (it.row >= 0)
            u = state_load<ES, NB>(p, state_at<ES, NB>(p, it.row, (uint32_t)i, c0));
        store<NB>(ring_at<NB, G>(ring, hr - (W - 1), g), u);
    }
}

/* Copies stage k of the segment (own rows k*R .. k*R + R - 1) into its ring slot; nothing past
 * the segment's last stage. */
template <int DT, int NB>
__device__ __forceinline__ void issue_stage(const ConvParams &p, const TileItem &it, unsigned char *ring, uint32_t k,
                                            uint32_t nst)
{
    constexpr uint32_t G = Tile<NB>::G;
    if (k >= nst)
        return;
    const uint64_t own = it.s1 - it.s0;
    const uint32_t rows = (uint32_t)min((uint64_t)kTileRows, own - (uint64_t)k * kTileRows);
    const unsigned char *src = p.x + (it.lo + it.s0 + (uint64_t)k * kTileRows) * p.x_tok_b + it.u0 * NB;
    for (uint32_t q = threadIdx.x; q < kTileRows * G; q += kTileThreads) {
        const uint32_t r = q / G, g = q % G;
        if (r < rows && g < it.gu)
            copy_unit<NB>(ring_at<NB, G>(ring, k * kTileRows + r, g), src + r * p.x_tok_b + g * NB);
    }
}

/* This thread's RL rows of stage k (unit g, rows lane*RL ..): the W-1 inputs before the first
 * from the ring into registers, then per row its input, the output, and the window's shift. */
template <int DT, int NB>
__device__ __forceinline__ void compute_stage(const ConvParams &p, const TileItem &it, unsigned char *ring,
                                              const float *s_w, uint32_t k, uint32_t g, uint32_t lane)
{
    constexpr int ES = Elem<DT>::size, VE = NB / ES;
    constexpr uint32_t G = Tile<NB>::G, RL = Tile<NB>::RL, pitch = G * VE + 4;
    const uint32_t W = p.W;
    const uint64_t own = it.s1 - it.s0;
    const uint32_t rows = (uint32_t)min((uint64_t)kTileRows, own - (uint64_t)k * kTileRows);
    const uint32_t r0 = lane * RL;
    if (g >= it.gu || r0 >= rows)
        return;
    const uint32_t rel0 = k * kTileRows + r0; /* ring-relative index of the first output */
    Raw<NB> in[kMaxWidth];                    /* in[d]: the input d tokens back */
#pragma unroll
    for (int d = 1; d < kMaxWidth; d++)
        in[d] = d < (int)W ? lds<NB>(ring_at<NB, G>(ring, rel0 - d, g)) : raw_zero<NB>();
    const float *w_col = s_w + g * VE;
    unsigned char *yp = p.y + (it.lo + it.s0 + rel0) * p.y_tok_b + (it.u0 + g) * NB;
    const uint32_t n = rows - r0 < RL ? rows - r0 : RL;
#pragma unroll
    for (uint32_t m = 0; m < RL; m++) {
        if (m < n) {
            in[0] = lds<NB>(ring_at<NB, G>(ring, rel0 + m, g));
            store<NB>(yp + m * p.y_tok_b, conv_unit<DT, NB>(in, w_col, pitch, W, p.silu));
#pragma unroll
            for (int d = kMaxWidth - 1; d > 0; d--)
                in[d] = in[d - 1];
        }
    }
}

/* The state row after the sequence: xx indices L .. L + W-2, from the ring where this segment
 * holds them (its halo and own rows, xx [s0, s1 + W-1)), else from x (out of place only: x is
 * intact). */
template <int DT, int NB>
__device__ void store_state(const ConvParams &p, const TileItem &it, unsigned char *ring)
{
    constexpr int ES = Elem<DT>::size, VE = NB / ES;
    constexpr uint32_t G = Tile<NB>::G;
    const uint32_t W = p.W;
    for (uint32_t q = threadIdx.x; q < (W - 1) * G; q += blockDim.x) {
        const uint32_t r = q / G, g = q % G;
        if (g >= it.gu)
            continue;
        const uint64_t i = it.L + r, c0 = (it.u0 + g) * VE;
        Raw<NB> u;
        if (i < it.s1 + W - 1)
            u = lds<NB>(ring_at<NB, G>(ring, (uint32_t)(i - it.s0) - (W - 1), g));
        else
            u = load<NB>(p.x + (it.lo + i - (W - 1)) * p.x_tok_b + c0 * ES);
        state_store<ES, NB>(p, state_at<ES, NB>(p, it.row, r, c0), u);
    }
}

/* The item's segment: halo, cluster barrier when in place, then the stages through the ring. */
template <int DT, int NB>
__device__ void tile_item(const ConvParams &p, const TileItem &it, unsigned char *ring, const float *s_w, uint32_t seg)
{
    constexpr uint32_t G = Tile<NB>::G;
    const uint32_t g = threadIdx.x % G, lane = threadIdx.x / G;
    const uint64_t own = it.s1 - it.s0;
    const uint32_t nst = (uint32_t)((own + kTileRows - 1) / kTileRows);
    if (own > 0)
        load_halo<DT, NB>(p, it, ring);
    if (p.cluster)
        cluster_sync();
#pragma unroll
    for (uint32_t k = 0; k < kTileAhead; k++) {
        issue_stage<DT, NB>(p, it, ring, k, nst);
        cp_async_commit();
    }
    for (uint32_t k = 0; k < nst; k++) {
        cp_async_wait<kTileAhead - 1>();
        __syncthreads(); /* stage k (and the halo) landed for every thread; slot k - 2 is free */
        issue_stage<DT, NB>(p, it, ring, k + kTileAhead, nst);
        cp_async_commit();
        compute_stage<DT, NB>(p, it, ring, s_w, k, g, lane);
    }
    cp_async_wait<0>();
    /* The state's writer: in a cluster the last non-empty segment (its ring holds the last W-1
     * inputs), else segment 0 (the only one reading the state rows). Block-uniform. */
    const bool writer = it.L > 0 && it.row >= 0 && (p.cluster ? own > 0 && it.s1 == it.L : seg == 0);
    if (writer && lmk_block_seq_stores(p.slots, p.slots_is64, it.s, p.n_seq, it.row))
        store_state<DT, NB>(p, it, ring);
}

template <int DT, int NB>
__global__ void __launch_bounds__(kTileThreads, kTileBlocksPerSm) conv_tile_kernel(const __grid_constant__ ConvParams p)
{
    constexpr int VE = NB / Elem<DT>::size;
    constexpr uint32_t G = Tile<NB>::G, pitch = G * VE + 4;
    extern __shared__ __align__(16) unsigned char smem[];
    unsigned char *ring = smem;
    float *s_w = reinterpret_cast<float *>(smem + kRingRows * kSliceBytes);
    const uint32_t segs = p.segs, seg = blockIdx.x % segs;
    const uint64_t step = gridDim.x / segs;
    pdl_enter();
    for (uint64_t item = blockIdx.x / segs; item < p.n_items; item += step) {
        TileItem it;
        const uint64_t s = item / p.n_slices;
        it.s = s;
        it.u0 = (item % p.n_slices) * G;
        it.gu = (uint32_t)min((uint64_t)G, p.n_units - it.u0);
        size_t lo, hi;
        lmk_seq_bounds(p.cu_seqlens, p.cu_is64, s, p.T, &lo, &hi);
        it.lo = lo, it.L = hi - lo;
        it.s0 = seg_bound(it.L, seg, segs, p.W);
        it.s1 = seg_bound(it.L, seg + 1, segs, p.W);
        it.row = p.state ? lmk_seq_slot(p.slots, p.slots_is64, s, p.n_slots) : -1;
        stage_weights(p, s_w, pitch, it.u0 * VE, it.gu * VE);
        tile_item<DT, NB>(p, it, ring, s_w, seg);
        __syncthreads(); /* the ring and the weights are refilled by the next item */
    }
}

/* ---------------------------------------------------------------------------------------------
 * Planning and launch (host).
 * ------------------------------------------------------------------------------------------- */

enum Kind { K_WALK, K_TILE };

struct LaunchPlan {
    Kind kind;
    uint32_t nb;     /* unit bytes: 16 or the element size */
    unsigned blocks, threads;
    size_t smem;
    bool pdl;
};

/* Widest unit (16 bytes, else one element) that every row start, stride and row length allows.
 * Strides of an axis of one are never applied, so they do not narrow it. */
uint32_t plan_unit(const lmk_causal_conv1d_args *a, uint32_t es)
{
    uint64_t bits = (uintptr_t)a->x | (uintptr_t)a->y | (a->C * es);
    if (a->T > 1)
        bits |= (a->x_tok | a->y_tok) * es;
    return bits % 16 == 0 ? 16 : es;
}

/* Whether state units move as one access: channel stride 1 and every offset a multiple of 16. */
bool plan_state_vec(const lmk_causal_conv1d_args *a, uint32_t es, uint32_t nb)
{
    if (!a->state || nb != 16 || a->st_ch != 1)
        return false;
    uint64_t bits = (uintptr_t)a->state;
    if (a->n_slots > 1)
        bits |= a->st_slot * es;
    if (a->W > 2)
        bits |= a->st_row * es;
    return bits % 16 == 0;
}

/* The walk kernel: a block per (slice of up to kWalkThreads units, group of sequences). */
void plan_walk(const lmk_causal_conv1d_args *a, ConvParams *p, LaunchPlan *L, uint32_t ve)
{
    const uint64_t nt = p->n_units < kWalkThreads ? (p->n_units + 31) / 32 * 32 : kWalkThreads;
    const uint64_t slices = (p->n_units + nt - 1) / nt;
    const uint64_t cap = kGridCap / slices ? kGridCap / slices : 1;
    const uint64_t groups = a->n_seq < cap ? a->n_seq : cap;
    p->n_slices = (uint32_t)slices;
    L->kind = K_WALK;
    L->blocks = (unsigned)(slices * groups);
    L->threads = (unsigned)nt;
    L->smem = (size_t)(a->W + 1) * (nt * ve + 4) * sizeof(float);
}

/* The tile kernel: a block per (sequence, slice of kSliceBytes, segment). Where (sequence, slice)
 * items alone leave SMs idle, sequences are split into as many segments as keep the grid within
 * one wave of resident blocks (kTileBlocksPerSm an SM: blocks are long walks, and a second wave
 * would double the time of the blocks in it), each of at least a stage of tokens on average. In
 * place the segments of a sequence must be one cluster (sm_90 code), else it is one segment. */
void plan_tile(const lmk_causal_conv1d_args *a, const lmk_cuda_device *d, ConvParams *p, LaunchPlan *L, uint32_t ve,
               uint32_t nb)
{
    const uint64_t G = kSliceBytes / nb;
    const uint64_t slices = (p->n_units + G - 1) / G;
    const uint64_t items = a->n_seq * slices;
    const bool sm90 = d->pdl || d->bulk; /* either is set only where the device runs sm_90 code */
    const uint64_t kmax = !a->in_place ? kMaxSegs : sm90 ? kMaxClusterSegs : 1;
    const uint64_t want = (uint64_t)d->sm_count * kTileBlocksPerSm / items;
    const uint64_t per_seq = a->T / a->n_seq / kTileRows;
    uint64_t segs = want < kmax ? want : kmax;
    segs = segs < per_seq ? segs : per_seq;
    segs = segs < 1 ? 1 : segs;
    const uint64_t cap = kGridCap / segs ? kGridCap / segs : 1;
    const uint64_t clusters = items < cap ? items : cap;
    p->n_slices = (uint32_t)slices;
    p->n_items = items;
    p->segs = (uint32_t)segs;
    p->cluster = a->in_place && segs > 1;
    L->kind = K_TILE;
    L->blocks = (unsigned)(clusters * segs);
    L->threads = kTileThreads;
    L->smem = (size_t)kRingRows * kSliceBytes + (size_t)(a->W + 1) * (G * ve + 4) * sizeof(float);
}

void plan(const lmk_causal_conv1d_args *a, const lmk_cuda_device *d, ConvParams *p, LaunchPlan *L)
{
    const uint32_t es = a->dtype == LMK_F32 ? 4 : 2;
    const uint32_t nb = plan_unit(a, es), ve = nb / es;
    *p = ConvParams{};
    p->x = static_cast<const unsigned char *>(a->x);
    p->y = static_cast<unsigned char *>(a->y);
    p->weight = a->weight, p->bias = a->bias;
    p->cu_seqlens = a->cu_seqlens, p->slots = a->slots;
    p->state = static_cast<unsigned char *>(a->state);
    p->T = a->T, p->n_seq = a->n_seq, p->n_slots = a->state ? a->n_slots : 0;
    p->x_tok_b = a->x_tok * es, p->y_tok_b = a->y_tok * es;
    p->st_slot = a->st_slot, p->st_row = a->st_row, p->st_ch = a->st_ch;
    p->n_units = a->C / ve;
    p->W = (uint32_t)a->W;
    p->w_dtype = a->w_dtype, p->b_dtype = a->bias_dtype;
    p->cu_is64 = a->cu_is64, p->slots_is64 = a->slots_is64;
    p->silu = a->act == LMK_ACT_SILU;
    p->st_vec = plan_state_vec(a, es, nb);
    L->nb = nb;
    L->pdl = d->pdl;
    if (a->T <= kWalkTokens * a->n_seq)
        plan_walk(a, p, L, ve);
    else
        plan_tile(a, d, p, L, ve, nb);
}

/* One launch, with programmatic serialization where the device has it and the cluster dimension
 * of a clustered tile launch. */
cudaError_t start(void (*kernel)(ConvParams), const ConvParams &p, const LaunchPlan &L, cudaStream_t st)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(L.blocks, 1, 1);
    cfg.blockDim = dim3(L.threads, 1, 1);
    cfg.dynamicSmemBytes = L.smem;
    cfg.stream = st;
    cudaLaunchAttribute attr[2];
    unsigned n = 0;
    if (L.pdl) {
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n].val.programmaticStreamSerializationAllowed = 1;
        n++;
    }
    if (p.cluster) {
        attr[n].id = cudaLaunchAttributeClusterDimension;
        attr[n].val.clusterDim.x = p.segs;
        attr[n].val.clusterDim.y = 1;
        attr[n].val.clusterDim.z = 1;
        n++;
    }
    cfg.attrs = attr;
    cfg.numAttrs = n;
    return cudaLaunchKernelEx(&cfg, kernel, p);
}

template <int DT, int NB> cudaError_t launch_nb(const ConvParams &p, const LaunchPlan &L, cudaStream_t st)
{
    return start(L.kind == K_WALK ? conv_walk_kernel<DT, NB> : conv_tile_kernel<DT, NB>, p, L, st);
}

template <int DT> cudaError_t launch_dt(const ConvParams &p, const LaunchPlan &L, cudaStream_t st)
{
    return L.nb == 16 ? launch_nb<DT, 16>(p, L, st) : launch_nb<DT, Elem<DT>::size>(p, L, st);
}

template <int DT> void preload_dt(cudaError_t *first)
{
    lmk_cuda_preload(conv_walk_kernel<DT, 16>, 0, first);
    lmk_cuda_preload(conv_tile_kernel<DT, 16>, 0, first);
    lmk_cuda_preload(conv_walk_kernel<DT, Elem<DT>::size>, 0, first);
    lmk_cuda_preload(conv_tile_kernel<DT, Elem<DT>::size>, 0, first);
}

} /* namespace */

lmk_status lmk_cuda_causal_conv1d(lmk_stream *s, const void *args)
{
    const lmk_causal_conv1d_args *a = (const lmk_causal_conv1d_args *)args;
    const lmk_cuda_device *d = lmk_cuda_dev(s->dev);
    lmk_status st = lmk_cuda_use(d->ordinal, "causal_conv1d: cudaSetDevice");
    if (st != LMK_OK)
        return st;
    ConvParams p;
    LaunchPlan L;
    plan(a, d, &p, &L);
    const cudaStream_t cs = lmk_cuda_stream_of(s);
    cudaError_t e;
    switch (a->dtype) {
    case LMK_F32: e = launch_dt<LMK_F32>(p, L, cs); break;
    case LMK_BF16: e = launch_dt<LMK_BF16>(p, L, cs); break;
    default: e = launch_dt<LMK_F16>(p, L, cs); break;
    }
    return e == cudaSuccess ? LMK_OK : lmk_cuda_fail(e, "causal_conv1d: kernel launch");
}

cudaError_t lmk_cuda_causal_conv1d_preload(void)
{
    cudaError_t first = cudaSuccess;
    preload_dt<LMK_F32>(&first);
    preload_dt<LMK_BF16>(&first);
    preload_dt<LMK_F16>(&first);
    return first;
}
