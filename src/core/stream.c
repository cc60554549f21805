/*
 * stream.c - streams: the order of work on one device.
 *
 * The backend owns what a stream is (a CPU thread pool, a cudaStream_t); this file owns the handle
 * so that creation failures roll back in one place.
 */
#include "core/internal.h"

#include <fenv.h>

lmk_status lmk_stream_create(lmk_device *dev, lmk_stream **out)
{
    if (!dev)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "lmk_stream_create: dev must not be NULL");
    if (!out)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "lmk_stream_create: out must not be NULL");
    lmk_stream *s = lmk_host_calloc(sizeof *s, 0);
    if (!s)
        return lmk_fail(LMK_ERR_OUT_OF_MEMORY, "lmk_stream_create: out of host memory");
    s->dev = dev;
    const lmk_status st = dev->ops->stream_create(s);
    if (st != LMK_OK) {
        lmk_host_free(s);
        return st;
    }
    *out = s;
    return LMK_OK;
}

lmk_status lmk_stream_sync(lmk_stream *s)
{
    if (!s)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "lmk_stream_sync: stream must not be NULL");
    return s->dev->ops->stream_sync(s);
}

void lmk_stream_destroy(lmk_stream *s)
{
    if (!s)
        return;
    s->dev->ops->stream_destroy(s);
    lmk_host_free(s);
}

lmk_device *lmk_stream_device(const lmk_stream *s)
{
    return s ? s->dev : NULL;
}

/* The backend runs under round-to-nearest whatever the caller set: its host-side preparation
 * (narrowing doubles to kernel parameters, say) must not depend on the caller's rounding mode
 * (lmk.h, determinism). The CPU paths also guard their worker threads (lmk_cpu_parallel). */
lmk_status lmk_dispatch(lmk_stream *s, lmk_op_id id, const char *name, const void *args)
{
    const lmk_op_fn fn = s->dev->ops->op[id];
    if (!fn)
        return lmk_fail(LMK_ERR_UNSUPPORTED, "%s: the %s backend of this build has no %s", name, s->dev->name, name);
    const int mode = fegetround();
    if (mode != FE_TONEAREST)
        fesetround(FE_TONEAREST);
    const lmk_status st = fn(s, args);
    if (mode != FE_TONEAREST)
        fesetround(mode);
    return st;
}
