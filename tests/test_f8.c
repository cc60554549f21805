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
 */
#include "harness.h"
#include "lmk.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
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
    return harness_summary();
}
