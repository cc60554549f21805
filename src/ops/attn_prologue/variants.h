/*
 * variants.h - the kernel variants of attn_prologue's CUDA backend (src/ops/attn_prologue/cuda.cu),
 * one X-macro row each: the planner (plan_call) returns a row's id, the launcher and the preload
 * instantiate each row's kernel from its template arguments, tests/test_cuda_routing.c checks the
 * row each model shape takes, and `lmk bench --variant NAME` times a call forced onto one row
 * (lmk_cuda_attn_prologue_force). A row names a kernel, its unit width and three switches:
 *
 *   X(id, name, kernel, units, f8, mix, chunk, reason, bench)
 *
 *   kernel  LMK_AP_K_STREAM  prologue_stream_kernel<DT, VE, U = 2, F8, MIX>
 *           LMK_AP_K_DECODE  prologue_decode_kernel<DT, VE, F8, MIX>  (a lane an item: no U)
 *           LMK_AP_K_BLOCK   prologue_kernel<DT, VE, U, CHUNK>        (f8 paths always in, no MIX)
 *   units   LMK_AP_U16 16-byte units (VE = 16 / element size; U = 2), LMK_AP_U4 4-element units
 *           (the f8-cache decode units, 4 codes a cache store), LMK_AP_U1 one-element units (U = 4)
 *   f8      the f8-cache paths compiled in (a call with an f8 cache needs them; one without runs
 *           them correctly, only slower)
 *   mix     a lane runs pair and copy items by one code path (emit_mixed; rows with both: Qwen3.5)
 *   chunk   rows longer than one chunk of L x U items (two passes)
 *   reason  why the row exists; bench: the `lmk bench --op attn_prologue` case that keeps it (its
 *           T, dtype and the fragments of its name), or what needs it where no case does.
 *
 * DT is the call's dtype (f32, bf16, f16): every row is instantiated for each. With f32 the U4 rows
 * are the U16 rows' kernels (4 f32 elements are 16 bytes): the planner returns U16 there. C and C++.
 */
#ifndef LMK_ATTN_PROLOGUE_VARIANTS_H
#define LMK_ATTN_PROLOGUE_VARIANTS_H

#include "lmk.h"

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The kernels and unit widths a row names (the table's kernel and units columns). */
typedef enum lmk_ap_kernel { LMK_AP_K_STREAM, LMK_AP_K_DECODE, LMK_AP_K_BLOCK } lmk_ap_kernel;
typedef enum lmk_ap_units { LMK_AP_U16, LMK_AP_U4, LMK_AP_U1 } lmk_ap_units;

#define LMK_AP_VARIANTS(X)                                                                                            \
    X(LMK_AP_STREAM, "prologue_stream", LMK_AP_K_STREAM, LMK_AP_U16, false, false, false,                             \
      "prompts with 16-byte units and no f8 cache: the stream kernel without the f8 paths",                           \
      "T=4106 bf16 'q-in-place' 'cache=bf16+v' '// Qwen3-8B prompt'")                                                 \
    X(LMK_AP_STREAM_F8, "prologue_stream_f8", LMK_AP_K_STREAM, LMK_AP_U16, true, false, false,                        \
      "prompts with 16-byte units and an f8 cache",                                                                   \
      "T=4106 bf16 'q-in-place' 'cache=f8e4m3+v scale=0.0625' '// Qwen3-8B prompt'")                                  \
    X(LMK_AP_STREAM_MIX, "prologue_stream_mix", LMK_AP_K_STREAM, LMK_AP_U16, false, true, false,                      \
      "prompts whose q/k rows hold pair and copy items (partial half-split rope), no f8 cache",                       \
      "T=4106 bf16 'cache=bf16+v' '// Qwen3.5/3.6-27B prompt'")                                                       \
    X(LMK_AP_DECODE, "prologue_decode", LMK_AP_K_DECODE, LMK_AP_U16, false, false, false,                             \
      "small calls with 16-byte units, no f8 cache: one item a lane, no chunk loop, no f8 paths",                     \
      "T=1 bf16 'q-in-place' 'cache=bf16+v' '// Qwen3-8B decode batch'")                                              \
    X(LMK_AP_DECODE_MIX, "prologue_decode_mix", LMK_AP_K_DECODE, LMK_AP_U16, false, true, false,                      \
      "small calls of rows with pair and copy items, no f8 cache, at most one block per SM",                          \
      "T=1 bf16 'cache=bf16+v' '// Qwen3.5/3.6-27B decode batch'")                                                    \
    X(LMK_AP_DECODE_F8, "prologue_decode_f8", LMK_AP_K_DECODE, LMK_AP_U16, true, false, false,                        \
      "small calls with an f8 cache whose rows pass 32 items at 4-element units (and f32's)",                         \
      "none: head_dim >= 512 bf16, or f32 with an f8 cache")                                                          \
    X(LMK_AP_DECODE_F8_MIX, "prologue_decode_f8_mix", LMK_AP_K_DECODE, LMK_AP_U16, true, true, false,                 \
      "the same with rows of pair and copy items",                                                                    \
      "none: f32 with an f8 cache, Qwen3.5's rows")                                                                   \
    X(LMK_AP_DECODE_F8_NARROW, "prologue_decode_f8_narrow", LMK_AP_K_DECODE, LMK_AP_U4, true, false, false,           \
      "small calls with an f8 cache: 4-element units shorten each lane's chain of scale and code conversion",         \
      "T=1 and T=64 bf16 'q-in-place' 'cache=f8e4m3+v scale=0.0625' '// Qwen3-8B decode batch'")                      \
    X(LMK_AP_DECODE_F8_NARROW_MIX, "prologue_decode_f8_narrow_mix", LMK_AP_K_DECODE, LMK_AP_U4, true, true, false,    \
      "the same with rows of pair and copy items (at any size of call)",                                              \
      "T=1 and T=64 bf16 'cache=f8e4m3+v' '// Qwen3.5/3.6-27B decode batch'")                                         \
    X(LMK_AP_BLOCK, "prologue_block", LMK_AP_K_BLOCK, LMK_AP_U16, true, false, false,                                 \
      "prompts with 16-byte units whose stream tables pass 48 KB (head_dim near 1024)",                               \
      "none: no model; every stream and decode row's A/B baseline")                                                   \
    X(LMK_AP_BLOCK_CHUNK, "prologue_block_chunk", LMK_AP_K_BLOCK, LMK_AP_U16, true, false, true,                      \
      "16-byte units, rows past one chunk (head_dim > 2048 bf16, > 1024 f32)",                                        \
      "none: correctness (no model)")                                                                                 \
    X(LMK_AP_BLOCK_ELEM, "prologue_block_elem", LMK_AP_K_BLOCK, LMK_AP_U1, true, false, false,                        \
      "operands that 16-byte units do not fit (odd shapes, unaligned views)",                                         \
      "none: correctness (no model)")                                                                                 \
    X(LMK_AP_BLOCK_ELEM_CHUNK, "prologue_block_elem_chunk", LMK_AP_K_BLOCK, LMK_AP_U1, true, false, true,             \
      "one-element units, rows past one chunk (head_dim > 256 with a full rope)",                                     \
      "none: correctness (no model)")

/* The rows' ids, in the table's order. */
#define LMK_AP_VARIANT_ID(id, name, kernel, units, f8, mix, chunk, reason, bench) id,
typedef enum lmk_ap_variant { LMK_AP_VARIANTS(LMK_AP_VARIANT_ID) LMK_AP_N_VARIANTS } lmk_ap_variant;
#undef LMK_AP_VARIANT_ID

/* Forces every later attn_prologue call on a CUDA device onto one row of the table (its launch and
 * its route), for the bench's A/B runs; variant -1 gives the planner its own choice back. The row
 * steers the choices it names (the kernel, 16-byte or 4-element decode units, MIX where rows hold
 * pair and copy items, the f8 paths, which also run a call without an f8 cache); a call the forced
 * row cannot run fails with LMK_ERR_UNSUPPORTED and launches nothing. Process-wide: call it
 * before the calls it affects, not while other threads plan. Returns LMK_OK, or
 * LMK_ERR_INVALID_ARGUMENT for a variant outside [-1, LMK_AP_N_VARIANTS). */
lmk_status lmk_cuda_attn_prologue_force(int variant);

#ifdef __cplusplus
}
#endif
#endif /* LMK_ATTN_PROLOGUE_VARIANTS_H */
