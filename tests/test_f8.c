/*
 * test_f8.c - the FP8 E4M3FN conversions of lmk.h (lmk_f8e4m3_to_f32, lmk_f32_to_f8e4m3).
 *
 * Widening is checked on all 256 codes against a decode written field by field here. Narrowing is
 * checked against an independent float64 rounding (here, below) on every f32 rounding boundary:
 * for each pair of neighbouring E4M3 values, the midpoint and the f32 values one and two ulps on
 * either side of it, and each value itself, in both signs; on zeros, subnormals of both formats,
 * the saturation edge (448, 464, infinity) and NaN payloads; and on a million random f32 bit
 * patterns. (The library's conversion was also compared with this reference on all 2^32 inputs
 * when it was written: too slow for every run.)
 *
 * On each CUDA device, the f8 cache write of lmk_attn_prologue (the kernel's own conversion: a
 * hardware instruction on sm_89 and later) is compared with lmk_f32_to_f8e4m3 bit for bit: v rows
 * of f32 values with v_scale 1 (stored = f8(x)), in pairs as the kernel converts them. Every f32
 * bit pattern whose exponent field is 0x00 (zeros, subnormals), 0x60-0x8f (2^-31 to 2^17: every
 * rounding boundary, the subnormal codes, the saturation edge) or 0xff (infinities, every NaN
 * payload), both signs: 839 M inputs, under LMK_TEST_QUICK; otherwise all 2^32. Then every bf16
 * pattern through the bf16 kernel; then x * (1 / scale) for scales with no exact reciprocal, powers
 * of two, and the valid range's tiny and huge ones, on the inputs around every rounding boundary
 * (check_scales; the CPU's cache write too).
 * Without a GPU this part prints a SKIP line.
 */
#include "harness.h"
#include "lmk.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

HARNESS_DEFINE;

/* E4M3FN value of a code: sign, exponent (bias 7, 0 is subnormal), 3 mantissa bits; 0x7F and 0xFF
 * are NaN. */
static double decode(uint8_t c)
{
    const int e = (c >> 3) & 15, m = c & 7;
    const double mag = e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
    return (c & 0x80) ? -mag : mag;
}

static bool is_nan_code(uint8_t c)
{
    return (c & 0x7f) == 0x7f;
}

/* Nearest-even E4M3 code of f by searching the 127 non-negative finite values in float64. */
static uint8_t encode_ref(float f)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    const uint8_t sign = (uint8_t)((b >> 24) & 0x80);
    if (isnan(f))
        return sign | 0x7f;
    const double a = fabs((double)f);
    if (a > 448.0) /* lmk.h: saturating (the nearest finite value is 448 up to 464, and past it too) */
        return sign | 0x7e;
    uint8_t best = 0;
    for (uint8_t c = 1; c <= 0x7e; c++) {
        const double d = fabs(decode(c) - a), db = fabs(decode(best) - a);
        if (d < db || (d == db && (c & 1) == 0 && (best & 1) == 1))
            best = c;
    }
    return sign | best;
}

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static int n_bad;

static void check_one(float f)
{
    const uint8_t got = lmk_f32_to_f8e4m3(f), want = encode_ref(f);
    if (got != want && n_bad++ < 10) {
        uint32_t b;
        memcpy(&b, &f, 4);
        CHECK(0, "lmk_f32_to_f8e4m3(%a = 0x%08x) = 0x%02x, want 0x%02x", (double)f, b, got, want);
    }
}

/* f and the f32 values up to two ulps on either side. */
static void check_around(float f)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    for (int d = -2; d <= 2; d++)
        check_one(from_bits(b + (uint32_t)d));
}

/* ---- the cache write (CUDA's kernels, the CPU's row path) against lmk_f32_to_f8e4m3 ---- */

enum { G_T = 16384, G_DV = 4096, G_D = 8 }; /* one CUDA call converts G_T * G_DV = 2^26 values */

typedef struct f8_rig {
    lmk_device *dev;
    lmk_stream *s;
    lmk_dtype dt;
    size_t T;        /* tokens: one call converts T * G_DV values */
    size_t D;        /* head_dim of q and k */
    char name[16];   /* the device, for messages */
    lmk_buffer *q, *qo, *k, *kc, *v, *vc, *pos, *slots;
} f8_rig;

static void rig_free(f8_rig *g)
{
    lmk_buffer *b[] = {g->q, g->qo, g->k, g->kc, g->v, g->vc, g->pos, g->slots};
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++)
        lmk_buffer_free(b[i]);
    if (g->s)
        lmk_stream_destroy(g->s);
    if (g->dev)
        lmk_device_close(g->dev);
}

static lmk_status alloc3(f8_rig *g, lmk_dtype dt, size_t a, size_t b, size_t c, lmk_buffer **out)
{
    const size_t shape[3] = {a, b, c};
    return lmk_buffer_alloc(g->dev, a * b * c * lmk_dtype_size(dt), dt, shape, 3, out);
}

/* q, k: [T, 1, D] zeros (rotated, then ignored; D = G_D on a GPU, 128 on the CPU, whose row path,
 * the one a model's rows take, wants rows of whole vectors); v: [T, 1, G_DV] in dt; caches of T
 * rows, the v cache f8; slots 0..T-1. T <= G_T. */
static bool rig_open(f8_rig *g, lmk_backend be, int ordinal, lmk_dtype dt, size_t T)
{
    memset(g, 0, sizeof *g);
    g->dt = dt, g->T = T, g->D = be == LMK_BACKEND_CPU ? 128 : G_D;
    const size_t D = g->D;
    if (be == LMK_BACKEND_CPU)
        snprintf(g->name, sizeof g->name, "cpu");
    else
        snprintf(g->name, sizeof g->name, "cuda:%d", ordinal);
    const size_t es = lmk_dtype_size(dt), one[1] = {T};
    bool ok = lmk_device_open(be, ordinal, &g->dev) == LMK_OK && lmk_stream_create(g->dev, &g->s) == LMK_OK &&
              alloc3(g, dt, T, 1, D, &g->q) == LMK_OK && alloc3(g, dt, T, 1, D, &g->qo) == LMK_OK &&
              alloc3(g, dt, T, 1, D, &g->k) == LMK_OK && alloc3(g, dt, T, 1, D, &g->kc) == LMK_OK &&
              alloc3(g, dt, T, 1, G_DV, &g->v) == LMK_OK && alloc3(g, LMK_F8E4M3, T, 1, G_DV, &g->vc) == LMK_OK &&
              lmk_buffer_alloc(g->dev, T * 4, LMK_I32, one, 1, &g->pos) == LMK_OK &&
              lmk_buffer_alloc(g->dev, T * 4, LMK_I32, one, 1, &g->slots) == LMK_OK;
    if (ok) {
        int32_t *h = calloc(T, 4);
        void *z = calloc(T * D, es);
        ok = h && z && lmk_buffer_write(g->pos, 0, h, T * 4) == LMK_OK &&
             lmk_buffer_write(g->q, 0, z, T * D * es) == LMK_OK &&
             lmk_buffer_write(g->k, 0, z, T * D * es) == LMK_OK;
        for (size_t i = 0; ok && i < T; i++)
            h[i] = (int32_t)i;
        ok = ok && lmk_buffer_write(g->slots, 0, h, T * 4) == LMK_OK;
        free(h);
        free(z);
    }
    CHECK(ok, "%s: setting up the f8 conversion check: %s", g->name, lmk_last_error());
    return ok;
}

/* Writes n = T * G_DV values (in g->dt) to v, runs the prologue with v_scale (0 means 1), reads the
 * f8 cache into codes. */
static bool rig_run(f8_rig *g, const void *vals, float v_scale, uint8_t *codes)
{
    const size_t n = g->T * G_DV;
    const lmk_rope_params rp = {.head_dim = (uint32_t)g->D, .rope_dim = (uint32_t)g->D, .n_heads = 1, .n_k_heads = 1,
                                .seq_len = (uint32_t)g->T, .freq_base = 10000.0f, .mode = LMK_ROPE_NEOX};
    const lmk_rms_norm_params nm = {.eps = 1e-6f};
    const lmk_attn_prologue_io io = {.q_in = g->q, .k_in = g->k, .v_in = g->v, .positions = g->pos,
                                     .slots = g->slots, .q_out = g->qo, .k_cache = g->kc, .v_cache = g->vc,
                                     .v_scale = v_scale};
    const bool ok = lmk_buffer_write(g->v, 0, vals, n * lmk_dtype_size(g->dt)) == LMK_OK &&
                    lmk_attn_prologue(g->s, &io, &rp, &nm) == LMK_OK && lmk_stream_sync(g->s) == LMK_OK &&
                    lmk_buffer_read(g->vc, 0, codes, n) == LMK_OK;
    CHECK(ok, "the f8 cache write on %s: %s", g->name, lmk_last_error());
    return ok;
}

static bool env_set(const char *name)
{
    const char *e = getenv(name);
    return e && *e && strcmp(e, "0") != 0;
}

/* lmk.h's f8 cache rule: the f32 product x * inv with inv = 1.0f / scale (in f32, to nearest),
 * then lmk_f32_to_f8e4m3. */
static uint8_t scaled_code(float x, float scale)
{
    const float inv = 1.0f / scale;
    return lmk_f32_to_f8e4m3(x * inv);
}

/* The f8 cache write with scales that have no exact reciprocal (where x * inv and x / scale can
 * differ by an f32 ulp, and a backend that divides, or forms inv otherwise, gives other codes),
 * powers of two, and tiny and huge scales (lmk.h's range is [2^-126, 2^126]). The inputs a wrong
 * product would show: for every E4M3 value and every midpoint between neighbours (the rounding
 * boundaries), in both signs, the f32 values within 8 ulps of value * scale, whose products land
 * within a few ulps of the boundary; the special values; the rest of the T * G_DV inputs (2^26 on a
 * GPU) random bit patterns (any exponent). Compared with scaled_code bit for bit. */
static void check_scales(f8_rig *g, uint32_t *vals, uint8_t *codes)
{
    const float scales[] = {0.0173f, 0.0291f, 3.0f, 1.0f / 3.0f, 0x1.fffffep-1f, 0x1.000002p0f, 7.1e-5f, 1234.567f,
                            0x1.7p-64f, 0x1.3p63f, 1e-30f, 3e30f, 0x1p-126f, 0x1.fffffep125f, 0.0625f, 448.0f};
    const uint32_t special[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7f7fffffu, 0xff7fffffu,
                                0x00000001u, 0x80000001u, 0x007fffffu, 0x00800000u, 0x7fc00000u, 0xffc00001u};
    const size_t n = g->T * G_DV;
    uint64_t x = 0x2545f4914f6cdd1dull;
    for (size_t si = 0; si < sizeof scales / sizeof scales[0]; si++) {
        const float sc = scales[si];
        size_t m = 0;
        for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
            vals[m++] = special[i];
        for (int sgn = 0; sgn < 2; sgn++)
            for (int c = 0; c <= 0x7e; c++) {
                const double lo = decode((uint8_t)c), hi = c < 0x7e ? decode((uint8_t)(c + 1)) : 464.0;
                const double at[2] = {lo, (lo + hi) / 2};
                for (int k = 0; k < 2; k++) {
                    const float t = (float)((sgn ? -at[k] : at[k]) * (double)sc);
                    uint32_t b;
                    memcpy(&b, &t, 4);
                    for (int d = -8; d <= 8; d++)
                        vals[m++] = b + (uint32_t)d;
                }
            }
        while (m < n) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            vals[m++] = (uint32_t)x;
        }
        if (!rig_run(g, vals, sc, codes))
            return;
        long long bad = 0;
        for (size_t k = 0; k < n; k++) {
            const uint8_t want = scaled_code(from_bits(vals[k]), sc);
            if (codes[k] != want && bad++ < 8)
                CHECK(0, "%s f32 -> f8 cache, v_scale %a: 0x%08x (%a) stored 0x%02x, want 0x%02x", g->name,
                      (double)sc, vals[k], (double)from_bits(vals[k]), codes[k], want);
        }
        CHECK(bad == 0, "%s: the f8 cache write with v_scale %g (%a) on %zu inputs: %lld differ from "
              "lmk_f32_to_f8e4m3(x * (1 / scale))", g->name, (double)sc, (double)sc, n, bad);
    }
}

/* Every f32 pattern with one of the chosen exponent fields (all 2^32 without LMK_TEST_QUICK), four
 * exponent fields (2^26 inputs) per call; then every bf16 pattern. */
static void check_gpu(int ordinal)
{
    const size_t n = (size_t)G_T * G_DV;
    uint32_t *vals = malloc(n * 4);
    uint8_t *codes = malloc(n);
    f8_rig g;
    if (!vals || !codes) {
        CHECK(0, "f8 conversion check: out of host memory");
        free(vals), free(codes);
        return;
    }
    int exps[256], ne = 0;
    const bool full = !env_set("LMK_TEST_QUICK");
    for (int e = 0; e < 256; e++)
        if (full || e == 0 || e == 0xff || (e >= 0x60 && e <= 0x8f))
            exps[ne++] = e;
    long long bad = 0, done = 0;
    if (rig_open(&g, LMK_BACKEND_CUDA, ordinal, LMK_F32, G_T)) {
        for (int i = 0; i < ne; i += 4) { /* 4 exponent fields x 2 signs x 2^23 = 2^26 */
            size_t m = 0;
            for (int j = i; j < i + 4; j++) {
                const uint32_t e = (uint32_t)exps[j < ne ? j : i]; /* a short last group repeats one */
                for (uint32_t sgn = 0; sgn < 2; sgn++)
                    for (uint32_t f = 0; f < (1u << 23); f++)
                        vals[m++] = (sgn << 31) | (e << 23) | f;
            }
            if (!rig_run(&g, vals, 0.0f, codes))
                break;
            for (size_t k = 0; k < n; k++) {
                const uint8_t want = lmk_f32_to_f8e4m3(from_bits(vals[k]));
                if (codes[k] != want && bad++ < 8)
                    CHECK(0, "cuda:%d f32 -> f8 cache: 0x%08x (%a) stored 0x%02x, lmk_f32_to_f8e4m3 gives 0x%02x",
                          ordinal, vals[k], (double)from_bits(vals[k]), codes[k], want);
            }
            done += (long long)n;
        }
        CHECK(bad == 0, "cuda:%d: the f32 kernel's f8 cache write on %lld inputs%s: %lld differ from "
              "lmk_f32_to_f8e4m3", ordinal, done, full ? " (every f32 pattern)" : "", bad);
    }
    rig_free(&g);
    bad = 0;
    if (rig_open(&g, LMK_BACKEND_CUDA, ordinal, LMK_BF16, G_T)) {
        uint16_t *h = (uint16_t *)vals;
        for (size_t k = 0; k < n; k++)
            h[k] = (uint16_t)k; /* every bf16 pattern, 1024 times over */
        if (rig_run(&g, h, 0.0f, codes))
            for (size_t k = 0; k < 65536; k++) {
                const uint8_t want = lmk_f32_to_f8e4m3(from_bits((uint32_t)h[k] << 16));
                if (codes[k] != want && bad++ < 8)
                    CHECK(0, "cuda:%d bf16 -> f8 cache: 0x%04x stored 0x%02x, lmk_f32_to_f8e4m3 gives 0x%02x",
                          ordinal, h[k], codes[k], want);
            }
        CHECK(bad == 0, "cuda:%d: the bf16 kernel's f8 cache write on every bf16 pattern: %lld differ", ordinal,
              bad);
    }
    rig_free(&g);
    if (rig_open(&g, LMK_BACKEND_CUDA, ordinal, LMK_F32, G_T))
        check_scales(&g, vals, codes);
    rig_free(&g);
    free(vals);
    free(codes);
}

int main(void)
{
    int widen_bad = 0;
    for (int c = 0; c < 256; c++) {
        const float got = lmk_f8e4m3_to_f32((uint8_t)c);
        const bool ok = is_nan_code((uint8_t)c) ? isnan(got)
                                                 : (double)got == decode((uint8_t)c) && !!signbit(got) == !!(c & 0x80);
        if (!ok && widen_bad++ < 5)
            CHECK(0, "lmk_f8e4m3_to_f32(0x%02x) = %a, want %a", c, (double)got, decode((uint8_t)c));
    }
    CHECK(widen_bad == 0, "widening: %d of 256 codes wrong", widen_bad);

    int round_trip_bad = 0;
    for (int c = 0; c < 256; c++)
        if (!is_nan_code((uint8_t)c) && lmk_f32_to_f8e4m3(lmk_f8e4m3_to_f32((uint8_t)c)) != c)
            round_trip_bad++;
    CHECK(round_trip_bad == 0, "narrowing a decoded code gives the code back: %d of 254 do not", round_trip_bad);

    n_bad = 0;
    for (int sgn = 0; sgn < 2; sgn++)
        for (int c = 0; c <= 0x7e; c++) {
            const double lo = decode((uint8_t)c), hi = c < 0x7e ? decode((uint8_t)(c + 1)) : 464.0;
            const double s = sgn ? -1.0 : 1.0;
            check_around((float)(s * lo));
            check_around((float)(s * (lo + hi) / 2)); /* midpoints are exact in f32 */
        }
    CHECK(n_bad == 0, "every rounding boundary: %d wrong", n_bad);

    n_bad = 0;
    const float special[] = {0.0f, -0.0f, 448.0f, 449.0f, 463.99f, 464.0f, 465.0f, 1e30f, INFINITY, -INFINITY,
                             0x1p-9f, 0x1p-10f, 0x1.8p-10f, 0x1p-11f, 0x1p-6f, 0x1.ffp-7f, 0x1p-149f, 0x1p-126f,
                             from_bits(0x7fc00000u), from_bits(0xffc00001u), from_bits(0x7f800001u)};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
        check_around(special[i]);
    CHECK(n_bad == 0, "zeros, subnormals, saturation, infinities, NaNs: %d wrong", n_bad);
    CHECK(lmk_f32_to_f8e4m3(INFINITY) == 0x7e && lmk_f32_to_f8e4m3(-INFINITY) == 0xfe &&
              lmk_f32_to_f8e4m3(from_bits(0x7fc00000u)) == 0x7f && lmk_f32_to_f8e4m3(from_bits(0xffc00000u)) == 0xff,
          "saturation and NaN codes as lmk.h states");

    n_bad = 0;
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 1000000; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        check_one(from_bits((uint32_t)x));
    }
    CHECK(n_bad == 0, "a million random f32 bit patterns: %d wrong", n_bad);

    /* The CPU's cache write with the same scales: 2^22 inputs a scale (LMK_TEST_QUICK: 2^20). */
    {
        const size_t T = env_set("LMK_TEST_QUICK") ? 256 : 1024;
        uint32_t *vals = malloc(T * G_DV * 4);
        uint8_t *codes = malloc(T * G_DV);
        f8_rig g;
        if (!vals || !codes)
            CHECK(0, "f8 conversion check on the CPU: out of host memory");
        else if (rig_open(&g, LMK_BACKEND_CPU, 0, LMK_F32, T))
            check_scales(&g, vals, codes);
        rig_free(&g);
        free(vals);
        free(codes);
    }

    const int n_gpu = lmk_device_count(LMK_BACKEND_CUDA);
    if (n_gpu <= 0)
        SKIP("the CUDA f8 cache write against lmk_f32_to_f8e4m3: no usable GPU");
    for (int d = 0; d < n_gpu; d++)
        check_gpu(d);
    return harness_summary();
}
