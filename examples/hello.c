/*
 * examples/hello.c - the smallest complete lmk program: open the CPU device, rotate a tiny
 * [3 tokens, 2 heads, 4] f32 query tensor in place with lmk_rope (NEOX, as Llama and Qwen), print
 * the result, free everything. tests/test_install.sh builds it against an installed lmk
 * (pkg-config, static, find_package) and checks what it prints against cos/sin computed on its own.
 *
 *   cc hello.c -o hello $(pkg-config --cflags --libs lmk) -Wl,-rpath,$(pkg-config --variable=libdir lmk)
 */
#include <lmk.h>
#include <stdio.h>

enum { T = 3, HEADS = 2, HEAD_DIM = 4 };

int main(void)
{
    static const int32_t pos[T] = {0, 1, 5}; /* the tokens' positions: NEOX takes one per token */
    float q[T * HEADS * HEAD_DIM];
    for (int i = 0; i < T * HEADS * HEAD_DIM; i++) q[i] = 0.25f * (float)(i + 1); /* 0.25, 0.5, ... */

    printf("lmk %s (%s)\n", lmk_version(), lmk_build_info());

    lmk_device *dev = NULL;
    lmk_stream *s = NULL;
    lmk_buffer *qb = NULL, *pb = NULL;
    const size_t qshape[3] = {T, HEADS, HEAD_DIM}, pshape[1] = {T};
    lmk_status st = lmk_device_open(LMK_BACKEND_CPU, 0, &dev);
    if (st == LMK_OK) {
        printf("device: %s\n", lmk_device_name(dev));
        st = lmk_stream_create(dev, &s);
    }
    if (st == LMK_OK) st = lmk_buffer_alloc(dev, sizeof q, LMK_F32, qshape, 3, &qb);
    if (st == LMK_OK) st = lmk_buffer_alloc(dev, sizeof pos, LMK_I32, pshape, 1, &pb);
    if (st == LMK_OK) st = lmk_buffer_write(qb, 0, q, sizeof q);
    if (st == LMK_OK) st = lmk_buffer_write(pb, 0, pos, sizeof pos);

    /* rope_dim == head_dim == 4: pairs (q[0], q[2]) at angle pos and (q[1], q[3]) at pos / 100.
     * Fields left zero take lmk.h's defaults (no scaling, Hugging Face's pairing). */
    const lmk_rope_params rp = {
        .head_dim = HEAD_DIM, .rope_dim = HEAD_DIM, .n_heads = HEADS, .seq_len = T,
        .freq_base = 10000.0f, .mode = LMK_ROPE_NEOX,
    };
    /* q only (k_in, k_out NULL), no freq_factors, in place (q_out is q_in). */
    if (st == LMK_OK) st = lmk_rope(s, qb, NULL, pb, NULL, qb, NULL, &rp);
    if (st == LMK_OK) st = lmk_stream_sync(s); /* ops only enqueue: wait before reading */
    if (st == LMK_OK) st = lmk_buffer_read(qb, 0, q, sizeof q);

    if (st == LMK_OK) {
        printf("rope (neox, freq_base 10000) of q[i] = 0.25*(i+1), shape [%d, %d, %d]:\n", T, HEADS, HEAD_DIM);
        for (int t = 0; t < T; t++)
            for (int h = 0; h < HEADS; h++) {
                const float *r = &q[(t * HEADS + h) * HEAD_DIM];
                printf("token %d pos %d head %d: %.6f %.6f %.6f %.6f\n", t, (int)pos[t], h, (double)r[0],
                       (double)r[1], (double)r[2], (double)r[3]);
            }
    } else {
        fprintf(stderr, "hello: %s: %s\n", lmk_status_name(st), lmk_last_error());
    }
    lmk_buffer_free(pb); /* all NULL-safe */
    lmk_buffer_free(qb);
    lmk_stream_destroy(s);
    lmk_device_close(dev);
    return st == LMK_OK ? 0 : 1;
}
