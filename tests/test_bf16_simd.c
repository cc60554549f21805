/*
 * test_bf16_simd.c - the CPU backend's vector f32 -> bf16 narrowing (src/cpu/bf16_simd.h, used by
 * lmk_rope and lmk_attn_prologue) against lmk_f32_to_bf16, bit for bit, at each vector level this
 * CPU has (a level it lacks prints a SKIP line).
 *
 * The ops' own tests compare their bf16 outputs with the float64 reference within one ulp, and
 * NaN outputs only as NaN, so a narrowing that rounded a tie the wrong way or let a NaN's payload
 * carry into infinity or across the sign could pass them. Here every f32 whose high half is any
 * of the 65536 patterns and whose low half is one of the rounding boundaries (0, 1, 0x7fff,
 * 0x8000, 0x8001, 0xffff, and a random one) goes through lmk_cpu_bf16_16 (AVX-512),
 * lmk_cpu_bf16_8 and lmk_cpu_bf16_8x2 (AVX2): every tie, every NaN payload, infinities,
 * subnormals and zeros of both signs, plus 4M random bit patterns. lmk_cpu_bf16_8x2 fixes NaNs
 * only when a lane of either of its vectors is NaN, so it also gets vectors with one NaN lane in
 * a (or in b) among numbers, and vectors with none. lmk_cpu_bf16_eo (even/odd order) gets the same
 * inputs after lmk_cpu_eo16's permutation, and the even/odd widening with its way back to element
 * order (lmk_cpu_bf16_widen_eo, lmk_cpu_store_eo_f32) every bf16 pattern; the same for AVX-512's
 * 32-element forms (lmk_cpu_eo32, lmk_cpu_store_bf16_eo16, lmk_cpu_bf16_widen_eo16,
 * lmk_cpu_store_eo16_f32). The lone NaN goes into each lane of 32.
 */
#include "common.h"
#include "cpu/bf16_simd.h"

#include <stdint.h>
#include <string.h>

HARNESS_DEFINE;

enum { N_LOW = 7, N_RANDOM = 1 << 22 };

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t next_u32(void)
{
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

/* Bit pattern i of the sweep: high half i >> 3's 16 bits, low half one of the boundaries. */
static uint32_t sweep_bits(uint32_t i)
{
    static const uint32_t low[N_LOW] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff, 0x5a5a};
    return (i / N_LOW) << 16 | low[i % N_LOW];
}

/* The first lane of n whose bits differ from lmk_f32_to_bf16's, or -1. */
static long long first_wrong(const uint32_t *in, const uint16_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float f;
        memcpy(&f, &in[i], 4);
        if (out[i] != lmk_f32_to_bf16(f))
            return (long long)i;
    }
    return -1;
}

#if LMK_CPU_X86
LMK_TARGET_AVX512 static void narrow_avx512(const uint32_t *in, uint16_t *out, size_t n)
{
    for (size_t i = 0; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(void *)(out + i), lmk_cpu_bf16_16(_mm512_loadu_ps((const float *)in + i)));
}

/* The same through the 32-element even/odd order (lmk_cpu_eo32, lmk_cpu_store_bf16_eo16). */
LMK_TARGET_AVX512 static void narrow_avx512_eo(const uint32_t *in, uint16_t *out, size_t n)
{
    for (size_t i = 0; i + 32 <= n; i += 32) {
        float t[32];
        memcpy(t, in + i, sizeof t);
        lmk_cpu_eo32(t);
        lmk_cpu_store_bf16_eo16((unsigned char *)(out + i), _mm512_loadu_ps(t), _mm512_loadu_ps(t + 16), 0);
    }
}

LMK_TARGET_AVX2 static void narrow_avx2(const uint32_t *in, uint16_t *out, size_t n)
{
    for (size_t i = 0; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(out + i), lmk_cpu_bf16_8(_mm256_loadu_ps((const float *)in + i)));
}

LMK_TARGET_AVX2 static void narrow_avx2_x2(const uint32_t *in, uint16_t *out, size_t n)
{
    for (size_t i = 0; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(void *)(out + i),
                            lmk_cpu_bf16_8x2(_mm256_loadu_ps((const float *)in + i), _mm256_loadu_ps((const float *)in + i + 8)));
}

/* Element order to even/odd order (lmk_cpu_eo16, on a copy), then lmk_cpu_bf16_eo back to element
 * order: the permutation and the narrowing together. */
LMK_TARGET_AVX2 static void narrow_avx2_eo(const uint32_t *in, uint16_t *out, size_t n)
{
    for (size_t i = 0; i + 16 <= n; i += 16) {
        float t[16];
        memcpy(t, in + i, sizeof t);
        lmk_cpu_eo16(t);
        _mm256_storeu_si256((__m256i *)(void *)(out + i), lmk_cpu_bf16_eo(_mm256_loadu_ps(t), _mm256_loadu_ps(t + 8)));
    }
}

/* Every bf16 pattern through the even/odd widening and back to element order (AVX2:
 * lmk_cpu_bf16_widen_eo, lmk_cpu_store_eo_f32; AVX-512: their 32-element forms): lmk_bf16_to_f32
 * in element order. */
LMK_TARGET_AVX2 static void widen_eo_avx2(const uint16_t *h, float *x)
{
    for (size_t i = 0; i < 65536; i += 16) {
        __m256 e, o;
        lmk_cpu_bf16_widen_eo(h + i, &e, &o);
        lmk_cpu_store_eo_f32(x + i, e, o);
    }
}

LMK_TARGET_AVX512 static void widen_eo_avx512(const uint16_t *h, float *x)
{
    for (size_t i = 0; i < 65536; i += 32) {
        __m512 e, o;
        lmk_cpu_bf16_widen_eo16(h + i, &e, &o);
        lmk_cpu_store_eo16_f32(x + i, e, o);
    }
}

static void check_widen_eo(const char *name, void (*widen)(const uint16_t *, float *))
{
    static uint16_t h[65536];
    static float x[65536];
    for (size_t i = 0; i < 65536; i++)
        h[i] = (uint16_t)(i * 40503u); /* odd multiplier: a permutation, neighbours unrelated */
    memset(x, 0xA5, sizeof x);
    widen(h, x);
    long long bad = -1;
    for (size_t i = 0; i < 65536 && bad < 0; i++) {
        const float want = lmk_bf16_to_f32(h[i]);
        if (memcmp(&x[i], &want, 4) != 0)
            bad = (long long)i;
    }
    CHECK(bad < 0, "%s: every bf16 pattern in element order: element %lld (0x%04x) wrong", name, bad,
          bad < 0 ? 0u : h[bad]);
}

typedef void (*narrow_fn)(const uint32_t *in, uint16_t *out, size_t n);

static void check_level(const char *name, narrow_fn f, uint32_t *in, uint16_t *out)
{
    /* every high half with each boundary low half (a multiple of 16 lanes) */
    const size_t n_sweep = (size_t)65536 * N_LOW;
    for (size_t i = 0; i < n_sweep; i++)
        in[i] = sweep_bits((uint32_t)i);
    memset(out, 0xA5, n_sweep * 2);
    f(in, out, n_sweep);
    long long bad = first_wrong(in, out, n_sweep);
    CHECK(bad < 0, "%s: every high half x %d low halves: bits 0x%08x gave 0x%04x, want 0x%04x", name, N_LOW,
          bad < 0 ? 0u : in[bad], bad < 0 ? 0u : out[bad], bad < 0 ? 0u : lmk_f32_to_bf16(((float *)in)[bad]));

    for (size_t i = 0; i < N_RANDOM; i++)
        in[i] = next_u32();
    memset(out, 0xA5, N_RANDOM * 2);
    f(in, out, N_RANDOM);
    bad = first_wrong(in, out, N_RANDOM);
    CHECK(bad < 0, "%s: %d random bit patterns: 0x%08x gave 0x%04x, want 0x%04x", name, N_RANDOM,
          bad < 0 ? 0u : in[bad], bad < 0 ? 0u : out[bad], bad < 0 ? 0u : lmk_f32_to_bf16(((float *)in)[bad]));

    /* one NaN (payload that carries without the fix-up) in one lane of 32 numbers, every lane */
    static const uint32_t nans[] = {0x7fffffffu, 0xffffffffu, 0x7fbfffffu, 0x7f80ffffu, 0x7fc00000u, 0xff800001u};
    int wrong = 0;
    for (size_t k = 0; k < sizeof nans / sizeof nans[0]; k++)
        for (size_t lane = 0; lane < 32; lane++) {
            uint32_t v[32];
            uint16_t o[32];
            for (size_t i = 0; i < 32; i++)
                v[i] = 0x3f800000u + (uint32_t)i * 0x8000u + 0x7fffu; /* numbers just below ties */
            v[lane] = nans[k];
            f(v, o, 32);
            wrong += first_wrong(v, o, 32) >= 0;
        }
    CHECK(wrong == 0, "%s: a single NaN among numbers, each lane and payload: %d vectors wrong", name, wrong);
}
#endif

int main(void)
{
    static uint32_t in[N_RANDOM > 65536 * N_LOW ? N_RANDOM : 65536 * N_LOW];
    static uint16_t out[sizeof in / sizeof in[0]];
#if LMK_CPU_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) {
        check_level("avx512 lmk_cpu_bf16_16", narrow_avx512, in, out);
        check_level("avx512 lmk_cpu_eo32 + lmk_cpu_store_bf16_eo16", narrow_avx512_eo, in, out);
        check_widen_eo("avx512 lmk_cpu_bf16_widen_eo16 + lmk_cpu_store_eo16_f32", widen_eo_avx512);
    } else
        SKIP("avx512: this CPU has no AVX-512F");
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        check_level("avx2 lmk_cpu_bf16_8", narrow_avx2, in, out);
        check_level("avx2 lmk_cpu_bf16_8x2", narrow_avx2_x2, in, out);
        check_level("avx2 lmk_cpu_eo16 + lmk_cpu_bf16_eo", narrow_avx2_eo, in, out);
        check_widen_eo("avx2 lmk_cpu_bf16_widen_eo + lmk_cpu_store_eo_f32", widen_eo_avx2);
    } else {
        SKIP("avx2: this CPU has no AVX2+FMA");
    }
#else
    (void)in, (void)out, (void)sweep_bits, (void)first_wrong, (void)next_u32;
    SKIP("vector narrowing: not an x86-64 build (the portable path rounds with lmk_f32_to_bf16 itself)");
#endif
    return harness_summary();
}
