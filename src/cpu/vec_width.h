/*
 * vec_width.h - binds the generic names of a per-width template to one width of cpu/vec.h. An op
 * writes a loop once, in a template header that its cpu.c includes once per width with LMK_VEC_W
 * defined as 8 (AVX2) or 16 (AVX-512); the template includes this file first, and again after
 * undefining LMK_VEC_W at its end, which only removes the names. So this file has no include guard:
 * each inclusion replaces the names of the one before.
 *
 *   VW         f32 lanes of a vector: 8 or 16
 *   VF, VD     the f32 and the double vector types
 *   V(step)    cpu/vec.h's step at this width: V(load) is lmk_v8_load or lmk_v16_load
 *   VN(name)   a template function's name at this width: VN(split) is split_v8 or split_v16
 *   V_TARGET   the level's target attribute (LMK_TARGET_AVX2 or LMK_TARGET_AVX512)
 */
#undef VW
#undef VF
#undef VD
#undef V
#undef VN
#undef V_TARGET

#if !defined(LMK_VEC_W)
/* only the names removed */
#elif LMK_VEC_W == 8
#define VW 8
#define VF __m256
#define VD __m256d
#define V(step) lmk_v8_##step
#define VN(name) name##_v8
#define V_TARGET LMK_TARGET_AVX2
#elif LMK_VEC_W == 16
#define VW 16
#define VF __m512
#define VD __m512d
#define V(step) lmk_v16_##step
#define VN(name) name##_v16
#define V_TARGET LMK_TARGET_AVX512
#else
#error "cpu/vec_width.h: LMK_VEC_W must be 8 or 16"
#endif
