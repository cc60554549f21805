/* _host.c - the compiled host path of the lmk Python package (the module lmk._host).
 *
 * One function per op (rope, repeat_heads, attn_prologue, causal_conv1d, gated_delta_rule) reads the
 * caller's NumPy arrays (buffer protocol) and torch tensors (data_ptr, shape, stride), checks the
 * logical shapes and keywords as python/lmk/_ops.py does, wraps every array as an lmk_buffer (a strided
 * view where it is strided) and calls the op, with no Python object made per operand. The handles
 * live in a per-call arena on the C stack and are freed before the function returns.
 *
 * This path takes only calls it can finish: on anything else (another kind of array, a dtype or a
 * keyword spelling it does not know, a shape the op rejects, zero tokens, a buffer lmk_buffer_wrap
 * refuses) it returns NotImplemented before writing anything, and the Python path (_ops.py) runs the
 * call, raising its own error where there is one. So every rule and message stays the Python path's,
 * and this file only has to be as strict as it, never laxer. A status from the op itself is raised
 * through _runtime.check, as the Python path does.
 *
 * The module does not link liblmk: init() receives the addresses of the functions of the library the
 * package loaded with ctypes (LMK_LIBRARY or the packaged one), so both paths always call the same
 * library. Devices, streams and their locks are the Python runtime's (_runtime.py): init() receives
 * callbacks that hand them out, the CPU ones are cached here until forget() (after fork).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "lmk.h"

#define MAX_ARRAYS 16
#define MAX_BUFFERS (2 * MAX_ARRAYS)
#define MAX_OWNED 8

typedef lmk_status (*wrap_fn)(lmk_device *, void *, size_t, lmk_dtype, const size_t *, int, lmk_buffer **);
typedef lmk_status (*view_fn)(const lmk_buffer *, size_t, lmk_dtype, const size_t *, const size_t *, int,
                              lmk_buffer **);
typedef void (*free_fn)(lmk_buffer *);
typedef lmk_status (*rope_fn)(lmk_stream *, const lmk_buffer *, const lmk_buffer *, const lmk_buffer *,
                              const lmk_buffer *, lmk_buffer *, lmk_buffer *, const lmk_rope_params *);
typedef lmk_status (*repeat_fn)(lmk_stream *, const lmk_buffer *, lmk_buffer *, const lmk_repeat_heads_params *);
typedef lmk_status (*prologue_fn)(lmk_stream *, const lmk_attn_prologue_io *, const lmk_rope_params *,
                                  const lmk_rms_norm_params *);
typedef lmk_status (*conv_fn)(lmk_stream *, const lmk_buffer *, const lmk_buffer *, const lmk_buffer *,
                              const lmk_buffer *, const lmk_buffer *, lmk_buffer *, lmk_buffer *,
                              const lmk_causal_conv1d_params *);
typedef lmk_status (*gdn_fn)(lmk_stream *, const lmk_gdn_io *, const lmk_gdn_params *);

/* The library's functions (NULL: this liblmk lacks the op) and the runtime's callbacks, from init(). */
static struct {
    wrap_fn wrap;
    view_fn view_strided;
    free_fn free;
    rope_fn rope;
    repeat_fn repeat_heads;
    prologue_fn attn_prologue;
    conv_fn causal_conv1d;
    gdn_fn gated_delta_rule;
    PyObject *cpu_context;  /* () -> (lmk_device, lmk_stream, lock) */
    PyObject *cuda_context; /* (ordinal) -> (lmk_device, lmk_stream, lock, device to restore or -1) */
    PyObject *set_device;   /* (ordinal) -> None: gives a torch caller its current CUDA device back */
    PyObject *check;        /* (status) -> raises LmkError */
    PyObject *empty_like;   /* (like, shape) -> a new array of like's kind, dtype and device */
    PyObject *append_row;   /* (positions) -> positions with its first row appended */
    PyObject *ndarray, *tensor, *parameter, *torch_dtypes; /* types; torch dtype -> lmk_dtype */
    PyObject *cpu;          /* cached cpu_context() */
    unsigned long long taken, declined;
} g;

enum { DEV_CPU = 0, DEV_CUDA = 1 };

typedef struct {
    void *ptr;
    int nd, dtype, readonly, dev_type, dev_index;
    size_t itemsize;
    Py_ssize_t shape[LMK_MAX_DIMS], strides[LMK_MAX_DIMS]; /* strides in elements */
} host_array;

/* One call's arena: the arrays read, the buffer exports to release, the lmk handles to free (views
 * after their parents, so freed in reverse) and the objects this call made. */
typedef struct {
    host_array arrays[MAX_ARRAYS];
    Py_buffer views[MAX_ARRAYS];
    lmk_buffer *buffers[MAX_BUFFERS];
    PyObject *owned[MAX_OWNED];
    int n_arrays, n_views, n_buffers, n_owned;
    int dev_type, dev_index;
    int raised; /* the op failed and its exception is set */
    lmk_device *devh;
} host_call;

static void call_close(host_call *c)
{
    while (c->n_buffers > 0)
        g.free(c->buffers[--c->n_buffers]);
    while (c->n_views > 0)
        PyBuffer_Release(&c->views[--c->n_views]);
    while (c->n_owned > 0)
        Py_DECREF(c->owned[--c->n_owned]);
}

/* Keeps a new reference for the life of the call; NULL (a failed call) declines. */
static PyObject *own(host_call *c, PyObject *o)
{
    if (!o || c->n_owned == MAX_OWNED) {
        Py_XDECREF(o);
        return NULL;
    }
    c->owned[c->n_owned++] = o;
    return o;
}

/* ---- keywords: each accepts a subset of what _ops.py accepts, and returns 0 to decline ---- */

static int get_u32(PyObject *o, uint32_t *out)
{
    if (!PyIndex_Check(o))
        return 0;
    PyObject *i = PyNumber_Index(o);
    if (!i)
        return 0;
    unsigned long long v = PyLong_AsUnsignedLongLong(i);
    Py_DECREF(i);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return 0;
    if (v >= 4294967296ull)
        return 0;
    *out = (uint32_t)v;
    return 1;
}

static int get_float(PyObject *o, float *out)
{
    if (PyUnicode_Check(o) || PyBytes_Check(o) || PyByteArray_Check(o))
        return 0;
    double v = PyFloat_AsDouble(o);
    if (v == -1.0 && PyErr_Occurred())
        return 0;
    *out = (float)v;
    return 1;
}

/* True, False, or the integer 0 or 1. */
static int get_bool(PyObject *o, int *out)
{
    if (o == Py_True || o == Py_False) {
        *out = o == Py_True;
        return 1;
    }
    if (!PyLong_CheckExact(o))
        return 0;
    long v = PyLong_AsLong(o);
    if (v != 0 && v != 1)
        return 0;
    *out = (int)v;
    return 1;
}

typedef struct {
    const char *name;
    int value;
} choice;

static const choice MODES[] = {{"normal", 0}, {"neox", 2}, {"mrope", 8}, {"imrope", 40}, {"vision", 24}, {0, 0}};
static const choice PAIRINGS[] = {{"half_rope", 0}, {"half_head", 1}, {0, 0}};
static const choice LAYOUTS[] = {{"tiled", 0}, {"block", 1}, {0, 0}};
static const choice ACTIVATIONS[] = {{"none", LMK_ACT_NONE}, {"silu", LMK_ACT_SILU}, {0, 0}};

/* A table's name spelt exactly, or one of its values as an int (other spellings go to Python). */
static int get_choice(PyObject *o, const choice *table, int *out)
{
    if (PyUnicode_CheckExact(o)) {
        for (const choice *t = table; t->name; t++)
            if (PyUnicode_CompareWithASCIIString(o, t->name) == 0) {
                *out = t->value;
                return 1;
            }
        return 0;
    }
    if (!PyLong_CheckExact(o))
        return 0;
    long v = PyLong_AsLong(o);
    if (v == -1 && PyErr_Occurred())
        return 0;
    for (const choice *t = table; t->name; t++)
        if (t->value == v) {
            *out = (int)v;
            return 1;
        }
    return 0;
}

static int is_multi(int mode) { return mode == 8 || mode == 40 || mode == 24; }

/* lmk_rope_params.sections: None, or a list or tuple of 1 to 4 integers; the multi modes need one > 0. */
static int get_sections(PyObject *o, int mode, uint32_t sections[4])
{
    memset(sections, 0, 4 * sizeof *sections);
    if (o && o != Py_None) {
        if (!PyList_CheckExact(o) && !PyTuple_CheckExact(o))
            return 0;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
        if (n < 1 || n > 4)
            return 0;
        for (Py_ssize_t i = 0; i < n; i++)
            if (!get_u32(PySequence_Fast_GET_ITEM(o, i), &sections[i]))
                return 0;
    }
    return !is_multi(mode) || (sections[0] | sections[1] | sections[2] | sections[3]);
}

/* The rope keywords in _ops.ROPE_KWARGS order less freq_factors; NULL entries take their defaults. */
enum { RK_ROPE_DIM, RK_FREQ_BASE, RK_MODE, RK_SECTIONS, RK_PAIRING, RK_FREQ_SCALE, RK_EXT_FACTOR, RK_ATTN_FACTOR,
       RK_BETA_FAST, RK_BETA_SLOW, RK_N_CTX_ORIG, RK_COUNT };
static const char *const ROPE_NAMES[RK_COUNT] = {"rope_dim", "freq_base", "mode", "sections", "pairing",
                                                 "freq_scale", "ext_factor", "attn_factor", "beta_fast",
                                                 "beta_slow", "n_ctx_orig"};

static int opt_float(PyObject *o, float dflt, float *out)
{
    if (!o) {
        *out = dflt;
        return 1;
    }
    return get_float(o, out);
}

static int get_rope_params(PyObject *const *kw, uint32_t T, uint32_t H, uint32_t D, uint32_t Hk,
                           lmk_rope_params *p)
{
    memset(p, 0, sizeof *p);
    p->head_dim = D, p->n_heads = H, p->seq_len = T, p->n_k_heads = Hk;
    PyObject *rd = kw[RK_ROPE_DIM];
    p->rope_dim = D;
    if (rd && rd != Py_None && !get_u32(rd, &p->rope_dim))
        return 0;
    int mode = 2, pairing = 0;
    if ((kw[RK_MODE] && !get_choice(kw[RK_MODE], MODES, &mode)) ||
        (kw[RK_PAIRING] && !get_choice(kw[RK_PAIRING], PAIRINGS, &pairing)))
        return 0;
    p->mode = (lmk_rope_mode)mode;
    p->pairing = (lmk_rope_pairing)pairing;
    if (!get_sections(kw[RK_SECTIONS], mode, p->sections))
        return 0;
    p->n_ctx_orig = 0;
    if (kw[RK_N_CTX_ORIG] && !get_u32(kw[RK_N_CTX_ORIG], &p->n_ctx_orig))
        return 0;
    return opt_float(kw[RK_FREQ_BASE], 10000.0f, &p->freq_base) &&
           opt_float(kw[RK_FREQ_SCALE], 1.0f, &p->freq_scale) && opt_float(kw[RK_EXT_FACTOR], 0.0f, &p->ext_factor) &&
           opt_float(kw[RK_ATTN_FACTOR], 1.0f, &p->attn_factor) &&
           opt_float(kw[RK_BETA_FAST], 32.0f, &p->beta_fast) && opt_float(kw[RK_BETA_SLOW], 1.0f, &p->beta_slow);
}

/* ---- arrays ---- */

/* A NumPy buffer format (native byte order) as an lmk dtype, as _arrays.py maps the DLPack dtype NumPy
 * exports; raw: any other integer, float or bool element moves as the unsigned integer of its size. */
static int format_dtype(const char *f, Py_ssize_t size, int raw)
{
    if (!f)
        return -1;
    if (f[0] == '@' || f[0] == '=' || f[0] == '<')
        f++;
    if (!f[0] || f[1])
        return -1;
    switch (f[0]) {
    case 'f': return size == 4 ? LMK_F32 : -1;
    case 'e': return size == 2 ? LMK_F16 : -1;
    case 'B': return size == 1 ? LMK_U8 : -1;
    case 'H': return size == 2 ? LMK_U16 : -1;
    case 'I': return size == 4 ? LMK_U32 : size == 8 && raw ? LMK_I64 : -1;
    case 'i': return size == 4 ? LMK_I32 : size == 8 && raw ? LMK_I64 : -1;
    case 'l': case 'q': return size == 8 ? LMK_I64 : size == 4 && raw ? LMK_U32 : -1;
    case '?': case 'b': return raw && size == 1 ? LMK_U8 : -1;
    case 'h': return raw && size == 2 ? LMK_U16 : -1;
    case 'L': case 'Q': case 'd': return raw && size == 8 ? LMK_I64 : raw && size == 4 ? LMK_U32 : -1;
    default: return -1;
    }
}

static int read_numpy(host_call *c, PyObject *o, host_array *a, int raw)
{
    Py_buffer *v = &c->views[c->n_views];
    if (PyObject_GetBuffer(o, v, PyBUF_RECORDS_RO) != 0)
        return 0;
    c->n_views++;
    int dt = format_dtype(v->format, v->itemsize, raw);
    if (dt < 0 || v->ndim > LMK_MAX_DIMS || v->itemsize <= 0)
        return 0;
    a->ptr = v->buf, a->nd = v->ndim, a->itemsize = (size_t)v->itemsize, a->dtype = dt;
    a->readonly = v->readonly, a->dev_type = DEV_CPU, a->dev_index = 0;
    for (int i = 0; i < a->nd; i++) {
        if (v->strides[i] % v->itemsize)
            return 0;
        a->shape[i] = v->shape[i];
        a->strides[i] = v->strides[i] / v->itemsize;
    }
    return 1;
}

/* A tuple of at most LMK_MAX_DIMS ints into dst; its length, or -1. */
static int int_tuple(PyObject *t, Py_ssize_t *dst)
{
    if (!t || !PyTuple_Check(t) || PyTuple_GET_SIZE(t) > LMK_MAX_DIMS)
        return -1;
    int n = (int)PyTuple_GET_SIZE(t);
    for (int i = 0; i < n; i++) {
        dst[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, i));
        if (dst[i] == -1 && PyErr_Occurred())
            return -1;
    }
    return n;
}

/* Attribute names, interned once (PyInit__host): a lookup by C string would make a str per call. */
static PyObject *s_dtype, *s_element_size, *s_is_cpu, *s_is_cuda, *s_get_device, *s_data_ptr, *s_shape, *s_stride,
    *s_acquire, *s_release;

static PyObject *call_method(PyObject *o, PyObject *name)
{
    return PyObject_CallMethodObjArgs(o, name, NULL);
}

/* dtype and device of a torch tensor: a dtype of the table (raw: else by element size); cpu or cuda. */
static const size_t DTYPE_SIZES[LMK_DTYPE_COUNT] = {4, 2, 2, 1, 2, 4, 4, 8, 1};

static int torch_kind(PyObject *o, host_array *a, int raw)
{
    PyObject *dt = PyObject_GetAttr(o, s_dtype);
    PyObject *code = dt ? PyDict_GetItem(g.torch_dtypes, dt) : NULL;
    Py_XDECREF(dt);
    long lmk = code ? PyLong_AsLong(code) : -1;
    PyObject *es = lmk < 0 || lmk >= LMK_DTYPE_COUNT ? call_method(o, s_element_size) : NULL;
    a->itemsize = es ? PyLong_AsSize_t(es) : lmk >= 0 && lmk < LMK_DTYPE_COUNT ? DTYPE_SIZES[lmk] : 0;
    Py_XDECREF(es);
    if (lmk >= 0 && lmk < LMK_DTYPE_COUNT)
        a->dtype = (int)lmk;
    else if (raw && (a->itemsize == 1 || a->itemsize == 2 || a->itemsize == 4 || a->itemsize == 8))
        a->dtype = a->itemsize == 1 ? LMK_U8 : a->itemsize == 2 ? LMK_U16 : a->itemsize == 4 ? LMK_U32 : LMK_I64;
    else
        return 0;
    PyObject *is_cpu = PyObject_GetAttr(o, s_is_cpu);
    int cpu = is_cpu == Py_True;
    Py_XDECREF(is_cpu);
    a->dev_type = DEV_CPU, a->dev_index = 0;
    if (cpu)
        return 1;
    PyObject *is_cuda = PyObject_GetAttr(o, s_is_cuda);
    int cuda = is_cuda == Py_True;
    Py_XDECREF(is_cuda);
    PyObject *idx = cuda ? call_method(o, s_get_device) : NULL;
    a->dev_type = DEV_CUDA;
    a->dev_index = idx ? (int)PyLong_AsLong(idx) : -1;
    Py_XDECREF(idx);
    return a->dev_index >= 0;
}

static int read_torch(PyObject *o, host_array *a, int raw)
{
    if (!torch_kind(o, a, raw))
        return 0;
    PyObject *ptr = call_method(o, s_data_ptr);
    a->ptr = ptr ? PyLong_AsVoidPtr(ptr) : NULL;
    Py_XDECREF(ptr);
    if (!ptr || PyErr_Occurred())
        return 0;
    PyObject *shape = PyObject_GetAttr(o, s_shape);
    a->nd = int_tuple(shape, a->shape);
    Py_XDECREF(shape);
    PyObject *strides = call_method(o, s_stride);
    int ns = int_tuple(strides, a->strides);
    Py_XDECREF(strides);
    a->readonly = 0;
    return a->nd >= 0 && ns == a->nd;
}

/* Reads o (None: NULL) on the call's device: the first array read sets it. NULL declines. */
static host_array *read_array(host_call *c, PyObject *o, int raw, int writable)
{
    if (c->n_arrays == MAX_ARRAYS || c->n_views == MAX_ARRAYS)
        return NULL;
    host_array *a = &c->arrays[c->n_arrays];
    PyTypeObject *t = Py_TYPE(o);
    int ok;
    if ((PyObject *)t == g.ndarray)
        ok = read_numpy(c, o, a, raw);
    else if (g.tensor && ((PyObject *)t == g.tensor || (PyObject *)t == g.parameter))
        ok = read_torch(o, a, raw);
    else
        ok = 0;
    if (!ok || (writable && a->readonly))
        return NULL;
    if (c->n_arrays == 0)
        c->dev_type = a->dev_type, c->dev_index = a->dev_index;
    else if (a->dev_type != c->dev_type || a->dev_index != c->dev_index)
        return NULL;
    c->n_arrays++;
    return a;
}

/* read_array for an optional argument: *out NULL for None; 0 declines. */
static int read_opt(host_call *c, PyObject *o, int raw, int writable, host_array **out)
{
    *out = NULL;
    if (o == Py_None)
        return 1;
    *out = read_array(c, o, raw, writable);
    return *out != NULL;
}

static int has_shape(const host_array *a, int nd, const Py_ssize_t *shape)
{
    if (a->nd != nd)
        return 0;
    for (int i = 0; i < nd; i++)
        if (a->shape[i] != shape[i])
            return 0;
    return 1;
}

static int shape3(const host_array *a, Py_ssize_t n0, Py_ssize_t n1, Py_ssize_t n2)
{
    const Py_ssize_t s[3] = {n0, n1, n2};
    return has_shape(a, 3, s);
}

/* A new array of like's kind, dtype and device, owned by the call; NULL declines. */
static PyObject *alloc_like(host_call *c, PyObject *like, Py_ssize_t n0, Py_ssize_t n1, Py_ssize_t n2, int nd)
{
    PyObject *shape = nd == 3 ? Py_BuildValue("(nnn)", n0, n1, n2) : Py_BuildValue("(nn)", n0, n1);
    if (!shape)
        return NULL;
    PyObject *r = PyObject_CallFunctionObjArgs(g.empty_like, like, shape, NULL);
    Py_DECREF(shape);
    return own(c, r);
}

/* ---- buffers ---- */

/* Dense row-major, strides of axes of length 1 ignored; an array without elements is dense. */
static int is_dense(const host_array *a)
{
    for (int i = 0; i < a->nd; i++)
        if (a->shape[i] == 0)
            return 1;
    Py_ssize_t expect = 1;
    for (int i = a->nd - 1; i >= 0; i--) {
        if (a->shape[i] != 1 && a->strides[i] != expect)
            return 0;
        expect *= a->shape[i];
    }
    return 1;
}

static int push(host_call *c, lmk_status st, lmk_buffer *b)
{
    if (st != LMK_OK)
        return 0;
    c->buffers[c->n_buffers++] = b;
    return 1;
}

/* An lmk_buffer over a's memory as _runtime.Call.buffer makes it: a wrap of a dense array, else a wrap
 * of the bytes it spans and a strided view. dense: a must be dense; pool: any strides (state pools),
 * else the last axis has stride 1. a NULL gives NULL. 0 declines. */
static int make_buffer(host_call *c, const host_array *a, int dense, int pool, lmk_buffer **out)
{
    *out = NULL;
    if (!a)
        return 1;
    size_t shape[LMK_MAX_DIMS], strides[LMK_MAX_DIMS], numel = 1, span = 1;
    for (int i = 0; i < a->nd; i++) {
        shape[i] = (size_t)a->shape[i];
        numel *= shape[i];
    }
    if (is_dense(a))
        return push(c, g.wrap(c->devh, a->ptr, numel * a->itemsize, (lmk_dtype)a->dtype, a->nd ? shape : NULL,
                              a->nd, out), *out);
    if (dense || (!pool && a->shape[a->nd - 1] > 1 && a->strides[a->nd - 1] != 1))
        return 0;
    for (int i = 0; i < a->nd; i++) {
        Py_ssize_t s = a->shape[i] == 1 ? 0 : a->strides[i];
        if (s < 0)
            return 0;
        strides[i] = (size_t)s;
        span += (shape[i] - 1) * strides[i];
    }
    lmk_buffer *parent = NULL;
    if (!push(c, g.wrap(c->devh, a->ptr, span * a->itemsize, (lmk_dtype)a->dtype, NULL, 0, &parent), parent))
        return 0;
    return push(c, g.view_strided(parent, 0, (lmk_dtype)a->dtype, shape, strides, a->nd, out), *out);
}

/* ---- running ---- */

typedef lmk_status (*invoke_fn)(lmk_stream *s, void *op);

static int unpack_ptr(PyObject *t, Py_ssize_t i, void **out)
{
    *out = PyLong_AsVoidPtr(PyTuple_GET_ITEM(t, i));
    return *out != NULL;
}

/* The device handle of the call's device; the context tuple of its stream, a new reference. */
static PyObject *call_context(host_call *c)
{
    PyObject *ctx;
    if (c->dev_type == DEV_CPU) {
        if (!g.cpu) {
            g.cpu = PyObject_CallObject(g.cpu_context, NULL);
            if (!g.cpu || !PyTuple_Check(g.cpu) || PyTuple_GET_SIZE(g.cpu) != 3)
                Py_CLEAR(g.cpu);
        }
        ctx = g.cpu;
        Py_XINCREF(ctx);
    } else {
        ctx = PyObject_CallFunction(g.cuda_context, "i", c->dev_index);
        if (ctx && (!PyTuple_Check(ctx) || PyTuple_GET_SIZE(ctx) != 4))
            Py_CLEAR(ctx);
    }
    void *devh;
    if (ctx && !unpack_ptr(ctx, 0, &devh))
        Py_CLEAR(ctx);
    c->devh = ctx ? devh : NULL;
    return ctx;
}

/* Runs the op on the context's stream under the stream's lock, without the GIL (as ctypes calls run),
 * gives a CUDA caller its device back, and raises the op's failure through _runtime.check. Returns
 * result (a new reference) or NULL with the exception set. */
static PyObject *run(host_call *c, PyObject *ctx, invoke_fn invoke, void *op, PyObject *result)
{
    void *stream;
    PyObject *lock = PyTuple_GET_ITEM(ctx, 2);
    lmk_status st = LMK_OK;
    PyObject *r = unpack_ptr(ctx, 1, &stream) ? call_method(lock, s_acquire) : NULL;
    if (r) {
        Py_DECREF(r);
        Py_BEGIN_ALLOW_THREADS
        st = invoke((lmk_stream *)stream, op);
        Py_END_ALLOW_THREADS
        r = call_method(lock, s_release);
        Py_XDECREF(r);
    }
    if (r && PyTuple_GET_SIZE(ctx) == 4) {
        long restore = PyLong_AsLong(PyTuple_GET_ITEM(ctx, 3));
        if (restore >= 0) {
            r = PyObject_CallFunction(g.set_device, "l", restore);
            Py_XDECREF(r);
        }
    }
    if (r && st != LMK_OK) {
        r = PyObject_CallFunction(g.check, "i", (int)st);
        Py_XDECREF(r);
        r = NULL;
    }
    if (!r) {
        c->raised = 1;
        Py_XDECREF(result);
        return NULL;
    }
    g.taken++;
    return result;
}

/* Builds the buffers (build returns 0 to decline) and runs. result: a new reference, returned. */
static PyObject *finish(host_call *c, int (*build)(host_call *, void *), invoke_fn invoke, void *op,
                        PyObject *result)
{
    PyObject *ctx = call_context(c);
    if (!ctx || !build(c, op)) {
        Py_XDECREF(ctx);
        Py_DECREF(result);
        return NULL;
    }
    PyObject *r = run(c, ctx, invoke, op, result);
    Py_DECREF(ctx);
    return r;
}

/* The end of every op function: r is the result, or NULL with an exception from the op, or NULL
 * without one to decline. */
static PyObject *done(host_call *c, PyObject *r)
{
    call_close(c);
    if (r || c->raised)
        return r;
    PyErr_Clear();
    g.declined++;
    Py_RETURN_NOTIMPLEMENTED;
}

static PyObject *result_of(PyObject *o)
{
    Py_INCREF(o);
    return o;
}

static void call_init(host_call *c)
{
    c->n_arrays = c->n_views = c->n_buffers = c->n_owned = 0;
    c->dev_type = DEV_CPU, c->dev_index = 0, c->raised = 0, c->devh = NULL;
}

static int dims_u32(const host_array *a)
{
    for (int i = 0; i < a->nd; i++)
        if ((unsigned long long)a->shape[i] >= 4294967296ull)
            return 0;
    return 1;
}

/* positions as _ops._positions takes them: the multi modes' Hugging Face (3, T) gets its t row appended. */
static const host_array *read_positions(host_call *c, PyObject *pos, int mode, Py_ssize_t T)
{
    host_array *a = read_array(c, pos, 0, 0);
    if (a && is_multi(mode) && a->nd == 2 && a->shape[0] == 3 && a->shape[1] == T) {
        PyObject *full = own(c, PyObject_CallFunctionObjArgs(g.append_row, pos, NULL));
        a = full ? read_array(c, full, 0, 0) : NULL;
    }
    return a;
}

/* A [T, n, d] argument (optional: None gives NULL); T, n, d: -1 for any. */
static int read3(host_call *c, PyObject *o, int writable, Py_ssize_t T, Py_ssize_t n, Py_ssize_t d,
                 host_array **out)
{
    if (!read_opt(c, o, 0, writable, out))
        return 0;
    host_array *a = *out;
    return !a || (a->nd == 3 && dims_u32(a) &&
                  shape3(a, T < 0 ? a->shape[0] : T, n < 0 ? a->shape[1] : n, d < 0 ? a->shape[2] : d));
}

/* ---- rope ---- */

typedef struct {
    const host_array *q, *k, *pos, *ff, *out, *k_out;
    lmk_buffer *bq, *bk, *bpos, *bff, *bout, *bk_out;
    lmk_rope_params p;
} rope_op;

static int rope_build(host_call *c, void *v)
{
    rope_op *o = v;
    return make_buffer(c, o->q, 0, 0, &o->bq) && make_buffer(c, o->k, 0, 0, &o->bk) &&
           make_buffer(c, o->pos, 1, 0, &o->bpos) && make_buffer(c, o->ff, 1, 0, &o->bff) &&
           make_buffer(c, o->out, 0, 0, &o->bout) && make_buffer(c, o->k_out, 0, 0, &o->bk_out);
}

static lmk_status rope_invoke(lmk_stream *s, void *v)
{
    rope_op *o = v;
    return g.rope(s, o->bq, o->bk, o->bpos, o->bff, o->bout, o->bk_out, &o->p);
}

/* a: q, positions, k, out, k_out, freq_factors, then the rope keywords in RK order. */
static PyObject *rope_call(host_call *c, PyObject *const *a)
{
    rope_op o;
    PyObject *q = a[0], *k = a[2], *out = a[3], *k_out = a[4];
    host_array *qa, *ka, *ffa, *oa, *koa;
    if ((k == Py_None && k_out != Py_None) || !read3(c, q, 0, -1, -1, -1, &qa) || !qa)
        return NULL;
    Py_ssize_t T = qa->shape[0], H = qa->shape[1], D = qa->shape[2];
    if (!read3(c, k, 0, T, -1, D, &ka))
        return NULL;
    Py_ssize_t Hk = ka ? ka->shape[1] : 0;
    if (!get_rope_params(a + 6, (uint32_t)T, (uint32_t)H, (uint32_t)D, (uint32_t)Hk, &o.p) || T == 0)
        return NULL;
    if (out == Py_None && !(out = alloc_like(c, q, T, H, D, 3)))
        return NULL;
    if (k != Py_None && k_out == Py_None && !(k_out = alloc_like(c, k, T, Hk, D, 3)))
        return NULL;
    o.pos = read_positions(c, a[1], (int)o.p.mode, T);
    if (!o.pos || !read_opt(c, a[5], 0, 0, &ffa) || !read3(c, out, 1, T, H, D, &oa) ||
        !read3(c, k_out, 1, T, Hk, D, &koa))
        return NULL;
    o.q = qa, o.k = ka, o.ff = ffa, o.out = oa, o.k_out = koa;
    PyObject *result = k == Py_None ? result_of(out) : PyTuple_Pack(2, out, k_out);
    return result ? finish(c, rope_build, rope_invoke, &o, result) : NULL;
}

static PyObject *host_rope(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    (void)self;
    host_call c;
    call_init(&c);
    return done(&c, n == 6 + RK_COUNT && g.rope ? rope_call(&c, args) : NULL);
}

/* ---- repeat_heads ---- */

typedef struct {
    const host_array *x, *out;
    lmk_buffer *bx, *bout;
    lmk_repeat_heads_params p;
} repeat_op;

static int repeat_build(host_call *c, void *v)
{
    repeat_op *o = v;
    return make_buffer(c, o->x, 0, 0, &o->bx) && make_buffer(c, o->out, 0, 0, &o->bout);
}

static lmk_status repeat_invoke(lmk_stream *s, void *v)
{
    repeat_op *o = v;
    return g.repeat_heads(s, o->bx, o->bout, &o->p);
}

/* a: x, h, layout, out. */
static PyObject *repeat_call(host_call *c, PyObject *const *a)
{
    repeat_op o;
    int layout;
    uint32_t h;
    PyObject *out = a[3];
    if (!get_choice(a[2], LAYOUTS, &layout))
        return NULL;
    host_array *xa = read_array(c, a[0], 1, 0), *oa;
    if (!xa || xa->nd != 3 || !dims_u32(xa) || !get_u32(a[1], &h) || xa->shape[0] == 0)
        return NULL;
    Py_ssize_t T = xa->shape[0], K = xa->shape[2];
    o.p.seq = (uint32_t)T, o.p.hg = (uint32_t)xa->shape[1], o.p.h = h, o.p.k = (uint32_t)K;
    o.p.layout = (lmk_repeat_layout)layout;
    if (out == Py_None && !(out = alloc_like(c, a[0], T, h, K, 3)))
        return NULL;
    if (!(oa = read_array(c, out, 1, 1)) || !shape3(oa, T, h, K))
        return NULL;
    o.x = xa, o.out = oa;
    return finish(c, repeat_build, repeat_invoke, &o, result_of(out));
}

static PyObject *host_repeat_heads(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    (void)self;
    host_call c;
    call_init(&c);
    return done(&c, n == 4 && g.repeat_heads ? repeat_call(&c, args) : NULL);
}

/* ---- attn_prologue ---- */

typedef struct {
    const host_array *arr[12]; /* q, k, v, q_norm_w, k_norm_w, positions, freq_factors, slots, q_out, k_out,
                                  k_cache, v_cache: lmk_attn_prologue_io's order */
    lmk_attn_prologue_io io;
    lmk_rope_params p;
    lmk_rms_norm_params norm;
} prologue_op;

static int prologue_build(host_call *c, void *v)
{
    prologue_op *o = v;
    lmk_buffer *b[12];
    for (int i = 0; i < 12; i++) /* the norm weights, positions, freq_factors and slots are dense */
        if (!make_buffer(c, o->arr[i], i >= 3 && i <= 7, 0, &b[i]))
            return 0;
    lmk_attn_prologue_io *io = &o->io;
    io->q_in = b[0], io->k_in = b[1], io->v_in = b[2], io->q_norm_w = b[3], io->k_norm_w = b[4];
    io->positions = b[5], io->freq_factors = b[6], io->slots = b[7], io->q_out = b[8], io->k_out = b[9];
    io->k_cache = b[10], io->v_cache = b[11];
    return 1;
}

static lmk_status prologue_invoke(lmk_stream *s, void *v)
{
    prologue_op *o = v;
    return g.attn_prologue(s, &o->io, &o->p, &o->norm);
}

/* A KV cache as rows [n_slots, Hk, D] as _ops._cache_rows views it (D -1: its own). */
static int cache_rows(host_array *a, Py_ssize_t Hk, Py_ssize_t D)
{
    if (!a)
        return 1;
    if (a->nd == 4) {
        Py_ssize_t nb = a->shape[0], bs = a->shape[1], sb = a->strides[0], ss = a->strides[1];
        if (nb > 1 && bs > 1 && sb != bs * ss)
            return 0;
        a->nd = 3;
        a->shape[0] = nb * bs, a->shape[1] = a->shape[2], a->shape[2] = a->shape[3];
        a->strides[0] = bs > 1 ? ss : sb, a->strides[1] = a->strides[2], a->strides[2] = a->strides[3];
    }
    return a->nd == 3 && a->shape[1] == Hk && a->shape[2] == (D < 0 ? a->shape[2] : D);
}

/* The rope keywords of a dict (in RK order) and its freq_factors; 0 when it has any other key. */
static int rope_kwargs(PyObject *d, PyObject *kw[RK_COUNT], PyObject **freq_factors)
{
    if (!PyDict_CheckExact(d))
        return 0;
    Py_ssize_t found = 0;
    for (int i = 0; i < RK_COUNT; i++)
        found += (kw[i] = PyDict_GetItemString(d, ROPE_NAMES[i])) != NULL;
    *freq_factors = PyDict_GetItemString(d, "freq_factors");
    found += *freq_factors != NULL;
    if (!*freq_factors)
        *freq_factors = Py_None;
    return found == PyDict_Size(d);
}

/* a: q, k, positions, v, q_norm_w, k_norm_w, eps, weight_offset, slots, k_cache, v_cache, k_scale, v_scale,
 * q_out, k_out, rope_kwargs (a dict). */
static PyObject *prologue_call(host_call *c, PyObject *const *a)
{
    prologue_op o;
    PyObject *kw[RK_COUNT], *ff, *q_out = a[13], *k_out = a[14], *k_cache = a[9], *v_cache = a[10];
    host_array *qa, *ka, *va, *x[12];
    if (!rope_kwargs(a[15], kw, &ff) || (a[3] != Py_None && v_cache == Py_None) ||
        !read3(c, a[0], 0, -1, -1, -1, &qa) || !qa)
        return NULL;
    Py_ssize_t T = qa->shape[0], H = qa->shape[1], D = qa->shape[2];
    if (!read3(c, a[1], 0, T, -1, D, &ka) || !ka || !read3(c, a[3], 0, T, ka->shape[1], -1, &va))
        return NULL;
    Py_ssize_t Hk = ka->shape[1], Dv = va ? va->shape[2] : -1;
    if (!get_rope_params(kw, (uint32_t)T, (uint32_t)H, (uint32_t)D, (uint32_t)Hk, &o.p) ||
        !get_float(a[6], &o.norm.eps) || !get_float(a[7], &o.norm.weight_offset) ||
        !get_float(a[11], &o.io.k_scale) || !get_float(a[12], &o.io.v_scale) || T == 0)
        return NULL;
    if (q_out == Py_None && !(q_out = alloc_like(c, a[0], T, H, D, 3)))
        return NULL;
    if (k_out == Py_None && k_cache == Py_None && !(k_out = alloc_like(c, a[1], T, Hk, D, 3)))
        return NULL;
    x[0] = qa, x[1] = ka, x[2] = va;
    x[5] = (host_array *)read_positions(c, a[2], (int)o.p.mode, T);
    if (!read_opt(c, a[4], 0, 0, &x[3]) || !read_opt(c, a[5], 0, 0, &x[4]) || !x[5] ||
        !read_opt(c, ff, 0, 0, &x[6]) || !read_opt(c, a[8], 0, 0, &x[7]) || !read3(c, q_out, 1, T, H, D, &x[8]) ||
        !read3(c, k_out, 1, T, Hk, D, &x[9]) || !read_opt(c, k_cache, 0, 1, &x[10]) ||
        !read_opt(c, v_cache, 0, 1, &x[11]) || !cache_rows(x[10], Hk, D) || !cache_rows(x[11], Hk, Dv))
        return NULL;
    for (int i = 0; i < 12; i++)
        o.arr[i] = x[i];
    PyObject *result = PyTuple_Pack(2, q_out, k_out);
    return result ? finish(c, prologue_build, prologue_invoke, &o, result) : NULL;
}

static PyObject *host_attn_prologue(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    (void)self;
    host_call c;
    call_init(&c);
    return done(&c, n == 16 && g.attn_prologue ? prologue_call(&c, args) : NULL);
}

/* ---- causal_conv1d ---- */

typedef struct {
    const host_array *arr[7]; /* x, weight, bias, cu_seqlens, state_slots, state, out: the C call's order */
    lmk_buffer *b[7];
    lmk_causal_conv1d_params p;
} conv_op;

static int conv_build(host_call *c, void *v)
{
    conv_op *o = v;
    for (int i = 0; i < 7; i++) /* weight, bias, cu_seqlens, state_slots dense; state a pool */
        if (!make_buffer(c, o->arr[i], i >= 1 && i <= 4, i == 5, &o->b[i]))
            return 0;
    return 1;
}

static lmk_status conv_invoke(lmk_stream *s, void *v)
{
    conv_op *o = v;
    return g.causal_conv1d(s, o->b[0], o->b[1], o->b[2], o->b[3], o->b[4], o->b[5], o->b[6], &o->p);
}

/* a: x, weight, bias, activation, cu_seqlens, state, state_slots, out. */
static PyObject *conv_call(host_call *c, PyObject *const *a)
{
    conv_op o;
    int act;
    PyObject *out = a[7];
    host_array *x[7];
    act = LMK_ACT_NONE; /* activation None is "none" */
    if (a[3] != Py_None && !get_choice(a[3], ACTIVATIONS, &act))
        return NULL;
    if (!(x[0] = read_array(c, a[0], 0, 0)) || x[0]->nd != 2 || !dims_u32(x[0]) ||
        !(x[1] = read_array(c, a[1], 0, 0)))
        return NULL;
    Py_ssize_t T = x[0]->shape[0], C = x[0]->shape[1];
    host_array *w = x[1];
    if (w->nd == 3 && w->shape[1] == 1) { /* Hugging Face's conv1d.weight [C, 1, W] */
        w->nd = 2, w->shape[1] = w->shape[2], w->strides[1] = w->strides[2];
    }
    if (w->nd != 2 || w->shape[0] != C || !dims_u32(w))
        return NULL;
    Py_ssize_t W = w->shape[1];
    o.p.seq_len = (uint32_t)T, o.p.channels = (uint32_t)C, o.p.width = (uint32_t)W;
    o.p.activation = (lmk_activation)act;
    if (!read_opt(c, a[2], 0, 0, &x[2]) || !read_opt(c, a[4], 0, 0, &x[3]) || !read_opt(c, a[6], 0, 0, &x[4]) ||
        !read_opt(c, a[5], 0, 1, &x[5]) || (x[5] && (x[5]->nd != 3 || x[5]->shape[1] != W - 1 ||
                                                       x[5]->shape[2] != C)) || T == 0)
        return NULL;
    if (out == Py_None && !(out = alloc_like(c, a[0], T, C, 0, 2)))
        return NULL;
    const Py_ssize_t shape[2] = {T, C};
    if (!(x[6] = read_array(c, out, 0, 1)) || !has_shape(x[6], 2, shape))
        return NULL;
    for (int i = 0; i < 7; i++)
        o.arr[i] = x[i];
    return finish(c, conv_build, conv_invoke, &o, result_of(out));
}

static PyObject *host_causal_conv1d(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    (void)self;
    host_call c;
    call_init(&c);
    return done(&c, n == 8 && g.causal_conv1d ? conv_call(&c, args) : NULL);
}

/* ---- gated_delta_rule ---- */

typedef struct {
    const host_array *arr[14]; /* lmk_gdn_io's order: q, k, v, a, b, A_log, dt_bias, cu_seqlens, state_slots,
                                  state, z, norm_w, out, workspace */
    lmk_gdn_io io;
    lmk_gdn_params p;
} gdn_op;

static int gdn_build(host_call *c, void *v)
{
    gdn_op *o = v;
    lmk_buffer *b[14];
    for (int i = 0; i < 14; i++) /* A_log, dt_bias, cu_seqlens, state_slots, norm_w, workspace dense; state a pool */
        if (!make_buffer(c, o->arr[i], (i >= 5 && i <= 8) || i == 11 || i == 13, i == 9, &b[i]))
            return 0;
    lmk_gdn_io *io = &o->io;
    io->q = b[0], io->k = b[1], io->v = b[2], io->a = b[3], io->b = b[4], io->A_log = b[5], io->dt_bias = b[6];
    io->cu_seqlens = b[7], io->state_slots = b[8], io->state = b[9], io->z = b[10], io->norm_w = b[11];
    io->out = b[12], io->workspace = b[13];
    return 1;
}

static lmk_status gdn_invoke(lmk_stream *s, void *v)
{
    gdn_op *o = v;
    return g.gated_delta_rule(s, &o->io, &o->p);
}

/* lmk_gdn_params from the keywords heads, scale, l2norm, eps, weight_offset (a[7..9], a[15..16]). */
static int gdn_params(PyObject *const *a, lmk_gdn_params *p)
{
    int heads, l2norm;
    p->scale = 0.0f;
    if (!get_choice(a[7], LAYOUTS, &heads) || (a[8] != Py_None && !get_float(a[8], &p->scale)) ||
        !get_bool(a[9], &l2norm) || !get_float(a[15], &p->norm.eps) || !get_float(a[16], &p->norm.weight_offset))
        return 0;
    p->head_map = (lmk_repeat_layout)heads;
    p->flags = l2norm ? 0u : LMK_GDN_NO_L2NORM;
    return 1;
}

/* a: q, k, v, a, b, A_log, dt_bias, heads, scale, l2norm, cu_seqlens, state, state_slots, z, norm_w, eps,
 * weight_offset, out, workspace. */
static PyObject *gdn_call(host_call *c, PyObject *const *a)
{
    gdn_op o;
    host_array *x[14];
    PyObject *out = a[17];
    if (!read3(c, a[0], 0, -1, -1, -1, &x[0]) || !x[0])
        return NULL;
    Py_ssize_t T = x[0]->shape[0], Hk = x[0]->shape[1], dk = x[0]->shape[2];
    if (!read3(c, a[1], 0, T, Hk, dk, &x[1]) || !x[1] || !read3(c, a[2], 0, T, -1, -1, &x[2]) || !x[2])
        return NULL;
    Py_ssize_t Hv = x[2]->shape[1], dv = x[2]->shape[2];
    const Py_ssize_t gate[2] = {T, Hv};
    o.p.seq_len = (uint32_t)T, o.p.n_k_heads = (uint32_t)Hk, o.p.n_v_heads = (uint32_t)Hv;
    o.p.k_dim = (uint32_t)dk, o.p.v_dim = (uint32_t)dv;
    if (!gdn_params(a, &o.p) || !(x[3] = read_array(c, a[3], 0, 0)) || !has_shape(x[3], 2, gate) ||
        !(x[4] = read_array(c, a[4], 0, 0)) || !has_shape(x[4], 2, gate) || !read3(c, a[13], 0, T, Hv, dv, &x[10]))
        return NULL;
    if (!read_opt(c, a[5], 0, 0, &x[5]) || !read_opt(c, a[6], 0, 0, &x[6]) || !read_opt(c, a[14], 0, 0, &x[11]) ||
        !read_opt(c, a[10], 0, 0, &x[7]) || !read_opt(c, a[12], 0, 0, &x[8]) || !read_opt(c, a[11], 0, 1, &x[9]) ||
        !read_opt(c, a[18], 0, 1, &x[13]))
        return NULL;
    const host_array *st = x[9];
    if ((st && (st->nd != 4 || st->shape[1] != Hv || st->shape[2] != dk || st->shape[3] != dv)) || T == 0)
        return NULL;
    if (out == Py_None && !(out = alloc_like(c, a[0], T, Hv, dv, 3)))
        return NULL;
    if (!read3(c, out, 1, T, Hv, dv, &x[12]) || !x[12])
        return NULL;
    for (int i = 0; i < 14; i++)
        o.arr[i] = x[i];
    return finish(c, gdn_build, gdn_invoke, &o, result_of(out));
}

static PyObject *host_gated_delta_rule(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    (void)self;
    host_call c;
    call_init(&c);
    return done(&c, n == 19 && g.gated_delta_rule ? gdn_call(&c, args) : NULL);
}

/* ---- the module ---- */

static int set_ref(PyObject **slot, PyObject *o)
{
    Py_XINCREF(o);
    Py_XSETREF(*slot, o);
    return 1;
}

/* init((wrap, view_strided, free, rope, repeat_heads, attn_prologue, causal_conv1d, gated_delta_rule),
 *      (cpu_context, cuda_context, set_device, check, empty_like, append_row), ndarray type or None):
 * function addresses (0: the library lacks it; the first three are required) and the runtime's callbacks. */
static PyObject *host_init(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *fns, *cbs, *ndarray;
    void *p[8];
    if (!PyArg_ParseTuple(args, "O!O!O", &PyTuple_Type, &fns, &PyTuple_Type, &cbs, &ndarray))
        return NULL;
    if (PyTuple_GET_SIZE(fns) != 8 || PyTuple_GET_SIZE(cbs) != 6) {
        PyErr_SetString(PyExc_ValueError, "lmk._host.init: 8 function addresses and 6 callbacks expected");
        return NULL;
    }
    for (int i = 0; i < 8; i++) {
        p[i] = PyLong_AsVoidPtr(PyTuple_GET_ITEM(fns, i));
        if (PyErr_Occurred())
            return NULL;
    }
    if (!p[0] || !p[1] || !p[2]) {
        PyErr_SetString(PyExc_ValueError, "lmk._host.init: lmk_buffer_wrap, _view_strided and _free are required");
        return NULL;
    }
    g.wrap = (wrap_fn)p[0], g.view_strided = (view_fn)p[1], g.free = (free_fn)p[2], g.rope = (rope_fn)p[3];
    g.repeat_heads = (repeat_fn)p[4], g.attn_prologue = (prologue_fn)p[5], g.causal_conv1d = (conv_fn)p[6];
    g.gated_delta_rule = (gdn_fn)p[7];
    PyObject **slots[6] = {&g.cpu_context, &g.cuda_context, &g.set_device, &g.check, &g.empty_like, &g.append_row};
    for (int i = 0; i < 6; i++)
        set_ref(slots[i], PyTuple_GET_ITEM(cbs, i));
    set_ref(&g.ndarray, ndarray == Py_None ? NULL : ndarray);
    Py_CLEAR(g.cpu);
    Py_RETURN_NONE;
}

/* set_torch(torch.Tensor, torch.nn.Parameter, {torch dtype: lmk_dtype}): torch tensors take this path. */
static PyObject *host_set_torch(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *tensor, *parameter, *dtypes;
    if (!PyArg_ParseTuple(args, "O!O!O!", &PyType_Type, &tensor, &PyType_Type, &parameter, &PyDict_Type, &dtypes))
        return NULL;
    set_ref(&g.parameter, parameter);
    set_ref(&g.torch_dtypes, dtypes);
    set_ref(&g.tensor, tensor);
    Py_RETURN_NONE;
}

/* forget(): drops the cached CPU device and stream (a forked child opens its own). */
static PyObject *host_forget(PyObject *self, PyObject *unused)
{
    (void)self, (void)unused;
    Py_CLEAR(g.cpu);
    Py_RETURN_NONE;
}

/* stats() -> (calls this path ran, calls it handed to the Python path). */
static PyObject *host_stats(PyObject *self, PyObject *unused)
{
    (void)self, (void)unused;
    return Py_BuildValue("(KK)", g.taken, g.declined);
}

static PyMethodDef host_methods[] = {
    {"init", host_init, METH_VARARGS, "init(functions, callbacks, ndarray): binds the library and runtime"},
    {"set_torch", host_set_torch, METH_VARARGS, "set_torch(Tensor, Parameter, dtypes): takes torch tensors"},
    {"forget", host_forget, METH_NOARGS, "forget(): drops the cached CPU handles (after fork)"},
    {"stats", host_stats, METH_NOARGS, "stats() -> (taken, declined)"},
    {"rope", (PyCFunction)(void (*)(void))host_rope, METH_FASTCALL,
     "rope(q, positions, k, out, k_out, freq_factors, rope_dim, freq_base, mode, sections, pairing, freq_scale, "
     "ext_factor, attn_factor, beta_fast, beta_slow, n_ctx_orig) -> result or NotImplemented"},
    {"repeat_heads", (PyCFunction)(void (*)(void))host_repeat_heads, METH_FASTCALL,
     "repeat_heads(x, h, layout, out) -> out or NotImplemented"},
    {"attn_prologue", (PyCFunction)(void (*)(void))host_attn_prologue, METH_FASTCALL,
     "attn_prologue(q, k, positions, v, q_norm_w, k_norm_w, eps, weight_offset, slots, k_cache, v_cache, k_scale, "
     "v_scale, q_out, k_out, rope_kwargs) -> (q_out, k_out) or NotImplemented"},
    {"causal_conv1d", (PyCFunction)(void (*)(void))host_causal_conv1d, METH_FASTCALL,
     "causal_conv1d(x, weight, bias, activation, cu_seqlens, state, state_slots, out) -> out or NotImplemented"},
    {"gated_delta_rule", (PyCFunction)(void (*)(void))host_gated_delta_rule, METH_FASTCALL,
     "gated_delta_rule(q, k, v, a, b, A_log, dt_bias, heads, scale, l2norm, cu_seqlens, state, state_slots, z, "
     "norm_w, eps, weight_offset, out, workspace) -> out or NotImplemented"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef host_module = {PyModuleDef_HEAD_INIT, "lmk._host",
                                         "The compiled host path of lmk (python/lmk/_host.c).", -1, host_methods,
                                         NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__host(void)
{
    struct {
        PyObject **slot;
        const char *name;
    } names[] = {{&s_dtype, "dtype"}, {&s_element_size, "element_size"}, {&s_is_cpu, "is_cpu"},
                 {&s_is_cuda, "is_cuda"}, {&s_get_device, "get_device"}, {&s_data_ptr, "data_ptr"},
                 {&s_shape, "shape"}, {&s_stride, "stride"}, {&s_acquire, "acquire"}, {&s_release, "release"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!*names[i].slot && !(*names[i].slot = PyUnicode_InternFromString(names[i].name)))
            return NULL;
    return PyModule_Create(&host_module);
}
