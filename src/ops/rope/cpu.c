/*
 * cpu.c - the CPU fast path of rope: every mode, scaling, position type and strided layout of
 * lmk.h's lmk_rope, on one tensor or on q and k sharing positions.
 *
 * Work is split by rows (token-major; within a token the q heads, then the k heads), so each
 * thread computes the cos/sin table of a token once and applies it to every head of both tensors.
 * The table is built by src/cpu/rope_angles.h, which lmk_attn_prologue uses too: per thread and
 * chunk of pairs, the angle factor freq(p) and the pair's position axis (src/ops/rope_math.h's
 * rules of every mode, the YaRN ramp and freq_factors); per token, theta = pos * freq in double,
 * then m*cos and m*sin rounded to f32 by lmk_cpu_sincos (src/cpu/sincos.c): a double reduction by
 * pi/2 and fdlibm's double polynomials in 8 or 4 lanes, the same f32 values as (float)cos/sin from
 * libm on 8M angles up to 2^40, at a small fraction of libm's cost, which would otherwise be a
 * large share of the memory time of a 24-head token (docs/cpu.md, "Angles: lmk_cpu_sincos").
 * Angles beyond LMK_CPU_SINCOS_VECTOR_MAX = 2^40 (i64 positions, freq_base < 1) use libm for the
 * token.
 *
 * Rows are then rotated in f32 with AVX-512 or AVX2 (chosen at device open): one body per loop,
 * cpu_vec.h, instantiated at both widths on cpu/vec.h's steps, which load bf16/f16 by widening
 * and store with round-to-nearest-even that gives the same bits as lmk_f32_to_bf16 /
 * lmk_f32_to_f16 (NaN included). bf16 goes in even/odd order where it can (cpu_vec.h). A row is
 * contiguous whatever the token and head strides, so strided operands (q in [q | gate], q and k in
 * place in a packed QKV buffer) take the same kernels. Elements outside the rotated pairs are byte
 * copies (nothing to do in place). Large out-of-place outputs whose every vector store and copied
 * segment starts on a cache line (every real model shape, dense or with line-multiple strides) are
 * written with streaming stores. The portable path is scalar C with libm angles.
 *
 * Memory: the table holds PAIRS_PER_CHUNK = 128 pairs (3.2 KB), which covers rope_dim <= 256 (every
 * real model) in one pass; larger rope_dim is processed chunk by chunk. Each share's table is its
 * block of the stream's scratch (lmk_cpu_scratch), not the stack of the calling thread (share 0
 * runs there), which holds frames alone and stays within lmk.h's bound at every optimisation
 * level (at -O0 the vector steps are functions of their own, LMK_CPU_STEP); no size ever reaches
 * a VLA or the heap. tests/test_small_stack.c measures it.
 */
#include "cpu/cpu.h"
#include "cpu/rope_angles.h"
#include "cpu/vec.h"
#include "ops/rope/rope.h"

#define PAIRS_PER_CHUNK 128

/* One tensor of a launch, strides in bytes. */
typedef struct rope_tensor_job {
    const unsigned char *in;
    unsigned char *out;
    size_t heads;
    size_t in_tok, in_head, out_tok, out_head;
    int in_place;
    int stream;                  /* streaming stores for this tensor's output */
    size_t ahead_tok, ahead_head; /* in place: the prefetch distance (~16 KB of rows) */
} rope_tensor_job;

typedef struct rope_job {
    lmk_stream *s;              /* its pool's scratch holds each share's table */
    lmk_cpu_isa isa;
    lmk_dtype dtype;
    size_t es;                  /* bytes per element */
    size_t head_dim, half;      /* elements; half = rope_dim / 2 pairs */
    size_t stride;              /* element distance from a pair's first element to its second */
    int interleaved;            /* NORMAL: pair p is (2p, 2p+1) */
    size_t seq, rows_per_token; /* rows: seq * (heads of q + heads of k) */
    const lmk_rope_angle *angle;
    int n_tensors;
    rope_tensor_job t[2];
} rope_job;

/* A share's table, in its block of the stream's scratch (lmk_cpu_scratch), not on the stack of
 * the calling thread, which runs share 0 (lmk.h's stack bound). */
typedef struct rope_table {
    float cos[PAIRS_PER_CHUNK], sin[PAIRS_PER_CHUNK];
    double freq[PAIRS_PER_CHUNK], theta[PAIRS_PER_CHUNK];
    unsigned char axis[PAIRS_PER_CHUNK];
    double max_freq; /* max |freq| of the chunk */
} rope_table;
_Static_assert(sizeof(rope_table) <= LMK_CPU_SCRATCH, "a share's table fits its scratch");

/* In place: the row to prefetch next (the run's k-th row prefetches the tensor's row ~16 KB later
 * in (token, head) order), walked by pointer steps. */
typedef struct rope_prefetch {
    const unsigned char *p;       /* the rotated pairs of the next row to prefetch */
    size_t left;                  /* rows of the tensor from that one to its end (0: none) */
    size_t head, heads;           /* its head, and the tensor's heads */
    ptrdiff_t head_step, tok_step; /* bytes to the next row within a token, and from a token's last row */
    size_t len, b_bytes;          /* bytes of the a segment; its b segment b_bytes on (NORMAL: 0) */
} rope_prefetch;

/* A run of consecutive heads of one token of one tensor and what to do to them. Offsets in bytes. */
typedef struct rope_rows {
    const unsigned char *in;
    unsigned char *out;
    size_t n_rows, in_rb, out_rb; /* rows, and bytes from a row to the next (head strides) */
    size_t a0, b_bytes; /* the chunk's first a element; from a pair's a to its b */
    size_t n;           /* rotate the chunk's n pairs with cos/sin c[0..n), s[0..n) */
    const float *c, *s;
    int copy;           /* copy the two gaps [gap[g][0], gap[g][1]) of each row */
    int nt;             /* streaming stores (every segment is whole cache lines) */
    size_t gap[2][2];
    int prefetch;
    rope_prefetch pf;
} rope_rows;
/* ---- rows: scalar ---- */

/* Pair i's a at ia + i*step, its b at ib + i*step (step: es split, 2*es interleaved). */
LMK_INLINE void rotate_scalar_dt(lmk_dtype dt, size_t step, const unsigned char *ia, const unsigned char *ib,
                                 unsigned char *oa, unsigned char *ob, const float *c, const float *s, size_t i0,
                                 size_t n)
{
    for (size_t i = i0; i < n; i++) {
        const float a = lmk_cpu_load_f32(dt, ia + i * step, 0), b = lmk_cpu_load_f32(dt, ib + i * step, 0);
        lmk_cpu_store_f32(dt, oa + i * step, 0, a * c[i] - b * s[i]);
        lmk_cpu_store_f32(dt, ob + i * step, 0, a * s[i] + b * c[i]);
    }
}

/* Rotates pairs [i0, n) of the chunk of one row: the portable path and the vector kernels' tails.
 * One loop per dtype and layout with a constant step, so f32 split pairs vectorise. */
static void rotate_scalar(lmk_dtype dt, int il, const unsigned char *ia, const unsigned char *ib, unsigned char *oa,
                          unsigned char *ob, const float *c, const float *s, size_t i0, size_t n)
{
    if (dt == LMK_F32)
        il ? rotate_scalar_dt(LMK_F32, 8, ia, ib, oa, ob, c, s, i0, n)
           : rotate_scalar_dt(LMK_F32, 4, ia, ib, oa, ob, c, s, i0, n);
    else if (dt == LMK_BF16)
        il ? rotate_scalar_dt(LMK_BF16, 4, ia, ib, oa, ob, c, s, i0, n)
           : rotate_scalar_dt(LMK_BF16, 2, ia, ib, oa, ob, c, s, i0, n);
    else
        il ? rotate_scalar_dt(LMK_F16, 4, ia, ib, oa, ob, c, s, i0, n)
           : rotate_scalar_dt(LMK_F16, 2, ia, ib, oa, ob, c, s, i0, n);
}

/* Copies row k's elements that no pair touches (split: [half, stride) and [stride + half,
 * head_dim), the first empty in the Hugging Face pairing; interleaved: [rope_dim, head_dim)). */
static inline void copy_gaps(const rope_rows *r, size_t k, int nt)
{
    for (int g = 0; g < 2; g++) {
        const size_t n = r->gap[g][1] - r->gap[g][0];
        unsigned char *o = r->out + k * r->out_rb + r->gap[g][0];
        const unsigned char *i = r->in + k * r->in_rb + r->gap[g][0];
        if (nt)
            lmk_cpu_stream_copy(o, i, n);
        else if (n)
            memcpy(o, i, n);
    }
}

/* In place only the rotated lines of a row are touched (a quarter of a Qwen row), a strided
 * pattern the hardware prefetchers serve poorly: loads wait on memory a row at a time.
 * Prefetching the pairs of the row ~16 KB ahead, with write intent since they will be stored,
 * keeps those loads off the critical path (the distance is not critical: docs/decisions.md,
 * "Prefetch only where the hardware prefetchers fall short"). Out of place the rows are read
 * whole, the hardware streams them, and prefetching buys nothing. The target walks the tensor's
 * rows in (token, head) order through the strides, so it never leaves the tensor. */
static inline void prefetch_ahead(rope_prefetch *f)
{
    if (!f->left)
        return;
    for (size_t l = 0; l < f->len; l += 64) {
        __builtin_prefetch(f->p + l, 1, 3);
        __builtin_prefetch(f->p + f->b_bytes + l, 1, 3); /* NORMAL: the same line again */
    }
    if (--f->left)
        f->p += ++f->head == f->heads ? (f->head = 0, f->tok_step) : f->head_step;
}

/* ---- rows: AVX2 and AVX-512, one body (cpu_vec.h) per width ---- */

#if LMK_CPU_X86
#define LMK_VEC_W 8
#include "ops/rope/cpu_vec.h"
#define LMK_VEC_W 16
#include "ops/rope/cpu_vec.h"
#endif

/* ---- runs of rows ---- */

static void rows_scalar(lmk_dtype dt, int il, const rope_rows *r)
{
    rope_prefetch pf = r->pf;
    for (size_t k = 0; k < r->n_rows; k++) {
        if (r->prefetch)
            prefetch_ahead(&pf);
        const unsigned char *ia = r->in + k * r->in_rb + r->a0;
        unsigned char *oa = r->out + k * r->out_rb + r->a0;
        rotate_scalar(dt, il, ia, ia + r->b_bytes, oa, oa + r->b_bytes, r->c, r->s, 0, r->n);
        if (r->copy)
            copy_gaps(r, k, 0);
    }
}

/* In place: where the prefetch of the run starting at (token, head) begins. */
static rope_prefetch make_prefetch(const rope_job *j, const rope_tensor_job *t, size_t token, size_t head, size_t a0,
                                   size_t n)
{
    const size_t h = head + t->ahead_head, wrap = h >= t->heads, ph = wrap ? h - t->heads : h;
    const size_t pt = token + t->ahead_tok + wrap, left = pt < j->seq ? (j->seq - pt) * t->heads - ph : 0;
    return (rope_prefetch){
        .p = left ? t->out + pt * t->out_tok + ph * t->out_head + a0 : NULL, .left = left,
        .head = ph, .heads = t->heads, .head_step = (ptrdiff_t)t->out_head,
        .tok_step = (ptrdiff_t)t->out_tok - (ptrdiff_t)((t->heads - 1) * t->out_head),
        .len = (j->interleaved ? 2 * n : n) * j->es, .b_bytes = j->interleaved ? 0 : j->stride * j->es,
    };
}

/* The run of heads [head, head + n_rows) of one token of tensor t, for pairs [p0, p0 + n). */
static void make_rows(rope_rows *r, const rope_job *j, const rope_tensor_job *t, const rope_table *tb, size_t token,
                      size_t head, size_t n_rows, size_t p0, size_t n, int copy)
{
    const size_t es = j->es, hd = j->head_dim * es, a0 = (j->interleaved ? 2 * p0 : p0) * es;
    const size_t b_bytes = j->stride * es, rot_end = 2 * j->half * es; /* interleaved: the rotated run */
    *r = (rope_rows){
        .in = t->in + token * t->in_tok + head * t->in_head,
        .out = t->out + token * t->out_tok + head * t->out_head,
        .n_rows = n_rows, .in_rb = t->in_head, .out_rb = t->out_head,
        .a0 = a0, .b_bytes = b_bytes, .n = n, .c = tb->cos, .s = tb->sin,
        .copy = copy && !t->in_place, .nt = t->stream, .prefetch = t->in_place,
    };
    if (j->interleaved) {
        r->gap[0][0] = r->gap[0][1] = rot_end;
        r->gap[1][0] = rot_end, r->gap[1][1] = hd;
    } else {
        r->gap[0][0] = j->half * es, r->gap[0][1] = b_bytes;
        r->gap[1][0] = b_bytes + j->half * es, r->gap[1][1] = hd;
    }
    if (t->in_place)
        r->pf = make_prefetch(j, t, token, head, a0, n);
}

/* Rotates pairs [p0, p0 + n) (n may be 0) of the rows [first, last) of one token, q heads first
 * then k heads, and copies their unrotated elements when `copy`. */
static void process_rows(const rope_job *j, const rope_table *tb, size_t token, size_t first, size_t last, size_t p0,
                         size_t n, int copy)
{
    size_t base = 0; /* first row of tensor ti within the token */
    for (int ti = 0; ti < j->n_tensors; base += j->t[ti].heads, ti++) {
        const rope_tensor_job *t = &j->t[ti];
        const size_t a = first > base ? first - base : 0, b = last - base < t->heads ? last - base : t->heads;
        if (last <= base || a >= b)
            continue;
        rope_rows r;
        make_rows(&r, j, t, tb, token, a, b - a, p0, n, copy);
#if LMK_CPU_X86
        if (j->isa == LMK_CPU_AVX512) {
            j->interleaved ? rows_adjacent_v16(j->dtype, &r) : rows_split_v16(j->dtype, &r);
            continue;
        }
        if (j->isa == LMK_CPU_AVX2) {
            j->interleaved ? rows_adjacent_v8(j->dtype, &r) : rows_split_v8(j->dtype, &r);
            continue;
        }
#endif
        rows_scalar(j->dtype, j->interleaved, &r);
    }
}

static void rope_task(void *ctx, int tid, int n_threads)
{
    const rope_job *j = ctx;
    const size_t rpt = j->rows_per_token;
    size_t lo, hi;
    lmk_cpu_share(j->seq * rpt, tid, n_threads, 1, &lo, &hi);
    if (lo >= hi)
        return;
    rope_table *const tb = lmk_cpu_scratch(j->s, tid);
    const int one_chunk = j->half <= PAIRS_PER_CHUNK;
    /* One pass per chunk of pairs; with a single chunk the copies ride along while the rows are
     * in L1, otherwise a last pass (n = 0 pairs) copies. */
    for (size_t p0 = 0; p0 < j->half || !one_chunk; p0 += PAIRS_PER_CHUNK) {
        const size_t n = p0 >= j->half ? 0 : j->half - p0 < PAIRS_PER_CHUNK ? j->half - p0 : PAIRS_PER_CHUNK;
        if (n)
            tb->max_freq = lmk_rope_cpu_freqs(j->angle, p0, n, tb->axis, tb->freq);
        for (size_t row = lo; row < hi;) {
            const size_t token = row / rpt, first = row % rpt;
            const size_t last = hi - row < rpt - first ? first + (hi - row) : rpt;
            if (n)
                lmk_rope_cpu_angles(j->isa, j->angle, token, tb->axis, tb->freq, tb->max_freq, n, tb->theta, tb->cos,
                                    tb->sin);
#if LMK_CPU_X86
            if (n && j->isa == LMK_CPU_AVX2 && j->dtype == LMK_BF16 && !j->interleaved)
                eo_table_v8(tb->cos, tb->sin, n);
            if (n && j->isa == LMK_CPU_AVX512 && j->dtype == LMK_BF16 && !j->interleaved)
                eo_table_v16(tb->cos, tb->sin, n);
#endif
            process_rows(j, tb, token, first, last, p0, n, one_chunk || !n);
            row += last - first;
        }
        if (!n)
            break;
    }
    if (j->t[0].stream || j->t[1].stream)
        lmk_cpu_stream_fence();
}

/* Streaming stores need every vector store 64-byte aligned: the output, its token and head
 * strides (of axes longer than 1), both rotated segments (or NORMAL's rotated run) and the copied
 * gaps all start on a cache line and are whole lines long (true for all real model shapes). */
static int can_stream(const rope_job *j, const rope_tensor_job *t, size_t bytes)
{
    const size_t es = j->es;
    const int segs = j->interleaved ? (2 * j->half * es) % 64 == 0
                                    : (j->half * es) % 64 == 0 && (j->stride * es) % 64 == 0;
    const int lines = segs && (j->head_dim * es) % 64 == 0 && (uintptr_t)t->out % 64 == 0 &&
                      (j->seq == 1 || t->out_tok % 64 == 0) && (t->heads == 1 || t->out_head % 64 == 0);
    return j->isa != LMK_CPU_SCALAR && lines && !t->in_place && bytes >= 2 * LMK_CPU_STREAM_MIN_BYTES;
}

lmk_status lmk_cpu_rope(lmk_stream *s, const void *args)
{
    const lmk_rope_args *a = args;
    rope_job j = {
        .s = s,
        .isa = lmk_cpu_stream_isa(s),
        .dtype = a->dtype,
        .es = lmk_dtype_size(a->dtype),
        .head_dim = a->head_dim,
        .half = a->rope_dim / 2,
        .stride = a->pair_stride,
        .interleaved = a->interleaved,
        .seq = a->seq_len,
        .angle = &a->angle,
        .n_tensors = a->n_tensors,
    };
    size_t bytes = 0;
    for (int ti = 0; ti < a->n_tensors; ti++) {
        const lmk_rope_tensor *t = &a->t[ti];
        j.t[ti] = (rope_tensor_job){
            .in = t->in, .out = t->out, .heads = t->n_heads,
            .in_tok = t->in_tok * j.es, .in_head = t->in_head * j.es,
            .out_tok = t->out_tok * j.es, .out_head = t->out_head * j.es,
            .in_place = t->in == t->out,
        };
        const size_t ahead = (16384 + j.head_dim * j.es - 1) / (j.head_dim * j.es); /* rows */
        j.t[ti].ahead_tok = ahead / t->n_heads, j.t[ti].ahead_head = ahead % t->n_heads;
        bytes += 2 * j.seq * t->n_heads * j.head_dim * j.es;
    }
    j.rows_per_token = j.t[0].heads + j.t[1].heads;
    for (int ti = 0; ti < a->n_tensors; ti++)
        j.t[ti].stream = can_stream(&j, &j.t[ti], bytes);
    lmk_cpu_parallel(s, bytes, rope_task, &j);
    return LMK_OK;
}
