/*
 * fuzz_repeat_heads.c - libFuzzer harness for lmk_repeat_heads: both layouts, dense and strided
 * operands.
 *
 * One input is one call. Parameters: small valid ones, or wild ones (0, huge, h not a multiple of
 * hg, unknown layouts). Operands: dense buffers made every way (fuzz_common.h: allocations, wraps,
 * views of a shared parent, wrong counts, another device, NULL), views with random head and token
 * strides (0 too: one source head read for many), k read out of a packed QKV projection and
 * written beside it in the same rows (side by side), a destination overlapping its source, or its
 * own elements (a self-overlapping layout), src and dst the same handle, any dtype, mismatched
 * dtypes.
 *
 * An oracle written from lmk.h decides: valid, invalid, or (for disjoint layouts that are not side
 * by side in one row, which lmk.h lets lmk reject) either. Then:
 *   valid:   LMK_OK, dst's elements are the reference's bit for bit (lmk_ref_repeat over the
 *            snapshot, through both operands' strides), and no other byte anywhere changed (the
 *            gaps of a strided dst included);
 *   invalid: LMK_ERR_INVALID_ARGUMENT, a message naming "repeat_heads", and no byte changed;
 *   always:  no heap allocation inside the call, no leak after freeing the call's buffers.
 */
#include "fuzz_common.h"
#include "ops/repeat/repeat.h"

enum { SRC, DST };
enum { INVALID, VALID, EITHER };

typedef struct heads_call {
    lmk_repeat_heads_params p;
    const lmk_repeat_heads_params *pp;
    lmk_stream *s;
    lmk_buffer *b[2];
    bool packed;   /* src and dst side by side in the rows of one packed buffer */
    bool loose[2]; /* random strides: disjoint but maybe not provably so */
} heads_call;

static size_t elems3(const lmk_repeat_heads_params *p, uint32_t heads)
{
    size_t n;
    if (__builtin_mul_overflow((size_t)p->seq * heads, p->k, &n) || n > FZ_BUF_CAP)
        return 7;
    return n;
}

/* A [seq, heads, k] view of the arena with strides {ts, hs, 1} at byte `off` (random when
 * SIZE_MAX); NULL when it does not fit. */
static lmk_buffer *arena_view(fz_env *e, fz_call *c, fz_in *in, lmk_dtype t, const lmk_repeat_heads_params *p,
                              uint32_t heads, size_t ts, size_t hs, size_t off)
{
    const size_t es = lmk_dtype_size(t), n[3] = {p->seq, heads, p->k}, st[3] = {ts, hs, 1};
    if (!es || !n[0] || !n[1] || !n[2] || n[0] > 4096 || n[1] > 4096 || n[2] > 4096)
        return NULL;
    const size_t span = tst_span(n, st, es);
    if (span == 0 || span > FZ_ARENA_BYTES || (off != SIZE_MAX && off + span > FZ_ARENA_BYTES))
        return NULL;
    if (off == SIZE_MAX)
        off = fz_u16(in) % (FZ_ARENA_BYTES - span + 1);
    off -= off % es;
    lmk_buffer *b = NULL;
    if (lmk_buffer_view_strided(e->parent, off, t, n, st, 3, &b) != LMK_OK)
        return NULL;
    fz_call_keep(c, b);
    fz_world_add(&c->world, e->arena, FZ_ARENA_BYTES);
    return b;
}

static void make_operands(fz_env *e, fz_call *c, fz_in *in, heads_call *hc, lmk_dtype ts, lmk_dtype td)
{
    const lmk_repeat_heads_params *p = &hc->p;
    const size_t k = p->k;
    switch (fz_pick(in, 8)) {
    case 5: /* [seq, (hq + hg + h) k]: src is k of a QKV projection, dst written beside it */
        if (ts == td) {
            const size_t hq = fz_pick(in, 4), row = (hq + p->hg + p->h) * k, es = lmk_dtype_size(ts);
            hc->b[SRC] = arena_view(e, c, in, ts, p, p->hg, row, k, SIZE_MAX);
            if (hc->b[SRC]) {
                const size_t base = (size_t)((unsigned char *)lmk_buffer_data(hc->b[SRC]) - e->arena);
                hc->b[DST] = arena_view(e, c, in, td, p, p->h, row, k, base + (size_t)p->hg * k * es);
                hc->packed = hc->b[DST] != NULL;
            }
        }
        break;
    case 6: { /* random strides: 0 (one source head for many), padded, or overlapping */
        const size_t hs = fz_pick(in, 4) ? k + fz_pick(in, 5) : fz_pick(in, 2 * (unsigned)(k < 100 ? k : 100) + 1);
        hc->b[SRC] = arena_view(e, c, in, ts, p, p->hg, fz_pick(in, 4) ? p->hg * hs + fz_pick(in, 9) : fz_pick(in, 200),
                                hs, SIZE_MAX);
        hc->loose[SRC] = true;
        break;
    }
    case 7: { /* a strided destination: padded heads and tokens, or (rarely) overlapping itself */
        const size_t hs = fz_pick(in, 8) ? k + fz_pick(in, 4) : fz_pick(in, (unsigned)(k < 200 ? k : 200) + 1);
        hc->b[DST] = arena_view(e, c, in, td, p, p->h, p->h * hs + fz_pick(in, 5), hs, SIZE_MAX);
        hc->loose[DST] = true;
        break;
    }
    default:
        break;
    }
    if (!hc->b[SRC])
        hc->b[SRC] = fz_make_buffer(e, c, in, ts, elems3(p, p->hg));
    if (!hc->b[DST])
        hc->b[DST] = fz_pick(in, 16) == 15 && hc->b[SRC] ? hc->b[SRC] : fz_make_buffer(e, c, in, td, elems3(p, p->h));
}

/* lmk.h's rules, in order; the overlap rule on element bytes. */
static int verdict(const heads_call *hc, lmk_tensor3 t[2], fz_world *w, fz_marks *mk)
{
    const lmk_repeat_heads_params *p = hc->pp;
    if (!hc->s || !hc->b[SRC] || !hc->b[DST] || !p)
        return INVALID;
    if (!p->seq || !p->hg || !p->h || !p->k || p->h % p->hg)
        return INVALID;
    if (p->layout != LMK_REPEAT_TILED && p->layout != LMK_REPEAT_BLOCK)
        return INVALID;
    if (!fz_operand3(hc->b[SRC], p->seq, p->hg, p->k, &t[SRC]) || !fz_operand3(hc->b[DST], p->seq, p->h, p->k, &t[DST]))
        return INVALID;
    if (lmk_buffer_dtype(hc->b[SRC]) != lmk_buffer_dtype(hc->b[DST]))
        return INVALID;
    const lmk_device *d = lmk_stream_device(hc->s);
    if (lmk_buffer_device(hc->b[SRC]) != d || lmk_buffer_device(hc->b[DST]) != d)
        return INVALID;
    fz_mark(w, mk, &t[SRC], SRC);
    fz_mark(w, mk, &t[DST], DST);
    if (mk->self_overlap[DST] || fz_marks_share(w, mk, SRC, DST))
        return INVALID;
    if (hc->loose[DST] || (fz_spans_meet(&t[SRC], &t[DST]) && !hc->packed))
        return EITHER;
    return VALID;
}

static void pick_params(fz_in *in, bool sane, lmk_repeat_heads_params *p)
{
    if (sane) {
        p->seq = 1 + fz_pick(in, 12);
        p->hg = 1 + fz_pick(in, 8);
        p->h = p->hg * (1 + fz_pick(in, 4));
        p->k = 1 + fz_pick(in, 48);
    } else {
        p->seq = fz_dim(in);
        p->hg = fz_dim(in);
        p->h = fz_pick(in, 4) ? p->hg * (1 + fz_pick(in, 4)) : fz_dim(in);
        p->k = fz_dim(in);
    }
    const unsigned l = fz_pick(in, sane ? 2 : 3);
    p->layout = l < 2 ? (lmk_repeat_layout)l : (lmk_repeat_layout)(int32_t)fz_u32(in);
}

/* dst against the reference over the snapshot, element by element through both operands' strides. */
static void check_result(fz_call *c, const heads_call *hc, const lmk_tensor3 t[2], const fz_marks *mk)
{
    const lmk_repeat_heads_params *p = &hc->p;
    const size_t es = t[SRC].es, len = tst_span(t[DST].n, t[DST].stride, es);
    unsigned char *want = malloc(len + 1);
    FZ_CHECK(want != NULL, "harness: out of memory");
    memcpy(want, t[DST].data, len);
    const lmk_repeat_args a = {
        .src = fz_world_before(&c->world, t[SRC].data), .dst = want, .seq = p->seq, .hg = p->hg, .h = p->h,
        .k = p->k, .elem_size = es, .src_tok = t[SRC].stride[0], .src_head = t[SRC].stride[1],
        .dst_tok = t[DST].stride[0], .dst_head = t[DST].stride[1], .layout = p->layout,
    };
    lmk_ref_repeat(&a);
    const long long d = tst_bits_diff(t[DST].data, want, len);
    FZ_CHECK(d < 0, "repeat_heads(seq %u, hg %u, h %u, k %u, layout %d, %s, src strides %zu/%zu, dst %zu/%zu): dst "
                    "byte %lld differs from the reference",
             p->seq, p->hg, p->h, p->k, (int)p->layout, lmk_dtype_name(lmk_buffer_dtype(hc->b[SRC])),
             t[SRC].stride[0], t[SRC].stride[1], t[DST].stride[0], t[DST].stride[1], d);
    free(want);
    FZ_CHECK(fz_changed_outside(&c->world, mk, 1u << DST) == NULL, "repeat_heads wrote outside dst's elements");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in in = {data, size};
    fz_env *e = fz_env_get();
    const long live_before = atomic_load(&fz_n_live);
    fz_call c = {.rng = tst_rng_make(fz_u32(&in))};
    c.sane = fz_pick(&in, 2) == 0;
    heads_call hc = {0};
    pick_params(&in, c.sane, &hc.p);
    const lmk_dtype ts = (lmk_dtype)fz_pick(&in, LMK_DTYPE_COUNT);
    const lmk_dtype td = !c.sane && fz_pick(&in, 8) == 7 ? (lmk_dtype)fz_pick(&in, LMK_DTYPE_COUNT) : ts;
    make_operands(e, &c, &in, &hc, ts, td);
    hc.s = !c.sane && fz_pick(&in, 64) == 63 ? NULL : e->stream;
    hc.pp = !c.sane && fz_pick(&in, 64) == 63 ? NULL : &hc.p;

    fz_fill_regions(&c);
    fz_world_snapshot(&c.world);
    fz_marks mk;
    fz_marks_init(&mk, &c.world);
    lmk_tensor3 t[2] = {{0}};
    const int v = verdict(&hc, t, &c.world, &mk);

    lmk_clear_error();
    const long allocs_before = atomic_load(&fz_n_allocs);
    const lmk_status st = lmk_repeat_heads(hc.s, hc.b[SRC], hc.b[DST], hc.pp);
    if (st == LMK_OK)
        FZ_CHECK(lmk_stream_sync(hc.s) == LMK_OK, "lmk_stream_sync after a valid repeat_heads");
    FZ_CHECK(atomic_load(&fz_n_allocs) == allocs_before, "repeat_heads allocated %ld times",
             atomic_load(&fz_n_allocs) - allocs_before);
    fz_stat("inputs");
    if (hc.packed)
        fz_stat("calls with src and dst side by side in one buffer");
    if (v == VALID || (v == EITHER && st == LMK_OK)) {
        FZ_CHECK(st == LMK_OK, "valid repeat_heads(seq %u, hg %u, h %u, k %u, layout %d, %s) returned %s", hc.p.seq,
                 hc.p.hg, hc.p.h, hc.p.k, (int)hc.p.layout, lmk_dtype_name(ts), lmk_status_name(st));
        check_result(&c, &hc, t, &mk);
        fz_stat(v == VALID ? "valid calls, bit-exact" : "calls on layouts lmk may reject, accepted and bit-exact");
    } else {
        fz_stat(v == EITHER ? "calls on layouts lmk may reject, rejected" : "invalid calls");
        FZ_CHECK(st == LMK_ERR_INVALID_ARGUMENT,
                 "invalid repeat_heads(seq %u, hg %u, h %u, k %u, layout %d, %s->%s) returned %s", hc.p.seq, hc.p.hg,
                 hc.p.h, hc.p.k, (int)hc.p.layout, lmk_dtype_name(ts), lmk_dtype_name(td), lmk_status_name(st));
        FZ_CHECK(fz_message_names("repeat_heads"), "message \"%s\" does not name repeat_heads", lmk_last_error());
        FZ_CHECK(fz_world_changed(&c.world, NULL, NULL, 0) == NULL, "a rejected repeat_heads changed a byte");
    }
    fz_marks_free(&mk);
    fz_call_end(&c, live_before);
    return 0;
}
