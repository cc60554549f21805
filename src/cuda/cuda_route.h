/*
 * cuda_route.h - which kernel a CUDA op call launches, planned exactly as the call would plan it but
 * not launched. The launchers (src/ops/<op>/cuda.cu) and these functions share one planning path,
 * so a route is the launch's own choice. tests/test_cuda_routing.c asserts the routes of the model
 * shapes (docs/cuda.md, "Routing"), on described devices (no GPU needed) and on the real one. C and
 * C++.
 */
#ifndef LMK_CUDA_ROUTE_H
#define LMK_CUDA_ROUTE_H

#include "cuda/cuda_internal.h"
#include "ops/attn_prologue/attn_prologue.h"
#include "ops/rope/rope.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One launch, as planned. */
typedef struct lmk_cuda_route {
    const char *kernel;  /* the __global__ function's name, e.g. "rope_bulk_kernel" */
    unsigned unit_bytes; /* bytes of a unit: 16, one element's, or 4 elements' (decode with an f8 cache) */
    bool mix;            /* attn_prologue: the MIX instantiation (a lane runs pair and copy items alike) */
    bool ahead;          /* attn_prologue's stream kernel: tables formed one block ahead */
    bool chunk;          /* attn_prologue: rows processed in chunks (the CHUNK instantiation) */
    bool maps;           /* rope_bulk_kernel: some side moved by bulk tensor copies (tensor maps) */
    unsigned blocks;     /* blocks planned (the stream kernel launches at most those resident at once) */
    unsigned threads;    /* threads a block */
    size_t smem;         /* dynamic shared memory a block */
} lmk_cuda_route;

/* Plans lmk_cuda_rope's launches for a on d (one per slice of 128 pairs), writes the first `max` to
 * r and returns how many there are, or -1 with lmk_last_error set where the launch would fail
 * before reaching a kernel. d needs only sm_count, bulk, tmap_encode and the smem fields; a tensor
 * map is encoded through d->tmap_encode as a launch would. */
LMK_INTERNAL int lmk_cuda_rope_route(const lmk_cuda_device *d, const lmk_rope_args *a, lmk_cuda_route *r, int max);
/* The same for lmk_cuda_attn_prologue (always one launch): LMK_OK and *r, or the error the call
 * would return. */
LMK_INTERNAL lmk_status lmk_cuda_attn_prologue_route(const lmk_cuda_device *d, const lmk_attn_prologue_args *a,
                                                     lmk_cuda_route *r);

#ifdef __cplusplus
}
#endif
#endif /* LMK_CUDA_ROUTE_H */
