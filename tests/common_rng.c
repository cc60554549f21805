/*
 * common_rng.c - the seeds of the test programs.
 *
 * Every test draws fresh inputs from a generator (testkit/rng.c) seeded with a case seed drawn
 * from the program seed, which is printed once, so a failure seen in CI can be replayed with
 * LMK_TEST_SEED. Fixed seeds (the seed library's test vectors) use their own generator,
 * tst_seed_rng_next.
 */
#include "common.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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
        g_seed = tst_seed_mix((uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec, (uint64_t)getpid(), 0);
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

float tst_seed_rng_next(uint32_t *seed)
{
    *seed = *seed * 1103515245u + 12345u;
    return (float)(int32_t)*seed / 2147483648.0f;
}
