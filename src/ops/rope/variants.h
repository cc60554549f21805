/*
 * variants.h - the kernel variants of rope's CUDA backend (src/ops/rope/cuda.cu), one X-macro row
 * each: the planner (for_each_launch) returns a row's id per launch, the launcher and the preload
 * instantiate each row's kernel, tests/test_cuda_routing.c checks the row each model shape takes,
 * and `lmk bench --variant NAME` times a call forced onto one row (lmk_cuda_rope_force).
 *
 *   X(id, name, kernel, copy, maps, reason, bench)
 *
 *   kernel  LMK_ROPE_K_DECODE rope_decode_kernel<DT, VE, IL, COPY>
 *           LMK_ROPE_K_ROWS   rope_rows_kernel<DT, VE, IL>        (launches with copy items)
 *           LMK_ROPE_K_PAIRS  rope_pairs_kernel<DT, VE, IL>       (launches without)
 *           LMK_ROPE_K_BULK   rope_bulk_kernel<DT, IL, MAPS ? BulkParams : RopeParams> (16-byte units)
 *   copy    the decode kernel's copy items compiled in (a tensor out of place with untouched
 *           elements); maps: the bulk kernel's parameters carry tensor maps (a side moved by bulk
 *           tensor copies: q inside [q | gate] or a packed QKV)
 *   reason  why the row exists; bench: the `lmk bench --op rope` case that keeps it (its T, dtype
 *           and the fragments of its name).
 *
 * DT (f32, bf16, f16), the unit width VE (16, 8, 4, 2 bytes or one element: what the shape's
 * alignment allows, plan_units) and IL (interleaved pairs whole in a unit) are the call's, not the
 * row's: every row but the bulk ones is instantiated for each. C and C++.
 */
#ifndef LMK_ROPE_VARIANTS_H
#define LMK_ROPE_VARIANTS_H

#include "lmk.h"

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The kernels a row names. */
typedef enum lmk_rope_kernel { LMK_ROPE_K_DECODE, LMK_ROPE_K_ROWS, LMK_ROPE_K_PAIRS, LMK_ROPE_K_BULK } lmk_rope_kernel;

#define LMK_ROPE_VARIANTS(X)                                                                                          \
    X(LMK_ROPE_DECODE, "rope_decode", LMK_ROPE_K_DECODE, false, false,                                                \
      "small calls (at most 2 blocks per SM) with nothing to copy: no copy items compiled in",                        \
      "T=1 bf16 'rope neox' 'bf16 llama3-ff' '// Llama-3.1-8B'")                                                      \
    X(LMK_ROPE_DECODE_COPY, "rope_decode_copy", LMK_ROPE_K_DECODE, true, false,                                       \
      "small calls with untouched elements to copy (partial rope, out of place)",                                     \
      "T=1 bf16 'rope_multi_qk imrope' '// Qwen3.5/3.6-27B'")                                                         \
    X(LMK_ROPE_ROWS, "rope_rows", LMK_ROPE_K_ROWS, false, false,                                                      \
      "prompts with elements to copy that the bulk kernel does not take (older GPUs, narrow units, big tokens)",      \
      "T=4106 f32 'rope_multi_qk imrope' '// Qwen3.5/3.6-27B' (28 KB a token); A100: every copy prompt")              \
    X(LMK_ROPE_PAIRS, "rope_pairs", LMK_ROPE_K_PAIRS, false, false,                                                   \
      "prompts with nothing to copy (in place, or rope_dim == head_dim)",                                             \
      "T=4106 bf16 'rope neox' 'qkv-in-place' '// Llama-3.1-8B'")                                                     \
    X(LMK_ROPE_BULK, "rope_bulk", LMK_ROPE_K_BULK, false, false,                                                      \
      "sm_90 prompts with elements to copy, heads adjacent: bulk copies through a ring of stages",                    \
      "T=4106 bf16 'rope_multi_qk imrope' '// Qwen3.5/3.6-27B'")                                                      \
    X(LMK_ROPE_BULK_MAPS, "rope_bulk_maps", LMK_ROPE_K_BULK, false, true,                                             \
      "the same where a side's heads are not adjacent: bulk tensor copies through tensor maps",                       \
      "T=4106 bf16 'rope imrope' 'q=q|gate' '// Qwen3.5/3.6-27B'")

/* The rows' ids, in the table's order. */
#define LMK_ROPE_VARIANT_ID(id, name, kernel, copy, maps, reason, bench) id,
typedef enum lmk_rope_variant { LMK_ROPE_VARIANTS(LMK_ROPE_VARIANT_ID) LMK_ROPE_N_VARIANTS } lmk_rope_variant;
#undef LMK_ROPE_VARIANT_ID

/* Forces every later rope launch on a CUDA device onto one row of the table (launches and routes),
 * for the bench's A/B runs; variant -1 gives the planner its own choice back. rope_decode_copy also
 * takes rope_decode's launches, and rope_bulk_maps rope_bulk's (their instantiations run those
 * correctly). A launch the forced row cannot run fails the call with LMK_ERR_UNSUPPORTED before
 * anything is launched. Process-wide: call it before the calls it affects, not while other threads
 * plan. Returns LMK_OK, or LMK_ERR_INVALID_ARGUMENT for a variant outside [-1,
 * LMK_ROPE_N_VARIANTS). */
lmk_status lmk_cuda_rope_force(int variant);

#ifdef __cplusplus
}
#endif
#endif /* LMK_ROPE_VARIANTS_H */
