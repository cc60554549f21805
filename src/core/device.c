/*
 * device.c - opening devices, choosing their backend, and what the build's backends report.
 *
 * The device is the only place that knows which backend table serves a handle; every other
 * front-end function dispatches through dev->ops, so adding a backend touches this file alone.
 * Core never calls into a backend by name: what it needs from one (its device count, a name that
 * shows the thread count, its part of lmk_build_info) is a slot of the backend's table.
 */
#include "core/internal.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* The table of each backend this build has; NULL for the others and for AUTO (a choice, not a
 * backend). */
static const lmk_backend_ops *backend_table(lmk_backend backend)
{
    switch (backend) {
    case LMK_BACKEND_CPU:
        return &lmk_cpu_backend;
#ifdef LMK_WITH_CUDA
    case LMK_BACKEND_CUDA:
        return &lmk_cuda_backend;
#endif
    default:
        return NULL;
    }
}

/* Every backend, in the order lmk_build_info lists their details. */
static const lmk_backend g_backends[] = {LMK_BACKEND_CPU, LMK_BACKEND_CUDA};

int lmk_device_count(lmk_backend backend)
{
    if (backend == LMK_BACKEND_AUTO) {
        const int n_cuda = lmk_device_count(LMK_BACKEND_CUDA);
        return n_cuda > 0 ? n_cuda : 1;
    }
    const lmk_backend_ops *ops = backend_table(backend);
    return ops ? ops->device_count() : 0;
}

lmk_status lmk_device_open(lmk_backend backend, int ordinal, lmk_device **out)
{
    if (!out)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "lmk_device_open: out must not be NULL");
    if (ordinal < 0)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "lmk_device_open: ordinal (%d) must be >= 0", ordinal);
    if (backend == LMK_BACKEND_AUTO) {
        backend = lmk_device_count(LMK_BACKEND_CUDA) > 0 ? LMK_BACKEND_CUDA : LMK_BACKEND_CPU;
        return lmk_device_open(backend, ordinal, out);
    }
    const lmk_backend_ops *ops = backend_table(backend);
    if (!ops && backend == LMK_BACKEND_CUDA)
        return lmk_fail(LMK_ERR_UNSUPPORTED, "lmk_device_open: this build of lmk has no CUDA backend");
    if (!ops)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "lmk_device_open: unknown backend %d", (int)backend);

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
    if (dev->ops->device_threads_changed) /* the CPU name shows the thread count (lmk.h) */
        dev->ops->device_threads_changed(dev);
    return LMK_OK;
}

int lmk_device_threads(const lmk_device *dev)
{
    if (!dev || dev->backend != LMK_BACKEND_CPU)
        return 0;
    return __atomic_load_n(&dev->n_threads, __ATOMIC_RELAXED);
}

/* The build's fixed part, then each backend's run-time part (the CPU's simd=, known only at run
 * time), written once. */
static char g_build_info[256];
static pthread_once_t g_build_info_once = PTHREAD_ONCE_INIT;

static void build_info_init(void)
{
    snprintf(g_build_info, sizeof g_build_info, "%s",
             "compiler=" LMK_BUILD_COMPILER
#ifdef LMK_WITH_CUDA
             " cuda=yes (" LMK_BUILD_CUDA_ARCHS ")"
#else
             " cuda=no"
#endif
             " build=" LMK_BUILD_TYPE);
    for (size_t i = 0; i < sizeof g_backends / sizeof g_backends[0]; i++) {
        const lmk_backend_ops *ops = backend_table(g_backends[i]);
        const size_t used = strlen(g_build_info);
        if (!ops || !ops->build_detail || used + 2 >= sizeof g_build_info)
            continue;
        g_build_info[used] = ' ';
        ops->build_detail(g_build_info + used + 1, sizeof g_build_info - used - 1);
    }
}

const char *lmk_build_info(void)
{
    pthread_once(&g_build_info_once, build_info_init);
    return g_build_info;
}
