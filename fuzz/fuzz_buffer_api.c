/*
 * fuzz_buffer_api.c - libFuzzer harness for the buffer API (and the small functions around it).
 *
 * One input is a sequence of up to 64 calls on a table of live buffers: alloc, wrap, view (of
 * views too), write, read, free, the getters, plus device and stream open/close, status and dtype
 * names, and the bf16/f16 conversions. Sizes, offsets, shapes, ndim and dtypes are random,
 * including 0, past the end, overflowing and absurd (2^64-1 bytes; the allocator hook refuses
 * anything over 64 MiB, so those must come back as LMK_ERR_OUT_OF_MEMORY).
 *
 * A model tracks every buffer (root memory, offset, length, dtype, shape) and a shadow copy of
 * every root's bytes. An oracle written from lmk.h decides each call's outcome. Checked:
 *   - a valid call succeeds (or, for alloc, reports OUT_OF_MEMORY) and its results match the model:
 *     lengths, element counts, dtype, ndim, dims, device, data address, zero fill, read bytes;
 *   - an invalid call returns INVALID_ARGUMENT with a message naming the function, leaves *out
 *     untouched and changes no byte;
 *   - after every call every root's bytes equal the shadow (a write touches exactly its range);
 *   - after the sequence, everything freed, no host allocation of the library is outstanding.
 */
#include "fuzz_common.h"

#define MAX_LIVE 16

typedef struct hbuf {
    lmk_buffer *b;
    int parent;          /* index in the table, -1 for a root */
    int children;        /* live views of this buffer */
    int root;            /* index in roots[] */
    size_t root_off;     /* offset of the first byte in the root */
    size_t byte_len;
    lmk_dtype dtype;
    lmk_device *dev;
} hbuf;

typedef struct root {
    unsigned char *mem; /* the memory */
    unsigned char *shadow;
    size_t len;
    int owner;          /* table index of the buffer that owns it, -1 for the arena */
    bool live;
} root;

typedef struct state {
    fz_env *e;
    hbuf bufs[MAX_LIVE];
    int n_bufs;
    root roots[MAX_LIVE + 1];
    int n_roots;
} state;

static lmk_buffer *const SENTINEL = (lmk_buffer *)(uintptr_t)0x5e5e5e5e0ull;

const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    /* A library that bypasses the hook with malloc(2^64-1) must get NULL back, not an ASan report. */
    return "allocator_may_return_null=1";
}

static void check_shadows(const state *st, const char *after)
{
    for (int i = 0; i < st->n_roots; i++)
        if (st->roots[i].live)
            FZ_CHECK(memcmp(st->roots[i].mem, st->roots[i].shadow, st->roots[i].len) == 0,
                     "memory of root %d changed unexpectedly after %s", i, after);
}

static size_t pick_len(fz_in *in)
{
    static const size_t huge[] = {FZ_ALLOC_CAP + 1, (size_t)1 << 40, SIZE_MAX,     SIZE_MAX - 63,
                                  SIZE_MAX / 2 + 1, SIZE_MAX - 4095, (size_t)1 << 62};
    /* Byte value 0 (also what an exhausted input reads) picks the common, valid choice. */
    switch (fz_pick(in, 8)) {
    case 0:
    case 1:
    case 2:
        return fz_pick(in, 256);
    case 3:
    case 4:
        return fz_u16(in) % FZ_BUF_CAP;
    case 5:
        return 0;
    case 6:
        return huge[fz_pick(in, sizeof huge / sizeof huge[0])];
    default:
        return fz_u64(in);
    }
}

static lmk_dtype pick_dtype(fz_in *in)
{
    switch (fz_pick(in, 16)) {
    case 13:
        return (lmk_dtype)LMK_DTYPE_COUNT;
    case 14:
        return (lmk_dtype)-1;
    case 15:
        return (lmk_dtype)(int32_t)fz_u32(in);
    default:
        return (lmk_dtype)fz_pick(in, LMK_DTYPE_COUNT);
    }
}

/* A shape and ndim: mostly one that fits `room` bytes of dtype t, sometimes not, or broken. */
static int pick_shape(fz_in *in, lmk_dtype t, size_t room, size_t shape[LMK_MAX_DIMS], bool *null_shape)
{
    *null_shape = false;
    const unsigned how = fz_pick(in, 10);
    if (how == 7)
        return 0;
    if (how == 8) {
        *null_shape = true;
        return fz_pick(in, 3); /* NULL shape with ndim 0 (valid) or > 0 (invalid) */
    }
    if (how == 9)
        return fz_pick(in, 2) ? -1 - (int)fz_pick(in, 4) : LMK_MAX_DIMS + 1 + (int)fz_pick(in, 4);
    const int nd = 1 + (int)(fz_pick(in, 4) == 3 ? fz_pick(in, LMK_MAX_DIMS) : fz_pick(in, 3));
    const size_t es = lmk_dtype_size(t) ? lmk_dtype_size(t) : 1;
    size_t budget = room / es;
    for (int i = 0; i < nd; i++) {
        switch (fz_pick(in, 20)) {
        case 16:
            shape[i] = 0;
            break;
        case 17:
            shape[i] = SIZE_MAX / (1 + fz_pick(in, 4));
            break;
        case 18:
            shape[i] = fz_u32(in);
            break;
        case 19:
            shape[i] = budget + 1 + fz_pick(in, 3);
            break;
        default:
            shape[i] = budget ? 1 + fz_u16(in) % budget : fz_pick(in, 2);
            break;
        }
        if (shape[i] && shape[i] <= budget)
            budget /= shape[i];
    }
    return nd;
}

/* The shape rules of every constructor (lmk.h "Buffers"): 0 when they hold; else the element
 * count is returned through *count. Returns whether the shape is acceptable for `room` bytes. */
static bool shape_ok(lmk_dtype t, const size_t *shape, int ndim, bool null_shape, size_t room, size_t *count)
{
    const size_t es = lmk_dtype_size(t);
    if (!es || ndim < 0 || ndim > LMK_MAX_DIMS || (ndim > 0 && null_shape))
        return false;
    if (ndim == 0) {
        *count = room / es;
        return true;
    }
    /* An axis of 0: no element and no byte, whatever the other axes hold (lmk.h "Buffers"). */
    bool empty = false;
    for (int i = 0; i < ndim; i++)
        empty = empty || shape[i] == 0;
    size_t n = 1, bytes;
    for (int i = 0; i < ndim && !empty; i++)
        if (__builtin_mul_overflow(n, shape[i], &n))
            return false;
    if (empty)
        n = 0;
    if (__builtin_mul_overflow(n, es, &bytes) || bytes > room)
        return false;
    *count = n;
    return true;
}

/* Checks a new buffer against what the model says it is. */
static void check_new(const lmk_buffer *b, lmk_device *dev, const void *data, size_t byte_len, lmk_dtype t,
                      const size_t *shape, int ndim, size_t count)
{
    FZ_CHECK(lmk_buffer_byte_len(b) == byte_len, "byte_len %zu, want %zu", lmk_buffer_byte_len(b), byte_len);
    FZ_CHECK(lmk_buffer_element_count(b) == count, "element_count %zu, want %zu", lmk_buffer_element_count(b), count);
    FZ_CHECK(lmk_buffer_dtype(b) == t, "dtype %d, want %d", (int)lmk_buffer_dtype(b), (int)t);
    FZ_CHECK(lmk_buffer_device(b) == dev, "device differs");
    FZ_CHECK(lmk_buffer_ndim(b) == (ndim ? ndim : 1), "ndim %d, want %d", lmk_buffer_ndim(b), ndim ? ndim : 1);
    for (int i = 0; i < ndim; i++)
        FZ_CHECK(lmk_buffer_dim(b, i) == shape[i], "dim %d is %zu, want %zu", i, lmk_buffer_dim(b, i), shape[i]);
    if (ndim == 0)
        FZ_CHECK(lmk_buffer_dim(b, 0) == count, "dim 0 of a shapeless buffer is %zu, want %zu", lmk_buffer_dim(b, 0),
                 count);
    FZ_CHECK(lmk_buffer_dim(b, -1) == 0 && lmk_buffer_dim(b, LMK_MAX_DIMS) == 0 && lmk_buffer_dim(b, INT32_MIN) == 0,
             "lmk_buffer_dim outside [0, ndim) is not 0");
    if (data)
        FZ_CHECK(lmk_buffer_data(b) == data, "data %p, want %p", lmk_buffer_data(b), data);
}

static int add_root(state *st, unsigned char *mem, size_t len, int owner, bool zero)
{
    int r = -1;
    for (int i = 0; i < st->n_roots; i++)
        if (!st->roots[i].live)
            r = i;
    if (r < 0)
        r = st->n_roots++;
    root *R = &st->roots[r];
    R->mem = mem;
    R->len = len;
    R->owner = owner;
    R->live = true;
    R->shadow = malloc(len ? len : 1);
    FZ_CHECK(R->shadow != NULL, "harness: out of memory");
    if (zero)
        memset(R->shadow, 0, len);
    else
        memcpy(R->shadow, mem, len);
    return r;
}

static void expect_invalid(lmk_status s, lmk_buffer *out, const char *fn)
{
    fz_stat("invalid constructor calls");
    FZ_CHECK(s == LMK_ERR_INVALID_ARGUMENT, "%s: invalid call returned %s", fn, lmk_status_name(s));
    FZ_CHECK(fz_message_names(fn), "%s: message \"%s\" does not name it", fn, lmk_last_error());
    FZ_CHECK(out == SENTINEL, "%s: a failed call wrote *out", fn);
}

static void do_alloc(state *st, fz_in *in)
{
    lmk_device *dev = fz_pick(in, 32) == 31 ? NULL : fz_pick(in, 8) == 7 ? st->e->other : st->e->dev;
    const size_t byte_len = pick_len(in);
    const lmk_dtype t = pick_dtype(in);
    size_t shape[LMK_MAX_DIMS];
    bool null_shape;
    const int ndim = pick_shape(in, t, byte_len, shape, &null_shape);
    const bool null_out = fz_pick(in, 32) == 31;
    size_t count = 0;
    const bool valid = dev && !null_out && shape_ok(t, shape, ndim, null_shape, byte_len, &count);

    lmk_buffer *b = SENTINEL;
    lmk_clear_error();
    const lmk_status s = lmk_buffer_alloc(dev, byte_len, t, null_shape ? NULL : shape, ndim, null_out ? NULL : &b);
    if (!valid) {
        expect_invalid(s, b, "lmk_buffer_alloc");
        return;
    }
    if (byte_len > FZ_ALLOC_CAP) {
        fz_stat("out-of-memory allocs");
        FZ_CHECK(s == LMK_ERR_OUT_OF_MEMORY, "lmk_buffer_alloc(%zu bytes) returned %s, want OUT_OF_MEMORY", byte_len,
                 lmk_status_name(s));
        FZ_CHECK(lmk_last_error()[0] != '\0', "out of memory without a message");
        FZ_CHECK(b == SENTINEL, "a failed lmk_buffer_alloc wrote *out");
        return;
    }
    FZ_CHECK(s == LMK_OK, "lmk_buffer_alloc(%zu bytes, %s, ndim %d) returned %s", byte_len, lmk_dtype_name(t), ndim,
             lmk_status_name(s));
    fz_stat("buffers allocated");
    check_new(b, dev, NULL, byte_len, t, shape, ndim, count);
    const unsigned char *d = lmk_buffer_data(b);
    FZ_CHECK(byte_len == 0 || d != NULL, "no memory for %zu bytes", byte_len);
    FZ_CHECK((uintptr_t)d % lmk_dtype_size(t) == 0, "lmk_buffer_alloc: data %p not aligned to %s", (const void *)d,
             lmk_dtype_name(t));
    for (size_t i = 0; i < byte_len; i++)
        FZ_CHECK(d[i] == 0, "lmk_buffer_alloc: byte %zu is not zero", i);
    if (st->n_bufs == MAX_LIVE) {
        lmk_buffer_free(b);
        return;
    }
    const int idx = st->n_bufs++;
    st->bufs[idx] = (hbuf){.b = b, .parent = -1, .root_off = 0, .byte_len = byte_len, .dtype = t, .dev = dev};
    st->bufs[idx].root = add_root(st, lmk_buffer_data(b), byte_len, idx, true);
}

static void do_wrap(state *st, fz_in *in)
{
    lmk_device *dev = fz_pick(in, 32) == 31 ? NULL : st->e->dev;
    const lmk_dtype t = pick_dtype(in);
    size_t off = fz_u16(in) % FZ_ARENA_BYTES;
    if (fz_pick(in, 4))
        off -= off % (lmk_dtype_size(t) ? lmk_dtype_size(t) : 1);
    size_t byte_len = fz_u16(in) % (FZ_ARENA_BYTES - off + 1);
    unsigned char *ptr = st->e->arena + off;
    const unsigned mode = fz_pick(in, 16);
    if (mode == 0)
        ptr = NULL; /* invalid unless byte_len is 0 */
    else if (mode == 1)
        byte_len = 0;
    size_t shape[LMK_MAX_DIMS];
    bool null_shape;
    const int ndim = pick_shape(in, t, byte_len, shape, &null_shape);
    size_t count = 0;
    const bool ok_shape = shape_ok(t, shape, ndim, null_shape, byte_len, &count);
    const bool valid = dev && ok_shape && (ptr || byte_len == 0);
    /* lmk.h does not say that ptr must be aligned to the dtype size; the library requires it. */
    const bool either = valid && lmk_dtype_size(t) && (uintptr_t)ptr % lmk_dtype_size(t) != 0;

    lmk_buffer *b = SENTINEL;
    lmk_clear_error();
    const lmk_status s = lmk_buffer_wrap(dev, ptr, byte_len, t, null_shape ? NULL : shape, ndim, &b);
    if (!valid || (either && s != LMK_OK)) {
        expect_invalid(s, b, "lmk_buffer_wrap");
        return;
    }
    FZ_CHECK(s == LMK_OK, "lmk_buffer_wrap(arena+%zu, %zu bytes, %s, ndim %d) returned %s", off, byte_len,
             lmk_dtype_name(t), ndim, lmk_status_name(s));
    fz_stat("buffers wrapped");
    check_new(b, dev, ptr, byte_len, t, shape, ndim, count);
    if (st->n_bufs == MAX_LIVE || !ptr) {
        lmk_buffer_free(b);
        return;
    }
    const int idx = st->n_bufs++;
    st->bufs[idx] = (hbuf){.b = b, .parent = -1, .root = 0, .root_off = off, .byte_len = byte_len, .dtype = t,
                           .dev = dev};
}

static void do_view(state *st, fz_in *in)
{
    const int pi = st->n_bufs ? (int)fz_pick(in, (unsigned)st->n_bufs) : -1;
    hbuf *P = pi >= 0 && fz_pick(in, 32) != 31 ? &st->bufs[pi] : NULL;
    const lmk_dtype t = pick_dtype(in);
    const size_t plen = P ? P->byte_len : 0;
    size_t off;
    switch (fz_pick(in, 8)) {
    case 5:
        off = plen + 1 + fz_pick(in, 8);
        break;
    case 6:
        off = SIZE_MAX - fz_pick(in, 8);
        break;
    case 7:
        off = plen;
        break;
    default:
        off = plen ? fz_u16(in) % (plen + 1) : 0;
        if (fz_pick(in, 4))
            off -= off % (lmk_dtype_size(t) ? lmk_dtype_size(t) : 1);
        break;
    }
    const size_t room = P && off <= plen ? plen - off : 0;
    size_t shape[LMK_MAX_DIMS];
    bool null_shape;
    const int ndim = pick_shape(in, t, room, shape, &null_shape);
    size_t count = 0;
    const bool valid = P && off <= plen && shape_ok(t, shape, ndim, null_shape, room, &count);
    const uintptr_t addr = P ? (uintptr_t)lmk_buffer_data(P->b) + off : 0;
    const bool either = valid && (addr % lmk_dtype_size(t)) != 0; /* undocumented alignment rule */

    lmk_buffer *b = SENTINEL;
    lmk_clear_error();
    const lmk_status s = lmk_buffer_view(P ? P->b : NULL, off, t, null_shape ? NULL : shape, ndim, &b);
    if (!valid || (either && s != LMK_OK)) {
        expect_invalid(s, b, "lmk_buffer_view");
        return;
    }
    FZ_CHECK(s == LMK_OK, "lmk_buffer_view(+%zu of %zu, %s, ndim %d) returned %s", off, plen, lmk_dtype_name(t), ndim,
             lmk_status_name(s));
    const size_t len = ndim ? count * lmk_dtype_size(t) : room;
    fz_stat("views made");
    check_new(b, P->dev, plen ? (void *)addr : NULL, len, t, shape, ndim, count);
    if (st->n_bufs == MAX_LIVE) {
        lmk_buffer_free(b);
        return;
    }
    P->children++;
    const int idx = st->n_bufs++;
    st->bufs[idx] = (hbuf){.b = b, .parent = pi, .root = P->root, .root_off = P->root_off + off, .byte_len = len,
                           .dtype = t, .dev = P->dev};
}

static void pick_range(fz_in *in, size_t len, size_t *off, size_t *n)
{
    switch (fz_pick(in, 8)) {
    case 6:
        *off = len + fz_pick(in, 4);
        *n = fz_pick(in, 4);
        break;
    case 7:
        *off = fz_pick(in, 2) ? SIZE_MAX - fz_pick(in, 4) : fz_pick(in, 8);
        *n = fz_pick(in, 2) ? SIZE_MAX - fz_pick(in, 4) : len + 1;
        break;
    default:
        *off = len ? fz_u16(in) % (len + 1) : 0;
        *n = len - *off ? fz_u16(in) % (len - *off + 1) : 0;
        break;
    }
    if (*n > FZ_ARENA_BYTES && *off <= len && *n <= len - *off)
        *n = 0; /* never true for our buffers; keeps host staging small */
}

static void do_rw(state *st, fz_in *in, tst_rng *rng, bool write)
{
    const char *fn = write ? "lmk_buffer_write" : "lmk_buffer_read";
    hbuf *B = st->n_bufs && fz_pick(in, 32) != 31 ? &st->bufs[fz_pick(in, (unsigned)st->n_bufs)] : NULL;
    size_t off, n;
    pick_range(in, B ? B->byte_len : 0, &off, &n);
    const bool null_host = fz_pick(in, 16) == 15;
    const size_t stage = n <= FZ_ARENA_BYTES ? n : 16;
    unsigned char *host = malloc(stage + 1);
    FZ_CHECK(host != NULL, "harness: out of memory");
    for (size_t i = 0; i < stage; i++)
        host[i] = (unsigned char)tst_rng_u64(rng);
    const bool valid = B && !(null_host && n) && off <= B->byte_len && n <= B->byte_len - off;
    unsigned char *copy = malloc(stage + 1);
    FZ_CHECK(copy != NULL, "harness: out of memory");
    memcpy(copy, host, stage);

    lmk_clear_error();
    const lmk_status s = write ? lmk_buffer_write(B ? B->b : NULL, off, null_host ? NULL : host, n)
                               : lmk_buffer_read(B ? B->b : NULL, off, null_host ? NULL : host, n);
    fz_stat(valid ? "valid reads/writes" : "invalid reads/writes");
    if (!valid) {
        FZ_CHECK(s == LMK_ERR_INVALID_ARGUMENT, "%s(off %zu, n %zu, len %zu) returned %s", fn, off, n,
                 B ? B->byte_len : 0, lmk_status_name(s));
        FZ_CHECK(fz_message_names(fn), "%s: message \"%s\" does not name it", fn, lmk_last_error());
        FZ_CHECK(memcmp(host, copy, stage) == 0, "%s: a rejected call changed the host memory", fn);
    } else {
        FZ_CHECK(s == LMK_OK, "%s(off %zu, n %zu, len %zu) returned %s", fn, off, n, B->byte_len, lmk_status_name(s));
        unsigned char *sh = st->roots[B->root].shadow + B->root_off + off;
        if (write)
            memcpy(sh, host, n);
        else
            FZ_CHECK(n == 0 || memcmp(host, sh, n) == 0, "%s returned bytes that differ from what was written", fn);
    }
    free(host);
    free(copy);
    check_shadows(st, fn);
}

static void do_free(state *st, fz_in *in, bool allow_null)
{
    if ((allow_null && fz_pick(in, 8) == 7) || st->n_bufs == 0) {
        lmk_buffer_free(NULL);
        return;
    }
    /* A buffer without live views (the contract: views are freed before their parent). */
    int i = (int)fz_pick(in, (unsigned)st->n_bufs);
    for (int tries = 0; st->bufs[i].children && tries < MAX_LIVE; tries++)
        i = (i + 1) % st->n_bufs;
    if (st->bufs[i].children)
        return;
    hbuf *B = &st->bufs[i];
    lmk_buffer_free(B->b);
    if (B->parent >= 0)
        st->bufs[B->parent].children--;
    else if (st->roots[B->root].owner == i) {
        free(st->roots[B->root].shadow);
        st->roots[B->root].live = false;
    }
    /* Move the last entry into slot i, fixing the references to it. */
    const int last = --st->n_bufs;
    if (i != last) {
        st->bufs[i] = st->bufs[last];
        for (int j = 0; j < st->n_bufs; j++)
            if (st->bufs[j].parent == last)
                st->bufs[j].parent = i;
        for (int r = 0; r < st->n_roots; r++)
            if (st->roots[r].live && st->roots[r].owner == last)
                st->roots[r].owner = i;
    }
}

static void do_misc(state *st, fz_in *in)
{
    const int v = (int)(int32_t)fz_u32(in);
    FZ_CHECK(lmk_status_name((lmk_status)v) != NULL && lmk_dtype_name((lmk_dtype)v) != NULL, "a name is NULL");
    FZ_CHECK((unsigned)v < LMK_DTYPE_COUNT ? lmk_dtype_size((lmk_dtype)v) > 0 : lmk_dtype_size((lmk_dtype)v) == 0,
             "lmk_dtype_size(%d)", v);
    FZ_CHECK(lmk_buffer_byte_len(NULL) == 0 && lmk_buffer_element_count(NULL) == 0 && lmk_buffer_ndim(NULL) == 0 &&
                 lmk_buffer_dim(NULL, 0) == 0 && lmk_buffer_device(NULL) == NULL && lmk_buffer_data(NULL) == NULL,
             "a getter on NULL");
    FZ_CHECK(lmk_stream_device(NULL) == NULL && lmk_device_name(NULL) != NULL, "a getter on NULL");
    /* bf16 and f16: widening then narrowing is the identity on every non-NaN pattern; NaN stays NaN. */
    const uint16_t h = (uint16_t)v;
    const float fb = lmk_bf16_to_f32(h), fh = lmk_f16_to_f32(h);
    if (isnan(fb))
        FZ_CHECK(isnan(lmk_bf16_to_f32(lmk_f32_to_bf16(fb))), "bf16 NaN %#x lost", h);
    else
        FZ_CHECK(lmk_f32_to_bf16(fb) == h, "bf16 %#x -> %g -> %#x", h, (double)fb, lmk_f32_to_bf16(fb));
    if (isnan(fh))
        FZ_CHECK(isnan(lmk_f16_to_f32(lmk_f32_to_f16(fh))), "f16 NaN %#x lost", h);
    else
        FZ_CHECK(lmk_f32_to_f16(fh) == h, "f16 %#x -> %g -> %#x", h, (double)fh, lmk_f32_to_f16(fh));
    /* Narrowing any f32 rounds to one of its two neighbours (or the NaN/inf rules). */
    const float f = fz_f32_bits(fz_u32(in));
    const float rb = lmk_bf16_to_f32(lmk_f32_to_bf16(f)), rh = lmk_f16_to_f32(lmk_f32_to_f16(f));
    if (isnan(f)) {
        FZ_CHECK(isnan(rb) && isnan(rh), "NaN %#x narrowed to a number", fz_bits_f32(f));
    } else {
        FZ_CHECK(fabs((double)rb - f) <= lmk_ulp(LMK_BF16, f) / 2 || (isinf(rb) && fabs(f) >= 3.3961e38),
                 "bf16(%.9g) = %.9g", (double)f, (double)rb);
        FZ_CHECK(fabs((double)rh - f) <= lmk_ulp(LMK_F16, f) / 2 || (isinf(rh) && fabs(f) >= 65520.0),
                 "f16(%.9g) = %.9g", (double)f, (double)rh);
    }
    if (st->n_bufs) {
        const hbuf *B = &st->bufs[fz_pick(in, (unsigned)st->n_bufs)];
        const int axis = (int)(int8_t)fz_u8(in);
        if (axis < 0 || axis >= lmk_buffer_ndim(B->b))
            FZ_CHECK(lmk_buffer_dim(B->b, axis) == 0, "lmk_buffer_dim(%d) outside [0, ndim) is not 0", axis);
    }
}

static void do_device(state *st, fz_in *in)
{
    const lmk_backend be = (lmk_backend)(fz_pick(in, 8) == 7 ? (int)(int32_t)fz_u32(in) : (int)fz_pick(in, 3));
    const int ordinal = fz_pick(in, 4) == 3 ? (int)(int32_t)fz_u32(in) : (int)fz_pick(in, 2);
    lmk_device *d = (lmk_device *)SENTINEL;
    lmk_clear_error();
    const lmk_status s = lmk_device_open(be, ordinal, &d);
    if (s != LMK_OK) {
        FZ_CHECK((lmk_device *)SENTINEL == d, "lmk_device_open failed but wrote *out");
        FZ_CHECK(lmk_last_error()[0] != '\0', "lmk_device_open failed without a message");
        if (ordinal < 0 || ((unsigned)be > LMK_BACKEND_CUDA))
            FZ_CHECK(s == LMK_ERR_INVALID_ARGUMENT, "lmk_device_open(%d, %d) returned %s", (int)be, ordinal,
                     lmk_status_name(s));
        if ((be == LMK_BACKEND_CPU || be == LMK_BACKEND_AUTO) && ordinal == 0)
            FZ_CHECK(0, "lmk_device_open(%d, 0) failed: %s", (int)be, lmk_status_name(s));
        return;
    }
    FZ_CHECK(ordinal >= 0 && (unsigned)be <= LMK_BACKEND_CUDA, "lmk_device_open(%d, %d) succeeded", (int)be, ordinal);
    FZ_CHECK(be != LMK_BACKEND_CPU || ordinal == 0, "lmk_device_open(CPU, %d) succeeded: the CPU has one device",
             ordinal);
    FZ_CHECK(lmk_device_name(d) && lmk_device_name(d)[0], "a device without a name");
    const int threads = fz_pick(in, 4) == 3 ? (int)(int32_t)fz_u32(in) : (int)fz_pick(in, 5) - 1;
    const lmk_status ts = lmk_device_set_threads(d, threads);
    FZ_CHECK(threads > 1024 ? ts == LMK_ERR_INVALID_ARGUMENT : ts == LMK_OK, "lmk_device_set_threads(%d) returned %s",
             threads, lmk_status_name(ts));
    lmk_stream *s1 = NULL;
    FZ_CHECK(lmk_stream_create(d, &s1) == LMK_OK, "lmk_stream_create");
    FZ_CHECK(lmk_stream_device(s1) == d, "lmk_stream_device");
    FZ_CHECK(lmk_stream_sync(s1) == LMK_OK, "lmk_stream_sync of an idle stream");
    lmk_stream_destroy(s1);
    lmk_stream_destroy(NULL);
    FZ_CHECK(lmk_stream_sync(NULL) == LMK_ERR_INVALID_ARGUMENT, "lmk_stream_sync(NULL)");
    FZ_CHECK(lmk_stream_create(NULL, &s1) == LMK_ERR_INVALID_ARGUMENT &&
                 lmk_stream_create(d, NULL) == LMK_ERR_INVALID_ARGUMENT,
             "lmk_stream_create with NULL");
    lmk_device_close(d);
    lmk_device_close(NULL);
    FZ_UNUSED(st);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in in = {data, size};
    state st = {.e = fz_env_get()};
    const long live_before = atomic_load(&fz_n_live);
    tst_rng rng = tst_rng_make(fz_u32(&in));
    tst_fill_bytes(&rng, st.e->arena, FZ_ARENA_BYTES);
    add_root(&st, st.e->arena, FZ_ARENA_BYTES, -1, false);

    fz_stat("inputs");
    for (int step = 0; step < 64 && in.n; step++) {
        fz_stat("calls");
        switch (fz_pick(&in, 16)) {
        case 0:
        case 1:
        case 2:
            do_alloc(&st, &in);
            break;
        case 3:
        case 4:
            do_wrap(&st, &in);
            break;
        case 5:
        case 6:
        case 7:
            do_view(&st, &in);
            break;
        case 8:
        case 9:
            do_rw(&st, &in, &rng, true);
            break;
        case 10:
        case 11:
            do_rw(&st, &in, &rng, false);
            break;
        case 12:
        case 13:
            do_free(&st, &in, true);
            break;
        case 14:
            do_misc(&st, &in);
            break;
        default:
            do_device(&st, &in);
            break;
        }
        check_shadows(&st, "a call");
    }
    while (st.n_bufs) { /* free everything, views first */
        fz_in none = {NULL, 0};
        do_free(&st, &none, false);
    }
    for (int i = 0; i < st.n_roots; i++)
        if (st.roots[i].live)
            free(st.roots[i].shadow);
    FZ_CHECK(atomic_load(&fz_n_live) == live_before, "leak: %ld host allocations outstanding, %ld before",
             atomic_load(&fz_n_live), live_before);
    return 0;
}
