/*
 * bench_cuda.c - device timing for `lmk bench` on CUDA devices: cudaEvent medians (optionally of
 * CUDA-graph replays, which strip launch gaps), the device-to-device copy ceiling, and the host cost
 * of one op call. Built only with the CUDA backend (the build drops tools/ *_cuda.c otherwise). It
 * uses the public API and lmk_cuda.h; failures are reported through the test kit (tst_fail), read
 * back with lmk_last_error() like the library's own.
 *
 * Method (the numbers must mean what they say): warm up first, so module loading and first-touch
 * costs stay out; take many samples and report the median, which one slow sample cannot move; time
 * on the op's own stream with events, so no host clock or launch latency enters a device time. The
 * copy ceiling rotates among buffers larger than L2 together, so it measures DRAM, like the ops
 * whose prefill shapes are far larger than L2.
 */
#include "bench_cuda.h"
#include "lmk_cuda.h"
#include "testkit.h"

#include <stdlib.h>
#include <time.h>

static lmk_status cuda_err(cudaError_t e, const char *what)
{
    (void)cudaGetLastError();
    return tst_fail(e == cudaErrorMemoryAllocation ? LMK_ERR_OUT_OF_MEMORY : LMK_ERR_DEVICE, "%s: %s (%s)", what,
                    cudaGetErrorString(e), cudaGetErrorName(e));
}

/* Checks that s is a CUDA stream, makes its device (CUDA device `ordinal`) current and returns its
 * cudaStream_t. */
static lmk_status bench_stream(lmk_stream *s, int ordinal, const char *fn, cudaStream_t *h)
{
    if (!s || lmk_device_backend(lmk_stream_device(s)) != LMK_BACKEND_CUDA)
        return tst_fail(LMK_ERR_INVALID_ARGUMENT, "%s: s must be a CUDA stream", fn);
    int cur = -1;
    const int want = ordinal;
    if (cudaGetDevice(&cur) != cudaSuccess || cur != want) {
        const cudaError_t e = cudaSetDevice(want);
        if (e != cudaSuccess)
            return cuda_err(e, fn);
    }
    *h = lmk_stream_cuda_handle(s);
    return LMK_OK;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of n samples (sorts them). */
static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof v[0], cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double host_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

lmk_status bench_cuda_time(lmk_stream *s, int ordinal, lmk_status (*fn)(void *ctx), void *ctx, int warmup, int reps,
                               int inner, int use_graph, double *median_s)
{
    static const char *const me = "bench_cuda_time";
    cudaStream_t h = 0;
    lmk_status st = bench_stream(s, ordinal, me, &h);
    if (st != LMK_OK)
        return st;
    if (!fn || !median_s || warmup < 0 || reps < 1 || inner < 1)
        return tst_fail(LMK_ERR_INVALID_ARGUMENT, "%s: fn, median_s must be set, warmup >= 0, reps and inner >= 1",
                        me);
    if (use_graph && (h == 0 || h == cudaStreamLegacy))
        return tst_fail(LMK_ERR_INVALID_ARGUMENT, "%s: the legacy default stream cannot be captured into a graph",
                        me);

    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cudaEvent_t ev[2] = {NULL, NULL};
    double *samples = malloc((size_t)reps * sizeof *samples);
    cudaError_t e = cudaSuccess;
    if (!samples)
        return tst_fail(LMK_ERR_OUT_OF_MEMORY, "%s: out of host memory", me);

    for (int i = 0; i < warmup && st == LMK_OK; i++)
        st = fn(ctx);
    if (st != LMK_OK)
        goto done;
    if (use_graph) {
        if ((e = cudaStreamBeginCapture(h, cudaStreamCaptureModeThreadLocal)) != cudaSuccess) {
            st = cuda_err(e, "bench_cuda_time: cudaStreamBeginCapture");
            goto done;
        }
        for (int i = 0; i < inner && st == LMK_OK; i++)
            st = fn(ctx);
        e = cudaStreamEndCapture(h, &graph); /* ends the capture even when fn failed */
        if (st != LMK_OK)
            goto done;
        if (e != cudaSuccess) {
            st = cuda_err(e, "bench_cuda_time: cudaStreamEndCapture");
            goto done;
        }
        if ((e = cudaGraphInstantiate(&exec, graph, 0)) != cudaSuccess ||
            (e = cudaGraphLaunch(exec, h)) != cudaSuccess) { /* one untimed replay: upload and warm */
            st = cuda_err(e, "bench_cuda_time: cudaGraphInstantiate/Launch");
            goto done;
        }
    }
    if ((e = cudaEventCreate(&ev[0])) != cudaSuccess || (e = cudaEventCreate(&ev[1])) != cudaSuccess ||
        (e = cudaStreamSynchronize(h)) != cudaSuccess) {
        st = cuda_err(e, "bench_cuda_time: warm-up");
        goto done;
    }
    for (int r = 0; r < reps; r++) {
        if ((e = cudaEventRecord(ev[0], h)) != cudaSuccess)
            break;
        if (use_graph) {
            if ((e = cudaGraphLaunch(exec, h)) != cudaSuccess)
                break;
        } else {
            for (int i = 0; i < inner && st == LMK_OK; i++)
                st = fn(ctx);
            if (st != LMK_OK)
                goto done;
        }
        float ms = 0;
        if ((e = cudaEventRecord(ev[1], h)) != cudaSuccess || (e = cudaEventSynchronize(ev[1])) != cudaSuccess ||
            (e = cudaEventElapsedTime(&ms, ev[0], ev[1])) != cudaSuccess)
            break;
        samples[r] = 1e-3 * (double)ms / inner;
    }
    if (e != cudaSuccess) {
        st = cuda_err(e, "bench_cuda_time: timing");
        goto done;
    }
    *median_s = median(samples, reps);
done:
    if (exec)
        (void)cudaGraphExecDestroy(exec);
    if (graph)
        (void)cudaGraphDestroy(graph);
    for (int i = 0; i < 2; i++)
        if (ev[i])
            (void)cudaEventDestroy(ev[i]);
    free(samples);
    return st;
}

enum { CEIL_MAX_SETS = 64, CEIL_REPS = 31 };

/* One call issues one device-to-device copy of `bytes`, as cudaMemcpyAsync calls of at most `piece`
 * bytes, from the next of `sets` buffer pairs. */
typedef struct {
    cudaStream_t h;
    void *const *src, *const *dst;
    size_t sets, bytes, piece, next;
    const char *what; /* names the form in an error */
} copy_ctx;

static lmk_status copy_once(void *vctx)
{
    copy_ctx *c = vctx;
    const size_t i = c->next++ % c->sets;
    for (size_t o = 0; o < c->bytes; o += c->piece) {
        const cudaError_t e = cudaMemcpyAsync((char *)c->dst[i] + o, (const char *)c->src[i] + o,
                                              c->bytes - o < c->piece ? c->bytes - o : c->piece,
                                              cudaMemcpyDeviceToDevice, c->h);
        if (e != cudaSuccess)
            return cuda_err(e, c->what);
    }
    return LMK_OK;
}

/* The ceiling is timed exactly as the ops are, by the ops' own timer (bench_cuda_time: a graph of
 * `inner` back-to-back calls, replayed CEIL_REPS times): here each call is one device-to-device
 * copy, rotating among buffer sets. Timing one copy per event pair instead would charge each copy a launch gap that the
 * ops do not pay, and put the ceiling below what the ops reach. Copies above 64 MiB are timed
 * twice, whole and as 64 MiB cudaMemcpyAsync pieces, and the faster counts: one large copy can
 * take the copy engine's slow form depending on its buffers, where 64 MiB pieces of the same copy
 * do not (docs/bench.md, "The ceiling"). */
lmk_status bench_cuda_copy_ceiling(lmk_stream *s, int ordinal, size_t bytes, double *bytes_per_s)
{
    static const char *const me = "bench_cuda_copy_ceiling";
    const size_t piece = (size_t)64 << 20;
    cudaStream_t h = 0;
    lmk_status st = bench_stream(s, ordinal, me, &h);
    if (st != LMK_OK)
        return st;
    if (!bytes_per_s || bytes == 0)
        return tst_fail(LMK_ERR_INVALID_ARGUMENT, "%s: bytes_per_s must be set and bytes > 0", me);
    /* Copy a whole number of 4 KiB pages: an odd-sized copy can take the copy engine's slow form
     * and let ops "beat" their ceiling. The bandwidth is per byte, so the rounding costs nothing.
     * (Round sizes can hit the same slow form: the 64 MiB pieces below are what avoid it.) */
    if (bytes >= ((size_t)1 << 20))
        bytes &= ~(size_t)4095;

    int l2 = 0;
    (void)cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, ordinal);
    size_t sets = (4 * (size_t)(l2 > 0 ? l2 : 0) + 2 * bytes - 1) / (2 * bytes);
    sets = sets < 1 ? 1 : sets > CEIL_MAX_SETS ? CEIL_MAX_SETS : sets;
    const int inner = bytes < ((size_t)1 << 20) ? 100 : 10;

    void *src[CEIL_MAX_SETS] = {0}, *dst[CEIL_MAX_SETS] = {0};
    cudaError_t e = cudaSuccess;
    for (size_t i = 0; i < sets && e == cudaSuccess; i++) {
        if ((e = cudaMalloc(&src[i], bytes)) == cudaSuccess && (e = cudaMalloc(&dst[i], bytes)) == cudaSuccess)
            e = cudaMemsetAsync(src[i], 0x5a, bytes, h); /* never time copies of untouched pages */
    }
    double sec = 0, sec_pieces = 0;
    if (e != cudaSuccess)
        st = cuda_err(e, "bench_cuda_copy_ceiling: buffers");
    copy_ctx c = {h, src, dst, sets, bytes, bytes, 0, "bench_cuda_copy_ceiling: one cudaMemcpyAsync per copy"};
    if (st == LMK_OK)
        st = bench_cuda_time(s, ordinal, copy_once, &c, 3, CEIL_REPS, inner, 1, &sec);
    if (st == LMK_OK && bytes > piece) {
        c.piece = piece;
        c.what = "bench_cuda_copy_ceiling: 64 MiB pieces";
        st = bench_cuda_time(s, ordinal, copy_once, &c, 3, CEIL_REPS, inner, 1, &sec_pieces);
        if (st == LMK_OK && sec_pieces < sec)
            sec = sec_pieces;
    }
    if (st == LMK_OK)
        *bytes_per_s = 2.0 * (double)bytes / sec;
    for (size_t i = 0; i < sets; i++) {
        if (src[i])
            (void)cudaFree(src[i]);
        if (dst[i])
            (void)cudaFree(dst[i]);
    }
    return st;
}

lmk_status bench_cuda_host_cost(lmk_stream *s, int ordinal, lmk_status (*fn)(void *ctx), void *ctx, int calls,
                                    double *median_s)
{
    static const char *const me = "bench_cuda_host_cost";
    cudaStream_t h = 0;
    lmk_status st = bench_stream(s, ordinal, me, &h);
    if (st != LMK_OK)
        return st;
    if (!fn || !median_s || calls < 1)
        return tst_fail(LMK_ERR_INVALID_ARGUMENT, "%s: fn and median_s must be set and calls >= 1", me);
    double *samples = malloc((size_t)calls * sizeof *samples);
    if (!samples)
        return tst_fail(LMK_ERR_OUT_OF_MEMORY, "%s: out of host memory", me);
    cudaError_t e = cudaSuccess;
    for (int i = 0; i < calls && st == LMK_OK && e == cudaSuccess; i++) {
        if (i % 64 == 0 && (e = cudaStreamSynchronize(h)) != cudaSuccess)
            break;
        const double t0 = host_now();
        st = fn(ctx);
        samples[i] = host_now() - t0;
    }
    if (st == LMK_OK && e == cudaSuccess)
        e = cudaStreamSynchronize(h);
    if (st == LMK_OK && e != cudaSuccess)
        st = cuda_err(e, "bench_cuda_host_cost: cudaStreamSynchronize");
    if (st == LMK_OK)
        *median_s = median(samples, calls);
    free(samples);
    return st;
}
