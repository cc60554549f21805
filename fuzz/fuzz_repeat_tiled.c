/*
 * fuzz_repeat_tiled.c - libFuzzer harness for lmk_repeat_tiled.
 *
 * One input is one call: parameters (0, small, odd, huge and overflowing dimensions, h not a
 * multiple of hg), operands made every way a caller can (alloc, wrap, views at offsets of one
 * parent so that src and dst can overlap, views inside an allocation, a buffer of another device,
 * NULL), element counts and byte lengths that are right, one off, or wrong, and dtypes that match
 * or not. An oracle written from lmk.h decides whether the call is valid. Then:
 *   valid:   LMK_OK, dst equals the reference bit for bit, and no other byte anywhere changed
 *            (the bytes of dst past seq*h*k elements are sentinels);
 *   invalid: LMK_ERR_INVALID_ARGUMENT, a message naming "repeat_tiled", and no byte changed;
 *   always:  no heap allocation inside the call, no leak after freeing the call's buffers.
 */
#include "fuzz_common.h"
#include "ops/repeat/repeat.h"

/* lmk.h's contract for lmk_repeat_tiled: whether the call is valid. */
static bool repeat_valid(const lmk_stream *s, const lmk_buffer *src, const lmk_buffer *dst,
                         const lmk_repeat_tiled_params *p, size_t *src_bytes, size_t *dst_bytes)
{
    if (!s || !src || !dst || !p)
        return false;
    if (!p->seq || !p->hg || !p->h || !p->k || p->h % p->hg)
        return false;
    const size_t es = lmk_dtype_size(lmk_buffer_dtype(src));
    if (__builtin_mul_overflow((size_t)p->seq * p->hg, p->k, src_bytes) ||
        __builtin_mul_overflow(*src_bytes, es, src_bytes))
        return false;
    if (__builtin_mul_overflow((size_t)p->seq * p->h, p->k, dst_bytes) ||
        __builtin_mul_overflow(*dst_bytes, es, dst_bytes))
        return false;
    if (lmk_buffer_dtype(src) != lmk_buffer_dtype(dst))
        return false;
    if (lmk_buffer_byte_len(src) < *src_bytes || lmk_buffer_byte_len(dst) < *dst_bytes)
        return false;
    if (lmk_buffer_device(src) != lmk_stream_device(s) || lmk_buffer_device(dst) != lmk_stream_device(s))
        return false;
    return !fz_overlap(src, *src_bytes, dst, *dst_bytes);
}

/* seq*heads*k, or a small count when that exceeds what a call may allocate. */
static size_t want_elems(const lmk_repeat_tiled_params *p, uint32_t heads)
{
    size_t n;
    if (__builtin_mul_overflow((size_t)p->seq * heads, p->k, &n) || n > FZ_BUF_CAP)
        return 7;
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in in = {data, size};
    fz_env *e = fz_env_get();
    const long live_before = atomic_load(&fz_n_live);
    fz_call c = {.rng = tst_rng_make(fz_u32(&in))};
    c.sane = fz_pick(&in, 2) == 0;

    lmk_repeat_tiled_params p;
    if (c.sane) {
        p.seq = 1 + fz_pick(&in, 16);
        p.hg = 1 + fz_pick(&in, 16);
        p.h = p.hg * (1 + fz_pick(&in, 4));
        p.k = 1 + fz_pick(&in, 64);
    } else {
        p.seq = fz_dim(&in);
        p.hg = fz_dim(&in);
        p.h = fz_pick(&in, 4) ? p.hg * (1 + fz_pick(&in, 4)) : fz_dim(&in); /* mostly a multiple (may wrap) */
        p.k = fz_dim(&in);
    }
    const lmk_dtype ts = (lmk_dtype)fz_pick(&in, LMK_DTYPE_COUNT);
    const lmk_dtype td = !c.sane && fz_pick(&in, 8) == 7 ? (lmk_dtype)fz_pick(&in, LMK_DTYPE_COUNT) : ts;

    lmk_buffer *src = fz_make_buffer(e, &c, &in, ts, want_elems(&p, p.hg));
    lmk_buffer *dst = fz_make_buffer(e, &c, &in, td, want_elems(&p, p.h));
    if (fz_pick(&in, 16) == 15 && src) /* src and dst the same buffer */
        dst = src;
    lmk_stream *s = !c.sane && fz_pick(&in, 64) == 63 ? NULL : e->stream;
    const lmk_repeat_tiled_params *pp = !c.sane && fz_pick(&in, 64) == 63 ? NULL : &p;

    fz_fill_regions(&c);
    fz_world_snapshot(&c.world);
    size_t src_bytes = 0, dst_bytes = 0;
    const bool valid = repeat_valid(s, src, dst, pp, &src_bytes, &dst_bytes);

    lmk_clear_error();
    const long allocs_before = atomic_load(&fz_n_allocs);
    const lmk_status st = lmk_repeat_tiled(s, src, dst, pp);
    if (st == LMK_OK && s)
        FZ_CHECK(lmk_stream_sync(s) == LMK_OK, "lmk_stream_sync after a valid repeat_tiled");
    FZ_CHECK(atomic_load(&fz_n_allocs) == allocs_before, "repeat_tiled allocated %ld times",
             atomic_load(&fz_n_allocs) - allocs_before);

    fz_stat("inputs");
    fz_stat(valid ? "valid calls" : "invalid calls");
    if (valid) {
        FZ_CHECK(st == LMK_OK, "valid repeat_tiled(seq %u, hg %u, h %u, k %u, %s) returned %s", p.seq, p.hg, p.h, p.k,
                 lmk_dtype_name(ts), lmk_status_name(st));
        /* The expected dst: the reference over the snapshot of src, into a copy of dst's bytes. */
        unsigned char *want = malloc(dst_bytes ? dst_bytes : 1);
        FZ_CHECK(want != NULL, "harness: out of memory");
        const lmk_repeat_args a = {.src = fz_world_before(&c.world, lmk_buffer_data(src)),
                                   .dst = want,
                                   .seq = p.seq, .hg = p.hg, .h = p.h, .k = p.k,
                                   .elem_size = lmk_dtype_size(ts),
                                   .src_tok = (size_t)p.hg * p.k, .src_head = p.k,
                                   .dst_tok = (size_t)p.h * p.k, .dst_head = p.k, .layout = LMK_REPEAT_TILED};
        lmk_ref_repeat(&a);
        const unsigned char *got = lmk_buffer_data(dst);
        for (size_t i = 0; i < dst_bytes; i++)
            FZ_CHECK(got[i] == want[i], "repeat_tiled(seq %u, hg %u, h %u, k %u, %s): dst byte %zu is %u, want %u",
                     p.seq, p.hg, p.h, p.k, lmk_dtype_name(ts), i, got[i], want[i]);
        free(want);
        const void *skip[] = {lmk_buffer_data(dst)};
        const size_t skip_len[] = {dst_bytes};
        const void *bad = fz_world_changed(&c.world, skip, skip_len, 1);
        FZ_CHECK(bad == NULL, "repeat_tiled wrote outside dst's %zu bytes (at dst%+td)", dst_bytes,
                 (const unsigned char *)bad - (const unsigned char *)lmk_buffer_data(dst));
    } else {
        FZ_CHECK(st == LMK_ERR_INVALID_ARGUMENT, "invalid repeat_tiled(seq %u, hg %u, h %u, k %u, %s->%s) returned %s",
                 p.seq, p.hg, p.h, p.k, lmk_dtype_name(ts), lmk_dtype_name(td), lmk_status_name(st));
        FZ_CHECK(fz_message_names("repeat_tiled"), "message \"%s\" does not name repeat_tiled", lmk_last_error());
        FZ_CHECK(fz_world_changed(&c.world, NULL, NULL, 0) == NULL, "a rejected repeat_tiled changed a byte");
    }
    fz_call_end(&c, live_before);
    return 0;
}
