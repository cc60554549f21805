/*
 * common_rng.c - seeds and random tensors for the tests.
 *
 * Every test draws fresh inputs from a generator seeded with the program seed, which is printed
 * once, so a failure seen in CI can be replayed with LMK_TEST_SEED. Fixed seeds (the seed
 * library's test vectors) use their own generator, tst_seed_rng_next.
 */
#include "common.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

static pthread_once_t g_seed_once = PTHREAD_ONCE_INIT;
static uint64_t g_seed;
static pthread_mutex_t g_case_lock = PTHREAD_MUTEX_INITIALIZER;
static tst_rng g_case_rng;

static void seed_init(void)
{
    const char *env = getenv("LMK_TEST_SEED");
    if (env && *env) {
        g_seed = strtoull(env, NULL, 0);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t x = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32);
        g_seed = splitmix64(&x);
    }
    g_case_rng = tst_rng_make(g_seed);
    printf("seed 0x%016" PRIx64 " (LMK_TEST_SEED=0x%016" PRIx64 " reproduces this run)%s\n", g_seed, g_seed,
           tst_quick() ? " [LMK_TEST_QUICK]" : "");
    fflush(stdout);
}

uint64_t tst_program_seed(void)
{
    pthread_once(&g_seed_once, seed_init);
    return g_seed;
}

uint64_t tst_case_seed(void)
{
    tst_program_seed();
    pthread_mutex_lock(&g_case_lock);
    const uint64_t s = tst_rng_u64(&g_case_rng);
    pthread_mutex_unlock(&g_case_lock);
    return s;
}

bool tst_quick(void)
{
    const char *env = getenv("LMK_TEST_QUICK");
    return env && *env && strcmp(env, "0") != 0;
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

float tst_seed_rng_next(uint32_t *seed)
{
    *seed = *seed * 1103515245u + 12345u;
    return (float)(int32_t)*seed / 2147483648.0f;
}
