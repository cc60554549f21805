/*
 * test_rope.c - rope_multi and rope_multi_qk on every backend against the float64 reference.
 *
 * In order:
 *  1. the seed library's test vectors (the Metal library lmk started from), with their exact numbers;
 *  2. the pairing trap: for Qwen3.5 (head_dim 256, rope_dim 64) the Hugging Face pairing and the
 *     seed's differ, and only the former matches an independent rotate_half written here;
 *  3. every Qwen3.5/3.6, Qwen3-VL and Qwen2-VL full-attention shape at decode and at a prompt length, in f32,
 *     bf16 and f16, both pairings, in place and out of place, and the fused q+k launch, against
 *     lmk_ref_rope_f64 under the precision contract (f32 1e-5 absolute for |x| <= 2, bf16/f16
 *     one ulp plus 1e-6), with every element outside the rotated pairs a bit-exact copy;
 *  4. edge shapes: seq 1, rope_dim == head_dim, rope_dim 2, head_dim 2, wrapping, empty and huge
 *     sections, negative and +-2^20 positions, u32 positions, NaN payloads in copied elements;
 *  5. every validation rule 1-10 in its order with the message it must give, unknown mode and
 *     pairing, overlaps, and no output byte changed by a rejected call.
 */
#include "common.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

HARNESS_DEFINE;

static const lmk_dtype k_float_dtypes[] = {LMK_F32, LMK_BF16, LMK_F16};
#define F32_TOL 1e-5

/* ------------------------------------------------------------------------------------------------
 * running one launch
 * ---------------------------------------------------------------------------------------------- */

static size_t n_elems(const lmk_rope_multi_params *p, uint32_t n_heads)
{
    return (size_t)p->seq_len * n_heads * p->head_dim;
}

/* Runs rope_multi (n_t 1) or rope_multi_qk (n_t 2, k with nk heads) on the device with host inputs
 * in_host and positions pos_host (4*seq_len, stored as pos_dtype), and copies the outputs to
 * out_host. Outputs are poisoned first; afterwards the guard bytes after every output, the
 * inputs (out of place) and the positions must be untouched (one TST_REQUIRE). Returns the op's
 * status (or the first setup failure). */
static lmk_status rope_exec(tst_dev *d, const lmk_rope_multi_params *p, uint32_t nk, int n_t, lmk_dtype dtype,
                            lmk_dtype pos_dtype, bool in_place, const void *const in_host[2], const int32_t *pos_host,
                            void *out_host[2], const char *name)
{
    const size_t es = lmk_dtype_size(dtype);
    const uint32_t heads[2] = {p->n_heads, nk};
    lmk_buffer *in[2] = {NULL, NULL}, *out[2] = {NULL, NULL}, *pos = NULL;
    lmk_status st = LMK_ERR_OUT_OF_MEMORY;
    const size_t pos_shape[1] = {4 * (size_t)p->seq_len};
    pos = tst_buf(d->dev, pos_dtype, pos_shape, 1, 4 * (size_t)p->seq_len * 4, TST_GUARD, pos_host,
                  4 * (size_t)p->seq_len * 4, TST_POISON);
    if (!pos)
        goto done;
    for (int i = 0; i < n_t; i++) {
        const size_t shape[3] = {p->seq_len, heads[i], p->head_dim}, used = n_elems(p, heads[i]) * es;
        in[i] = tst_buf(d->dev, dtype, shape, 3, used, TST_GUARD, in_host[i], used, TST_POISON);
        out[i] = in_place ? in[i] : tst_buf(d->dev, dtype, shape, 3, used, TST_GUARD, NULL, 0, TST_POISON);
        if (!in[i] || !out[i])
            goto done;
    }
    st = n_t == 1 ? lmk_rope_multi(d->stream, in[0], out[0], pos, p)
                  : lmk_rope_multi_qk(d->stream, in[0], out[0], in[1], out[1], pos, p, nk);
    if (st == LMK_OK)
        st = lmk_stream_sync(d->stream);
    if (st != LMK_OK)
        goto done;
    for (int i = 0; i < n_t; i++) {
        const size_t used = n_elems(p, heads[i]) * es;
        unsigned char *o = tst_read_all(out[i]);
        if (!o) {
            st = LMK_ERR_DEVICE;
            goto done;
        }
        memcpy(out_host[i], o, used);
        const long long g = tst_find_not(o, used, used + TST_GUARD, TST_POISON);
        TST_REQUIRE(g < 0, "%s [%s]: tensor %d: guard byte %lld after the output was written", name, d->name, i,
                    g - (long long)used);
        free(o);
        if (!in_place) {
            unsigned char *ib = tst_read_all(in[i]);
            TST_REQUIRE(ib && memcmp(ib, in_host[i], used) == 0 && tst_find_not(ib, used, used + TST_GUARD, TST_POISON) < 0,
                        "%s [%s]: tensor %d: the input buffer changed (out of place)", name, d->name, i);
            free(ib);
        }
    }
    unsigned char *pb = tst_read_all(pos);
    TST_REQUIRE(pb && memcmp(pb, pos_host, 16 * (size_t)p->seq_len) == 0 &&
                    tst_find_not(pb, 16 * (size_t)p->seq_len, 16 * (size_t)p->seq_len + TST_GUARD, TST_POISON) < 0,
                "%s [%s]: the positions buffer changed", name, d->name);
    free(pb);
done:
    for (int i = 0; i < 2; i++) {
        if (out[i] != in[i])
            lmk_buffer_free(out[i]);
        lmk_buffer_free(in[i]);
    }
    lmk_buffer_free(pos);
    return st;
}

/* ------------------------------------------------------------------------------------------------
 * a case: random inputs, one launch, reference check
 * ---------------------------------------------------------------------------------------------- */

enum { POS_TEXT, POS_RANDOM };

typedef struct rope_case {
    lmk_rope_multi_params p;
    lmk_dtype dtype, pos_dtype;      /* pos_dtype 0 (f32) means i32 */
    uint32_t n_k_heads;              /* > 0: the fused q+k launch */
    bool in_place;
    int pos_kind;                    /* POS_TEXT: start at pos_lo; POS_RANDOM: each axis in [pos_lo, pos_hi] */
    int32_t pos_lo, pos_hi;
    bool nan_copies;                 /* copied elements get random bit patterns, mostly NaNs */
    int repeat;                      /* extra launches that must give the same bits */
    const char *comment;
    bool print;
} rope_case;

/* Random bits for an element that is only copied: half of them NaNs with random payloads
 * (signalling ones included), the rest any pattern at all. */
static void random_copy_element(tst_rng *r, lmk_dtype t, void *base, size_t i)
{
    const uint32_t u = tst_rng_u32(r);
    const bool nan = u & 1;
    if (t == LMK_F32) {
        uint32_t v = tst_rng_u32(r);
        if (nan)
            v = (v & 0x807fffffu) | 0x7f800000u | ((v & 0x7fffffu) ? 0 : 1);
        memcpy((char *)base + 4 * i, &v, 4);
    } else {
        uint16_t v = (uint16_t)(u >> 16);
        if (nan) {
            const uint16_t e = t == LMK_BF16 ? 0x7f80u : 0x7c00u, m = t == LMK_BF16 ? 0x7fu : 0x3ffu;
            v = (uint16_t)((v & (0x8000u | m)) | e);
            if (!(v & m))
                v |= 1;
        }
        memcpy((char *)base + 2 * i, &v, 2);
    }
}

static void run_case(tst_dev *d, const rope_case *c)
{
    const lmk_rope_multi_params *p = &c->p;
    const int n_t = c->n_k_heads ? 2 : 1;
    const uint32_t heads[2] = {p->n_heads, c->n_k_heads};
    const lmk_dtype pos_dtype = c->pos_dtype == LMK_U32 ? LMK_U32 : LMK_I32;
    const size_t es = lmk_dtype_size(c->dtype);
    const uint64_t seed = tst_case_seed();
    tst_rng r = tst_rng_make(seed);
    char name[256];
    tst_rope_name(name, sizeof name, n_t == 2 ? "rope_multi_qk" : "rope_multi", p, c->dtype, NULL);
    const size_t len = strlen(name);
    snprintf(name + len, sizeof name - len, "%s%.0u%s%s%s", n_t == 2 ? " nk=" : "", n_t == 2 ? c->n_k_heads : 0u,
             c->in_place ? " inplace" : "", c->comment ? " // " : "", c->comment ? c->comment : "");
    const double t0 = tst_now();

    void *in_host[2] = {NULL, NULL}, *got[2] = {NULL, NULL}, *again[2] = {NULL, NULL};
    int32_t *pos = malloc(16 * (size_t)p->seq_len);
    bool *mask = malloc(p->head_dim * sizeof *mask);
    bool ok = pos && mask;
    for (int i = 0; i < n_t && ok; i++) {
        const size_t n = n_elems(p, heads[i]);
        in_host[i] = malloc(n * es);
        got[i] = malloc(n * es);
        again[i] = malloc(n * es);
        ok = in_host[i] && got[i] && again[i];
    }
    if (!ok) {
        TST_FAIL("%s: out of host memory", name);
        goto done;
    }
    tst_rope_rotated_mask(p, mask);
    for (int i = 0; i < n_t; i++) {
        const size_t n = n_elems(p, heads[i]);
        tst_fill_float(&r, c->dtype, in_host[i], n, -2.0, 2.0);
        if (c->nan_copies)
            for (size_t j = 0; j < n; j++)
                if (!mask[j % p->head_dim])
                    random_copy_element(&r, c->dtype, in_host[i], j);
    }
    if (c->pos_kind == POS_TEXT)
        tst_positions_text(pos, p->seq_len, c->pos_lo);
    else
        tst_positions_random(&r, pos, p->seq_len, c->pos_lo, c->pos_hi);

    const void *const cin[2] = {in_host[0], in_host[1]};
    lmk_status st = rope_exec(d, p, c->n_k_heads, n_t, c->dtype, pos_dtype, c->in_place, cin, pos, got, name);
    bool pass = CHECK(st == LMK_OK, "%s [%s]: %s \"%s\"", name, d->name, lmk_status_name(st), lmk_last_error());
    if (st == LMK_OK) {
        const lmk_rope_args a = tst_rope_host_args(p, c->n_k_heads, n_t, c->dtype, cin[0], cin[1], pos);
        char msg[512];
        const void *const g[2] = {got[0], got[1]};
        const bool good = tst_rope_check(&a, g, F32_TOL, msg, sizeof msg);
        pass &= CHECK(good, "%s [%s] seed 0x%016" PRIx64 ": %s", name, d->name, seed, msg);

        for (int k = 0; k < c->repeat; k++) {
            st = rope_exec(d, p, c->n_k_heads, n_t, c->dtype, pos_dtype, c->in_place, cin, pos, again, name);
            bool same = st == LMK_OK;
            for (int i = 0; i < n_t && same; i++)
                same = memcmp(got[i], again[i], n_elems(p, heads[i]) * es) == 0;
            pass &= CHECK(same, "%s [%s]: run %d is not bit-identical to the first (%s)", name, d->name, k + 2,
                          lmk_status_name(st));
        }
        if (n_t == 2) {
            /* The fused launch is "the same as" two lmk_rope_multi calls: bit for bit. */
            bool same = true;
            for (int i = 0; i < 2 && same; i++) {
                lmk_rope_multi_params pi = *p;
                pi.n_heads = heads[i];
                const void *const one[2] = {in_host[i], NULL};
                void *o[2] = {again[i], NULL};
                st = rope_exec(d, &pi, 0, 1, c->dtype, pos_dtype, false, one, pos, o, name);
                same = st == LMK_OK && memcmp(got[i], again[i], n_elems(p, heads[i]) * es) == 0;
                if (!same) {
                    TST_FAIL("%s [%s]: the fused %s output differs from lmk_rope_multi on it alone (%s)", name,
                             d->name, i ? "k" : "q", lmk_status_name(st));
                    pass = false;
                }
            }
            if (same)
                TST_PASS("qk fused == separate");
        }
        if (c->print)
            printf("  %-92s [%s] %s %s (%.2f s)\n", name, d->name, pass ? "OK" : "FAIL", good ? msg : "",
                   tst_now() - t0);
    }
done:
    for (int i = 0; i < 2; i++) {
        free(in_host[i]);
        free(got[i]);
        free(again[i]);
    }
    free(pos);
    free(mask);
}

/* ------------------------------------------------------------------------------------------------
 * 1. the seed's test vectors (seed pairing, f32)
 * ---------------------------------------------------------------------------------------------- */

/* One rope_multi launch of f32 inputs; out must hold seq_len*n_heads*head_dim floats. */
static lmk_status rope_f32(tst_dev *d, const lmk_rope_multi_params *p, const float *in, const int32_t *pos, float *out,
                           const char *name)
{
    const void *const i2[2] = {in, NULL};
    void *o2[2] = {out, NULL};
    return rope_exec(d, p, 0, 1, LMK_F32, LMK_I32, false, i2, pos, o2, name);
}

static bool close_all(const float *got, const double *want, size_t n, double tol, size_t *bad_at)
{
    for (size_t i = 0; i < n; i++)
        if (!(fabs((double)got[i] - want[i]) <= tol)) {
            *bad_at = i;
            return false;
        }
    return true;
}

/* Checks an f32 output against the float64 reference (f32 tolerance, bit-exact copies). */
static bool check_f32_vs_ref(const lmk_rope_multi_params *p, const float *in, const int32_t *pos, const float *out,
                             char *msg, size_t msg_len)
{
    const void *const i2[2] = {in, NULL};
    const lmk_rope_args a = tst_rope_host_args(p, 0, 1, LMK_F32, i2[0], NULL, pos);
    const void *const g[2] = {out, NULL};
    return tst_rope_check(&a, g, F32_TOL, msg, msg_len);
}

static void test_seed_vectors(tst_dev *d)
{
    /* Vectors 1 and 2. */
    {
        lmk_rope_multi_params p = {.head_dim = 16, .rope_dim = 8, .n_heads = 1, .seq_len = 1, .freq_base = 2.0f,
                                   .mode = LMK_ROPE_IMROPE, .sections = {2, 2, 1, 0},
                                   .pairing = LMK_ROPE_PAIR_HALF_HEAD};
        float in[16], out[16];
        for (int i = 0; i < 16; i++)
            in[i] = (float)(i + 1) * 0.1f;
        const int32_t pos[4] = {5, 7, 9, 0};
        static const double want_imrope[16] = {0.891398132, 0.571022809, 0.210265458, -0.59566319, 0.5, 0.6, 0.7, 0.8,
                                               0.159403563, 0.84494549,  1.12061965,  -1.11587882, 1.3, 1.4, 1.5, 1.6};
        static const double want_mrope[16] = {0.891398132, 0.776494503,  1.13969946, 0.813795567, 0.5, 0.6, 0.7, 0.8,
                                              0.159403563, -0.661102295, -0.0329390466, -0.968368173, 1.3, 1.4, 1.5, 1.6};
        for (int v = 0; v < 2; v++) {
            p.mode = v == 0 ? LMK_ROPE_IMROPE : LMK_ROPE_MROPE;
            const double *want = v == 0 ? want_imrope : want_mrope;
            const lmk_status st = rope_f32(d, &p, in, pos, out, "seed vector");
            size_t at = 0;
            const bool ok = st == LMK_OK && close_all(out, want, 16, 1e-5, &at);
            CHECK(ok, "[%s] seed vector %d (%s hd=16 rd=8 base 2, sections [2,2,1,0], positions [5,7,9,0]): %s; "
                      "element %zu = %.9g, want %.9g",
                  d->name, v + 1, v ? "mrope" : "imrope", lmk_status_name(st), at, (double)out[at], want[at]);
            /* The untouched elements are the inputs themselves, bit for bit. */
            CHECK(st == LMK_OK && memcmp(out + 4, in + 4, 16) == 0 && memcmp(out + 12, in + 12, 16) == 0,
                  "[%s] seed vector %d: copied elements 4..7 and 12..15 differ from the input", d->name, v + 1);
        }
    }

    /* The seed RNG must reproduce the seed's published first values, or vector 3 below tests
     * nothing: a precondition, counted only when it fails (it tests the harness, not lmk). */
    {
        uint32_t s = 0xdeadbeefu;
        const double want[4] = {0.328184724, -1.13410151, 1.25128174, 1.46783543};
        bool ok = true;
        float got[4];
        for (int i = 0; i < 4; i++) {
            got[i] = tst_seed_rng_next(&s) * 1.5f;
            ok = ok && fabs((double)got[i] - want[i]) <= 1e-7;
        }
        TST_REQUIRE(ok, "seed RNG 0xdeadbeef * 1.5 starts %.9g %.9g %.9g %.9g, want 0.328184724 -1.13410151 "
                        "1.25128174 1.46783543",
              (double)got[0], (double)got[1], (double)got[2], (double)got[3]);
    }

    /* Vector 3, and on the same input 5 (IMROPE with text positions is plain NeoX rope) and 6
     * (bf16 within 5e-2 of f32). */
    {
        const lmk_rope_multi_params p = {.head_dim = 32, .rope_dim = 16, .n_heads = 4, .seq_len = 6,
                                         .freq_base = 1e4f, .mode = LMK_ROPE_IMROPE, .sections = {3, 3, 2, 0},
                                         .pairing = LMK_ROPE_PAIR_HALF_HEAD};
        enum { N = 6 * 4 * 32 };
        float in[N], out[N];
        uint32_t s = 0xdeadbeefu;
        for (int i = 0; i < N; i++)
            in[i] = tst_seed_rng_next(&s) * 1.5f;
        int32_t pos[4 * 6];
        tst_positions_text(pos, 6, 0);
        lmk_status st = rope_f32(d, &p, in, pos, out, "seed vector 3");
        char msg[512] = "";
        CHECK(st == LMK_OK && check_f32_vs_ref(&p, in, pos, out, msg, sizeof msg),
              "[%s] seed vector 3 (hd=32 rd=16 nh=4 T=6 base 1e4 imrope [3,3,2,0]): %s %s", d->name,
              lmk_status_name(st), msg);

        /* 5: an independent NeoX rope (one frequency per pair, the token's position), both pairings. */
        for (int pairing = 0; pairing < 2; pairing++) {
            lmk_rope_multi_params q = p;
            q.pairing = (lmk_rope_pairing)pairing;
            float o5[N];
            st = rope_f32(d, &q, in, pos, o5, "seed vector 5");
            const uint32_t half = q.rope_dim / 2, stride = pairing ? q.head_dim / 2 : half;
            double worst = 0.0;
            bool copies = true;
            for (size_t row = 0; row < 6 * 4; row++) {
                const double position = (double)(row / 4);
                const float *x = in + row * 32, *y = o5 + row * 32;
                bool rotated[32] = {false};
                for (uint32_t j = 0; j < half; j++) {
                    const double th = position / pow(1e4, 2.0 * j / q.rope_dim);
                    const double a = x[j], b = x[j + stride];
                    worst = fmax(worst, fabs(y[j] - (a * cos(th) - b * sin(th))));
                    worst = fmax(worst, fabs(y[j + stride] - (a * sin(th) + b * cos(th))));
                    rotated[j] = rotated[j + stride] = true;
                }
                for (int j = 0; j < 32; j++)
                    if (!rotated[j] && memcmp(&x[j], &y[j], 4) != 0)
                        copies = false;
            }
            CHECK(st == LMK_OK && worst <= 1e-5 && copies,
                  "[%s] seed vector 5 (%s): IMROPE with text positions vs plain NeoX: max err %.3g, copies %s",
                  d->name, pairing ? "half_head" : "half_rope", worst, copies ? "exact" : "differ");
        }

        /* 6: bf16 of the same input within 5e-2 of the f32 result. */
        uint16_t in16[N], out16[N];
        for (int i = 0; i < N; i++)
            in16[i] = lmk_f32_to_bf16(in[i]);
        const void *const i2[2] = {in16, NULL};
        void *o2[2] = {out16, NULL};
        st = rope_exec(d, &p, 0, 1, LMK_BF16, LMK_I32, false, i2, pos, o2, "seed vector 6");
        double worst = 0.0;
        for (int i = 0; i < N; i++)
            worst = fmax(worst, fabs((double)lmk_bf16_to_f32(out16[i]) - (double)out[i]));
        CHECK(st == LMK_OK && worst <= 5e-2, "[%s] seed vector 6: bf16 vs f32 max diff %.3g (want <= 5e-2): %s",
              d->name, worst, lmk_status_name(st));
    }

    /* Vector 4: three runs bit-identical; pairs 32..127 untouched at both halves. */
    {
        const lmk_rope_multi_params p = {.head_dim = 256, .rope_dim = 64, .n_heads = 4, .seq_len = 3,
                                         .freq_base = 1e7f, .mode = LMK_ROPE_IMROPE, .sections = {11, 11, 10, 0},
                                         .pairing = LMK_ROPE_PAIR_HALF_HEAD};
        enum { N = 3 * 4 * 256 };
        static float in[N], out[3][N];
        uint32_t s = 0xfeed1234u;
        for (int i = 0; i < N; i++)
            in[i] = tst_seed_rng_next(&s);
        int32_t pos[12];
        tst_positions_text(pos, 3, 0);
        lmk_status st = LMK_OK;
        for (int k = 0; k < 3 && st == LMK_OK; k++)
            st = rope_f32(d, &p, in, pos, out[k], "seed vector 4");
        CHECK(st == LMK_OK && memcmp(out[0], out[1], sizeof out[0]) == 0 && memcmp(out[0], out[2], sizeof out[0]) == 0,
              "[%s] seed vector 4: three runs are not bit-identical (%s)", d->name, lmk_status_name(st));
        bool untouched = true;
        for (size_t row = 0; row < 12; row++)
            untouched = untouched && memcmp(out[0] + row * 256 + 32, in + row * 256 + 32, 96 * 4) == 0 &&
                        memcmp(out[0] + row * 256 + 160, in + row * 256 + 160, 96 * 4) == 0;
        char msg[512] = "";
        CHECK(st == LMK_OK && untouched && check_f32_vs_ref(&p, in, pos, out[0], msg, sizeof msg),
              "[%s] seed vector 4: pairs 32..127 %s at both halves; %s", d->name, untouched ? "untouched" : "CHANGED",
              msg);
    }

    /* Vector 7: the decode shape, Q (32 heads) and K (4 heads) at position 42, repeated calls. */
    {
        lmk_rope_multi_params p = {.head_dim = 256, .rope_dim = 64, .n_heads = 32, .seq_len = 1, .freq_base = 1e7f,
                                   .mode = LMK_ROPE_IMROPE, .sections = {11, 11, 10, 0},
                                   .pairing = LMK_ROPE_PAIR_HALF_HEAD};
        static float q[32 * 256], k[4 * 256], qo[32 * 256], ko[4 * 256], qo2[32 * 256], ko2[4 * 256];
        uint32_t s = 0xc0ffee99u;
        for (int i = 0; i < 32 * 256; i++)
            q[i] = tst_seed_rng_next(&s);
        for (int i = 0; i < 4 * 256; i++)
            k[i] = tst_seed_rng_next(&s);
        const int32_t pos[4] = {42, 42, 42, 42};
        lmk_status st = rope_f32(d, &p, q, pos, qo, "seed vector 7 q");
        p.n_heads = 4;
        if (st == LMK_OK)
            st = rope_f32(d, &p, k, pos, ko, "seed vector 7 k");
        bool same = st == LMK_OK;
        for (int rep = 0; rep < 4 && same; rep++) {
            p.n_heads = 32;
            same = rope_f32(d, &p, q, pos, qo2, "seed vector 7 q") == LMK_OK && memcmp(qo, qo2, sizeof qo) == 0;
            p.n_heads = 4;
            same = same && rope_f32(d, &p, k, pos, ko2, "seed vector 7 k") == LMK_OK && memcmp(ko, ko2, sizeof ko) == 0;
        }
        CHECK(same, "[%s] seed vector 7: repeated decode calls are not bit-identical (%s)", d->name,
              lmk_status_name(st));
        char msg[512] = "";
        p.n_heads = 32;
        bool ok = st == LMK_OK && check_f32_vs_ref(&p, q, pos, qo, msg, sizeof msg);
        p.n_heads = 4;
        ok = ok && check_f32_vs_ref(&p, k, pos, ko, msg, sizeof msg);
        CHECK(ok, "[%s] seed vector 7 against the reference: %s", d->name, msg);
    }
}

/* ------------------------------------------------------------------------------------------------
 * 2. the pairing trap
 * ---------------------------------------------------------------------------------------------- */

/* Hugging Face's Qwen3-VL/3.5 rope for one row, written from transformers' code, not from lmk's:
 * inv_freq, the interleaved section overwrite of the t frequencies (apply_interleaved_mrope),
 * emb = cat(freqs, freqs), and q*cos + rotate_half(q)*sin on q[:R], with q[R:] passed through. */
static void hf_rope_row(const float *x, double *out, uint32_t hd, uint32_t R, double base, const uint32_t sec[3],
                        const int32_t thw[3])
{
    const uint32_t half = R / 2;
    double freqs[3][128], emb[256], rot[256];
    for (int axis = 0; axis < 3; axis++)
        for (uint32_t j = 0; j < half; j++)
            freqs[axis][j] = (double)thw[axis] * (1.0 / pow(base, (double)(2 * j) / (double)R));
    double ft[128];
    for (uint32_t j = 0; j < half; j++)
        ft[j] = freqs[0][j];
    for (int dim = 1; dim < 3; dim++) /* freqs_t[..., dim:sec[dim]*3:3] = freqs[dim][..., dim:sec[dim]*3:3] */
        for (uint32_t j = (uint32_t)dim; j < sec[dim] * 3 && j < half; j += 3)
            ft[j] = freqs[dim][j];
    for (uint32_t i = 0; i < R; i++)
        emb[i] = ft[i % half];
    for (uint32_t i = 0; i < R; i++)
        rot[i] = i < half ? -(double)x[i + half] : (double)x[i - half];
    for (uint32_t i = 0; i < R; i++)
        out[i] = (double)x[i] * cos(emb[i]) + rot[i] * sin(emb[i]);
    for (uint32_t i = R; i < hd; i++)
        out[i] = x[i];
}

static void test_pairing_trap(tst_dev *d)
{
    enum { T = 5, NH = 3, HD = 256, N = T * NH * HD };
    static float in[N], half_rope[N], half_head[N];
    tst_rng r = tst_rng_make(tst_case_seed());
    tst_fill_float(&r, LMK_F32, in, N, -2.0, 2.0);
    /* Distinct t/h/w positions; axis e holds the t positions, which is how a caller gets Hugging
     * Face's result (HF uses t for the sectors past the sections). */
    int32_t pos[4 * T];
    tst_positions_random(&r, pos, T, 0, 100000);
    for (int i = 0; i < T; i++)
        pos[3 * T + i] = pos[i];
    lmk_rope_multi_params p = {.head_dim = HD, .rope_dim = 64, .n_heads = NH, .seq_len = T, .freq_base = 1e7f,
                               .mode = LMK_ROPE_IMROPE, .sections = {11, 11, 10, 0},
                               .pairing = LMK_ROPE_PAIR_HALF_ROPE};
    lmk_status st = rope_f32(d, &p, in, pos, half_rope, "pairing trap");
    p.pairing = LMK_ROPE_PAIR_HALF_HEAD;
    if (st == LMK_OK)
        st = rope_f32(d, &p, in, pos, half_head, "pairing trap");
    if (!CHECK(st == LMK_OK, "[%s] pairing trap: %s \"%s\"", d->name, lmk_status_name(st), lmk_last_error()))
        return;
    double err_rope = 0.0, err_head = 0.0;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < NH; h++) {
            const size_t row = ((size_t)t * NH + h) * HD;
            double hf[HD];
            const uint32_t sec[3] = {11, 11, 10};
            const int32_t thw[3] = {pos[t], pos[T + t], pos[2 * T + t]};
            hf_rope_row(in + row, hf, HD, 64, 1e7, sec, thw);
            for (int i = 0; i < HD; i++) {
                err_rope = fmax(err_rope, fabs(half_rope[row + i] - hf[i]));
                err_head = fmax(err_head, fabs(half_head[row + i] - hf[i]));
            }
        }
    CHECK(err_rope <= 1e-5, "[%s] HALF_ROPE vs an independent Hugging Face rotate_half (hd 256, rd 64): max err %.3g",
          d->name, err_rope);
    CHECK(err_head > 0.1, "[%s] HALF_HEAD should differ from Hugging Face by far more than rounding (max diff %.3g)",
          d->name, err_head);
    CHECK(memcmp(half_rope, half_head, sizeof half_rope) != 0, "[%s] HALF_ROPE and HALF_HEAD gave the same bits",
          d->name);
    /* The zero value of the params is the Hugging Face pairing. */
    lmk_rope_multi_params z;
    memset(&z, 0, sizeof z);
    CHECK(z.pairing == LMK_ROPE_PAIR_HALF_ROPE && LMK_ROPE_PAIR_HALF_ROPE == 0 && LMK_ROPE_PAIR_HALF_HEAD == 1,
          "the zero pairing is not HALF_ROPE");
}

/* ------------------------------------------------------------------------------------------------
 * 3. model shapes
 * ---------------------------------------------------------------------------------------------- */

static lmk_rope_multi_params shape_params(const tst_attn_shape *s, uint32_t n_heads, uint32_t T,
                                          lmk_rope_pairing pairing)
{
    lmk_rope_multi_params p = {.head_dim = s->head_dim, .rope_dim = s->rope_dim, .n_heads = n_heads, .seq_len = T,
                               .freq_base = s->freq_base, .mode = s->mode, .pairing = pairing};
    memcpy(p.sections, s->sections, sizeof p.sections);
    return p;
}

static void test_model_shapes(tst_dev *d)
{
    const uint32_t mid_t = tst_quick() ? 17 : 100;
    char comment[96];
    for (int si = 0; si < tst_attn_shape_count; si++) {
        const tst_attn_shape *s = &tst_attn_shapes[si];
        for (int ti = 0; ti < 2; ti++) {
            const uint32_t T = ti ? mid_t : 1;
            for (size_t di = 0; di < sizeof k_float_dtypes / sizeof k_float_dtypes[0]; di++)
                for (int pairing = 0; pairing < 2; pairing++)
                    for (int qk = 0; qk < 2; qk++) {
                        snprintf(comment, sizeof comment, "%s %s", s->model, qk ? "Q+K" : "Q");
                        rope_case c = {
                            .p = shape_params(s, s->n_q_heads, T, (lmk_rope_pairing)pairing),
                            .dtype = k_float_dtypes[di],
                            .n_k_heads = qk ? s->n_k_heads : 0,
                            .in_place = ((si + di + (size_t)pairing + (size_t)qk) % 2) == 1,
                            /* decode at the end of the 262144 context; prompts with distinct t/h/w/e */
                            .pos_kind = T == 1 ? POS_TEXT : POS_RANDOM,
                            .pos_lo = T == 1 ? 262143 : 0,
                            .pos_hi = 262143,
                            .repeat = di == 0 && pairing == 0 ? 1 : 0,
                            .comment = comment,
                            .print = true,
                        };
                        run_case(d, &c);
                    }
        }
    }
    /* The seed's benchmark prompt length on the 27B's Q and on Q+K. */
    const uint32_t big_t = tst_quick() || d->isa_variant ? 257 : 4106;
    const tst_attn_shape *s27 = &tst_attn_shapes[2];
    rope_case c = {.p = shape_params(s27, 24, big_t, LMK_ROPE_PAIR_HALF_ROPE), .dtype = LMK_F32,
                   .pos_kind = POS_TEXT, .pos_lo = 0, .comment = "qwen3.5-27B Q", .print = true};
    run_case(d, &c);
    rope_case c2 = {.p = shape_params(s27, 24, big_t, LMK_ROPE_PAIR_HALF_ROPE), .dtype = LMK_BF16, .n_k_heads = 4,
                    .in_place = true, .pos_kind = POS_RANDOM, .pos_lo = 0, .pos_hi = 262143,
                    .comment = "qwen3.5-27B Q+K", .print = true};
    run_case(d, &c2);
}

/* ------------------------------------------------------------------------------------------------
 * 4. edge shapes
 * ---------------------------------------------------------------------------------------------- */

static void test_edges(tst_dev *d)
{
    typedef struct {
        uint32_t hd, rd, nh, T;
        lmk_rope_mode mode;
        uint32_t sec[4];
        int pos_kind;
        int32_t lo, hi;
        lmk_dtype pos_dtype;
        const char *what;
    } edge;
    const uint32_t MAXU = 0xFFFFFFFFu;
    const edge edges[] = {
        {256, 64, 1, 1, LMK_ROPE_IMROPE, {11, 11, 10, 0}, POS_RANDOM, 0, 262143, LMK_I32, "seq 1, one head"},
        {64, 64, 3, 5, LMK_ROPE_IMROPE, {11, 11, 10, 0}, POS_RANDOM, 0, 5000, LMK_I32, "rope_dim == head_dim"},
        {8, 2, 2, 3, LMK_ROPE_MROPE, {1, 0, 0, 0}, POS_RANDOM, 0, 5000, LMK_I32, "rope_dim 2"},
        {2, 2, 3, 4, LMK_ROPE_IMROPE, {1, 1, 1, 0}, POS_RANDOM, 0, 5000, LMK_I32, "head_dim 2"},
        {2, 2, 1, 1, LMK_ROPE_MROPE, {0, 0, 0, 1}, POS_RANDOM, 0, 5000, LMK_I32, "head_dim 2, axis e only"},
        {34, 34, 3, 7, LMK_ROPE_MROPE, {3, 5, 4, 5}, POS_RANDOM, 0, 5000, LMK_I32, "17 pairs (odd)"},
        {40, 6, 5, 3, LMK_ROPE_IMROPE, {1, 1, 1, 0}, POS_RANDOM, 0, 5000, LMK_I32, "3 pairs of 20"},
        {256, 254, 2, 3, LMK_ROPE_IMROPE, {11, 11, 10, 0}, POS_RANDOM, 0, 5000, LMK_I32, "127 pairs"},
        {12, 8, 2, 3, LMK_ROPE_IMROPE, {1, 1, 1, 1}, POS_RANDOM, 0, 5000, LMK_I32, "head_dim 12 rope_dim 8"},
        {64, 32, 2, 5, LMK_ROPE_IMROPE, {2, 1, 1, 0}, POS_RANDOM, 0, 5000, LMK_I32, "sections wrap (sum 4 < 16)"},
        {64, 32, 2, 5, LMK_ROPE_MROPE, {2, 1, 1, 0}, POS_RANDOM, 0, 5000, LMK_I32, "mrope sections wrap"},
        {64, 32, 2, 5, LMK_ROPE_IMROPE, {0, 0, 0, 0}, POS_RANDOM, 0, 5000, LMK_I32, "sections sum 0 (axis e)"},
        {64, 32, 2, 5, LMK_ROPE_MROPE, {0, 0, 0, 0}, POS_RANDOM, 0, 5000, LMK_I32, "mrope sections sum 0"},
        {64, 32, 2, 5, LMK_ROPE_IMROPE, {MAXU, 0, 0, 0}, POS_RANDOM, 0, 5000, LMK_I32, "section 0xFFFFFFFF"},
        {64, 32, 2, 5, LMK_ROPE_MROPE, {1, MAXU, 3, 0}, POS_RANDOM, 0, 5000, LMK_I32, "mrope huge middle section"},
        {64, 32, 2, 5, LMK_ROPE_IMROPE, {MAXU, MAXU, MAXU, MAXU}, POS_RANDOM, 0, 5000, LMK_I32,
         "sections whose 32-bit sum wraps"},
        {64, 32, 2, 5, LMK_ROPE_MROPE, {MAXU, MAXU, MAXU, MAXU}, POS_RANDOM, 0, 5000, LMK_I32,
         "mrope sections whose 32-bit sum wraps"},
        {64, 32, 2, 5, LMK_ROPE_IMROPE, {0x55555556u, 2, 0, 0}, POS_RANDOM, 0, 5000, LMK_I32,
         "3*s wraps 32 bits"},
        {128, 64, 3, 9, LMK_ROPE_IMROPE, {11, 11, 10, 0}, POS_RANDOM, -5000, -1, LMK_I32, "negative positions"},
        {256, 64, 2, 9, LMK_ROPE_IMROPE, {11, 11, 10, 0}, POS_RANDOM, -(1 << 20), 1 << 20, LMK_I32,
         "positions in +-2^20"},
        {128, 128, 2, 4, LMK_ROPE_MROPE, {16, 24, 24, 0}, POS_TEXT, (1 << 20) - 4, 0, LMK_I32, "text at 2^20"},
        {128, 128, 2, 4, LMK_ROPE_MROPE, {16, 24, 24, 0}, POS_TEXT, -(1 << 20), 0, LMK_I32, "text at -2^20"},
        {256, 64, 2, 9, LMK_ROPE_IMROPE, {11, 11, 10, 0}, POS_RANDOM, -(1 << 20), 1 << 20, LMK_U32,
         "u32 positions (>= 2^31 read as negative)"},
        {256, 64, 3, 33, LMK_ROPE_IMROPE, {11, 11, 10, 0}, POS_RANDOM, 0, 262143, LMK_I32, "33 tokens"},
    };
    char comment[128];
    for (size_t e = 0; e < sizeof edges / sizeof edges[0]; e++)
        for (size_t di = 0; di < sizeof k_float_dtypes / sizeof k_float_dtypes[0]; di++)
            for (int pairing = 0; pairing < 2; pairing++)
                for (int place = 0; place < 2; place++) {
                    const edge *g = &edges[e];
                    rope_case c = {
                        .p = {.head_dim = g->hd, .rope_dim = g->rd, .n_heads = g->nh, .seq_len = g->T,
                              .freq_base = 1e4f, .mode = g->mode, .pairing = (lmk_rope_pairing)pairing},
                        .dtype = k_float_dtypes[di],
                        .pos_dtype = g->pos_dtype,
                        .in_place = place,
                        .pos_kind = g->pos_kind,
                        .pos_lo = g->lo,
                        .pos_hi = g->hi,
                        /* copied elements full of NaN payloads in half of the cases */
                        .nan_copies = ((e + di) % 2) == 0,
                        .comment = comment,
                    };
                    memcpy(c.p.sections, g->sec, sizeof c.p.sections);
                    if (g->hd >= 128)
                        c.p.freq_base = 1e7f;
                    snprintf(comment, sizeof comment, "%s%s", g->what, c.nan_copies ? ", NaN copies" : "");
                    run_case(d, &c);
                }
    /* The fused launch on edge shapes too (q and k of different head counts). */
    for (size_t di = 0; di < sizeof k_float_dtypes / sizeof k_float_dtypes[0]; di++)
        for (int pairing = 0; pairing < 2; pairing++) {
            rope_case c = {.p = {.head_dim = 12, .rope_dim = 8, .n_heads = 3, .seq_len = 5, .freq_base = 1e4f,
                                 .mode = LMK_ROPE_MROPE, .sections = {1, 2, 1, 0},
                                 .pairing = (lmk_rope_pairing)pairing},
                           .dtype = k_float_dtypes[di], .n_k_heads = 1, .in_place = pairing == 1,
                           .pos_kind = POS_RANDOM, .pos_lo = -100, .pos_hi = 100, .nan_copies = true,
                           .comment = "small q+k"};
            run_case(d, &c);
        }

    /* In place through a second handle of the same memory and offset (a view) is in place too. */
    {
        enum { N = 2 * 3 * 16 };
        float host[N], want_out[N];
        tst_rng r = tst_rng_make(tst_case_seed());
        tst_fill_float(&r, LMK_F32, host, N, -2, 2);
        const size_t shape[3] = {2, 3, 16};
        int32_t pos[8];
        tst_positions_random(&r, pos, 2, 0, 1000);
        const lmk_rope_multi_params p = {.head_dim = 16, .rope_dim = 8, .n_heads = 3, .seq_len = 2,
                                         .freq_base = 1e4f, .mode = LMK_ROPE_IMROPE, .sections = {1, 1, 1, 0}};
        lmk_buffer *b = tst_buf(d->dev, LMK_F32, shape, 3, sizeof host, 0, host, sizeof host, -1), *v = NULL;
        lmk_buffer *pb = tst_buf(d->dev, LMK_I32, NULL, 0, sizeof pos, 0, pos, sizeof pos, -1);
        if (b && pb && lmk_buffer_view(b, 0, LMK_F32, shape, 3, &v) == LMK_OK) {
            lmk_status st = lmk_rope_multi(d->stream, b, v, pb, &p);
            lmk_stream_sync(d->stream);
            char msg[512] = "";
            const bool ok = st == LMK_OK && lmk_buffer_read(b, 0, want_out, sizeof want_out) == LMK_OK &&
                            check_f32_vs_ref(&p, host, pos, want_out, msg, sizeof msg);
            CHECK(ok, "[%s] in place through a view of the same memory: %s \"%s\" %s", d->name, lmk_status_name(st),
                  lmk_last_error(), msg);
        }
        lmk_buffer_free(v);
        lmk_buffer_free(b);
        lmk_buffer_free(pb);
    }
}

/* ------------------------------------------------------------------------------------------------
 * 5. validation
 * ---------------------------------------------------------------------------------------------- */

static lmk_buffer *poisoned(tst_dev *d, lmk_dtype t, size_t n_el)
{
    const size_t shape[1] = {n_el};
    return tst_buf(d->dev, t, shape, 1, n_el * lmk_dtype_size(t), 0, NULL, 0, TST_POISON);
}

static bool all_poison(lmk_buffer *b)
{
    if (!b)
        return true;
    unsigned char *h = tst_read_all(b);
    const bool ok = h && tst_find_not(h, 0, lmk_buffer_byte_len(b), TST_POISON) < 0;
    free(h);
    return ok;
}

/* Checks a rejected rope_multi call: INVALID_ARGUMENT, the message holds the op name and every
 * needle, and the poisoned output is unchanged. */
static void expect_reject(tst_dev *d, const char *what, const lmk_buffer *in, lmk_buffer *out, const lmk_buffer *pos,
                          const lmk_rope_multi_params *p, const char *n1, const char *n2, const char *n3)
{
    lmk_clear_error();
    const lmk_status st = lmk_rope_multi(d->stream, in, out, pos, p);
    lmk_stream_sync(d->stream);
    const bool unchanged = all_poison(out);
    CHECK(st == LMK_ERR_INVALID_ARGUMENT && tst_msg_has("rope_multi", n1, n2, n3, NULL) && unchanged,
          "[%s] %s: %s \"%s\" (want INVALID_ARGUMENT naming \"%s\" \"%s\" \"%s\")%s", d->name, what,
          lmk_status_name(st), lmk_last_error(), n1 ? n1 : "", n2 ? n2 : "", n3 ? n3 : "",
          unchanged ? "" : "; the output was written");
}

static void test_validation(tst_dev *d)
{
    /* Start from a call that breaks every rule (and the mode and pairing), mend one rule at a time:
     * each step must report the first rule still broken, in lmk.h's order. Final shape: seq 3,
     * 2 heads, head_dim 8, rope_dim 4 = 48 elements, 12 positions. */
    lmk_buffer *in_u8_47 = poisoned(d, LMK_U8, 47), *in_u8_48 = poisoned(d, LMK_U8, 48);
    lmk_buffer *out_f32_49 = poisoned(d, LMK_F32, 49), *out_f32_48 = poisoned(d, LMK_F32, 48);
    lmk_buffer *out_u8_48 = poisoned(d, LMK_U8, 48), *in_f32_48 = poisoned(d, LMK_F32, 48);
    lmk_buffer *pos_f32_11 = poisoned(d, LMK_F32, 11), *pos_f32_12 = poisoned(d, LMK_F32, 12);
    lmk_buffer *pos_i32 = NULL;
    int32_t pos_host[12];
    tst_positions_text(pos_host, 3, 7);
    pos_i32 = tst_buf(d->dev, LMK_I32, NULL, 0, sizeof pos_host, 0, pos_host, sizeof pos_host, -1);
    if (!in_u8_47 || !in_u8_48 || !out_f32_49 || !out_f32_48 || !out_u8_48 || !in_f32_48 || !pos_f32_11 ||
        !pos_f32_12 || !pos_i32)
        goto done;
    {
        float x[48];
        for (int i = 0; i < 48; i++)
            x[i] = (float)i / 48.0f;
        lmk_buffer_write(in_f32_48, 0, x, sizeof x);
    }
    lmk_rope_multi_params p = {.head_dim = 7, .rope_dim = 10, .n_heads = 0, .seq_len = 3, .freq_base = INFINITY,
                               .mode = (lmk_rope_mode)7, .sections = {1, 1, 0, 0}, .pairing = (lmk_rope_pairing)5};
    expect_reject(d, "rule 1 (n_heads 0), every later rule broken too", in_u8_47, out_f32_49, pos_f32_11, &p,
                  "rope_multi:", "must all be > 0", NULL);
    p.n_heads = 2;
    expect_reject(d, "rule 2 (head_dim 7)", in_u8_47, out_f32_49, pos_f32_11, &p,
                  "rope_multi: head_dim and rope_dim must be even", NULL, NULL);
    p.head_dim = 8;
    expect_reject(d, "rule 3 (rope_dim 10 > head_dim 8)", in_u8_47, out_f32_49, pos_f32_11, &p,
                  "rope_dim must be <= head_dim", "10", "8");
    p.rope_dim = 4;
    expect_reject(d, "rule 4 (freq_base inf)", in_u8_47, out_f32_49, pos_f32_11, &p,
                  "freq_base must be finite and positive, got inf", NULL, NULL);
    p.freq_base = 1e4f;
    expect_reject(d, "rule 5 (input 47 elements)", in_u8_47, out_f32_49, pos_f32_11, &p, "input element count 47",
                  "48", NULL);
    expect_reject(d, "rule 6 (output 49 elements)", in_u8_48, out_f32_49, pos_f32_11, &p, "output element count 49",
                  "48", NULL);
    expect_reject(d, "rule 7 (u8 vs f32)", in_u8_48, out_f32_48, pos_f32_11, &p, "mismatch", "u8", "f32");
    expect_reject(d, "rule 8 (11 positions)", in_u8_48, out_u8_48, pos_f32_11, &p, "positions length 11", "12", NULL);
    expect_reject(d, "rule 9 (f32 positions)", in_u8_48, out_u8_48, pos_f32_12, &p, "i32 or u32", "f32", NULL);
    expect_reject(d, "rule 10 (u8 input)", in_u8_48, out_u8_48, pos_i32, &p, "u8", "dtype", NULL);
    expect_reject(d, "unknown mode 7", in_f32_48, out_f32_48, pos_i32, &p, "mode", "7", NULL);
    p.mode = LMK_ROPE_IMROPE;
    expect_reject(d, "unknown pairing 5", in_f32_48, out_f32_48, pos_i32, &p, "pairing", "5", NULL);
    p.pairing = LMK_ROPE_PAIR_HALF_HEAD;
    lmk_status st = lmk_rope_multi(d->stream, in_f32_48, out_f32_48, pos_i32, &p);
    CHECK(st == LMK_OK && lmk_stream_sync(d->stream) == LMK_OK, "[%s] the mended call: %s \"%s\"", d->name,
          lmk_status_name(st), lmk_last_error());
    lmk_buffer_free(out_f32_48);
    out_f32_48 = poisoned(d, LMK_F32, 48);
    if (!out_f32_48)
        goto done;

    /* Rule 1 for each of the four, rule 2 for each of the two. */
    const lmk_rope_multi_params good = p;
    for (int i = 0; i < 4; i++) {
        lmk_rope_multi_params q = good;
        uint32_t *f[4] = {&q.head_dim, &q.rope_dim, &q.n_heads, &q.seq_len};
        *f[i] = 0;
        expect_reject(d, "a zero dim", in_f32_48, out_f32_48, pos_i32, &q, "must all be > 0", NULL, NULL);
    }
    {
        lmk_rope_multi_params q = good;
        q.head_dim = 15; /* the seed's rejection vector */
        expect_reject(d, "odd head_dim 15", in_f32_48, out_f32_48, pos_i32, &q,
                      "rope_multi: head_dim and rope_dim must be even", "15", NULL);
        q = good;
        q.rope_dim = 3;
        expect_reject(d, "odd rope_dim 3", in_f32_48, out_f32_48, pos_i32, &q, "must be even", "3", NULL);
        q = good;
        q.rope_dim = 16;
        q.head_dim = 8; /* the seed's: rope_dim 16 > head_dim 8 */
        expect_reject(d, "rope_dim 16 > head_dim 8", in_f32_48, out_f32_48, pos_i32, &q,
                      "rope_multi: rope_dim must be <= head_dim", "16", NULL);
    }
    /* Rule 4 for every kind of bad base, the value in the message. */
    const struct {
        float v;
        const char *shown;
    } bases[] = {{INFINITY, "inf"}, {-INFINITY, "-inf"}, {NAN, "nan"}, {0.0f, "got 0"}, {-1.0f, "got -1"},
                 {-0.0f, "got -0"}, {-1e7f, "got -1e+07"}};
    for (size_t i = 0; i < sizeof bases / sizeof bases[0]; i++) {
        lmk_rope_multi_params q = good;
        q.freq_base = bases[i].v;
        expect_reject(d, "bad freq_base", in_f32_48, out_f32_48, pos_i32, &q, "freq_base must be finite and positive",
                      bases[i].shown, NULL);
    }
    /* Unknown modes near the known ones, and unknown pairings. */
    const int modes[] = {0, 2, 24, 41, -8};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        lmk_rope_multi_params q = good;
        q.mode = (lmk_rope_mode)modes[i];
        char v[16];
        snprintf(v, sizeof v, "%d", modes[i]);
        expect_reject(d, "unknown mode", in_f32_48, out_f32_48, pos_i32, &q, "mode", v, NULL);
    }
    const int pairings[] = {2, -1, 100};
    for (size_t i = 0; i < sizeof pairings / sizeof pairings[0]; i++) {
        lmk_rope_multi_params q = good;
        q.pairing = (lmk_rope_pairing)pairings[i];
        char v[16];
        snprintf(v, sizeof v, "%d", pairings[i]);
        expect_reject(d, "unknown pairing", in_f32_48, out_f32_48, pos_i32, &q, "pairing", v, NULL);
    }
    /* A buffer whose byte length holds the elements but whose shape does not: the shape counts. */
    {
        const size_t shape47[1] = {47};
        lmk_buffer *big = tst_buf(d->dev, LMK_F32, shape47, 1, 47 * 4, 64, NULL, 0, 0);
        if (big)
            expect_reject(d, "input of 47 elements in a 252-byte buffer", big, out_f32_48, pos_i32, &good,
                          "input element count 47", NULL, NULL);
        lmk_buffer_free(big);
    }
    /* u32 positions are accepted; i32 of the wrong length is not. */
    {
        lmk_buffer *pos_u32 = tst_buf(d->dev, LMK_U32, NULL, 0, sizeof pos_host, 0, pos_host, sizeof pos_host, -1);
        lmk_buffer *o = poisoned(d, LMK_F32, 48);
        st = pos_u32 && o ? lmk_rope_multi(d->stream, in_f32_48, o, pos_u32, &good) : LMK_ERR_OUT_OF_MEMORY;
        lmk_stream_sync(d->stream);
        CHECK(st == LMK_OK && !all_poison(o), "[%s] u32 positions: %s \"%s\"", d->name, lmk_status_name(st),
              lmk_last_error());
        lmk_buffer_free(pos_u32);
        lmk_buffer_free(o);
    }
    /* NULL arguments. */
    expect_reject(d, "NULL input", NULL, out_f32_48, pos_i32, &good, "NULL", NULL, NULL);
    expect_reject(d, "NULL positions", in_f32_48, out_f32_48, NULL, &good, "NULL", NULL, NULL);
    expect_reject(d, "NULL params", in_f32_48, out_f32_48, pos_i32, NULL, "NULL", NULL, NULL);
    st = lmk_rope_multi(d->stream, in_f32_48, NULL, pos_i32, &good);
    CHECK(st == LMK_ERR_INVALID_ARGUMENT, "[%s] NULL output: %s", d->name, lmk_status_name(st));
    st = lmk_rope_multi(NULL, in_f32_48, out_f32_48, pos_i32, &good);
    CHECK(st == LMK_ERR_INVALID_ARGUMENT && all_poison(out_f32_48), "[%s] NULL stream: %s", d->name,
          lmk_status_name(st));

    /* Overlaps: output partly over the input, output over the positions. */
    {
        lmk_buffer *parent = poisoned(d, LMK_F32, 256), *vin = NULL, *vout = NULL, *vpos = NULL;
        const size_t s48[1] = {48}, s12[1] = {12};
        if (parent && lmk_buffer_view(parent, 0, LMK_F32, s48, 1, &vin) == LMK_OK &&
            lmk_buffer_view(parent, 4, LMK_F32, s48, 1, &vout) == LMK_OK) {
            expect_reject(d, "output 4 bytes past the input (partial overlap)", vin, vout, pos_i32, &good, "overlap",
                          NULL, NULL);
            lmk_buffer_free(vout);
            vout = NULL;
            if (lmk_buffer_view(parent, 188, LMK_F32, s48, 1, &vout) == LMK_OK) /* [188, 380): input's end */
                expect_reject(d, "output starting 4 bytes before the input ends", vin, vout, pos_i32, &good,
                              "overlap", NULL, NULL);
            lmk_buffer_free(vout);
            vout = NULL;
            if (lmk_buffer_view(parent, 400, LMK_F32, s48, 1, &vout) == LMK_OK &&
                lmk_buffer_view(parent, 560, LMK_I32, s12, 1, &vpos) == LMK_OK) /* [560, 608) inside [400, 592) */
                expect_reject(d, "output over the positions", in_f32_48, vout, vpos, &good, "overlap", NULL, NULL);
        }
        lmk_buffer_free(vpos);
        lmk_buffer_free(vout);
        lmk_buffer_free(vin);
        lmk_buffer_free(parent);
    }
    /* A buffer of another device handle. */
    {
        lmk_device *other = NULL;
        if (lmk_device_open(d->backend, 0, &other) == LMK_OK) {
            lmk_buffer *o = tst_buf(other, LMK_F32, NULL, 0, 48 * 4, 0, NULL, 0, TST_POISON);
            if (o)
                expect_reject(d, "output on another device", in_f32_48, o, pos_i32, &good, "device", NULL, NULL);
            lmk_buffer_free(o);
            lmk_device_close(other);
        }
    }

    /* rope_multi_qk: its own rules, messages naming q or k, and no output written on rejection. */
    {
        lmk_buffer *q = in_f32_48, *qo = out_f32_48, *k = poisoned(d, LMK_F32, 24), *ko = poisoned(d, LMK_F32, 24);
        lmk_buffer *k_bf16 = poisoned(d, LMK_BF16, 24), *ko_bf16 = poisoned(d, LMK_BF16, 24);
        lmk_buffer *k_bad = poisoned(d, LMK_F32, 23), *qo_bad = poisoned(d, LMK_F32, 47);
        lmk_buffer *kq_view = NULL;
        const size_t s24v[1] = {24};
        if (q && lmk_buffer_view(q, 32, LMK_F32, s24v, 1, &kq_view) != LMK_OK)
            kq_view = NULL;
        if (k && ko && k_bf16 && ko_bf16 && k_bad && qo_bad && kq_view) {
            float kx[24];
            for (int i = 0; i < 24; i++)
                kx[i] = 0.25f;
            lmk_buffer_write(k, 0, kx, sizeof kx);
            struct {
                const char *what;
                const lmk_buffer *qi;
                lmk_buffer *qo;
                const lmk_buffer *ki;
                lmk_buffer *ko;
                uint32_t nk;
                const char *n1, *n2;
            } bad[] = {
                {"n_k_heads 0", q, qo, k, ko, 0, "n_k_heads", NULL},
                {"k input of 23 elements", q, qo, k_bad, ko, 1, "k ", "input element count 23"},
                {"q output of 47 elements", q, qo_bad, k, ko, 1, "q ", "output element count 47"},
                {"k with 2 heads of 24 elements", q, qo, k, ko, 2, "k ", "input element count 24"},
                {"q f32, k bf16", q, qo, k_bf16, ko_bf16, 1, "f32", "bf16"},
                {"q output == k output", q, qo, q, qo, 2, "overlap", NULL},
                {"k output over the q input", q, qo, k, kq_view, 1, "overlap", NULL},
            };
            for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
                lmk_clear_error();
                st = lmk_rope_multi_qk(d->stream, bad[i].qi, bad[i].qo, bad[i].ki, bad[i].ko, pos_i32, &good,
                                       bad[i].nk);
                lmk_stream_sync(d->stream);
                const bool unchanged = all_poison(qo) && all_poison(ko) && all_poison(qo_bad) && all_poison(ko_bf16);
                CHECK(st == LMK_ERR_INVALID_ARGUMENT && tst_msg_has("rope_multi", bad[i].n1, bad[i].n2, NULL) &&
                          unchanged,
                      "[%s] rope_multi_qk %s: %s \"%s\"%s", d->name, bad[i].what, lmk_status_name(st),
                      lmk_last_error(), unchanged ? "" : "; an output was written");
            }
            /* every parameter rule applies to the fused call too */
            lmk_rope_multi_params q2 = good;
            q2.freq_base = NAN;
            st = lmk_rope_multi_qk(d->stream, q, qo, k, ko, pos_i32, &q2, 1);
            CHECK(st == LMK_ERR_INVALID_ARGUMENT && tst_msg_has("rope_multi", "freq_base", "nan", NULL) &&
                      all_poison(qo) && all_poison(ko),
                  "[%s] rope_multi_qk freq_base nan: %s \"%s\"", d->name, lmk_status_name(st), lmk_last_error());
            q2 = good;
            q2.mode = (lmk_rope_mode)9;
            st = lmk_rope_multi_qk(d->stream, q, qo, k, ko, pos_i32, &q2, 1);
            CHECK(st == LMK_ERR_INVALID_ARGUMENT && tst_msg_has("mode", "9", NULL) && all_poison(qo) && all_poison(ko),
                  "[%s] rope_multi_qk mode 9: %s \"%s\"", d->name, lmk_status_name(st), lmk_last_error());
            st = lmk_rope_multi_qk(d->stream, q, qo, k, NULL, pos_i32, &good, 1);
            CHECK(st == LMK_ERR_INVALID_ARGUMENT && all_poison(qo), "[%s] rope_multi_qk NULL k output: %s", d->name,
                  lmk_status_name(st));
            /* k output partly over the positions */
            lmk_buffer *parent = poisoned(d, LMK_F32, 64), *vko = NULL, *vpos = NULL;
            const size_t s24[1] = {24}, s12[1] = {12};
            if (parent && lmk_buffer_view(parent, 0, LMK_F32, s24, 1, &vko) == LMK_OK &&
                lmk_buffer_view(parent, 64, LMK_I32, s12, 1, &vpos) == LMK_OK &&
                lmk_buffer_write(vpos, 0, pos_host, sizeof pos_host) == LMK_OK) {
                st = lmk_rope_multi_qk(d->stream, q, qo, k, vko, vpos, &good, 1);
                CHECK(st == LMK_ERR_INVALID_ARGUMENT && tst_msg_has("overlap", NULL) && all_poison(qo),
                      "[%s] rope_multi_qk k output over the positions: %s \"%s\"", d->name, lmk_status_name(st),
                      lmk_last_error());
            }
            lmk_buffer_free(vko);
            lmk_buffer_free(vpos);
            lmk_buffer_free(parent);
            /* the valid call, both in place */
            lmk_buffer *qq = poisoned(d, LMK_F32, 48);
            float qx[48];
            for (int i = 0; i < 48; i++)
                qx[i] = 0.5f;
            if (qq && lmk_buffer_write(qq, 0, qx, sizeof qx) == LMK_OK) {
                st = lmk_rope_multi_qk(d->stream, qq, qq, k, k, pos_i32, &good, 1);
                lmk_stream_sync(d->stream);
                float back[48];
                CHECK(st == LMK_OK && lmk_buffer_read(qq, 0, back, sizeof back) == LMK_OK &&
                          memcmp(back, qx, sizeof qx) != 0,
                      "[%s] rope_multi_qk both in place: %s \"%s\"", d->name, lmk_status_name(st), lmk_last_error());
            }
            lmk_buffer_free(qq);
        }
        lmk_buffer_free(kq_view);
        lmk_buffer_free(k);
        lmk_buffer_free(ko);
        lmk_buffer_free(k_bf16);
        lmk_buffer_free(ko_bf16);
        lmk_buffer_free(k_bad);
        lmk_buffer_free(qo_bad);
    }
done:
    lmk_buffer_free(in_u8_47);
    lmk_buffer_free(in_u8_48);
    lmk_buffer_free(out_f32_49);
    lmk_buffer_free(out_f32_48);
    lmk_buffer_free(out_u8_48);
    lmk_buffer_free(in_f32_48);
    lmk_buffer_free(pos_f32_11);
    lmk_buffer_free(pos_f32_12);
    lmk_buffer_free(pos_i32);
}

int main(void)
{
    tst_program_seed();
    const double t0 = tst_now();
    tst_dev devs[TST_MAX_DEVS];
    const int n = tst_devs_open_isas(devs);
    for (int i = 0; i < n; i++) {
        printf("[%s] %s\n", devs[i].name, lmk_device_name(devs[i].dev));
        test_seed_vectors(&devs[i]);
        test_pairing_trap(&devs[i]);
        test_model_shapes(&devs[i]);
        test_edges(&devs[i]);
        test_validation(&devs[i]);
    }
    tst_devs_close(devs, n);
    printf("test_rope: %.2f s\n", tst_now() - t0);
    return harness_summary();
}
