/*
 * buffer.c - buffers: device memory with a dtype and a shape.
 *
 * Three constructors share one shape check: alloc owns its memory, wrap borrows the caller's, and
 * view borrows a parent's. Reads and writes are bounds-checked here and copied by the backend.
 */
#include "core/internal.h"

#include <string.h>

/* Fills b's dtype and shape from the arguments, checking that the shape fits byte_len bytes.
 * `fn` names the calling function in the message. */
static lmk_status set_shape(lmk_buffer *b, const char *fn, size_t byte_len, lmk_dtype dtype,
                            const size_t *shape, int ndim)
{
    const size_t esize = lmk_dtype_size(dtype);
    if (esize == 0)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: unknown dtype %d", fn, (int)dtype);
    if (ndim < 0 || ndim > LMK_MAX_DIMS)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: ndim (%d) must be in [0, %d]", fn, ndim,
                        LMK_MAX_DIMS);
    if (ndim > 0 && !shape)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: shape must not be NULL when ndim (%d) > 0", fn, ndim);
    b->dtype = dtype;
    b->byte_len = byte_len;
    b->dense = true;
    if (ndim == 0) {
        b->ndim = 1;
        b->shape[0] = byte_len / esize;
        b->stride[0] = 1;
        b->element_count = b->shape[0];
        return LMK_OK;
    }
    /* A shape with an axis of 0 holds no element, whatever its other axes: its byte size is 0. */
    size_t count = 1, bytes;
    bool empty = false;
    for (int i = 0; i < ndim; i++)
        empty = empty || shape[i] == 0;
    for (int i = 0; i < ndim && !empty; i++)
        if (lmk_mul_overflows(count, shape[i], &count))
            return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: shape element count overflows size_t", fn);
    if (empty)
        count = 0;
    if (lmk_mul_overflows(count, esize, &bytes))
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: shape byte size overflows size_t", fn);
    if (bytes > byte_len)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT,
                        "%s: shape needs %zu bytes (%zu %s elements), buffer has %zu", fn, bytes, count,
                        lmk_dtype_name(dtype), byte_len);
    b->ndim = ndim;
    memcpy(b->shape, shape, (size_t)ndim * sizeof shape[0]);
    size_t stride = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        b->stride[i] = stride;
        stride *= shape[i]; /* cannot overflow: the product of all of them did not (or one is 0, and
                             * stride stays 0 from it on) */
    }
    b->element_count = count;
    return LMK_OK;
}

lmk_status lmk_buffer_alloc(lmk_device *dev, size_t byte_len, lmk_dtype dtype, const size_t *shape,
                            int ndim, lmk_buffer **out)
{
    if (!dev || !out)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "lmk_buffer_alloc: %s must not be NULL", !dev ? "dev" : "out");
    lmk_buffer tmp = {0};
    lmk_status st = set_shape(&tmp, "lmk_buffer_alloc", byte_len, dtype, shape, ndim);
    if (st != LMK_OK)
        return st;
    lmk_buffer *b = lmk_host_alloc(sizeof *b, 0);
    if (!b)
        return lmk_fail(LMK_ERR_OUT_OF_MEMORY, "lmk_buffer_alloc: out of host memory");
    *b = tmp;
    b->dev = dev;
    st = dev->ops->mem_alloc(dev, byte_len, &b->alloc);
    if (st != LMK_OK) {
        lmk_host_free(b);
        return st;
    }
    b->data = b->alloc;
    *out = b;
    return LMK_OK;
}

lmk_status lmk_buffer_wrap(lmk_device *dev, void *ptr, size_t byte_len, lmk_dtype dtype, const size_t *shape,
                           int ndim, lmk_buffer **out)
{
    if (!dev || !out)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "lmk_buffer_wrap: %s must not be NULL", !dev ? "dev" : "out");
    if (!ptr && byte_len)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "lmk_buffer_wrap: ptr is NULL but byte_len is %zu", byte_len);
    lmk_buffer tmp = {0};
    lmk_status st = set_shape(&tmp, "lmk_buffer_wrap", byte_len, dtype, shape, ndim);
    if (st != LMK_OK)
        return st;
    if ((uintptr_t)ptr % lmk_dtype_size(dtype))
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "lmk_buffer_wrap: ptr %p is not aligned to the %s size (%zu)",
                        ptr, lmk_dtype_name(dtype), lmk_dtype_size(dtype));
    if ((uintptr_t)ptr > UINTPTR_MAX - byte_len)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "lmk_buffer_wrap: ptr %p + byte_len %zu wraps the address space",
                        ptr, byte_len);
    lmk_buffer *b = lmk_host_alloc(sizeof *b, 0);
    if (!b)
        return lmk_fail(LMK_ERR_OUT_OF_MEMORY, "lmk_buffer_wrap: out of host memory");
    *b = tmp;
    b->dev = dev;
    b->data = ptr;
    *out = b;
    return LMK_OK;
}

/* parent's memory from byte_offset; a NULL parent (a wrapped empty buffer) stays NULL, since
 * NULL + 0 is undefined in C. */
static unsigned char *view_data(const lmk_buffer *parent, size_t byte_offset)
{
    return parent->data ? parent->data + byte_offset : NULL;
}

lmk_status lmk_buffer_view(const lmk_buffer *parent, size_t byte_offset, lmk_dtype dtype, const size_t *shape,
                           int ndim, lmk_buffer **out)
{
    if (!parent || !out)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "lmk_buffer_view: %s must not be NULL", !parent ? "parent" : "out");
    if (byte_offset > parent->byte_len)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "lmk_buffer_view: byte_offset %zu is past the parent's %zu bytes",
                        byte_offset, parent->byte_len);
    const size_t room = parent->byte_len - byte_offset;
    lmk_buffer tmp = {0};
    lmk_status st = set_shape(&tmp, "lmk_buffer_view", room, dtype, shape, ndim);
    if (st != LMK_OK)
        return st;
    if (ndim > 0)
        tmp.byte_len = tmp.element_count * lmk_dtype_size(dtype); /* exactly the shape's bytes */
    if (((uintptr_t)parent->data + byte_offset) % lmk_dtype_size(dtype))
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT,
                        "lmk_buffer_view: byte_offset %zu is not aligned to the %s size (%zu)", byte_offset,
                        lmk_dtype_name(dtype), lmk_dtype_size(dtype));
    lmk_buffer *b = lmk_host_alloc(sizeof *b, 0);
    if (!b)
        return lmk_fail(LMK_ERR_OUT_OF_MEMORY, "lmk_buffer_view: out of host memory");
    *b = tmp;
    b->dev = parent->dev;
    b->data = view_data(parent, byte_offset);
    *out = b;
    return LMK_OK;
}

lmk_status lmk_buffer_view_strided(const lmk_buffer *parent, size_t byte_offset, lmk_dtype dtype, const size_t *shape,
                                   const size_t *strides, int ndim, lmk_buffer **out)
{
    static const char fn[] = "lmk_buffer_view_strided";
    if (!parent)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: parent must not be NULL", fn);
    if (!out)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: out must not be NULL", fn);
    const size_t es = lmk_dtype_size(dtype);
    if (es == 0)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: unknown dtype %d", fn, (int)dtype);
    if (ndim < 1 || ndim > LMK_MAX_DIMS)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: ndim (%d) must be in [1, %d]", fn, ndim, LMK_MAX_DIMS);
    if (!shape || !strides)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: %s must not be NULL", fn, !shape ? "shape" : "strides");
    if (byte_offset > parent->byte_len)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: byte_offset %zu is past the parent's %zu bytes", fn,
                        byte_offset, parent->byte_len);
    if (((uintptr_t)parent->data + byte_offset) % es)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: byte_offset %zu is not aligned to the %s size (%zu)", fn,
                        byte_offset, lmk_dtype_name(dtype), es);
    /* count = product of the shape; last = offset of the furthest element, in elements. A view
     * with an axis of 0 has no element: count 0, span 0, whatever the other axes and strides. */
    size_t count = 1, last = 0, term;
    bool empty = false;
    for (int i = 0; i < ndim; i++)
        empty = empty || shape[i] == 0;
    for (int i = 0; i < ndim && !empty; i++) {
        if (lmk_mul_overflows(count, shape[i], &count))
            return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: shape element count overflows size_t", fn);
        if (lmk_mul_overflows(shape[i] - 1, strides[i], &term) || __builtin_add_overflow(last, term, &last))
            return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: the span of axis %d (%zu elements, stride %zu) overflows",
                            fn, i, shape[i], strides[i]);
    }
    if (empty)
        count = 0;
    size_t span = 0;
    if (count && (__builtin_add_overflow(last, 1, &span) || lmk_mul_overflows(span, es, &span)))
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: the view's byte span overflows size_t", fn);
    if (span > parent->byte_len - byte_offset)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT,
                        "%s: the view spans %zu bytes from byte_offset %zu, past the parent's %zu bytes", fn, span,
                        byte_offset, parent->byte_len);
    lmk_buffer *b = lmk_host_alloc(sizeof *b, 0);
    if (!b)
        return lmk_fail(LMK_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    *b = (lmk_buffer){.dev = parent->dev, .data = view_data(parent, byte_offset), .byte_len = span, .dtype = dtype,
                      .ndim = ndim, .element_count = count};
    memcpy(b->shape, shape, (size_t)ndim * sizeof shape[0]);
    memcpy(b->stride, strides, (size_t)ndim * sizeof strides[0]);
    b->dense = lmk_buffer_is_contiguous(b) != 0;
    *out = b;
    return LMK_OK;
}

void lmk_buffer_free(lmk_buffer *buf)
{
    if (!buf)
        return;
    if (buf->alloc)
        buf->dev->ops->mem_free(buf->dev, buf->alloc);
    lmk_host_free(buf);
}

/* Checks [off, off+n) lies inside buf; `fn` names the caller. */
static lmk_status check_range(const lmk_buffer *buf, const char *fn, size_t off, const void *host, size_t n)
{
    if (!buf)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: buf must not be NULL", fn);
    if (!host && n)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: host pointer is NULL but n is %zu", fn, n);
    if (off > buf->byte_len || n > buf->byte_len - off)
        return lmk_fail(LMK_ERR_INVALID_ARGUMENT, "%s: range [%zu, %zu + %zu) is outside the buffer's %zu bytes",
                        fn, off, off, n, buf->byte_len);
    return LMK_OK;
}

lmk_status lmk_buffer_write(lmk_buffer *buf, size_t byte_offset, const void *src, size_t n)
{
    const lmk_status st = check_range(buf, "lmk_buffer_write", byte_offset, src, n);
    if (st != LMK_OK || n == 0)
        return st;
    return buf->dev->ops->mem_write(buf->dev, buf->data + byte_offset, src, n);
}

lmk_status lmk_buffer_read(const lmk_buffer *buf, size_t byte_offset, void *dst, size_t n)
{
    const lmk_status st = check_range(buf, "lmk_buffer_read", byte_offset, dst, n);
    if (st != LMK_OK || n == 0)
        return st;
    return buf->dev->ops->mem_read(buf->dev, dst, buf->data + byte_offset, n);
}

size_t lmk_buffer_byte_len(const lmk_buffer *buf) { return buf ? buf->byte_len : 0; }
size_t lmk_buffer_element_count(const lmk_buffer *buf) { return buf ? buf->element_count : 0; }
lmk_dtype lmk_buffer_dtype(const lmk_buffer *buf) { return buf ? buf->dtype : LMK_F32; }
int lmk_buffer_ndim(const lmk_buffer *buf) { return buf ? buf->ndim : 0; }
size_t lmk_buffer_dim(const lmk_buffer *buf, int axis)
{
    return buf && axis >= 0 && axis < buf->ndim ? buf->shape[axis] : 0;
}
lmk_device *lmk_buffer_device(const lmk_buffer *buf) { return buf ? buf->dev : NULL; }
void *lmk_buffer_data(const lmk_buffer *buf) { return buf ? buf->data : NULL; }
size_t lmk_buffer_stride(const lmk_buffer *buf, int axis)
{
    return buf && axis >= 0 && axis < buf->ndim ? buf->stride[axis] : 0;
}

int lmk_buffer_is_contiguous(const lmk_buffer *buf)
{
    if (!buf)
        return 0;
    if (buf->element_count == 0)
        return 1; /* no element: none is out of place, whatever the strides */
    size_t want = 1;
    for (int i = buf->ndim - 1; i >= 0; i--) {
        if (buf->shape[i] != 1 && buf->stride[i] != want)
            return 0;
        want *= buf->shape[i];
    }
    return 1;
}
