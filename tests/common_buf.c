/*
 * common_buf.c - devices, buffers and message checks for the tests (poison, guards and the
 * guarded device memory of a case are in testkit/mem.c).
 *
 * Every op test runs on each backend this machine has: the CPU always, CUDA when a GPU is usable.
 * Without one, the CUDA cases are reported with a visible SKIP line, so the same binary runs in CI
 * and on a GPU host and the summary says what was not run.
 */
#include "common.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int tst_devs_open(tst_dev devs[TST_MAX_DEVS])
{
    int n = 0;
    memset(devs, 0, sizeof(tst_dev) * TST_MAX_DEVS);

    tst_dev *d = &devs[n];
    lmk_status st = lmk_device_open(LMK_BACKEND_CPU, 0, &d->dev);
    if (TST_REQUIRE(st == LMK_OK, "open cpu device: %s: %s", lmk_status_name(st), lmk_last_error())) {
        st = lmk_stream_create(d->dev, &d->stream);
        if (TST_REQUIRE(st == LMK_OK, "cpu stream: %s: %s", lmk_status_name(st), lmk_last_error())) {
            snprintf(d->name, sizeof d->name, "cpu");
            d->backend = LMK_BACKEND_CPU;
            TST_PASS("open the cpu device and a stream");
            n++;
        } else {
            lmk_device_close(d->dev);
            d->dev = NULL;
        }
    }

    const int n_cuda = lmk_device_count(LMK_BACKEND_CUDA);
    if (n_cuda <= 0) {
#ifdef LMK_WITH_CUDA
        SKIP("cuda: lmk_device_count(LMK_BACKEND_CUDA) is 0 (no usable GPU); CUDA cases not run");
#else
        SKIP("cuda: this build has no CUDA backend; CUDA cases not run");
#endif
        return n;
    }
    d = &devs[n];
    st = lmk_device_open(LMK_BACKEND_CUDA, 0, &d->dev);
    if (TST_REQUIRE(st == LMK_OK, "open cuda device 0: %s: %s", lmk_status_name(st), lmk_last_error())) {
        st = lmk_stream_create(d->dev, &d->stream);
        if (TST_REQUIRE(st == LMK_OK, "cuda stream: %s: %s", lmk_status_name(st), lmk_last_error())) {
            snprintf(d->name, sizeof d->name, "cuda:0");
            d->backend = LMK_BACKEND_CUDA;
            TST_PASS("open cuda device 0 and a stream");
            n++;
        } else {
            lmk_device_close(d->dev);
            d->dev = NULL;
        }
    }
    return n;
}

/* Opens a CPU device and stream with LMK_CPU_ISA set to `isa` during the open, and a stream of
 * n_threads threads: odd counts, so work splits that only go wrong when shares are uneven show. */
static bool open_cpu_capped(tst_dev *d, const char *isa, int n_threads)
{
    memset(d, 0, sizeof *d);
    setenv("LMK_CPU_ISA", isa, 1);
    lmk_status st = lmk_device_open(LMK_BACKEND_CPU, 0, &d->dev);
    unsetenv("LMK_CPU_ISA");
    if (!TST_REQUIRE(st == LMK_OK, "open cpu capped at %s: %s: %s", isa, lmk_status_name(st), lmk_last_error()))
        return false;
    st = lmk_device_set_threads(d->dev, n_threads);
    if (st == LMK_OK)
        st = lmk_stream_create(d->dev, &d->stream);
    if (!TST_REQUIRE(st == LMK_OK, "cpu/%s stream: %s: %s", isa, lmk_status_name(st), lmk_last_error())) {
        lmk_device_close(d->dev);
        d->dev = NULL;
        return false;
    }
    if (!TST_REQUIRE(strstr(lmk_device_name(d->dev), isa) != NULL, "cpu capped at %s is named \"%s\"", isa,
                     lmk_device_name(d->dev))) {
        lmk_stream_destroy(d->stream);
        lmk_device_close(d->dev);
        memset(d, 0, sizeof *d);
        return false;
    }
    snprintf(d->name, sizeof d->name, "cpu/%s/%dt", isa, n_threads);
    d->backend = LMK_BACKEND_CPU;
    d->isa_variant = true;
    return true;
}

int tst_devs_open_isas(tst_dev devs[TST_MAX_DEVS])
{
    int n = tst_devs_open(devs);
    const char *user = getenv("LMK_CPU_ISA");
    if ((user && *user) || n == 0 || devs[0].backend != LMK_BACKEND_CPU)
        return n;
    const char *name = lmk_device_name(devs[0].dev);
    const bool has512 = strstr(name, "avx512") != NULL, has2 = has512 || strstr(name, "avx2") != NULL;
    if (has512 && n < TST_MAX_DEVS && open_cpu_capped(&devs[n], "avx2", 3))
        n++;
    if (has2 && n < TST_MAX_DEVS && open_cpu_capped(&devs[n], "scalar", 5))
        n++;
    return n;
}

void tst_devs_close(tst_dev *devs, int n)
{
    for (int i = 0; i < n; i++) {
        lmk_stream_destroy(devs[i].stream);
        lmk_device_close(devs[i].dev);
        devs[i].stream = NULL;
        devs[i].dev = NULL;
    }
}

lmk_buffer *tst_buf(lmk_device *dev, lmk_dtype dtype, const size_t *shape, int ndim, size_t used, size_t extra,
                    const void *init, size_t init_len, int fill)
{
    lmk_buffer *b = NULL;
    const size_t len = used + extra;
    lmk_status st = lmk_buffer_alloc(dev, len, dtype, shape, ndim, &b);
    if (!TST_REQUIRE(st == LMK_OK, "lmk_buffer_alloc(%zu bytes, %s): %s: %s", len, lmk_dtype_name(dtype),
               lmk_status_name(st), lmk_last_error()))
        return NULL;
    if (init_len > len)
        init_len = len;
    if (fill >= 0 && init_len < len) {
        unsigned char *tmp = malloc(len - init_len);
        if (!tmp) {
            TST_FAIL("out of host memory for a %zu-byte fill", len - init_len);
            lmk_buffer_free(b);
            return NULL;
        }
        memset(tmp, fill, len - init_len);
        st = lmk_buffer_write(b, init_len, tmp, len - init_len);
        free(tmp);
        if (!TST_REQUIRE(st == LMK_OK, "buffer fill: %s: %s", lmk_status_name(st), lmk_last_error())) {
            lmk_buffer_free(b);
            return NULL;
        }
    }
    if (init && init_len) {
        st = lmk_buffer_write(b, 0, init, init_len);
        if (!TST_REQUIRE(st == LMK_OK, "buffer write: %s: %s", lmk_status_name(st), lmk_last_error())) {
            lmk_buffer_free(b);
            return NULL;
        }
    }
    return b;
}

void *tst_read_all(const lmk_buffer *b)
{
    const size_t n = lmk_buffer_byte_len(b);
    void *p = malloc(n ? n : 1);
    if (!p) {
        TST_FAIL("out of host memory for a %zu-byte read", n);
        return NULL;
    }
    const lmk_status st = lmk_buffer_read(b, 0, p, n);
    if (!TST_REQUIRE(st == LMK_OK, "lmk_buffer_read(%zu bytes): %s: %s", n, lmk_status_name(st), lmk_last_error())) {
        free(p);
        return NULL;
    }
    return p;
}

bool tst_msg_has(const char *first, ...)
{
    const char *msg = lmk_last_error();
    bool ok = msg != NULL;
    va_list ap;
    va_start(ap, first);
    for (const char *s = first; s && ok; s = va_arg(ap, const char *))
        ok = strstr(msg, s) != NULL;
    va_end(ap);
    return ok;
}
