/*
 * test_fenv.c - CPU results do not depend on the caller's floating-point environment.
 *
 * lmk.h promises bit-identical outputs for the same inputs regardless of the calling thread's
 * rounding mode (fesetround) and, on x86, of the MXCSR flush-to-zero / denormals-are-zero bits
 * that -ffast-math programs set. This test runs lmk_rope_multi, and lmk_rope in NEOX mode with
 * YaRN scaling (f32, bf16, f16; a small shape that runs on the calling thread alone and a 1 MiB
 * one that uses the worker pool), on every CPU ISA level this machine has, once under the default
 * environment and then under each other rounding mode and under FTZ/DAZ, and compares the output
 * bits. The inputs hold subnormal values, so that DAZ and FTZ would show. (The YaRN scaling
 * factors lmk_rope derives on the calling thread are covered too.) It also creates a stream while the odd environment is set (new threads
 * inherit their creator's environment: the pool's workers must not), and checks that every op
 * call gives the caller its environment back.
 */
#include "harness.h"
#include "lmk.h"

#include <fenv.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define HAVE_MXCSR 1
#define MXCSR_FTZ 0x8000u
#define MXCSR_DAZ 0x0040u
#else
#define HAVE_MXCSR 0
#endif

HARNESS_DEFINE;

typedef struct env {
    const char *name;
    int round;
    bool ftz_daz;
} env;

static const env k_envs[] = {
    {"FE_TOWARDZERO", FE_TOWARDZERO, false},
    {"FE_UPWARD", FE_UPWARD, false},
    {"FE_DOWNWARD", FE_DOWNWARD, false},
#if HAVE_MXCSR
    {"FTZ+DAZ", FE_TONEAREST, true},
    {"FE_UPWARD+FTZ+DAZ", FE_UPWARD, true},
#endif
};

/* Sets an environment; returns what to restore with env_restore. */
typedef struct saved_env {
    int round;
    unsigned mxcsr;
} saved_env;

static saved_env env_set(const env *e)
{
    saved_env s = {fegetround(), 0};
#if HAVE_MXCSR
    s.mxcsr = _mm_getcsr();
#endif
    fesetround(e->round);
#if HAVE_MXCSR
    if (e->ftz_daz)
        _mm_setcsr(_mm_getcsr() | MXCSR_FTZ | MXCSR_DAZ);
#endif
    return s;
}

static void env_restore(saved_env s)
{
    fesetround(s.round);
#if HAVE_MXCSR
    _mm_setcsr(s.mxcsr);
#endif
}

/* Whether the environment is still exactly e (the op gave it back). */
static bool env_is(const env *e)
{
    if (fegetround() != e->round)
        return false;
#if HAVE_MXCSR
    const unsigned m = _mm_getcsr();
    if (!!(m & MXCSR_FTZ) != e->ftz_daz || !!(m & MXCSR_DAZ) != e->ftz_daz)
        return false;
#endif
    return true;
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint64_t rng_next(void)
{
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Inputs in [-2, 2), one in 16 a subnormal of the dtype (f32 subnormals for f32; for bf16 the
 * bf16 subnormals; for f16 values whose f16 results are subnormal, i.e. tiny). */
static void fill_input(lmk_dtype t, void *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const uint64_t r = rng_next();
        float f = (float)((double)(r >> 11) * 0x1.0p-53 * 4.0 - 2.0);
        if ((r & 15) == 0) {
            if (t == LMK_F16) {
                f = (float)((r >> 20) % 1000 + 1) * 0x1.0p-24f; /* f16 subnormals */
            } else {
                uint32_t bits = (uint32_t)(r >> 32) & 0x007fffffu; /* f32 subnormal, random sign */
                bits |= (uint32_t)(r & 16) << 27;
                if (t == LMK_BF16)
                    bits &= 0xffff0000u;
                if ((bits & 0x7fffffffu) == 0)
                    bits |= 0x00010000u;
                memcpy(&f, &bits, 4);
            }
        }
        if (t == LMK_F32) {
            memcpy((char *)dst + 4 * i, &f, 4);
        } else {
            const uint16_t h = t == LMK_BF16 ? lmk_f32_to_bf16(f) : lmk_f32_to_f16(f);
            memcpy((char *)dst + 2 * i, &h, 2);
        }
    }
}

typedef struct shape {
    const char *name;
    uint32_t seq, heads, head_dim, rope_dim;
    lmk_rope_mode mode;
    uint32_t sections[4];
    bool yarn; /* through lmk_rope with YaRN scaling, else lmk_rope_multi */
} shape;

static const shape k_shapes[] = {
    /* 2*4*128 elements: a few KiB, runs on the calling thread alone */
    {"small rope_multi", 2, 4, 128, 64, LMK_ROPE_IMROPE, {11, 11, 10, 0}, false},
    /* 64*32*128 f32 elements: 1 MiB in, 1 MiB out, runs on the pool */
    {"big rope_multi", 64, 32, 128, 128, LMK_ROPE_MROPE, {16, 24, 24, 0}, false},
    {"small rope NEOX+YaRN", 2, 4, 128, 96, LMK_ROPE_NEOX, {0, 0, 0, 0}, true},
    {"big rope NEOX+YaRN", 64, 32, 128, 128, LMK_ROPE_NEOX, {0, 0, 0, 0}, true},
};

/* Runs one rope_multi on stream s; out_host receives the output. Returns the status. */
static lmk_status run_rope(lmk_stream *s, lmk_dtype t, const shape *sh, const void *in_host, const int32_t *pos,
                           void *out_host)
{
    lmk_device *dev = lmk_stream_device(s);
    const size_t n = (size_t)sh->seq * sh->heads * sh->head_dim, bytes = n * lmk_dtype_size(t);
    const size_t n_pos = sh->yarn ? sh->seq : 4 * (size_t)sh->seq;
    lmk_buffer *in = NULL, *out = NULL, *pb = NULL;
    lmk_status st = lmk_buffer_alloc(dev, bytes, t, NULL, 0, &in);
    if (st == LMK_OK)
        st = lmk_buffer_alloc(dev, bytes, t, NULL, 0, &out);
    if (st == LMK_OK)
        st = lmk_buffer_alloc(dev, n_pos * sizeof(int32_t), LMK_I32, NULL, 0, &pb);
    if (st == LMK_OK)
        st = lmk_buffer_write(in, 0, in_host, bytes);
    if (st == LMK_OK)
        st = lmk_buffer_write(pb, 0, pos, n_pos * sizeof(int32_t));
    lmk_rope_multi_params p = {.head_dim = sh->head_dim,
                               .rope_dim = sh->rope_dim,
                               .n_heads = sh->heads,
                               .seq_len = sh->seq,
                               .freq_base = 1000000.0f,
                               .mode = sh->mode};
    memcpy(p.sections, sh->sections, sizeof p.sections);
    /* YaRN as Qwen3 / DeepSeek configure it: factor 40, 4096 original context */
    const lmk_rope_params yp = {.head_dim = sh->head_dim,
                                .rope_dim = sh->rope_dim,
                                .n_heads = sh->heads,
                                .seq_len = sh->seq,
                                .freq_base = 10000.0f,
                                .mode = sh->mode,
                                .freq_scale = 1.0f / 40.0f,
                                .ext_factor = 1.0f,
                                .n_ctx_orig = 4096};
    if (st == LMK_OK)
        st = sh->yarn ? lmk_rope(s, in, NULL, pb, NULL, out, NULL, &yp) : lmk_rope_multi(s, in, out, pb, &p);
    if (st == LMK_OK)
        st = lmk_stream_sync(s);
    if (st == LMK_OK)
        st = lmk_buffer_read(out, 0, out_host, bytes);
    lmk_buffer_free(pb);
    lmk_buffer_free(out);
    lmk_buffer_free(in);
    return st;
}

static size_t first_diff(const void *a, const void *b, size_t n)
{
    const unsigned char *x = a, *y = b;
    for (size_t i = 0; i < n; i++)
        if (x[i] != y[i])
            return i;
    return n;
}

static void test_isa(const char *isa, int n_threads)
{
    setenv("LMK_CPU_ISA", isa, 1);
    lmk_device *dev = NULL;
    if (!CHECK(lmk_device_open(LMK_BACKEND_CPU, 0, &dev) == LMK_OK, "open cpu: %s", lmk_last_error()))
        return;
    lmk_device_set_threads(dev, n_threads);
    char label[96];
    snprintf(label, sizeof label, "%s", lmk_device_name(dev));
    lmk_stream *s = NULL;
    if (!CHECK(lmk_stream_create(dev, &s) == LMK_OK, "stream: %s", lmk_last_error())) {
        lmk_device_close(dev);
        return;
    }
    static const lmk_dtype dtypes[] = {LMK_F32, LMK_BF16, LMK_F16};
    for (size_t si = 0; si < sizeof k_shapes / sizeof k_shapes[0]; si++) {
        const shape *sh = &k_shapes[si];
        int32_t *pos = malloc(4 * sh->seq * sizeof *pos);
        for (uint32_t i = 0; i < 4 * sh->seq; i++)
            pos[i] = (int32_t)(rng_next() % 200000) - 1000;
        for (size_t di = 0; di < sizeof dtypes / sizeof dtypes[0]; di++) {
            const lmk_dtype t = dtypes[di];
            const size_t bytes = (size_t)sh->seq * sh->heads * sh->head_dim * lmk_dtype_size(t);
            void *in = malloc(bytes), *want = malloc(bytes), *got = malloc(bytes);
            fill_input(t, in, bytes / lmk_dtype_size(t));
            lmk_status st = run_rope(s, t, sh, in, pos, want);
            /* lmk_rope's CPU path may not have every mode yet: skip what it does not run */
            const bool unsupported = st == LMK_ERR_UNSUPPORTED;
            if (unsupported)
                SKIP("[%s] %s %s: %s", label, sh->name, lmk_dtype_name(t), lmk_last_error());
            else
                CHECK(st == LMK_OK, "[%s] %s %s default environment: %s", label, sh->name, lmk_dtype_name(t),
                      lmk_last_error());
            for (size_t ei = 0; ei < sizeof k_envs / sizeof k_envs[0] && !unsupported; ei++) {
                const env *e = &k_envs[ei];
                /* On the stream made under the default environment, and on one made under e. */
                for (int fresh = 0; fresh < 2; fresh++) {
                    memset(got, 0, bytes);
                    const saved_env sv = env_set(e);
                    lmk_stream *s2 = NULL;
                    st = fresh ? lmk_stream_create(dev, &s2) : LMK_OK;
                    if (st == LMK_OK)
                        st = run_rope(fresh ? s2 : s, t, sh, in, pos, got);
                    const bool kept = env_is(e);
                    lmk_stream_destroy(s2);
                    env_restore(sv);
                    const size_t d = first_diff(want, got, bytes);
                    CHECK(st == LMK_OK && d == bytes,
                          "[%s] %s %s under %s%s: %s; output byte %zu of %zu differs from the default environment's",
                          label, sh->name, lmk_dtype_name(t), e->name, fresh ? " (stream created under it)" : "",
                          st == LMK_OK ? "ok" : lmk_last_error(), d, bytes);
                    CHECK(kept, "[%s] %s %s: the op did not give back the caller's environment %s", label, sh->name,
                          lmk_dtype_name(t), e->name);
                }
            }
            free(in);
            free(want);
            free(got);
        }
        free(pos);
    }
    lmk_stream_destroy(s);
    lmk_device_close(dev);
}

int main(void)
{
#if !HAVE_MXCSR
    SKIP("FTZ/DAZ: not an x86 machine (only rounding modes are tested)");
#endif
    static const char *const isas[] = {"scalar", "avx2", "avx512"};
    for (int i = 0; i < 3; i++) {
        test_isa(isas[i], 1);
        test_isa(isas[i], 3);
    }
    unsetenv("LMK_CPU_ISA");
    return harness_summary();
}
