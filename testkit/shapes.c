/*
 * shapes.c - real model shapes, case names and positions that the tests, the tool and the ops'
 * case descriptors share.
 *
 * Names are printed the way ggml's test-backend-ops prints its cases, parameters first and the
 * model after "//", e.g.
 *     rope_multi imrope hd=256 rd=64 nh=24 T=4106 f32 half_rope // qwen3.5-27B Q
 * so a failing line says at once which layer of which model is affected.
 */
#include "testkit.h"

#include <stdio.h>

/* Full-attention layers. Qwen3.5/3.6: head_dim 256, rope_dim 64 (partial rotary 0.25), base 1e7,
 * IMROPE [11,11,10,0]. Qwen3-VL and Qwen2-VL rotate the whole 128-dim head; their head counts are
 * those of the 8B and 7B models. */
const tst_attn_shape tst_attn_shapes[] = {
    {"qwen3.5-0.8B/2B", 8, 2, 256, 64, 1e7f, LMK_ROPE_IMROPE, {11, 11, 10, 0}},
    {"qwen3.5-4B/9B", 16, 4, 256, 64, 1e7f, LMK_ROPE_IMROPE, {11, 11, 10, 0}},
    {"qwen3.5/3.6-27B", 24, 4, 256, 64, 1e7f, LMK_ROPE_IMROPE, {11, 11, 10, 0}},
    {"qwen3.5/3.6-35B-A3B", 16, 2, 256, 64, 1e7f, LMK_ROPE_IMROPE, {11, 11, 10, 0}},
    {"qwen3.5-122B/397B", 32, 2, 256, 64, 1e7f, LMK_ROPE_IMROPE, {11, 11, 10, 0}},
    {"qwen3-vl-8B", 32, 8, 128, 128, 5e6f, LMK_ROPE_IMROPE, {24, 20, 20, 0}},
    {"qwen2-vl-7B", 28, 4, 128, 128, 1e6f, LMK_ROPE_MROPE, {16, 24, 24, 0}},
};
const int tst_attn_shape_count = (int)(sizeof tst_attn_shapes / sizeof tst_attn_shapes[0]);

char *tst_rope_name(char *buf, size_t n, const char *op, const lmk_rope_multi_params *p, lmk_dtype dtype,
                    const char *comment)
{
    const char *mode = p->mode == LMK_ROPE_IMROPE ? "imrope" : p->mode == LMK_ROPE_MROPE ? "mrope" : "mode?";
    const char *pairing = p->pairing == LMK_ROPE_PAIR_HALF_ROPE   ? "half_rope"
                          : p->pairing == LMK_ROPE_PAIR_HALF_HEAD ? "half_head"
                                                                  : "pairing?";
    snprintf(buf, n, "%s %s hd=%u rd=%u nh=%u T=%u %s %s%s%s", op, mode, p->head_dim, p->rope_dim, p->n_heads,
             p->seq_len, lmk_dtype_name(dtype), pairing, comment && *comment ? " // " : "",
             comment ? comment : "");
    return buf;
}

char *tst_format_base(char *buf, size_t n, double v)
{
    char tmp[32], *o = buf;
    snprintf(tmp, sizeof tmp, "%g", v);
    for (const char *p = tmp; *p && (size_t)(o - buf) + 1 < n; p++) {
        if (p[0] == 'e' && p[1] == '+') {
            *o++ = 'e';
            p++;
            while (p[1] == '0' && p[2])
                p++;
            continue;
        }
        *o++ = *p;
    }
    *o = '\0';
    return buf;
}

void tst_positions_text(int32_t *pos, uint32_t seq_len, int32_t start)
{
    for (int axis = 0; axis < 4; axis++)
        for (uint32_t i = 0; i < seq_len; i++)
            pos[(size_t)axis * seq_len + i] = start + (int32_t)i;
}

void tst_positions_random(tst_rng *r, int32_t *pos, uint32_t seq_len, int32_t lo, int32_t hi)
{
    const uint32_t span = (uint32_t)((int64_t)hi - lo + 1);
    for (size_t i = 0; i < 4 * (size_t)seq_len; i++)
        pos[i] = (int32_t)((int64_t)lo + (span ? tst_rng_below(r, span) : tst_rng_u32(r)));
}
