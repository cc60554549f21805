/*
 * cuda_kernels_bench.c - the CUDA backend's own check-and-time driver, run on the GPU machine in one
 * call (docs/cuda_notes.md has the command and the results). Not a test_*.c: the build does not run
 * it; build it by hand against build/liblmk.a (see docs/cuda_notes.md).
 *
 *   cuda_kernels_bench [--quick] [--no-time] [--time-only] [--filter TEXT]
 *
 *   --quick      small sweep, no timing (for compute-sanitizer)
 *   --time-only  skip the sweep;  --filter TEXT  time only the rows whose name contains TEXT
 *
 * Part 1, a correctness sweep aimed at every path of the kernels, each against the float64
 * references on host copies: repeat_tiled at element sizes 1, 2, 4 and 8 bytes (8 through the
 * backend table, which no dtype reaches) with base offsets that force each access width, the 64-bit
 * index path (T = 2^21, 2^31 output elements) and T = 2^20; rope_multi in f32/bf16/f16, both
 * pairings, MROPE/IMROPE, odd and degenerate sections, one tensor and Q+K, in and out of place,
 * offsets that force each unit width, NaN payloads in copied elements, |positions| up to 2^20 and
 * T = 2^20. Outputs are poisoned first and guard bytes after them must survive.
 * Part 2 (unless --no-time or --quick), the timing of the targets of docs/cuda_notes.md against the
 * copy ceiling measured in the same run, with tools/bench_cuda.c.
 */
#include "bench_cuda.h"
#include "common.h"
#include "lmk_cuda.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

HARNESS_DEFINE;

enum { GUARD = 64 };

/* A view of `bytes` bytes at byte offset `off` of a fresh buffer of off + bytes + GUARD bytes, the
 * whole buffer filled with `fill`. */
typedef struct vbuf {
    lmk_buffer *parent, *view;
    size_t off, bytes;
} vbuf;

static bool vbuf_make(lmk_device *dev, vbuf *v, lmk_dtype dt, size_t off, size_t bytes, unsigned fill)
{
    memset(v, 0, sizeof *v);
    v->off = off;
    v->bytes = bytes;
    const size_t total = off + bytes + GUARD;
    unsigned char *tmp = malloc(total);
    if (!TST_REQUIRE(tmp != NULL, "out of host memory"))
        return false;
    memset(tmp, (int)fill, total);
    const size_t shape[1] = {bytes / lmk_dtype_size(dt)};
    bool ok = lmk_buffer_alloc(dev, total, LMK_U8, NULL, 0, &v->parent) == LMK_OK &&
              lmk_buffer_write(v->parent, 0, tmp, total) == LMK_OK &&
              lmk_buffer_view(v->parent, off, dt, shape, 1, &v->view) == LMK_OK;
    free(tmp);
    return TST_REQUIRE(ok, "vbuf: %s", lmk_last_error());
}

static void vbuf_free(vbuf *v)
{
    lmk_buffer_free(v->view);
    lmk_buffer_free(v->parent);
    memset(v, 0, sizeof *v);
}

/* Reads the view into got (v->bytes) and checks the bytes before and after it still hold `fill`. */
static bool vbuf_read(const vbuf *v, void *got, unsigned fill, const char *name)
{
    const size_t total = v->off + v->bytes + GUARD;
    unsigned char *all = malloc(total);
    if (!TST_REQUIRE(all != NULL, "out of host memory"))
        return false;
    bool ok = TST_REQUIRE(lmk_buffer_read(v->parent, 0, all, total) == LMK_OK, "%s: read: %s", name, lmk_last_error());
    if (ok) {
        memcpy(got, all + v->off, v->bytes);
        const long long a = tst_find_not(all, 0, v->off, fill), b = tst_find_not(all, v->off + v->bytes, total, fill);
        ok = TST_REQUIRE(a < 0 && b < 0, "%s: bytes outside the output were written (at %lld)", name, a >= 0 ? a : b);
    }
    free(all);
    return ok;
}

/* ---------------------------------------------------------------------------------------------- */
/* repeat_tiled sweep                                                                               */

static void repeat_case(lmk_device *dev, lmk_stream *s, size_t T, size_t hg, size_t h, size_t k, size_t es,
                        size_t src_off, size_t dst_off)
{
    char name[160];
    snprintf(name, sizeof name, "repeat_tiled T=%zu hg=%zu h=%zu k=%zu es=%zu src+%zu dst+%zu", T, hg, h, k, es,
             src_off, dst_off);
    tst_rng rng = tst_rng_make(tst_case_seed());
    const size_t sb = T * hg * k * es, db = T * h * k * es;
    const lmk_dtype dt = es == 1 ? LMK_U8 : es == 2 ? LMK_U16 : LMK_U32; /* es 8: a u32 view, twice the length */
    unsigned char *src = malloc(sb), *want = malloc(db), *got = malloc(db);
    vbuf vs, vd;
    bool ok = TST_REQUIRE(src && want && got, "out of host memory");
    ok = ok && vbuf_make(dev, &vs, dt, src_off, sb, 0x00) && vbuf_make(dev, &vd, dt, dst_off, db, TST_POISON);
    if (ok) {
        tst_fill_bytes(&rng, src, sb);
        const lmk_repeat_args ref = {src, want, T, hg, h, k, es};
        lmk_ref_repeat_tiled(&ref);
        ok = TST_REQUIRE(lmk_buffer_write(vs.view, 0, src, sb) == LMK_OK, "write: %s", lmk_last_error());
    }
    if (ok) {
        lmk_status st;
        if (es == 8) { /* no dtype has 8 bytes: call the backend with validated-style arguments */
            const lmk_repeat_args a = {lmk_buffer_data(vs.view), lmk_buffer_data(vd.view), T, hg, h, k, 8};
            st = lmk_cuda_backend.repeat_tiled(s, &a);
        } else {
            const lmk_repeat_tiled_params p = {(uint32_t)T, (uint32_t)hg, (uint32_t)h, (uint32_t)k};
            st = lmk_repeat_tiled(s, vs.view, vd.view, &p);
        }
        if (st == LMK_OK)
            st = lmk_stream_sync(s);
        ok = TST_REQUIRE(st == LMK_OK, "%s: %s: %s", name, lmk_status_name(st), lmk_last_error()) &&
             vbuf_read(&vd, got, TST_POISON, name);
    }
    if (ok) {
        const long long d = tst_bits_diff(got, want, db);
        ok = TST_REQUIRE(d < 0, "%s: differs from the reference at byte %lld", name, d);
    }
    if (ok)
        TST_PASS(name);
    vbuf_free(&vs);
    vbuf_free(&vd);
    free(src);
    free(want);
    free(got);
}

static void repeat_sweep(lmk_device *dev, lmk_stream *s, bool quick)
{
    static const size_t shapes[][4] = {
        {1, 16, 48, 128}, {37, 16, 32, 128}, {19, 16, 64, 128}, {5, 3, 9, 7}, {2, 1, 4, 1}, {1000, 2, 6, 3}, {3, 5, 5, 11},
    };
    static const size_t es_list[] = {1, 2, 4, 8};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (size_t e = 0; e < 4; e++) {
            const size_t es = es_list[e];
            repeat_case(dev, s, shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], es, 0, 0);
            /* offsets that leave 8-, 4-, 2- and 1-byte alignment (multiples of the element size) */
            static const size_t offs[] = {8, 4, 2, 1};
            for (size_t o = 0; o < 4; o++)
                if (offs[o] % es == 0 && offs[o] >= es) {
                    repeat_case(dev, s, shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], es, offs[o], 0);
                    repeat_case(dev, s, shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], es, 0, offs[o]);
                }
        }
    repeat_case(dev, s, (size_t)1 << 20, 1, 3, 5, 2, 0, 0); /* T = 2^20 */
    if (!quick)
        repeat_case(dev, s, (size_t)1 << 21, 1, 1024, 1, 1, 0, 0); /* 2^31 output words: 64-bit indices */
}

/* ---------------------------------------------------------------------------------------------- */
/* rope_multi sweep                                                                                 */

typedef struct rope_shape {
    uint32_t D, R, nq, nk, T; /* nk 0: one tensor (lmk_rope_multi) */
    lmk_rope_mode mode;
    uint32_t sec[4];
    float base;
} rope_shape;

static void rope_case(lmk_device *dev, lmk_stream *s, const rope_shape *sh, lmk_dtype dt, lmk_rope_pairing pairing,
                      bool in_place, size_t off_elems, bool text_pos)
{
    const size_t es = lmk_dtype_size(dt);
    const lmk_rope_multi_params p = {sh->D, sh->R, sh->nq, sh->T, sh->base, sh->mode,
                                     {sh->sec[0], sh->sec[1], sh->sec[2], sh->sec[3]}, pairing};
    char name[256], base[160];
    tst_rope_name(base, sizeof base, sh->nk ? "rope_multi_qk" : "rope_multi", &p, dt, NULL);
    snprintf(name, sizeof name, "%s nk=%u sec=[%u,%u,%u,%u] %s off=%zu%s", base, sh->nk, sh->sec[0], sh->sec[1],
             sh->sec[2], sh->sec[3], in_place ? "in-place" : "out-of-place", off_elems, text_pos ? " text" : "");
    tst_rng rng = tst_rng_make(tst_case_seed());
    const int nt = sh->nk ? 2 : 1;
    const uint32_t nh[2] = {sh->nq, sh->nk};
    void *in[2] = {0}, *got[2] = {0};
    int32_t *pos = malloc(4 * (size_t)sh->T * sizeof *pos);
    vbuf vi[2], vo[2], vp;
    memset(vi, 0, sizeof vi);
    memset(vo, 0, sizeof vo);
    memset(&vp, 0, sizeof vp);
    bool ok = TST_REQUIRE(pos != NULL, "out of host memory");
    for (int j = 0; j < nt && ok; j++) {
        const size_t n = (size_t)sh->T * nh[j] * sh->D, bytes = n * es;
        in[j] = malloc(bytes);
        got[j] = malloc(bytes);
        ok = TST_REQUIRE(in[j] && got[j], "out of host memory");
        if (!ok)
            break;
        tst_fill_float(&rng, dt, in[j], n, -2, 2);
        /* NaN payloads (and a NaN in a rotated pair) must survive: a few raw patterns */
        for (size_t i = 0; i < n; i += 97) {
            const uint32_t bits = dt == LMK_F32 ? 0x7f800001u + (uint32_t)(i & 0xffff) : 0x7f81u + (uint32_t)(i & 0x3f);
            memcpy((char *)in[j] + i * es, &bits, es);
        }
        const unsigned fill = in_place ? 0x00 : TST_POISON;
        ok = vbuf_make(dev, &vi[j], dt, off_elems * es, bytes, fill) &&
             TST_REQUIRE(lmk_buffer_write(vi[j].view, 0, in[j], bytes) == LMK_OK, "write: %s", lmk_last_error());
        if (ok && !in_place)
            ok = vbuf_make(dev, &vo[j], dt, off_elems * es, bytes, TST_POISON);
    }
    if (ok) {
        if (text_pos)
            tst_positions_text(pos, sh->T, 1 << 19);
        else
            tst_positions_random(&rng, pos, sh->T, -(1 << 20), 1 << 20);
        ok = vbuf_make(dev, &vp, LMK_I32, 0, 4 * (size_t)sh->T * 4, 0) &&
             TST_REQUIRE(lmk_buffer_write(vp.view, 0, pos, 16 * (size_t)sh->T) == LMK_OK, "write: %s", lmk_last_error());
    }
    if (ok) {
        lmk_buffer *out0 = in_place ? vi[0].view : vo[0].view, *out1 = in_place ? vi[1].view : vo[1].view;
        lmk_status st = sh->nk ? lmk_rope_multi_qk(s, vi[0].view, out0, vi[1].view, out1, vp.view, &p, sh->nk)
                               : lmk_rope_multi(s, vi[0].view, out0, vp.view, &p);
        if (st == LMK_OK)
            st = lmk_stream_sync(s);
        ok = TST_REQUIRE(st == LMK_OK, "%s: %s: %s", name, lmk_status_name(st), lmk_last_error());
        for (int j = 0; j < nt && ok; j++)
            ok = vbuf_read(in_place ? &vi[j] : &vo[j], got[j], in_place ? 0x00 : TST_POISON, name);
    }
    if (ok) {
        lmk_rope_args a = {.dtype = dt, .head_dim = sh->D, .rope_dim = sh->R, .seq_len = sh->T, .freq_base = sh->base,
                           .mode = sh->mode, .pairing = pairing, .positions = pos, .n_tensors = nt,
                           .t = {{in[0], NULL, sh->nq}, {in[1], NULL, sh->nk}}};
        memcpy(a.sections, sh->sec, sizeof a.sections);
        char msg[512];
        const void *g[2] = {got[0], got[1]};
        ok = TST_REQUIRE(tst_rope_check(&a, g, 1e-5, msg, sizeof msg), "%s: %s", name, msg);
        if (ok && getenv("LMK_VERBOSE"))
            printf("ok %s: %s\n", name, msg);
    }
    if (ok)
        TST_PASS(name);
    for (int j = 0; j < 2; j++) {
        vbuf_free(&vi[j]);
        vbuf_free(&vo[j]);
        free(in[j]);
        free(got[j]);
    }
    vbuf_free(&vp);
    free(pos);
}

static void rope_sweep(lmk_device *dev, lmk_stream *s, bool quick)
{
    const rope_shape shapes[] = {
        {256, 64, 24, 4, 1, LMK_ROPE_IMROPE, {11, 11, 10, 0}, 1e7f},   /* qwen3.5-27B decode */
        {256, 64, 24, 4, 37, LMK_ROPE_IMROPE, {11, 11, 10, 0}, 1e7f},  /* qwen3.5-27B prefill */
        {256, 64, 32, 2, 9, LMK_ROPE_IMROPE, {11, 11, 10, 0}, 1e7f},   /* qwen3.5-122B */
        {128, 128, 28, 4, 5, LMK_ROPE_MROPE, {16, 24, 24, 0}, 1e6f},   /* qwen2-vl-7B */
        {128, 128, 32, 8, 3, LMK_ROPE_IMROPE, {24, 20, 20, 0}, 5e6f},  /* qwen3-vl-8B */
        {16, 8, 1, 0, 1, LMK_ROPE_IMROPE, {2, 2, 1, 0}, 2.0f},         /* seed vector shape */
        {32, 16, 4, 0, 6, LMK_ROPE_IMROPE, {3, 3, 2, 0}, 1e4f},
        {10, 6, 3, 2, 7, LMK_ROPE_MROPE, {1, 1, 1, 0}, 1e4f},          /* half 3: one-element units */
        {20, 4, 2, 3, 5, LMK_ROPE_IMROPE, {1, 0, 1, 0}, 100.0f},       /* half 2 */
        {24, 16, 2, 1, 4, LMK_ROPE_IMROPE, {0, 0, 0, 0}, 1e4f},        /* sections sum 0: all axis e */
        {64, 32, 3, 1, 4, LMK_ROPE_MROPE, {0xffffffffu, 0xffffffffu, 5, 0}, 1e4f}, /* huge sections */
        {32, 32, 2, 1, 3, LMK_ROPE_MROPE, {3, 2, 1, 0}, 1e4f},         /* sum 6 < 16 pairs: wraps */
        {48, 40, 2, 2, 3, LMK_ROPE_IMROPE, {2, 3, 1, 1}, 1e4f},        /* sum 7 < 20 pairs, axis e */
        {2, 2, 1, 0, 33, LMK_ROPE_IMROPE, {1, 0, 0, 0}, 1e4f},
        {4200, 4200, 2, 1, 3, LMK_ROPE_IMROPE, {11, 11, 10, 0}, 1e7f},    /* 2100 pairs: two table chunks */
        {4400, 4196, 2, 1, 3, LMK_ROPE_MROPE, {700, 700, 698, 0}, 1e7f},  /* 2098 pairs: 8-byte units */
        /* small T: the decode kernel (T x row groups <= 2 per SM) */
        {256, 64, 24, 4, 3, LMK_ROPE_IMROPE, {11, 11, 10, 0}, 1e7f},    /* qwen3.5-27B, 3 tokens */
        {256, 64, 24, 0, 2, LMK_ROPE_IMROPE, {11, 11, 10, 0}, 1e7f},    /* q alone, 2 tokens */
        {2048, 2048, 2, 1, 2, LMK_ROPE_IMROPE, {11, 11, 10, 0}, 1e7f},  /* 1024 pairs: angles > threads */
        {1032, 1000, 3, 2, 1, LMK_ROPE_MROPE, {100, 200, 150, 50}, 1e6f}, /* 500 pairs: 4-element units, axis e */
    };
    /* The general kernel at the odd shapes too: T large enough (300 > 2 blocks per SM of 132 SMs)
     * that the small-T kernel is not chosen for them. */
    static const size_t general_from = 5, general_to = 14;
    static const lmk_dtype dts[] = {LMK_F32, LMK_BF16, LMK_F16};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int d = 0; d < 3; d++)
            for (int pairing = 0; pairing < 2; pairing++)
                for (int ip = 0; ip < 2; ip++) {
                    rope_case(dev, s, &shapes[i], dts[d], (lmk_rope_pairing)pairing, ip, 0, false);
                    if (i < 2 || i == 6) /* offsets of 1, 2, 4 elements: every unit width */
                        for (size_t off = 1; off <= 4; off *= 2)
                            rope_case(dev, s, &shapes[i], dts[d], (lmk_rope_pairing)pairing, ip, off, false);
                }
    for (size_t i = general_from; i < general_to; i++) {
        rope_shape sh = shapes[i];
        sh.T = 300;
        for (int d = 0; d < 3; d++)
            for (int pairing = 0; pairing < 2; pairing++)
                for (int ip = 0; ip < 2; ip++)
                    rope_case(dev, s, &sh, dts[d], (lmk_rope_pairing)pairing, ip, 0, false);
    }
    rope_case(dev, s, &shapes[1], LMK_F32, LMK_ROPE_PAIR_HALF_ROPE, false, 0, true);
    const rope_shape big = {2, 2, 1, 1, quick ? 4096u : 1u << 20, LMK_ROPE_IMROPE, {11, 11, 10, 0}, 1e7f};
    rope_case(dev, s, &big, LMK_F32, LMK_ROPE_PAIR_HALF_ROPE, false, 0, false); /* T = 2^20 */
    const rope_shape big2 = {256, 64, 24, 4, quick ? 300u : 4106u, LMK_ROPE_IMROPE, {11, 11, 10, 0}, 1e7f};
    rope_case(dev, s, &big2, LMK_BF16, LMK_ROPE_PAIR_HALF_ROPE, false, 0, false);
    rope_case(dev, s, &big2, LMK_F32, LMK_ROPE_PAIR_HALF_ROPE, true, 0, false);
}

/* ---------------------------------------------------------------------------------------------- */
/* timing                                                                                           */

enum { MAX_SETS = 8 };

typedef struct op_ctx {
    lmk_stream *s;
    int n_sets, cur;
    bool rope, in_place;
    lmk_buffer *in[MAX_SETS][2], *out[MAX_SETS][2], *pos;
    lmk_rope_multi_params rp;
    uint32_t nk;
    lmk_repeat_tiled_params pp;
} op_ctx;

static lmk_status op_fn(void *c)
{
    op_ctx *x = c;
    const int i = x->cur++ % x->n_sets;
    if (x->rope)
        return lmk_rope_multi_qk(x->s, x->in[i][0], x->out[i][0], x->in[i][1], x->out[i][1], x->pos, &x->rp, x->nk);
    return lmk_repeat_tiled(x->s, x->in[i][0], x->out[i][0], &x->pp);
}

static void op_ctx_free(op_ctx *x)
{
    for (int i = 0; i < MAX_SETS; i++)
        for (int j = 0; j < 2; j++) {
            if (x->out[i][j] != x->in[i][j])
                lmk_buffer_free(x->out[i][j]);
            lmk_buffer_free(x->in[i][j]);
        }
    lmk_buffer_free(x->pos);
    memset(x, 0, sizeof *x);
}

static lmk_buffer *random_buffer(lmk_device *dev, lmk_dtype dt, size_t n, tst_rng *rng)
{
    const size_t bytes = n * lmk_dtype_size(dt);
    void *h = malloc(bytes);
    lmk_buffer *b = NULL;
    if (!h)
        return NULL;
    if (dt == LMK_I32) {
        tst_positions_random(rng, h, (uint32_t)(n / 4), -(1 << 20), 1 << 20);
    } else {
        /* one random block repeated: fast to make, and never zeros */
        const size_t blk = n < 65536 ? n : 65536;
        tst_fill_float(rng, dt == LMK_U8 ? LMK_BF16 : dt, h, blk, -2, 2);
        for (size_t i = blk; i < n; i += blk)
            memcpy((char *)h + i * lmk_dtype_size(dt), h, (n - i < blk ? n - i : blk) * lmk_dtype_size(dt));
    }
    if (lmk_buffer_alloc(dev, bytes, dt, NULL, 0, &b) != LMK_OK || lmk_buffer_write(b, 0, h, bytes) != LMK_OK) {
        lmk_buffer_free(b);
        b = NULL;
    }
    free(h);
    return b;
}

/* Enough sets that the op's working set exceeds four L2s (at least 2). */
static int sets_for(size_t bytes_per_set)
{
    size_t n = ((size_t)4 * 50 * 1000 * 1000 + bytes_per_set - 1) / bytes_per_set;
    return n < 2 ? 2 : n > MAX_SETS ? MAX_SETS : (int)n;
}

static bool make_rope_ctx(lmk_device *dev, lmk_stream *s, op_ctx *x, lmk_dtype dt, uint32_t T, uint32_t nq, uint32_t nk,
                          bool in_place, tst_rng *rng)
{
    memset(x, 0, sizeof *x);
    x->s = s;
    x->rope = true;
    x->in_place = in_place;
    x->rp = (lmk_rope_multi_params){256, 64, nq, T, 1e7f, LMK_ROPE_IMROPE, {11, 11, 10, 0}, LMK_ROPE_PAIR_HALF_ROPE};
    x->nk = nk;
    const size_t nqe = (size_t)T * nq * 256, nke = (size_t)T * nk * 256;
    x->n_sets = sets_for((nqe + nke) * lmk_dtype_size(dt) * (in_place ? 1 : 2));
    x->pos = random_buffer(dev, LMK_I32, 4 * (size_t)T, rng);
    bool ok = x->pos != NULL;
    for (int i = 0; i < x->n_sets && ok; i++) {
        x->in[i][0] = random_buffer(dev, dt, nqe, rng);
        x->in[i][1] = random_buffer(dev, dt, nke, rng);
        x->out[i][0] = in_place ? x->in[i][0] : random_buffer(dev, dt, nqe, rng);
        x->out[i][1] = in_place ? x->in[i][1] : random_buffer(dev, dt, nke, rng);
        ok = x->in[i][0] && x->in[i][1] && x->out[i][0] && x->out[i][1];
    }
    return TST_REQUIRE(ok, "timing buffers: %s", lmk_last_error());
}

static bool make_repeat_ctx(lmk_device *dev, lmk_stream *s, op_ctx *x, lmk_dtype dt, uint32_t T, uint32_t h, tst_rng *rng)
{
    memset(x, 0, sizeof *x);
    x->s = s;
    x->pp = (lmk_repeat_tiled_params){T, 16, h, 128};
    const size_t ns = (size_t)T * 16 * 128, nd = (size_t)T * h * 128;
    x->n_sets = sets_for((ns + nd) * lmk_dtype_size(dt));
    bool ok = true;
    for (int i = 0; i < x->n_sets && ok; i++) {
        x->in[i][0] = random_buffer(dev, dt, ns, rng);
        x->out[i][0] = random_buffer(dev, dt, nd, rng);
        ok = x->in[i][0] && x->out[i][0];
    }
    return TST_REQUIRE(ok, "timing buffers: %s", lmk_last_error());
}

/* Times one op: device time per call (no graph, 10 back-to-back calls per sample), the copy ceiling
 * for the same byte count, and prints the row. Returns the fraction of the ceiling. */
static const char *g_filter = NULL;

static bool wanted(const char *name)
{
    return !g_filter || strstr(name, g_filter) != NULL;
}

static double time_row(lmk_stream *s, op_ctx *x, const char *name, double bytes, double target)
{
    double t = 0, t2 = 0, bw = 0;
    lmk_status st = lmk_bench_cuda_time(s, op_fn, x, 5, 30, 10, 0, &t);
    if (st == LMK_OK)
        st = lmk_bench_cuda_time(s, op_fn, x, 0, 30, 10, 0, &t2); /* the same again: the noise */
    if (st == LMK_OK)
        st = lmk_bench_cuda_copy_ceiling(s, (size_t)(bytes / 2), &bw);
    if (!TST_REQUIRE(st == LMK_OK, "%s: timing: %s: %s", name, lmk_status_name(st), lmk_last_error()))
        return 0;
    const double ceil_t = bytes / bw, frac = ceil_t / t;
    printf("%-58s %8.2f us (again %8.2f) %7.1f GB/s | copy %7.1f GB/s = %7.2f us | %.3f of ceiling (target %.2f) %s\n",
           name, t * 1e6, t2 * 1e6, bytes / t * 1e-9, bw * 1e-9, ceil_t * 1e6, frac, target,
           frac >= target ? "MET" : "MISSED");
    return frac;
}

static void time_decode(lmk_stream *s, op_ctx *x, const char *name, double target_us)
{
    double tg = 0, tp = 0, hc = 0;
    lmk_status st = lmk_bench_cuda_time(s, op_fn, x, 10, 30, 100, 1, &tg);
    if (st == LMK_OK)
        st = lmk_bench_cuda_time(s, op_fn, x, 10, 30, 100, 0, &tp);
    if (st == LMK_OK)
        st = lmk_bench_cuda_host_cost(s, op_fn, x, 2000, &hc);
    if (!TST_REQUIRE(st == LMK_OK, "%s: timing: %s: %s", name, lmk_status_name(st), lmk_last_error()))
        return;
    printf("%-58s graph %6.3f us/call (target <= %.1f %s) | stream %6.3f us/call | host %6.3f us/call (target <= 3 %s)\n",
           name, tg * 1e6, target_us, tg * 1e6 <= target_us ? "MET" : "MISSED", tp * 1e6, hc * 1e6,
           hc * 1e6 <= 3.0 ? "MET" : "MISSED");
}

/* Host cost of bare CUDA calls, to separate the platform's launch cost from lmk's own. */
typedef struct raw_ctx {
    lmk_stream *s;
    cudaStream_t h;
    void *p, *q;
    cudaEvent_t ev;
    int what;
} raw_ctx;

static lmk_status raw_fn(void *c)
{
    raw_ctx *x = c;
    int dev = 0;
    if (x->what == 3) { /* the backend's launcher alone: no validation */
        const lmk_repeat_args a = {x->p, x->q, 1, 16, 48, 128, 4};
        return lmk_cuda_backend.repeat_tiled(x->s, &a);
    }
    cudaError_t e = x->what == 0 ? cudaMemsetAsync(x->p, 0, 16, x->h)
                    : x->what == 1 ? cudaEventRecord(x->ev, x->h)
                                   : cudaGetDevice(&dev);
    return e == cudaSuccess ? LMK_OK : LMK_ERR_DEVICE;
}

static void time_raw(lmk_stream *s)
{
    raw_ctx x = {s, lmk_stream_cuda_handle(s), NULL, NULL, NULL, 0};
    if (cudaMalloc(&x.p, 16 * 128 * 4) != cudaSuccess || cudaMalloc(&x.q, 48 * 128 * 4) != cudaSuccess ||
        cudaEventCreateWithFlags(&x.ev, cudaEventDisableTiming) != cudaSuccess)
        return;
    static const char *const names[] = {"cudaMemsetAsync(16 B)", "cudaEventRecord", "cudaGetDevice",
                                        "repeat_tiled T=1 launcher, no validation"};
    for (x.what = 0; x.what < 4; x.what++) {
        double hc = 0;
        if (lmk_bench_cuda_host_cost(s, raw_fn, &x, 2000, &hc) == LMK_OK)
            printf("host cost of %-45s %6.3f us/call\n", names[x.what], hc * 1e6);
    }
    (void)cudaEventDestroy(x.ev);
    (void)cudaFree(x.p);
    (void)cudaFree(x.q);
}

static void timing(lmk_device *dev, lmk_stream *s)
{
    tst_rng rng = tst_rng_make(tst_case_seed());
    op_ctx x; /* zero between rows: op_ctx_free leaves it zeroed, and a filtered-out row frees nothing */
    memset(&x, 0, sizeof x);
    printf("\n== timing on %s (medians of 30 samples of 10 calls; 'again' repeats the measurement)\n",
           lmk_device_name(dev));
    static const lmk_dtype dts[] = {LMK_F32, LMK_BF16};
    static const uint32_t hs[] = {48, 32, 64};
    for (int d = 0; d < 2; d++)
        for (int i = 0; i < 3; i++) {
            const size_t es = lmk_dtype_size(dts[d]);
            char name[128];
            snprintf(name, sizeof name, "repeat_tiled [4106,16,128]->[4106,%u,128] %s", hs[i], lmk_dtype_name(dts[d]));
            if (wanted(name) && make_repeat_ctx(dev, s, &x, dts[d], 4106, hs[i], &rng))
                time_row(s, &x, name, (double)4106 * 128 * (16 + hs[i]) * es, hs[i] == 48 ? 0.9 : 0);
            op_ctx_free(&x);
        }
    for (int d = 0; d < 2; d++) {
        const size_t es = lmk_dtype_size(dts[d]);
        char name[128];
        snprintf(name, sizeof name, "rope Q+K 27B T=4106 out of place %s", lmk_dtype_name(dts[d]));
        if (wanted(name) && make_rope_ctx(dev, s, &x, dts[d], 4106, 24, 4, false, &rng))
            time_row(s, &x, name, 2.0 * 4106 * 28 * 256 * es, 0.85);
        op_ctx_free(&x);
        snprintf(name, sizeof name, "rope Q+K 27B T=16384 in place %s (rotated bytes)", lmk_dtype_name(dts[d]));
        if (wanted(name) && make_rope_ctx(dev, s, &x, dts[d], 16384, 24, 4, true, &rng))
            time_row(s, &x, name, 2.0 * 16384 * 28 * 64 * es, dts[d] == LMK_BF16 ? 0.8 : 0);
        op_ctx_free(&x);
    }
    printf("\n== decode (T=1): a CUDA graph of 100 calls, 100 calls on the stream, host enqueue cost\n");
    if (wanted("T=1"))
        time_raw(s);
    for (int d = 0; d < 2; d++) {
        char name[128];
        snprintf(name, sizeof name, "rope Q+K 27B T=1 out of place %s", lmk_dtype_name(dts[d]));
        if (wanted(name) && make_rope_ctx(dev, s, &x, dts[d], 1, 24, 4, false, &rng))
            time_decode(s, &x, name, 1.5);
        op_ctx_free(&x);
        snprintf(name, sizeof name, "rope Q+K 27B T=1 in place %s", lmk_dtype_name(dts[d]));
        if (wanted(name) && make_rope_ctx(dev, s, &x, dts[d], 1, 24, 4, true, &rng))
            time_decode(s, &x, name, 1.5);
        op_ctx_free(&x);
        snprintf(name, sizeof name, "repeat_tiled T=1 16->48 %s", lmk_dtype_name(dts[d]));
        if (wanted(name) && make_repeat_ctx(dev, s, &x, dts[d], 1, 48, &rng))
            time_decode(s, &x, name, 1.5);
        op_ctx_free(&x);
    }
}

int main(int argc, char **argv)
{
    bool quick = false, do_time = true, do_sweep = true;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            quick = true, do_time = false;
        else if (!strcmp(argv[i], "--no-time"))
            do_time = false;
        else if (!strcmp(argv[i], "--time-only"))
            do_sweep = false;
        else if (!strcmp(argv[i], "--filter") && i + 1 < argc)
            g_filter = argv[++i];
    }
    tst_program_seed();
    if (lmk_device_count(LMK_BACKEND_CUDA) <= 0) {
        SKIP("cuda_kernels_bench: no usable GPU");
        return harness_summary();
    }
    lmk_device *dev = NULL;
    lmk_stream *s = NULL;
    if (!CHECK(lmk_device_open(LMK_BACKEND_CUDA, 0, &dev) == LMK_OK && lmk_stream_create(dev, &s) == LMK_OK,
               "open: %s", lmk_last_error()))
        return harness_summary();
    printf("device: %s\n", lmk_device_name(dev));
    if (do_sweep) {
        const double t0 = tst_now();
        repeat_sweep(dev, s, quick);
        const double t1 = tst_now();
        rope_sweep(dev, s, quick);
        printf("sweep: repeat %.1f s, rope %.1f s; %d passed, %d failed\n", t1 - t0, tst_now() - t1, harness_passed,
               harness_failed);
        fflush(stdout);
    }
    if (do_time)
        timing(dev, s);
    lmk_stream_destroy(s);
    lmk_device_close(dev);
    return harness_summary();
}
