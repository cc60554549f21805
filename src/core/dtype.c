/*
 * dtype.c - element types and the exact half-precision conversions every backend uses.
 *
 * Widening bf16/f16 to f32 is exact. Narrowing rounds to nearest, ties to even, the IEEE default,
 * so CPU and GPU produce the same bits (__float2bfloat16_rn and __float2half_rn round the same way).
 * A NaN stays a NaN: the quiet bit is set and the sign and top payload bits are kept, because plain
 * rounding arithmetic on a NaN with a small payload would carry into the exponent and give inf.
 */
#include "core/internal.h"
#include "core/f8.h"

#include <math.h>
#include <string.h>

static const struct {
    const char *name;
    size_t size;
} g_dtypes[LMK_DTYPE_COUNT] = {
    [LMK_F32] = {"f32", 4}, [LMK_F16] = {"f16", 2}, [LMK_BF16] = {"bf16", 2}, [LMK_U8] = {"u8", 1},
    [LMK_U16] = {"u16", 2}, [LMK_U32] = {"u32", 4}, [LMK_I32] = {"i32", 4}, [LMK_I64] = {"i64", 8},
    [LMK_F8E4M3] = {"f8e4m3", 1},
};

size_t lmk_dtype_size(lmk_dtype t)
{
    return (unsigned)t < LMK_DTYPE_COUNT ? g_dtypes[t].size : 0;
}

const char *lmk_dtype_name(lmk_dtype t)
{
    return (unsigned)t < LMK_DTYPE_COUNT ? g_dtypes[t].name : "invalid";
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float lmk_bf16_to_f32(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

uint16_t lmk_f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float lmk_f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1f) /* inf or NaN: payload moves to the top of the f32 mantissa */
        return bits_f32(sign | 0x7f800000u | (mant << 13));
    if (exp != 0)
        return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
    if (mant == 0)
        return bits_f32(sign);
    /* subnormal: mant * 2^-24, normalised */
    int e = 113;
    while (!(mant & 0x400u)) {
        mant <<= 1;
        e--;
    }
    return bits_f32(sign | ((uint32_t)e << 23) | ((mant & 0x3ffu) << 13));
}

uint16_t lmk_f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x > 0x7f800000u) /* NaN */
        return (uint16_t)(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
    if (x >= 0x477ff000u) /* >= 65520 (halfway past the largest finite) rounds to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (x >= 0x38800000u) { /* normal in f16: rebias the exponent, round the 13 dropped bits */
        uint32_t r = x - 0x38000000u;
        r += 0xfffu + ((r >> 13) & 1u);
        return (uint16_t)(sign | (r >> 13));
    }
    if (x < 0x33000000u) /* below 2^-25: rounds to zero (2^-25 itself ties to even zero) */
        return sign;
    /* subnormal in f16: units of 2^-24 */
    const uint32_t e = x >> 23;
    const uint32_t m = (x & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e;
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u)))
        q++;
    return (uint16_t)(sign | q);
}

/* E4M3FN: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is subnormal (m * 2^-9);
 * 0x7F and 0xFF are NaN; there is no infinity. */
float lmk_f8e4m3_to_f32(uint8_t v)
{
    const float sign = (v & 0x80u) ? -1.0f : 1.0f;
    const int e = (v >> 3) & 0xf, m = v & 7;
    if (e == 15 && m == 7)
        return bits_f32((v & 0x80u ? 0x80000000u : 0u) | 0x7fc00000u);
    if (e == 0)
        return sign * ldexpf((float)m, -9);
    return sign * ldexpf((float)(8 + m), e - 10);
}

uint8_t lmk_f32_to_f8e4m3(float f)
{
    return lmk_f8e4m3_from_f32_bits(f32_bits(f));
}

double lmk_float_load(lmk_dtype t, const void *base, size_t i)
{
    if (t == LMK_F32) {
        float f;
        memcpy(&f, (const char *)base + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, (const char *)base + 2 * i, 2);
    return t == LMK_BF16 ? lmk_bf16_to_f32(h) : lmk_f16_to_f32(h);
}

double lmk_ulp(lmk_dtype t, double v)
{
    const int frac_bits = t == LMK_BF16 ? 7 : t == LMK_F16 ? 10 : t == LMK_F8E4M3 ? 3 : 23;
    const double min_spacing = ldexp(1.0, t == LMK_BF16 ? -133 : t == LMK_F16 ? -24 : t == LMK_F8E4M3 ? -9 : -149);
    if (v == 0 || !isfinite(v))
        return min_spacing;
    int e;
    frexp(fabs(v), &e); /* |v| in [2^(e-1), 2^e) */
    const double u = ldexp(1.0, e - 1 - frac_bits);
    return u > min_spacing ? u : min_spacing;
}

double lmk_rope_tolerance(lmk_dtype t, double ref)
{
    return t == LMK_F32 ? 1e-5 : lmk_ulp(t, ref) + 1e-6;
}
