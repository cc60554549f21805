/*
 * route.h - the route of an attn_prologue call on CUDA: the row of its variants table
 * (variants.h) and the launch shape that lmk_cuda_attn_prologue would launch, planned by the same
 * function (plan_call, cuda.cu) but not launched. tests/test_cuda_routing.c checks the model shapes'
 * routes through it. C and C++.
 */
#ifndef LMK_ATTN_PROLOGUE_ROUTE_H
#define LMK_ATTN_PROLOGUE_ROUTE_H

#include "cuda/cuda_internal.h"
#include "cuda/cuda_route.h"
#include "ops/attn_prologue/attn_prologue.h"
#include "ops/attn_prologue/variants.h"

#ifdef __cplusplus
extern "C" {
#endif

/* LMK_OK and the call's one launch in *r (r->variant: an lmk_ap_variant), or the error the call
 * would return (a forced variant the call cannot run: LMK_ERR_UNSUPPORTED). d needs only sm_count
 * and pdl. */
LMK_INTERNAL lmk_status lmk_cuda_attn_prologue_route(const lmk_cuda_device *d, const lmk_attn_prologue_args *a,
                                                     lmk_cuda_route *r);

#ifdef __cplusplus
}
#endif
#endif /* LMK_ATTN_PROLOGUE_ROUTE_H */
