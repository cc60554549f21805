/*
 * examples/hello.c - the smallest complete lmk program: open the CPU device, rotate a tiny
 * [3 tokens, 2 heads, 4] f32 tensor in place with lmk_rope_multi, print the result, free everything.
 * tests/test_install.sh builds it against an installed lmk (pkg-config, static, find_package) and
 * checks what it prints against cos/sin computed on its own.
 *
 *   cc hello.c -o hello $(pkg-config --cflags --libs lmk) -Wl,-rpath,$(pkg-config --variable=libdir lmk)
 */
#include <lmk.h>
#include <stdio.h>

enum { T = 3, HEADS = 2, HEAD_DIM = 4 };

int main(void)
{
    /* Text tokens at positions 0, 1 and 5: all four position axes (t, h, w, e) hold the position. */
    static const int32_t tok_pos[T] = {0, 1, 5};
    int32_t pos[4 * T];
    float x[T * HEADS * HEAD_DIM];
    for (int a = 0; a < 4; a++)
        for (int t = 0; t < T; t++) pos[a * T + t] = tok_pos[t];
    for (int i = 0; i < T * HEADS * HEAD_DIM; i++) x[i] = 0.25f * (float)(i + 1); /* 0.25, 0.5, ... */

    printf("lmk %s (%s)\n", lmk_version(), lmk_build_info());

    lmk_device *dev = NULL;
    lmk_stream *s = NULL;
    lmk_buffer *xb = NULL, *pb = NULL;
    const size_t xshape[3] = {T, HEADS, HEAD_DIM}, pshape[1] = {4 * T};
    lmk_status st = lmk_device_open(LMK_BACKEND_CPU, 0, &dev);
    if (st == LMK_OK) {
        printf("device: %s\n", lmk_device_name(dev));
        st = lmk_stream_create(dev, &s);
    }
    if (st == LMK_OK) st = lmk_buffer_alloc(dev, sizeof x, LMK_F32, xshape, 3, &xb);
    if (st == LMK_OK) st = lmk_buffer_alloc(dev, sizeof pos, LMK_I32, pshape, 1, &pb);
    if (st == LMK_OK) st = lmk_buffer_write(xb, 0, x, sizeof x);
    if (st == LMK_OK) st = lmk_buffer_write(pb, 0, pos, sizeof pos);

    /* rope_dim == head_dim == 4: pairs (x[0], x[2]) and (x[1], x[3]), angles pos and pos / 100. */
    const lmk_rope_multi_params rp = {
        .head_dim = HEAD_DIM, .rope_dim = HEAD_DIM, .n_heads = HEADS, .seq_len = T,
        .freq_base = 10000.0f, .mode = LMK_ROPE_IMROPE, .sections = {1, 1, 0, 0},
        .pairing = LMK_ROPE_PAIR_HALF_ROPE,
    };
    if (st == LMK_OK) st = lmk_rope_multi(s, xb, xb, pb, &rp); /* in place */
    if (st == LMK_OK) st = lmk_stream_sync(s);
    if (st == LMK_OK) st = lmk_buffer_read(xb, 0, x, sizeof x);

    if (st == LMK_OK) {
        printf("rope_multi (imrope, freq_base 10000) of x[i] = 0.25*(i+1), shape [%d, %d, %d]:\n", T, HEADS,
               HEAD_DIM);
        for (int t = 0; t < T; t++)
            for (int h = 0; h < HEADS; h++) {
                const float *r = &x[(t * HEADS + h) * HEAD_DIM];
                printf("token %d pos %d head %d: %.6f %.6f %.6f %.6f\n", t, (int)tok_pos[t], h, (double)r[0],
                       (double)r[1], (double)r[2], (double)r[3]);
            }
    } else {
        fprintf(stderr, "hello: %s: %s\n", lmk_status_name(st), lmk_last_error());
    }
    lmk_buffer_free(pb); /* all NULL-safe */
    lmk_buffer_free(xb);
    lmk_stream_destroy(s);
    lmk_device_close(dev);
    return st == LMK_OK ? 0 : 1;
}
