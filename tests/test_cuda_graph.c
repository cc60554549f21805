/*
 * test_cuda_graph.c - lmk ops inside CUDA graphs, CUDA stream interop, and asynchronous faults.
 *
 * 1. Graph replay. The ops of one Qwen3.5-27B layer step (rope Q+K f32 out of place, rope Q+K bf16
 *    in place, repeat_tiled 16->48 f32 and 16->32 bf16) are captured into one CUDA graph, on a
 *    stream from lmk_stream_create and again on a caller's cudaStream_t wrapped with
 *    lmk_stream_wrap_cuda over caller-owned (cudaMalloc) memory. The graph must hold exactly four
 *    kernels (Q+K is one launch). It is replayed several times; between replays the positions are
 *    rewritten (cudaMemcpyAsync on the stream, or lmk_buffer_write after a sync), the repeat
 *    sources are redrawn and the outputs poisoned, and every replay is checked against the float64
 *    references on host copies: rope f32 within 1e-5, bf16 within one ulp (+1e-6), copied elements
 *    and repeat outputs bit-exact.
 * 2. Interop contracts: the handle round trip, a borrowed stream outliving its lmk handle, and
 *    lmk_stream_wrap_cuda's argument errors.
 * 3. Faults. An op reading freed device memory, and one reading an address nothing maps, must come
 *    back as LMK_ERR_DEVICE with CUDA's text, at the call or at lmk_stream_sync. Such a fault is
 *    sticky (it poisons the process's CUDA context), so each runs in a child process forked before
 *    this process touches CUDA (CUDA does not survive fork). LMK_TEST_SKIP_FAULTS=1 skips them
 *    (for compute-sanitizer runs, which would report the planted faults).
 * Without a GPU every case prints a SKIP line.
 */
#include "common.h"
#include "lmk_cuda.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

HARNESS_DEFINE;

enum { CHILD_PASS = 0, CHILD_FAIL = 1, CHILD_SKIP = 77 };

/* The Qwen3.5/3.6-27B full-attention layer: 24 q heads, 4 k heads, head_dim 256, rope_dim 64. */
static const lmk_rope_multi_params k_rope27 = {
    .head_dim = 256, .rope_dim = 64, .n_heads = 24, .seq_len = 0, .freq_base = 1e7f,
    .mode = LMK_ROPE_IMROPE, .sections = {11, 11, 10, 0}, .pairing = LMK_ROPE_PAIR_HALF_ROPE,
};
enum { N_K_HEADS = 4, REPLAYS = 4 };

/* One device buffer and its host copy. `own` is caller memory (cudaMalloc) when the buffer wraps it. */
typedef struct tbuf {
    lmk_buffer *b;
    void *host;
    size_t bytes;
    void *own;
} tbuf;

static bool tbuf_make(lmk_device *dev, tbuf *t, lmk_dtype dtype, size_t bytes, bool wrap)
{
    memset(t, 0, sizeof *t);
    t->bytes = bytes;
    t->host = malloc(bytes);
    if (!TST_REQUIRE(t->host != NULL, "out of host memory"))
        return false;
    lmk_status st;
    if (wrap) {
        const cudaError_t e = cudaMalloc(&t->own, bytes);
        if (!TST_REQUIRE(e == cudaSuccess, "cudaMalloc(%zu): %s", bytes, cudaGetErrorString(e)))
            return false;
        st = lmk_buffer_wrap(dev, t->own, bytes, dtype, NULL, 0, &t->b);
    } else {
        st = lmk_buffer_alloc(dev, bytes, dtype, NULL, 0, &t->b);
    }
    return TST_REQUIRE(st == LMK_OK, "buffer of %zu bytes: %s: %s", bytes, lmk_status_name(st), lmk_last_error());
}

static void tbuf_free(tbuf *t)
{
    lmk_buffer_free(t->b);
    if (t->own)
        (void)cudaFree(t->own);
    free(t->host);
    memset(t, 0, sizeof *t);
}

static bool tbuf_upload(tbuf *t)
{
    const lmk_status st = lmk_buffer_write(t->b, 0, t->host, t->bytes);
    return TST_REQUIRE(st == LMK_OK, "lmk_buffer_write: %s: %s", lmk_status_name(st), lmk_last_error());
}

static void *tbuf_download(const tbuf *t)
{
    void *p = malloc(t->bytes);
    if (!TST_REQUIRE(p != NULL, "out of host memory"))
        return NULL;
    const lmk_status st = lmk_buffer_read(t->b, 0, p, t->bytes);
    if (!TST_REQUIRE(st == LMK_OK, "lmk_buffer_read: %s: %s", lmk_status_name(st), lmk_last_error())) {
        free(p);
        return NULL;
    }
    return p;
}

/* The buffers of one layer step. */
enum { QF_IN, QF_OUT, KF_IN, KF_OUT, QB, KB, POS, R1_SRC, R1_DST, R2_SRC, R2_DST, NBUF };

typedef struct layer {
    uint32_t seq;
    lmk_rope_multi_params pf, pb;
    lmk_repeat_tiled_params r1, r2;
    tbuf t[NBUF];
    void *qb0, *kb0; /* the bf16 in-place inputs, restored before every replay */
} layer;

static bool layer_make(lmk_device *dev, layer *L, uint32_t seq, bool wrap, tst_rng *rng)
{
    memset(L, 0, sizeof *L);
    L->seq = seq;
    L->pf = k_rope27;
    L->pf.seq_len = seq;
    L->pb = L->pf;
    L->r1 = (lmk_repeat_tiled_params){seq, 16, 48, 128};
    L->r2 = (lmk_repeat_tiled_params){seq, 16, 32, 128};
    const size_t q = (size_t)seq * 24 * 256, k = (size_t)seq * N_K_HEADS * 256, g = (size_t)seq * 16 * 128;
    const struct { lmk_dtype dt; size_t n; } spec[NBUF] = {
        [QF_IN] = {LMK_F32, q}, [QF_OUT] = {LMK_F32, q}, [KF_IN] = {LMK_F32, k}, [KF_OUT] = {LMK_F32, k},
        [QB] = {LMK_BF16, q}, [KB] = {LMK_BF16, k}, [POS] = {LMK_I32, 4 * (size_t)seq},
        [R1_SRC] = {LMK_F32, g}, [R1_DST] = {LMK_F32, 3 * g}, [R2_SRC] = {LMK_BF16, g}, [R2_DST] = {LMK_BF16, 2 * g},
    };
    for (int i = 0; i < NBUF; i++)
        if (!tbuf_make(dev, &L->t[i], spec[i].dt, spec[i].n * lmk_dtype_size(spec[i].dt), wrap))
            return false;
    tst_fill_float(rng, LMK_F32, L->t[QF_IN].host, q, -2, 2);
    tst_fill_float(rng, LMK_F32, L->t[KF_IN].host, k, -2, 2);
    tst_fill_float(rng, LMK_BF16, L->t[QB].host, q, -2, 2);
    tst_fill_float(rng, LMK_BF16, L->t[KB].host, k, -2, 2);
    L->qb0 = malloc(L->t[QB].bytes);
    L->kb0 = malloc(L->t[KB].bytes);
    if (!TST_REQUIRE(L->qb0 && L->kb0, "out of host memory"))
        return false;
    memcpy(L->qb0, L->t[QB].host, L->t[QB].bytes);
    memcpy(L->kb0, L->t[KB].host, L->t[KB].bytes);
    return tbuf_upload(&L->t[QF_IN]) && tbuf_upload(&L->t[KF_IN]);
}

static void layer_free(layer *L)
{
    for (int i = 0; i < NBUF; i++)
        tbuf_free(&L->t[i]);
    free(L->qb0);
    free(L->kb0);
}

/* The four ops of the step: what the graph captures. */
static lmk_status layer_ops(lmk_stream *s, layer *L)
{
    tbuf *t = L->t;
    lmk_status st = lmk_rope_multi_qk(s, t[QF_IN].b, t[QF_OUT].b, t[KF_IN].b, t[KF_OUT].b, t[POS].b, &L->pf, N_K_HEADS);
    if (st == LMK_OK)
        st = lmk_rope_multi_qk(s, t[QB].b, t[QB].b, t[KB].b, t[KB].b, t[POS].b, &L->pb, N_K_HEADS);
    if (st == LMK_OK)
        st = lmk_repeat_tiled(s, t[R1_SRC].b, t[R1_DST].b, &L->r1);
    if (st == LMK_OK)
        st = lmk_repeat_tiled(s, t[R2_SRC].b, t[R2_DST].b, &L->r2);
    return st;
}

/* Checks one rope launch's outputs (got) against the float64 reference on the host inputs. */
static bool check_rope(const char *what, const layer *L, lmk_dtype dt, const void *q_in, const void *k_in,
                       const void *q_got, const void *k_got)
{
    const lmk_rope_multi_params *p = dt == LMK_F32 ? &L->pf : &L->pb;
    const lmk_rope_args a = tst_rope_host_args(p, N_K_HEADS, 2, dt, q_in, k_in, L->t[POS].host);
    const void *got[2] = {q_got, k_got};
    char msg[512];
    const bool ok = tst_rope_check(&a, got, 1e-5, msg, sizeof msg);
    return TST_REQUIRE(ok, "%s: %s", what, msg);
}

static bool check_repeat(const char *what, const tbuf *src, const tbuf *dst_t, const void *got,
                         const lmk_repeat_tiled_params *p, size_t es)
{
    void *want = malloc(dst_t->bytes);
    if (!TST_REQUIRE(want != NULL, "out of host memory"))
        return false;
    const lmk_repeat_args a = tst_repeat_host_args(src->host, want, p->seq, p->hg, p->h, p->k, es);
    lmk_ref_repeat(&a);
    const long long d = tst_bits_diff(got, want, dst_t->bytes);
    free(want);
    return TST_REQUIRE(d < 0, "%s: output differs from the reference at byte %lld", what, d);
}

/* Captures the step into a graph on s, replays it REPLAYS times with fresh positions and repeat
 * sources, and checks each replay. */
static void graph_case(lmk_device *dev, lmk_stream *s, bool wrap, const char *name)
{
    tst_rng rng = tst_rng_make(tst_case_seed());
    layer L;
    const uint32_t seq = 37; /* odd, and more than one block of tokens per op */
    const cudaStream_t h = lmk_stream_cuda_handle(s);
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    bool ok = layer_make(dev, &L, seq, wrap, &rng);

    /* Capture. Nothing is uploaded to positions yet: the graph must read them at replay time. */
    if (ok) {
        cudaError_t e = cudaStreamBeginCapture(h, cudaStreamCaptureModeThreadLocal);
        ok = TST_REQUIRE(e == cudaSuccess, "%s: cudaStreamBeginCapture: %s", name, cudaGetErrorString(e));
        if (ok) {
            const lmk_status st = layer_ops(s, &L);
            e = cudaStreamEndCapture(h, &graph);
            ok = TST_REQUIRE(st == LMK_OK, "%s: an op failed during capture: %s: %s", name, lmk_status_name(st),
                             lmk_last_error()) &&
                 TST_REQUIRE(e == cudaSuccess, "%s: cudaStreamEndCapture: %s", name, cudaGetErrorString(e));
        }
    }
    if (ok) {
        size_t n_nodes = 0;
        cudaError_t e = cudaGraphGetNodes(graph, NULL, &n_nodes);
        ok = TST_REQUIRE(e == cudaSuccess && n_nodes == 4,
                         "%s: the graph holds %zu nodes, want 4 (one kernel per op, Q+K fused)", name, n_nodes);
        if (ok) {
            e = cudaGraphInstantiate(&exec, graph, 0);
            ok = TST_REQUIRE(e == cudaSuccess, "%s: cudaGraphInstantiate: %s", name, cudaGetErrorString(e));
        }
    }

    for (int rep = 0; rep < REPLAYS && ok; rep++) {
        tbuf *t = L.t;
        /* Fresh positions up to |2^20| with distinct axes, fresh repeat sources, poisoned outputs,
         * and the bf16 in-place tensors restored to their inputs. */
        tst_positions_random(&rng, t[POS].host, seq, -(1 << 20), 1 << 20);
        tst_fill_bytes(&rng, t[R1_SRC].host, t[R1_SRC].bytes);
        tst_fill_bytes(&rng, t[R2_SRC].host, t[R2_SRC].bytes);
        memcpy(t[QB].host, L.qb0, t[QB].bytes);
        memcpy(t[KB].host, L.kb0, t[KB].bytes);
        const int outs[] = {QF_OUT, KF_OUT, R1_DST, R2_DST};
        for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++)
            tst_poison(t[outs[i]].host, t[outs[i]].bytes, TST_POISON);
        ok = tbuf_upload(&t[R1_SRC]) && tbuf_upload(&t[R2_SRC]) && tbuf_upload(&t[QB]) && tbuf_upload(&t[KB]) &&
             tbuf_upload(&t[QF_OUT]) && tbuf_upload(&t[KF_OUT]) && tbuf_upload(&t[R1_DST]) && tbuf_upload(&t[R2_DST]);
        if (!ok)
            break;
        cudaError_t e;
        if (rep % 2 == 0) { /* positions through the stream, ordered before the replay */
            e = cudaMemcpyAsync(lmk_buffer_data(t[POS].b), t[POS].host, t[POS].bytes, cudaMemcpyHostToDevice, h);
            ok = TST_REQUIRE(e == cudaSuccess, "%s: cudaMemcpyAsync: %s", name, cudaGetErrorString(e));
        } else { /* positions through lmk_buffer_write, the stream being idle */
            ok = tbuf_upload(&t[POS]);
        }
        if (!ok)
            break;
        e = cudaGraphLaunch(exec, h);
        const lmk_status st = lmk_stream_sync(s);
        ok = TST_REQUIRE(e == cudaSuccess, "%s: cudaGraphLaunch: %s", name, cudaGetErrorString(e)) &&
             TST_REQUIRE(st == LMK_OK, "%s: lmk_stream_sync: %s", name, lmk_last_error());
        if (!ok)
            break;

        char what[160];
        snprintf(what, sizeof what, "%s replay %d", name, rep);
        void *got[NBUF] = {0};
        const int reads[] = {QF_OUT, KF_OUT, QB, KB, R1_DST, R2_DST};
        for (size_t i = 0; i < sizeof reads / sizeof reads[0] && ok; i++)
            ok = (got[reads[i]] = tbuf_download(&t[reads[i]])) != NULL;
        ok = ok && check_rope(what, &L, LMK_F32, t[QF_IN].host, t[KF_IN].host, got[QF_OUT], got[KF_OUT]);
        ok = ok && check_rope(what, &L, LMK_BF16, L.qb0, L.kb0, got[QB], got[KB]);
        ok = ok && check_repeat(what, &t[R1_SRC], &t[R1_DST], got[R1_DST], &L.r1, 4);
        ok = ok && check_repeat(what, &t[R2_SRC], &t[R2_DST], got[R2_DST], &L.r2, 2);
        for (int i = 0; i < NBUF; i++)
            free(got[i]);
    }
    if (ok)
        TST_PASS(name);
    if (exec)
        (void)cudaGraphExecDestroy(exec);
    if (graph)
        (void)cudaGraphDestroy(graph);
    layer_free(&L);
}

static void interop_cases(lmk_device *cuda)
{
    lmk_stream *w = NULL;
    lmk_device *cpu = NULL;
    cudaStream_t cs = NULL;

    /* Argument errors. */
    lmk_status st = lmk_stream_wrap_cuda(NULL, 0, &w);
    CHECK(st == LMK_ERR_INVALID_ARGUMENT && tst_msg_has("lmk_stream_wrap_cuda", NULL),
          "wrap with a NULL device: %s: %s", lmk_status_name(st), lmk_last_error());
    st = lmk_stream_wrap_cuda(cuda, 0, NULL);
    CHECK(st == LMK_ERR_INVALID_ARGUMENT, "wrap with a NULL out: %s", lmk_status_name(st));
    if (lmk_device_open(LMK_BACKEND_CPU, 0, &cpu) == LMK_OK) {
        st = lmk_stream_wrap_cuda(cpu, 0, &w);
        CHECK(st == LMK_ERR_INVALID_ARGUMENT && tst_msg_has("not a CUDA device", NULL),
              "wrap on a CPU device: %s: %s", lmk_status_name(st), lmk_last_error());
        lmk_stream *cpu_s = NULL;
        if (lmk_stream_create(cpu, &cpu_s) == LMK_OK)
            CHECK(lmk_stream_cuda_handle(cpu_s) == 0, "lmk_stream_cuda_handle of a CPU stream is not 0");
        lmk_stream_destroy(cpu_s);
        lmk_device_close(cpu);
    }
    CHECK(lmk_stream_cuda_handle(NULL) == 0, "lmk_stream_cuda_handle(NULL) is not 0");

    /* Round trip, and a borrowed stream outlives its handle. */
    cudaError_t e = cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking);
    if (!TST_REQUIRE(e == cudaSuccess, "cudaStreamCreate: %s", cudaGetErrorString(e)))
        return;
    st = lmk_stream_wrap_cuda(cuda, cs, &w);
    if (CHECK(st == LMK_OK, "lmk_stream_wrap_cuda: %s: %s", lmk_status_name(st), lmk_last_error())) {
        CHECK(lmk_stream_cuda_handle(w) == cs && lmk_stream_device(w) == cuda, "wrapped handle round trip");
        CHECK(lmk_stream_sync(w) == LMK_OK, "sync of a wrapped stream: %s", lmk_last_error());
        lmk_stream_destroy(w);
        e = cudaStreamQuery(cs);
        CHECK(e == cudaSuccess, "the borrowed stream is unusable after lmk_stream_destroy: %s", cudaGetErrorString(e));
    }
    (void)cudaStreamDestroy(cs);

    /* The legacy default stream may be wrapped too, and ops run on it. */
    st = lmk_stream_wrap_cuda(cuda, 0, &w);
    if (CHECK(st == LMK_OK, "wrap the legacy default stream: %s: %s", lmk_status_name(st), lmk_last_error())) {
        lmk_buffer *src = NULL, *dst = NULL;
        const lmk_repeat_tiled_params p = {3, 2, 6, 5};
        uint16_t in[30], out[90], want[90];
        for (int i = 0; i < 30; i++)
            in[i] = (uint16_t)(i * 2654435761u >> 16);
        const lmk_repeat_args ra = tst_repeat_host_args(in, want, 3, 2, 6, 5, 2);
        lmk_ref_repeat(&ra);
        bool ok = lmk_buffer_alloc(cuda, sizeof in, LMK_U16, NULL, 0, &src) == LMK_OK &&
                  lmk_buffer_alloc(cuda, sizeof out, LMK_U16, NULL, 0, &dst) == LMK_OK &&
                  lmk_buffer_write(src, 0, in, sizeof in) == LMK_OK && lmk_repeat_tiled(w, src, dst, &p) == LMK_OK &&
                  lmk_stream_sync(w) == LMK_OK && lmk_buffer_read(dst, 0, out, sizeof out) == LMK_OK;
        CHECK(ok && memcmp(out, want, sizeof out) == 0, "repeat_tiled u16 on the legacy default stream: %s",
              ok ? "wrong output" : lmk_last_error());
        lmk_buffer_free(src);
        lmk_buffer_free(dst);
        lmk_stream_destroy(w);
    }
}

/* ---- faults, each in a child process ---- */

/* Runs one op whose source is `bad` (device address) and expects LMK_ERR_DEVICE with CUDA's text
 * at the call or at lmk_stream_sync, then that the context is poisoned (sticky) and that handles
 * can still be released. Returns a CHILD_* code; prints what it saw. */
static int fault_run(lmk_device *dev, void *bad, const char *what)
{
    lmk_stream *s = NULL;
    lmk_buffer *src = NULL, *dst = NULL;
    const lmk_repeat_tiled_params p = {1024, 16, 48, 128};
    const size_t src_bytes = (size_t)1024 * 16 * 128 * 4;
    int rc = CHILD_FAIL;
    if (lmk_stream_create(dev, &s) != LMK_OK || lmk_buffer_wrap(dev, bad, src_bytes, LMK_F32, NULL, 0, &src) != LMK_OK ||
        lmk_buffer_alloc(dev, 3 * src_bytes, LMK_F32, NULL, 0, &dst) != LMK_OK) {
        fprintf(stderr, "FAIL fault %s: setup: %s\n", what, lmk_last_error());
        goto out;
    }
    lmk_status st = lmk_repeat_tiled(s, src, dst, &p);
    const char *where = "the op call";
    if (st == LMK_OK) {
        st = lmk_stream_sync(s);
        where = "lmk_stream_sync";
    }
    printf("fault %s: %s returned %s: %s\n", what, where, lmk_status_name(st), lmk_last_error());
    if (st != LMK_ERR_DEVICE || !tst_msg_has("cudaError", NULL)) {
        fprintf(stderr, "FAIL fault %s: want LMK_ERR_DEVICE with CUDA's text\n", what);
        goto out;
    }
    /* Sticky: the next CUDA work of this process fails too. */
    lmk_buffer *more = NULL;
    st = lmk_buffer_alloc(dev, 4096, LMK_U8, NULL, 0, &more);
    printf("fault %s: afterwards lmk_buffer_alloc returned %s: %s\n", what, lmk_status_name(st), lmk_last_error());
    lmk_buffer_free(more);
    if (st != LMK_ERR_DEVICE) {
        fprintf(stderr, "FAIL fault %s: the context should be unusable after the fault\n", what);
        goto out;
    }
    rc = CHILD_PASS;
out:
    lmk_buffer_free(src);
    lmk_buffer_free(dst);
    lmk_stream_destroy(s);
    return rc;
}

static int fault_child(int which)
{
    if (lmk_device_count(LMK_BACKEND_CUDA) <= 0)
        return CHILD_SKIP;
    lmk_device *dev = NULL;
    if (lmk_device_open(LMK_BACKEND_CUDA, 0, &dev) != LMK_OK) {
        fprintf(stderr, "FAIL fault: open: %s\n", lmk_last_error());
        return CHILD_FAIL;
    }
    int rc;
    if (which == 0) {
        /* 256 MiB: an allocation this large gets its own mapping, which cudaFree unmaps. */
        void *p = NULL;
        if (cudaMalloc(&p, (size_t)256 << 20) != cudaSuccess || cudaFree(p) != cudaSuccess) {
            fprintf(stderr, "FAIL fault: cudaMalloc/cudaFree\n");
            rc = CHILD_FAIL;
        } else {
            rc = fault_run(dev, p, "freed device memory");
        }
    } else {
        rc = fault_run(dev, (void *)(uintptr_t)0x10000, "unmapped address 0x10000");
    }
    lmk_device_close(dev); /* must not crash on a poisoned context */
    return rc;
}

/* Forks (before the parent touches CUDA) and returns the child's CHILD_* code. */
static int run_child(int which)
{
    fflush(stdout);
    fflush(stderr);
    const pid_t pid = fork();
    if (pid < 0)
        return CHILD_FAIL;
    if (pid == 0) {
        const int rc = fault_child(which);
        fflush(stdout);
        fflush(stderr);
        _exit(rc);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
        return CHILD_FAIL;
    return WEXITSTATUS(status);
}

int main(void)
{
    tst_program_seed();

    /* Faults first, in children: this process has not initialised CUDA yet. */
    const char *skip_faults = getenv("LMK_TEST_SKIP_FAULTS");
    static const char *const fault_names[2] = {"op on freed device memory", "op on an unmapped address"};
    for (int which = 0; which < 2; which++) {
        if (skip_faults && *skip_faults && strcmp(skip_faults, "0") != 0) {
            SKIP("cuda fault case '%s': LMK_TEST_SKIP_FAULTS is set", fault_names[which]);
            continue;
        }
        const int rc = run_child(which);
        if (rc == CHILD_SKIP)
            SKIP("cuda fault case '%s': no usable GPU", fault_names[which]);
        else
            CHECK(rc == CHILD_PASS, "cuda fault case '%s' (child exit %d)", fault_names[which], rc);
    }

    if (lmk_device_count(LMK_BACKEND_CUDA) <= 0) {
        SKIP("cuda graph and interop cases: no usable GPU");
        return harness_summary();
    }
    lmk_device *dev = NULL;
    lmk_status st = lmk_device_open(LMK_BACKEND_CUDA, 0, &dev);
    if (!CHECK(st == LMK_OK, "open cuda device 0: %s: %s", lmk_status_name(st), lmk_last_error()))
        return harness_summary();
    printf("device: %s\n", lmk_device_name(dev));

    lmk_stream *s = NULL;
    st = lmk_stream_create(dev, &s);
    if (CHECK(st == LMK_OK, "lmk_stream_create: %s", lmk_last_error()))
        graph_case(dev, s, false, "graph of a layer step on an lmk stream, lmk buffers");
    lmk_stream_destroy(s);

    cudaStream_t cs = NULL;
    if (TST_REQUIRE(cudaStreamCreate(&cs) == cudaSuccess, "cudaStreamCreate")) {
        lmk_stream *w = NULL;
        st = lmk_stream_wrap_cuda(dev, cs, &w);
        if (CHECK(st == LMK_OK, "lmk_stream_wrap_cuda: %s", lmk_last_error()))
            graph_case(dev, w, true, "graph of a layer step on a wrapped cudaStream_t, caller memory");
        lmk_stream_destroy(w);
        (void)cudaStreamDestroy(cs);
    }

    interop_cases(dev);
    lmk_device_close(dev);
    return harness_summary();
}
