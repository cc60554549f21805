/*
 * rope.h - the arguments a rope launch hands to a backend (lmk_rope, lmk_rope_multi and
 * lmk_rope_multi_qk all become one lmk_rope_args), and the references over them.
 *
 * Validation (op.c) resolves every parameter default, so backends see plain values: the pair
 * layout, which position axis and exponent index each pair uses (src/ops/rope_math.h), and the angle
 * factor of each pair as a closed formula (lmk_rope_angle). A backend may tabulate per-pair values
 * wherever it likes (a table in the CPU stream's own memory, shared memory on CUDA); the formulas
 * live in src/ops/rope_math.h once.
 */
#ifndef LMK_OPS_ROPE_H
#define LMK_OPS_ROPE_H

#include "core/internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One tensor that a rope launch rotates. in == out with equal strides means in place. Strides are
 * in elements; the last axis is dense. */
typedef struct lmk_rope_tensor {
    const void *in;
    void *out;
    uint32_t n_heads;
    size_t in_tok, in_head;   /* strides of in */
    size_t out_tok, out_head; /* strides of out */
} lmk_rope_tensor;

/* How the angle of pair p is formed: theta = pos * freq(p), output scaled by mscale. All fields are
 * resolved (no zero defaults). */
typedef struct lmk_rope_angle {
    lmk_rope_mode mode;
    uint32_t sections[4];
    uint32_t n_pairs;         /* rotated pairs: rope_dim / 2 */
    double freq_base;
    double exp_n;             /* n of the exponent: rope_dim, or head_dim / 2 for VISION */
    double freq_scale;
    double ext_factor;        /* 0: no ramp */
    double ramp_low, ramp_high; /* the YaRN correction range [low, high] when ext_factor != 0 */
    double mscale;            /* m of lmk.h: applied to rotated outputs only */
    /* The resolved parameters the three values above come from (the reference recomputes them). */
    double beta_fast, beta_slow, attn_factor;
    uint32_t n_ctx_orig;
    const float *freq_factors;/* NULL, or one per rotated pair (device memory of the op's device) */
    const void *positions;    /* device memory */
    lmk_dtype pos_dtype;      /* LMK_I32, LMK_U32 (read as i32) or LMK_I64 */
    size_t pos_axis_stride;   /* seq_len for the multi modes (4 axes), 0 for NORMAL / NEOX */
} lmk_rope_angle;

typedef struct lmk_rope_args {
    lmk_dtype dtype;          /* LMK_F32, LMK_BF16 or LMK_F16 */
    uint32_t head_dim, rope_dim, seq_len;
    int interleaved;          /* NORMAL: pair p is (2p, 2p+1); else (p, p + pair_stride) */
    uint32_t pair_stride;     /* rope_dim/2, or head_dim/2 for HALF_HEAD and VISION */
    lmk_rope_angle angle;
    int n_tensors;            /* 1 (q only) or 2 (q and k) */
    lmk_rope_tensor t[2];
} lmk_rope_args;

/* The arguments of a validated call (op.c's own constructor, also used by tests and tools to run
 * the reference on host copies): p's defaults resolved, t = q_in, q_out, k_in, k_out (k only when
 * has_k). No validation. */
lmk_rope_args lmk_rope_args_for(const lmk_rope_params *p, lmk_dtype dtype, const lmk_tensor3 t[4], bool has_k,
                                const void *positions, lmk_dtype pos_dtype, const float *freq_factors);

/* lmk_rope's rules R2-R9 (dimensions, freq_base, mode, pairing, scaling) and R11-R12 (positions,
 * freq_factors), for fused ops that rotate as lmk_rope does. */
lmk_status lmk_rope_check_params(const char *op, const lmk_rope_params *p, bool has_k);
lmk_status lmk_rope_check_inputs(const char *op, const lmk_rope_params *p, const lmk_buffer *positions,
                                 const lmk_buffer *freq_factors);

/* The exact float64 results of every element of each tensor, in dense row-major order of [T, heads,
 * head_dim] (out64[i] holds tensor i's seq_len*n_heads*head_dim values; copied elements are the
 * widened inputs). Reads inputs through their strides; writes no output. Host memory. */
void lmk_ref_rope_f64(const lmk_rope_args *a, double *const out64[2]);
/* One row of token `token` rotated in float64: row = rope(x) over head_dim values (row may be x).
 * Elements outside the rotated pairs are copied. Used by references of fused ops. */
void lmk_ref_rope_row(const lmk_rope_args *a, size_t token, const double *x, double *row);
/* The same for tokens [t0, t1) only: out64[i] holds (t1-t0)*n_heads*head_dim values. */
void lmk_ref_rope_f64_tokens(const lmk_rope_args *a, size_t t0, size_t t1, double *const out64[2]);

#ifdef __cplusplus
}
#endif
#endif /* LMK_OPS_ROPE_H */
