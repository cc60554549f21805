/*
 * gated_delta_rule.h - the arguments a gated_delta_rule launch hands to a backend, and the
 * reference over them (lmk.h, "gated_delta_rule").
 */
#ifndef LMK_OPS_GATED_DELTA_RULE_H
#define LMK_OPS_GATED_DELTA_RULE_H

#include "core/internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Head dims the ops accept (lmk.h): every backend keeps a head's vectors of this size on its stack
 * or in shared memory. */
#define LMK_GDN_MAX_DIM 256

typedef struct lmk_gdn_args {
    const void *q, *k, *v;        /* [T, Hk, dk], [T, Hk, dk], [T, Hv, dv]; last axis dense */
    void *out;                    /* [T, Hv, dv] */
    lmk_dtype dtype;              /* q, k, v and out */
    size_t T, Hk, Hv, dk, dv;
    size_t q_tok, q_head, k_tok, k_head, v_tok, v_head, o_tok, o_head; /* element strides */
    const void *a, *b;            /* [T, Hv], heads dense */
    lmk_dtype a_dtype, b_dtype;
    size_t a_tok, b_tok;
    const void *A_log, *dt_bias;  /* [Hv] dense, or both NULL: a is g and b is beta */
    lmk_dtype A_dtype, dt_dtype;
    const void *z;                /* [T, Hv, dv] or NULL (no output norm) */
    lmk_dtype z_dtype;
    size_t z_tok, z_head;
    const void *norm_w;           /* [dv] dense; given exactly when z is */
    lmk_dtype nw_dtype;
    const void *cu_seqlens;       /* [n_seq + 1], or NULL: one sequence of T tokens */
    int cu_is64;
    const void *slots;            /* [n_seq], or NULL: sequence s uses row s */
    int slots_is64;
    size_t n_seq;
    void *state;                  /* [n_slots, Hv, dk, dv], or NULL */
    lmk_dtype state_dtype;        /* f32 or bf16 */
    size_t n_slots;
    size_t s_slot, s_head, s_k, s_v; /* the state's strides in elements */
    lmk_repeat_layout head_map;   /* TILED: k head h % Hk; BLOCK: h / (Hv / Hk) */
    float scale;                  /* resolved: never 0 */
    bool l2norm;
    float eps, weight_offset;     /* the gated norm, when z is given */
    void *workspace;              /* scratch of the chunked form (lmk_gdn_io.workspace), or NULL */
    size_t workspace_bytes;
} lmk_gdn_args;

/* ---- the chunked form's workspace (CUDA: cuda_chunk.cu; its size: lmk_gated_delta_rule_workspace) ----
 *
 * Chunks of LMK_GDN_CHUNK tokens aligned to each sequence's start, at most T / LMK_GDN_CHUNK + n_seq
 * of them (the sum over sequences of ceil(len / C) is below that for any valid cu_seqlens; the
 * kernels clamp a hostile array's count to it). The workspace holds, from its first 256-byte
 * aligned byte: each sequence's first chunk (n_seq + 1 i32), each chunk's sequence (i32, -1 past
 * the last), then per (chunk, value head) a record of W [C, dk] f16, U' [C, dv] f32, Mqk [C, C] f16
 * and the gates [3, C] f32, then per (chunk, key head) the normalised q and k [C, dk] f16 each. Every
 * size depends only on T, n_seq, the heads and the dims, and grows with T and n_seq. */
#define LMK_GDN_CHUNK 64

typedef struct lmk_gdn_chunk_layout {
    size_t n_chunks;           /* the bound: T / C + n_seq */
    size_t off_seq_first;      /* bytes from the aligned base */
    size_t off_chunk_seq;
    size_t off_records, record_bytes;
    size_t off_qk, qk_bytes;
    size_t total;              /* bytes a caller provides: the layout plus alignment slack */
} lmk_gdn_chunk_layout;

static inline size_t lmk_gdn_align256(size_t x)
{
    return (x + 255) & ~(size_t)255;
}

/* The layout for a call's sizes; total 0 when a size overflows. */
static inline lmk_gdn_chunk_layout lmk_gdn_chunk_plan(size_t T, size_t n_seq, size_t Hk, size_t Hv, size_t dk,
                                                      size_t dv)
{
    lmk_gdn_chunk_layout l = {0, 0, 0, 0, 0, 0, 0, 0};
    const size_t C = LMK_GDN_CHUNK;
    l.n_chunks = T / C + n_seq;
    if (l.n_chunks < T / C || l.n_chunks > ((size_t)1 << 30) || Hv > ((size_t)1 << 20) || dk > 4096 || dv > 4096)
        return l;
    l.record_bytes = C * dk * 2 + C * dv * 4 + C * C * 2 + 3 * C * 4;
    l.qk_bytes = 2 * C * dk * 2;
    l.off_seq_first = 0;
    l.off_chunk_seq = lmk_gdn_align256((n_seq + 1) * 4);
    l.off_records = l.off_chunk_seq + lmk_gdn_align256(l.n_chunks * 4);
    const double rec = (double)l.n_chunks * (double)Hv * (double)l.record_bytes;
    const double qk = (double)l.n_chunks * (double)Hk * (double)l.qk_bytes;
    if (rec + qk + (double)l.off_records > 1e18)
        return l;
    l.off_qk = l.off_records + l.n_chunks * Hv * l.record_bytes;
    l.total = l.off_qk + l.n_chunks * Hk * l.qk_bytes + 256;
    return l;
}

/* The k head value head h reads. */
static inline size_t lmk_gdn_k_head(const lmk_gdn_args *a, size_t h)
{
    return a->head_map == LMK_REPEAT_BLOCK ? h / (a->Hv / a->Hk) : h % a->Hk;
}

/* The float64 reference over host memory: out and the state rows exactly as lmk.h defines them,
 * the state carried in double and rounded once to its dtype at each sequence's end. */
void lmk_ref_gated_delta_rule(const lmk_gdn_args *a);

#ifdef __cplusplus
}
#endif

#ifdef __CUDACC__
#include <cuda_runtime_api.h>
struct lmk_cuda_device;
/* The chunked form on CUDA (cuda_chunk.cu), called by cuda.cu's launcher. takes: whether it takes
 * this call on device d (not: no workspace or too small, f32 inputs, q and k not L2-normalised,
 * dims other than dk = dv = 64 or 128, sequences averaging under a chunk, too little shared
 * memory), with the shared stages and the blocks a head's rows are split over (a cluster of 2 on
 * sm_90 code, else 1) that launch then uses. */
bool lmk_cuda_gdn_chunk_takes(const lmk_gdn_args *a, const struct lmk_cuda_device *d, int *stages, int *split);
cudaError_t lmk_cuda_gdn_chunk_launch(const lmk_gdn_args *a, const struct lmk_cuda_device *d, cudaStream_t cs,
                                      int stages, int split);
cudaError_t lmk_cuda_gdn_chunk_preload(size_t smem_optin);
#endif
#endif /* LMK_OPS_GATED_DELTA_RULE_H */
