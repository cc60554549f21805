/*
 * cuda.cu - the CUDA kernel of gated_delta_rule (lmk.h, "gated_delta_rule") and its launch
 * planning: the gates, the q/k L2 norms, the delta-rule recurrence over a [dk, dv] f32 state and
 * the gated RMSNorm of the output, token by token, for sequences packed along T, each from its row
 * of the state pool (f32 or bf16, any strides) or zeros, in one kernel.
 *
 * Prompts given a workspace run the chunked form instead, where it takes the call (cuda_chunk.cu,
 * lmk_cuda_gdn_chunk_takes): this kernel is every other call's.
 *
 * Work. A block owns one (sequence, value head) item and walks the sequence's tokens in order
 * (grid-stride over items: n_seq * Hv, any count). The recurrence is independent per column j of
 * the state (kv_j = sum_i S_ij kn_i, u_j = beta (v_j - kv_j), S_:j += kn u_j, o_j = sum_i S_ij
 * qn_i); only the output norm couples the columns of a row, so the block owns whole rows: every
 * column of the head. Thread (part p, column j) holds rows p*NR .. p*NR + NR - 1 of column j
 * (P = 1, 2 or 4 parts for dk up to 64, 128, 256; NR <= 64 rows), the P threads of a column are
 * lanes JW = 32/P apart in one warp, so kv_j and o_j are a thread's NR-row dot product plus a
 * fixed xor-shuffle tree over the P parts (commutative pairs: every part gets the same bits).
 * The state is read once at the sequence start into registers (widened from bf16) and written
 * once at its end (rounded once to bf16 for a bf16 pool), only by the sequence that stores its
 * row. gdn_kernel<NREG = 64> (at most kSmallThreads threads) keeps every row in registers: dk =
 * dv = 128 is 256 threads of 64 state floats. Where that would take more than kSmallThreads
 * threads (dk > 128 and dv > 128), gdn_kernel<NREG = 32> keeps 32 rows in registers and the rest
 * (up to 32) in dynamic shared memory, at up to 1024 threads: 256 x 256 fits (128 KB of shared
 * memory); a GPU whose blocks get less is told UNSUPPORTED.
 * Rows past dk (a part's rows when P does not divide dk, all rows past NR in NREG) are 0 in
 * registers and in the staged q/k, so they add nothing and are never loaded or stored. The state
 * is a quarter of an SM's registers at 128 x 128 and gdn_kernel<64> is capped at 128 registers a
 * thread, so two such blocks share an SM: one loads its state while the other computes.
 * Loads: a warp reads P runs of JW consecutive columns of one row (dv-fastest layouts coalesce);
 * with dk-fastest rows (s_k = 1, aligned) a thread reads its column's rows 16 bytes at a time.
 *
 * A token: the block stages q[t, kh] and k[t, kh] (raw, f32) in shared memory, each thread a few
 * elements, with per-warp sums of squares; thread 0 computes the gates (decay = exp(g), beta) into
 * shared memory; one barrier. Then every thread forms the L2 norms from the warp sums (fixed
 * order), kv = decay * |k|^-1 * sum_i S_i k_i, u = beta * (v - kv), S_i = decay * S_i + k_i * u / |k|,
 * o = (sum_i S_i q_i) * scale / |q| (the formulas of lmk.h with the norms factored out of the
 * sums), and with z the row's sum of o^2 through per-warp sums and a second barrier, then
 * out = o / sqrt(mean(o^2) + eps) * (w + offset) * silu(z). Shared buffers alternate by token
 * parity, so a buffer is rewritten only after the next token's barrier, which every reader of it
 * has passed. The next token's inputs are loaded while the current one is computed.
 * Precision: f32 throughout, nothing rounded to a 16-bit type between the gates, the recurrence
 * and the norm; expf/log1pf for the gates, softplus(x) = max(x, 0) + log1pf(expf(-|x|)) (no
 * overflow), 1/sqrtf for the norms. Deterministic: every sum has a fixed order, no atomics.
 *
 * Sequences and slots are device data: lmk_seq_bounds and lmk_seq_slot (varlen.h) clamp them. A
 * row is stored only by the last sequence naming it (lmk_block_seq_stores: lmk_seq_stores with the scan
 * of later slots shared by the block), from the row read at that sequence's start; an empty
 * sequence reads and writes nothing. Everything a launch needs travels by value in GdnParams (no
 * allocation, no copy, no sync), so a call can be captured into a CUDA graph; launches use
 * programmatic dependent launch where the device has it (pdl_enter before the first global
 * access).
 */
#include "cuda/cuda_internal.h"
#include "cuda/kernel_common.cuh"
#include "ops/gated_delta_rule/gated_delta_rule.h"
#include "ops/varlen.h"

#include <math.h>
#include <stdint.h>

namespace {

constexpr uint32_t kQKPer = 4;        /* most q/k elements a thread stages a token (blocks have >= 2*dk/4 threads) */
constexpr uint32_t kMaxParts = 4;     /* P: dk <= 256 in parts of at most 64 rows */
constexpr uint32_t kPartPitch = 68;   /* floats between parts of a staged q or k: 64 rows + 4, so a
                                         part starts 16-byte aligned and the parts' rows r fall
                                         in distinct banks */
constexpr uint32_t kMaxWarps = 32;
constexpr uint32_t kSmallThreads = 512; /* gdn_kernel<64>: at most 128 registers a thread */
constexpr uint32_t kBigThreads = 1024;  /* gdn_kernel<32>: at most 64 */
constexpr uint64_t kGridCap = 1u << 30;
constexpr float kEpsL2 = 1e-6f;         /* lmk.h: the L2 norm's epsilon */

struct GdnParams {
    const unsigned char *q, *k, *v;
    unsigned char *out;
    const void *a, *b, *A_log, *dt_bias, *z, *norm_w;
    const void *cu_seqlens, *slots;
    unsigned char *state;
    uint64_t T, n_seq, n_slots, n_items;
    uint64_t q_tok, q_head, k_tok, k_head, v_tok, v_head, o_tok, o_head; /* elements */
    uint64_t a_tok, b_tok, z_tok, z_head;
    uint64_t s_slot, s_head, s_k, s_v; /* the state's strides, elements */
    uint32_t Hk, Hv, group, dk, dv;    /* group = Hv / Hk */
    uint32_t nr_part, jw;              /* NR rows a part, JW columns a warp (32 / P) */
    int a_dt, b_dt, A_dt, dt_dt, z_dt, nw_dt, cu_is64, slots_is64;
    float scale, eps, weight_offset;
    bool block_map, l2norm, has_gates, has_z;
    bool st_bf16;
    bool st_rows_vec; /* s_k == 1, every part whole and 16-byte aligned: rows load 16 bytes at a time */
};

struct GdnShared {
    float qk[2][2][kMaxParts * kPartPitch]; /* [parity][q, k][part * kPartPitch + row]; rows past dk 0 */
    float ss[2][kMaxWarps][2];              /* [parity][warp]: sums of q^2, k^2 */
    float oo[2][kMaxWarps];                 /* [parity][warp]: sums of o^2 */
    float gate[2][2];                       /* [parity]: decay, beta */
};

/* The q/k elements a thread of gdn_kernel<NREG> stages a token: <32> runs only with more than
 * kSmallThreads threads, so 2 * dk <= 512 elements take one each. */
template <int NREG> constexpr uint32_t kStaged = NREG == 64 ? kQKPer : 1;

/* A thread's place: its part and column, its part's rows, and the q/k elements it stages (code:
 * bit 31 present, bit 30 k, bits 8..17 the position in GdnShared.qk[parity], bits 0..7 the
 * element). */
template <uint32_t QK> struct LaneInfo {
    uint32_t part, j, nr, lane, warp;
    bool col; /* j < dv */
    uint32_t code[QK];
};

/* A token's inputs as one thread uses them, widened. */
template <uint32_t QK> struct TokIn {
    float qk[QK];
    float v, z, a, b;
};

template <int DT> __device__ __forceinline__ float ld_elem(const unsigned char *base, uint64_t i)
{
    if constexpr (Elem<DT>::size == 4)
        return Elem<DT>::widen(reinterpret_cast<const uint32_t *>(base)[i]);
    else
        return Elem<DT>::widen(reinterpret_cast<const unsigned short *>(base)[i]);
}

template <int DT> __device__ __forceinline__ void st_elem(unsigned char *p, float f)
{
    if constexpr (Elem<DT>::size == 4)
        *reinterpret_cast<float *>(p) = f;
    else
        *reinterpret_cast<unsigned short *>(p) = (unsigned short)Elem<DT>::narrow(f);
}

__device__ __forceinline__ float warp_sum(float x)
{
#pragma unroll
    for (uint32_t m = 16; m > 0; m >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, m);
    return x;
}

/* The sum over the P parts of a column (lanes jw apart): every part gets the same bits. */
__device__ __forceinline__ float part_sum(float x, uint32_t jw)
{
    for (uint32_t m = jw; m < 32; m <<= 1)
        x += __shfl_xor_sync(0xffffffffu, x, m);
    return x;
}

template <uint32_t QK> __device__ LaneInfo<QK> lane_of(const GdnParams &p)
{
    LaneInfo<QK> ln;
    const uint32_t tid = threadIdx.x;
    ln.lane = tid & 31u, ln.warp = tid >> 5;
    ln.part = ln.lane / p.jw;
    ln.j = ln.warp * p.jw + ln.lane % p.jw;
    ln.col = ln.j < p.dv;
    const uint32_t first = ln.part * p.nr_part;
    ln.nr = p.dk > first ? min(p.nr_part, p.dk - first) : 0;
#pragma unroll
    for (uint32_t m = 0; m < QK; m++) {
        const uint32_t e = tid + m * blockDim.x;
        ln.code[m] = 0;
        if (e < 2 * p.dk) {
            const uint32_t which = e >= p.dk, i = e - which * p.dk;
            const uint32_t pos = which * kMaxParts * kPartPitch + i / p.nr_part * kPartPitch + i % p.nr_part;
            ln.code[m] = 1u << 31 | which << 30 | pos << 8 | i;
        }
    }
    return ln;
}

/* Token t's inputs: the q/k elements this thread stages, v and z of its column, a and b (thread 0,
 * which computes the gates). */
template <int DT, uint32_t QK>
__device__ __forceinline__ TokIn<QK> load_tok(const GdnParams &p, const LaneInfo<QK> &ln, uint64_t t, uint32_t kh,
                                              uint32_t h)
{
    constexpr int ES = Elem<DT>::size;
    TokIn<QK> in;
    const unsigned char *qrow = p.q + (t * p.q_tok + kh * p.q_head) * ES;
    const unsigned char *krow = p.k + (t * p.k_tok + kh * p.k_head) * ES;
#pragma unroll
    for (uint32_t m = 0; m < QK; m++) {
        const uint32_t c = ln.code[m];
        in.qk[m] = c >> 31 ? ld_elem<DT>((c >> 30) & 1u ? krow : qrow, c & 0xffu) : 0.0f;
    }
    in.v = ln.col ? ld_elem<DT>(p.v, t * p.v_tok + h * p.v_head + ln.j) : 0.0f;
    in.z = ln.col && p.has_z ? ld_f32(p.z, p.z_dt, t * p.z_tok + h * p.z_head + ln.j) : 0.0f;
    in.a = in.b = 0.0f;
    if (threadIdx.x == 0) {
        in.a = ld_f32(p.a, p.a_dt, t * p.a_tok + h);
        in.b = ld_f32(p.b, p.b_dt, t * p.b_tok + h);
    }
    return in;
}

/* The first element of this thread's rows of (row, head h, column j) in the state pool. */
template <uint32_t QK>
__device__ __forceinline__ unsigned char *state_ptr(const GdnParams &p, int64_t row, uint32_t h, const LaneInfo<QK> &ln)
{
    const uint64_t es = p.st_bf16 ? 2 : 4;
    return p.state + ((uint64_t)row * p.s_slot + h * p.s_head + ln.j * p.s_v + (uint64_t)ln.part * p.nr_part * p.s_k) * es;
}

/* This thread's rows of the state, widened: NREG in registers (0 past nr), rows NREG .. nr - 1 in
 * shared memory (over[(r - NREG) * nt]). */
template <int NREG>
__device__ void load_state(const GdnParams &p, const unsigned char *sb, uint32_t nr, float (&S)[NREG], float *over,
                           uint32_t nt)
{
    const uint64_t sk = p.s_k;
    if (p.st_bf16) {
        if (p.st_rows_vec) {
#pragma unroll
            for (int r = 0; r < NREG; r += 8) {
                uint4 u = make_uint4(0, 0, 0, 0);
                if ((uint32_t)r < nr)
                    u = *reinterpret_cast<const uint4 *>(sb + r * 2);
                const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
                for (int e = 0; e < 8; e++)
                    S[r + e] = Elem<LMK_BF16>::widen((w[e >> 1] >> (16 * (e & 1))) & 0xffffu);
            }
        } else {
#pragma unroll
            for (int r = 0; r < NREG; r++)
                S[r] = (uint32_t)r < nr ? ld_elem<LMK_BF16>(sb, r * sk) : 0.0f;
        }
        for (uint32_t r = NREG; r < nr; r++)
            over[(r - NREG) * nt] = ld_elem<LMK_BF16>(sb, r * sk);
    } else {
        if (p.st_rows_vec) {
#pragma unroll
            for (int r = 0; r < NREG; r += 4) {
                float4 f = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if ((uint32_t)r < nr)
                    f = *reinterpret_cast<const float4 *>(sb + r * 4);
                S[r] = f.x, S[r + 1] = f.y, S[r + 2] = f.z, S[r + 3] = f.w;
            }
        } else {
#pragma unroll
            for (int r = 0; r < NREG; r++)
                S[r] = (uint32_t)r < nr ? ld_elem<LMK_F32>(sb, r * sk) : 0.0f;
        }
        for (uint32_t r = NREG; r < nr; r++)
            over[(r - NREG) * nt] = ld_elem<LMK_F32>(sb, r * sk);
    }
}

/* The rows back to the pool, rounded once for a bf16 pool. */
template <int NREG>
__device__ void store_state(const GdnParams &p, unsigned char *sb, uint32_t nr, const float (&S)[NREG],
                            const float *over, uint32_t nt)
{
    const uint64_t sk = p.s_k;
    if (p.st_bf16) {
        if (p.st_rows_vec) {
#pragma unroll
            for (int r = 0; r < NREG; r += 8)
                if ((uint32_t)r < nr) {
                    uint32_t w[4];
#pragma unroll
                    for (int e = 0; e < 8; e += 2)
                        w[e >> 1] = Elem<LMK_BF16>::narrow(S[r + e]) | Elem<LMK_BF16>::narrow(S[r + e + 1]) << 16;
                    *reinterpret_cast<uint4 *>(sb + r * 2) = make_uint4(w[0], w[1], w[2], w[3]);
                }
        } else {
#pragma unroll
            for (int r = 0; r < NREG; r++)
                if ((uint32_t)r < nr)
                    st_elem<LMK_BF16>(sb + r * sk * 2, S[r]);
        }
        for (uint32_t r = NREG; r < nr; r++)
            st_elem<LMK_BF16>(sb + r * sk * 2, over[(r - NREG) * nt]);
    } else {
        if (p.st_rows_vec) {
#pragma unroll
            for (int r = 0; r < NREG; r += 4)
                if ((uint32_t)r < nr)
                    *reinterpret_cast<float4 *>(sb + r * 4) = make_float4(S[r], S[r + 1], S[r + 2], S[r + 3]);
        } else {
#pragma unroll
            for (int r = 0; r < NREG; r++)
                if ((uint32_t)r < nr)
                    st_elem<LMK_F32>(sb + r * sk * 4, S[r]);
        }
        for (uint32_t r = NREG; r < nr; r++)
            st_elem<LMK_F32>(sb + r * sk * 4, over[(r - NREG) * nt]);
    }
}

/* Phase 1 of a token: q and k to shared memory with the per-warp sums of squares, the gates
 * (thread 0), then the barrier after which every thread reads them. */
template <uint32_t QK>
__device__ __forceinline__ void stage_token(const GdnParams &p, GdnShared &sh, const LaneInfo<QK> &ln,
                                            const TokIn<QK> &in, uint32_t par, float A_neg, float dt_bias)
{
    float sq = 0.0f, sk = 0.0f;
    float *buf = &sh.qk[par][0][0];
#pragma unroll
    for (uint32_t m = 0; m < QK; m++) {
        const uint32_t c = ln.code[m];
        if (c >> 31) {
            const float x = in.qk[m];
            buf[(c >> 8) & 0x3ffu] = x;
            if ((c >> 30) & 1u)
                sk = fmaf(x, x, sk);
            else
                sq = fmaf(x, x, sq);
        }
    }
    sq = warp_sum(sq);
    sk = warp_sum(sk);
    if (ln.lane == 0)
        sh.ss[par][ln.warp][0] = sq, sh.ss[par][ln.warp][1] = sk;
    if (threadIdx.x == 0) {
        float g = in.a, beta = in.b;
        if (p.has_gates) {
            const float x = in.a + dt_bias;
            g = A_neg * (fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x))));
            beta = 1.0f / (1.0f + expf(-in.b));
        }
        sh.gate[par][0] = expf(g);
        sh.gate[par][1] = beta;
    }
    __syncthreads();
}

/* sum_r S_r * x_r over this thread's rows (x: a part of a staged q or k, 16-byte aligned). */
template <int NREG>
__device__ __forceinline__ float dot_rows(const float (&S)[NREG], const float *over, uint32_t nt, uint32_t nr,
                                          const float *x)
{
    float acc = 0.0f;
#pragma unroll
    for (int r = 0; r < NREG; r += 4) {
        const float4 f = *reinterpret_cast<const float4 *>(x + r);
        acc = fmaf(S[r], f.x, acc);
        acc = fmaf(S[r + 1], f.y, acc);
        acc = fmaf(S[r + 2], f.z, acc);
        acc = fmaf(S[r + 3], f.w, acc);
    }
    for (uint32_t r = NREG; r < nr; r++)
        acc = fmaf(over[(r - NREG) * nt], x[r], acc);
    return acc;
}

/* S_r = decay * S_r + k_r * uk for this thread's rows, returning sum_r S_r * q_r of the new S. */
template <int NREG>
__device__ __forceinline__ float update_rows(float (&S)[NREG], float *over, uint32_t nt, uint32_t nr, const float *kr,
                                             const float *qr, float decay, float uk)
{
    float acc = 0.0f;
#pragma unroll
    for (int r = 0; r < NREG; r += 4) {
        const float4 kf = *reinterpret_cast<const float4 *>(kr + r);
        const float4 qf = *reinterpret_cast<const float4 *>(qr + r);
        S[r] = fmaf(S[r], decay, kf.x * uk);
        S[r + 1] = fmaf(S[r + 1], decay, kf.y * uk);
        S[r + 2] = fmaf(S[r + 2], decay, kf.z * uk);
        S[r + 3] = fmaf(S[r + 3], decay, kf.w * uk);
        acc = fmaf(S[r], qf.x, acc);
        acc = fmaf(S[r + 1], qf.y, acc);
        acc = fmaf(S[r + 2], qf.z, acc);
        acc = fmaf(S[r + 3], qf.w, acc);
    }
    for (uint32_t r = NREG; r < nr; r++) {
        float *o = over + (r - NREG) * nt;
        *o = fmaf(*o, decay, kr[r] * uk);
        acc = fmaf(*o, qr[r], acc);
    }
    return acc;
}

/* Phase 2: the norms from the warp sums, kv, u, the state update and o (the same on every part). */
template <int NREG, uint32_t QK>
__device__ __forceinline__ float step_state(const GdnParams &p, const GdnShared &sh, const LaneInfo<QK> &ln,
                                            const TokIn<QK> &in, uint32_t par, float (&S)[NREG], float *over)
{
    const uint32_t nw = blockDim.x >> 5, nt = blockDim.x;
    float sq = 0.0f, sk = 0.0f;
    for (uint32_t w = 0; w < nw; w++)
        sq += sh.ss[par][w][0], sk += sh.ss[par][w][1];
    const float decay = sh.gate[par][0], beta = sh.gate[par][1];
    const float qs = p.l2norm ? p.scale / sqrtf(sq + kEpsL2) : p.scale;
    const float ks = p.l2norm ? 1.0f / sqrtf(sk + kEpsL2) : 1.0f;
    const float *qr = &sh.qk[par][0][ln.part * kPartPitch];
    const float *kr = &sh.qk[par][1][ln.part * kPartPitch];
    const float kv = part_sum(dot_rows<NREG>(S, over, nt, ln.nr, kr), p.jw) * (decay * ks);
    /* The staged values are read again by the update: reloading them (a compiler barrier, no
     * instruction) keeps the first pass's 4 * NREG/4 loads from living through the reduction. */
    asm volatile("" ::: "memory");
    const float u = beta * (in.v - kv);
    const float os = update_rows<NREG>(S, over, nt, ln.nr, kr, qr, decay, u * ks);
    return part_sum(os, p.jw) * qs;
}

/* Phase 3: the gated RMSNorm over the row (z given: a barrier for the row's sum of o^2), and the
 * store by part 0 of each column. */
template <int DT, uint32_t QK>
__device__ __forceinline__ void emit_out(const GdnParams &p, GdnShared &sh, const LaneInfo<QK> &ln,
                                         const TokIn<QK> &in, uint32_t par, float o, float nw, uint64_t t, uint32_t h)
{
    float y = o;
    if (p.has_z) {
        const float sq = warp_sum(ln.part == 0 && ln.col ? o * o : 0.0f);
        if (ln.lane == 0)
            sh.oo[par][ln.warp] = sq;
        __syncthreads();
        float ss = 0.0f;
        for (uint32_t w = 0; w < (blockDim.x >> 5); w++)
            ss += sh.oo[par][w];
        const float inv = 1.0f / sqrtf(ss / (float)p.dv + p.eps);
        y = o * inv * nw * (in.z / (1.0f + expf(-in.z)));
    }
    if (ln.part == 0 && ln.col)
        st_elem<DT>(p.out + (t * p.o_tok + h * p.o_head + ln.j) * Elem<DT>::size, y);
}

/* One (sequence, head) item: the state in, the tokens, the state out. */
template <int DT, int NREG>
__device__ void gdn_sequence(const GdnParams &p, GdnShared &sh, float *over, const LaneInfo<kStaged<NREG>> &ln,
                             uint64_t lo, uint64_t hi, uint32_t h, int64_t row, bool stores)
{
    const uint32_t kh = p.block_map ? h / p.group : h % p.Hk, nt = blockDim.x;
    unsigned char *sb = row >= 0 && ln.col ? state_ptr(p, row, h, ln) : nullptr;
    float S[NREG];
#pragma unroll
    for (int r = 0; r < NREG; r++)
        S[r] = 0.0f;
    for (uint32_t r = NREG; r < ln.nr; r++)
        over[(r - NREG) * nt] = 0.0f;
    if (sb)
        load_state<NREG>(p, sb, ln.nr, S, over, nt);
    float A_neg = 0.0f, dt_bias = 0.0f;
    if (threadIdx.x == 0 && p.has_gates) {
        A_neg = -expf(ld_f32(p.A_log, p.A_dt, h));
        dt_bias = ld_f32(p.dt_bias, p.dt_dt, h);
    }
    const float nw = p.has_z && ln.col ? ld_f32(p.norm_w, p.nw_dt, ln.j) + p.weight_offset : 0.0f;
    const uint32_t n = (uint32_t)(hi - lo); /* T < 2^32 (lmk_gdn_params.seq_len) */
    TokIn<kStaged<NREG>> cur = load_tok<DT>(p, ln, lo, kh, h), next = cur;
    for (uint32_t i = 0; i < n; i++) {
        const uint32_t par = i & 1u;
        if (i + 1 < n)
            next = load_tok<DT>(p, ln, lo + i + 1, kh, h);
        stage_token(p, sh, ln, cur, par, A_neg, dt_bias);
        const float o = step_state(p, sh, ln, cur, par, S, over);
        emit_out<DT>(p, sh, ln, cur, par, o, nw, lo + i, h);
        cur = next;
    }
    if (stores && sb)
        store_state<NREG>(p, sb, ln.nr, S, over, nt);
}

/* Block b: items b, b + gridDim, ... (item = sequence * Hv + head). Dynamic shared memory: the
 * state rows past NREG, (NR - NREG) * blockDim floats. */
template <int DT, int NREG>
__global__ void __launch_bounds__(NREG == 64 ? kSmallThreads : kBigThreads)
gdn_kernel(const __grid_constant__ GdnParams p)
{
    extern __shared__ float s_over[];
    __shared__ __align__(16) GdnShared sh;
    const uint32_t tid = threadIdx.x;
    const LaneInfo<kStaged<NREG>> ln = lane_of<kStaged<NREG>>(p);
    pdl_enter();
    for (uint32_t i = tid; i < sizeof(sh.qk) / sizeof(float); i += blockDim.x)
        (&sh.qk[0][0][0])[i] = 0.0f; /* rows past dk stay 0: they multiply state rows that are 0 */
    __syncthreads();
    for (uint64_t item = blockIdx.x; item < p.n_items; item += gridDim.x) {
        const uint64_t s = item / p.Hv;
        const uint32_t h = (uint32_t)(item - s * p.Hv);
        size_t lo, hi;
        lmk_seq_bounds(p.cu_seqlens, p.cu_is64, s, p.T, &lo, &hi);
        if (lo == hi)
            continue; /* block-uniform: an empty sequence reads and writes nothing */
        const int64_t row = p.state ? lmk_seq_slot(p.slots, p.slots_is64, s, p.n_slots) : -1;
        const bool stores = row >= 0 && lmk_block_seq_stores(p.slots, p.slots_is64, s, p.n_seq, row);
        gdn_sequence<DT, NREG>(p, sh, s_over + tid, ln, lo, hi, h, row, stores);
        __syncthreads(); /* the next item rewrites the parity-0 buffers */
    }
}

/* ---------------------------------------------------------------------------------------------
 * Planning and launch (host).
 * ------------------------------------------------------------------------------------------- */

struct GdnPlan {
    unsigned blocks, threads;
    int nreg;    /* 64 or 32: the kernel */
    size_t smem; /* dynamic */
};

/* Whether a thread's rows load 16 bytes at a time: dk-fastest (s_k == 1), every part exactly NR
 * rows, NR a whole number of 16-byte units, and every offset a multiple of 16. */
bool plan_rows_vec(const lmk_gdn_args *a, uint32_t parts, uint32_t nr)
{
    const uint64_t es = a->state_dtype == LMK_BF16 ? 2 : 4;
    if (!a->state || a->s_k != 1 || a->dk % parts != 0 || (nr * es) % 16 != 0)
        return false;
    uint64_t bits = (uintptr_t)a->state;
    if (a->n_slots > 1)
        bits |= a->s_slot * es;
    if (a->Hv > 1)
        bits |= a->s_head * es;
    if (a->dv > 1)
        bits |= a->s_v * es;
    return bits % 16 == 0;
}

void plan(const lmk_gdn_args *a, GdnParams *p, GdnPlan *L)
{
    *p = GdnParams{};
    p->q = static_cast<const unsigned char *>(a->q), p->k = static_cast<const unsigned char *>(a->k);
    p->v = static_cast<const unsigned char *>(a->v), p->out = static_cast<unsigned char *>(a->out);
    p->a = a->a, p->b = a->b, p->A_log = a->A_log, p->dt_bias = a->dt_bias, p->z = a->z, p->norm_w = a->norm_w;
    p->cu_seqlens = a->cu_seqlens, p->slots = a->slots;
    p->state = static_cast<unsigned char *>(a->state);
    p->T = a->T, p->n_seq = a->n_seq, p->n_slots = a->state ? a->n_slots : 0;
    p->n_items = a->n_seq * a->Hv;
    p->q_tok = a->q_tok, p->q_head = a->q_head, p->k_tok = a->k_tok, p->k_head = a->k_head;
    p->v_tok = a->v_tok, p->v_head = a->v_head, p->o_tok = a->o_tok, p->o_head = a->o_head;
    p->a_tok = a->a_tok, p->b_tok = a->b_tok, p->z_tok = a->z_tok, p->z_head = a->z_head;
    p->s_slot = a->s_slot, p->s_head = a->s_head, p->s_k = a->s_k, p->s_v = a->s_v;
    p->Hk = (uint32_t)a->Hk, p->Hv = (uint32_t)a->Hv, p->group = (uint32_t)(a->Hv / a->Hk);
    p->dk = (uint32_t)a->dk, p->dv = (uint32_t)a->dv;
    p->a_dt = a->a_dtype, p->b_dt = a->b_dtype, p->A_dt = a->A_dtype, p->dt_dt = a->dt_dtype;
    p->z_dt = a->z_dtype, p->nw_dt = a->nw_dtype;
    p->cu_is64 = a->cu_is64, p->slots_is64 = a->slots_is64;
    p->scale = a->scale, p->eps = a->eps, p->weight_offset = a->weight_offset;
    p->block_map = a->head_map == LMK_REPEAT_BLOCK;
    p->l2norm = a->l2norm;
    p->has_gates = a->A_log != nullptr;
    p->has_z = a->z != nullptr;
    p->st_bf16 = a->state_dtype == LMK_BF16;
    const uint32_t parts = a->dk <= 64 ? 1 : a->dk <= 128 ? 2 : 4;
    const uint32_t nr = (uint32_t)((a->dk + parts - 1) / parts), jw = 32 / parts;
    p->nr_part = nr, p->jw = jw;
    p->st_rows_vec = plan_rows_vec(a, parts, nr);
    uint64_t threads = (a->dv + jw - 1) / jw * 32;
    const uint64_t staging = (2 * a->dk + kQKPer - 1) / kQKPer;
    const uint64_t staging_threads = (staging + 31) / 32 * 32;
    threads = threads > staging_threads ? threads : staging_threads;
    L->nreg = threads <= kSmallThreads ? 64 : 32;
    L->threads = (unsigned)threads;
    L->smem = nr > (uint32_t)L->nreg ? (size_t)(nr - L->nreg) * threads * sizeof(float) : 0;
    L->blocks = (unsigned)(p->n_items < kGridCap ? p->n_items : kGridCap);
}

template <int DT> cudaError_t launch_dt(const GdnParams &p, const GdnPlan &L, cudaStream_t st, bool pdl)
{
    const dim3 blocks(L.blocks, 1, 1), threads(L.threads, 1, 1);
    if (L.nreg == 64)
        return lmk_cuda_start(gdn_kernel<DT, 64>, p, blocks, threads, L.smem, st, pdl);
    return lmk_cuda_start(gdn_kernel<DT, 32>, p, blocks, threads, L.smem, st, pdl);
}

/* gdn_kernel<32> may use all the dynamic shared memory a block can have beside its static
 * GdnShared, set once per device here. */
template <int DT> void preload_dt(size_t dyn_max, cudaError_t *first)
{
    lmk_cuda_preload(gdn_kernel<DT, 64>, 0, first);
    lmk_cuda_preload(gdn_kernel<DT, 32>, dyn_max, first);
}

} /* namespace */

lmk_status lmk_cuda_gated_delta_rule(lmk_stream *s, const void *args)
{
    const lmk_gdn_args *a = (const lmk_gdn_args *)args;
    const lmk_cuda_device *d = lmk_cuda_dev(s->dev);
    lmk_status st = lmk_cuda_use(d->ordinal, "gated_delta_rule: cudaSetDevice");
    if (st != LMK_OK)
        return st;
    GdnParams p;
    GdnPlan L;
    plan(a, &p, &L);
    if (L.smem + sizeof(GdnShared) > (size_t)d->smem_optin)
        return lmk_fail(LMK_ERR_UNSUPPORTED,
                        "gated_delta_rule: k_dim %zu x v_dim %zu needs %zu bytes of shared memory a block, "
                        "this GPU gives at most %d",
                        a->dk, a->dv, L.smem + sizeof(GdnShared), d->smem_optin);
    const cudaStream_t cs = lmk_cuda_stream_of(s);
    int stages = 0, split = 0;
    if (lmk_cuda_gdn_chunk_takes(a, d, &stages, &split)) {
        const cudaError_t ec = lmk_cuda_gdn_chunk_launch(a, d, cs, stages, split);
        return ec == cudaSuccess ? LMK_OK : lmk_cuda_fail(ec, "gated_delta_rule: chunked kernel launch");
    }
    cudaError_t e;
    switch (a->dtype) {
    case LMK_F32: e = launch_dt<LMK_F32>(p, L, cs, d->pdl); break;
    case LMK_BF16: e = launch_dt<LMK_BF16>(p, L, cs, d->pdl); break;
    default: e = launch_dt<LMK_F16>(p, L, cs, d->pdl); break;
    }
    return e == cudaSuccess ? LMK_OK : lmk_cuda_fail(e, "gated_delta_rule: kernel launch");
}

cudaError_t lmk_cuda_gated_delta_rule_preload(void)
{
    int dev = 0, optin = 0;
    cudaError_t first = cudaGetDevice(&dev);
    if (first == cudaSuccess)
        first = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (first != cudaSuccess)
        return first;
    const size_t dyn_max = (size_t)optin > sizeof(GdnShared) ? (size_t)optin - sizeof(GdnShared) : 0;
    preload_dt<LMK_F32>(dyn_max, &first);
    preload_dt<LMK_BF16>(dyn_max, &first);
    preload_dt<LMK_F16>(dyn_max, &first);
    const cudaError_t chunk = lmk_cuda_gdn_chunk_preload((size_t)optin);
    return first != cudaSuccess ? first : chunk;
}
