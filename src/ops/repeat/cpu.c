/*
 * cpu.c - the CPU fast path of repeat_heads (GQA head broadcast, tiled or block, strided).
 *
 * Dense operands take the block path below; strided ones copy one head row (k elements) at a time
 * through the strides, threads splitting the (token, head) rows (rows_task).
 *
 * Dense tiled: dst[t, i, :] = src[t, i % hg, :] means the destination token t is its source token (hg*k
 * elements, `block` bytes) written h/hg times back to back. Dense block: dst[t, i, :] =
 * src[t, i / (h/hg), :] means each source head row (k elements) is written h/hg times back to back,
 * so the same path runs with one head row as the block and seq*hg blocks. Either way the whole op
 * is one sequential write of the destination, in which each source block is read once from memory
 * and re-read from L1 for its other copies: the op moves src + dst bytes, the least possible. Bytes
 * are copied as bytes, so every element size is bit-exact.
 *
 * Threads split the destination bytes into contiguous 64-byte-aligned ranges (a range may start
 * or end inside a token, which balances seq = 1 as well as long prompts). Large outputs use
 * streaming stores when every block starts 16-byte aligned; otherwise memcpy.
 */
#include "cpu/cpu.h"
#include "ops/repeat/repeat.h"

typedef struct repeat_job {
    const unsigned char *src;
    unsigned char *dst;
    size_t block;  /* bytes of one source block: a token (hg*k elements) or a head row (k) */
    size_t reps;   /* h / hg: copies of each source block */
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

/* Tokens ahead whose source rows a thread prefetches: a strided source (k inside a packed QKV)
 * is a short run in every long row, which the hardware prefetchers follow poorly. */
enum { kAhead = 2 };

typedef struct rows_job {
    const lmk_repeat_args *a;
    int stream; /* streaming stores: the output is large and every destination row 16-byte aligned */
} rows_job;

/* Strided operands: row r = (token, head) of dst is one copy of k elements from its source row.
 * A thread walks its rows with running indices (one division per thread, not two per row), and
 * large outputs whose rows all start 16-byte aligned take streaming stores, as the dense path. */
static void rows_task(void *ctx, int tid, int n_threads)
{
    const rows_job *j = ctx;
    const lmk_repeat_args *a = j->a;
    size_t lo, hi;
    lmk_cpu_share(a->seq * a->h, tid, n_threads, 1, &lo, &hi);
    if (lo >= hi)
        return;
    const size_t es = a->elem_size, row = a->k * es, per = a->h / a->hg;
    const size_t src_tok = a->src_tok * es, src_head = a->src_head * es;
    const size_t dst_tok = a->dst_tok * es, dst_head = a->dst_head * es;
    const bool block = a->layout == LMK_REPEAT_BLOCK;
    size_t t = lo / a->h, i = lo % a->h;
    size_t g = block ? i / per : i % a->hg, c = block ? i % per : 0; /* c: copies of g made so far */
    for (size_t r = lo; r < hi; r++) {
        if (i == 0 && t + kAhead < a->seq) /* a token's source rows, kAhead tokens early */
            for (size_t h = 0; h < a->hg; h++)
                for (size_t l = 0; l < row; l += 64)
                    __builtin_prefetch(a->src + (t + kAhead) * src_tok + h * src_head + l, 0, 3);
        unsigned char *d = a->dst + t * dst_tok + i * dst_head;
        const unsigned char *src = a->src + t * src_tok + g * src_head;
        if (j->stream)
            lmk_cpu_stream_copy(d, src, row);
        else
            memcpy(d, src, row);
        if (++i == a->h) {
            i = 0, g = 0, c = 0, t++;
        } else if (block) {
            if (++c == per)
                c = 0, g++;
        } else if (++g == a->hg) {
            g = 0;
        }
    }
    if (j->stream)
        lmk_cpu_stream_fence();
}

/* Whether every stride that is used (axes longer than 1) is the dense row-major one. */
static bool dense(const lmk_repeat_args *a)
{
    const bool heads = (a->hg == 1 || a->src_head == a->k) && (a->h == 1 || a->dst_head == a->k);
    return heads && (a->seq == 1 || (a->src_tok == a->hg * a->k && a->dst_tok == a->h * a->k));
}

lmk_status lmk_cpu_repeat(lmk_stream *s, const void *args)
{
    const lmk_repeat_args *a = args;
    if (!dense(a)) {
        const size_t es = a->elem_size, out = a->seq * a->h * a->k * es;
        const bool aligned = (uintptr_t)a->dst % 16 == 0 && (a->k * es) % 16 == 0 &&
                             (a->seq == 1 || (a->dst_tok * es) % 16 == 0) &&
                             (a->h == 1 || (a->dst_head * es) % 16 == 0);
        rows_job rj = {.a = a, .stream = out >= LMK_CPU_STREAM_MIN_BYTES && aligned};
        lmk_cpu_parallel(s, out + a->seq * a->hg * a->k * es, rows_task, &rj);
        return LMK_OK;
    }
    /* Blocks of a token's hg*k elements whenever the layouts agree (tiled, or hg == h, or
     * hg == 1); blocks of one head row in the block layout. Validation guarantees every size > 0,
     * h % hg == 0 and no overflow of seq*h*k*elem_size. */
    const bool tiled = a->layout == LMK_REPEAT_TILED || a->hg == a->h || a->hg == 1;
    const size_t n_blocks = tiled ? a->seq : a->seq * a->hg;
    repeat_job j = {
        .src = a->src,
        .dst = a->dst,
        .block = (tiled ? a->hg * a->k : a->k) * a->elem_size,
        .reps = a->h / a->hg,
    };
    j.total = n_blocks * j.reps * j.block;
    j.stream = j.total >= LMK_CPU_STREAM_MIN_BYTES && (uintptr_t)j.dst % 16 == 0 && j.block % 16 == 0;
    lmk_cpu_parallel(s, j.total + n_blocks * j.block, repeat_task, &j);
    return LMK_OK;
}
