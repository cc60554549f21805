/*
 * cuda.cu - the CUDA kernels of rope (lmk.h's lmk_rope; lmk_rope_multi and lmk_rope_multi_qk reach
 * them through the same lmk_rope_args) and their launch planning. Every mode (NORMAL, NEOX, MROPE,
 * IMROPE, VISION) and pairing, every scaling (freq_scale, the YaRN ramp, freq_factors, attn_factor),
 * i32/u32/i64 positions, strided operands with their own token and head strides per tensor, one
 * tensor or q and k in one launch, each out of place or in place. This comment is the current
 * design; docs/cuda.md ("rope") has its figures and docs/decisions.md the alternatives measured
 * against it.
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
 * (plan_angles): the pair's position axis and exponent index by rope_math.h's rule itself
 * (lmk_rope_axis_at, its sums taken once on the host by lmk_rope_axes_of: no copy of the rule
 * here), and its factor by lmk_rope_freq's formula with theta_e = exp2(j * log2_step) in float64
 * (pair_freq; pow() is an out-of-line call on the device). Every thread of a warp reads the same
 * parameter words: a per-pair table in the parameters would be read at a different address by each
 * thread, and it bought nothing when timed against this form (docs/decisions.md, "Kernel
 * parameters small and uniform"). A launch rotates at most kSlicePairs
 * = 128 pairs: rope_dim <= 256 (every model we know) is one launch, a larger one takes a launch per
 * slice of 128 pairs, each rotating its own pairs (the first also copies the untouched elements).
 * freq_factors live in device memory, which the host cannot read without a sync: the device
 * divides the factor by ff[p] (lmk.h's theta is linear in theta_e and ff only divides theta_e, so
 * lmk_rope_freq(ff) = lmk_rope_freq(1) / ff up to two float64 roundings). Positions are read by
 * lmk_rope_pos's rule. The angle is reduced in float64 and its sin/cos evaluated in f32 (rope_cs).
 * An angle's loads (position, freq_factor) are issued before the data's and its arithmetic runs
 * while they are in flight (angle_begin, angle_end).
 *
 * Four kernels, all reading the (cos, sin) of a block's (token, pair) angles from a shared-memory
 * table that the block computes once for all its rows of q and k (docs/cuda.md, "rope: the four
 * kernels", says why each exists):
 *   rope_bulk_kernel (sm_90 and later, prefill with copy items: Qwen3.5's q and k, dense or q
 *     inside q|gate or a packed QKV): tiles of whole rows stream through a ring of stages in
 *     shared memory by bulk copies (kernel_common.cuh), are rotated there and stored back by bulk
 *     copies; a tensor whose heads are not adjacent moves a tile in one bulk
 *     tensor copy (a tensor map per side, made on the host). No thread holds data in flight.
 *     plan_bulk.
 *   rope_rows_kernel (the other prefill launches with copy items): a thread keeps one (row, unit)
 *     for several tokens, so a token costs it one 64-bit multiply-add of the token stride, and no
 *     division runs per item (a flat enumeration of items needs two run-time divisions and four
 *     64-bit products per item, at the load and again at the store, which leaves a launch whose
 *     items are mostly copies bound by its instructions). A tile of tokens has pair blocks
 *     (threads: pair unit x row x token lane; they form the tile's angles while their loads are in
 *     flight, then rotate) and copy blocks (threads: copy unit x row x token lane; no angles, no
 *     barrier), kTB (pairs) or kCopyTB tokens loaded before any is stored. plan_rows.
 *   rope_pairs_kernel (prefill without copy items: in place, or rope_dim == head_dim): items
 *     (token, row, unit) dealt to the threads kPairBatch at a time, unit fastest. Whole rows per
 *     warp and one angle per (token, pair) per block; where every item is a pair the enumeration's
 *     arithmetic is a small share of the work, and this shape beats every shape of the rows kernel
 *     there (Llama, in place). kPairCtas blocks an SM. plan_pairs.
 *   rope_decode_kernel (small T): one token per block, whole rows per block, one item per thread
 *     (threadIdx.x is the item of the row, threadIdx.y the row) and at most one angle per thread,
 *     no loop, no run-time division; the angle's factor is formed before the PDL wait. Chosen when
 *     its grid is at most 2 blocks per SM, where the prefill kernels cannot fill the GPU either.
 *     plan_decode.
 * On sm_90 and later all launch with programmatic dependent launch (kernel_common.cuh: pdl_enter,
 * lmk_cuda_device.pdl): a launch may start while the previous kernel of the stream finishes and
 * waits for it before its first memory access, which takes a short kernel's launch and ramp-up
 * off a decode call's time in a graph.
 * Everything a launch needs travels by value in RopeParams (the bulk kernel's in BulkParams, with
 * its tensor maps; no allocation, no copy, no sync): a call can be captured into a CUDA graph.
 * for_each_launch plans in named steps: plan_units (VE and layout), plan_geometry (rows, strides,
 * untouched ranges), then per slice of pairs plan_slice, plan_angles (the angle constants), and
 * plan_decode, plan_bulk, plan_rows or plan_pairs (the launch shape and its row of variants.h's
 * table: the kernel, and the decode kernel's copy items or the bulk kernel's tensor maps).
 * lmk_cuda_rope launches its plans through a switch over the table; lmk_cuda_rope_route (route.h)
 * reports them, and tests/test_cuda_routing.c checks the row each model shape takes. The bench
 * forces a row (lmk_cuda_rope_force) to time it against the planner's choice.
 *
 * Precision (lmk.h: f32 within 1e-5 * max(1, m) of float64 for |x| <= 2 and |angle| <= 2^20): the
 * angle is pos * freq in float64 and reduced by k*pi/2 in float64 (exact to ~1e-16 for |theta| <=
 * 2^20); sin and cos of the reduced f32 angle (|r| <= pi/4) come from minimax polynomials (rope_cs,
 * 1.5 ulp). The angle error is ~1e-7 rad, so f32 results sit within ~1e-6 of float64 and bf16/f16
 * results within one ulp. A non-finite angle (a freq_factor of 0 or inf) gives NaN, as cos(inf).
 */
#include "cuda/cuda_internal.h"
#include "cuda/kernel_common.cuh"
#include "ops/rope/rope.h"
#include "ops/rope_math.h"
#include "ops/rope/route.h"
#include "ops/rope/variants.h"

#include <atomic>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <math.h>
#include <stdint.h>
#include <type_traits>

namespace {

/* The prefill kernel with copy items (rope_rows_kernel): threads a block has at most, the tokens a
 * thread loads before it stores any (kTB of a pair item: 2 * kTB units, 128 bytes in flight a
 * thread; kCopyTB<ES> units of a copy item: 8 for 2-byte types, where the copies bound the time, 4
 * for f32), the angles a thread may form (kAngles: the block's critical path runs while the loads
 * are in flight; a second angle pays where rows are few, K alone), and the most (token, pair)
 * angles a tile holds (16 KB of shared memory). */
constexpr uint32_t kRowThreads = 256;
constexpr int kTB = 4;
template <int ES> constexpr int kCopyTB = ES == 2 ? 8 : 4;
constexpr uint32_t kAngles = 2;
constexpr uint32_t kTileAngles = 2048;
/* The prefill kernel without copy items (rope_pairs_kernel: in place, or rope_dim == head_dim):
 * threads of a block, and the pair items a thread loads before the barrier (128 bytes each with
 * 16-byte units). */
constexpr uint32_t kPairThreads = 256;
constexpr int kPairBatch = 4;
/* Blocks of rope_pairs_kernel an SM holds: 4 caps a thread at 64 registers. The kernel's time is
 * the rotation after each block's barrier, when that block has no loads in flight, so more blocks
 * an SM keep more loads in flight through it; 5 would spill (docs/decisions.md). */
constexpr int kPairCtas = 4;
/* The small-T kernel: threads a block aims for (whole rows of one token, one item per thread) and
 * the most items per row it takes (one row per block at most); wider rows (head_dim >= 512 with
 * narrow units) go to the prefill kernel. */
constexpr uint32_t kDecThreads = 256;
constexpr uint32_t kDecMaxItems = 512;
/* Up to this many rows in a launch (T x heads), 2-byte types take 8-byte units instead of 16: then
 * bf16 gets f32's items, threads and blocks at decode, and f32's time. */
constexpr uint64_t kDecNarrowRows = 64;
/* The most pairs one launch rotates (a decode block computes at most one angle per thread): rope_dim
 * <= 256, every model we know, is one launch; beyond, one launch per slice of kSlicePairs pairs. A
 * multiple of 8: a slice holds whole units of up to 8 pairs. */
constexpr uint32_t kSlicePairs = 128;
static_assert(kSlicePairs % 8 == 0 && kSlicePairs <= kDecThreads && kSlicePairs <= kPairThreads,
              "a slice holds whole units; one angle per thread");
static_assert(kSlicePairs * kTB <= kTileAngles, "a tile holds at least kTB tokens");

/* The bulk kernel (rope_bulk_kernel, sm_90 and later, prefill launches with copy items and 16-byte
 * units): threads a block has; blocks an SM holds, each with 1/kBulkCtas of the SM's shared memory
 * (a block's iterations are one serial chain, wait, rotate, barrier, stores, refill, so blocks side
 * by side overlap each other's chains; with three, an f32 q token of Qwen3.5 still fits 3 stages);
 * the bytes of rows a tile aims for (a tile is one stage of the ring, and each tile costs the block
 * a barrier: larger tiles, fewer barriers); the fewest stages worth it and the most (a barrier pair
 * each); the angles a thread forms per tile at most; and the smallest bulk copy a plan may issue
 * (below it the number of copies, not the bytes, sets the time: a copy per 128-byte rotated span,
 * in place, is far slower than rope_pairs_kernel). docs/decisions.md has the measurements. */
constexpr uint32_t kBulkThreads = 256;
constexpr uint32_t kBulkCtas = 3;
constexpr uint32_t kBulkTileBytes = 32768;
constexpr uint32_t kBulkMinStages = 3;
constexpr uint32_t kBulkMaxStages = 16;
constexpr uint32_t kBulkAngles = 2;
constexpr uint32_t kBulkMinCopy = 2048;

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
 * rope_math.h's axis rule with its sums taken on the host (lmk_rope_axes), and lmk_rope_freq's
 * factor with theta_e = exp2(j * log2_step) in float64. All uniform across a warp: every thread
 * reads the same parameter words, so no read is serialized (a per-pair table in the parameters
 * would be read at a different address by every thread of a warp). */
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

/* The prefill kernel's blocks (plan_rows). A tile is `tile` tokens; its blocks are `pg` pair
 * blocks, then `groups - pg` copy blocks. Pair block g covers pair units [u * p_bx, u * p_bx + p_bx)
 * of rows [r * p_by, r * p_by + p_by) (u = g % p_ug, r = g / p_ug): threads (unit, row, token lane),
 * p_bx x p_by x p_tz, each lane taking tokens z, z + p_tz, ... of the tile (at most kTB); the block
 * forms the angles of its own pairs only, at most one per thread. Copy block c covers copied rows
 * crow0 + [c * c_by, c * c_by + c_by): threads (copy unit, row, token lane), c_bx x c_by x c_tz,
 * c_bx <= nc looping over the units. */
struct RowsPlan {
    uint64_t seq, n_blocks;          /* tokens; tiles * groups */
    uint32_t tile, groups, pg;
    uint32_t p_bx, p_ug, p_by, p_tz;
    uint32_t c_bx, c_by, c_tz, crow0, crows;
};

/* The blocks of the prefill kernel without copy items (plan_pairs_flat): a block is a tile of
 * tile_tokens tokens and a group of rows; its items (token, row, unit), unit fastest, are dealt to
 * the threads kPairBatch at a time. */
struct PairsPlan {
    uint64_t seq, n_blocks;          /* tokens; tiles * groups */
    uint32_t tile_tokens;
    uint32_t groups, rows_per_group;
};

/* How the bulk kernel moves one tensor's rows of a tile in one direction (BulkPlan.ld_mode,
 * st_mode; bulk_mode, plan_bulk). */
enum BulkMode : uint32_t {
    BULK_ROW,    /* a bulk copy per row */
    BULK_TOKEN,  /* a bulk copy per token: the heads are adjacent */
    BULK_TILE,   /* one bulk copy for the tile: heads and tokens adjacent */
    BULK_TENSOR, /* one bulk tensor copy for the tile through a tensor map: heads not adjacent */
};

/* The plan of rope_bulk_kernel (plan_bulk). A tile is `tile` tokens; block b takes tiles b, b +
 * grid, ... through a ring of `stages` stages in shared memory. A stage holds the tile's rows of
 * each tensor, [token][head][span_b[j]] from byte region_b[j]: the whole row of a tensor that is
 * out of place (its untouched elements travel with the row, bit-exact), only the rotated span of
 * one in place (its first rope_dim elements; plan_bulk admits only layouts where those are all the
 * rotated ones). Each bulk copy moves one row (BULK_ROW), one token's rows (BULK_TOKEN: the heads
 * are adjacent) or the whole tile's (BULK_TILE: tokens adjacent too), per tensor and direction
 * (ld_mode, st_mode); BULK_TENSOR moves the tile's rows of a tensor whose heads are not adjacent
 * (q inside q|gate or a packed QKV, a rotated span in place) in one bulk tensor copy, through the
 * tensor map BulkParams.tm[2 * j + out]. Shared memory: a barrier per stage for its rows and one for its
 * positions (kBulkMaxStages of each), two (cos, sin) tables of tile * half from cs0, then per
 * stage its rows (stage_b bytes from stage0, each tensor's from a 128-byte boundary) and the
 * positions of its angles (8 bytes each from pos0). */
struct BulkPlan {
    uint64_t seq, tiles;
    uint32_t tile, stages, n_pos;    /* n_pos: threads with an angle (they arrive on every stage) */
    uint32_t span_b[2], region_b[2], tok_b; /* tok_b: one token's bytes in a stage, both tensors */
    uint32_t box_tok_b;              /* of tok_b, the bytes BULK_TENSOR loads: a tensor copy fills its
                                        whole box, the tokens past the tensor's end with zeros */
    BulkMode ld_mode[2], st_mode[2];
    uint32_t cs0, stage0, stage_b, pos0;
};

/* Everything a launch needs, passed by value (kernel parameter space: no allocation, no copy). */
struct RopeParams {
    Geom g;
    AnglePlan a;
    RowsPlan rp;
    PairsPlan pp;
    BulkPlan bp;
};
/* RopeParams and the tensor maps of BulkPlan's BULK_TENSOR sides (plan_tensor_map): the parameters
 * of rope_bulk_kernel's instance for plans with such a side. Every other launch goes without them: the
 * parameters' size costs every launch time in a graph. */
struct BulkParams {
    CUtensorMap tm[4];
    RopeParams r;
};
static_assert(sizeof(BulkParams) <= 4000, "kernel parameters must stay under the 4 KB limit");

template <typename P> constexpr bool kMaps = false; /* P holds tensor maps */
template <> constexpr bool kMaps<BulkParams> = true;

/* Whether a bulk plan moves some side by BULK_TENSOR (its launch then takes BulkParams). */
inline bool uses_maps(const BulkPlan &bp)
{
    return bp.ld_mode[0] == BULK_TENSOR || bp.st_mode[0] == BULK_TENSOR || bp.ld_mode[1] == BULK_TENSOR ||
           bp.st_mode[1] == BULK_TENSOR;
}

/* How a launch is shaped: its row of the variants table (variants.h) and its grid. */
struct LaunchPlan {
    lmk_rope_variant variant;
    bool pdl;                        /* programmatic stream serialization (lmk_cuda_device.pdl) */
    dim3 blocks, threads;
    size_t smem;
};

/* ---------------------------------------------------------------------------------------------
 * Device helpers: raw units, dtypes, the angle.
 * ------------------------------------------------------------------------------------------- */

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

/* The factor of the slice's pair i before freq_factors: kernel parameters only, so the decode
 * kernel forms it before it waits for the previous kernel (pdl_enter), off its critical path. */
__device__ __forceinline__ double angle_freq(const AnglePlan &a, uint32_t i)
{
    uint32_t j;
    (void)lmk_rope_axis_at(&a.axes, a.p0 + i, &j);
    return pair_freq(a, a.p0 + i, j);
}

__device__ __forceinline__ float2 angle_finish(const AnglePlan &a, double freq, const AngleIn &in)
{
    if (a.ff)
        freq = freq / (double)in.ff;
    const float2 cs = rope_cs((double)in.pos * freq);
    return make_float2(cs.x * a.mscale, cs.y * a.mscale);
}

__device__ __forceinline__ float2 angle_end(const AnglePlan &a, uint32_t i, const AngleIn &in)
{
    return angle_finish(a, angle_freq(a, i), in);
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
            const float a = elem<DT, VE>(ra, 2 * k);
            const float b = elem<DT, VE>(ra, 2 * k + 1);
            const float2 r = rotate2(a, b, c[k], sn[k]);
            o[2 * k] = r.x, o[2 * k + 1] = r.y;
        }
        store<VE * ES>(out, pack<DT, VE>(o));
    } else {
        float oa[VE], ob[VE];
#pragma unroll
        for (int e = 0; e < VE; e++) {
            const float a = elem<DT, VE>(ra, e);
            const float b = elem<DT, VE>(rb, e);
            const float2 r = rotate2(a, b, c[e], sn[e]);
            oa[e] = r.x, ob[e] = r.y;
        }
        store<VE * ES>(out, pack<DT, VE>(oa));
        store<VE * ES>(out + stride_b, pack<DT, VE>(ob));
    }
}

/* ---------------------------------------------------------------------------------------------
 * The prefill kernel.
 * ------------------------------------------------------------------------------------------- */

/* Where row r (q for r < nh0, else k) starts at token 0, in and out, and its token strides (bytes).
 * A thread keeps one row for all its tokens: a token then costs one 64-bit multiply-add. */
struct RowPtr {
    const unsigned char *in;
    unsigned char *out;
    uint64_t it, ot;
};
__device__ __forceinline__ RowPtr row_ptr(const Geom &g, uint32_t r)
{
    const bool k = r >= g.nh0;
    const uint64_t h = k ? r - g.nh0 : r;
    return RowPtr{(k ? g.in1 : g.in0) + h * (k ? g.in_head1 : g.in_head0),
                  (k ? g.out1 : g.out0) + h * (k ? g.out_head1 : g.out_head0), k ? g.in_tok1 : g.in_tok0,
                  k ? g.out_tok1 : g.out_tok0};
}

/* A pair block: thread (x, y, z) = (pair unit u0 + x, row r0 + y, token lane z) loads its unit of
 * tokens z, z + p_tz, ... (at most kTB) while the block forms the (cos, sin) of its pairs at the
 * tile's tokens (one angle per thread at most, its loads issued before the data's), waits at the
 * barrier and rotates. Threads past the block's shape load nothing but still reach the barrier
 * (they may form angles). */
template <int DT, int VE, bool IL>
__device__ __forceinline__ void pair_block(const RopeParams &p, uint64_t t0, uint32_t tt, uint32_t group,
                                           float2 *s_cs)
{
    constexpr int NB = VE * Elem<DT>::size;
    constexpr uint32_t PPU = IL ? VE / 2 : VE;
    const Geom &g = p.g;
    const RowsPlan &rp = p.rp;
    const uint32_t rg = group / rp.p_ug, u0 = (group - rg * rp.p_ug) * rp.p_bx;
    const uint32_t nu = min(rp.p_bx, g.npu - u0), np = nu * PPU; /* units and pairs of the block */
    const uint32_t tid = threadIdx.x, nthr = blockDim.x, n_ang = tt * np;
    const uint32_t x = tid % rp.p_bx, yz = tid / rp.p_bx, y = yz % rp.p_by, z = yz / rp.p_by;
    const uint32_t r = rg * rp.p_by + y;
    const bool live = x < nu && z < rp.p_tz && r < g.rows;
    const uint32_t a_tl = tid / np, a_i = u0 * PPU + (tid - a_tl * np);
    AngleIn ain{};
    if (tid < n_ang)
        ain = angle_begin(p.a, t0 + a_tl, a_i);
    const uint32_t off = g.pair_b + (u0 + x) * g.ustep_b;
    RowPtr rr{};
    Raw<NB> va[kTB], vb[kTB];
    if (live) {
        rr = row_ptr(g, r);
#pragma unroll
        for (int b = 0; b < kTB; b++) {
            const uint32_t tl = z + b * rp.p_tz;
            if (tl < tt) {
                const unsigned char *src = rr.in + (t0 + tl) * rr.it + off;
                va[b] = load<NB>(src);
                if constexpr (!IL)
                    vb[b] = load<NB>(src + g.stride_b);
            }
        }
    }
    if (tid < n_ang)
        s_cs[tid] = angle_end(p.a, a_i, ain);
    for (uint32_t k = tid + nthr; k < n_ang; k += nthr) { /* only if the plan could not avoid it */
        const uint32_t tl = k / np, i = u0 * PPU + (k - tl * np);
        s_cs[k] = angle_end(p.a, i, angle_begin(p.a, t0 + tl, i));
    }
    __syncthreads();
    if (live) {
#pragma unroll
        for (int b = 0; b < kTB; b++) {
            const uint32_t tl = z + b * rp.p_tz;
            if (tl < tt)
                rotate_store<DT, VE, IL>(va[b], vb[b], s_cs + tl * np + x * PPU, rr.out + (t0 + tl) * rr.ot + off,
                                         g.stride_b);
        }
    }
}

/* A copy block: thread (x, y, z) moves copy units x, x + c_bx, ... of copied row crow0 + c * c_by
 * + y, tokens z, z + c_tz, ..., CTB loads before their stores. No angles, no barrier. */
template <int NB, int CTB>
__device__ __forceinline__ void copy_block(const Geom &g, const RowsPlan &rp, uint64_t t0, uint32_t tt, uint32_t c)
{
    const uint32_t tid = threadIdx.x;
    const uint32_t x0 = tid % rp.c_bx, yz = tid / rp.c_bx, y = yz % rp.c_by, z = yz / rp.c_by;
    const uint32_t rc = c * rp.c_by + y;
    if (z >= rp.c_tz || rc >= rp.crows)
        return;
    const RowPtr rr = row_ptr(g, rp.crow0 + rc);
    for (uint32_t x = x0; x < g.nc; x += rp.c_bx) {
        const uint32_t off = (x < g.nc1 ? g.c1_b : g.c2_b) + x * NB;
        const unsigned char *src = rr.in + off;
        unsigned char *dst = rr.out + off;
        for (uint32_t tl = z; tl < tt; tl += CTB * rp.c_tz) {
            Raw<NB> v[CTB];
#pragma unroll
            for (int b = 0; b < CTB; b++)
                if (tl + b * rp.c_tz < tt)
                    v[b] = load<NB>(src + (t0 + tl + b * rp.c_tz) * rr.it);
#pragma unroll
            for (int b = 0; b < CTB; b++)
                if (tl + b * rp.c_tz < tt)
                    store<NB>(dst + (t0 + tl + b * rp.c_tz) * rr.ot, v[b]);
        }
    }
}

/* A block is one (tile, group): pair groups first, then copy groups, so the blocks of one tile run
 * side by side over the same rows. The grid is 2-D only past 2^31 - 1 blocks. The (cos, sin) table
 * is dynamic shared memory of tile * half entries (pair blocks only use it). */
template <int DT, int VE, bool IL>
__global__ void __launch_bounds__(kRowThreads, 3) rope_rows_kernel(const __grid_constant__ RopeParams p)
{
    extern __shared__ __align__(16) float2 s_cs[];
    const RowsPlan &rp = p.rp;
    TileGroup b;
    if (!tile_group(rp.n_blocks, rp.groups, rp.tile, rp.seq, &b))
        return;
    pdl_enter();
    if (b.group < rp.pg)
        pair_block<DT, VE, IL>(p, b.t0, b.tt, b.group, s_cs);
    else
        copy_block<VE * Elem<DT>::size, kCopyTB<Elem<DT>::size>>(p.g, rp, b.t0, b.tt, b.group - rp.pg);
}

/* ---------------------------------------------------------------------------------------------
 * The prefill kernel without copy items.
 * ------------------------------------------------------------------------------------------- */

/* One batch of pair items of a thread: the loaded a and b units, and the item's row and (token of
 * the tile, unit) from which pairs_store recomputes the output address and the table index
 * (two 32-bit words instead of an output pointer and a table index keep the 16-byte kernels
 * within their register cap). tl < 256 and u < 128 (a tile holds at most kPairThreads angles, a
 * slice at most kSlicePairs pairs), so both fit 16 bits. */
template <int NB> struct PairBatch {
    Raw<NB> a[kPairBatch], b[kPairBatch];
    uint32_t r[kPairBatch];   /* row; ~0u: no item */
    uint32_t key[kPairBatch]; /* tl << 16 | u */
};

/* Loads the pair items i, i + kPairThreads, ... of this block. An item is (token tl of the tile,
 * row r_lo + rr, unit u of the slice), u fastest so a warp reads contiguous units. */
template <int NB, bool IL>
__device__ __forceinline__ void pairs_load(const Geom &g, PairBatch<NB> &bt, uint32_t i, uint32_t n_items,
                                           uint32_t nr, uint64_t t0, uint32_t r_lo)
{
#pragma unroll
    for (int k = 0; k < kPairBatch; k++) {
        const uint32_t item = i + k * kPairThreads;
        bt.r[k] = ~0u;
        if (item < n_items) {
            const uint32_t u = item % g.npu, rr = item / g.npu;
            const uint32_t tl = rr / nr, r = r_lo + (rr - tl * nr);
            const RowRef ref = row_ref(g, t0 + tl, r);
            const uint32_t off = g.pair_b + u * g.ustep_b;
            bt.a[k] = load<NB>(ref.in + off);
            if constexpr (!IL)
                bt.b[k] = load<NB>(ref.in + off + g.stride_b);
            bt.r[k] = r;
            bt.key[k] = tl << 16 | u;
        }
    }
}

template <int DT, int VE, bool IL>
__device__ __forceinline__ void pairs_store(const Geom &g, const PairBatch<VE * Elem<DT>::size> &bt,
                                            const float2 *s_cs, uint64_t t0)
{
    constexpr uint32_t PPU = IL ? VE / 2 : VE;
#pragma unroll
    for (int k = 0; k < kPairBatch; k++)
        if (bt.r[k] != ~0u) {
            const uint32_t tl = bt.key[k] >> 16, u = bt.key[k] & 0xffffu;
            const RowRef ref = row_ref(g, t0 + tl, bt.r[k]);
            rotate_store<DT, VE, IL>(bt.a[k], bt.b[k], s_cs + tl * g.half + u * PPU,
                                     ref.out + g.pair_b + u * g.ustep_b, g.stride_b);
        }
}

/* A block is one (tile, row group): the angles' loads are issued (one angle per thread at most:
 * the host sizes the tile so), the first batch of items is loaded, the angles are finished into
 * shared memory, the block syncs and rotates, loading further batches as it goes. At most 64
 * registers, so kPairCtas = 4 blocks of 256 threads fit an SM (ptxas -v: the cap costs the
 * 2-byte NEOX instances 8 bytes of spill stores and no loads, the f32 one 16 bytes stored and 8
 * loaded). */
template <int DT, int VE, bool IL>
__global__ void __launch_bounds__(kPairThreads, kPairCtas) rope_pairs_kernel(const __grid_constant__ RopeParams p)
{
    constexpr int NB = VE * Elem<DT>::size;
    extern __shared__ __align__(16) float2 s_cs[];
    const Geom &g = p.g;
    const PairsPlan &pp = p.pp;
    TileGroup b;
    if (!tile_group(pp.n_blocks, pp.groups, pp.tile_tokens, pp.seq, &b))
        return;
    const uint64_t t0 = b.t0;
    const uint32_t tt = b.tt, r_lo = b.group * pp.rows_per_group;
    const uint32_t nr = min(pp.rows_per_group, g.rows - r_lo);
    const uint32_t n_items = tt * nr * g.npu;
    pdl_enter();

    const bool angle = threadIdx.x < tt * g.half;
    const uint32_t a_tl = threadIdx.x / g.half, a_i = threadIdx.x - a_tl * g.half;
    AngleIn ain{};
    if (angle)
        ain = angle_begin(p.a, t0 + a_tl, a_i);
    PairBatch<NB> bt;
    uint32_t i = threadIdx.x;
    pairs_load<NB, IL>(g, bt, i, n_items, nr, t0, r_lo);
    if (angle)
        s_cs[threadIdx.x] = angle_end(p.a, a_i, ain);
    __syncthreads();
    for (;;) {
        pairs_store<DT, VE, IL>(g, bt, s_cs, t0);
        i += kPairBatch * kPairThreads;
        if (i >= n_items)
            break;
        pairs_load<NB, IL>(g, bt, i, n_items, nr, t0, r_lo);
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
    const double freq = j < g.half ? angle_freq(p.a, j) : 0.0;
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
        s_cs[j] = angle_finish(p.a, freq, ain);
    if (do_copy)
        store<NB>(ref.out + off, a);
    __syncthreads();
    if (live && pair)
        rotate_store<DT, VE, IL>(a, b, s_cs + x * PPU, ref.out + off, g.stride_b);
}

/* ---------------------------------------------------------------------------------------------
 * The bulk kernel (sm_90 and later): tiles stream through shared memory by bulk copies.
 * ------------------------------------------------------------------------------------------- */

/* One tensor's side of a tile's copies (j: 0 q, 1 k; out: the stores, else the loads), issued by
 * the 32 lanes of warp 0 round robin; the host makes a BULK_TENSOR side's tensor map from the same
 * fields (plan_bulk). */
struct BulkSide {
    unsigned char *base; /* the tensor's input or output */
    uint64_t tok, head;  /* its strides, bytes */
    uint32_t nh;
    BulkMode mode;
};
__host__ __device__ __forceinline__ BulkSide bulk_side(const Geom &g, const BulkPlan &bp, int j, bool out)
{
    BulkSide sd;
    sd.base = out ? (j ? g.out1 : g.out0) : const_cast<unsigned char *>(j ? g.in1 : g.in0);
    sd.tok = out ? (j ? g.out_tok1 : g.out_tok0) : (j ? g.in_tok1 : g.in_tok0);
    sd.head = out ? (j ? g.out_head1 : g.out_head0) : (j ? g.in_head1 : g.in_head0);
    sd.nh = j ? g.rows - g.nh0 : g.nh0;
    sd.mode = out ? bp.st_mode[j] : bp.ld_mode[j];
    return sd;
}

/* The helpers and the kernel's body exist for sm_90 and later (and the host pass); code for older
 * GPUs has an empty kernel, which the host never launches (plan_bulk). */
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900

/* The RopeParams of either kind of the bulk kernel's parameters. */
__device__ __forceinline__ const RopeParams &rope_of(const RopeParams &p)
{
    return p;
}
__device__ __forceinline__ const RopeParams &rope_of(const BulkParams &p)
{
    return p.r;
}

/* Bulk copy k of a tile's copies of one tensor in one direction (BulkPlan.ld_mode, st_mode): its
 * first token of the tile and head, and its bytes; bulk_ops: how many a tile has. */
struct BulkOp {
    uint32_t tl, h, bytes;
};
__device__ __forceinline__ uint32_t bulk_ops(BulkMode mode, uint32_t nh, uint32_t tt)
{
    return nh == 0 ? 0 : mode == BULK_TILE ? 1 : mode == BULK_TOKEN ? tt : tt * nh;
}
__device__ __forceinline__ BulkOp bulk_op(BulkMode mode, uint32_t k, uint32_t nh, uint32_t span, uint32_t tt)
{
    if (mode == BULK_TILE)
        return BulkOp{0, 0, tt * nh * span};
    if (mode == BULK_TOKEN)
        return BulkOp{k, 0, nh * span};
    const uint32_t tl = k / nh;
    return BulkOp{tl, k - tl * nh, span};
}

/* Warp 0 fills stage st with the tile of tokens [t0, t0 + tt) (lane 0 first adds the tile's bytes
 * to the phase of bar, then every lane issues its copies; lane j a BULK_TENSOR tensor's one), or, with
 * out, stores the stage's rows into the outputs in this lane's current bulk group. */
template <typename P>
__device__ __forceinline__ void bulk_tile(const P &prm, uint64_t t0, uint32_t tt, unsigned char *st, uint64_t *bar,
                                          bool out, uint32_t lane)
{
    const Geom &g = rope_of(prm).g;
    const BulkPlan &bp = rope_of(prm).bp;
    if (!out) {
        if (lane == 0)
            mbar_arrive_bytes(bar, kMaps<P> ? tt * bp.tok_b + (bp.tile - tt) * bp.box_tok_b : tt * bp.tok_b);
        __syncwarp();
    }
    for (int j = 0; j < 2; j++) {
        const BulkSide sd = bulk_side(g, bp, j, out);
        if constexpr (kMaps<P>) {
            if (sd.mode == BULK_TENSOR) {
                if (lane == (uint32_t)j && sd.nh) {
                    const CUtensorMap *map = &prm.tm[2 * j + out];
                    if (out)
                        tensor_store3(map, 0, 0, (int)t0, st + bp.region_b[j]);
                    else
                        tensor_load3(st + bp.region_b[j], map, 0, 0, (int)t0, bar);
                }
                continue;
            }
        }
        const uint32_t n = bulk_ops(sd.mode, sd.nh, tt), span = bp.span_b[j];
        for (uint32_t k = lane; k < n; k += 32) {
            const BulkOp o = bulk_op(sd.mode, k, sd.nh, span, tt);
            unsigned char *sm = st + bp.region_b[j] + (o.tl * sd.nh + o.h) * span;
            unsigned char *gm = sd.base + (t0 + o.tl) * sd.tok + o.h * sd.head;
            if (out)
                bulk_store(gm, sm, o.bytes);
            else
                bulk_load(sm, gm, o.bytes, bar);
        }
    }
}

/* A thread's angles: slots k = kBulkThreads - 1 - tid + m * kBulkThreads (the last threads, as
 * warp 0 issues the copies) of a tile's tile * half (token, pair) angles. A slot's pair, position
 * axis and factor are the same for every tile; only the token moves. */
struct BulkAngles {
    double freq[kBulkAngles];
    uint64_t pidx[kBulkAngles]; /* its position's index at the tile's first token */
    uint32_t tl[kBulkAngles], k[kBulkAngles];
    float ff[kBulkAngles];
    uint32_t n; /* live slots */
};

/* The positions of this thread's angles at the tile of tokens [t0, t0 + tt) into the stage's
 * position slots (cp.async), then its arrival on the stage's barrier when they have landed. */
__device__ __forceinline__ void bulk_positions(const AnglePlan &a, const BulkAngles &ba, uint64_t t0, uint32_t tt,
                                               unsigned char *slots, uint64_t *bar)
{
    const bool wide = a.pos_dtype == LMK_I64;
#pragma unroll
    for (uint32_t m = 0; m < kBulkAngles; m++)
        if (m < ba.n && ba.tl[m] < tt)
            cp_async_word(slots + ba.k[m] * 8,
                          (const unsigned char *)a.pos + (ba.pidx[m] + t0) * (wide ? 8 : 4), wide);
    mbar_arrive_cp_async(bar);
}

/* This thread's angles of a tile from its position slots into the (cos, sin) table: lmk_rope_pos's
 * rule (i32 and u32 as i32), then angle_finish, as every other kernel. */
__device__ __forceinline__ void bulk_form(const AnglePlan &a, const BulkAngles &ba, uint32_t tt,
                                          const unsigned char *slots, float2 *cs)
{
#pragma unroll
    for (uint32_t m = 0; m < kBulkAngles; m++)
        if (m < ba.n && ba.tl[m] < tt) {
            const unsigned char *w = slots + ba.k[m] * 8;
            AngleIn in;
            in.pos = a.pos_dtype == LMK_I64 ? *reinterpret_cast<const long long *>(w)
                                            : (int64_t)*reinterpret_cast<const int *>(w);
            in.ff = ba.ff[m];
            cs[ba.k[m]] = angle_finish(a, ba.freq[m], in);
        }
}

/* A 16-byte unit of shared memory. */
__device__ __forceinline__ Raw<16> lds16(const unsigned char *p)
{
    const uint4 v = *reinterpret_cast<const uint4 *>(p);
    Raw<16> r;
    r.w[0] = v.x, r.w[1] = v.y, r.w[2] = v.z, r.w[3] = v.w;
    return r;
}


/* This thread's angle slots (parameters only: formed before the PDL wait): slots k = kBulkThreads -
 * 1 - tid + m * kBulkThreads of a tile's n_cs (token, pair) angles, each with its factor and its
 * position's index at the tile's first token. */
__device__ __forceinline__ BulkAngles bulk_angle_slots(const AnglePlan &a, const Geom &g, uint32_t tid,
                                                       uint32_t n_cs)
{
    BulkAngles ba;
    ba.n = 0;
#pragma unroll
    for (uint32_t m = 0; m < kBulkAngles; m++) {
        const uint32_t k = kBulkThreads - 1 - tid + m * kBulkThreads;
        if (k < n_cs) {
            const uint32_t tl = k / g.half, i = k - tl * g.half;
            uint32_t j;
            const uint32_t axis = lmk_rope_axis_at(&a.axes, a.p0 + i, &j);
            ba.freq[m] = pair_freq(a, a.p0 + i, j);
            ba.pidx[m] = (uint64_t)axis * a.pos_axis_stride + tl;
            ba.tl[m] = tl, ba.k[m] = k;
            ba.n = m + 1;
        }
    }
    return ba;
}

/* A thread's share of a tile's rotation (parameters only): pair unit x (at byte off of a row) of the
 * tile's rows y, y + ylanes, ..., walked as (token, row) counters from (tl0, r0) that advance by
 * (dq, dr) a step. */
struct BulkRot {
    uint32_t x, y, ylanes, off, r0, tl0, dq, dr;
};
__device__ __forceinline__ BulkRot bulk_rot(const Geom &g, uint32_t tid)
{
    BulkRot w;
    w.x = tid % g.npu, w.y = tid / g.npu, w.ylanes = kBulkThreads / g.npu;
    w.r0 = w.y % g.rows, w.tl0 = w.y / g.rows, w.dq = w.ylanes / g.rows, w.dr = w.ylanes - w.dq * g.rows;
    w.off = w.x * g.ustep_b;
    return w;
}

/* Rotates this thread's pair units of the tile of tt tokens in stage st, in place, with the tile's
 * (cos, sin) table cs. */
template <int DT, bool IL>
__device__ __forceinline__ void bulk_rotate(const Geom &g, const BulkPlan &bp, const BulkRot &w, unsigned char *st,
                                            const float2 *cs, uint32_t tt)
{
    constexpr int VE = 16 / Elem<DT>::size;
    constexpr uint32_t PPU = IL ? VE / 2 : VE;
    if (w.y >= w.ylanes)
        return;
    uint32_t tl = w.tl0, r = w.r0;
    while (tl < tt) {
        const uint32_t j = r >= g.nh0, h = r - j * g.nh0, nh = j ? g.rows - g.nh0 : g.nh0;
        unsigned char *row = st + bp.region_b[j] + (tl * nh + h) * bp.span_b[j] + w.off;
        Raw<16> ra = lds16(row), rb{};
        if constexpr (!IL)
            rb = lds16(row + g.stride_b);
        rotate_store<DT, VE, IL>(ra, rb, cs + tl * g.half + w.x * PPU, row, g.stride_b);
        tl += w.dq, r += w.dr;
        if (r >= g.rows)
            r -= g.rows, tl++;
    }
}

/* Warp 0: waits until the stores of the tile `lag` iterations back have read their stage, which is
 * refilled next. */
__device__ __forceinline__ void bulk_wait_stage(uint32_t lag)
{
    if (lag == 2)
        bulk_wait_read<2>();
    else
        bulk_wait_read<1>();
    __syncwarp();
}

#endif

/* Prefill with 16-byte units on sm_90 and later (plan_bulk): block b takes tiles b, b + grid, ...
 * through a ring of S stages. A stage is filled by warp 0's bulk loads (counted by the stage's
 * barrier) and by the angle threads' copies of its positions (by its second one). Once it has
 * landed, the threads rotate its pair units in shared memory (thread: pair unit x, rows y, y +
 * kBulkThreads / npu, ... of the tile), the angle threads form the next tile's (cos, sin) from its
 * positions, the block syncs, and warp 0 stores the stage (its untouched elements moved as they
 * came, bit-exact) and refills the stage of the tile `lag` iterations back (2 from 4 stages on,
 * else 1), whose stores have read it by then; lag + 1 < S keeps every tile's positions filled at
 * least one iteration before its angles are formed. The registers hold no data in flight, so every
 * stage but the one being rotated can be on its way. Every element is rotated by rotate_store
 * from angle_finish's (cos, sin), as in the other kernels: the same bits. */
template <int DT, bool IL, typename P>
__global__ void __launch_bounds__(kBulkThreads, kBulkCtas) rope_bulk_kernel(const __grid_constant__ P prm)
{
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
    const RopeParams &p = rope_of(prm);
    extern __shared__ __align__(128) unsigned char smem[];
    const Geom &g = p.g;
    const BulkPlan &bp = p.bp;
    const AnglePlan &a = p.a;
    const uint32_t tid = threadIdx.x, lane = tid & 31, S = bp.stages;
    uint64_t *bars = reinterpret_cast<uint64_t *>(smem);
    float2 *cs_tab = reinterpret_cast<float2 *>(smem + bp.cs0);
    const uint32_t n_cs = bp.tile * g.half, pos_b = n_cs * 8;
    const uint64_t step = gridDim.x;
    const uint32_t n_iter = (uint32_t)((bp.tiles - blockIdx.x + step - 1) / step);

    /* Everything up to pdl_enter is parameter arithmetic: the angle slots and the rotation's rows. */
    BulkAngles ba = bulk_angle_slots(a, g, tid, n_cs);
    const BulkRot rot = bulk_rot(g, tid);
    if (tid == 0) {
        for (uint32_t s = 0; s < S; s++)
            mbar_init(bars + s, 1), mbar_init(bars + kBulkMaxStages + s, bp.n_pos);
        mbar_init_fence();
    }
    pdl_enter();
#pragma unroll
    for (uint32_t m = 0; m < kBulkAngles; m++)
        ba.ff[m] = m < ba.n && a.ff ? __ldg(a.ff + (ba.k[m] - ba.tl[m] * g.half)) : 1.0f;
    __syncthreads();

    /* Fills stage it % S with iteration it's tile. */
    auto fill = [&](uint32_t it) {
        const uint64_t t0 = (blockIdx.x + it * step) * bp.tile;
        const uint32_t tt = (uint32_t)min((uint64_t)bp.tile, bp.seq - t0), s = it % S;
        if (tid < 32)
            bulk_tile(prm, t0, tt, smem + bp.stage0 + s * bp.stage_b, bars + s, false, lane);
        if (ba.n)
            bulk_positions(a, ba, t0, tt, smem + bp.pos0 + s * pos_b, bars + kBulkMaxStages + s);
    };
    /* The angles of iteration it's tile into table it & 1, once its positions have landed. */
    auto angles = [&](uint32_t it) {
        const uint64_t t0 = (blockIdx.x + it * step) * bp.tile;
        const uint32_t tt = (uint32_t)min((uint64_t)bp.tile, bp.seq - t0), s = it % S;
        mbar_wait(bars + kBulkMaxStages + s, (it / S) & 1);
        bulk_form(a, ba, tt, smem + bp.pos0 + s * pos_b, cs_tab + (it & 1) * n_cs);
    };

    for (uint32_t it = 0; it < n_iter && it < S; it++)
        fill(it);
    if (ba.n)
        angles(0);
    __syncthreads();
    for (uint32_t it = 0; it < n_iter; it++) {
        const uint32_t s = it % S;
        const uint64_t t0 = (blockIdx.x + it * step) * bp.tile;
        const uint32_t tt = (uint32_t)min((uint64_t)bp.tile, bp.seq - t0);
        unsigned char *st = smem + bp.stage0 + s * bp.stage_b;
        mbar_wait(bars + s, (it / S) & 1);
        bulk_rotate<DT, IL>(g, bp, rot, st, cs_tab + (it & 1) * n_cs, tt);
        if (ba.n && it + 1 < n_iter)
            angles(it + 1);
        fence_async_shared();
        __syncthreads();
        if (tid < 32) {
            bulk_tile(prm, t0, tt, st, nullptr, true, lane);
            bulk_commit();
        }
        const uint32_t lag = S >= 4 ? 2 : 1;
        if (it >= lag && it - lag + S < n_iter) {
            if (tid < 32)
                bulk_wait_stage(lag);
            fill(it - lag + S);
        }
    }
    if (tid < 32)
        bulk_wait_all();
#endif
}

/* ---------------------------------------------------------------------------------------------
 * Launch: the variants table's rows (variants.h) as kernels, for a dtype, unit width and layout.
 * ------------------------------------------------------------------------------------------- */

template <typename P> cudaError_t start(void (*kernel)(P), const P &p, const LaunchPlan &L, cudaStream_t st)
{
    return lmk_cuda_start(kernel, p, L.blocks, L.threads, L.smem, st, L.pdl);
}

/* The launch of one row of the table: its kernel with the row's template arguments and the call's
 * (DT, VE, IL). The bulk kernel exists for 16-byte units only (plan_bulk asks for no other). */
template <int DT, int VE, bool IL, lmk_rope_kernel K, bool COPY, bool MAPS>
cudaError_t launch_row(const BulkParams &P, const LaunchPlan &L, cudaStream_t st)
{
    const RopeParams &p = P.r;
    if constexpr (K == LMK_ROPE_K_DECODE)
        return start(rope_decode_kernel<DT, VE, IL, COPY>, p, L, st);
    else if constexpr (K == LMK_ROPE_K_ROWS)
        return start(rope_rows_kernel<DT, VE, IL>, p, L, st);
    else if constexpr (K == LMK_ROPE_K_PAIRS)
        return start(rope_pairs_kernel<DT, VE, IL>, p, L, st);
    else if constexpr (VE * Elem<DT>::size == 16 && MAPS)
        return start(rope_bulk_kernel<DT, IL, BulkParams>, P, L, st);
    else if constexpr (VE * Elem<DT>::size == 16)
        return start(rope_bulk_kernel<DT, IL, RopeParams>, p, L, st);
    return cudaErrorInvalidValue;
}

/* The launch of row L.variant: a switch over the table. */
template <int DT, int VE, bool IL> cudaError_t launch(const BulkParams &P, const LaunchPlan &L, cudaStream_t st)
{
    switch (L.variant) {
#define ROPE_LAUNCH(id, name, kernel, copy, maps, reason, bench)                                                      \
    case id:                                                                                                           \
        return launch_row<DT, VE, IL, kernel, copy, maps>(P, L, st);
        LMK_ROPE_VARIANTS(ROPE_LAUNCH)
#undef ROPE_LAUNCH
    case LMK_ROPE_N_VARIANTS:
        break;
    }
    return cudaErrorInvalidValue; /* the planners return rows of the table only */
}

/* IL exists only for units of two or more elements (plan_units never asks for it otherwise). */
template <int DT, int VE> cudaError_t launch_layout(bool il, const BulkParams &p, const LaunchPlan &L, cudaStream_t st)
{
    if constexpr (VE >= 2) {
        if (il)
            return launch<DT, VE, true>(p, L, st);
    }
    return launch<DT, VE, false>(p, L, st);
}

template <int DT> cudaError_t launch_ve(uint32_t ve, bool il, const BulkParams &p, const LaunchPlan &L, cudaStream_t st)
{
    if constexpr (Elem<DT>::size == 2) {
        if (ve == 8)
            return launch_layout<DT, 8>(il, p, L, st);
    }
    return ve == 4 ? launch_layout<DT, 4>(il, p, L, st)
         : ve == 2 ? launch_layout<DT, 2>(il, p, L, st)
                   : launch_layout<DT, 1>(il, p, L, st);
}

cudaError_t launch_dtype(lmk_dtype dt, uint32_t ve, bool il, const BulkParams &p, const LaunchPlan &L, cudaStream_t st)
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

/* Loads one row's kernel for (DT, VE, IL). The bulk kernels may use all the shared memory a block
 * can have (optin; plan_bulk takes at most 1/kBulkCtas of an SM's), set here once per device rather
 * than in an op call; they exist for 16-byte units only. */
template <int DT, int VE, bool IL, lmk_rope_kernel K, bool COPY, bool MAPS>
void preload_row(int optin, cudaError_t *first)
{
    if constexpr (K == LMK_ROPE_K_DECODE)
        lmk_cuda_preload(rope_decode_kernel<DT, VE, IL, COPY>, 0, first);
    else if constexpr (K == LMK_ROPE_K_ROWS)
        lmk_cuda_preload(rope_rows_kernel<DT, VE, IL>, 0, first);
    else if constexpr (K == LMK_ROPE_K_PAIRS)
        lmk_cuda_preload(rope_pairs_kernel<DT, VE, IL>, 0, first);
    else if constexpr (VE * Elem<DT>::size == 16)
        lmk_cuda_preload(rope_bulk_kernel<DT, IL, typename std::conditional<MAPS, BulkParams, RopeParams>::type>,
                         (size_t)optin, first);
}

/* Every row of the table, for each layout of a unit width. */
template <int DT, int VE> void preload_ve(int optin, cudaError_t *first)
{
#define ROPE_PRELOAD(id, name, kernel, copy, maps, reason, bench)                                                     \
    preload_row<DT, VE, false, kernel, copy, maps>(optin, first);                                                      \
    if constexpr (VE >= 2)                                                                                             \
        preload_row<DT, VE, true, kernel, copy, maps>(optin, first);
    LMK_ROPE_VARIANTS(ROPE_PRELOAD)
#undef ROPE_PRELOAD
}

/* Every unit width plan_units may choose. */
template <int DT> void preload_dtype(int optin, cudaError_t *first)
{
    if constexpr (Elem<DT>::size == 2)
        preload_ve<DT, 8>(optin, first);
    preload_ve<DT, 4>(optin, first);
    preload_ve<DT, 2>(optin, first);
    preload_ve<DT, 1>(optin, first);
}

/* ---------------------------------------------------------------------------------------------
 * Planning (host): units, geometry, angles, then the decode or the tile plan.
 * ------------------------------------------------------------------------------------------- */

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
    L->variant = g.nc > 0 ? LMK_ROPE_DECODE_COPY : LMK_ROPE_DECODE;
    L->blocks = dim3((unsigned)seq, (unsigned)groups, 1);
    L->threads = dim3((unsigned)ipr, (unsigned)rpb, 1);
    L->smem = (size_t)g.half * sizeof(float2);
    return true;
}

/* Rows of a block: the most rows of `per_row` threads that fit kRowThreads, balanced over the
 * groups that `rows` then needs (returned through *groups). */
uint32_t block_rows(uint32_t rows, uint32_t per_row, uint64_t *groups)
{
    uint64_t by = kRowThreads / per_row;
    by = by < 1 ? 1 : by > rows ? rows : by;
    *groups = ceil_div(rows, by);
    return (uint32_t)ceil_div(rows, *groups);
}

/* The pair blocks of rope_rows_kernel: every row of a token in one block when its pair units fit
 * (rows x npu <= kRowThreads), else the units split into groups of p_bx (each block then forms
 * only its own pairs' angles: none is formed twice for a token), and rows split only when even
 * one unit per row does not fit. Then token lanes fill the block, and the tile is the most tokens
 * such that every lane has at most kTB of them and every thread at most kAngles angles. */
void plan_row_pairs(const Geom &g, uint64_t seq, RowsPlan *rp, uint64_t *pg)
{
    const uint32_t ppu = g.half / g.npu;
    uint64_t bx = g.npu, ug = 1, rgs = 1;
    if ((uint64_t)g.rows * g.npu > kRowThreads) {
        bx = kRowThreads / g.rows;
        bx = bx < 1 ? 1 : bx;
        ug = ceil_div(g.npu, bx);
        bx = ceil_div(g.npu, ug); /* balanced */
    }
    rp->p_bx = (uint32_t)bx;
    rp->p_ug = (uint32_t)ug;
    rp->p_by = block_rows(g.rows, rp->p_bx, &rgs);
    const uint64_t per_lane = bx * rp->p_by, lanes = kRowThreads / per_lane < 1 ? 1 : kRowThreads / per_lane;
    const uint64_t np = bx * ppu; /* pairs of a block */
    uint64_t tile = lanes * kTB;
    const uint64_t angle_cap = lanes * per_lane * kAngles / np;
    tile = tile > angle_cap ? angle_cap : tile;
    tile = tile < 1 ? 1 : tile > seq ? seq : tile;
    if (tile * np > kTileAngles)
        tile = kTileAngles / np;
    /* lanes for the tile's tokens, and more (idle but for their angles) when the block's angles
     * would otherwise exceed kAngles a thread (K alone: 16 threads a lane, 32 pairs) */
    uint64_t tz = ceil_div(tile * np, per_lane * kAngles);
    tz = tz < ceil_div(tile, kTB) ? ceil_div(tile, kTB) : tz;
    rp->p_tz = (uint32_t)(tz < lanes ? tz : lanes);
    rp->tile = (uint32_t)tile;
    *pg = ug * rgs;
}

/* The plan of rope_rows_kernel: pair blocks (plan_row_pairs), then copy blocks: threads (copy unit,
 * row, token lane), c_bx at most kRowThreads (wider rows loop over units), over the tile's tokens
 * in batches of kCopyTB. The block has the larger of the two thread counts. Both kinds read and
 * write units of consecutive memory across a warp (units of a row, then the next row). */
void plan_rows(const Geom &g, uint64_t seq, RowsPlan *rp, LaunchPlan *L)
{
    uint64_t pg, cg = 0;
    rp->seq = seq;
    plan_row_pairs(g, seq, rp, &pg);
    const uint32_t threads_p = rp->p_bx * rp->p_by * rp->p_tz;
    uint32_t threads_c = 0;
    rp->crow0 = g.copy0 ? 0 : g.nh0;
    rp->crows = (g.copy0 ? g.nh0 : 0) + (g.copy1 ? g.rows - g.nh0 : 0);
    rp->c_bx = g.nc < kRowThreads ? g.nc : kRowThreads;
    rp->c_by = block_rows(rp->crows, rp->c_bx, &cg);
    uint64_t cz = kRowThreads / ((uint64_t)rp->c_bx * rp->c_by);
    cz = cz < 1 ? 1 : cz > rp->tile ? rp->tile : cz;
    rp->c_tz = (uint32_t)cz;
    threads_c = rp->c_bx * rp->c_by * rp->c_tz;
    rp->pg = (uint32_t)pg;
    rp->groups = (uint32_t)(pg + cg);
    rp->n_blocks = ceil_div(seq, rp->tile) * rp->groups;
    L->variant = LMK_ROPE_ROWS;
    L->blocks = dim3((unsigned)rp->n_blocks, 1, 1);
    if (rp->n_blocks > 0x7fffffffu) /* T near 2^32 */
        L->blocks = dim3(1u << 30, (unsigned)ceil_div(rp->n_blocks, 1u << 30), 1);
    L->threads = dim3(threads_p > threads_c ? threads_p : threads_c, 1, 1);
    L->smem = (size_t)rp->tile * rp->p_bx * (g.half / g.npu) * sizeof(float2);
}

/* The plan of rope_pairs_kernel (launches without copy items). A block's items are tile_tokens *
 * rows_per_group * units: at most what one batch of every thread holds, so each thread loads all
 * its items before the barrier, and one angle per thread. Groups > 1 only when the tiles alone
 * cannot occupy the GPU (then ~one item per thread) or a block would hold 2^30 items. */
void plan_pairs(const Geom &g, uint64_t seq, int sm_count, PairsPlan *pp, LaunchPlan *L)
{
    pp->seq = seq;
    const uint64_t per_token = (uint64_t)g.rows * g.npu;
    uint64_t tile = (uint64_t)kPairBatch * kPairThreads / per_token;
    const uint64_t tile_max = kPairThreads / g.half;
    tile = tile < 1 ? 1 : tile > tile_max ? tile_max : tile;
    tile = tile > seq ? seq : tile;
    const uint64_t tiles = ceil_div(seq, tile);
    uint64_t groups = ceil_div(tile * per_token, (uint64_t)1 << 30);
    if (tiles < 2 * (uint64_t)sm_count) {
        const uint64_t gmin = ceil_div(tile * per_token, kPairThreads);
        groups = gmin > groups ? gmin : groups;
    }
    groups = groups > g.rows ? g.rows : groups;
    pp->rows_per_group = (uint32_t)ceil_div(g.rows, groups);
    pp->groups = (uint32_t)ceil_div(g.rows, pp->rows_per_group); /* no empty group */
    pp->tile_tokens = (uint32_t)tile;
    pp->n_blocks = tiles * pp->groups;
    L->variant = LMK_ROPE_PAIRS;
    L->blocks = dim3((unsigned)pp->n_blocks, 1, 1);
    if (pp->n_blocks > 0x7fffffffu) /* T near 2^32 with one token per tile */
        L->blocks = dim3(1u << 30, (unsigned)ceil_div(pp->n_blocks, 1u << 30), 1);
    L->threads = dim3(kPairThreads, 1, 1);
    L->smem = (size_t)pp->tile_tokens * g.half * sizeof(float2);
}

/* How tensor j is moved in one direction (BulkPlan.ld_mode, st_mode): BULK_TILE when the tile's
 * rows are one run of bytes (heads and tokens adjacent), BULK_TOKEN when a token's are (heads
 * adjacent), else BULK_ROW (plan_bulk may then take BULK_TENSOR). */
BulkMode bulk_mode(uint32_t nh, uint32_t span, uint64_t head_b, uint64_t tok_b, uint64_t seq)
{
    if (nh > 1 && head_b != span)
        return BULK_ROW;
    return seq == 1 || tok_b == (uint64_t)nh * span ? BULK_TILE : BULK_TOKEN;
}

/* The tensor map of one side of tensor j for BulkPlan's BULK_TENSOR: its rows of a tile, [tile][nh][span]
 * elements (es bytes, moved as raw integers: bit-exact) at byte strides head_b and tok_b from base.
 * False where a bulk tensor copy cannot take it (box sides over 256, tokens past int32
 * coordinates, strides not multiples of 16 or past 2^40, no encoder): the other modes then. */
bool plan_tensor_map(const lmk_cuda_device *d, CUtensorMap *m, const void *base, uint32_t es, uint32_t span_b,
                     uint32_t nh, uint64_t head_b, uint64_t tok_b, uint64_t seq, uint32_t tile)
{
    const uint32_t n0 = span_b / es;
    if (!d->tmap_encode || n0 > 256 || nh > 256 || tile > 256 || seq > INT32_MAX || (uintptr_t)base % 16)
        return false;
    if (nh == 1) /* a stride of a dimension of one is never applied: any valid one */
        head_b = span_b;
    if (seq == 1)
        tok_b = (uint64_t)nh * head_b;
    if (head_b % 16 || tok_b % 16 || head_b >> 40 || tok_b >> 40)
        return false;
    const cuuint64_t dim[3] = {n0, nh, seq}, stride[2] = {head_b, tok_b};
    const cuuint32_t box[3] = {n0, nh, tile}, step[3] = {1, 1, 1};
    const uint32_t fill = l2_fill_bytes(span_b);
    const CUtensorMapL2promotion l2 = fill == 256   ? CU_TENSOR_MAP_L2_PROMOTION_L2_256B
                                      : fill == 128 ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B
                                                    : CU_TENSOR_MAP_L2_PROMOTION_NONE;
    const PFN_cuTensorMapEncodeTiled_v12000 encode = (PFN_cuTensorMapEncodeTiled_v12000)d->tmap_encode;
    return encode(m, es == 4 ? CU_TENSOR_MAP_DATA_TYPE_UINT32 : CU_TENSOR_MAP_DATA_TYPE_UINT16, 3,
                  const_cast<void *>(base), dim, stride, box, step, CU_TENSOR_MAP_INTERLEAVE_NONE,
                  CU_TENSOR_MAP_SWIZZLE_NONE, l2, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* The ring of rope_bulk_kernel (plan_bulk): the tile of `tile` tokens halved until at least
 * kBulkMinStages stages of it fit a block's share of the SM's shared memory (1/kBulkCtas), at most
 * kBulkMaxStages; the shared memory's layout (BulkPlan) and its bytes in *smem. False where even a
 * tile of one token does not fit. */
bool plan_bulk_stages(const lmk_cuda_device *d, const Geom &g, uint64_t tile, BulkPlan *bp, size_t *smem)
{
    const uint32_t nh1 = g.rows - g.nh0;
    const uint64_t avail64 = (uint64_t)d->smem_sm / kBulkCtas - d->smem_reserved;
    const uint64_t avail = (avail64 < (uint64_t)d->smem_optin ? avail64 : (uint64_t)d->smem_optin) & ~(uint64_t)127;
    for (;; tile /= 2) {
        const uint64_t cs0 = 2 * kBulkMaxStages * sizeof(uint64_t);
        const uint64_t stage0 = (cs0 + 2 * tile * g.half * sizeof(float2) + 127) & ~(uint64_t)127;
        const uint64_t region1 = (tile * g.nh0 * bp->span_b[0] + 127) & ~(uint64_t)127;
        const uint64_t stage_b = (region1 + tile * nh1 * bp->span_b[1] + 127) & ~(uint64_t)127;
        const uint64_t pos_b = tile * g.half * 8;
        uint64_t stages = avail > stage0 ? (avail - stage0) / (stage_b + pos_b) : 0;
        if (stages >= kBulkMinStages) {
            stages = stages > kBulkMaxStages ? kBulkMaxStages : stages;
            bp->tile = (uint32_t)tile, bp->stages = (uint32_t)stages;
            bp->region_b[0] = 0, bp->region_b[1] = (uint32_t)region1;
            bp->cs0 = (uint32_t)cs0, bp->stage0 = (uint32_t)stage0, bp->stage_b = (uint32_t)stage_b;
            bp->pos0 = (uint32_t)(stage0 + stages * stage_b);
            *smem = (size_t)(bp->pos0 + stages * pos_b);
            return true;
        }
        if (tile == 1)
            return false;
    }
}

/* The tensor maps of the plan's BULK_TENSOR sides, in bk->tm[2 * j + out] as bulk_tile reads them,
 * and the bytes a tile's tensor loads fill (BulkPlan.box_tok_b). False where one cannot be made. */
bool plan_bulk_maps(const lmk_rope_args *a, const lmk_cuda_device *d, const Geom &g, uint32_t es, BulkParams *bk)
{
    BulkPlan *bp = &bk->r.bp;
    bp->box_tok_b = 0;
    for (int m = 0; m < 4; m++) {
        const int j = m / 2;
        const bool out = m % 2;
        const BulkSide sd = bulk_side(g, *bp, j, out);
        if (sd.mode != BULK_TENSOR || sd.nh == 0)
            continue;
        if (!plan_tensor_map(d, &bk->tm[m], sd.base, es, bp->span_b[j], sd.nh, sd.head, sd.tok, a->seq_len, bp->tile))
            return false;
        if (!out)
            bp->box_tok_b += sd.nh * bp->span_b[j];
    }
    return true;
}

/* The plan of rope_bulk_kernel, when it applies: the device has bulk copies (lmk_cuda_device.bulk),
 * the launch has copy items (a tensor out of place with rope_dim < head_dim: Qwen3.5's q and k;
 * the others keep rope_pairs_kernel, the faster one where nothing is copied), 16-byte
 * units, one slice (rope_dim <= 2 * kSlicePairs), every tensor in place has its rotated elements in
 * one span at the start of its rows (rope_dim/2 pairing or interleaved, where rope_dim elements are
 * exactly the rotated ones), and no copy would be under kBulkMinCopy bytes. Where a tensor out of
 * place has heads that are not adjacent (q inside q|gate or a packed QKV) its rows would be a copy
 * each; a bulk tensor copy of the tile takes them instead (BULK_TENSOR, plan_tensor_map), else the
 * launch keeps rope_rows_kernel. The tile is about kBulkTileBytes of rows (at most kBulkAngles
 * angles a thread, 256 tokens with BULK_TENSOR), halved until at least kBulkMinStages stages fit the
 * block's shared memory (1/kBulkCtas of an SM's); none fitting (rows of over ~24 KB a token)
 * keeps the other kernels. */
bool plan_bulk(const lmk_rope_args *a, const Geom &g, uint32_t nb, const lmk_cuda_device *d, BulkParams *bk,
               LaunchPlan *L)
{
    BulkPlan *bp = &bk->r.bp;
    const uint32_t es = a->dtype == LMK_F32 ? 4 : 2;
    if (!d->bulk || g.nc == 0 || nb != 16 || g.pair_b != 0 || 2 * g.half != a->rope_dim)
        return false;
    const bool span_ok = a->interleaved || g.stride_b == g.half * es;
    const uint32_t row_b = a->head_dim * es, rot_b = a->rope_dim * es, nh1 = g.rows - g.nh0;
    for (int j = 0; j < a->n_tensors; j++) {
        const bool copy = j ? g.copy1 : g.copy0;
        if (!copy && !span_ok)
            return false;
        bp->span_b[j] = copy ? row_b : rot_b;
    }
    if (a->n_tensors == 1)
        bp->span_b[1] = bp->span_b[0];
    const uint64_t tok_b = (uint64_t)g.nh0 * bp->span_b[0] + (uint64_t)nh1 * bp->span_b[1];
    if (tok_b > kBulkTileBytes * (uint64_t)kBulkMaxStages) /* far more than a block's shared memory */
        return false;
    bp->tok_b = (uint32_t)tok_b;
    bp->ld_mode[0] = bulk_mode(g.nh0, bp->span_b[0], g.in_head0, g.in_tok0, a->seq_len);
    bp->st_mode[0] = bulk_mode(g.nh0, bp->span_b[0], g.out_head0, g.out_tok0, a->seq_len);
    bp->ld_mode[1] = bulk_mode(nh1, bp->span_b[1], g.in_head1, g.in_tok1, a->seq_len);
    bp->st_mode[1] = bulk_mode(nh1, bp->span_b[1], g.out_head1, g.out_tok1, a->seq_len);
    BulkMode *modes[4] = {&bp->ld_mode[0], &bp->st_mode[0], &bp->ld_mode[1], &bp->st_mode[1]};
    /* BULK_TENSOR for whole rows only: a tensor in place moves its rotated spans, and spans of 128
     * bytes 512 apart move slower through tensor copies than through rope_pairs_kernel. */
    bool tensor = false;
    for (int m = 0; m < 4; m++)
        if (*modes[m] == BULK_ROW && d->tmap_encode && bp->span_b[m / 2] == row_b)
            *modes[m] = BULK_TENSOR, tensor = true;
    uint64_t tile = kBulkTileBytes / bp->tok_b;
    const uint64_t tile_angles = (uint64_t)kBulkThreads * kBulkAngles / g.half;
    tile = tile < 1 ? 1 : tile > tile_angles ? tile_angles : tile;
    tile = tile > a->seq_len ? a->seq_len : tile;
    tile = tensor && tile > 256 ? 256 : tile;
    const uint32_t nh[2] = {g.nh0, nh1};
    for (int m = 0; m < 4; m++) {
        const uint32_t j = m / 2;
        const BulkMode mode = *modes[m];
        const uint64_t bytes =
            (mode == BULK_ROW ? 1 : mode == BULK_TOKEN ? nh[j] : tile * nh[j]) * (uint64_t)bp->span_b[j];
        if (nh[j] && bytes < kBulkMinCopy && mode != BULK_TENSOR)
            return false;
    }
    if (!plan_bulk_stages(d, g, tile, bp, &L->smem) || !plan_bulk_maps(a, d, g, es, bk))
        return false;
    bp->seq = a->seq_len;
    bp->tiles = ceil_div(a->seq_len, bp->tile);
    bp->n_pos = bp->tile * g.half < kBulkThreads ? bp->tile * g.half : kBulkThreads;
    const uint64_t grid = (uint64_t)d->sm_count * kBulkCtas;
    L->variant = uses_maps(*bp) ? LMK_ROPE_BULK_MAPS : LMK_ROPE_BULK;
    L->blocks = dim3((unsigned)(bp->tiles < grid ? bp->tiles : grid), 1, 1);
    L->threads = dim3(kBulkThreads, 1, 1);
    return true;
}

/* The table's rows (variants.h), for the planner and the routes. */
struct VariantRow {
    lmk_rope_kernel kernel;
    const char *name;
};
constexpr VariantRow kRows[] = {
#define ROPE_ROW(id, name, kernel, copy, maps, reason, bench) {kernel, name},
    LMK_ROPE_VARIANTS(ROPE_ROW)
#undef ROPE_ROW
};
static_assert(sizeof kRows / sizeof kRows[0] == LMK_ROPE_N_VARIANTS, "one row per id");
constexpr const char *kKernelNames[] = {"rope_decode_kernel", "rope_rows_kernel", "rope_pairs_kernel",
                                        "rope_bulk_kernel"};

/* The row the bench forces every launch onto (lmk_cuda_rope_force), or -1. */
std::atomic<int> g_forced{-1};

/* The launch shape of one slice: the decode kernel where its grid is small, else the bulk kernel
 * where it takes the launch, else rope_rows_kernel (copy items) or rope_pairs_kernel. A forced row
 * skips the decode and bulk plans unless it names their kernel, and must then be the plan's row
 * (LMK_ERR_UNSUPPORTED otherwise), or a superset of it: the decode kernel with copy items compiled
 * in runs a launch without any, and the bulk kernel's parameters with tensor maps serve a plan
 * that uses none (the A/B of rope_decode and rope_bulk). */
lmk_status plan_launch(const lmk_rope_args *a, const lmk_cuda_device *d, uint32_t ve, BulkParams *P, LaunchPlan *L)
{
    RopeParams &p = P->r;
    const int forced = g_forced.load(std::memory_order_relaxed);
    const lmk_rope_kernel fk = forced >= 0 ? kRows[forced].kernel : LMK_ROPE_K_DECODE;
    if ((forced < 0 || fk == LMK_ROPE_K_DECODE) && plan_decode(p.g, a->seq_len, d->sm_count, L))
        ;
    else if ((forced < 0 || fk == LMK_ROPE_K_BULK) && plan_bulk(a, p.g, ve * (a->dtype == LMK_F32 ? 4 : 2), d, P, L))
        ;
    else if (p.g.nc > 0)
        plan_rows(p.g, a->seq_len, &p.rp, L);
    else
        plan_pairs(p.g, a->seq_len, d->sm_count, &p.pp, L);
    L->pdl = d->pdl;
    if ((forced == LMK_ROPE_DECODE_COPY && L->variant == LMK_ROPE_DECODE) ||
        (forced == LMK_ROPE_BULK_MAPS && L->variant == LMK_ROPE_BULK))
        L->variant = (lmk_rope_variant)forced;
    if (forced >= 0 && L->variant != forced)
        return lmk_fail(LMK_ERR_UNSUPPORTED, "rope: the forced variant %s cannot run this launch (it plans %s)",
                        kRows[forced].name, kRows[L->variant].name);
    return LMK_OK;
}

/* The plans of a call's launches, one per slice of kSlicePairs pairs (one for rope_dim <= 256), each
 * planned from scratch: every launch is a pure function of its parameters, so slices never depend
 * on each other. Calls f(P, L, ve, il) for each in order and stops at the first status f returns
 * that is not LMK_OK. Both lmk_cuda_rope and lmk_cuda_rope_route plan through here. */
template <typename F> lmk_status for_each_launch(const lmk_rope_args *a, const lmk_cuda_device *d, F &&f)
{
    bool il;
    const uint32_t ve = plan_units(a, &il), ppu = il ? ve / 2 : ve, half = a->rope_dim / 2;
    BulkParams P{};
    RopeParams &p = P.r;
    uint32_t nc_row;
    lmk_status st = plan_geometry(a, ve, il, &p.g, &nc_row);
    for (uint32_t p0 = 0; st == LMK_OK && p0 < half; p0 += kSlicePairs) {
        const uint32_t n = half - p0 < kSlicePairs ? half - p0 : kSlicePairs;
        plan_slice(&p.g, p0, n, ppu, nc_row);
        plan_angles(&a->angle, p0, &p.a);
        LaunchPlan L;
        st = plan_launch(a, d, ve, &P, &L);
        if (st == LMK_OK)
            st = f(P, L, ve, il);
    }
    return st;
}

} /* namespace */

lmk_status lmk_cuda_rope(lmk_stream *s, const void *args)
{
    const lmk_rope_args *a = (const lmk_rope_args *)args;
    const lmk_cuda_device *d = lmk_cuda_dev(s->dev);
    lmk_status st = lmk_cuda_use(d->ordinal, "rope: cudaSetDevice");
    if (st != LMK_OK)
        return st;
    /* A forced row must suit every launch before the first is made (a call that fails changes
     * nothing); the planner's own rows always do. */
    const auto none = [](const BulkParams &, const LaunchPlan &, uint32_t, bool) { return LMK_OK; };
    if (g_forced.load(std::memory_order_relaxed) >= 0 && (st = for_each_launch(a, d, none)) != LMK_OK)
        return st;
    const cudaStream_t h = lmk_cuda_stream_of(s);
    return for_each_launch(a, d, [&](const BulkParams &P, const LaunchPlan &L, uint32_t ve, bool il) {
        const cudaError_t e = launch_dtype(a->dtype, ve, il, P, L, h);
        return e == cudaSuccess ? LMK_OK : lmk_cuda_fail(e, "rope: kernel launch");
    });
}

extern "C" lmk_status lmk_cuda_rope_route(const lmk_cuda_device *d, const lmk_rope_args *a, lmk_cuda_route *r,
                                          int max, int *n)
{
    *n = 0;
    return for_each_launch(a, d, [&](const BulkParams &, const LaunchPlan &L, uint32_t ve, bool) {
        if (*n < max) {
            lmk_cuda_route *o = &r[*n];
            *o = lmk_cuda_route{};
            o->variant = L.variant;
            o->variant_name = kRows[L.variant].name;
            o->kernel = kKernelNames[kRows[L.variant].kernel];
            o->unit_bytes = ve * (a->dtype == LMK_F32 ? 4 : 2);
            o->blocks = L.blocks.x * L.blocks.y * L.blocks.z;
            o->threads = L.threads.x * L.threads.y * L.threads.z;
            o->smem = L.smem;
        }
        ++*n;
        return LMK_OK;
    });
}

extern "C" lmk_status lmk_cuda_rope_force(int variant)
{
    if (variant < -1 || variant >= LMK_ROPE_N_VARIANTS)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "rope: variant (%d) must be -1 or a row of the variants table, < %d",
                        variant, (int)LMK_ROPE_N_VARIANTS);
    g_forced.store(variant, std::memory_order_relaxed);
    return LMK_OK;
}

cudaError_t lmk_cuda_rope_preload(void)
{
    int dev = 0, optin = 0;
    cudaError_t first = cudaGetDevice(&dev);
    if (first == cudaSuccess)
        first = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (first != cudaSuccess)
        return first;
    preload_dtype<LMK_F32>(optin, &first);
    preload_dtype<LMK_BF16>(optin, &first);
    preload_dtype<LMK_F16>(optin, &first);
    return first;
}
