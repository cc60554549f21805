/*
 * cuda.cu - the CUDA kernel of attn_prologue (per-head RMSNorm + rope + KV-cache write) and its
 * launcher.
 *
 * One block handles one token (a grid-stride loop over tokens) and a group of its rows: the q
 * heads, then the k heads, then the v heads (v rows are plain copies into the cache). The block
 * first fills a shared table with the (cos, sin) of every rotated pair of its token (float64 angle
 * from rope_common.h's rules, the same as lmk_rope's), then each warp takes whole rows:
 *   1. the lanes load the row in units of VE elements (16 bytes when the shape, strides and
 *      addresses allow), widen to f32, keep the sum of squares, and stage the values in shared
 *      memory (one row buffer per warp);
 *   2. a warp reduction gives the norm factor; the staged values are normed in place;
 *   3. each lane produces its own units: rotated elements from the staged pair (a, b), others the
 *      normed value, or the input's own bits when there is no norm (bit-exact copies, NaN payloads
 *      included), and stores them to every destination of the row: q_out; k_out and the k cache row
 *      of the token's slot (f8 caches quantised from the f32 value with lmk_f8e4m3_from_f32_bits,
 *      the host's own rounding).
 * A lane owns the same units in steps 1 and 3, so in place (out == in) a lane only overwrites what
 * it alone has read. Rows per block: all rows of the token when there are enough tokens to fill the
 * GPU (prefill); one row per warp otherwise (decode), so that a T=1 call spreads over several SMs.
 * Limits: head_dim and Dv up to 4096 (a warp's row buffer and the angle table live in 48 KB of
 * shared memory; past head_dim 1280 a block has fewer than 8 warps).
 */
#include "core/f8.h"
#include "cuda/cuda_internal.h"
#include "ops/attn_prologue/attn_prologue.h"
#include "ops/rope/rope_common.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kWarps = 8;            /* warps per block, fewer when the row buffers need it */
constexpr uint32_t kMaxDim = 4096;   /* largest head_dim / Dv (one warp's row buffer then fits) */
constexpr uint32_t kSmemLimit = 48 * 1024;

/* One destination of a row: base of its [rows, heads, dim] tensor, element strides, dtype. */
struct Dest {
    unsigned char *p;
    uint64_t tok, head;
    int dt;
    float scale;      /* f8: stored = lmk_f32_to_f8e4m3(x / scale), lmk.h's formula */
};

struct Params {
    const unsigned char *q_in, *k_in, *v_in;
    uint64_t q_tok, q_head, k_tok, k_head, v_tok, v_head;
    Dest q_out, k_out, k_cache, v_cache; /* p == nullptr: absent */
    const void *q_w, *k_w;
    int q_w_dt, k_w_dt;
    float eps, w_off, mscale;
    int dt;                              /* input dtype */
    uint32_t T, hq, hk, D, dv, rows;     /* rows = hq + hk (+ hk with v) */
    uint32_t rows_per_block;
    int interleaved;
    uint32_t pair_stride, n_pairs, rope_dim;
    /* angle */
    int mode;
    uint32_t sections[4];
    double freq_base, exp_n, freq_scale, ext_factor, ramp_low, ramp_high;
    const float *ff;
    const void *pos;
    int pos_dt;
    uint64_t pos_axis_stride;
    const void *slots;
    int slot_dt;
    uint64_t k_slots, v_slots;
};

__device__ __forceinline__ float widen(int dt, const unsigned char *p, uint64_t i)
{
    if (dt == LMK_F32)
        return reinterpret_cast<const float *>(p)[i];
    const unsigned short h = reinterpret_cast<const unsigned short *>(p)[i];
    return dt == LMK_BF16 ? __uint_as_float((uint32_t)h << 16) : __half2float(__ushort_as_half(h));
}

/* lmk's roundings (lmk_f32_to_bf16 / f16 / f8e4m3): nearest even, NaN kept quiet with its sign. */
__device__ __forceinline__ void narrow_store(int dt, unsigned char *p, uint64_t i, float f, float scale)
{
    const uint32_t u = __float_as_uint(f);
    const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
    switch (dt) {
    case LMK_F32:
        reinterpret_cast<float *>(p)[i] = f;
        break;
    case LMK_BF16:
        reinterpret_cast<unsigned short *>(p)[i] =
            (unsigned short)(nan ? (u >> 16) | 0x0040u : (u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
        break;
    case LMK_F16:
        reinterpret_cast<unsigned short *>(p)[i] =
            nan ? (unsigned short)(((u >> 16) & 0x8000u) | 0x7e00u | ((u >> 13) & 0x03ffu))
                : __half_as_ushort(__float2half_rn(f));
        break;
    default:
        /* x / scale, not x * (1 / scale). A NaN keeps its sign without going through the division:
         * GPU arithmetic returns the canonical (positive) NaN, the host's keeps the operand's. */
        p[i] = lmk_f8e4m3_from_f32_bits(f != f ? __float_as_uint(f) : __float_as_uint(__fdiv_rn(f, scale)));
        break;
    }
}

__device__ __forceinline__ void raw_copy(unsigned char *dst, const unsigned char *src, uint64_t i, int es)
{
    if (es == 4)
        reinterpret_cast<uint32_t *>(dst)[i] = reinterpret_cast<const uint32_t *>(src)[i];
    else
        reinterpret_cast<unsigned short *>(dst)[i] = reinterpret_cast<const unsigned short *>(src)[i];
}

__device__ __forceinline__ int64_t slot_of(const Params &p, uint32_t token)
{
    if (!p.slots)
        return -1;
    return p.slot_dt == LMK_I64 ? reinterpret_cast<const int64_t *>(p.slots)[token]
                                : (int64_t)reinterpret_cast<const int32_t *>(p.slots)[token];
}

/* The (cos, sin) of every pair of `token` into cs (n_pairs float2), by all threads of the block. */
__device__ void fill_angles(const Params &p, uint32_t token, float2 *cs)
{
    for (uint32_t i = threadIdx.x; i < p.n_pairs; i += blockDim.x) {
        uint32_t j;
        const int axis = lmk_rope_axis_j(p.mode, p.sections, i, &j);
        const double ff = p.ff ? (double)p.ff[i] : 1.0;
        const double f = lmk_rope_freq(p.freq_base, p.exp_n, p.freq_scale, p.ext_factor, p.ramp_low, p.ramp_high, i,
                                       j, ff);
        const double pos = lmk_rope_pos(p.pos, p.pos_dt, (uint64_t)axis * p.pos_axis_stride + token);
        double s, c;
        sincos(pos * f, &s, &c);
        cs[i] = make_float2((float)c, (float)s);
    }
}

/* Element i of a row: whether it is rotated, and then its value from the staged (normed) values x. */
__device__ __forceinline__ bool rotated(const Params &p, const float *x, const float2 *cs, uint32_t i, float *out)
{
    uint32_t a, b, pair;
    bool is_a;
    if (p.interleaved) {
        if (i >= p.rope_dim)
            return false;
        pair = i >> 1, a = i & ~1u, b = a + 1, is_a = !(i & 1u);
    } else if (i < p.n_pairs) {
        pair = i, a = i, b = i + p.pair_stride, is_a = true;
    } else if (i >= p.pair_stride && i < p.pair_stride + p.n_pairs) {
        pair = i - p.pair_stride, a = pair, b = i, is_a = false;
    } else {
        return false;
    }
    const float2 c = cs[pair];
    *out = (is_a ? x[a] * c.x - x[b] * c.y : x[a] * c.y + x[b] * c.x) * p.mscale;
    return true;
}

/* One q or k row (which 0 or 1, head h) of `token`, by one warp; x is the warp's row buffer. */
__device__ void do_row(const Params &p, uint32_t token, int which, uint32_t h, int64_t slot, float *x,
                       const float2 *cs)
{
    const unsigned char *in = which ? p.k_in + (token * p.k_tok + h * p.k_head) * (p.dt == LMK_F32 ? 4 : 2)
                                    : p.q_in + (token * p.q_tok + h * p.q_head) * (p.dt == LMK_F32 ? 4 : 2);
    const void *w = which ? p.k_w : p.q_w;
    const int w_dt = which ? p.k_w_dt : p.q_w_dt;
    const int lane = threadIdx.x & 31, es = p.dt == LMK_F32 ? 4 : 2;
    float ss = 0.0f;
    for (uint32_t i = lane; i < p.D; i += 32) {
        const float v = widen(p.dt, in, i);
        x[i] = v;
        ss += v * v;
    }
    for (int o = 16; o > 0; o >>= 1)
        ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (w) {
        const float r = 1.0f / sqrtf(ss / (float)p.D + p.eps);
        for (uint32_t i = lane; i < p.D; i += 32)
            x[i] = x[i] * r * (widen(w_dt, (const unsigned char *)w, i) + p.w_off);
    }
    __syncwarp();
    /* The row's destinations and the element offset of the row in each. */
    Dest d[2];
    uint64_t base[2];
    int nd = 0;
    const Dest &o = which ? p.k_out : p.q_out;
    if (o.p)
        d[nd] = o, base[nd++] = token * o.tok + h * o.head;
    if (which && p.k_cache.p && slot >= 0 && (uint64_t)slot < p.k_slots)
        d[nd] = p.k_cache, base[nd++] = (uint64_t)slot * p.k_cache.tok + h * p.k_cache.head;
    for (uint32_t i = lane; i < p.D; i += 32) {
        float v;
        const bool rot = rotated(p, x, cs, i, &v);
        if (!rot)
            v = x[i];
        for (int k = 0; k < nd; k++) {
            const int des = d[k].dt == LMK_F32 ? 4 : d[k].dt == LMK_F8E4M3 ? 1 : 2;
            unsigned char *row = d[k].p + base[k] * des;
            if (!rot && !w && d[k].dt == p.dt)
                raw_copy(row, in, i, es);
            else
                narrow_store(d[k].dt, row, i, v, d[k].scale);
        }
    }
    __syncwarp(); /* x is reused by the warp's next row */
}

/* One v row into its cache row: a bit copy in v's dtype, or quantised to f8. */
__device__ void do_v(const Params &p, uint32_t token, uint32_t h, int64_t slot)
{
    if (!p.v_cache.p || slot < 0 || (uint64_t)slot >= p.v_slots)
        return;
    const int es = p.dt == LMK_F32 ? 4 : 2, lane = threadIdx.x & 31;
    const unsigned char *in = p.v_in + (token * p.v_tok + h * p.v_head) * es;
    const int des = p.v_cache.dt == LMK_F8E4M3 ? 1 : es;
    unsigned char *out = p.v_cache.p + ((uint64_t)slot * p.v_cache.tok + h * p.v_cache.head) * des;
    for (uint32_t i = lane; i < p.dv; i += 32) {
        if (p.v_cache.dt == p.dt)
            raw_copy(out, in, i, es);
        else
            narrow_store(p.v_cache.dt, out, i, widen(p.dt, in, i), p.v_cache.scale);
    }
}

__global__ void __launch_bounds__(kWarps * 32) prologue_kernel(const Params p)
{
    extern __shared__ float4 smem4[];
    float2 *cs = reinterpret_cast<float2 *>(smem4);
    const uint32_t warps = blockDim.x >> 5;
    float *rowbuf = reinterpret_cast<float *>(cs + ((p.n_pairs + 1) & ~1u)) + (threadIdx.x >> 5) * p.D;
    const uint32_t r0 = blockIdx.y * p.rows_per_block;
    const uint32_t r1 = r0 + p.rows_per_block < p.rows ? r0 + p.rows_per_block : p.rows;
    const bool needs_angles = r0 < p.hq + p.hk;
    for (uint32_t token = blockIdx.x; token < p.T; token += gridDim.x) {
        if (needs_angles)
            fill_angles(p, token, cs);
        __syncthreads();
        const int64_t slot = slot_of(p, token);
        for (uint32_t r = r0 + (threadIdx.x >> 5); r < r1; r += warps) {
            if (r < p.hq)
                do_row(p, token, 0, r, slot, rowbuf, cs);
            else if (r < p.hq + p.hk)
                do_row(p, token, 1, r - p.hq, slot, rowbuf, cs);
            else
                do_v(p, token, r - p.hq - p.hk, slot);
        }
        __syncthreads(); /* cs is refilled for the next token */
    }
}

Dest dest_of(const lmk_rows &r)
{
    return Dest{(unsigned char *)r.data, r.tok, r.head, (int)r.dtype, 1.0f};
}

} /* namespace */

lmk_status lmk_cuda_attn_prologue(lmk_stream *s, const void *args)
{
    static const char op[] = "attn_prologue";
    const lmk_attn_prologue_args *a = (const lmk_attn_prologue_args *)args;
    const lmk_cuda_device *d = lmk_cuda_dev(s->dev);
    lmk_status st = lmk_cuda_use(d->ordinal, "attn_prologue: cudaSetDevice");
    if (st != LMK_OK)
        return st;
    const lmk_rope_args *r = &a->rope;
    if (r->head_dim > kMaxDim || a->v_dim > kMaxDim)
        return lmk_fail(LMK_ERR_UNSUPPORTED, "%s: head_dim (%u) and Dv (%u) must be <= %u on CUDA", op, r->head_dim,
                        a->v_dim, kMaxDim);
    Params p = {};
    p.q_in = (const unsigned char *)r->t[0].in;
    p.k_in = (const unsigned char *)r->t[1].in;
    p.v_in = (const unsigned char *)a->v_in.data;
    p.q_tok = r->t[0].in_tok, p.q_head = r->t[0].in_head;
    p.k_tok = r->t[1].in_tok, p.k_head = r->t[1].in_head;
    p.v_tok = a->v_in.tok, p.v_head = a->v_in.head;
    p.q_out = Dest{(unsigned char *)r->t[0].out, r->t[0].out_tok, r->t[0].out_head, (int)r->dtype, 1.0f};
    p.k_out = Dest{(unsigned char *)r->t[1].out, r->t[1].out_tok, r->t[1].out_head, (int)r->dtype, 1.0f};
    p.k_cache = dest_of(a->k_cache);
    p.k_cache.scale = a->k_scale;
    p.v_cache = dest_of(a->v_cache);
    p.v_cache.scale = a->v_scale;
    p.q_w = a->q_norm_w, p.k_w = a->k_norm_w;
    p.q_w_dt = (int)a->q_norm_dtype, p.k_w_dt = (int)a->k_norm_dtype;
    p.eps = (float)a->eps, p.w_off = (float)a->weight_offset, p.mscale = (float)r->angle.mscale;
    p.dt = (int)r->dtype;
    p.T = r->seq_len, p.hq = r->t[0].n_heads, p.hk = r->t[1].n_heads, p.D = r->head_dim, p.dv = a->v_dim;
    p.rows = p.hq + p.hk + (a->v_cache.data ? p.hk : 0);
    p.interleaved = r->interleaved, p.pair_stride = r->pair_stride, p.n_pairs = r->angle.n_pairs;
    p.rope_dim = r->rope_dim;
    const lmk_rope_angle *g = &r->angle;
    p.mode = (int)g->mode;
    for (int i = 0; i < 4; i++)
        p.sections[i] = g->sections[i];
    p.freq_base = g->freq_base, p.exp_n = g->exp_n, p.freq_scale = g->freq_scale, p.ext_factor = g->ext_factor;
    p.ramp_low = g->ramp_low, p.ramp_high = g->ramp_high;
    p.ff = g->freq_factors, p.pos = g->positions, p.pos_dt = (int)g->pos_dtype, p.pos_axis_stride = g->pos_axis_stride;
    p.slots = a->slots, p.slot_dt = (int)a->slot_dtype, p.k_slots = a->k_slots, p.v_slots = a->v_slots;

    /* Warps per block: kWarps unless their row buffers and the angle table exceed the shared memory
     * (head_dim > 1280); with head_dim <= kMaxDim one warp always fits. */
    const size_t table = (size_t)((p.n_pairs + 1) & ~1u) * sizeof(float2);
    uint32_t warps = kWarps;
    while (warps > 1 && table + (size_t)warps * p.D * sizeof(float) > kSmemLimit)
        warps--;
    const size_t smem = table + (size_t)warps * p.D * sizeof(float);
    /* Rows per block: a token's rows all in one block when the tokens alone fill the GPU, else one
     * row per warp so that a short call spreads over the SMs. */
    const uint64_t sms = (uint64_t)d->sm_count;
    p.rows_per_block = (uint64_t)p.T >= 2 * sms ? p.rows : warps;
    const uint32_t groups = (p.rows + p.rows_per_block - 1) / p.rows_per_block;
    if (groups > 65535u)
        return lmk_fail(LMK_ERR_UNSUPPORTED, "%s: %u heads per token exceed the CUDA kernel's grid (%u row groups)", op,
                        p.rows, groups);
    const uint32_t blocks_x = p.T < 65535u * 16u ? p.T : 65535u * 16u;
    prologue_kernel<<<dim3(blocks_x, groups, 1), warps * 32, smem, lmk_cuda_stream_of(s)>>>(p);
    const cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? LMK_OK : lmk_cuda_fail(e, "attn_prologue: kernel launch");
}

cudaError_t lmk_cuda_attn_prologue_preload(void)
{
    cudaFuncAttributes attr;
    return cudaFuncGetAttributes(&attr, prologue_kernel);
}
