/*
 * cpu.h - what the files of the CPU backend share: the instruction-set level chosen at device
 * open, the per-stream thread pool that runs an op's work, and the streaming (non-temporal) copy
 * both ops use for outputs too large to be worth keeping in cache.
 *
 * Backend layout: backend.c (vtable, device, memory, streams and their pools); sincos.c (the
 * cos/sin tables of rope's angles, for lmk_rope and lmk_attn_prologue); bf16_simd.h (vector
 * f32 -> bf16 narrowing); vec.h and vec_width.h (the vector layer of rope and attn_prologue: widen,
 * narrow, rotate, sums, each written once per width); rope_angles.h (their angle tables); each op's CPU
 * path is src/ops/<op>/cpu.c. An op splits its work into n_threads deterministic shares (each output element is
 * computed by a fixed formula from the inputs alone, so the split never changes a result bit) and
 * hands one task function to lmk_cpu_parallel, which runs share 0 on the calling thread and the
 * others on the stream's workers, returning when all are done.
 */
#ifndef LMK_CPU_H
#define LMK_CPU_H

#include "core/internal.h"

#include <string.h>

/* -DLMK_CPU_PORTABLE builds only the portable C paths, as on a non-x86 machine. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(LMK_CPU_PORTABLE)
#define LMK_CPU_X86 1
#include <immintrin.h>
/* Functions that use AVX2/AVX-512 carry their own target, so the rest of the library keeps the
 * baseline ISA and the choice is made at run time (device open). */
#define LMK_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define LMK_TARGET_AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))
#else
#define LMK_CPU_X86 0
#endif

/* For helpers called with constant arguments (dtype, streaming), so each caller gets its own
 * specialised copy. */
#if defined(__GNUC__)
#define LMK_INLINE static inline __attribute__((always_inline))
#else
#define LMK_INLINE static inline
#endif

/* A 16-bit element of a half dtype widened to f32: f16 when dt is LMK_F16, bf16 otherwise. The bf16
 * case is inline (lmk_bf16_to_f32 is a call per element). */
static inline float lmk_cpu_half_to_f32(lmk_dtype dt, uint16_t h)
{
    if (dt == LMK_F16)
        return lmk_f16_to_f32(h);
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Instruction-set levels, best last. The environment variable LMK_CPU_ISA ("scalar", "avx2",
 * "avx512") caps the level at device open, so tests can reach every path on one machine. */
typedef enum lmk_cpu_isa { LMK_CPU_SCALAR = 0, LMK_CPU_AVX2 = 1, LMK_CPU_AVX512 = 2 } lmk_cpu_isa;

/* Outputs of at least this many bytes are written with streaming stores when aligned: they could
 * not stay in L2/L3 anyway, and streaming stores skip the read-for-ownership of every destination
 * line, which is a third of the traffic of a plain copy. Smaller outputs stay cached for the next
 * op. (The host L3 size that sysconf reports is unreliable in VMs: 320 MB on the 32 MB dev box.) */
#define LMK_CPU_STREAM_MIN_BYTES ((size_t)4 << 20)

/* Ops that move fewer bytes than this run on the calling thread alone: waking a sleeping worker
 * costs more than a small op (a decode step) takes. With spinning workers, two threads beat one
 * from about this size on (docs/decisions.md, "A spinning-then-sleeping pool per stream"). */
#define LMK_CPU_PARALLEL_MIN_BYTES ((size_t)256 << 10)

/* One share of an op: called once per thread with tid in [0, n_threads). */
typedef void (*lmk_cpu_task)(void *ctx, int tid, int n_threads);

/* Runs task on the stream's pool (or the calling thread alone when `bytes` is small) and returns
 * when every share has finished. Never allocates. */
void lmk_cpu_parallel(lmk_stream *s, size_t bytes, lmk_cpu_task task, void *ctx);

/* How many shares lmk_cpu_parallel(s, bytes, ...) runs the task in at most: 1 when it runs it on
 * the calling thread alone (a small op, a one-thread stream). */
int lmk_cpu_parallel_threads(const lmk_stream *s, size_t bytes);

/* Scratch memory of the stream's pool, allocated with the stream (an op call allocates nothing),
 * 64-byte aligned, its bytes left by the last op that used them. lmk_cpu_scratch(s, tid): for
 * share tid (< the stream's thread count) of the op running on the stream, its per-thread tables
 * and buffers, which would otherwise sit on the calling thread's stack (share 0 runs there, and
 * lmk.h bounds its stack use). lmk_cpu_shared_scratch(s): what the calling thread prepares before
 * lmk_cpu_parallel for every share to read. One stream runs one op at a time (lmk.h), so an op
 * has both to itself. */
/* A share's block holds gated_delta_rule's chunk, the largest user: its f32 state and a chunk of 32
 * tokens' rows at head dims up to 128 (src/ops/gated_delta_rule/cpu_chunk.h); larger heads take
 * chunks of 16 or the token form. Sized so that a stream of the most threads lmk allows (1024)
 * holds under 200 MiB. */
#define LMK_CPU_SCRATCH ((size_t)192 << 10)
#define LMK_CPU_SHARED_SCRATCH ((size_t)8 << 10)
void *lmk_cpu_scratch(lmk_stream *s, int tid);
void *lmk_cpu_shared_scratch(lmk_stream *s);

/* The ISA level of the stream's device. */
lmk_cpu_isa lmk_cpu_stream_isa(const lmk_stream *s);

/* The largest |theta| the vector levels of lmk_cpu_sincos reduce exactly; beyond it (i64
 * positions, freq_base < 1, an infinite or NaN angle) callers pass LMK_CPU_SCALAR. */
#define LMK_CPU_SINCOS_VECTOR_MAX 0x1p40

/* c[i] = (float)(m * cos(theta[i])) and s[i] = (float)(m * sin(theta[i])) for i < n, the product
 * in double (skipped at m == 1), for rope's angle tables (sincos.c; lmk_rope and
 * lmk_attn_prologue share it). AVX512/AVX2: vector polynomials, which need n a multiple of 8 and
 * every |theta[i]| <= LMK_CPU_SINCOS_VECTOR_MAX; SCALAR: libm, any n and theta. Levels could round
 * a value differently in its last bit (lmk.h allows it across levels); none did on 98M random
 * angles up to 2^40 (docs/cpu.md, "Angles: lmk_cpu_sincos"). */
void lmk_cpu_sincos(lmk_cpu_isa isa, const double *theta, float *c, float *s, size_t n, double m);


/* The contiguous share [lo, hi) of n items for thread tid of nth, with lo and hi multiples of
 * `grain` (except hi == n). Depends only on (n, tid, nth, grain). */
static inline void lmk_cpu_share(size_t n, int tid, int nth, size_t grain, size_t *lo, size_t *hi)
{
    size_t per = (n / (size_t)nth + grain - 1) / grain * grain;
    if (per == 0)
        per = grain;
    const size_t a = per * (size_t)tid, b = a + per;
    *lo = a < n ? a : n;
    *hi = b < n && tid + 1 < nth ? b : n;
}

/* Copies n bytes with streaming stores: dst must be 16-byte aligned and n a multiple of 16.
 * SSE2 is part of x86-64, so this needs no dispatch; wider vectors move nothing faster (the
 * memory bus is the limit). Other architectures use memcpy. The caller issues the store fence
 * (lmk_cpu_stream_fence) once after its last streaming store. */
static inline void lmk_cpu_stream_copy(void *dst, const void *src, size_t n)
{
#if LMK_CPU_X86
    unsigned char *d = dst;
    const unsigned char *s = src;
    /* 16-byte steps up to the next cache line, so the main loop fills whole lines. */
    while (n >= 16 && ((uintptr_t)d & 63)) {
        _mm_stream_si128((__m128i *)(void *)d, _mm_loadu_si128((const __m128i *)(const void *)s));
        d += 16, s += 16, n -= 16;
    }
    for (; n >= 64; d += 64, s += 64, n -= 64) {
        const __m128i x0 = _mm_loadu_si128((const __m128i *)(const void *)s);
        const __m128i x1 = _mm_loadu_si128((const __m128i *)(const void *)(s + 16));
        const __m128i x2 = _mm_loadu_si128((const __m128i *)(const void *)(s + 32));
        const __m128i x3 = _mm_loadu_si128((const __m128i *)(const void *)(s + 48));
        _mm_stream_si128((__m128i *)(void *)d, x0);
        _mm_stream_si128((__m128i *)(void *)(d + 16), x1);
        _mm_stream_si128((__m128i *)(void *)(d + 32), x2);
        _mm_stream_si128((__m128i *)(void *)(d + 48), x3);
    }
    for (; n >= 16; d += 16, s += 16, n -= 16)
        _mm_stream_si128((__m128i *)(void *)d, _mm_loadu_si128((const __m128i *)(const void *)s));
#else
    memcpy(dst, src, n);
#endif
}

/* Orders this thread's streaming stores before whatever it does next (joining the pool). */
static inline void lmk_cpu_stream_fence(void)
{
#if LMK_CPU_X86
    _mm_sfence();
#endif
}

#endif /* LMK_CPU_H */
