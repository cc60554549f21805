/*
 * testkit_ref.h - the test kit's helpers around the float64 references, which take the library's
 * internal argument structs (src/ops/<op>/<op>.h). For the ops' case descriptors
 * (src/ops/<op>/case.c), the tests and the fuzzers; the `lmk` tool never includes it.
 */
#ifndef LMK_TESTKIT_REF_H
#define LMK_TESTKIT_REF_H

#include "core/internal.h"
#include "ops/rope/rope.h"
#include "testkit.h"

/* Which of the head_dim elements of a row are rotated (true) for a rope_multi pairing. */
void tst_rope_rotated_mask(const lmk_rope_multi_params *p, bool *mask);

/* Checks the outputs of a rope launch against the float64 reference: `a` holds host copies of
 * the inputs, positions and freq_factors (a->t[i].in with its strides, a->angle.positions; a->t[i].out
 * is ignored) and got[i] the output read back for tensor i, laid out with a->t[i]'s output strides.
 * Rotated elements: the precision contract (f32 within f32_tol * max(1, m), bf16/f16 one ulp plus
 * 1e-6); every other element: bit-exact copy of the input. Works in chunks of tokens. On failure
 * writes a description to msg and returns false. */
bool tst_rope_check(const lmk_rope_args *a, const void *const got[2], double f32_tol, char *msg, size_t msg_len);

/* tst_rope_check with the contract's tolerance (lmk_rope_tolerance, f32 scaled by max(1, m)),
 * reporting the largest error and its fraction of the tolerance. check_rotated false: only the
 * copied elements are compared (inputs outside the contract's domain; the rotated ones are then
 * only required to be deterministic, which the caller checks). */
bool tst_rope_verify(const lmk_rope_args *a, const void *const got[2], bool check_rotated, tst_result *res);

/* Dense host operand [n0, n1, n2] of element size es at data (for lmk_rope_args_for). */
lmk_tensor3 tst_dense3(const void *data, size_t n0, size_t n1, size_t n2, size_t es);

/* Host arguments of a dense lmk_rope_multi / lmk_rope_multi_qk call (n_t tensors: q, and k with
 * n_k_heads heads) for the reference and tst_rope_check. */
lmk_rope_args tst_rope_host_args(const lmk_rope_multi_params *p, uint32_t n_k_heads, int n_t, lmk_dtype dtype,
                                 const void *q, const void *k, const int32_t *pos);

/* The host tensor of a view of instance memory: data = its host copy (NULL without one), shape and
 * strides of the view. */
lmk_tensor3 tst_view_host3(const tst_mem *m, const lmk_buffer *view);

#endif /* LMK_TESTKIT_REF_H */
