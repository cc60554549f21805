/*
 * rng.c - the one random-number generator of the tests, the tool and the fuzzers, and the random
 * tensor values they feed the ops.
 *
 * xoshiro256** seeded through splitmix64: fast, good enough for test data, and the same stream on
 * every machine, so a printed seed replays a failure anywhere. Fuzzers seed it from their input.
 */
#include "core/internal.h"
#include "testkit.h"

#include <string.h>
#include <time.h>

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

tst_rng tst_rng_make(uint64_t seed)
{
    tst_rng r;
    for (int i = 0; i < 4; i++)
        r.s[i] = splitmix64(&seed);
    return r;
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t tst_rng_u64(tst_rng *r)
{
    uint64_t *s = r->s;
    const uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

uint32_t tst_rng_u32(tst_rng *r)
{
    return (uint32_t)(tst_rng_u64(r) >> 32);
}

uint32_t tst_rng_below(tst_rng *r, uint32_t n)
{
    return (uint32_t)(((tst_rng_u64(r) >> 32) * (uint64_t)n) >> 32);
}

double tst_rng_uniform(tst_rng *r, double lo, double hi)
{
    const double u = (double)(tst_rng_u64(r) >> 11) * 0x1p-53;
    return lo + (hi - lo) * u;
}

uint64_t tst_seed_mix(uint64_t seed, uint64_t a, uint64_t b)
{
    uint64_t x = seed ^ (a * 0xd1342543de82ef95ull) ^ (b * 0xaf251af3b0f025b5ull);
    return splitmix64(&x);
}

double tst_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double tst_load(lmk_dtype dtype, const void *base, size_t i)
{
    return lmk_float_load(dtype, base, i); /* the conversions test_runtime checks exhaustively */
}

void tst_store(lmk_dtype dtype, void *base, size_t i, double v)
{
    const float f = (float)v;
    if (dtype == LMK_F32) {
        memcpy((char *)base + 4 * i, &f, 4);
        return;
    }
    const uint16_t h = dtype == LMK_BF16 ? lmk_f32_to_bf16(f) : lmk_f32_to_f16(f);
    memcpy((char *)base + 2 * i, &h, 2);
}

void tst_fill_float(tst_rng *r, lmk_dtype dtype, void *dst, size_t n, double lo, double hi)
{
    for (size_t i = 0; i < n; i++)
        tst_store(dtype, dst, i, tst_rng_uniform(r, lo, hi));
}

void tst_fill_bytes(tst_rng *r, void *dst, size_t n)
{
    unsigned char *p = dst;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const uint64_t v = tst_rng_u64(r);
        memcpy(p + i, &v, 8);
    }
    if (i < n) {
        const uint64_t v = tst_rng_u64(r);
        memcpy(p + i, &v, n - i);
    }
}

void tst_fill_random(tst_rng *r, lmk_dtype dtype, void *dst, size_t n)
{
    if (dtype != LMK_F32 && dtype != LMK_BF16 && dtype != LMK_F16) {
        tst_fill_bytes(r, dst, n * lmk_dtype_size(dtype));
        return;
    }
    for (size_t i = 0; i < n; i++) {
        float f = (float)tst_rng_uniform(r, -2.0, 2.0);
        if (f == 0.0f)
            f = 0.5f;
        tst_store(dtype, dst, i, f);
        /* bf16/f16 round tiny values to zero: the same rule applies to what is stored */
        if (tst_load(dtype, dst, i) == 0.0)
            tst_store(dtype, dst, i, 0.5);
    }
}
