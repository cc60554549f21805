/*
 * rope_multi_ref.c - the naive reference of rope_multi: the executable spec.
 *
 * Float64 throughout, one pair at a time, straight from SPEC.md section 2, with no table, no
 * vectors and no threads. lmk_ref_rope_multi_f64 returns the exact float64 results, which the
 * precision contract is stated against; lmk_ref_rope_multi stores them in the tensor's dtype.
 */
#include "core/internal.h"
#include "ops/rope_common.h"

#include <math.h>
#include <string.h>

static void store(lmk_dtype t, void *base, size_t i, double v)
{
    const float f = (float)v;
    if (t == LMK_F32) {
        memcpy((char *)base + 4 * i, &f, 4);
        return;
    }
    const uint16_t h = t == LMK_BF16 ? lmk_f32_to_bf16(f) : lmk_f32_to_f16(f);
    memcpy((char *)base + 2 * i, &h, 2);
}

/* Rotates row `row` of tensor `ti`: writes the f64 result to out64 (if not NULL) and the stored
 * result to the tensor's output (if store_out). Copied elements are copied bit for bit. */
static void rotate_row(const lmk_rope_args *a, int ti, size_t token, size_t row, double *out64, int store_out)
{
    const lmk_rope_tensor *t = &a->t[ti];
    const size_t d = a->head_dim, es = lmk_dtype_size(a->dtype), base = row * d;
    const uint32_t stride = lmk_rope_pair_stride(a->pairing, a->head_dim, a->rope_dim);
    double vals[2];

    if (out64)
        for (size_t j = 0; j < d; j++)
            out64[base + j] = lmk_float_load(a->dtype, t->in, base + j);
    if (store_out && t->out != t->in)
        memcpy((char *)t->out + base * es, (const char *)t->in + base * es, d * es);

    for (uint32_t p = 0; p < a->rope_dim / 2; p++) {
        const int axis = lmk_rope_axis(a->mode, a->sections, p);
        const double pos = (double)a->positions[(size_t)axis * a->seq_len + token];
        const double theta = pos * pow((double)a->freq_base, -2.0 * (double)p / (double)a->rope_dim);
        const double c = cos(theta), s = sin(theta);
        const size_t ia = base + p, ib = base + p + stride;
        const double x = lmk_float_load(a->dtype, t->in, ia), y = lmk_float_load(a->dtype, t->in, ib);
        vals[0] = x * c - y * s;
        vals[1] = x * s + y * c;
        if (out64) {
            out64[ia] = vals[0];
            out64[ib] = vals[1];
        }
        if (store_out) {
            store(a->dtype, t->out, ia, vals[0]);
            store(a->dtype, t->out, ib, vals[1]);
        }
    }
}

static void run(const lmk_rope_args *a, double *const out64[2], int store_out)
{
    for (int ti = 0; ti < a->n_tensors; ti++)
        for (size_t token = 0; token < a->seq_len; token++)
            for (size_t h = 0; h < a->t[ti].n_heads; h++)
                rotate_row(a, ti, token, token * a->t[ti].n_heads + h, out64 ? out64[ti] : NULL, store_out);
}

void lmk_ref_rope_multi(const lmk_rope_args *a)
{
    run(a, NULL, 1);
}

void lmk_ref_rope_multi_f64(const lmk_rope_args *a, double *const out64[2])
{
    run(a, out64, 0);
}
