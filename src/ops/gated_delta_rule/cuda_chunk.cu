/*
 * cuda_chunk.cu - the chunked (WY / UT-transform) form of gated_delta_rule on tensor cores, for
 * prompts (lmk.h, "gated_delta_rule"): the same function as the token-by-token kernel of cuda.cu,
 * with the work of a chunk of C = 64 tokens done as matrix products. cuda.cu chooses it (chunk_takes
 * below) when the caller gave a workspace large enough, q/k/v are bf16 or f16, q and k are
 * L2-normalised, dk = dv = 64 or 128, and the sequences average a chunk or more.
 *
 * The math (per sequence, value head, chunk of L <= C tokens aligned to the sequence start; G the
 * cumulative log decay within the chunk, kn and qu the L2-normalised k and q, qu without the scale):
 *   A   = strictly lower, A_ij = beta_i e^(G_i - G_j) kn_i . kn_j
 *   W   = (I + A)^-1 diag(beta e^G) Kn,   U' = (I + A)^-1 diag(beta) V      (chunk-local)
 *   U   = U' - W S0                                                          (the new values)
 *   O   = scale (diag(e^G) Qu S0 + Mqk U),  Mqk_ij = e^(G_i - G_j) qu_i . kn_j for j <= i
 *   S1  = e^(G_last) S0 + Kn^T diag(e^(G_last - G_j)) U
 * e^(G_i - G_j) is always formed from the difference (j <= i: never above 1 for decays <= 1), and a
 * short final chunk's padding rows are zero with g = 0, so G_last is the last real token's.
 *
 * Three kernels, one stream, no host sync (a call can be captured into a CUDA graph):
 *  K0 plan_kernel (one block): each sequence's first chunk, a prefix sum of ceil(len / C) over the
 *     sequences as lmk_seq_bounds clamps them, capped at the workspace's bound T / C + n_seq (a
 *     hostile cu_seqlens loses chunks, never leaves the workspace), and each chunk's sequence.
 *  K1 prep_kernel (one block per (chunk, value head), parallel): gates, L2 norms, G, A and Mqk
 *     (Kn Kn^T and Qu Kn^T on tensor cores, f16 operands, f32 sums), then W and U' by forward
 *     substitution through (I + A) in f32, one column a thread; W, Mqk (bounded by 1) stored f16,
 *     U' f32, the gates f32, Qu and Kn f16 once per key head (by the first value head reading it).
 *  K2 seq_kernel (one block per (sequence, value head), sequential over its chunks): the state
 *     S^T [dv, dk] in f32 registers, warp w owning value rows 16w .. 16w + 15 (the accumulator
 *     layout of mma.m16n8k16, which is also its A-operand layout, so S0^T, U^T and O^T never move
 *     between threads). A chunk's operands come through cp.async into one of two shared stages
 *     (one where shared memory is short) while the previous chunk computes. On sm_90 code a head's
 *     value rows may be split over a cluster of two blocks (when that takes fewer half-length
 *     waves): each holds half of every output row, and the gated norm adds the two blocks' partial
 *     sums of squares, read through distributed shared memory, in rank order.
 * Precision (lmk.h: rows within 4e-3 of float64 with 16-bit inputs; the carried state never
 * rounded): every product runs on f16 tensor cores with f32 sums, f16 rather than bf16 for its 11
 * bits. Operands bounded by 1 (Qu, Kn, W, Mqk) are stored f16; those of unbounded range (S0, U, U~)
 * are scaled per row by a power of two (exact both ways) so their largest element sits just under
 * 2^15, then rounded to f16 as operands only: the state itself stays f32 between chunks, loaded at
 * the sequence start and stored at its end as the token kernel does (bf16 pools rounded once). A
 * float64 model of these roundings over long sequences of long memory keeps the outputs a tenth
 * of lmk.h's bound from the reference, the roundings of Kn, Qu and W dominating (splitting S0 and
 * U~ into hi + lo f16 pairs, twice the products, barely moved it). The gated norm runs in f32 on
 * the chunk's O rows, staged in shared memory.
 * Deterministic: fixed reduction orders, no atomics. Sequences and slots are read through varlen.h.
 */
#include "cuda/cuda_internal.h"
#include "cuda/kernel_common.cuh"
#include "ops/gated_delta_rule/gated_delta_rule.h"
#include "ops/varlen.h"

#include <math.h>
#include <stdint.h>

namespace {

constexpr int kC = LMK_GDN_CHUNK; /* tokens a chunk */
constexpr float kEpsL2 = 1e-6f;    /* lmk.h: the L2 norm's epsilon */
constexpr int kPrepThreads = 256;
constexpr int kPlanThreads = 1024;
constexpr uint64_t kGridCap = 1u << 30;

struct ChunkParams {
    const unsigned char *q, *k, *v;
    unsigned char *out;
    const void *a, *b, *A_log, *dt_bias, *z, *norm_w;
    const void *cu_seqlens, *slots;
    unsigned char *state;
    int32_t *seq_first, *chunk_seq; /* workspace: [n_seq + 1], [n_chunks] */
    unsigned char *records, *qk;    /* workspace: per (chunk, value head), per (chunk, key head) */
    uint64_t T, n_seq, n_slots, n_chunks, record_bytes, qk_bytes;
    uint64_t q_tok, q_head, k_tok, k_head, v_tok, v_head, o_tok, o_head; /* elements */
    uint64_t a_tok, b_tok, z_tok, z_head;
    uint64_t s_slot, s_head, s_k, s_v;
    uint32_t Hk, Hv, group;
    int a_dt, b_dt, A_dt, dt_dt, z_dt, nw_dt, cu_is64, slots_is64;
    float scale, eps, weight_offset;
    bool block_map, has_gates, has_z, st_bf16;
    int stages; /* K2's shared stages: 2 (prefetch) or 1 */
};

/* Record layout (bytes from a record's start): W [C, DK] f16, U' [C, DV] f32, Mqk [C, C] f16, gates
 * [3, C] f32 (e^G_i, e^(G_last - G_i), then e^G_last and zeros). The qk block: Qu then Kn, [C, DK]
 * f16 each. lmk_gdn_chunk_plan's record_bytes and qk_bytes are these sums. */
template <int DK, int DV> struct Rec {
    static constexpr int W = 0;
    static constexpr int U = W + kC * DK * 2;
    static constexpr int M = U + kC * DV * 4;
    static constexpr int G = M + kC * kC * 2;
    static constexpr int bytes = G + 3 * kC * 4;
    static constexpr int Kn = kC * DK * 2; /* in the qk block, after Qu */
};

/* K2's shared stage: rows padded by 16 bytes so that the 8 rows of an ldmatrix and the U' / O
 * elements of a warp's accumulator fall in distinct banks. O is staged in the U' rows. */
template <int DK, int DV> struct Stage {
    static constexpr int PK = DK + 8;  /* halves a W / Qu / Kn row */
    static constexpr int PC = kC + 8;  /* halves an Mqk row */
    static constexpr int PV = DV + 4;  /* floats a U' / O row */
    static constexpr int W = 0;
    static constexpr int Q = W + kC * PK * 2;
    static constexpr int K = Q + kC * PK * 2;
    static constexpr int M = K + kC * PK * 2;
    static constexpr int U = M + kC * PC * 2;
    static constexpr int G = U + kC * PV * 4;
    static constexpr int bytes = G + 3 * kC * 4;
};

/* K1's shared memory: Kn and Qu f16 (padded rows), A f32 [C, C], six gate vectors. */
template <int DK> struct Prep {
    static constexpr int PK = DK + 8;
    static constexpr int bytes = 2 * kC * PK * 2 + kC * kC * 4 + 6 * kC * 4;
};

template <int DT> __device__ __forceinline__ float ld_in(const unsigned char *base, uint64_t i)
{
    return Elem<DT>::widen(reinterpret_cast<const unsigned short *>(base)[i]);
}

__device__ __forceinline__ float warp_sum(float x)
{
#pragma unroll
    for (uint32_t m = 16; m > 0; m >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, m);
    return x;
}

__device__ __forceinline__ uint32_t h2_bits(__half2 h)
{
    return (uint32_t)__half_as_ushort(h.x) | ((uint32_t)__half_as_ushort(h.y) << 16);
}

__device__ __forceinline__ uint32_t pack_h2(float lo, float hi)
{
    return h2_bits(__floats2half2_rn(lo, hi));
}

/* 2^s with s = 14 - exponent(m), clamped to [-100, 100]: m * 2^s < 2^15, inside f16's range with
 * room for the rounding; a power of two, so scaling by it and by its inverse is exact in f32. */
__device__ __forceinline__ void pow2_scale(float m, float &s, float &inv)
{
    int e = (int)((__float_as_uint(m) >> 23) & 0xffu) - 127;
    int k = 14 - e;
    k = k < -100 ? -100 : k > 100 ? 100 : k;
    s = __uint_as_float((uint32_t)(127 + k) << 23);
    inv = __uint_as_float((uint32_t)(127 - k) << 23);
}

/* The max of |x| over the 4 lanes of a quad (the lanes holding one accumulator row). */
__device__ __forceinline__ float quad_max(float x)
{
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p))
                 : "memory");
}

__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p))
                 : "memory");
}

__device__ __forceinline__ void cp16(void *dst, const void *src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}

__device__ __forceinline__ void cp_commit()
{
    asm volatile("cp.async.commit_group;" ::: "memory");
}

template <int N> __device__ __forceinline__ void cp_wait()
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* rows x ROW_BYTES bytes from global rows SRC_PITCH bytes apart into shared rows PITCH bytes apart. */
template <int ROW_BYTES, int PITCH, int SRC_PITCH, int NT>
__device__ __forceinline__ void copy_rows(unsigned char *dst, const unsigned char *src, int rows)
{
    constexpr int upr = ROW_BYTES / 16;
    for (int u = threadIdx.x; u < rows * upr; u += NT) {
        const int r = u / upr, c = u - r * upr;
        cp16(dst + r * PITCH + c * 16, src + (uint64_t)r * SRC_PITCH + c * 16);
    }
}

/* Sequence s's tokens [lo, hi) and its chunk count (clamped to the workspace's chunk table). */
__device__ __forceinline__ int seq_chunks(const ChunkParams &p, uint64_t s, size_t &lo, size_t &hi, int &first)
{
    lmk_seq_bounds(p.cu_seqlens, p.cu_is64, s, p.T, &lo, &hi);
    first = p.seq_first[s];
    const int listed = p.seq_first[s + 1] - first;
    const uint64_t need = (hi - lo + kC - 1) / kC;
    return listed < 0 ? 0 : (uint64_t)listed < need ? listed : (int)need;
}

/* ---------------------------------------------------------------------------------------------
 * K0: the chunk table.
 * ------------------------------------------------------------------------------------------- */

/* The exclusive prefix sum of x over the block's threads in thread order, and the block's total. */
__device__ __forceinline__ int64_t block_scan(int64_t x, int64_t *warp_sums, int64_t *total)
{
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int64_t inc = x;
#pragma unroll
    for (uint32_t o = 1; o < 32; o <<= 1) {
        const int64_t y = __shfl_up_sync(0xffffffffu, inc, o);
        inc += lane >= o ? y : 0;
    }
    if (lane == 31)
        warp_sums[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        int64_t w = lane < nw ? warp_sums[lane] : 0;
#pragma unroll
        for (uint32_t o = 1; o < 32; o <<= 1) {
            const int64_t y = __shfl_up_sync(0xffffffffu, w, o);
            w += lane >= o ? y : 0;
        }
        warp_sums[lane] = w; /* inclusive over the warps */
    }
    __syncthreads();
    *total = warp_sums[nw - 1];
    return inc - x + (warp ? warp_sums[warp - 1] : 0);
}

__global__ void __launch_bounds__(kPlanThreads) gdn_chunk_plan_kernel(const __grid_constant__ ChunkParams p)
{
    __shared__ int64_t warp_sums[32];
    pdl_enter();
    const uint32_t tid = threadIdx.x, nt = blockDim.x;
    const uint64_t per = (p.n_seq + nt - 1) / nt;
    const uint64_t s0 = tid * per < p.n_seq ? tid * per : p.n_seq, s1 = s0 + per < p.n_seq ? s0 + per : p.n_seq;
    int64_t cnt = 0;
    for (uint64_t s = s0; s < s1; s++) {
        size_t lo, hi;
        lmk_seq_bounds(p.cu_seqlens, p.cu_is64, s, p.T, &lo, &hi);
        cnt += (int64_t)((hi - lo + kC - 1) / kC);
    }
    int64_t all;
    int64_t off = block_scan(cnt, warp_sums, &all);
    const int64_t bound = (int64_t)p.n_chunks, total = all < bound ? all : bound;
    for (uint64_t s = s0; s < s1; s++) {
        size_t lo, hi;
        lmk_seq_bounds(p.cu_seqlens, p.cu_is64, s, p.T, &lo, &hi);
        const int64_t c = (int64_t)((hi - lo + kC - 1) / kC);
        const int64_t a = off < bound ? off : bound, b = off + c < bound ? off + c : bound;
        p.seq_first[s] = (int32_t)a;
        for (int64_t g = a; g < b; g++)
            p.chunk_seq[g] = (int32_t)s;
        off += c;
    }
    if (tid == 0)
        p.seq_first[p.n_seq] = (int32_t)total;
    for (int64_t g = total + tid; g < bound; g += nt)
        p.chunk_seq[g] = -1;
}

/* ---------------------------------------------------------------------------------------------
 * K1: a chunk's local quantities.
 * ------------------------------------------------------------------------------------------- */

/* Qu and Kn of the chunk's rows to shared memory (f16; rows past L zero). Warp w: rows w, w + 8, ... */
template <int DT, int DK>
__device__ __forceinline__ void prep_qk(const ChunkParams &p, __half *Qs, __half *Ks, uint64_t t0, int L, uint32_t kh)
{
    constexpr int PK = Prep<DK>::PK, E = DK / 32;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int i = w; i < kC; i += kPrepThreads / 32) {
        float qv[E], kv[E], sq = 0.0f, sk = 0.0f;
#pragma unroll
        for (int m = 0; m < E; m++) {
            qv[m] = kv[m] = 0.0f;
            if (i < L) {
                qv[m] = ld_in<DT>(p.q, (t0 + i) * p.q_tok + kh * p.q_head + lane + 32 * m);
                kv[m] = ld_in<DT>(p.k, (t0 + i) * p.k_tok + kh * p.k_head + lane + 32 * m);
            }
            sq = fmaf(qv[m], qv[m], sq);
            sk = fmaf(kv[m], kv[m], sk);
        }
        const float iq = 1.0f / sqrtf(warp_sum(sq) + kEpsL2), ik = 1.0f / sqrtf(warp_sum(sk) + kEpsL2);
#pragma unroll
        for (int m = 0; m < E; m++) {
            Qs[i * PK + lane + 32 * m] = __float2half_rn(qv[m] * iq);
            Ks[i * PK + lane + 32 * m] = __float2half_rn(kv[m] * ik);
        }
    }
}

/* The gates of the chunk's rows (g = 0, beta = 0 past L), G their running sum, e^G, e^(G_last - G)
 * and e^G_last (at eGl[kC]). */
__device__ __forceinline__ void prep_gates(const ChunkParams &p, float *gv, float *bv, float *Gv, float *eG,
                                           float *eGl, uint64_t t0, int L, uint32_t h)
{
    const int tid = threadIdx.x;
    if (tid < kC) {
        float g = 0.0f, beta = 0.0f;
        if (tid < L) {
            const float a = ld_f32(p.a, p.a_dt, (t0 + tid) * p.a_tok + h);
            const float b = ld_f32(p.b, p.b_dt, (t0 + tid) * p.b_tok + h);
            g = a, beta = b;
            if (p.has_gates) { /* as the token kernel: softplus without overflow */
                const float x = a + ld_f32(p.dt_bias, p.dt_dt, h);
                g = -expf(ld_f32(p.A_log, p.A_dt, h)) * (fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x))));
                beta = 1.0f / (1.0f + expf(-b));
            }
            /* e^-110 is 0 in f32: a stronger decay zeroes every product spanning it all the same,
             * and the bound keeps G finite (an infinite g would make G_i - G_j NaN) */
            g = g < -110.0f ? -110.0f : g;
        }
        gv[tid] = g, bv[tid] = beta;
    }
    __syncthreads();
    if (tid < kC) {
        float G = 0.0f;
        for (int j = 0; j <= tid; j++) /* left to right: every row's prefix has the same bits */
            G += gv[j];
        Gv[tid] = G;
    }
    __syncthreads();
    if (tid < kC) {
        eG[tid] = expf(Gv[tid]);
        eGl[tid] = expf(Gv[L - 1] - Gv[tid]);
    }
    if (tid == 0)
        eGl[kC] = expf(Gv[L - 1]);
}

/* Kn Kn^T and Qu Kn^T on tensor cores, then A (f32, shared) and Mqk (f16, the record). Warp w: rows
 * 16 (w / 2) .. + 15, columns 32 (w % 2) .. + 31. */
template <int DK>
__device__ __forceinline__ void prep_products(const __half *Qs, const __half *Ks, float *Af, const float *bv,
                                              const float *Gv, unsigned char *rec_m)
{
    constexpr int PK = Prep<DK>::PK;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, q4 = lane & 3;
    const int mt = w >> 1, nb = (w & 1) * 32;
    float kk[4][4], qk[4][4];
#pragma unroll
    for (int t = 0; t < 4; t++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            kk[t][e] = qk[t][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < DK / 16; ks++) {
        uint32_t ak[4], aq[4];
        ldsm_x4(ak, Ks + (mt * 16 + (lane & 15)) * PK + ks * 16 + (lane >> 4) * 8);
        ldsm_x4(aq, Qs + (mt * 16 + (lane & 15)) * PK + ks * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int np = 0; np < 2; np++) {
            uint32_t b[4];
            ldsm_x4(b, Ks + (nb + np * 16 + (lane & 7) + ((lane >> 4) << 3)) * PK + ks * 16 + ((lane >> 3) & 1) * 8);
            mma_f16(kk[2 * np], ak, b[0], b[1]);
            mma_f16(kk[2 * np + 1], ak, b[2], b[3]);
            mma_f16(qk[2 * np], aq, b[0], b[1]);
            mma_f16(qk[2 * np + 1], aq, b[2], b[3]);
        }
    }
#pragma unroll
    for (int t = 0; t < 4; t++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int i = mt * 16 + g + hf * 8, j0 = nb + t * 8 + 2 * q4;
            float m2[2];
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int j = j0 + c;
                const float d = j <= i ? expf(Gv[i] - Gv[j]) : 0.0f;
                Af[i * kC + j] = j < i ? bv[i] * d * kk[t][hf * 2 + c] : 0.0f;
                m2[c] = d * qk[t][hf * 2 + c];
            }
            *reinterpret_cast<uint32_t *>(rec_m + (i * kC + j0) * 2) = pack_h2(m2[0], m2[1]);
        }
}

/* W (column c < DK) or U' (column c - DK) by forward substitution: R_i = X_i - sum_{j<i} A_ij R_j,
 * in f32, the sum in a fixed order (A_ij is 0 for j >= i and R_j 0 until computed): four partial
 * sums over j mod 4, added in one order, so the dependent chain of a row is a quarter of its terms. */
template <int DT, int DK, int DV>
__device__ __forceinline__ void prep_solve(const ChunkParams &p, const __half *Ks, const float *Af, const float *bv,
                                           const float *eG, unsigned char *rec, uint64_t t0, int L, uint32_t h)
{
    constexpr int PK = Prep<DK>::PK;
    const int tid = threadIdx.x;
    if (tid >= DK + DV)
        return;
    const bool is_w = tid < DK;
    const int col = is_w ? tid : tid - DK;
    float R[kC];
#pragma unroll
    for (int i = 0; i < kC; i++)
        R[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < kC; i++) {
        float x;
        if (is_w)
            x = bv[i] * eG[i] * __half2float(Ks[i * PK + col]);
        else
            x = i < L ? bv[i] * ld_in<DT>(p.v, (t0 + i) * p.v_tok + h * p.v_head + col) : 0.0f;
        float x1 = 0.0f, x2 = 0.0f, x3 = 0.0f;
#pragma unroll
        for (int jb = 0; jb < (i + 3) / 4; jb++) {
            const float4 a4 = *reinterpret_cast<const float4 *>(Af + i * kC + 4 * jb);
            x = fmaf(-a4.x, R[4 * jb], x);
            x1 = fmaf(-a4.y, R[4 * jb + 1], x1);
            x2 = fmaf(-a4.z, R[4 * jb + 2], x2);
            x3 = fmaf(-a4.w, R[4 * jb + 3], x3);
        }
        R[i] = (x + x1) + (x2 + x3);
    }
    if (is_w) {
        __half *W = reinterpret_cast<__half *>(rec + Rec<DK, DV>::W);
#pragma unroll
        for (int i = 0; i < kC; i++)
            W[i * DK + col] = __float2half_rn(R[i]);
    } else {
        float *U = reinterpret_cast<float *>(rec + Rec<DK, DV>::U);
#pragma unroll
        for (int i = 0; i < kC; i++)
            U[i * DV + col] = R[i];
    }
}

template <int DT, int DK, int DV>
__global__ void __launch_bounds__(kPrepThreads) gdn_chunk_prep_kernel(const __grid_constant__ ChunkParams p)
{
    extern __shared__ __align__(16) unsigned char smem[];
    constexpr int PK = Prep<DK>::PK;
    __half *Ks = reinterpret_cast<__half *>(smem), *Qs = Ks + kC * PK;
    float *Af = reinterpret_cast<float *>(Qs + kC * PK);
    float *gv = Af + kC * kC, *bv = gv + kC, *Gv = bv + kC, *eG = Gv + kC, *eGl = eG + kC; /* eGl: kC + 1 */
    pdl_enter();
    const int tid = threadIdx.x;
    for (uint64_t item = blockIdx.x; item < p.n_chunks * p.Hv; item += gridDim.x) {
        const uint64_t gc = item / p.Hv;
        const uint32_t h = (uint32_t)(item - gc * p.Hv);
        const int s = p.chunk_seq[gc];
        if (s < 0)
            continue; /* block-uniform: past the call's chunks */
        size_t lo, hi;
        lmk_seq_bounds(p.cu_seqlens, p.cu_is64, (uint64_t)s, p.T, &lo, &hi);
        const uint64_t t0 = lo + (gc - (uint64_t)p.seq_first[s]) * kC; /* < hi: K0 lists ceil(len / C) chunks */
        const int L = (int)(hi - t0 < (uint64_t)kC ? hi - t0 : kC);
        const uint32_t kh = p.block_map ? h / p.group : h % p.Hk;
        unsigned char *rec = p.records + (gc * p.Hv + h) * p.record_bytes;
        prep_qk<DT, DK>(p, Qs, Ks, t0, L, kh);
        prep_gates(p, gv, bv, Gv, eG, eGl, t0, L, h);
        __syncthreads();
        prep_products<DK>(Qs, Ks, Af, bv, Gv, rec + Rec<DK, DV>::M);
        float *gates = reinterpret_cast<float *>(rec + Rec<DK, DV>::G);
        if (tid < kC)
            gates[tid] = eG[tid], gates[kC + tid] = eGl[tid], gates[2 * kC + tid] = tid == 0 ? eGl[kC] : 0.0f;
        const uint32_t first_h = p.block_map ? kh * p.group : kh; /* one writer per key head */
        if (h == first_h) {
            unsigned char *dst = p.qk + (gc * p.Hk + kh) * p.qk_bytes;
            constexpr int upr = DK * 2 / 16;
            for (int u = tid; u < 2 * kC * upr; u += kPrepThreads) {
                const int r = u / upr, c = u - r * upr; /* rows 0 .. C-1: Qu, C .. 2C-1: Kn */
                const __half *src = r < kC ? Qs + r * PK : Ks + (r - kC) * PK;
                *reinterpret_cast<uint4 *>(dst + r * DK * 2 + c * 16) =
                    *reinterpret_cast<const uint4 *>(reinterpret_cast<const unsigned char *>(src) + c * 16);
            }
        }
        __syncthreads();
        prep_solve<DT, DK, DV>(p, Ks, Af, bv, eG, rec, t0, L, h);
        __syncthreads(); /* the next item rewrites the shared arrays */
    }
}

/* ---------------------------------------------------------------------------------------------
 * K2: the sequential pass.
 * ------------------------------------------------------------------------------------------- */

/* A block's share of a head's value rows: the SPLIT blocks of a cluster (sm_90) take DV / SPLIT
 * rows each, a warp 16 of them. */
template <int DK, int DV, int SPLIT> struct Seq {
    static constexpr int DVB = DV / SPLIT;
    static constexpr int NW = DVB / 16;
    static constexpr int NT = NW * 32;
    using St = Stage<DK, DVB>;
    static constexpr int part_bytes = SPLIT > 1 ? 2 * kC * 4 : 0; /* the norm's partial sums, 2 chunks */
};

/* Chunk gc's operands for value head h (key head kh) into a stage: the block's rows dv0 .. of U'. */
template <int DK, int DV, int SPLIT>
__device__ __forceinline__ void load_stage(const ChunkParams &p, unsigned char *st, uint64_t gc, uint32_t h,
                                           uint32_t kh, int dv0)
{
    using R = Rec<DK, DV>;
    using Q = Seq<DK, DV, SPLIT>;
    using S = typename Q::St;
    constexpr int NT = Q::NT;
    const unsigned char *rec = p.records + (gc * p.Hv + h) * p.record_bytes;
    const unsigned char *qk = p.qk + (gc * p.Hk + kh) * p.qk_bytes;
    copy_rows<DK * 2, S::PK * 2, DK * 2, NT>(st + S::W, rec + R::W, kC);
    copy_rows<DK * 2, S::PK * 2, DK * 2, NT>(st + S::Q, qk, kC);
    copy_rows<DK * 2, S::PK * 2, DK * 2, NT>(st + S::K, qk + R::Kn, kC);
    copy_rows<kC * 2, S::PC * 2, kC * 2, NT>(st + S::M, rec + R::M, kC);
    copy_rows<Q::DVB * 4, S::PV * 4, DV * 4, NT>(st + S::U, rec + R::U + dv0 * 4, kC);
    copy_rows<3 * kC * 4, 3 * kC * 4, 3 * kC * 4, NT>(st + S::G, rec + R::G, 1);
    cp_commit();
}

/* Every thread of the cluster arrives after its earlier memory accesses (release) and waits for
 * all (acquire). sm_90 code only: the host launches clusters only where the device runs it. */
__device__ __forceinline__ void cluster_sync()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

/* The float at p in the shared memory of the cluster's block `rank` (sm_90 code only). */
__device__ __forceinline__ float ld_cluster(const float *p, uint32_t rank)
{
    float v = 0.0f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    uint32_t at;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(at) : "r"(smem_addr(p)), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(at) : "memory");
#else
    (void)p, (void)rank;
#endif
    return v;
}

/* A warp's 16 value rows of S^T in mma's accumulator layout: tile nt holds key columns 8nt .. 8nt + 7,
 * element e of this thread value row g + 8 (e >> 1) and key column 8nt + 2 q4 + (e & 1). */
template <int DK> struct StateRegs {
    float S[DK / 8][4];
};

/* This thread's state elements from the pool row (widened) or to it (rounded once for bf16). */
template <int DK>
__device__ __forceinline__ void state_io(const ChunkParams &p, StateRegs<DK> &r, int64_t row, uint32_t h, int dv0,
                                        bool load)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, q4 = lane & 3;
    const uint64_t base = (uint64_t)row * p.s_slot + h * p.s_head;
#pragma unroll
    for (int nt = 0; nt < DK / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const uint64_t dv = dv0 + w * 16 + g + (e >> 1) * 8, dk = nt * 8 + 2 * q4 + (e & 1);
            const uint64_t at = base + dk * p.s_k + dv * p.s_v;
            if (load)
                r.S[nt][e] = p.st_bf16 ? Elem<LMK_BF16>::widen(reinterpret_cast<const unsigned short *>(p.state)[at])
                                       : reinterpret_cast<const float *>(p.state)[at];
            else if (p.st_bf16)
                reinterpret_cast<unsigned short *>(p.state)[at] = (unsigned short)Elem<LMK_BF16>::narrow(r.S[nt][e]);
            else
                reinterpret_cast<float *>(p.state)[at] = r.S[nt][e];
        }
}

/* U^T and the first term of O^T: U = U' - W S0 and P = Qu S0 (S0 one f16 operand, scaled per row). */
template <int DK, int DV>
__device__ __forceinline__ void chunk_s0_products(const StateRegs<DK> &r, const unsigned char *st,
                                                  float (&accU)[kC / 8][4], float (&accO)[kC / 8][4])
{
    using S = Stage<DK, DV>;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, q4 = lane & 3;
    const __half *Ws = reinterpret_cast<const __half *>(st + S::W), *Qs = reinterpret_cast<const __half *>(st + S::Q);
    float m0 = 0.0f, m1 = 0.0f;
#pragma unroll
    for (int nt = 0; nt < DK / 8; nt++) {
        m0 = fmaxf(m0, fmaxf(fabsf(r.S[nt][0]), fabsf(r.S[nt][1])));
        m1 = fmaxf(m1, fmaxf(fabsf(r.S[nt][2]), fabsf(r.S[nt][3])));
    }
    float s0, i0, s1, i1;
    pow2_scale(quad_max(m0), s0, i0);
    pow2_scale(quad_max(m1), s1, i1);
#pragma unroll
    for (int nt = 0; nt < kC / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            accU[nt][e] = accO[nt][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < DK / 16; kk++) {
        const uint32_t a[4] = {pack_h2(r.S[2 * kk][0] * s0, r.S[2 * kk][1] * s0),
                               pack_h2(r.S[2 * kk][2] * s1, r.S[2 * kk][3] * s1),
                               pack_h2(r.S[2 * kk + 1][0] * s0, r.S[2 * kk + 1][1] * s0),
                               pack_h2(r.S[2 * kk + 1][2] * s1, r.S[2 * kk + 1][3] * s1)};
#pragma unroll
        for (int np = 0; np < kC / 16; np++) {
            const int at = (np * 16 + (lane & 7) + ((lane >> 4) << 3)) * S::PK + kk * 16 + ((lane >> 3) & 1) * 8;
            uint32_t bw[4], bq[4];
            ldsm_x4(bw, Ws + at);
            ldsm_x4(bq, Qs + at);
            mma_f16(accU[2 * np], a, bw[0], bw[1]);
            mma_f16(accU[2 * np + 1], a, bw[2], bw[3]);
            mma_f16(accO[2 * np], a, bq[0], bq[1]);
            mma_f16(accO[2 * np + 1], a, bq[2], bq[3]);
        }
    }
    /* unscale; U = U' - W S0; O's first term times e^G_i */
    const float *Us = reinterpret_cast<const float *>(st + S::U), *eG = reinterpret_cast<const float *>(st + S::G);
#pragma unroll
    for (int nt = 0; nt < kC / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int j = nt * 8 + 2 * q4 + (e & 1), dv = w * 16 + g + (e >> 1) * 8;
            const float inv = e < 2 ? i0 : i1;
            accU[nt][e] = Us[j * S::PV + dv] - accU[nt][e] * inv;
            accO[nt][e] = (accO[nt][e] * inv) * eG[j];
        }
}

/* O^T = scale (O^T + (Mqk U)^T), U one f16 operand scaled per row; the product is summed apart from O
 * (a scaled O could overflow where U is far smaller) and only over the tiles where j <= i. */
template <int DK, int DV>
__device__ __forceinline__ void chunk_intra(const unsigned char *st, const float (&accU)[kC / 8][4],
                                            float (&accO)[kC / 8][4], float scale)
{
    using S = Stage<DK, DV>;
    const int lane = threadIdx.x & 31;
    const __half *Ms = reinterpret_cast<const __half *>(st + S::M);
    float m0 = 0.0f, m1 = 0.0f;
#pragma unroll
    for (int nt = 0; nt < kC / 8; nt++) {
        m0 = fmaxf(m0, fmaxf(fabsf(accU[nt][0]), fabsf(accU[nt][1])));
        m1 = fmaxf(m1, fmaxf(fabsf(accU[nt][2]), fabsf(accU[nt][3])));
    }
    float s0, i0, s1, i1;
    pow2_scale(quad_max(m0), s0, i0);
    pow2_scale(quad_max(m1), s1, i1);
    uint32_t a[kC / 16][4];
#pragma unroll
    for (int kj = 0; kj < kC / 16; kj++) {
        a[kj][0] = pack_h2(accU[2 * kj][0] * s0, accU[2 * kj][1] * s0);
        a[kj][1] = pack_h2(accU[2 * kj][2] * s1, accU[2 * kj][3] * s1);
        a[kj][2] = pack_h2(accU[2 * kj + 1][0] * s0, accU[2 * kj + 1][1] * s0);
        a[kj][3] = pack_h2(accU[2 * kj + 1][2] * s1, accU[2 * kj + 1][3] * s1);
    }
#pragma unroll
    for (int np = 0; np < kC / 16; np++) {
        float t[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
        for (int kj = 0; kj <= np; kj++) { /* Mqk_ij = 0 for j > i: tiles past the diagonal are 0 */
            uint32_t bm[4];
            ldsm_x4(bm, Ms + (np * 16 + (lane & 7) + ((lane >> 4) << 3)) * S::PC + kj * 16 + ((lane >> 3) & 1) * 8);
            mma_f16(t[0], a[kj], bm[0], bm[1]);
            mma_f16(t[1], a[kj], bm[2], bm[3]);
        }
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                accO[2 * np + h][e] = (accO[2 * np + h][e] + t[h][e] * (e < 2 ? i0 : i1)) * scale;
    }
}

/* S1^T = e^G_last S0^T + (diag(e^(G_last - G)) U)^T Kn, U~ one f16 operand scaled per row, over the
 * key columns 64 at a time (accU becomes U~). */
template <int DK, int DV>
__device__ __forceinline__ void chunk_update(StateRegs<DK> &r, const unsigned char *st, float (&accU)[kC / 8][4])
{
    using S = Stage<DK, DV>;
    const int lane = threadIdx.x & 31, q4 = lane & 3;
    const __half *Ks = reinterpret_cast<const __half *>(st + S::K);
    const float *eGl = reinterpret_cast<const float *>(st + S::G) + kC;
    const float eGlast = eGl[kC];
    float m0 = 0.0f, m1 = 0.0f;
#pragma unroll
    for (int nt = 0; nt < kC / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            accU[nt][e] *= eGl[nt * 8 + 2 * q4 + (e & 1)];
            if (e < 2)
                m0 = fmaxf(m0, fabsf(accU[nt][e]));
            else
                m1 = fmaxf(m1, fabsf(accU[nt][e]));
        }
    float s0, i0, s1, i1;
    pow2_scale(quad_max(m0), s0, i0);
    pow2_scale(quad_max(m1), s1, i1);
#pragma unroll
    for (int grp = 0; grp < DK / 64; grp++) {
        float tmp[8][4];
#pragma unroll
        for (int t = 0; t < 8; t++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                tmp[t][e] = 0.0f;
#pragma unroll
        for (int kj = 0; kj < kC / 16; kj++) {
            const uint32_t a[4] = {pack_h2(accU[2 * kj][0] * s0, accU[2 * kj][1] * s0),
                                   pack_h2(accU[2 * kj][2] * s1, accU[2 * kj][3] * s1),
                                   pack_h2(accU[2 * kj + 1][0] * s0, accU[2 * kj + 1][1] * s0),
                                   pack_h2(accU[2 * kj + 1][2] * s1, accU[2 * kj + 1][3] * s1)};
#pragma unroll
            for (int np = 0; np < 4; np++) {
                uint32_t bk[4];
                ldsm_x4_t(bk, Ks + (kj * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * S::PK + grp * 64 + np * 16 +
                                  ((lane >> 4) << 3));
                mma_f16(tmp[2 * np], a, bk[0], bk[1]);
                mma_f16(tmp[2 * np + 1], a, bk[2], bk[3]);
            }
        }
#pragma unroll
        for (int t = 0; t < 8; t++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                r.S[grp * 8 + t][e] = fmaf(r.S[grp * 8 + t][e], eGlast, tmp[t][e] * (e < 2 ? i0 : i1));
    }
}

/* O^T to the stage's U' rows (each lane rewrites exactly the elements it read), then the gated norm
 * and the store of rows 0 .. L-1, warp w taking rows w, w + NW, ... In a cluster each block holds
 * DV / SPLIT values of a row: the row's sum of squares is the blocks' partial sums (part, this
 * chunk's half of the double buffer) added in rank order, the same bits in every block. */
template <int DT, int DK, int DV, int SPLIT>
__device__ __forceinline__ void chunk_out(const ChunkParams &p, unsigned char *st, const float (&accO)[kC / 8][4],
                                          const float (&nw)[DV / SPLIT / 32], uint64_t t0, int L, uint32_t h, int dv0,
                                          float *part)
{
    using Q = Seq<DK, DV, SPLIT>;
    using S = typename Q::St;
    constexpr int E = Q::DVB / 32, RW = kC / Q::NW; /* a lane's elements of a row; a warp's rows */
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, q4 = lane & 3;
    float *Os = reinterpret_cast<float *>(st + S::U);
    float zs[RW][E]; /* silu(z) of the warp's rows, loaded before the barrier so their latency overlaps it */
#pragma unroll
    for (int m = 0; m < RW; m++)
#pragma unroll
        for (int k = 0; k < E; k++) {
            const int i = w + Q::NW * m;
            const uint64_t at = (t0 + i) * p.z_tok + h * p.z_head + dv0 + lane + 32 * k;
            zs[m][k] = p.has_z && i < L ? ld_f32(p.z, p.z_dt, at) : 0.0f;
        }
#pragma unroll
    for (int nt = 0; nt < kC / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            Os[(nt * 8 + 2 * q4 + (e & 1)) * S::PV + w * 16 + g + (e >> 1) * 8] = accO[nt][e];
    __syncthreads();
    if (SPLIT > 1 && p.has_z) {
        for (int i = w; i < L; i += Q::NW) {
            float ss = 0.0f;
#pragma unroll
            for (int m = 0; m < E; m++)
                ss = fmaf(Os[i * S::PV + lane + 32 * m], Os[i * S::PV + lane + 32 * m], ss);
            ss = warp_sum(ss);
            if (lane == 0)
                part[i] = ss;
        }
        cluster_sync(); /* every block's partial sums written and visible */
    }
#pragma unroll
    for (int mr = 0; mr < RW; mr++) {
        const int i = w + Q::NW * mr;
        if (i >= L)
            break; /* warp-uniform */
        float o[E], ss = 0.0f;
#pragma unroll
        for (int m = 0; m < E; m++) {
            o[m] = Os[i * S::PV + lane + 32 * m];
            ss = fmaf(o[m], o[m], ss);
        }
        const uint64_t t = t0 + i;
        unsigned char *orow = p.out + (t * p.o_tok + h * p.o_head + dv0) * 2;
        float inv = 0.0f;
        if (p.has_z) {
            float tot = 0.0f;
            if (SPLIT > 1)
#pragma unroll
                for (int r = 0; r < SPLIT; r++)
                    tot += ld_cluster(part + i, (uint32_t)r);
            else
                tot = warp_sum(ss);
            inv = 1.0f / sqrtf(tot / (float)DV + p.eps);
        }
#pragma unroll
        for (int m = 0; m < E; m++) {
            const int e = lane + 32 * m;
            float y = o[m];
            if (p.has_z) {
                const float z = zs[mr][m];
                y = o[m] * inv * nw[m] * (z / (1.0f + expf(-z)));
            }
            reinterpret_cast<unsigned short *>(orow)[e] = (unsigned short)Elem<DT>::narrow(y);
        }
    }
}

/* One (sequence, head) item: the state in, its chunks in order, the state out. tick counts the
 * block's chunks over its items: the parity of the norm's partial-sum buffer. */
template <int DT, int DK, int DV, int SPLIT>
__device__ void seq_item(const ChunkParams &p, unsigned char *smem, uint64_t s, uint32_t h,
                         const float (&nw)[DV / SPLIT / 32], int dv0, float *part, uint32_t &tick)
{
    using Q = Seq<DK, DV, SPLIT>;
    using S = typename Q::St;
    size_t lo, hi;
    int first;
    const int nc = seq_chunks(p, s, lo, hi, first);
    if (nc <= 0)
        return; /* uniform over the cluster: an empty sequence reads and writes nothing */
    const int64_t row = p.state ? lmk_seq_slot(p.slots, p.slots_is64, s, p.n_slots) : -1;
    const bool stores = row >= 0 && lmk_block_seq_stores(p.slots, p.slots_is64, s, p.n_seq, row);
    const uint32_t kh = p.block_map ? h / p.group : h % p.Hk;
    StateRegs<DK> r;
    if (row >= 0)
        state_io<DK>(p, r, row, h, dv0, true);
    else
#pragma unroll
        for (int nt = 0; nt < DK / 8; nt++)
            r.S[nt][0] = r.S[nt][1] = r.S[nt][2] = r.S[nt][3] = 0.0f;
    load_stage<DK, DV, SPLIT>(p, smem, (uint64_t)first, h, kh, dv0);
    for (int c = 0; c < nc; c++, tick++) {
        unsigned char *st = smem + (p.stages == 2 ? (c & 1) * S::bytes : 0);
        if (p.stages == 2 && c + 1 < nc) {
            load_stage<DK, DV, SPLIT>(p, smem + ((c + 1) & 1) * S::bytes, (uint64_t)first + c + 1, h, kh, dv0);
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        const uint64_t t0 = lo + (uint64_t)c * kC;
        const int L = (int)(hi - t0 < (uint64_t)kC ? hi - t0 : kC);
        float accU[kC / 8][4], accO[kC / 8][4];
        chunk_s0_products<DK, Q::DVB>(r, st, accU, accO);
        chunk_intra<DK, Q::DVB>(st, accU, accO, p.scale);
        chunk_update<DK, Q::DVB>(r, st, accU);
        __syncwarp();
        chunk_out<DT, DK, DV, SPLIT>(p, st, accO, nw, t0, L, h, dv0, part + (tick & 1) * kC);
        __syncthreads(); /* the stage is refilled by a later load */
        if (p.stages == 1 && c + 1 < nc)
            load_stage<DK, DV, SPLIT>(p, smem, (uint64_t)first + c + 1, h, kh, dv0);
    }
    if (stores)
        state_io<DK>(p, r, row, h, dv0, false);
}

/* Block b: items b / SPLIT, + gridDim / SPLIT, ... (item = sequence * Hv + head), the cluster's
 * blocks (rank b % SPLIT) on the same items. Dynamic shared memory: the stages, then the partial
 * sums in a cluster. */
template <int DT, int DK, int DV, int SPLIT>
__global__ void __launch_bounds__(DV / SPLIT / 16 * 32, 1) gdn_chunk_seq_kernel(const __grid_constant__ ChunkParams p)
{
    using Q = Seq<DK, DV, SPLIT>;
    extern __shared__ __align__(16) unsigned char smem[];
    pdl_enter();
    const int dv0 = (int)(blockIdx.x % SPLIT) * Q::DVB;
    float nw[Q::DVB / 32];
#pragma unroll
    for (int m = 0; m < Q::DVB / 32; m++)
        nw[m] = p.has_z ? ld_f32(p.norm_w, p.nw_dt, dv0 + (threadIdx.x & 31) + 32 * m) + p.weight_offset : 0.0f;
    float *part = reinterpret_cast<float *>(smem + p.stages * Q::St::bytes);
    uint32_t tick = 0;
    for (uint64_t item = blockIdx.x / SPLIT; item < p.n_seq * p.Hv; item += gridDim.x / SPLIT) {
        const uint64_t s = item / p.Hv;
        seq_item<DT, DK, DV, SPLIT>(p, smem, s, (uint32_t)(item - s * p.Hv), nw, dv0, part, tick);
    }
    if (SPLIT > 1)
        cluster_sync(); /* no block leaves while another may still read its partial sums */
}

/* ---------------------------------------------------------------------------------------------
 * Host: whether the chunked form takes a call, and its launches.
 * ------------------------------------------------------------------------------------------- */

template <int DK, int DV, int SPLIT> size_t seq_smem(int stages)
{
    using Q = Seq<DK, DV, SPLIT>;
    return (size_t)stages * Q::St::bytes + Q::part_bytes;
}

size_t seq_smem_of(int d, int split, int stages)
{
    if (d == 128)
        return split > 1 ? seq_smem<128, 128, 2>(stages) : seq_smem<128, 128, 1>(stages);
    return split > 1 ? seq_smem<64, 64, 2>(stages) : seq_smem<64, 64, 1>(stages);
}

/* lmk_gdn_chunk_plan's record size is this layout's. */
static_assert(Rec<128, 128>::bytes == 64 * 128 * 2 + 64 * 128 * 4 + 64 * 64 * 2 + 3 * 64 * 4, "record layout");
static_assert(Rec<64, 64>::bytes == 64 * 64 * 2 + 64 * 64 * 4 + 64 * 64 * 2 + 3 * 64 * 4, "record layout");

/* One launch, with programmatic serialization where the device has it and a cluster of `cluster`
 * blocks when above 1. */
cudaError_t start(void (*kernel)(ChunkParams), const ChunkParams &p, unsigned blocks, unsigned threads, size_t smem,
                  cudaStream_t cs, bool pdl, unsigned cluster)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks, 1, 1);
    cfg.blockDim = dim3(threads, 1, 1);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = cs;
    cudaLaunchAttribute attr[2];
    unsigned n = 0;
    if (pdl) {
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n].val.programmaticStreamSerializationAllowed = 1;
        n++;
    }
    if (cluster > 1) {
        attr[n].id = cudaLaunchAttributeClusterDimension;
        attr[n].val.clusterDim.x = cluster;
        attr[n].val.clusterDim.y = 1;
        attr[n].val.clusterDim.z = 1;
        n++;
    }
    cfg.attrs = attr;
    cfg.numAttrs = n;
    return cudaLaunchKernelEx(&cfg, kernel, p);
}

template <int DT, int D>
cudaError_t launch_d(const ChunkParams &p, cudaStream_t cs, bool pdl, unsigned sms, int split)
{
    const uint64_t prep_items = p.n_chunks * p.Hv, seq_items = p.n_seq * p.Hv;
    cudaError_t e = start(gdn_chunk_plan_kernel, p, 1, kPlanThreads, 0, cs, pdl, 1);
    const uint64_t prep_blocks = prep_items < (uint64_t)sms * 64 ? prep_items : (uint64_t)sms * 64;
    if (e == cudaSuccess)
        e = start(gdn_chunk_prep_kernel<DT, D, D>, p, (unsigned)prep_blocks, kPrepThreads, (size_t)Prep<D>::bytes, cs,
                  pdl, 1);
    const uint64_t cap = kGridCap / 2, items = seq_items < cap ? seq_items : cap;
    if (e == cudaSuccess && split > 1)
        e = start(gdn_chunk_seq_kernel<DT, D, D, 2>, p, (unsigned)(items * 2), Seq<D, D, 2>::NT,
                  seq_smem<D, D, 2>(p.stages), cs, pdl, 2);
    else if (e == cudaSuccess)
        e = start(gdn_chunk_seq_kernel<DT, D, D, 1>, p, (unsigned)items, Seq<D, D, 1>::NT, seq_smem<D, D, 1>(p.stages),
                  cs, pdl, 1);
    return e;
}

template <int DT, int D> void preload_d(size_t optin, cudaError_t *first)
{
    const size_t prep = (size_t)Prep<D>::bytes;
    lmk_cuda_preload(gdn_chunk_prep_kernel<DT, D, D>, prep <= optin ? prep : 0, first);
    const size_t s1 = seq_smem<D, D, 1>(2) <= optin ? seq_smem<D, D, 1>(2) : seq_smem<D, D, 1>(1);
    const size_t s2 = seq_smem<D, D, 2>(2) <= optin ? seq_smem<D, D, 2>(2) : seq_smem<D, D, 2>(1);
    lmk_cuda_preload(gdn_chunk_seq_kernel<DT, D, D, 1>, s1 <= optin ? s1 : 0, first); /* else never launched */
    lmk_cuda_preload(gdn_chunk_seq_kernel<DT, D, D, 2>, s2 <= optin ? s2 : 0, first);
}

} /* namespace */

bool lmk_cuda_gdn_chunk_takes(const lmk_gdn_args *a, const lmk_cuda_device *d, int *stages, int *split)
{
    if (!a->workspace || (a->dtype != LMK_BF16 && a->dtype != LMK_F16) || !a->l2norm || a->dk != a->dv ||
        (a->dk != 64 && a->dk != 128) || a->T < (size_t)LMK_GDN_CHUNK * a->n_seq)
        return false;
    const lmk_gdn_chunk_layout l = lmk_gdn_chunk_plan(a->T, a->n_seq, a->Hk, a->Hv, a->dk, a->dv);
    if (!l.total || a->workspace_bytes < l.total)
        return false;
    const size_t optin = d->smem_optin > 0 ? (size_t)d->smem_optin : 0;
    const size_t prep = a->dk == 128 ? (size_t)Prep<128>::bytes : (size_t)Prep<64>::bytes;
    /* Splitting a head's value rows over a cluster of two blocks (sm_90 code) halves a block's
     * work: worth it when the items then take fewer half-length waves of one block an SM. */
    const uint64_t items = a->n_seq * a->Hv, sms = d->sm_count > 0 ? (uint64_t)d->sm_count : 1;
    const bool sm90 = d->pdl || d->bulk; /* either is set only where the device runs sm_90 code */
    *split = sm90 && (2 * items + sms - 1) / sms < 2 * ((items + sms - 1) / sms) ? 2 : 1;
    if (prep > optin || seq_smem_of((int)a->dk, *split, 1) > optin)
        *split = 1;
    if (prep > optin || seq_smem_of((int)a->dk, *split, 1) > optin)
        return false;
    *stages = seq_smem_of((int)a->dk, *split, 2) <= optin ? 2 : 1;
    return true;
}

cudaError_t lmk_cuda_gdn_chunk_launch(const lmk_gdn_args *a, const lmk_cuda_device *d, cudaStream_t cs, int stages,
                                      int split)
{
    const lmk_gdn_chunk_layout l = lmk_gdn_chunk_plan(a->T, a->n_seq, a->Hk, a->Hv, a->dk, a->dv);
    unsigned char *base = (unsigned char *)(((uintptr_t)a->workspace + 255) & ~(uintptr_t)255);
    ChunkParams p = {};
    p.q = static_cast<const unsigned char *>(a->q), p.k = static_cast<const unsigned char *>(a->k);
    p.v = static_cast<const unsigned char *>(a->v), p.out = static_cast<unsigned char *>(a->out);
    p.a = a->a, p.b = a->b, p.A_log = a->A_log, p.dt_bias = a->dt_bias, p.z = a->z, p.norm_w = a->norm_w;
    p.cu_seqlens = a->cu_seqlens, p.slots = a->slots;
    p.state = static_cast<unsigned char *>(a->state);
    p.seq_first = reinterpret_cast<int32_t *>(base + l.off_seq_first);
    p.chunk_seq = reinterpret_cast<int32_t *>(base + l.off_chunk_seq);
    p.records = base + l.off_records, p.qk = base + l.off_qk;
    p.T = a->T, p.n_seq = a->n_seq, p.n_slots = a->state ? a->n_slots : 0, p.n_chunks = l.n_chunks;
    p.record_bytes = l.record_bytes, p.qk_bytes = l.qk_bytes;
    p.q_tok = a->q_tok, p.q_head = a->q_head, p.k_tok = a->k_tok, p.k_head = a->k_head;
    p.v_tok = a->v_tok, p.v_head = a->v_head, p.o_tok = a->o_tok, p.o_head = a->o_head;
    p.a_tok = a->a_tok, p.b_tok = a->b_tok, p.z_tok = a->z_tok, p.z_head = a->z_head;
    p.s_slot = a->s_slot, p.s_head = a->s_head, p.s_k = a->s_k, p.s_v = a->s_v;
    p.Hk = (uint32_t)a->Hk, p.Hv = (uint32_t)a->Hv, p.group = (uint32_t)(a->Hv / a->Hk);
    p.a_dt = a->a_dtype, p.b_dt = a->b_dtype, p.A_dt = a->A_dtype, p.dt_dt = a->dt_dtype;
    p.z_dt = a->z_dtype, p.nw_dt = a->nw_dtype, p.cu_is64 = a->cu_is64, p.slots_is64 = a->slots_is64;
    p.scale = a->scale, p.eps = a->eps, p.weight_offset = a->weight_offset;
    p.block_map = a->head_map == LMK_REPEAT_BLOCK;
    p.has_gates = a->A_log != nullptr, p.has_z = a->z != nullptr, p.st_bf16 = a->state_dtype == LMK_BF16;
    p.stages = stages;
    const unsigned sms = d->sm_count > 0 ? (unsigned)d->sm_count : 1u;
    if (a->dtype == LMK_BF16)
        return a->dk == 128 ? launch_d<LMK_BF16, 128>(p, cs, d->pdl, sms, split)
                            : launch_d<LMK_BF16, 64>(p, cs, d->pdl, sms, split);
    return a->dk == 128 ? launch_d<LMK_F16, 128>(p, cs, d->pdl, sms, split)
                        : launch_d<LMK_F16, 64>(p, cs, d->pdl, sms, split);
}

cudaError_t lmk_cuda_gdn_chunk_preload(size_t smem_optin)
{
    cudaError_t first = cudaSuccess;
    lmk_cuda_preload(gdn_chunk_plan_kernel, 0, &first);
    preload_d<LMK_BF16, 128>(smem_optin, &first);
    preload_d<LMK_BF16, 64>(smem_optin, &first);
    preload_d<LMK_F16, 128>(smem_optin, &first);
    preload_d<LMK_F16, 64>(smem_optin, &first);
    return first;
}
