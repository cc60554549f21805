/*
 * cuda_route.h - one launch of a CUDA op call as its planner chose it, not launched. Each op with
 * several kernels keeps them in one X-macro table (src/ops/<op>/variants.h) and declares its route
 * function next to it (src/ops/<op>/route.h); the launcher and the route plan through one function,
 * so a route is the launch's own choice. tests/test_cuda_routing.c asserts the routes of the model
 * shapes (docs/cuda.md, "Routing"), on described devices (no GPU needed) and on the real one. C and
 * C++.
 */
#ifndef LMK_CUDA_ROUTE_H
#define LMK_CUDA_ROUTE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One launch, as planned. */
typedef struct lmk_cuda_route {
    int variant;              /* the row of the op's variants table (its enum id) */
    const char *variant_name; /* that row's name, e.g. "rope_bulk_maps" */
    const char *kernel;       /* the __global__ function's name, e.g. "rope_bulk_kernel" */
    unsigned unit_bytes;      /* bytes of a unit: 16, one element's, or 4 elements' (attn_prologue, f8 decode) */
    unsigned blocks;          /* blocks planned (a persistent kernel launches at most those resident at once) */
    unsigned threads;         /* threads a block */
    size_t smem;              /* dynamic shared memory a block */
} lmk_cuda_route;

#ifdef __cplusplus
}
#endif
#endif /* LMK_CUDA_ROUTE_H */
