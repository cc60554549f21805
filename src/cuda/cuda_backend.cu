/*
 * cuda_backend.cu - the CUDA backend's table (lmk_cuda_backend): devices, memory, streams, and
 * the interop entry points of include/lmk_cuda.h. The op kernels live in src/ops/<op>/cuda.cu.
 *
 * Rules every function here keeps:
 *  - Never exit, abort or print: every CUDA failure becomes LMK_ERR_DEVICE (LMK_ERR_OUT_OF_MEMORY
 *    for cudaErrorMemoryAllocation) with a message naming the function and CUDA's text.
 *  - The runtime's current device is per host thread, so every entry point makes the handle's
 *    device current on the calling thread first (a thread-local read when it already is).
 *  - lmk streams are non-blocking (cudaStreamNonBlocking): they do not serialise with the legacy
 *    default stream, so a plain cudaMemset/cudaMemcpy could still be in flight when an op on an
 *    lmk stream starts. Allocation zeroing and host copies therefore run on a private stream
 *    per device and are waited for before the call returns (they are setup, not ops).
 *  - A machine without a driver or GPU is normal (CI): the device count is 0 and device open
 *    returns LMK_ERR_NOT_FOUND, each with the runtime's error cleared.
 */
#include "cuda/cuda_internal.h"
#include "lmk_cuda.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

lmk_status lmk_cuda_fail(cudaError_t e, const char *what)
{
    (void)cudaGetLastError(); /* clear a non-sticky error so later launch checks don't see it */
    const lmk_status st = e == cudaErrorMemoryAllocation ? LMK_ERR_OUT_OF_MEMORY : LMK_ERR_DEVICE;
    return lmk_fail(st, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

static int cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

/* ---- devices ---- */

/* An empty kernel compiled with the same flags as every op's kernels: its PTX version is theirs. */
__global__ void pdl_probe_kernel() {}

/* Whether the GPU (compute capability 9 or later) runs code from compute_90 or later PTX, which
 * holds what sm_90 adds: programmatic dependent launch (kernel_common.cuh's pdl_enter and
 * lmk_cuda_start; a build for sm_80 alone, JIT-compiled on an H100, has no pdl_enter wait and must
 * not start early) and the bulk copies (bulk_load and the rest). Asked once, at device open,
 * outside any capture; a failed query says no, which keeps plain launches and the other kernels,
 * always correct. */
static bool sm90_code(int major)
{
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, pdl_probe_kernel) != cudaSuccess) {
        (void)cudaGetLastError(); /* the failed query is no launch error: a later launch check must not see it */
        return false;
    }
    return major >= 9 && fa.ptxVersion >= 90;
}

/* LMK_CUDA_PDL=0 turns programmatic dependent launch off, LMK_CUDA_BULK=0 the bulk-copy kernels
 * (the ops then take their others); lmk.h, lmk_device_open. */
static bool env_off(const char *name)
{
    const char *env = getenv(name);
    return env && !strcmp(env, "0");
}

/* The driver's cuTensorMapEncodeTiled (CUDA 12.0's interface), which the bulk tensor copies' maps
 * are made with, through the runtime: lmk links no driver library. NULL where the driver lacks it.
 * Runtimes before 12.5 have only the unversioned query (deprecated since). */
static void *tensor_map_encoder(void)
{
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q);
#else
    const cudaError_t e = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &q);
#endif
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return fn;
}

static lmk_status cuda_device_open(lmk_device *dev, int ordinal)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        /* A machine without a GPU or driver says "CUDA driver version is insufficient for CUDA
         * runtime version"; with no driver installed at all the driver version reads 0. */
        int driver = 0, runtime = 0;
        if (e == cudaErrorInsufficientDriver && cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0 &&
            cudaRuntimeGetVersion(&runtime) == cudaSuccess)
            return lmk_fail(LMK_ERR_NOT_FOUND,
                            "lmk_device_open: the NVIDIA driver supports CUDA %d.%d, older than this build's CUDA "
                            "runtime %d.%d (CUDA: %s)",
                            driver / 1000, driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10,
                            cudaGetErrorString(e));
        if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice)
            return lmk_fail(LMK_ERR_NOT_FOUND, "lmk_device_open: no NVIDIA GPU or driver found (CUDA: %s)",
                            cudaGetErrorString(e));
        return lmk_fail(LMK_ERR_NOT_FOUND, "lmk_device_open: no usable CUDA GPU (cudaGetDeviceCount: %s)",
                        cudaGetErrorString(e));
    }
    if (ordinal >= n)
        return lmk_fail(LMK_ERR_NOT_FOUND, "lmk_device_open: CUDA device %d does not exist (%d found)",
                        ordinal, n);

    cudaDeviceProp prop;
    e = cudaGetDeviceProperties(&prop, ordinal);
    if (e != cudaSuccess)
        return lmk_cuda_fail(e, "lmk_device_open: cudaGetDeviceProperties");
    lmk_status st = lmk_cuda_use(ordinal, "lmk_device_open: cudaSetDevice");
    if (st != LMK_OK)
        return st;

    /* Loading every kernel now keeps module loading out of ops (and out of graph captures), and
     * a GPU this build has no code for fails here, once, with a clear message. */
    e = cudaSuccess;
#define CUDA_OP_PRELOAD(name) \
    if (e == cudaSuccess)     \
        e = lmk_cuda_##name##_preload();
    LMK_OPS(CUDA_OP_PRELOAD)
#undef CUDA_OP_PRELOAD
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        if (e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidDeviceFunction ||
            e == cudaErrorUnsupportedPtxVersion)
            return lmk_fail(LMK_ERR_UNSUPPORTED,
                            "lmk_device_open: %s (sm_%d%d) is not supported by this build of lmk: %s",
                            prop.name, prop.major, prop.minor, cudaGetErrorString(e));
        return lmk_cuda_fail(e, "lmk_device_open: loading kernels");
    }

    lmk_cuda_device *d = (lmk_cuda_device *)lmk_host_calloc(sizeof *d, 0);
    if (!d)
        return lmk_fail(LMK_ERR_OUT_OF_MEMORY, "lmk_device_open: out of host memory");
    d->ordinal = ordinal;
    d->sm_count = prop.multiProcessorCount > 0 ? prop.multiProcessorCount : 1;
    const bool sm90 = sm90_code(prop.major);
    d->pdl = sm90 && !env_off("LMK_CUDA_PDL");
    d->bulk = sm90 && !env_off("LMK_CUDA_BULK");
    d->tmap_encode = d->bulk && !env_off("LMK_CUDA_TMAP") ? tensor_map_encoder() : NULL;
    d->smem_sm = (int)prop.sharedMemPerMultiprocessor;
    d->smem_optin = (int)prop.sharedMemPerBlockOptin;
    d->smem_reserved = (int)prop.reservedSharedMemPerBlock;
    e = cudaStreamCreateWithFlags(&d->setup, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        lmk_host_free(d);
        return lmk_cuda_fail(e, "lmk_device_open: cudaStreamCreateWithFlags");
    }
    dev->impl = d;
    /* The marketing name is cut to 96 characters so the suffix always fits dev->name. */
    snprintf(dev->name, sizeof dev->name, "%.96s (sm_%d%d, %d SMs)", prop.name, prop.major % 100,
             prop.minor % 100, prop.multiProcessorCount % 100000);
    return LMK_OK;
}

static void cuda_device_close(lmk_device *dev)
{
    lmk_cuda_device *d = lmk_cuda_dev(dev);
    if (!d)
        return;
    if (lmk_cuda_use(d->ordinal, "lmk_device_close") == LMK_OK)
        (void)cudaStreamDestroy(d->setup);
    (void)cudaGetLastError();
    lmk_host_free(d);
    dev->impl = NULL;
}

/* ---- memory ---- */

static lmk_status cuda_mem_alloc(lmk_device *dev, size_t n, void **out)
{
    const lmk_cuda_device *d = lmk_cuda_dev(dev);
    *out = NULL;
    if (n == 0)
        return LMK_OK; /* nothing to hold; mem_free(NULL) is a no-op */
    lmk_status st = lmk_cuda_use(d->ordinal, "lmk_buffer_alloc: cudaSetDevice");
    if (st != LMK_OK)
        return st;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        if (e == cudaErrorMemoryAllocation)
            return lmk_fail(LMK_ERR_OUT_OF_MEMORY, "lmk_buffer_alloc: cudaMalloc of %zu bytes: %s", n,
                            cudaGetErrorString(e));
        return lmk_cuda_fail(e, "lmk_buffer_alloc: cudaMalloc");
    }
    e = cudaMemsetAsync(p, 0, n, d->setup);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(d->setup);
    if (e != cudaSuccess) {
        st = lmk_cuda_fail(e, "lmk_buffer_alloc: zero-filling");
        (void)cudaFree(p);
        return st;
    }
    *out = p;
    return LMK_OK;
}

static void cuda_mem_free(lmk_device *dev, void *p)
{
    if (!p)
        return;
    if (lmk_cuda_use(lmk_cuda_dev(dev)->ordinal, "lmk_buffer_free") == LMK_OK)
        (void)cudaFree(p);
    (void)cudaGetLastError();
}

/* Host <-> device copies: complete when the call returns (see the file comment). */
static lmk_status cuda_copy(lmk_device *dev, void *dst, const void *src, size_t n, cudaMemcpyKind kind,
                            const char *what)
{
    const lmk_cuda_device *d = lmk_cuda_dev(dev);
    lmk_status st = lmk_cuda_use(d->ordinal, what);
    if (st != LMK_OK)
        return st;
    cudaError_t e = cudaMemcpyAsync(dst, src, n, kind, d->setup);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(d->setup);
    return e == cudaSuccess ? LMK_OK : lmk_cuda_fail(e, what);
}

static lmk_status cuda_mem_write(lmk_device *dev, void *dst, const void *src, size_t n)
{
    return cuda_copy(dev, dst, src, n, cudaMemcpyHostToDevice, "lmk_buffer_write: cudaMemcpy");
}

static lmk_status cuda_mem_read(lmk_device *dev, void *dst, const void *src, size_t n)
{
    return cuda_copy(dev, dst, src, n, cudaMemcpyDeviceToHost, "lmk_buffer_read: cudaMemcpy");
}

/* ---- streams ---- */

static lmk_status cuda_stream_create(lmk_stream *s)
{
    const lmk_cuda_device *d = lmk_cuda_dev(s->dev);
    lmk_status st = lmk_cuda_use(d->ordinal, "lmk_stream_create: cudaSetDevice");
    if (st != LMK_OK)
        return st;
    lmk_cuda_stream *cs = (lmk_cuda_stream *)lmk_host_calloc(sizeof *cs, 0);
    if (!cs)
        return lmk_fail(LMK_ERR_OUT_OF_MEMORY, "lmk_stream_create: out of host memory");
    const cudaError_t e = cudaStreamCreateWithFlags(&cs->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        lmk_host_free(cs);
        return lmk_cuda_fail(e, "lmk_stream_create: cudaStreamCreateWithFlags");
    }
    s->impl = cs;
    s->borrowed = false;
    return LMK_OK;
}

static lmk_status cuda_stream_sync(lmk_stream *s)
{
    lmk_status st = lmk_cuda_use(lmk_cuda_dev(s->dev)->ordinal, "lmk_stream_sync: cudaSetDevice");
    if (st != LMK_OK)
        return st;
    const cudaError_t e = cudaStreamSynchronize(lmk_cuda_stream_of(s));
    return e == cudaSuccess ? LMK_OK : lmk_cuda_fail(e, "lmk_stream_sync: cudaStreamSynchronize");
}

/* Waits for the stream's work (lmk_stream_destroy's contract), then destroys the cudaStream_t
 * unless it is borrowed. A stream being captured into a graph is not waited for: a synchronize
 * would invalidate the caller's capture. Errors cannot be reported here; a sticky one stays for
 * the next call to find. */
static void cuda_stream_destroy(lmk_stream *s)
{
    lmk_cuda_stream *cs = (lmk_cuda_stream *)s->impl;
    if (!cs)
        return;
    if (lmk_cuda_use(lmk_cuda_dev(s->dev)->ordinal, "lmk_stream_destroy") == LMK_OK) {
        cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
        if (cudaStreamIsCapturing(cs->stream, &cap) == cudaSuccess && cap == cudaStreamCaptureStatusNone)
            (void)cudaStreamSynchronize(cs->stream);
        if (!s->borrowed)
            (void)cudaStreamDestroy(cs->stream);
    }
    (void)cudaGetLastError();
    lmk_host_free(cs);
    s->impl = NULL;
}

/* Every op of src/ops/ops.h has its CUDA launcher, lmk_cuda_<op> in src/ops/<op>/cuda.cu. Slots are
 * assigned by name (C++ has no designated array initialisers); the ones left NULL say the backend has
 * nothing there: a CUDA device's name does not show a thread count, and the build's CUDA facts are
 * fixed at compile time (device.c). */
static lmk_backend_ops make_table()
{
    lmk_backend_ops t = {};
    t.device_count = cuda_device_count;
    t.device_open = cuda_device_open;
    t.device_close = cuda_device_close;
    t.mem_alloc = cuda_mem_alloc;
    t.mem_free = cuda_mem_free;
    t.mem_write = cuda_mem_write;
    t.mem_read = cuda_mem_read;
    t.stream_create = cuda_stream_create;
    t.stream_sync = cuda_stream_sync;
    t.stream_destroy = cuda_stream_destroy;
#define CUDA_OP_SLOT(name) t.op[LMK_OP_##name] = lmk_cuda_##name;
    LMK_OPS(CUDA_OP_SLOT)
#undef CUDA_OP_SLOT
    return t;
}

extern "C" const lmk_backend_ops lmk_cuda_backend = make_table();

/* ---- interop (include/lmk_cuda.h) ---- */

lmk_status lmk_stream_wrap_cuda(lmk_device *dev, cudaStream_t stream, lmk_stream **out)
{
    if (!dev)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "lmk_stream_wrap_cuda: dev must not be NULL");
    if (!out)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "lmk_stream_wrap_cuda: out must not be NULL");
    if (dev->backend != LMK_BACKEND_CUDA)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "lmk_stream_wrap_cuda: device \"%s\" is not a CUDA device",
                        dev->name);
    const lmk_cuda_device *d = lmk_cuda_dev(dev);
    lmk_status st = lmk_cuda_use(d->ordinal, "lmk_stream_wrap_cuda: cudaSetDevice");
    if (st != LMK_OK)
        return st;
    /* A real stream must belong to this device; the special handles (0, cudaStreamLegacy,
     * cudaStreamPerThread) mean "this thread's default stream of the current device". CUDA
     * refuses cudaStreamGetDevice on a stream that is being captured, in every capture mode, and
     * the refusal invalidates the capture (docs/cuda.md, "Graph capture and wrapped streams":
     * PyTorch's torch.cuda.graph captures on a stream of its own, which the Python package first
     * sees inside the capture), so
     * a stream under capture is taken without the check: one of another device fails at its
     * first launch instead, which ends the capture with that error. */
    if (stream != 0 && stream != cudaStreamLegacy && stream != cudaStreamPerThread) {
        cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
        cudaError_t e = cudaStreamIsCapturing(stream, &cap);
        if (e != cudaSuccess)
            return lmk_cuda_fail(e, "lmk_stream_wrap_cuda: cudaStreamIsCapturing");
        if (cap == cudaStreamCaptureStatusNone) {
            int sdev = -1;
            e = cudaStreamGetDevice(stream, &sdev);
            if (e != cudaSuccess)
                return lmk_cuda_fail(e, "lmk_stream_wrap_cuda: cudaStreamGetDevice");
            if (sdev != d->ordinal)
                return lmk_fail(LMK_ERR_INVALID_ARGUMENT,
                                "lmk_stream_wrap_cuda: the stream belongs to CUDA device %d, not %d", sdev,
                                d->ordinal);
        }
    }
    lmk_stream *s = (lmk_stream *)lmk_host_calloc(sizeof *s, 0);
    lmk_cuda_stream *cs = (lmk_cuda_stream *)lmk_host_calloc(sizeof *cs, 0);
    if (!s || !cs) {
        lmk_host_free(s);
        lmk_host_free(cs);
        return lmk_fail(LMK_ERR_OUT_OF_MEMORY, "lmk_stream_wrap_cuda: out of host memory");
    }
    cs->stream = stream;
    s->dev = dev;
    s->impl = cs;
    s->borrowed = true;
    *out = s;
    return LMK_OK;
}

cudaStream_t lmk_stream_cuda_handle(const lmk_stream *s)
{
    if (!s || !s->impl || s->dev->backend != LMK_BACKEND_CUDA)
        return 0;
    return lmk_cuda_stream_of(s);
}
