/*
 * route.h - the routes of a rope call on CUDA: per launch, the row of its variants table
 * (variants.h) and the launch shape that lmk_cuda_rope would launch, planned by the same function
 * (for_each_launch, cuda.cu) but not launched. tests/test_cuda_routing.c checks the model shapes'
 * routes through it. C and C++.
 */
#ifndef LMK_ROPE_ROUTE_H
#define LMK_ROPE_ROUTE_H

#include "cuda/cuda_internal.h"
#include "cuda/cuda_route.h"
#include "ops/rope/rope.h"
#include "ops/rope/variants.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Plans lmk_cuda_rope's launches for a on d (one per slice of 128 pairs; r[i].variant: an
 * lmk_rope_variant), writes the first `max` to r and how many there are to *n: LMK_OK, or the error
 * the call would return before reaching a kernel (a forced variant that a launch cannot run:
 * LMK_ERR_UNSUPPORTED). d needs only sm_count, pdl, bulk, tmap_encode and the smem fields; a tensor
 * map is encoded through d->tmap_encode as a launch would. */
LMK_INTERNAL lmk_status lmk_cuda_rope_route(const lmk_cuda_device *d, const lmk_rope_args *a, lmk_cuda_route *r,
                                            int max, int *n);

#ifdef __cplusplus
}
#endif
#endif /* LMK_ROPE_ROUTE_H */
