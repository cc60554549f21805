/*
 * cuda_internal.h - what the CUDA backend's files share: the device and stream state behind
 * lmk_device.impl / lmk_stream.impl, the "make this device current" helper every entry point calls,
 * the error helper that turns a cudaError_t into an lmk status, and the op launchers that the
 * backend table in cuda_backend.cu points at. The backend's files are C++ (nvcc); the device and
 * stream structs and the inline helpers also compile as C, for tests that describe a device
 * (cuda_route.h). The launchers have C++ linkage and are declared for C++ only.
 */
#ifndef LMK_CUDA_INTERNAL_H
#define LMK_CUDA_INTERNAL_H

#include "core/internal.h"

#include <cuda_runtime_api.h>

/* lmk_device.impl of a CUDA device. */
typedef struct lmk_cuda_device {
    int ordinal;
    int sm_count;          /* sizes the grids: grid-stride kernels launch a few blocks per SM */
    bool pdl;              /* launches use programmatic dependent launch (kernel_common.cuh) */
    bool bulk;             /* kernels may use the bulk copies of sm_90 (kernel_common.cuh) */
    void *tmap_encode;     /* the driver's cuTensorMapEncodeTiled where bulk tensor copies may be
                              used (bulk, and the driver has it), else NULL */
    int smem_sm, smem_optin, smem_reserved; /* shared memory: per SM, the most a block may ask
                                            for, and what the GPU reserves per block (bytes) */
    cudaStream_t setup;    /* private non-blocking stream for alloc zeroing and host copies */
} lmk_cuda_device;

/* lmk_stream.impl of a CUDA stream, created or borrowed (lmk_stream.borrowed). */
typedef struct lmk_cuda_stream {
    cudaStream_t stream;
} lmk_cuda_stream;

static inline lmk_cuda_device *lmk_cuda_dev(const lmk_device *dev)
{
    return (lmk_cuda_device *)dev->impl;
}

static inline cudaStream_t lmk_cuda_stream_of(const lmk_stream *s)
{
    return ((const lmk_cuda_stream *)s->impl)->stream;
}

/* Turns a failed CUDA call into LMK_ERR_DEVICE (LMK_ERR_OUT_OF_MEMORY for cudaErrorMemoryAllocation)
 * with "<what>: <CUDA's text> (<CUDA's name>)". It also reads and clears the runtime's per-thread
 * last error, so a non-sticky failure does not resurface at the next launch check. A sticky error
 * (an illegal address, say) cannot be cleared: every later call reports it again. */
LMK_INTERNAL lmk_status lmk_cuda_fail(cudaError_t e, const char *what);

/* Makes `ordinal` the calling thread's current device. cudaGetDevice is a thread-local read, so the
 * common case (already current) costs no driver call. */
static inline lmk_status lmk_cuda_use(int ordinal, const char *what)
{
    int cur = -1;
    cudaError_t e = cudaGetDevice(&cur);
    if (e == cudaSuccess && cur == ordinal)
        return LMK_OK;
    e = cudaSetDevice(ordinal);
    return e == cudaSuccess ? LMK_OK : lmk_cuda_fail(e, what);
}

/* Op launchers (src/ops/<op>/cuda.cu), one per entry of src/ops/ops.h: arguments are validated,
 * pointers are device memory of s->dev; each enqueues its kernels on the stream and checks the
 * launch. The preloads load every kernel instantiation of the op into the current device's context
 * (device open calls them), so no launch, captured or not, pays for lazy module loading, and a GPU
 * that this build has no code for is reported at open rather than at the first op. */
#ifdef __cplusplus
#define LMK_CUDA_OP_DECL(name)                                                  \
    LMK_INTERNAL lmk_status lmk_cuda_##name(lmk_stream *s, const void *args); \
    LMK_INTERNAL cudaError_t lmk_cuda_##name##_preload(void);
LMK_OPS(LMK_CUDA_OP_DECL)
#undef LMK_CUDA_OP_DECL
#endif

#endif /* LMK_CUDA_INTERNAL_H */
