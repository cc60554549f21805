/*
 * test_runtime.c - everything of lmk except the ops: status names and per-thread messages, dtypes
 * and the exact bf16/f16 conversions, devices, buffers and streams.
 *
 * The conversions are checked against independent computations, never against the library's own
 * bit tricks: widening exhaustively over all 65536 inputs by decoding sign, exponent and mantissa
 * in double arithmetic; narrowing over a large sample of f32 bit patterns (every exponent, every
 * tie position, subnormals, overflow, every kind of NaN) against round-to-nearest-even done with
 * floor() on a double scaled by the format's quantum.
 */
#include "common.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

HARNESS_DEFINE;

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ------------------------------------------------------------------------------------------------
 * status, messages, version
 * ---------------------------------------------------------------------------------------------- */

static void test_status_names(void)
{
    static const struct {
        lmk_status s;
        const char *name;
    } names[] = {
        {LMK_OK, "LMK_OK"},
        {LMK_ERR_INVALID_ARGUMENT, "LMK_ERR_INVALID_ARGUMENT"},
        {LMK_ERR_UNSUPPORTED, "LMK_ERR_UNSUPPORTED"},
        {LMK_ERR_OUT_OF_MEMORY, "LMK_ERR_OUT_OF_MEMORY"},
        {LMK_ERR_DEVICE, "LMK_ERR_DEVICE"},
        {LMK_ERR_NOT_FOUND, "LMK_ERR_NOT_FOUND"},
    };
    (void)CHECK(LMK_OK == 0 && LMK_ERR_INVALID_ARGUMENT == 1 && LMK_ERR_UNSUPPORTED == 2 && LMK_ERR_OUT_OF_MEMORY == 3 &&
              LMK_ERR_DEVICE == 4 && LMK_ERR_NOT_FOUND == 5,
          "status enum values changed");
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *got = lmk_status_name(names[i].s);
        CHECK(got && strcmp(got, names[i].name) == 0, "lmk_status_name(%d) = \"%s\", want \"%s\"", (int)names[i].s,
              got ? got : "(null)", names[i].name);
    }
    const int bad[] = {6, 7, 100, -1, 0x7fffffff};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *got = lmk_status_name((lmk_status)bad[i]);
        CHECK(got && strcmp(got, "LMK_UNKNOWN_STATUS") == 0, "lmk_status_name(%d) = \"%s\", want LMK_UNKNOWN_STATUS",
              bad[i], got ? got : "(null)");
    }
}

static void test_version(void)
{
    /* One version everywhere: the library's string, the header's macros and CMake's project version
     * (which CMakeLists.txt reads from those macros; LMK_PROJECT_VERSION is defined by it). */
    const char *v = lmk_version();
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", LMK_VERSION_MAJOR, LMK_VERSION_MINOR, LMK_VERSION_PATCH);
    CHECK(v && strcmp(v, want) == 0, "lmk_version() = \"%s\", lmk.h's macros say %s", v ? v : "(null)", want);
    CHECK(strcmp(want, LMK_PROJECT_VERSION) == 0, "lmk.h's macros say %s, CMake's project version is %s", want,
          LMK_PROJECT_VERSION);
    const char *info = lmk_build_info();
    CHECK(info && *info, "lmk_build_info() is empty");
#ifdef LMK_WITH_CUDA
    CHECK(info && strstr(info, "cuda=yes"), "CUDA build but lmk_build_info() = \"%s\"", info ? info : "");
#else
    CHECK(info && strstr(info, "cuda=no"), "build without CUDA but lmk_build_info() = \"%s\"", info ? info : "");
#endif
}

static void test_messages(void)
{
    lmk_clear_error();
    CHECK(strcmp(lmk_last_error(), "") == 0, "after lmk_clear_error: \"%s\"", lmk_last_error());
    lmk_device *d = NULL;
    lmk_status st = lmk_device_open(LMK_BACKEND_CPU, -3, &d);
    CHECK(st == LMK_ERR_INVALID_ARGUMENT && d == NULL && tst_msg_has("lmk_device_open", "-3", NULL),
          "negative ordinal: %s \"%s\"", lmk_status_name(st), lmk_last_error());
    char first[512];
    snprintf(first, sizeof first, "%s", lmk_last_error());
    /* A successful call leaves the message alone. */
    st = lmk_device_open(LMK_BACKEND_CPU, 0, &d);
    CHECK(st == LMK_OK && strcmp(lmk_last_error(), first) == 0,
          "a successful call changed the message: \"%s\" -> \"%s\"", first, lmk_last_error());
    lmk_device_close(d);
    /* The next failure replaces it. */
    st = lmk_device_open((lmk_backend)77, 0, &d);
    CHECK(st == LMK_ERR_INVALID_ARGUMENT && tst_msg_has("77", NULL) && strcmp(lmk_last_error(), first) != 0,
          "unknown backend: %s \"%s\"", lmk_status_name(st), lmk_last_error());
    lmk_clear_error();
    CHECK(lmk_last_error()[0] == '\0', "lmk_clear_error left \"%s\"", lmk_last_error());
}

/* Two threads fail in turn; each must see only its own message, and a fresh thread none. */
typedef struct err_thread {
    pthread_barrier_t *bar;
    int which;
    char initial[512], before_own[512], after_other[512];
} err_thread;

static void *err_thread_main(void *arg)
{
    err_thread *t = arg;
    lmk_device *d = NULL;
    snprintf(t->initial, sizeof t->initial, "%s", lmk_last_error());
    pthread_barrier_wait(t->bar);
    if (t->which == 0)
        lmk_device_open(LMK_BACKEND_CPU, -111, &d); /* "ordinal (-111)" */
    pthread_barrier_wait(t->bar);
    snprintf(t->before_own, sizeof t->before_own, "%s", lmk_last_error());
    if (t->which == 1)
        lmk_device_open((lmk_backend)222, 0, &d); /* "unknown backend 222" */
    pthread_barrier_wait(t->bar);
    snprintf(t->after_other, sizeof t->after_other, "%s", lmk_last_error());
    return NULL;
}

static void test_messages_per_thread(void)
{
    lmk_device *d = NULL;
    lmk_device_open(LMK_BACKEND_CPU, -5, &d); /* the main thread's own message */
    char main_msg[512];
    snprintf(main_msg, sizeof main_msg, "%s", lmk_last_error());

    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, 2);
    err_thread t[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        memset(&t[i], 0, sizeof t[i]);
        t[i].bar = &bar;
        t[i].which = i;
        pthread_create(&th[i], NULL, err_thread_main, &t[i]);
    }
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&bar);

    CHECK(t[0].initial[0] == '\0' && t[1].initial[0] == '\0',
          "a new thread sees another thread's message: \"%s\" / \"%s\"", t[0].initial, t[1].initial);
    CHECK(strstr(t[0].before_own, "-111") != NULL, "thread 0 lost its message: \"%s\"", t[0].before_own);
    CHECK(t[1].before_own[0] == '\0', "thread 1 sees thread 0's message: \"%s\"", t[1].before_own);
    CHECK(strstr(t[0].after_other, "-111") && !strstr(t[0].after_other, "222"),
          "thread 0's message was changed by thread 1's failure: \"%s\"", t[0].after_other);
    CHECK(strstr(t[1].after_other, "222") && !strstr(t[1].after_other, "-111"),
          "thread 1's message is not its own: \"%s\"", t[1].after_other);
    CHECK(strcmp(lmk_last_error(), main_msg) == 0 && strstr(main_msg, "-5"),
          "the main thread's message changed: \"%s\" -> \"%s\"", main_msg, lmk_last_error());
}

/* ------------------------------------------------------------------------------------------------
 * dtypes and conversions
 * ---------------------------------------------------------------------------------------------- */

static void test_dtypes(void)
{
    static const struct {
        lmk_dtype t;
        size_t size;
        const char *name;
    } want[] = {
        {LMK_F32, 4, "f32"}, {LMK_F16, 2, "f16"}, {LMK_BF16, 2, "bf16"}, {LMK_U8, 1, "u8"},
        {LMK_U16, 2, "u16"}, {LMK_U32, 4, "u32"}, {LMK_I32, 4, "i32"}, {LMK_I64, 8, "i64"},
        {LMK_F8E4M3, 1, "f8e4m3"},
    };
    _Static_assert(LMK_F32 == 0 && LMK_F16 == 1 && LMK_BF16 == 2 && LMK_U8 == 3 && LMK_U16 == 4 && LMK_U32 == 5 &&
                       LMK_I32 == 6 && LMK_I64 == 7 && LMK_F8E4M3 == 8 && LMK_DTYPE_COUNT == 9,
                   "dtype enum values are part of the ABI");
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const size_t s = lmk_dtype_size(want[i].t);
        const char *n = lmk_dtype_name(want[i].t);
        CHECK(s == want[i].size && n && strcmp(n, want[i].name) == 0, "dtype %d: size %zu name \"%s\", want %zu \"%s\"",
              (int)want[i].t, s, n ? n : "(null)", want[i].size, want[i].name);
    }
    const int bad[] = {9, 10, -1, 1000};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const size_t s = lmk_dtype_size((lmk_dtype)bad[i]);
        const char *n = lmk_dtype_name((lmk_dtype)bad[i]);
        CHECK(s == 0 && n && strcmp(n, "invalid") == 0, "dtype %d: size %zu name \"%s\", want 0 \"invalid\"", bad[i], s,
              n ? n : "(null)");
    }
}

/* The value of a bf16 (f16) bit pattern, decoded field by field in double arithmetic. */
static double decode_half(uint16_t h, int is_bf16)
{
    const int mbits = is_bf16 ? 7 : 10, ebits = is_bf16 ? 8 : 5, bias = is_bf16 ? 127 : 15;
    const int sign = h >> 15, e = (h >> mbits) & ((1 << ebits) - 1), m = h & ((1 << mbits) - 1);
    double v;
    if (e == (1 << ebits) - 1)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp((double)m, 1 - bias - mbits);
    else
        v = ldexp(1.0 + ldexp((double)m, -mbits), e - bias);
    return sign ? -v : v;
}

static void test_widening_exhaustive(void)
{
    for (int is_bf16 = 0; is_bf16 < 2; is_bf16++) {
        const char *name = is_bf16 ? "bf16" : "f16";
        const int mbits = is_bf16 ? 7 : 10;
        size_t bad = 0, bad_rt = 0;
        uint32_t first = 0, first_rt = 0;
        uint32_t first_got = 0, first_want = 0;
        for (uint32_t h = 0; h < 65536; h++) {
            const uint16_t x = (uint16_t)h;
            const float got = is_bf16 ? lmk_bf16_to_f32(x) : lmk_f16_to_f32(x);
            const double v = decode_half(x, is_bf16);
            const uint32_t gb = f32_bits(got);
            uint32_t wb;
            if (isnan(v)) /* sign and payload kept: the payload moves to the top of the f32 mantissa */
                wb = ((uint32_t)(x >> 15) << 31) | 0x7f800000u | ((uint32_t)(x & ((1u << mbits) - 1)) << (23 - mbits));
            else
                wb = f32_bits((float)v); /* exact: every bf16/f16 value is an f32 */
            if (gb != wb) {
                if (!bad++) {
                    first = h;
                    first_got = gb;
                    first_want = wb;
                }
            }
            /* Narrowing what was widened gives it back (NaNs: some NaN of the same sign). */
            const uint16_t back = is_bf16 ? lmk_f32_to_bf16(got) : lmk_f32_to_f16(got);
            const bool ok = isnan(v) ? (back & 0x7fffu) > (is_bf16 ? 0x7f80u : 0x7c00u) && (back >> 15) == (x >> 15)
                                     : back == x;
            if (!ok && !bad_rt++)
                first_rt = h;
        }
        CHECK(bad == 0, "%s -> f32 over all 65536 inputs: %zu wrong, first 0x%04x -> 0x%08x, want 0x%08x", name, bad,
              first, first_got, first_want);
        CHECK(bad_rt == 0, "%s -> f32 -> %s round trip: %zu wrong, first 0x%04x", name, name, bad_rt, first_rt);
    }
}

/* Round-to-nearest-even of finite x to a binary format with p significand bits, smallest normal
 * exponent emin and largest finite value max_finite, in double arithmetic: scale by the quantum of
 * x's binade (or the subnormal quantum), floor, compare the remainder with one half. */
static double round_format(double x, int p, int emin, double max_finite)
{
    if (x == 0.0)
        return x;
    const double ax = fabs(x);
    int e;
    frexp(ax, &e); /* ax in [2^(e-1), 2^e) */
    int qe = e - p;
    if (qe < emin - (p - 1))
        qe = emin - (p - 1);
    const double q = ldexp(1.0, qe);
    const double n = ax / q; /* exact: a power-of-two scaling */
    double r = floor(n);
    const double frac = n - r;
    if (frac > 0.5 || (frac == 0.5 && fmod(r, 2.0) == 1.0))
        r += 1.0;
    double res = r * q;
    if (res > max_finite)
        res = INFINITY;
    return copysign(res, x);
}

/* The f16 bit pattern of a value representable in f16 (or infinite), built field by field. */
static uint16_t encode_f16(double v)
{
    const uint16_t s = signbit(v) ? 0x8000u : 0u;
    const double a = fabs(v);
    if (isinf(a))
        return s | 0x7c00u;
    if (a == 0.0)
        return s;
    if (a < 0x1p-14)
        return (uint16_t)(s | (uint16_t)(a / 0x1p-24));
    int e;
    const double m = frexp(a, &e);
    return (uint16_t)(s | (uint16_t)((e - 1 + 15) << 10) | (uint16_t)((m * 2.0 - 1.0) * 1024.0));
}

typedef struct narrow_stats {
    size_t n, bad_bf16, bad_f16;
    uint32_t first_bf16, first_f16;
    uint16_t got_bf16, want_bf16, got_f16, want_f16;
} narrow_stats;

static void narrow_one(uint32_t u, narrow_stats *st)
{
    const float f = bits_f32(u);
    const uint16_t gb = lmk_f32_to_bf16(f), gh = lmk_f32_to_f16(f);
    bool ok_b, ok_h;
    uint16_t wb = 0, wh = 0;
    if (isnan(f)) {
        /* NaN stays NaN, quiet, sign kept. */
        ok_b = (gb & 0x7f80u) == 0x7f80u && (gb & 0x0040u) && (gb >> 15) == (u >> 31);
        ok_h = (gh & 0x7c00u) == 0x7c00u && (gh & 0x0200u) && (gh >> 15) == (u >> 31);
        wb = (uint16_t)(((u >> 31) << 15) | 0x7fc0u);
        wh = (uint16_t)(((u >> 31) << 15) | 0x7e00u);
    } else {
        const double rb = isinf(f) ? (double)f : round_format(f, 8, -126, 0x1.fep127);
        const uint32_t rbits = f32_bits((float)rb);
        wb = (uint16_t)(rbits >> 16);
        ok_b = gb == wb && (rbits & 0xffffu) == 0;
        const double rh = isinf(f) ? (double)f : round_format(f, 11, -14, 65504.0);
        wh = encode_f16(rh);
        ok_h = gh == wh;
    }
    st->n++;
    if (!ok_b && !st->bad_bf16++) {
        st->first_bf16 = u;
        st->got_bf16 = gb;
        st->want_bf16 = wb;
    }
    if (!ok_h && !st->bad_f16++) {
        st->first_f16 = u;
        st->got_f16 = gh;
        st->want_f16 = wh;
    }
}

static void test_narrowing(void)
{
    narrow_stats st = {0};
    /* 1. Specials and thresholds. */
    static const uint32_t specials[] = {
        0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u,            /* zeros, infinities */
        0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u,            /* quiet, signalling NaN */
        0x7f80ffffu, 0x7f810000u, 0x7fffffffu, 0xffffffffu, 0x7fa5a5a5u, /* NaN payloads low/high */
        0x00000001u, 0x80000001u, 0x007fffffu, 0x00800000u, 0x00400000u, /* subnormals, min normal */
        0x7f7fffffu, 0xff7fffffu, 0x7f7f7fffu, 0x7f7f8000u, 0x7f7f8001u, /* bf16 overflow edge */
        0x477fe000u, 0x477fefffu, 0x477ff000u, 0x477ff001u, 0x47800000u, /* f16 65504 .. 65520 .. 65536 */
        0x33000000u, 0x33000001u, 0x33800000u, 0x32ffffffu, 0x33c00000u, /* f16 2^-25 (tie), 2^-24, 1.5*2^-24 */
        0x387fc000u, 0x387fe000u, 0x387ff000u, 0x38800000u,             /* f16 subnormal/normal edge */
        0x3f800000u, 0x3f808000u, 0x3f818000u, 0x3f800001u, 0x3f801000u, 0x3f803000u, /* ties at 1.0 */
    };
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++)
        narrow_one(specials[i], &st);

    /* 2. Every exponent, both signs, every tie position k (1..23 dropped bits), both parities of
     *    the kept bit above it: below, at and above the half way point. */
    tst_rng r = tst_rng_make(tst_case_seed());
    for (uint32_t sign = 0; sign < 2; sign++)
        for (uint32_t e = 0; e < 256; e++)
            for (int k = 1; k <= 23; k++) {
                const uint32_t half = 1u << (k - 1), low_mask = (1u << k) - 1;
                const uint32_t lows[] = {0, 1, half - 1, half, half + 1, low_mask};
                for (int rep = 0; rep < 4; rep++) {
                    uint32_t high = tst_rng_u32(&r) & 0x7fffffu & ~low_mask;
                    if (k < 23)
                        high = (high & ~(1u << k)) | ((uint32_t)(rep & 1) << k);
                    for (size_t l = 0; l < sizeof lows / sizeof lows[0]; l++)
                        narrow_one((sign << 31) | (e << 23) | high | lows[l], &st);
                }
            }

    /* 3. A strided sweep over all 2^32 patterns, with a random start so runs differ. */
    const uint32_t stride = tst_quick() ? 4099u : 251u;
    for (uint64_t u = tst_rng_below(&r, stride); u < 0x100000000ull; u += stride)
        narrow_one((uint32_t)u, &st);

    CHECK(st.bad_bf16 == 0, "f32 -> bf16 over %zu patterns: %zu wrong, first 0x%08x -> 0x%04x, want 0x%04x", st.n,
          st.bad_bf16, st.first_bf16, st.got_bf16, st.want_bf16);
    CHECK(st.bad_f16 == 0, "f32 -> f16 over %zu patterns: %zu wrong, first 0x%08x -> 0x%04x, want 0x%04x", st.n,
          st.bad_f16, st.first_f16, st.got_f16, st.want_f16);
    /* A few fixed answers, so that a wrong reference cannot hide a wrong library. */
    CHECK(lmk_f32_to_bf16(1.0f) == 0x3f80 && lmk_f32_to_bf16(bits_f32(0x3f808000u)) == 0x3f80 &&
              lmk_f32_to_bf16(bits_f32(0x3f818000u)) == 0x3f82 && lmk_f32_to_bf16(bits_f32(0x3f808001u)) == 0x3f81 &&
              lmk_f32_to_bf16(bits_f32(0x7f7fffffu)) == 0x7f80 && lmk_f32_to_bf16(-0.0f) == 0x8000,
          "bf16 fixed answers (ties to even, overflow, -0)");
    CHECK(lmk_f32_to_f16(1.0f) == 0x3c00 && lmk_f32_to_f16(65504.0f) == 0x7bff && lmk_f32_to_f16(65520.0f) == 0x7c00 &&
              lmk_f32_to_f16(65519.0f) == 0x7bff && lmk_f32_to_f16(0x1p-24f) == 0x0001 &&
              lmk_f32_to_f16(0x1p-25f) == 0x0000 && lmk_f32_to_f16(0x1.8p-24f) == 0x0002 &&
              lmk_f32_to_f16(-2.0f) == 0xc000,
          "f16 fixed answers (max, overflow, subnormal ties)");
    CHECK(lmk_f32_to_bf16(bits_f32(0x7f800001u)) != 0x7f80 && lmk_f32_to_f16(bits_f32(0x7f800001u)) != 0x7c00,
          "a NaN with a small payload narrowed to infinity");
}

/* ------------------------------------------------------------------------------------------------
 * devices
 * ---------------------------------------------------------------------------------------------- */

static void test_devices(void)
{
    lmk_device *d = NULL;
    lmk_status st = lmk_device_open(LMK_BACKEND_CPU, 0, &d);
    CHECK(st == LMK_OK && d && lmk_device_backend(d) == LMK_BACKEND_CPU && lmk_device_name(d) &&
              lmk_device_name(d)[0],
          "open cpu: %s \"%s\"", lmk_status_name(st), lmk_last_error());
    if (d) {
        CHECK(lmk_device_set_threads(d, 1) == LMK_OK && lmk_device_set_threads(d, 0) == LMK_OK &&
                  lmk_device_set_threads(d, -4) == LMK_OK && lmk_device_set_threads(d, 1024) == LMK_OK,
              "lmk_device_set_threads valid values: %s", lmk_last_error());
        st = lmk_device_set_threads(d, 1025);
        CHECK(st == LMK_ERR_INVALID_ARGUMENT && tst_msg_has("1025", NULL), "set_threads(1025): %s \"%s\"",
              lmk_status_name(st), lmk_last_error());
    }
    st = lmk_device_set_threads(NULL, 2);
    CHECK(st == LMK_ERR_INVALID_ARGUMENT, "set_threads(NULL): %s", lmk_status_name(st));
    lmk_device_close(d);

    CHECK(lmk_device_count(LMK_BACKEND_CPU) == 1, "lmk_device_count(CPU) = %d", lmk_device_count(LMK_BACKEND_CPU));
    CHECK(lmk_device_count((lmk_backend)9) == 0, "lmk_device_count(9) = %d", lmk_device_count((lmk_backend)9));
    const int n_cuda = lmk_device_count(LMK_BACKEND_CUDA);
#ifndef LMK_WITH_CUDA
    CHECK(n_cuda == 0, "build without CUDA reports %d CUDA devices", n_cuda);
#endif

    lmk_device *sentinel = (lmk_device *)(uintptr_t)0x1234;
    d = sentinel;
    st = lmk_device_open(LMK_BACKEND_CPU, 1, &d);
    CHECK(st == LMK_ERR_NOT_FOUND && (d == sentinel || d == NULL) && lmk_last_error()[0],
          "cpu ordinal 1: %s \"%s\" (want NOT_FOUND)", lmk_status_name(st), lmk_last_error());
    d = sentinel;
    st = lmk_device_open(LMK_BACKEND_CPU, -1, &d);
    CHECK(st == LMK_ERR_INVALID_ARGUMENT && (d == sentinel || d == NULL) && tst_msg_has("-1", NULL),
          "cpu ordinal -1: %s \"%s\"", lmk_status_name(st), lmk_last_error());
    d = sentinel;
    st = lmk_device_open((lmk_backend)3, 0, &d);
    CHECK(st == LMK_ERR_INVALID_ARGUMENT && (d == sentinel || d == NULL) && tst_msg_has("3", NULL),
          "backend 3: %s \"%s\"", lmk_status_name(st), lmk_last_error());
    st = lmk_device_open((lmk_backend)-1, 0, &d);
    CHECK(st == LMK_ERR_INVALID_ARGUMENT, "backend -1: %s \"%s\"", lmk_status_name(st), lmk_last_error());
    st = lmk_device_open(LMK_BACKEND_CPU, 0, NULL);
    CHECK(st == LMK_ERR_INVALID_ARGUMENT && lmk_last_error()[0], "out NULL: %s", lmk_status_name(st));

    /* AUTO: CUDA when usable, else the CPU. */
    d = NULL;
    st = lmk_device_open(LMK_BACKEND_AUTO, 0, &d);
    const lmk_backend want_auto = n_cuda > 0 ? LMK_BACKEND_CUDA : LMK_BACKEND_CPU;
    CHECK(st == LMK_OK && d && lmk_device_backend(d) == want_auto, "AUTO: %s, backend %d, want %d \"%s\"",
          lmk_status_name(st), d ? (int)lmk_device_backend(d) : -1, (int)want_auto, lmk_last_error());
    lmk_device_close(d);

    /* CUDA: UNSUPPORTED without it in the build, NOT_FOUND without a GPU or past the last ordinal. */
    d = sentinel;
#ifndef LMK_WITH_CUDA
    st = lmk_device_open(LMK_BACKEND_CUDA, 0, &d);
    CHECK(st == LMK_ERR_UNSUPPORTED && (d == sentinel || d == NULL) && lmk_last_error()[0],
          "CUDA in a build without CUDA: %s \"%s\" (want UNSUPPORTED)", lmk_status_name(st), lmk_last_error());
#else
    if (n_cuda == 0) {
        st = lmk_device_open(LMK_BACKEND_CUDA, 0, &d);
        CHECK(st == LMK_ERR_NOT_FOUND && (d == sentinel || d == NULL) && lmk_last_error()[0],
              "CUDA build without a GPU: %s \"%s\" (want NOT_FOUND)", lmk_status_name(st), lmk_last_error());
    } else {
        st = lmk_device_open(LMK_BACKEND_CUDA, n_cuda, &d);
        CHECK(st == LMK_ERR_NOT_FOUND && (d == sentinel || d == NULL), "CUDA ordinal %d of %d: %s \"%s\"", n_cuda,
              n_cuda, lmk_status_name(st), lmk_last_error());
        d = NULL;
        st = lmk_device_open(LMK_BACKEND_CUDA, 0, &d);
        CHECK(st == LMK_OK && d && lmk_device_backend(d) == LMK_BACKEND_CUDA && lmk_device_name(d)[0],
              "CUDA ordinal 0: %s \"%s\"", lmk_status_name(st), lmk_last_error());
        lmk_device_close(d);
    }
#endif
    CHECK(lmk_device_backend(NULL) == LMK_BACKEND_AUTO && lmk_device_name(NULL) != NULL,
          "lmk_device_backend/name(NULL)");
}

/* ------------------------------------------------------------------------------------------------
 * buffers, on every backend
 * ---------------------------------------------------------------------------------------------- */

static bool bytes_are(const unsigned char *p, size_t n, unsigned char v)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != v)
            return false;
    return true;
}

static void test_buffers(tst_dev *td)
{
    lmk_device *dev = td->dev;
    const char *bn = td->name;
    lmk_status st;
    lmk_buffer *b = NULL, *sentinel = (lmk_buffer *)(uintptr_t)0x5678;

    /* alloc is zero-filled, also when the allocator hands back memory that was just dirtied: sizes
     * below malloc's mmap threshold are reused after a free, a 1 MiB one is not */
    static const size_t sizes[] = {1, 64, 1000, 4096, 65536, 1u << 20};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const size_t n = sizes[si];
        unsigned char *host = malloc(n);
        bool zero = host != NULL;
        for (int round = 0; round < 3 && zero; round++) {
            st = lmk_buffer_alloc(dev, n, LMK_U8, NULL, 0, &b);
            if (st != LMK_OK) {
                zero = false;
                break;
            }
            memset(host, 0x5A, n);
            zero = lmk_buffer_read(b, 0, host, n) == LMK_OK && bytes_are(host, n, 0);
            memset(host, 0xAB, n);
            lmk_buffer_write(b, 0, host, n); /* dirty it for the next round */
            lmk_buffer_free(b);
            b = NULL;
        }
        CHECK(zero, "%s: a fresh %zu-byte buffer is not zero-filled", bn, n);
        free(host);
    }

    /* getters: shape NULL/ndim 0 is 1-D [byte_len / size]; an explicit shape */
    st = lmk_buffer_alloc(dev, 100, LMK_F32, NULL, 0, &b);
    CHECK(st == LMK_OK && lmk_buffer_byte_len(b) == 100 && lmk_buffer_element_count(b) == 25 &&
              lmk_buffer_dtype(b) == LMK_F32 && lmk_buffer_ndim(b) == 1 && lmk_buffer_dim(b, 0) == 25 &&
              lmk_buffer_dim(b, 1) == 0 && lmk_buffer_dim(b, -1) == 0 && lmk_buffer_device(b) == dev &&
              lmk_buffer_data(b) != NULL,
          "%s alloc 100 bytes f32 no shape: len %zu count %zu ndim %d", bn, lmk_buffer_byte_len(b),
          lmk_buffer_element_count(b), lmk_buffer_ndim(b));
    lmk_buffer_free(b);
    const size_t shape3[3] = {3, 4, 5};
    b = NULL;
    st = lmk_buffer_alloc(dev, 3 * 4 * 5 * 2 + 10, LMK_BF16, shape3, 3, &b);
    CHECK(st == LMK_OK && lmk_buffer_byte_len(b) == 130 && lmk_buffer_element_count(b) == 60 &&
              lmk_buffer_dtype(b) == LMK_BF16 && lmk_buffer_ndim(b) == 3 && lmk_buffer_dim(b, 0) == 3 &&
              lmk_buffer_dim(b, 1) == 4 && lmk_buffer_dim(b, 2) == 5 && lmk_buffer_dim(b, 3) == 0,
          "%s alloc [3,4,5] bf16 in 130 bytes: %s len %zu count %zu", bn, lmk_status_name(st), lmk_buffer_byte_len(b),
          lmk_buffer_element_count(b));
    lmk_buffer_free(b);
    CHECK(lmk_buffer_byte_len(NULL) == 0 && lmk_buffer_element_count(NULL) == 0 && lmk_buffer_ndim(NULL) == 0 &&
              lmk_buffer_dim(NULL, 0) == 0 && lmk_buffer_device(NULL) == NULL && lmk_buffer_data(NULL) == NULL,
          "getters on NULL");

    /* 0-byte alloc */
    b = NULL;
    st = lmk_buffer_alloc(dev, 0, LMK_F32, NULL, 0, &b);
    if (CHECK(st == LMK_OK && b && lmk_buffer_byte_len(b) == 0 && lmk_buffer_element_count(b) == 0,
              "%s 0-byte alloc: %s \"%s\"", bn, lmk_status_name(st), lmk_last_error())) {
        unsigned char c = 7;
        CHECK(lmk_buffer_read(b, 0, &c, 0) == LMK_OK && lmk_buffer_write(b, 0, &c, 0) == LMK_OK,
              "%s 0-byte read/write of an empty buffer", bn);
        st = lmk_buffer_read(b, 0, &c, 1);
        CHECK(st == LMK_ERR_INVALID_ARGUMENT && c == 7, "%s 1-byte read of an empty buffer: %s", bn,
              lmk_status_name(st));
        lmk_buffer_free(b);
    }
    const size_t zero_shape[2] = {4, 0};
    b = NULL;
    st = lmk_buffer_alloc(dev, 0, LMK_F32, zero_shape, 2, &b);
    CHECK(st == LMK_OK && lmk_buffer_element_count(b) == 0, "%s alloc shape [4,0]: %s", bn, lmk_status_name(st));
    lmk_buffer_free(b);

    /* shape checks */
    const size_t too_big[2] = {5, 6};                    /* 30 f32 = 120 bytes > 100 */
    const size_t ovf[2] = {SIZE_MAX / 2, 3};             /* element count overflows */
    const size_t ovf_bytes[1] = {SIZE_MAX / 2};          /* bytes overflow for f32 */
    struct {
        const char *what;
        lmk_dtype t;
        const size_t *shape;
        int ndim;
        const char *needle;
    } bad[] = {
        {"shape larger than byte_len", LMK_F32, too_big, 2, "120"},
        {"shape count overflows", LMK_F32, ovf, 2, "overflow"},
        {"shape bytes overflow", LMK_F32, ovf_bytes, 1, "overflow"},
        {"ndim -1", LMK_F32, too_big, -1, "-1"},
        {"ndim 9", LMK_F32, too_big, 9, "9"},
        {"shape NULL with ndim 2", LMK_F32, NULL, 2, "shape"},
        {"unknown dtype 99", (lmk_dtype)99, NULL, 0, "99"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        b = sentinel;
        st = lmk_buffer_alloc(dev, 100, bad[i].t, bad[i].shape, bad[i].ndim, &b);
        CHECK(st == LMK_ERR_INVALID_ARGUMENT && (b == sentinel || b == NULL) && tst_msg_has("lmk_buffer_alloc", bad[i].needle, NULL),
              "%s alloc %s: %s \"%s\"", bn, bad[i].what, lmk_status_name(st), lmk_last_error());
    }
    st = lmk_buffer_alloc(NULL, 16, LMK_F32, NULL, 0, &b);
    CHECK(st == LMK_ERR_INVALID_ARGUMENT, "alloc on NULL device: %s", lmk_status_name(st));
    st = lmk_buffer_alloc(dev, 16, LMK_F32, NULL, 0, NULL);
    CHECK(st == LMK_ERR_INVALID_ARGUMENT, "alloc with out NULL: %s", lmk_status_name(st));
    const size_t eight[LMK_MAX_DIMS] = {1, 2, 1, 2, 1, 2, 1, 2};
    b = NULL;
    st = lmk_buffer_alloc(dev, 64, LMK_F32, eight, LMK_MAX_DIMS, &b);
    CHECK(st == LMK_OK && lmk_buffer_ndim(b) == 8 && lmk_buffer_element_count(b) == 16, "%s alloc with 8 dims: %s",
          bn, lmk_status_name(st));
    lmk_buffer_free(b);

    /* read/write bounds: every out-of-range call fails with a message and changes nothing */
    enum { N = 64 };
    unsigned char pattern[N], back[N], probe[N + 8];
    for (int i = 0; i < N; i++)
        pattern[i] = (unsigned char)(i * 7 + 1);
    b = NULL;
    st = lmk_buffer_alloc(dev, N, LMK_U8, NULL, 0, &b);
    if (CHECK(st == LMK_OK, "%s alloc 64: %s", bn, lmk_status_name(st))) {
        CHECK(lmk_buffer_write(b, 0, pattern, N) == LMK_OK && lmk_buffer_read(b, 0, back, N) == LMK_OK &&
                  memcmp(back, pattern, N) == 0,
              "%s write/read round trip", bn);
        unsigned char part[5];
        CHECK(lmk_buffer_read(b, 59, part, 5) == LMK_OK && memcmp(part, pattern + 59, 5) == 0,
              "%s read of the last 5 bytes", bn);
        const unsigned char five[5] = {9, 9, 9, 9, 9};
        CHECK(lmk_buffer_write(b, 10, five, 5) == LMK_OK && lmk_buffer_read(b, 0, back, N) == LMK_OK &&
                  memcmp(back + 10, five, 5) == 0 && memcmp(back, pattern, 10) == 0 &&
                  memcmp(back + 15, pattern + 15, N - 15) == 0,
              "%s write at an offset touches only its range", bn);
        lmk_buffer_write(b, 0, pattern, N);
        const struct {
            size_t off, n;
        } ranges[] = {{0, N + 1}, {1, N}, {N, 1}, {N + 1, 0}, {SIZE_MAX, 2}, {2, SIZE_MAX}, {SIZE_MAX, 0}, {60, 5}};
        for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
            const size_t off = ranges[i].off, n = ranges[i].n;
            memset(probe, 0xEE, sizeof probe);
            lmk_clear_error();
            st = lmk_buffer_read(b, off, probe, n);
            CHECK(st == LMK_ERR_INVALID_ARGUMENT && bytes_are(probe, sizeof probe, 0xEE) &&
                      tst_msg_has("lmk_buffer_read", NULL),
                  "%s read [%zu, +%zu) of 64 bytes: %s \"%s\"", bn, off, n, lmk_status_name(st), lmk_last_error());
            lmk_clear_error();
            st = lmk_buffer_write(b, off, probe, n);
            CHECK(st == LMK_ERR_INVALID_ARGUMENT && lmk_buffer_read(b, 0, back, N) == LMK_OK &&
                      memcmp(back, pattern, N) == 0 && tst_msg_has("lmk_buffer_write", NULL),
                  "%s write [%zu, +%zu) of 64 bytes: %s \"%s\"", bn, off, n, lmk_status_name(st), lmk_last_error());
        }
        CHECK(lmk_buffer_read(b, N, probe, 0) == LMK_OK, "%s 0-byte read at the end", bn);
        st = lmk_buffer_read(b, 0, NULL, 4);
        CHECK(st == LMK_ERR_INVALID_ARGUMENT, "%s read into NULL: %s", bn, lmk_status_name(st));
        st = lmk_buffer_write(b, 0, NULL, 4);
        CHECK(st == LMK_ERR_INVALID_ARGUMENT && lmk_buffer_read(b, 0, back, N) == LMK_OK && memcmp(back, pattern, N) == 0,
              "%s write from NULL: %s", bn, lmk_status_name(st));
        CHECK(lmk_buffer_read(NULL, 0, back, 1) == LMK_ERR_INVALID_ARGUMENT &&
                  lmk_buffer_write(NULL, 0, back, 1) == LMK_ERR_INVALID_ARGUMENT,
              "read/write of a NULL buffer");

        /* views: offset, shape, the rest of the parent, sharing memory */
        lmk_buffer *v = NULL;
        const size_t vshape[2] = {2, 3};
        st = lmk_buffer_view(b, 8, LMK_U16, vshape, 2, &v);
        if (CHECK(st == LMK_OK && lmk_buffer_byte_len(v) == 12 && lmk_buffer_element_count(v) == 6 &&
                      lmk_buffer_dtype(v) == LMK_U16 && lmk_buffer_device(v) == dev &&
                      (unsigned char *)lmk_buffer_data(v) == (unsigned char *)lmk_buffer_data(b) + 8,
                  "%s view [2,3] u16 at 8: %s len %zu count %zu \"%s\"", bn, lmk_status_name(st),
                  lmk_buffer_byte_len(v), lmk_buffer_element_count(v), lmk_last_error())) {
            unsigned char vb[12];
            CHECK(lmk_buffer_read(v, 0, vb, 12) == LMK_OK && memcmp(vb, pattern + 8, 12) == 0,
                  "%s view reads its parent's bytes", bn);
            const unsigned char w2[2] = {0xC1, 0xC2};
            CHECK(lmk_buffer_write(v, 10, w2, 2) == LMK_OK && lmk_buffer_read(b, 18, vb, 2) == LMK_OK &&
                      vb[0] == 0xC1 && vb[1] == 0xC2,
                  "%s a write through the view shows in the parent", bn);
            st = lmk_buffer_read(v, 10, vb, 4);
            CHECK(st == LMK_ERR_INVALID_ARGUMENT, "%s read past the view's 12 bytes: %s", bn, lmk_status_name(st));
            lmk_buffer_free(v);
            lmk_buffer_write(b, 0, pattern, N);
        }
        v = NULL;
        st = lmk_buffer_view(b, 16, LMK_F32, NULL, 0, &v);
        CHECK(st == LMK_OK && lmk_buffer_byte_len(v) == 48 && lmk_buffer_element_count(v) == 12,
              "%s view of the rest from 16: %s len %zu", bn, lmk_status_name(st), lmk_buffer_byte_len(v));
        lmk_buffer_free(v);
        v = NULL;
        st = lmk_buffer_view(b, N, LMK_F32, NULL, 0, &v);
        CHECK(st == LMK_OK && lmk_buffer_byte_len(v) == 0, "%s empty view at the end: %s", bn, lmk_status_name(st));
        lmk_buffer_free(v);
        const size_t vbig[1] = {13}, vfit[1] = {12}, veight[1] = {8};
        struct {
            const char *what;
            size_t off;
            lmk_dtype t;
            const size_t *shape;
            int ndim;
        } badv[] = {
            {"13 f32 from 16 (too large)", 16, LMK_F32, vbig, 1},
            {"8 f32 from 17 (misaligned)", 17, LMK_F32, veight, 1},
            {"offset past the end", N + 4, LMK_U8, NULL, 0},
            {"offset SIZE_MAX", SIZE_MAX, LMK_U8, NULL, 0},
            {"unknown dtype", 0, (lmk_dtype)42, NULL, 0},
            {"ndim 9", 0, LMK_U8, vfit, 9},
        };
        for (size_t i = 0; i < sizeof badv / sizeof badv[0]; i++) {
            v = sentinel;
            st = lmk_buffer_view(b, badv[i].off, badv[i].t, badv[i].shape, badv[i].ndim, &v);
            CHECK(st == LMK_ERR_INVALID_ARGUMENT && (v == sentinel || v == NULL) && tst_msg_has("lmk_buffer_view", NULL),
                  "%s view %s: %s \"%s\"", bn, badv[i].what, lmk_status_name(st), lmk_last_error());
        }
        CHECK(lmk_buffer_view(NULL, 0, LMK_U8, NULL, 0, &v) == LMK_ERR_INVALID_ARGUMENT &&
                  lmk_buffer_view(b, 0, LMK_U8, NULL, 0, NULL) == LMK_ERR_INVALID_ARGUMENT,
              "view with NULL parent or out");
        CHECK(lmk_buffer_read(b, 0, back, N) == LMK_OK && memcmp(back, pattern, N) == 0,
              "%s failed views changed the parent", bn);
        lmk_buffer_free(b);
    }
}

/* wrap borrows host memory: only the CPU, whose buffer memory is host memory */
static void test_wrap(lmk_device *cpu)
{
    lmk_status st;
    lmk_buffer *b = NULL, *sentinel = (lmk_buffer *)(uintptr_t)0x9abc;
    _Alignas(16) unsigned char mem[64];
    memset(mem, 0x11, sizeof mem);
    const size_t shape[2] = {4, 4};
    st = lmk_buffer_wrap(cpu, mem, sizeof mem, LMK_F32, shape, 2, &b);
    if (CHECK(st == LMK_OK && lmk_buffer_data(b) == (void *)mem && lmk_buffer_byte_len(b) == 64 &&
                  lmk_buffer_element_count(b) == 16,
              "wrap 64 bytes as [4,4] f32: %s \"%s\"", lmk_status_name(st), lmk_last_error())) {
        const unsigned char w[4] = {1, 2, 3, 4};
        CHECK(lmk_buffer_write(b, 60, w, 4) == LMK_OK && memcmp(mem + 60, w, 4) == 0,
              "a write to a wrapped buffer lands in the caller's memory");
        mem[0] = 0x77;
        unsigned char r = 0;
        CHECK(lmk_buffer_read(b, 0, &r, 1) == LMK_OK && r == 0x77, "a wrapped buffer reads the caller's memory");
        lmk_buffer_free(b); /* must not free mem (it is on the stack: a free would crash) */
        CHECK(mem[60] == 1 && mem[0] == 0x77, "freeing a wrapped buffer touched the memory");
    }
    b = NULL;
    st = lmk_buffer_wrap(cpu, NULL, 0, LMK_U8, NULL, 0, &b);
    CHECK(st == LMK_OK && lmk_buffer_byte_len(b) == 0, "wrap NULL with 0 bytes: %s", lmk_status_name(st));
    lmk_buffer_free(b);
    struct {
        const char *what;
        void *ptr;
        size_t len;
        lmk_dtype t;
    } bad[] = {
        {"NULL with 16 bytes", NULL, 16, LMK_U8},
        {"misaligned f32", mem + 1, 32, LMK_F32},
        {"misaligned bf16", mem + 3, 32, LMK_BF16},
        {"unknown dtype", mem, 16, (lmk_dtype)12},
        {"a range that wraps the address space", (void *)(UINTPTR_MAX - 15), 64, LMK_U8},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        b = sentinel;
        st = lmk_buffer_wrap(cpu, bad[i].ptr, bad[i].len, bad[i].t, NULL, 0, &b);
        CHECK(st == LMK_ERR_INVALID_ARGUMENT && (b == sentinel || b == NULL) && tst_msg_has("lmk_buffer_wrap", NULL),
              "wrap %s: %s \"%s\"", bad[i].what, lmk_status_name(st), lmk_last_error());
    }
    const size_t big_shape[1] = {17};
    st = lmk_buffer_wrap(cpu, mem, 64, LMK_F32, big_shape, 1, &b);
    CHECK(st == LMK_ERR_INVALID_ARGUMENT, "wrap with a shape larger than the memory: %s", lmk_status_name(st));
    st = lmk_buffer_wrap(NULL, mem, 64, LMK_F32, NULL, 0, &b);
    CHECK(st == LMK_ERR_INVALID_ARGUMENT, "wrap on a NULL device: %s", lmk_status_name(st));
    /* a wrapped buffer works as an op operand */
    float src[2 * 3], dst[2 * 6];
    for (int i = 0; i < 6; i++)
        src[i] = (float)i + 0.5f;
    memset(dst, 0, sizeof dst);
    lmk_buffer *bs = NULL, *bd = NULL;
    lmk_stream *s = NULL;
    if (lmk_buffer_wrap(cpu, src, sizeof src, LMK_F32, NULL, 0, &bs) == LMK_OK &&
        lmk_buffer_wrap(cpu, dst, sizeof dst, LMK_F32, NULL, 0, &bd) == LMK_OK &&
        lmk_stream_create(cpu, &s) == LMK_OK) {
        const lmk_repeat_tiled_params p = {.seq = 2, .hg = 1, .h = 2, .k = 3};
        st = lmk_repeat_tiled(s, bs, bd, &p);
        lmk_stream_sync(s);
        CHECK(st == LMK_OK && dst[0] == 0.5f && dst[3] == 0.5f && dst[5] == 2.5f && dst[6] == 3.5f && dst[11] == 5.5f,
              "repeat_tiled on wrapped host memory: %s", lmk_status_name(st));
    } else {
        TST_FAIL("wrap for an op: %s", lmk_last_error());
    }
    lmk_stream_destroy(s);
    lmk_buffer_free(bs);
    lmk_buffer_free(bd);
}

static void test_streams(tst_dev *td)
{
    lmk_stream *s[3] = {NULL, NULL, NULL};
    bool ok = true;
    for (int i = 0; i < 3; i++)
        ok = ok && lmk_stream_create(td->dev, &s[i]) == LMK_OK && s[i] && lmk_stream_device(s[i]) == td->dev;
    CHECK(ok && s[0] != s[1] && s[1] != s[2], "%s: three streams on one device: %s", td->name, lmk_last_error());
    for (int i = 0; i < 3; i++)
        if (s[i])
            ok = ok && lmk_stream_sync(s[i]) == LMK_OK && lmk_stream_sync(s[i]) == LMK_OK;
    CHECK(ok, "%s: sync of idle streams: %s", td->name, lmk_last_error());
    for (int i = 0; i < 3; i++)
        lmk_stream_destroy(s[i]);
    lmk_stream *out = (lmk_stream *)(uintptr_t)0x42;
    CHECK(lmk_stream_create(NULL, &out) == LMK_ERR_INVALID_ARGUMENT && out == (lmk_stream *)(uintptr_t)0x42 &&
              lmk_stream_create(td->dev, NULL) == LMK_ERR_INVALID_ARGUMENT,
          "stream_create with NULL device or out");
    CHECK(lmk_stream_sync(NULL) == LMK_ERR_INVALID_ARGUMENT, "stream_sync(NULL)");
    CHECK(lmk_stream_device(NULL) == NULL, "stream_device(NULL)");
}

/* Destroy/free/close accept NULL and do nothing for it (lmk.h): they return (a crash fails the
 * whole program) and leave even this thread's error message as it was. */
static void test_null_handles(void)
{
    lmk_stream *s = NULL;
    const lmk_status st = lmk_stream_create(NULL, &s);
    char before[256];
    snprintf(before, sizeof before, "%s", lmk_last_error());
    lmk_stream_destroy(NULL);
    lmk_buffer_free(NULL);
    lmk_device_close(NULL);
    CHECK(st == LMK_ERR_INVALID_ARGUMENT && before[0] != '\0' && strcmp(lmk_last_error(), before) == 0,
          "destroy/free/close of NULL changed this thread's message \"%s\" to \"%s\"", before, lmk_last_error());
}

/* lmk_float_load, lmk_ulp and lmk_rope_tolerance are the precision contract that `lmk check` and
 * the fuzzers judge by: they must agree with the tests' own independent tst_ulp and conversions. */
static void test_precision_helpers(void)
{
    tst_rng r = tst_rng_make(tst_program_seed() ^ 0x51ab);
    static const lmk_dtype dts[] = {LMK_F32, LMK_BF16, LMK_F16};
    int bad = 0;
    for (int d = 0; d < 3; d++)
        for (int i = 0; i < 200000 && bad < 5; i++) {
            const uint32_t u = tst_rng_u32(&r);
            float f;
            memcpy(&f, &u, 4);
            const double v = i < 8 ? (double[]){0.0, -0.0, 1.0, 0x1p-140, 0x1p-20, 65504.0, INFINITY, 3.0}[i] : f;
            if (lmk_ulp(dts[d], v) != tst_ulp(dts[d], v) ||
                lmk_rope_tolerance(dts[d], v) != (dts[d] == LMK_F32 ? 1e-5 : tst_ulp(dts[d], v) + 1e-6)) {
                bad++;
                fprintf(stderr, "%s %.17g: lmk_ulp %g, tst_ulp %g, tolerance %g\n", lmk_dtype_name(dts[d]), v,
                        lmk_ulp(dts[d], v), tst_ulp(dts[d], v), lmk_rope_tolerance(dts[d], v));
            }
        }
    CHECK(bad == 0, "lmk_ulp / lmk_rope_tolerance disagree with the tests' independent ulp (%d cases)", bad);

    const float f32[2] = {1.5f, -0x1p-130f};
    const uint16_t bf[2] = {0x3fc0, 0x8001}, hf[2] = {0x3e00, 0x8001};
    CHECK(lmk_float_load(LMK_F32, f32, 1) == -0x1p-130 && lmk_float_load(LMK_BF16, bf, 0) == 1.5 &&
              lmk_float_load(LMK_BF16, bf, 1) == -0x1p-133 && lmk_float_load(LMK_F16, hf, 0) == 1.5 &&
              lmk_float_load(LMK_F16, hf, 1) == -0x1p-24,
          "lmk_float_load widens element i of f32, bf16 and f16 exactly");
}

int main(void)
{
    tst_program_seed();
    const double t0 = tst_now();
    test_status_names();
    test_version();
    test_messages();
    test_messages_per_thread();
    test_dtypes();
    test_widening_exhaustive();
    test_narrowing();
    test_precision_helpers();
    test_devices();

    tst_dev devs[TST_MAX_DEVS];
    const int n = tst_devs_open(devs);
    for (int i = 0; i < n; i++) {
        test_buffers(&devs[i]);
        test_streams(&devs[i]);
        if (devs[i].backend == LMK_BACKEND_CPU)
            test_wrap(devs[i].dev);
    }
    tst_devs_close(devs, n);
    test_null_handles();
    printf("test_runtime: %.2f s\n", tst_now() - t0);
    return harness_summary();
}
