/*
 * case.c - the case descriptor of rope (testkit/testkit.h): lmk_rope in every mode and scaling,
 * with dense and strided operands, and the 0.1 entry points lmk_rope_multi / lmk_rope_multi_qk.
 *
 * The table holds every case `lmk check` and the tests run, on the layers of real models:
 *   Llama-3.1-8B     NEOX, head 128, base 5e5, the llama3 freq_factors (HF rope_type llama3)
 *   Qwen3-8B         NEOX, head 128, base 1e6, q and k rotated in place inside the packed QKV
 *   Qwen3.5/3.6      IMROPE [11,11,10,0], head 256, rope_dim 64, base 1e7, q read out of the
 *                    [q | gate] projection (strided), and the 0.1 rope_multi cases of every size
 *   gpt-oss-20b      NEOX, head 64, base 1.5e5, YaRN x32 from 4096 (llama.cpp's ggml YaRN)
 *   GPT-J-6B         NORMAL (adjacent pairs), head 256, rotary 64
 *   Qwen2-VL ViT     VISION [20,20] on head 80, patch-grid positions
 *   Qwen3-VL, Qwen2-VL text (IMROPE, MROPE), and edge shapes: tails, huge and zero sections, odd
 *   sizes, unaligned views, positions up to 2^20, u32 and i64 positions, attn_factor != 1.
 * Outputs are compared with the float64 reference (lmk_ref_rope_f64) under lmk.h's precision
 * contract; elements outside the rotated pairs must be the input's bits.
 */
#include "testkit_ref.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ENTRY_ROPE, ENTRY_MULTI };           /* lmk_rope; lmk_rope_multi or lmk_rope_multi_qk (0.1) */
enum { QI, QO, KI, KO, POS, FF };           /* the operands in tst_inst.arg */
enum { DENSE, QGATE, QKV };                 /* q dense; q inside [T, Hq, 2D] q|gate; q, k inside [q|k|v] */
enum { POS_TEXT, POS_RANDOM, POS_LARGE, POS_GRID };
enum { FF_NONE, FF_LLAMA3, FF_RANDOM };

typedef struct rope_case {
    int entry;
    lmk_rope_params p;      /* n_k_heads 0: q only */
    lmk_dtype dtype;
    int layout;
    bool in_place;          /* every tensor is its own output (QKV: always) */
    int pos;                /* POS_*: how positions are drawn */
    lmk_dtype pos_dtype;    /* i32, u32 or i64 */
    int ff;                 /* FF_*: freq_factors */
    uint32_t offset;        /* elements past a 256-byte boundary: 1 makes every view unaligned */
} rope_case;

_Static_assert(sizeof(rope_case) <= TST_CASE_PARAMS, "rope_case must fit in tst_case.p");

static const rope_case *P(const tst_case *c)
{
    return (const rope_case *)(const void *)c->p.bytes;
}

static bool multi_mode(lmk_rope_mode m)
{
    return m == LMK_ROPE_MROPE || m == LMK_ROPE_IMROPE || m == LMK_ROPE_VISION;
}

static size_t n_positions(const rope_case *rc)
{
    return (rc->entry == ENTRY_MULTI || multi_mode(rc->p.mode) ? 4 : 1) * (size_t)rc->p.seq_len;
}

/* ---- the table ---- */

#define D(t) (1u << (t))
#define D3 (D(LMK_F32) | D(LMK_BF16) | D(LMK_F16))

typedef struct row {
    rope_case rc;  /* dtype unset: one case per dtype of `dtypes` */
    unsigned dtypes;
    unsigned flags;
    const char *model;
} row;

#define MULTI .entry = ENTRY_MULTI
#define ROPE .entry = ENTRY_ROPE
#define QWEN35 .head_dim = 256, .rope_dim = 64, .freq_base = 1e7f, .mode = LMK_ROPE_IMROPE, .sections = {11, 11, 10, 0}
#define LLAMA31 .head_dim = 128, .rope_dim = 128, .n_heads = 32, .n_k_heads = 8, .freq_base = 5e5f, .mode = LMK_ROPE_NEOX
#define QWEN3 .head_dim = 128, .rope_dim = 128, .n_heads = 32, .n_k_heads = 8, .freq_base = 1e6f, .mode = LMK_ROPE_NEOX
/* gpt-oss: YaRN factor 32 over 4096 tokens, as llama.cpp runs it (ggml's rope_yarn). */
#define GPTOSS .head_dim = 64, .rope_dim = 64, .n_heads = 64, .n_k_heads = 8, .freq_base = 1.5e5f, \
               .mode = LMK_ROPE_NEOX, .freq_scale = 1.0f / 32, .ext_factor = 1.0f, .n_ctx_orig = 4096, \
               .beta_fast = 32.0f, .beta_slow = 1.0f
#define GPTJ .head_dim = 256, .rope_dim = 64, .n_heads = 16, .n_k_heads = 16, .freq_base = 1e4f, .mode = LMK_ROPE_NORMAL
#define VIT .head_dim = 80, .rope_dim = 80, .n_heads = 16, .n_k_heads = 16, .freq_base = 1e4f, \
            .mode = LMK_ROPE_VISION, .sections = {20, 20, 0, 0}
#define MAXS UINT32_MAX

static const row k_rows[] = {
    /* ---- lmk_rope_multi / lmk_rope_multi_qk (0.1) ---- */
    /* Qwen3.5/3.6-27B: Q 24 + K 4 in one fused call, a prefill of text tokens */
    {{MULTI, .p = {QWEN35, .n_heads = 24, .n_k_heads = 4, .seq_len = 64}}, D3, 0, "Qwen3.5/3.6-27B"},
    {{MULTI, .p = {QWEN35, .n_heads = 24, .n_k_heads = 4, .seq_len = 64}, .in_place = true}, D3, 0, "Qwen3.5/3.6-27B"},
    {{MULTI, .p = {QWEN35, .n_heads = 24, .n_k_heads = 4, .seq_len = 17}}, D(LMK_F32), TST_CASE_CONTRACT,
     "Qwen3.5/3.6-27B"},
    {{MULTI, .p = {QWEN35, .n_heads = 24, .n_k_heads = 4, .seq_len = 17}, .in_place = true}, D(LMK_BF16),
     TST_CASE_CONTRACT, "Qwen3.5/3.6-27B"},
    /* Q and K as separate calls, image-like positions (every axis its own) */
    {{MULTI, .p = {QWEN35, .n_heads = 24, .seq_len = 37}, .pos = POS_RANDOM}, D3, 0, "Qwen3.5/3.6-27B Q"},
    {{MULTI, .p = {QWEN35, .n_heads = 4, .seq_len = 37}, .pos = POS_RANDOM, .in_place = true}, D3, 0,
     "Qwen3.5/3.6-27B K"},
    /* decode: one token anywhere in a long context; positions up to |2^20| */
    {{MULTI, .p = {QWEN35, .n_heads = 32, .n_k_heads = 2, .seq_len = 1}, .pos = POS_LARGE}, D3, 0,
     "Qwen3.5-122B/397B decode"},
    {{MULTI, .p = {QWEN35, .n_heads = 24, .n_k_heads = 4, .seq_len = 16}, .pos = POS_LARGE}, D3, 0, "Qwen3.5/3.6-27B"},
    {{MULTI, .p = {QWEN35, .n_heads = 4, .seq_len = 16}, .pos = POS_LARGE, .pos_dtype = LMK_U32, .in_place = true}, D3,
     0, "Qwen3.5/3.6-27B K"},
    /* the Metal seed's pairing (x[p], x[p + head_dim/2]) on the same model */
    {{MULTI, .p = {QWEN35, .n_heads = 24, .n_k_heads = 4, .seq_len = 9, .pairing = LMK_ROPE_PAIR_HALF_HEAD},
      .pos = POS_RANDOM}, D3, 0, "Qwen3.5/3.6-27B, the seed's pairing"},
    {{MULTI, .p = {QWEN35, .n_heads = 4, .seq_len = 9, .pairing = LMK_ROPE_PAIR_HALF_HEAD}, .in_place = true}, D3, 0,
     "Qwen3.5/3.6-27B K, the seed's pairing"},
    {{MULTI, .p = {.head_dim = 256, .rope_dim = 64, .freq_base = 1e7f, .mode = LMK_ROPE_MROPE,
                   .sections = {11, 11, 10, 0}, .n_heads = 8, .n_k_heads = 2, .seq_len = 12}, .pos = POS_RANDOM}, D3,
     0, "Qwen3.5-0.8B/2B shape, MROPE sections"},
    {{MULTI, .p = {QWEN35, .n_heads = 24, .n_k_heads = 4, .seq_len = 5}, .pos = POS_RANDOM, .offset = 1}, D3, 0,
     "Qwen3.5/3.6-27B"},
    {{MULTI, .p = {QWEN35, .n_heads = 4, .seq_len = 5}, .pos = POS_RANDOM, .offset = 1, .in_place = true}, D3, 0,
     "Qwen3.5/3.6-27B K"},
    {{MULTI, .p = {.head_dim = 128, .rope_dim = 128, .freq_base = 5e6f, .mode = LMK_ROPE_IMROPE,
                   .sections = {24, 20, 20, 0}, .n_heads = 32, .n_k_heads = 8, .seq_len = 20}, .pos = POS_RANDOM}, D3,
     0, "Qwen3-VL-8B"},
    {{MULTI, .p = {.head_dim = 128, .rope_dim = 128, .freq_base = 1e6f, .mode = LMK_ROPE_MROPE,
                   .sections = {16, 24, 24, 0}, .n_heads = 28, .n_k_heads = 4, .seq_len = 20}, .pos = POS_RANDOM,
      .in_place = true}, D3, 0, "Qwen2-VL-7B"},
    /* the seed's own test shapes (its test vectors 1 and 3), sections that wrap or sum to 0 */
    {{MULTI, .p = {.head_dim = 16, .rope_dim = 8, .freq_base = 2.0f, .mode = LMK_ROPE_IMROPE, .sections = {2, 2, 1, 0},
                   .n_heads = 1, .seq_len = 1, .pairing = LMK_ROPE_PAIR_HALF_HEAD}, .pos = POS_RANDOM}, D3, 0,
     "edge: seed vector 1, base 2"},
    {{MULTI, .p = {.head_dim = 32, .rope_dim = 16, .freq_base = 1e4f, .mode = LMK_ROPE_IMROPE, .sections = {3, 3, 2, 0},
                   .n_heads = 4, .seq_len = 6, .pairing = LMK_ROPE_PAIR_HALF_HEAD}}, D3, 0, "edge: seed vector 3"},
    {{MULTI, .p = {.head_dim = 32, .rope_dim = 32, .freq_base = 1e4f, .mode = LMK_ROPE_MROPE, .sections = {0, 0, 0, 0},
                   .n_heads = 2, .seq_len = 3}, .pos = POS_RANDOM}, D3, 0, "edge: sections sum to 0"},
    {{MULTI, .p = {.head_dim = 32, .rope_dim = 32, .freq_base = 1e4f, .mode = LMK_ROPE_IMROPE,
                   .sections = {MAXS, MAXS, 7, 0}, .n_heads = 2, .seq_len = 3}, .pos = POS_RANDOM}, D3, 0,
     "edge: sections past 2^32"},
    {{MULTI, .p = {.head_dim = 32, .rope_dim = 32, .freq_base = 1e4f, .mode = LMK_ROPE_MROPE,
                   .sections = {2, MAXS, MAXS, 1}, .n_heads = 2, .seq_len = 3}, .pos = POS_RANDOM}, D3, 0,
     "edge: sections past 2^32"},
    /* odd sizes that leave vector tails everywhere */
    {{MULTI, .p = {.head_dim = 6, .rope_dim = 4, .freq_base = 1e4f, .mode = LMK_ROPE_IMROPE, .sections = {1, 1, 0, 0},
                   .n_heads = 3, .n_k_heads = 1, .seq_len = 5}, .pos = POS_RANDOM}, D3, 0, "edge: tails"},
    {{MULTI, .p = {.head_dim = 10, .rope_dim = 2, .freq_base = 100.0f, .mode = LMK_ROPE_MROPE, .sections = {1, 0, 0, 0},
                   .n_heads = 3, .seq_len = 4, .pairing = LMK_ROPE_PAIR_HALF_HEAD}, .pos = POS_RANDOM,
      .in_place = true}, D3, 0, "edge: tails"},
    {{MULTI, .p = {.head_dim = 130, .rope_dim = 126, .freq_base = 1e4f, .mode = LMK_ROPE_IMROPE,
                   .sections = {7, 7, 7, 0}, .n_heads = 3, .n_k_heads = 2, .seq_len = 7}, .pos = POS_LARGE,
      .offset = 1}, D3, 0, "edge: tails, unaligned"},
    /* outputs of several MB, large enough for the CPU's streaming-store path, aligned or not */
    {{MULTI, .p = {QWEN35, .n_heads = 24, .n_k_heads = 4, .seq_len = 640}, .pos = POS_RANDOM}, D3, 0,
     "Qwen3.5/3.6-27B prompt"},
    {{MULTI, .p = {QWEN35, .n_heads = 24, .seq_len = 641}, .pos = POS_LARGE, .offset = 1}, D3, 0,
     "Qwen3.5/3.6-27B Q prompt"},
    {{MULTI, .p = {QWEN35, .n_heads = 24, .seq_len = 640}, .pos = POS_LARGE, .offset = 1, .in_place = true}, D3, 0,
     "Qwen3.5/3.6-27B Q prompt"},
    {{MULTI, .p = {QWEN35, .n_heads = 24, .n_k_heads = 4, .seq_len = 4106}}, D3, TST_CASE_FULL,
     "Qwen3.5/3.6-27B prompt"},
    {{MULTI, .p = {QWEN35, .n_heads = 24, .n_k_heads = 4, .seq_len = 4106}, .pos = POS_LARGE, .in_place = true}, D3,
     TST_CASE_FULL, "Qwen3.5/3.6-27B prompt"},

    /* ---- lmk_rope: every mode and scaling, strided operands ---- */
    {{ROPE, .p = {LLAMA31, .seq_len = 1}, .pos = POS_LARGE, .ff = FF_LLAMA3}, D(LMK_BF16) | D(LMK_F32), 0,
     "Llama-3.1-8B decode"},
    {{ROPE, .p = {LLAMA31, .seq_len = 37}, .ff = FF_LLAMA3}, D3, 0, "Llama-3.1-8B"},
    {{ROPE, .p = {LLAMA31, .seq_len = 5}, .ff = FF_LLAMA3, .pos_dtype = LMK_I64}, D(LMK_BF16), TST_CASE_CONTRACT,
     "Llama-3.1-8B"},
    {{ROPE, .p = {LLAMA31, .seq_len = 4106}, .ff = FF_LLAMA3}, D(LMK_BF16), TST_CASE_FULL, "Llama-3.1-8B prompt"},
    {{ROPE, .p = {LLAMA31, .seq_len = 37}, .ff = FF_LLAMA3, .layout = QKV}, D(LMK_F32) | D(LMK_BF16), 0,
     "Llama-3.1-8B"},
    {{ROPE, .p = {QWEN3, .seq_len = 37}}, D(LMK_F32) | D(LMK_BF16), 0, "Qwen3-8B"},
    {{ROPE, .p = {QWEN3, .seq_len = 37}, .layout = QKV}, D3, 0, "Qwen3-8B"},
    {{ROPE, .p = {QWEN3, .seq_len = 1}, .layout = QKV, .pos = POS_LARGE}, D(LMK_BF16), 0, "Qwen3-8B decode"},
    {{ROPE, .p = {QWEN3, .seq_len = 4}, .layout = QKV}, D(LMK_BF16), TST_CASE_CONTRACT, "Qwen3-8B"},
    {{ROPE, .p = {QWEN3, .seq_len = 4106}, .layout = QKV}, D(LMK_BF16), TST_CASE_FULL, "Qwen3-8B prompt"},
    {{ROPE, .p = {QWEN35, .n_heads = 24, .n_k_heads = 4, .seq_len = 37}, .layout = QGATE, .pos = POS_RANDOM}, D3, 0,
     "Qwen3.5/3.6-27B"},
    {{ROPE, .p = {QWEN35, .n_heads = 24, .n_k_heads = 4, .seq_len = 1}, .layout = QGATE, .pos = POS_LARGE,
      .in_place = true}, D(LMK_BF16), 0, "Qwen3.5/3.6-27B decode"},
    {{ROPE, .p = {QWEN35, .n_heads = 24, .n_k_heads = 4, .seq_len = 3}, .layout = QGATE, .pos = POS_RANDOM},
     D(LMK_F16), TST_CASE_CONTRACT, "Qwen3.5/3.6-27B"},
    {{ROPE, .p = {QWEN35, .n_heads = 24, .n_k_heads = 4, .seq_len = 9}, .layout = QGATE, .pos_dtype = LMK_I64}, D3, 0,
     "Qwen3.5/3.6-27B"},
    {{ROPE, .p = {QWEN35, .n_heads = 24, .n_k_heads = 4, .seq_len = 4106}, .layout = QGATE}, D(LMK_BF16),
     TST_CASE_FULL, "Qwen3.5/3.6-27B prompt"},
    {{ROPE, .p = {GPTOSS, .seq_len = 37}}, D3, 0, "gpt-oss-20b"},
    {{ROPE, .p = {GPTOSS, .seq_len = 1}, .pos = POS_LARGE}, D(LMK_BF16), 0, "gpt-oss-20b decode"},
    {{ROPE, .p = {GPTOSS, .seq_len = 3}, .in_place = true}, D(LMK_BF16), TST_CASE_CONTRACT, "gpt-oss-20b"},
    {{ROPE, .p = {GPTOSS, .seq_len = 4106}}, D(LMK_BF16), TST_CASE_FULL, "gpt-oss-20b prompt"},
    {{ROPE, .p = {GPTJ, .seq_len = 37}}, D(LMK_F32) | D(LMK_F16), 0, "GPT-J-6B"},
    {{ROPE, .p = {GPTJ, .seq_len = 1}, .pos = POS_LARGE, .in_place = true}, D(LMK_BF16), 0, "GPT-J-6B decode"},
    {{ROPE, .p = {GPTJ, .seq_len = 2}}, D(LMK_F32), TST_CASE_CONTRACT, "GPT-J-6B"},
    {{ROPE, .p = {VIT, .seq_len = 256}, .pos = POS_GRID}, D(LMK_F32) | D(LMK_BF16), 0, "Qwen2-VL ViT (16x16 patches)"},
    {{ROPE, .p = {VIT, .seq_len = 16}, .pos = POS_GRID}, D(LMK_F32), TST_CASE_CONTRACT, "Qwen2-VL ViT"},
    {{ROPE, .p = {VIT, .seq_len = 4096}, .pos = POS_GRID}, D(LMK_F32), TST_CASE_FULL, "Qwen2-VL ViT (64x64 patches)"},
    {{ROPE, .p = {.head_dim = 128, .rope_dim = 128, .n_heads = 28, .n_k_heads = 4, .freq_base = 1e6f,
                  .mode = LMK_ROPE_MROPE, .sections = {16, 24, 24, 0}, .seq_len = 20}, .pos = POS_RANDOM,
      .layout = QGATE}, D(LMK_BF16), 0, "Qwen2-VL-7B, q strided"},
    {{ROPE, .p = {.head_dim = 128, .rope_dim = 128, .n_heads = 28, .n_k_heads = 4, .freq_base = 1e6f,
                  .mode = LMK_ROPE_NEOX, .freq_scale = 0.25f, .seq_len = 37}, .pos_dtype = LMK_U32}, D(LMK_F32), 0,
     "Qwen2.5-7B, rope_scaling linear x4"},
    /* edges: attn_factor scales the tolerance, freq_factors with more entries than pairs, tails */
    {{ROPE, .p = {.head_dim = 64, .rope_dim = 32, .n_heads = 4, .n_k_heads = 2, .freq_base = 1e4f,
                  .mode = LMK_ROPE_NEOX, .attn_factor = 2.0f, .seq_len = 7, .pairing = LMK_ROPE_PAIR_HALF_HEAD},
      .pos = POS_LARGE}, D3, 0, "edge: attn_factor 2, the seed's pairing"},
    {{ROPE, .p = {.head_dim = 32, .rope_dim = 16, .n_heads = 3, .freq_base = 1e4f, .mode = LMK_ROPE_IMROPE,
                  .sections = {3, 3, 2, 0}, .seq_len = 5}, .pos = POS_RANDOM, .ff = FF_RANDOM, .offset = 1}, D3, 0,
     "edge: freq_factors, unaligned"},
    {{ROPE, .p = {.head_dim = 6, .rope_dim = 4, .n_heads = 3, .n_k_heads = 1, .freq_base = 1e4f,
                  .mode = LMK_ROPE_NORMAL, .seq_len = 5}, .in_place = true, .offset = 1}, D3, 0,
     "edge: NORMAL tails, unaligned"},
    {{ROPE, .p = {.head_dim = 20, .rope_dim = 20, .n_heads = 3, .freq_base = 1e4f, .mode = LMK_ROPE_VISION,
                  .sections = {3, 2, 0, 4}, .seq_len = 6}, .pos = POS_RANDOM, .pos_dtype = LMK_I64}, D3, 0,
     "edge: VISION, four sections"},
};

static int popcount(unsigned x)
{
    int n = 0;
    for (; x; x &= x - 1)
        n++;
    return n;
}

static int rope_n_cases(void)
{
    int n = 0;
    for (size_t i = 0; i < sizeof k_rows / sizeof k_rows[0]; i++)
        n += popcount(k_rows[i].dtypes);
    return n;
}

/* ---- names ---- */

static const char *mode_name(lmk_rope_mode m)
{
    switch (m) {
    case LMK_ROPE_NORMAL: return "normal";
    case LMK_ROPE_NEOX: return "neox";
    case LMK_ROPE_MROPE: return "mrope";
    case LMK_ROPE_VISION: return "vision";
    case LMK_ROPE_IMROPE: return "imrope";
    default: return "mode?";
    }
}

/* Appends " <what>" to buf (of n bytes). */
static void add(char *buf, size_t n, const char *fmt, ...) TST_PRINTF(3, 4);
static void add(char *buf, size_t n, const char *fmt, ...)
{
    const size_t len = strlen(buf);
    if (len + 2 >= n)
        return;
    buf[len] = ' ';
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + len + 1, n - len - 1, fmt, ap);
    va_end(ap);
}

/* The words after the dtype: sections, pairing, layout, positions, freq_factors, scaling. */
static void name_extras(const rope_case *rc, char *x, size_t n)
{
    static const char *const pos_names[] = {"", "random", "large", "grid"};
    const lmk_rope_params *p = &rc->p;
    x[0] = '\0';
    if (multi_mode(p->mode)) {
        char s[4][12];
        for (int i = 0; i < 4; i++)
            snprintf(s[i], sizeof s[i], p->sections[i] == UINT32_MAX ? "max" : "%u", p->sections[i]);
        add(x, n, "s=%s,%s,%s,%s", s[0], s[1], s[2], s[3]);
    }
    if (p->pairing == LMK_ROPE_PAIR_HALF_HEAD)
        add(x, n, "half_head");
    if (rc->layout == QGATE)
        add(x, n, "q=q|gate");
    if (rc->layout == QKV)
        add(x, n, "qkv-in-place");
    else if (rc->in_place)
        add(x, n, "in-place");
    if (rc->pos != POS_TEXT)
        add(x, n, "pos=%s", pos_names[rc->pos]);
    if (rc->pos_dtype != LMK_I32)
        add(x, n, "pos=%s", lmk_dtype_name(rc->pos_dtype));
    if (rc->ff != FF_NONE)
        add(x, n, "%s", rc->ff == FF_LLAMA3 ? "llama3-ff" : "ff");
    if (p->ext_factor != 0.0f)
        add(x, n, "yarn fs=1/%g ext=%g ctx=%u", 1.0 / (double)p->freq_scale, (double)p->ext_factor, p->n_ctx_orig);
    else if (p->freq_scale != 0.0f && p->freq_scale != 1.0f)
        add(x, n, "linear fs=%g", (double)p->freq_scale);
    if (p->attn_factor != 0.0f && p->attn_factor != 1.0f)
        add(x, n, "af=%g", (double)p->attn_factor);
    if (rc->offset)
        add(x, n, "unaligned");
}

/* "rope neox hd=128 rd=128 nh=32/8 T=4106 bf16 llama3-ff // Llama-3.1-8B". */
static void set_case(tst_case *c, const rope_case *rc, unsigned flags, const char *model)
{
    memcpy(c->p.bytes, rc, sizeof *rc);
    c->flags = flags;
    c->T = rc->p.seq_len;
    c->dtype = rc->dtype;
    const lmk_rope_params *p = &rc->p;
    const char *entry = rc->entry == ENTRY_ROPE ? "rope" : p->n_k_heads ? "rope_multi_qk" : "rope_multi";
    char heads[32], extras[128];
    snprintf(heads, sizeof heads, p->n_k_heads ? "%u/%u" : "%u", p->n_heads, p->n_k_heads);
    name_extras(rc, extras, sizeof extras);
    tst_case_name(c, "%s %s hd=%u rd=%u nh=%s T=%u %s%s // %s", entry, mode_name(p->mode), p->head_dim, p->rope_dim,
                  heads, p->seq_len, lmk_dtype_name(rc->dtype), extras, model);
}

static void rope_get_case(int i, tst_case *c)
{
    for (size_t r = 0; r < sizeof k_rows / sizeof k_rows[0]; r++)
        for (int t = 0; t < LMK_DTYPE_COUNT; t++)
            if (k_rows[r].dtypes & D(t) && i-- == 0) {
                rope_case rc = k_rows[r].rc;
                rc.dtype = (lmk_dtype)t;
                if (rc.pos_dtype == (lmk_dtype)0) /* LMK_F32 is 0: an unset field means i32 */
                    rc.pos_dtype = LMK_I32;
                set_case(c, &rc, k_rows[r].flags, k_rows[r].model);
                return;
            }
}

/* ---- random cases ---- */

/* Dimensions: a real layer (heads cut to fit), the Qwen3.5-122B layer at a prompt length (big
 * enough for the CPU worker pool), or anything even. */
static void random_dims(tst_rng *r, rope_case *rc)
{
    static const lmk_rope_params layers[] = {{LLAMA31}, {QWEN3}, {QWEN35, .n_heads = 24, .n_k_heads = 4}, {GPTJ}, {VIT},
                                             {.head_dim = 64, .rope_dim = 64, .n_heads = 64, .n_k_heads = 8}};
    lmk_rope_params *p = &rc->p;
    const unsigned kind = tst_rng_below(r, 16);
    if (kind == 0) {
        p->head_dim = 256, p->rope_dim = 64, p->n_heads = 32, p->n_k_heads = 2;
        p->seq_len = 16 + tst_rng_below(r, 32);
        return;
    }
    if (kind < 6) {
        const lmk_rope_params *l = &layers[tst_rng_below(r, sizeof layers / sizeof layers[0])];
        p->head_dim = l->head_dim, p->rope_dim = l->rope_dim;
        p->n_heads = 1 + tst_rng_below(r, l->n_heads < 16 ? l->n_heads : 16);
        p->n_k_heads = tst_rng_below(r, 2) ? 1 + tst_rng_below(r, l->n_k_heads) : 0;
    } else {
        p->head_dim = 2 * (1 + tst_rng_below(r, 130));
        p->rope_dim = tst_rng_below(r, 3) == 0 ? p->head_dim : 2 * (1 + tst_rng_below(r, p->head_dim / 2));
        p->n_heads = 1 + tst_rng_below(r, 8);
        p->n_k_heads = tst_rng_below(r, 2) ? 1 + tst_rng_below(r, 4) : 0;
    }
    const uint32_t heads = p->n_heads > p->n_k_heads ? p->n_heads : p->n_k_heads;
    const uint32_t max_seq = 32768 / (heads * p->head_dim) ? 32768 / (heads * p->head_dim) : 1;
    p->seq_len = 1 + tst_rng_below(r, max_seq < 16 ? max_seq : 16);
}

/* Scaling of lmk_rope: none, linear, YaRN (ramp in [-0.25, 1]), attn_factor. Keeps every angle
 * within the precision contract's 2^20 radians. */
static void random_scaling(tst_rng *r, rope_case *rc)
{
    static const float scales[] = {0.25f, 0.5f, 1.0f / 32, 1.0f / 8};
    static const float exts[] = {1.0f, 0.5f, -0.25f}, attns[] = {0.0f, 1.0f, 0.5f, 2.0f, 1.25f};
    lmk_rope_params *p = &rc->p;
    switch (tst_rng_below(r, 4)) {
    case 1:
        p->freq_scale = scales[tst_rng_below(r, 2)];
        break;
    case 2:
        p->freq_scale = scales[tst_rng_below(r, 4)];
        p->ext_factor = exts[tst_rng_below(r, 3)];
        p->n_ctx_orig = tst_rng_below(r, 2) ? 4096 : 1 + tst_rng_below(r, 65536);
        p->beta_fast = tst_rng_below(r, 2) ? 0.0f : (float)(1 + tst_rng_below(r, 64));
        p->beta_slow = tst_rng_below(r, 2) ? 0.0f : (float)tst_rng_uniform(r, 0.25, 4.0);
        if (p->ext_factor < 0 && rc->pos == POS_LARGE) /* the ramp then extrapolates past theta */
            rc->pos = POS_RANDOM;
        break;
    default:
        break;
    }
    p->attn_factor = attns[tst_rng_below(r, 5)];
}

/* A random valid case: every mode, pairing, dtype, scaling, positions dtype, layout (dense, q from
 * q|gate, q and k in a packed QKV), in place or not, aligned or not. */
static void rope_random_case(tst_rng *r, tst_case *c)
{
    static const lmk_rope_mode modes[] = {LMK_ROPE_NORMAL, LMK_ROPE_NEOX, LMK_ROPE_MROPE, LMK_ROPE_VISION,
                                          LMK_ROPE_IMROPE};
    static const float bases[] = {1e4f, 1e6f, 1e7f, 5e6f, 5e5f, 1.5e5f, 2.0f, 10000.5f};
    rope_case rc = {.entry = tst_rng_below(r, 4) == 0 ? ENTRY_MULTI : ENTRY_ROPE, .pos_dtype = LMK_I32};
    lmk_rope_params *p = &rc.p;
    random_dims(r, &rc);
    p->mode = rc.entry == ENTRY_MULTI ? (tst_rng_below(r, 2) ? LMK_ROPE_IMROPE : LMK_ROPE_MROPE)
                                      : modes[tst_rng_below(r, 5)];
    if (p->mode == LMK_ROPE_VISION)
        p->rope_dim = p->head_dim;
    p->freq_base = bases[tst_rng_below(r, 8)];
    for (int i = 0; i < 4 && multi_mode(p->mode); i++)
        p->sections[i] = tst_rng_below(r, 16) == 15 ? UINT32_MAX - tst_rng_below(r, 2) : tst_rng_below(r, 33);
    p->pairing = p->mode == LMK_ROPE_NORMAL || tst_rng_below(r, 2) ? LMK_ROPE_PAIR_HALF_ROPE : LMK_ROPE_PAIR_HALF_HEAD;
    static const lmk_dtype dtypes[] = {LMK_F32, LMK_BF16, LMK_F16};
    rc.dtype = dtypes[tst_rng_below(r, 3)];
    rc.pos = (int)tst_rng_below(r, 4);
    rc.pos_dtype = tst_rng_below(r, 4) == 0 ? LMK_U32 : LMK_I32;
    if (rc.entry == ENTRY_ROPE) {
        random_scaling(r, &rc);
        rc.ff = tst_rng_below(r, 4) == 0 ? (p->rope_dim == 128 ? FF_LLAMA3 : FF_RANDOM) : FF_NONE;
        rc.layout = (int)tst_rng_below(r, 3);
        if (tst_rng_below(r, 4) == 0)
            rc.pos_dtype = LMK_I64;
    }
    rc.in_place = rc.layout == QKV || tst_rng_below(r, 2);
    rc.offset = tst_rng_below(r, 4) == 0;
    /* One case in eight a prompt of 265-2312 tokens, fewer where that passes 2^21 elements but
     * never under 265 (at most 265 x 8704 elements, the Qwen3.5-122B layer): past the decode
     * kernel (CUDA takes it while seq x row groups <= 2 x SMs, 264 on an H200), so random shapes,
     * modes, scalings and layouts also reach the prefill kernels (rows, pairs, bulk). Drawn after
     * every other draw, so the other seven cases of eight stay what they were. */
    if (tst_rng_below(r, 8) == 0) {
        const uint32_t rows = p->n_heads + p->n_k_heads, cap = (1u << 21) / (rows * p->head_dim);
        const uint32_t want = 265 + tst_rng_below(r, 2048);
        p->seq_len = want <= cap ? want : cap > 265 ? cap : 265;
    }
    set_case(c, &rc, 0, "random");
}

/* ---- the benchmark ---- */

static int rope_bench_cases(uint32_t T, lmk_dtype dtype, bool longest, tst_case *out, int max)
{
    const rope_case cases[] = {
        {MULTI, .p = {QWEN35, .n_heads = 24, .seq_len = T}, .dtype = dtype},
        {MULTI, .p = {QWEN35, .n_heads = 4, .seq_len = T}, .dtype = dtype},
        {MULTI, .p = {QWEN35, .n_heads = 24, .n_k_heads = 4, .seq_len = T}, .dtype = dtype},
        /* in place at the longest prompt, in the model's own dtype */
        {MULTI, .p = {QWEN35, .n_heads = 24, .n_k_heads = 4, .seq_len = T}, .dtype = dtype, .in_place = true},
        {ROPE, .p = {LLAMA31, .seq_len = T}, .dtype = dtype, .ff = FF_LLAMA3},
        /* the layouts an engine holds: q read out of the [q | gate] projection (k dense), and q
         * and k rotated in place inside the packed QKV */
        {ROPE, .p = {QWEN35, .n_heads = 24, .n_k_heads = 4, .seq_len = T}, .dtype = dtype, .layout = QGATE},
        {ROPE, .p = {LLAMA31, .seq_len = T}, .dtype = dtype, .ff = FF_LLAMA3, .layout = QKV, .in_place = true},
    };
    static const char *const models[] = {"Qwen3.5/3.6-27B Q", "Qwen3.5/3.6-27B K", "Qwen3.5/3.6-27B",
                                         "Qwen3.5/3.6-27B", "Llama-3.1-8B", "Qwen3.5/3.6-27B", "Llama-3.1-8B"};
    int n = 0;
    for (int i = 0; i < 7 && n < max; i++) {
        if (cases[i].in_place && cases[i].layout == DENSE && !(longest && dtype == LMK_BF16))
            continue;
        rope_case rc = cases[i];
        rc.pos_dtype = LMK_I32;
        set_case(&out[n++], &rc, 0, models[i]);
    }
    return n;
}

/* Out of place: every input read once, every output written once. In place only the rotated
 * elements are read and written: the rest of each row stays where it is. Plus the positions and
 * the freq_factors. */
static double rope_bytes(const tst_case *c)
{
    const rope_case *rc = P(c);
    const lmk_rope_params *p = &rc->p;
    const double es = (double)lmk_dtype_size(rc->dtype), heads = (double)p->n_heads + p->n_k_heads;
    const double per_row = rc->in_place || rc->layout == QKV ? p->rope_dim : p->head_dim;
    return 2.0 * p->seq_len * heads * per_row * es + (double)n_positions(rc) * (double)lmk_dtype_size(rc->pos_dtype) +
           (rc->ff ? 4.0 * (p->rope_dim / 2) : 0.0);
}

/* ---- on a device ---- */

static size_t lead(const rope_case *rc)
{
    return TST_GUARD + lmk_dtype_size(rc->dtype) * rc->offset;
}

/* A dense [T, heads, D] tensor in a region of its own: an input (with a host copy), an output, or
 * both (in place). */
static lmk_status dense_tensor(tst_inst *in, uint32_t heads, bool input, bool output, lmk_buffer **out)
{
    const rope_case *rc = P(&in->c);
    const size_t n[3] = {rc->p.seq_len, heads, rc->p.head_dim};
    int region;
    lmk_status st = tst_mem_region(&in->mem, lead(rc) + tst_span(n, NULL, lmk_dtype_size(rc->dtype)) + TST_GUARD,
                                   input, &region);
    return st == LMK_OK ? tst_mem_view(&in->mem, region, lead(rc), rc->dtype, n, NULL, output, out) : st;
}

/* One tensor (q or k) in and out, dense: its own input region, and its own output unless in place. */
static lmk_status dense_pair(tst_inst *in, uint32_t heads, int i_in, int i_out)
{
    const rope_case *rc = P(&in->c);
    lmk_status st = dense_tensor(in, heads, true, rc->in_place, &in->arg[i_in]);
    if (st == LMK_OK && rc->in_place)
        in->arg[i_out] = in->arg[i_in];
    else if (st == LMK_OK)
        st = dense_tensor(in, heads, false, true, &in->arg[i_out]);
    return st;
}

/* A packed projection of T rows of `row` elements; views of `heads` heads starting at element `at`
 * of a row, heads `head` elements apart. */
static lmk_status packed_region(tst_inst *in, size_t row, int *region)
{
    const rope_case *rc = P(&in->c);
    return tst_mem_region(&in->mem, lead(rc) + rc->p.seq_len * row * lmk_dtype_size(rc->dtype) + TST_GUARD, true,
                          region);
}

static lmk_status packed_view(tst_inst *in, int region, size_t row, size_t at, size_t head, uint32_t heads,
                              bool output, lmk_buffer **out)
{
    const rope_case *rc = P(&in->c);
    const size_t n[3] = {rc->p.seq_len, heads, rc->p.head_dim}, stride[3] = {row, head, 1};
    return tst_mem_view(&in->mem, region, lead(rc) + at * lmk_dtype_size(rc->dtype), rc->dtype, n, stride, output, out);
}

/* A dense 1-D input of `count` elements (positions, freq_factors). */
static lmk_status flat_input(tst_inst *in, lmk_dtype t, size_t count, lmk_buffer **out)
{
    const size_t n[3] = {1, 1, count};
    int region;
    lmk_status st = tst_mem_region(&in->mem, 2 * TST_GUARD + count * lmk_dtype_size(t), true, &region);
    return st == LMK_OK ? tst_mem_view(&in->mem, region, TST_GUARD, t, n, NULL, false, out) : st;
}

static lmk_status rope_setup(tst_inst *in)
{
    const rope_case *rc = P(&in->c);
    const lmk_rope_params *p = &rc->p;
    const size_t d = p->head_dim, hq = p->n_heads, hk = p->n_k_heads;
    lmk_status st = LMK_OK;
    int region = 0;
    if (rc->layout == QKV) { /* [T, (Hq + 2 Hk) D]: q then k then v, rotated in place */
        const size_t row = (hq + 2 * hk) * d;
        st = packed_region(in, row, &region);
        if (st == LMK_OK)
            st = packed_view(in, region, row, 0, d, p->n_heads, true, &in->arg[QI]);
        in->arg[QO] = in->arg[QI];
        if (st == LMK_OK && hk)
            st = packed_view(in, region, row, hq * d, d, p->n_k_heads, true, &in->arg[KI]);
        in->arg[KO] = in->arg[KI];
    } else if (rc->layout == QGATE) { /* q of [T, Hq, 2D]: q_h then gate_h for each head */
        st = packed_region(in, hq * 2 * d, &region);
        if (st == LMK_OK)
            st = packed_view(in, region, hq * 2 * d, 0, 2 * d, p->n_heads, rc->in_place, &in->arg[QI]);
        if (st == LMK_OK && rc->in_place)
            in->arg[QO] = in->arg[QI];
        else if (st == LMK_OK)
            st = dense_tensor(in, p->n_heads, false, true, &in->arg[QO]);
        if (st == LMK_OK && hk)
            st = dense_pair(in, p->n_k_heads, KI, KO);
    } else {
        st = dense_pair(in, p->n_heads, QI, QO);
        if (st == LMK_OK && hk)
            st = dense_pair(in, p->n_k_heads, KI, KO);
    }
    if (st == LMK_OK)
        st = flat_input(in, rc->pos_dtype, n_positions(rc), &in->arg[POS]);
    if (st == LMK_OK && rc->ff) /* one entry more than needed: "at least n_pairs" */
        st = flat_input(in, LMK_F32, p->rope_dim / 2 + (rc->ff == FF_RANDOM), &in->arg[FF]);
    return st;
}

/* The llama3 rope_scaling of Hugging Face (factor 8, low_freq_factor 1, high_freq_factor 4,
 * original_max_position_embeddings 8192) as lmk.h's freq_factors: base^(-2p/n) / inv_freq_HF[p]. */
static void llama3_factors(float *ff, const lmk_rope_params *p)
{
    const double factor = 8.0, low = 1.0, high = 4.0, orig = 8192.0, two_pi = 6.283185307179586;
    for (uint32_t i = 0; i < p->rope_dim / 2; i++) {
        const double inv = pow((double)p->freq_base, -2.0 * i / p->rope_dim), wavelen = two_pi / inv;
        double hf = inv;
        if (wavelen > orig / low) {
            hf = inv / factor;
        } else if (wavelen >= orig / high) {
            const double smooth = (orig / wavelen - low) / (high - low);
            hf = (1.0 - smooth) * inv / factor + smooth * inv;
        }
        ff[i] = (float)(inv / hf);
    }
}

/* Positions, axis-major: text (every axis the token's index after a random start), random (each
 * axis its own, as for image patches), large (anywhere in [-2^20, 2^20], both ends included), or
 * a patch grid (rows and columns of a square image, for the ViT). */
static void fill_positions(tst_inst *in, tst_rng *r)
{
    const rope_case *rc = P(&in->c);
    const size_t count = n_positions(rc), T = rc->p.seq_len;
    unsigned char *host = tst_mem_host(&in->mem, in->arg[POS]);
    const int64_t start = 1 + (int64_t)tst_rng_below(r, 100000);
    size_t w = 1;
    while (w * w < T)
        w++;
    for (size_t i = 0; i < count; i++) {
        const size_t axis = i / T, tok = i % T;
        int64_t v = start + (int64_t)tok;
        if (rc->pos == POS_RANDOM)
            v = tst_rng_below(r, 65536);
        else if (rc->pos == POS_LARGE)
            v = (int64_t)tst_rng_below(r, (2u << 20) + 1) - (1 << 20);
        else if (rc->pos == POS_GRID)
            v = (int64_t)(axis % 2 ? tok % w : tok / w);
        if (rc->pos == POS_LARGE && i < 2)
            v = i == 0 ? 1 << 20 : -(1 << 20);
        if (rc->pos_dtype == LMK_I64) {
            memcpy(host + 8 * i, &v, 8);
        } else {
            const int32_t v32 = (int32_t)v;
            memcpy(host + 4 * i, &v32, 4);
        }
    }
}

static void rope_fill(tst_inst *in, tst_rng *r)
{
    const rope_case *rc = P(&in->c);
    tst_inst_fill(in, in->arg[QI], r);
    if (in->arg[KI])
        tst_inst_fill(in, in->arg[KI], r);
    fill_positions(in, r);
    float *ff = in->arg[FF] ? tst_mem_host(&in->mem, in->arg[FF]) : NULL;
    if (ff && rc->ff == FF_LLAMA3)
        llama3_factors(ff, &rc->p);
    for (uint32_t i = 0; ff && rc->ff == FF_RANDOM && i <= rc->p.rope_dim / 2; i++)
        ff[i] = (float)tst_rng_uniform(r, 1.0, 8.0); /* >= 1: angles stay within 2^20 */
}

static lmk_rope_multi_params multi_params(const lmk_rope_params *p)
{
    lmk_rope_multi_params m = {.head_dim = p->head_dim, .rope_dim = p->rope_dim, .n_heads = p->n_heads,
                               .seq_len = p->seq_len, .freq_base = p->freq_base, .mode = p->mode,
                               .pairing = p->pairing};
    memcpy(m.sections, p->sections, sizeof m.sections);
    return m;
}

static lmk_status call(const tst_inst *in, lmk_stream *s, const lmk_rope_params *p)
{
    const rope_case *rc = P(&in->c);
    lmk_buffer *const *a = in->arg;
    if (rc->entry == ENTRY_ROPE)
        return lmk_rope(s, a[QI], p->n_k_heads ? a[KI] : NULL, a[POS], a[FF], a[QO], p->n_k_heads ? a[KO] : NULL, p);
    const lmk_rope_multi_params m = multi_params(p);
    if (p->n_k_heads)
        return lmk_rope_multi_qk(s, a[QI], a[QO], a[KI], a[KO], a[POS], &m, p->n_k_heads);
    return lmk_rope_multi(s, a[QI], a[QO], a[POS], &m);
}

static lmk_status rope_run(const tst_inst *in, lmk_stream *s)
{
    return call(in, s, &P(&in->c)->p);
}

static bool rope_verify(const tst_inst *in, tst_result *res)
{
    const rope_case *rc = P(&in->c);
    const tst_mem *m = &in->mem;
    const bool has_k = rc->p.n_k_heads > 0;
    lmk_tensor3 t[4] = {tst_view_host3(m, in->arg[QI]), tst_view_host3(m, in->arg[QO]), {0}, {0}};
    if (has_k)
        t[2] = tst_view_host3(m, in->arg[KI]), t[3] = tst_view_host3(m, in->arg[KO]);
    const lmk_rope_args a = lmk_rope_args_for(&rc->p, rc->dtype, t, has_k, tst_mem_host(m, in->arg[POS]),
                                              rc->pos_dtype, in->arg[FF] ? tst_mem_host(m, in->arg[FF]) : NULL);
    /* The outputs read back: one download per region (q and k share one in a packed QKV). */
    const tst_view *out[2] = {tst_mem_find(m, in->arg[QO]), has_k ? tst_mem_find(m, in->arg[KO]) : NULL};
    unsigned char *reg[2] = {NULL, NULL};
    const void *got[2] = {NULL, NULL};
    bool ok = true;
    for (int i = 0; i < 1 + has_k && ok; i++) {
        reg[i] = i == 1 && out[1]->region == out[0]->region ? NULL : tst_mem_download(m, out[i]->region);
        const unsigned char *base = reg[i] ? reg[i] : reg[0];
        ok = base != NULL;
        if (ok)
            got[i] = base + out[i]->off;
    }
    if (ok)
        ok = tst_rope_verify(&a, got, true, res);
    else
        snprintf(res->msg, sizeof res->msg, "read back: %s", lmk_last_error());
    free(reg[0]);
    free(reg[1]);
    return ok;
}

/* 0: freq_base -1; 1: an odd head_dim; 2: an unknown mode. */
static lmk_status rope_invalid(const tst_inst *in, lmk_stream *s, int k, const char **want)
{
    lmk_rope_params p = P(&in->c)->p;
    static const char *const wants[] = {"freq_base", "must be even", "unknown mode"};
    *want = wants[k];
    if (k == 0)
        p.freq_base = -1.0f;
    else if (k == 1)
        p.head_dim++;
    else
        p.mode = (lmk_rope_mode)99;
    return call(in, s, &p);
}

const tst_op tst_op_rope = {
    .name = "rope",
    .n_cases = rope_n_cases,
    .get_case = rope_get_case,
    .random_case = rope_random_case,
    .bench_cases = rope_bench_cases,
    .bytes = rope_bytes,
    .setup = rope_setup,
    .fill = rope_fill,
    .run = rope_run,
    .verify = rope_verify,
    .n_invalid = 3,
    .invalid = rope_invalid,
    .launches = 1,
};
