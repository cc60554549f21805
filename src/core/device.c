/*
 * device.c - opening devices and choosing their backend.
 *
 * The device is the only place that knows which backend table serves a handle; every other
 * front-end function dispatches through dev->ops, so adding a backend touches this file alone.
 */
#include "core/internal.h"
#include "cpu/cpu.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int lmk_default_threads(void)
{
    const char *env = getenv("LMK_NUM_THREADS");
    if (env && *env) {
        char *end = NULL;
        const long n = strtol(env, &end, 10);
        if (*end == '\0' && n >= 1 && n <= 1024)
            return (int)n;
    }
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n >= 1 ? (n > 1024 ? 1024 : (int)n) : 1;
}

int lmk_device_count(lmk_backend backend)
{
    switch (backend) {
    case LMK_BACKEND_CPU:
        return 1;
    case LMK_BACKEND_CUDA:
#ifdef LMK_WITH_CUDA
        return lmk_cuda_device_count();
#else
        return 0;
#endif
    case LMK_BACKEND_AUTO:
        return lmk_device_count(LMK_BACKEND_CUDA) > 0 ? lmk_device_count(LMK_BACKEND_CUDA) : 1;
    }
    return 0;
}

lmk_status lmk_device_open(lmk_backend backend, int ordinal, lmk_device **out)
{
    if (!out)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "lmk_device_open: out must not be NULL");
    if (ordinal < 0)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "lmk_device_open: ordinal (%d) must be >= 0", ordinal);

    const lmk_backend_ops *ops = NULL;
    switch (backend) {
    case LMK_BACKEND_AUTO:
        backend = lmk_device_count(LMK_BACKEND_CUDA) > 0 ? LMK_BACKEND_CUDA : LMK_BACKEND_CPU;
        return lmk_device_open(backend, ordinal, out);
    case LMK_BACKEND_CPU:
        ops = &lmk_cpu_backend;
        break;
    case LMK_BACKEND_CUDA:
#ifdef LMK_WITH_CUDA
        ops = &lmk_cuda_backend;
        break;
#else
        return lmk_fail(LMK_ERR_UNSUPPORTED, "lmk_device_open: this build of lmk has no CUDA backend");
#endif
    default:
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "lmk_device_open: unknown backend %d", (int)backend);
    }

    lmk_device *dev = lmk_host_calloc(sizeof *dev, 0);
    if (!dev)
        return lmk_fail(LMK_ERR_OUT_OF_MEMORY, "lmk_device_open: out of host memory");
    dev->backend = backend;
    dev->ops = ops;
    dev->ordinal = ordinal;
    dev->n_threads = lmk_default_threads();
    const lmk_status st = ops->device_open(dev, ordinal);
    if (st != LMK_OK) {
        lmk_host_free(dev);
        return st;
    }
    *out = dev;
    return LMK_OK;
}

void lmk_device_close(lmk_device *dev)
{
    if (!dev)
        return;
    dev->ops->device_close(dev);
    lmk_host_free(dev);
}

lmk_backend lmk_device_backend(const lmk_device *dev)
{
    return dev ? dev->backend : LMK_BACKEND_AUTO;
}

const char *lmk_device_name(const lmk_device *dev)
{
    return dev ? dev->name : "";
}

lmk_status lmk_device_set_threads(lmk_device *dev, int n_threads)
{
    if (!dev)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "lmk_device_set_threads: dev must not be NULL");
    if (n_threads > 1024)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "lmk_device_set_threads: n_threads (%d) must be <= 1024",
                        n_threads);
    /* Relaxed atomic: another thread may be reading it in lmk_stream_create right now. */
    __atomic_store_n(&dev->n_threads, n_threads <= 0 ? lmk_default_threads() : n_threads, __ATOMIC_RELAXED);
    if (dev->backend == LMK_BACKEND_CPU) /* the name shows the thread count (lmk.h) */
        lmk_cpu_name_device(dev);
    return LMK_OK;
}

int lmk_device_threads(const lmk_device *dev)
{
    if (!dev || dev->backend != LMK_BACKEND_CPU)
        return 0;
    return __atomic_load_n(&dev->n_threads, __ATOMIC_RELAXED);
}
