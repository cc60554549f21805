/*
 * repeat_tiled.c - the CPU fast path of repeat_tiled (tiled GQA head broadcast).
 *
 * dst[t, i, :] = src[t, i % hg, :] means the destination token t is its source token (hg*k
 * elements, `block` bytes) written h/hg times back to back. So the whole op is one sequential
 * write of the destination, in which each source token is read once from memory and re-read
 * from L1 for its other copies: the op moves src + dst bytes, the least possible. Bytes are
 * copied as bytes, so every element size is bit-exact.
 *
 * Threads split the destination bytes into contiguous 64-byte-aligned ranges (a range may start
 * or end inside a token, which balances seq = 1 as well as long prompts). Large outputs use
 * streaming stores when every block starts 16-byte aligned; otherwise memcpy.
 */
#include "cpu/cpu.h"

typedef struct repeat_job {
    const unsigned char *src;
    unsigned char *dst;
    size_t block;  /* bytes of one source token, hg*k*elem_size */
    size_t reps;   /* h / hg: copies of each source token */
    size_t total;  /* destination bytes */
    int stream;    /* streaming stores: dst and block are 16-byte aligned */
} repeat_job;

static void repeat_task(void *ctx, int tid, int n_threads)
{
    const repeat_job *j = ctx;
    size_t lo, hi;
    lmk_cpu_share(j->total, tid, n_threads, 64, &lo, &hi);
    if (lo >= hi)
        return;
    const size_t first = lo / j->block; /* destination block (token, copy) the range starts in */
    size_t off = lo % j->block, rep = first % j->reps;
    const unsigned char *src = j->src + first / j->reps * j->block;
    for (size_t pos = lo; pos < hi;) {
        const size_t n = j->block - off < hi - pos ? j->block - off : hi - pos;
        if (j->stream)
            lmk_cpu_stream_copy(j->dst + pos, src + off, n);
        else
            memcpy(j->dst + pos, src + off, n);
        pos += n;
        off = 0;
        if (++rep == j->reps) {
            rep = 0;
            src += j->block;
        }
    }
    if (j->stream)
        lmk_cpu_stream_fence();
}

lmk_status lmk_cpu_repeat_tiled(lmk_stream *s, const lmk_repeat_args *a)
{
    /* Validation guarantees every size > 0, h % hg == 0 and no overflow of seq*h*k*elem_size. */
    repeat_job j = {
        .src = a->src,
        .dst = a->dst,
        .block = a->hg * a->k * a->elem_size,
        .reps = a->h / a->hg,
    };
    j.total = a->seq * j.reps * j.block;
    j.stream = j.total >= LMK_CPU_STREAM_MIN_BYTES && (uintptr_t)j.dst % 16 == 0 && j.block % 16 == 0;
    lmk_cpu_parallel(s, j.total + a->seq * j.block, repeat_task, &j);
    return LMK_OK;
}
