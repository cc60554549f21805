/*
 * fuzz_rope_diff.c - differential fuzzer: the fast CPU path of rope_multi against the float64
 * reference, on valid calls only.
 *
 * The input picks a valid shape (random, or a production layer: Qwen3.5, Qwen3-VL, Qwen2-VL, the
 * seed's vectors), mode, sections (including huge ones), pairing, dtype, freq_base, positions (up
 * to 2^20 in magnitude, mixed axes) and a seed for values with |x| <= 2. Every result must be
 * within lmk.h's tolerance of the reference, copied elements bit-exact, and the fast path must give the same bits
 * however it runs: out of place or in place, alone or fused with k in lmk_rope_multi_qk, on streams
 * of 1, 2 or 3 worker threads. The input also picks the instruction set: three CPU devices are
 * opened with LMK_CPU_ISA capped at scalar, avx2 and the best the machine has. (fuzz_cases runs
 * every op's random cases, every rope mode included, the same way; this one keeps the rope_multi
 * entry points' own bit-identity checks.)
 */
#include "fuzz_common.h"

#define DIFF_CAP ((size_t)1 << 15) /* elements per tensor, but for the prompt-sized case */

static lmk_device *g_devs[3];      /* LMK_CPU_ISA = scalar, avx2, (unset) */
static lmk_stream *g_all[3][3];    /* per device: 1, 2 and 3 worker threads */
static lmk_device *g_dev;          /* the device of the current input */
static lmk_stream **g_streams;

static void init(void)
{
    if (g_devs[0])
        return;
    fz_install_allocator();
    fz_open_cpu_levels(g_devs, g_all);
}

static lmk_buffer *make(lmk_dtype t, size_t n)
{
    lmk_buffer *b = NULL;
    const size_t shape[1] = {n};
    FZ_CHECK(lmk_buffer_alloc(g_dev, n * lmk_dtype_size(t), t, shape, 1, &b) == LMK_OK, "lmk_buffer_alloc(%zu)", n);
    return b;
}

static void pick(fz_in *in, lmk_rope_multi_params *p, uint32_t *n_k_heads)
{
    static const struct {
        uint32_t head_dim, rope_dim, n_heads, n_k_heads;
        float base;
        lmk_rope_mode mode;
        uint32_t s[4];
    } layers[] = {
        {256, 64, 8, 2, 1e7f, LMK_ROPE_IMROPE, {11, 11, 10, 0}},  /* Qwen3.5 0.8B/2B full attention */
        {256, 64, 32, 2, 1e7f, LMK_ROPE_IMROPE, {11, 11, 10, 0}}, /* Qwen3.5 122B/397B */
        {128, 128, 8, 2, 5e6f, LMK_ROPE_IMROPE, {24, 20, 20, 0}}, /* Qwen3-VL text */
        {128, 128, 4, 2, 1e6f, LMK_ROPE_MROPE, {16, 24, 24, 0}},  /* Qwen2-VL */
        {16, 8, 1, 1, 2.0f, LMK_ROPE_IMROPE, {2, 2, 1, 0}},       /* seed test vector 1 */
        {32, 16, 4, 4, 1e4f, LMK_ROPE_IMROPE, {3, 3, 2, 0}},      /* seed test vector 3 */
    };
    if (fz_pick(in, 3) == 0) {
        const unsigned i = fz_pick(in, sizeof layers / sizeof layers[0]);
        p->head_dim = layers[i].head_dim;
        p->rope_dim = layers[i].rope_dim;
        p->n_heads = layers[i].n_heads;
        *n_k_heads = layers[i].n_k_heads;
        p->freq_base = layers[i].base;
        p->mode = layers[i].mode;
        memcpy(p->sections, layers[i].s, sizeof p->sections);
    } else {
        p->head_dim = 2 * (1 + fz_pick(in, 160));
        p->rope_dim = fz_pick(in, 3) == 0 ? p->head_dim : 2 * (1 + fz_pick(in, p->head_dim / 2));
        p->n_heads = 1 + fz_pick(in, 16);
        *n_k_heads = 1 + fz_pick(in, 8);
        static const float bases[] = {1e4f, 1e6f, 1e7f, 5e6f, 10000.5f, 2.0f, 1.0f, 500000.0f};
        p->freq_base = fz_pick(in, 4) ? bases[fz_pick(in, 8)] : 1.0f + (float)fz_u16(in);
        p->mode = fz_pick(in, 2) ? LMK_ROPE_IMROPE : LMK_ROPE_MROPE;
        for (int i = 0; i < 4; i++)
            p->sections[i] = fz_pick(in, 16) == 15 ? UINT32_MAX - fz_pick(in, 2) : fz_pick(in, 33);
    }
    p->pairing = fz_pick(in, 2) ? LMK_ROPE_PAIR_HALF_ROPE : LMK_ROPE_PAIR_HALF_HEAD;
    if (fz_pick(in, 32) == 31) {
        /* A prompt of the Qwen3.5-122B layer: outputs of 8 MiB and more, so the CPU path splits the
         * work over its pool and (for aligned f32 shapes) writes with streaming stores. */
        p->head_dim = 256, p->rope_dim = 64, p->n_heads = 32, *n_k_heads = 2;
        p->freq_base = 1e7f, p->mode = LMK_ROPE_IMROPE;
        p->sections[0] = 11, p->sections[1] = 11, p->sections[2] = 10, p->sections[3] = 0;
        p->seq_len = 128 + fz_pick(in, 32);
        return;
    }
    const size_t rows = DIFF_CAP / p->head_dim;
    const uint32_t max_seq = (uint32_t)(rows / p->n_heads) ? (uint32_t)(rows / p->n_heads) : 1;
    p->seq_len = 1 + fz_u8(in) % (max_seq < 64 ? max_seq : 64);
    if ((size_t)p->seq_len * p->n_heads * p->head_dim > DIFF_CAP)
        p->n_heads = 1;
    if ((size_t)p->seq_len * *n_k_heads * p->head_dim > DIFF_CAP)
        *n_k_heads = 1;
}

static void fill(lmk_buffer *b, tst_rng *rng)
{
    tst_fill_random(rng, lmk_buffer_dtype(b), lmk_buffer_data(b), lmk_buffer_element_count(b));
}

static void copy(lmk_buffer *dst, const lmk_buffer *src)
{
    memcpy(lmk_buffer_data(dst), lmk_buffer_data(src), lmk_buffer_byte_len(src));
}

static bool same(const lmk_buffer *a, const lmk_buffer *b)
{
    return memcmp(lmk_buffer_data(a), lmk_buffer_data(b), lmk_buffer_byte_len(a)) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    init();
    fz_in in = {data, size};
    const long live_before = atomic_load(&fz_n_live);
    tst_rng rng = tst_rng_make(fz_u32(&in));
    const unsigned dev_index = 2 - fz_pick(&in, 3); /* 0 (the default): the best ISA */
    g_dev = g_devs[dev_index];
    g_streams = g_all[dev_index];
    lmk_rope_multi_params p = {0};
    uint32_t n_k = 1;
    pick(&in, &p, &n_k);
    static const lmk_dtype dtypes[] = {LMK_F32, LMK_BF16, LMK_F16};
    const lmk_dtype t = dtypes[fz_pick(&in, 3)];
    const size_t nq = (size_t)p.seq_len * p.n_heads * p.head_dim, nk = (size_t)p.seq_len * n_k * p.head_dim;

    lmk_buffer *q = make(t, nq), *k = make(t, nk), *q_out = make(t, nq), *k_out = make(t, nk);
    lmk_buffer *q2 = make(t, nq), *k2 = make(t, nk), *pos = make(fz_pick(&in, 4) ? LMK_I32 : LMK_U32, 4 * p.seq_len);
    fill(q, &rng);
    fill(k, &rng);
    int32_t *pd = lmk_buffer_data(pos);
    const unsigned pos_cls = fz_pick(&in, 4);
    const int32_t start = (int32_t)(fz_u32(&in) % (1u << 20));
    for (uint32_t axis = 0; axis < 4; axis++)
        for (uint32_t i = 0; i < p.seq_len; i++) {
            const uint64_t r = tst_rng_u64(&rng);
            int32_t v = start + (int32_t)i; /* text: every axis the token position */
            if (pos_cls == 1)
                v = (int32_t)(r % (2u << 20)) - (1 << 20);
            else if (pos_cls == 2 && axis > 0)
                v = (int32_t)(r % 64); /* image patch grid */
            else if (pos_cls == 3)
                v = (r & 1) ? (1 << 20) : -(1 << 20);
            if (v > (1 << 20))
                v = 1 << 20;
            pd[(size_t)axis * p.seq_len + i] = v;
        }

    /* The reference and the comparison of the test kit. */
    const lmk_rope_args a = tst_rope_host_args(&p, n_k, 2, t, lmk_buffer_data(q), lmk_buffer_data(k), pd);
    tst_result res;

    /* 1: q alone, out of place, on the stream picked by the input. */
    lmk_stream *s = g_streams[fz_pick(&in, 3)];
    const long allocs_before = atomic_load(&fz_n_allocs);
    FZ_CHECK(lmk_rope_multi(s, q, q_out, pos, &p) == LMK_OK, "rope_multi failed");
    FZ_CHECK(lmk_stream_sync(s) == LMK_OK, "sync");
    FZ_CHECK(atomic_load(&fz_n_allocs) == allocs_before, "rope_multi allocated");
    lmk_rope_args aq = a; /* q alone */
    aq.n_tensors = 1;
    const void *got_q[2] = {lmk_buffer_data(q_out), NULL};
    FZ_CHECK(tst_rope_verify(&aq, got_q, true, &res),
             "%s: rope_multi(head_dim %u, rope_dim %u, n_heads %u, seq %u, base %g, mode %d, sections [%u,%u,%u,%u], "
             "pairing %d, %s): %s",
             lmk_device_name(g_dev), p.head_dim, p.rope_dim, p.n_heads, p.seq_len, (double)p.freq_base, (int)p.mode,
             p.sections[0], p.sections[1], p.sections[2], p.sections[3], (int)p.pairing, lmk_dtype_name(t), res.msg);

    /* 2: the same call in place on each stream: the same bits. */
    for (int i = 0; i < 3; i++) {
        copy(q2, q);
        FZ_CHECK(lmk_rope_multi(g_streams[i], q2, q2, pos, &p) == LMK_OK, "rope_multi in place failed");
        FZ_CHECK(lmk_stream_sync(g_streams[i]) == LMK_OK, "sync");
        FZ_CHECK(same(q2, q_out), "rope_multi in place with %d threads differs from out of place", i + 1);
    }

    /* 3: fused q+k, out of place then in place: q the same bits, k within tolerance. */
    lmk_buffer *q3 = make(t, nq);
    FZ_CHECK(lmk_rope_multi_qk(s, q, q3, k, k_out, pos, &p, n_k) == LMK_OK, "rope_multi_qk failed");
    FZ_CHECK(lmk_stream_sync(s) == LMK_OK, "sync");
    FZ_CHECK(same(q3, q_out), "rope_multi_qk's q differs from rope_multi's");
    const void *got_qk[2] = {lmk_buffer_data(q3), lmk_buffer_data(k_out)};
    FZ_CHECK(tst_rope_verify(&a, got_qk, true, &res), "rope_multi_qk: %s", res.msg);
    copy(q2, q);
    copy(k2, k);
    lmk_stream *s2 = g_streams[fz_pick(&in, 3)];
    FZ_CHECK(lmk_rope_multi_qk(s2, q2, q2, k2, k2, pos, &p, n_k) == LMK_OK, "rope_multi_qk in place failed");
    FZ_CHECK(lmk_stream_sync(s2) == LMK_OK, "sync");
    FZ_CHECK(same(q2, q_out) && same(k2, k_out), "rope_multi_qk in place differs from out of place");

    fz_stat("inputs");
    static const char *const isa_stat[3] = {"on the scalar path", "on avx2 (or less)", "on the best ISA"};
    fz_stat(isa_stat[dev_index]);
    if ((nq + nk) * lmk_dtype_size(t) >= ((size_t)256 << 10))
        fz_stat("inputs big enough for the worker pool");
    lmk_buffer *all[] = {q, k, q_out, k_out, q2, k2, pos, q3};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        lmk_buffer_free(all[i]);
    FZ_CHECK(atomic_load(&fz_n_live) == live_before, "leak");
    return 0;
}
