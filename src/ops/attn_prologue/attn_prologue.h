/*
 * attn_prologue.h - the arguments an attention-prologue launch hands to a backend, and the
 * reference over them.
 *
 * The rope part is an lmk_rope_args (q in t[0], k in t[1]) resolved by the same code as lmk_rope,
 * so the prologue rotates exactly as lmk_rope does. Around it: the per-head RMSNorm of q and k, the
 * k output (optional: k may go only to the cache), and the KV-cache rows written through slots, in
 * the input dtype or FP8 E4M3 with a per-tensor scale. An f8 cache stores
 * lmk_f32_to_f8e4m3(x * inv) (lmk.h), inv = 1 / scale formed once per call on the host
 * (lmk_attn_prologue_inv_scale, by prepare), so every backend and the reference multiply by the
 * same f32 value.
 */
#ifndef LMK_OPS_ATTN_PROLOGUE_H
#define LMK_OPS_ATTN_PROLOGUE_H

#include "ops/rope/rope.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A [rows, heads, dim] tensor in device memory: element (r, h, i) at data + (r*tok + h*head + i). */
typedef struct lmk_rows {
    void *data;             /* NULL when absent */
    size_t tok, head;       /* element strides; the last axis is dense */
    lmk_dtype dtype;
} lmk_rows;

typedef struct lmk_attn_prologue_args {
    /* q: rope.t[0] (in -> out). k: rope.t[1].in, and rope.t[1].out = k_out or NULL (k goes only to
     * the cache); rope.n_tensors is 2. rope.dtype is the dtype of q, k and v. */
    lmk_rope_args rope;
    const void *q_norm_w, *k_norm_w; /* [head_dim] or NULL: no norm on that tensor */
    lmk_dtype q_norm_dtype, k_norm_dtype;
    double eps, weight_offset;
    lmk_rows v_in;          /* [T, n_k_heads, v_dim]; data NULL without v */
    uint32_t v_dim;         /* Dv; validation rejects a Dv past 32 bits */
    const void *slots;      /* [T] cache rows; NULL without caches */
    lmk_dtype slot_dtype;   /* LMK_I32 or LMK_I64 */
    lmk_rows k_cache, v_cache; /* [n_slots, n_k_heads, D or v_dim]; data NULL when absent */
    uint64_t k_slots, v_slots; /* rows of each cache: a slot outside [0, rows) writes nothing */
    float k_inv_scale, v_inv_scale; /* lmk_attn_prologue_inv_scale of k_scale, v_scale: f8 caches store
                                     * lmk_f32_to_f8e4m3(x * inv); unused for other cache dtypes */
} lmk_attn_prologue_args;

/* Validates a call as lmk_attn_prologue does for a stream of `dev` and fills *out (op.c). Tests
 * and tools use it on host copies (buffers of a CPU device) to run the reference on exactly the
 * arguments a backend receives. */
lmk_status lmk_attn_prologue_prepare(const lmk_device *dev, const lmk_attn_prologue_io *io,
                                     const lmk_rope_params *rope, const lmk_rms_norm_params *norm,
                                     lmk_attn_prologue_args *out);

/* lmk.h's f8 factor of a k_scale or v_scale as the call passes it (0 meaning 1): the f32 nearest
 * 1 / scale, 1.0f / scale rounded to nearest, in whatever rounding mode the caller runs. Validation
 * keeps a nonzero scale in [2^-126, 2^126], where the result is a normal f32 and x * inv is within
 * one f32 ulp of x / scale. */
float lmk_attn_prologue_inv_scale(float scale);

/* The float64 chain for one token of every head, the executable spec: q_row64 gets n_heads rows of
 * head_dim (rope(norm(q))), k_row64 n_k_heads rows (rope(norm(k))). Reads inputs through their
 * strides (host memory). */
void lmk_ref_attn_prologue_token(const lmk_attn_prologue_args *a, size_t token, double *q_row64, double *k_row64);
/* The whole op on host memory: writes q_out, k_out and the cache rows exactly as the op must
 * (stored values rounded from the float64 results). */
void lmk_ref_attn_prologue(const lmk_attn_prologue_args *a);

#ifdef __cplusplus
}
#endif
#endif /* LMK_OPS_ATTN_PROLOGUE_H */
