/*
 * test_cuda_graph.c - lmk ops inside CUDA graphs, CUDA stream interop, and asynchronous faults.
 *
 * 1. Graph replay. Every contract case of every op of the registry (tst_ops: real model layers,
 *    dense and strided operands, in place and not) is captured into one CUDA graph, on a stream
 *    from lmk_stream_create and again on a caller's cudaStream_t wrapped with lmk_stream_wrap_cuda
 *    over caller-owned (cudaMalloc) memory. The graph must hold exactly one kernel per call (the
 *    descriptors say how many each launches: Q+K rope is one). It is replayed several times;
 *    between replays every input is redrawn and every output poisoned again (through
 *    cudaMemcpyAsync on the stream, or lmk_buffer_write after a sync), and every replay is checked
 *    against the float64 references on the host copies (each descriptor's verification: rope f32
 *    within 1e-5, bf16 within one ulp (+1e-6), copies bit-exact, nothing written outside the
 *    outputs).
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
enum { REPLAYS = 4, MAX_INST = 64 };

/* Regions of caller memory: cudaMalloc, wrapped with lmk_buffer_wrap. */
static lmk_status wrap_alloc(lmk_device *dev, size_t len, lmk_buffer **out, void **own, void *user)
{
    (void)user;
    const cudaError_t e = cudaMalloc(own, len ? len : 1);
    if (e != cudaSuccess) {
        *own = NULL;
        return tst_fail(LMK_ERR_OUT_OF_MEMORY, "cudaMalloc(%zu): %s", len, cudaGetErrorString(e));
    }
    const lmk_status st = lmk_buffer_wrap(dev, *own, len, LMK_U8, NULL, 0, out);
    if (st != LMK_OK) {
        (void)cudaFree(*own);
        *own = NULL;
    }
    return st;
}

static void wrap_free(void *own, void *user)
{
    (void)user;
    (void)cudaFree(own);
}

static const tst_alloc_hook k_wrap_hook = {wrap_alloc, wrap_free, NULL};

/* A layer step: every contract case the device supports, made on it. */
typedef struct step {
    tst_inst *in[MAX_INST];
    int n, launches;
} step;

static void step_free(step *st)
{
    for (int i = 0; i < st->n; i++)
        tst_inst_free(st->in[i]);
    st->n = 0;
}

/* Makes every contract case on dev; those the device does not support (a run returns
 * LMK_ERR_UNSUPPORTED) are left out with a SKIP line. */
static bool step_make(lmk_device *dev, lmk_stream *s, bool wrap, uint64_t seed, step *st)
{
    memset(st, 0, sizeof *st);
    for (int o = 0; o < tst_op_count; o++)
        for (int i = 0; i < tst_ops[o]->n_cases() && st->n < MAX_INST; i++) {
            const tst_case c = tst_op_case(tst_ops[o], i);
            if (!(c.flags & TST_CASE_CONTRACT))
                continue;
            tst_inst *in = NULL;
            lmk_status e = tst_inst_make(&c, dev, tst_seed_mix(seed, (uint64_t)o, (uint64_t)i), 0,
                                         wrap ? &k_wrap_hook : NULL, &in);
            if (!TST_REQUIRE(e == LMK_OK, "%s: make: %s: %s", c.name, lmk_status_name(e), lmk_last_error()))
                return false;
            e = tst_inst_run(in, s); /* outside the capture: does this device run it at all? */
            if (e == LMK_OK)
                e = lmk_stream_sync(s);
            if (e == LMK_ERR_UNSUPPORTED) {
                SKIP("%s: not supported on CUDA (LMK_ERR_UNSUPPORTED); left out of the graph", c.name);
                tst_inst_free(in);
                continue;
            }
            if (!TST_REQUIRE(e == LMK_OK, "%s: run: %s: %s", c.name, lmk_status_name(e), lmk_last_error())) {
                tst_inst_free(in);
                return false;
            }
            st->in[st->n++] = in;
            st->launches += c.op->launches;
        }
    return TST_REQUIRE(st->n > 0, "no contract case to capture");
}

/* New inputs and poisoned outputs for one replay: through the stream (cudaMemcpyAsync and
 * cudaMemsetAsync, ordered before the replay) or through lmk_buffer_write, the stream being idle. */
static bool step_refill(step *st, cudaStream_t h, bool async, uint64_t seed)
{
    for (int i = 0; i < st->n; i++) {
        tst_inst *in = st->in[i];
        if (!async) {
            const lmk_status e = tst_inst_reset(in, tst_seed_mix(seed, (uint64_t)i, 1));
            if (!TST_REQUIRE(e == LMK_OK, "reset: %s", lmk_last_error()))
                return false;
            continue;
        }
        tst_inst_refill(in, tst_seed_mix(seed, (uint64_t)i, 2));
        for (int r = 0; r < in->mem.n_r; r++) {
            const tst_region *g = &in->mem.r[r];
            void *dst = lmk_buffer_data(g->buf);
            const cudaError_t e = g->host ? cudaMemcpyAsync(dst, g->host, g->len, cudaMemcpyHostToDevice, h)
                                          : cudaMemsetAsync(dst, (int)TST_POISON, g->len, h);
            if (!TST_REQUIRE(e == cudaSuccess, "cudaMemcpyAsync/cudaMemsetAsync: %s", cudaGetErrorString(e)))
                return false;
        }
    }
    return true;
}

/* Captures the step into a graph on s, replays it REPLAYS times with fresh inputs, and checks every
 * case of each replay. mode: the capture's cudaStreamCaptureMode (PyTorch's torch.cuda.graph captures
 * in the global mode, in which any call CUDA deems unsafe, from any thread, invalidates the capture).
 * rewrap: the ops run on a second wrapper of s's stream made after the capture began, as the Python
 * package wraps a stream it first sees inside a capture (torch.cuda.graph's own capture stream). */
static void graph_case(lmk_device *dev, lmk_stream *s, bool wrap, enum cudaStreamCaptureMode mode, bool rewrap,
                       const char *name)
{
    const uint64_t seed = tst_case_seed();
    const cudaStream_t h = lmk_stream_cuda_handle(s);
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    step st;
    bool ok = step_make(dev, s, wrap, seed, &st);

    if (ok) {
        cudaError_t e = cudaStreamBeginCapture(h, mode);
        ok = TST_REQUIRE(e == cudaSuccess, "%s: cudaStreamBeginCapture: %s", name, cudaGetErrorString(e));
        if (ok) {
            lmk_stream *run_s = s, *w2 = NULL;
            lmk_status r = LMK_OK;
            if (rewrap) {
                r = lmk_stream_wrap_cuda(dev, h, &w2);
                run_s = w2;
            }
            for (int i = 0; i < st.n && r == LMK_OK; i++)
                r = tst_inst_run(st.in[i], run_s);
            e = cudaStreamEndCapture(h, &graph);
            if (w2)
                lmk_stream_destroy(w2);
            ok = TST_REQUIRE(r == LMK_OK, "%s: an op failed during capture: %s: %s", name, lmk_status_name(r),
                             lmk_last_error()) &&
                 TST_REQUIRE(e == cudaSuccess, "%s: cudaStreamEndCapture: %s", name, cudaGetErrorString(e));
        }
    }
    if (ok) {
        size_t n_nodes = 0;
        cudaError_t e = cudaGraphGetNodes(graph, NULL, &n_nodes);
        ok = TST_REQUIRE(e == cudaSuccess && n_nodes == (size_t)st.launches,
                         "%s: the graph holds %zu nodes, want %d (the launches of %d calls)", name, n_nodes,
                         st.launches, st.n);
        if (ok) {
            e = cudaGraphInstantiate(&exec, graph, 0);
            ok = TST_REQUIRE(e == cudaSuccess, "%s: cudaGraphInstantiate: %s", name, cudaGetErrorString(e));
        }
    }
    for (int rep = 0; rep < REPLAYS && ok; rep++) {
        ok = step_refill(&st, h, rep % 2 == 0, tst_seed_mix(seed, (uint64_t)rep, 7));
        if (!ok)
            break;
        const cudaError_t e = cudaGraphLaunch(exec, h);
        const lmk_status r = lmk_stream_sync(s);
        ok = TST_REQUIRE(e == cudaSuccess, "%s: cudaGraphLaunch: %s", name, cudaGetErrorString(e)) &&
             TST_REQUIRE(r == LMK_OK, "%s: lmk_stream_sync: %s", name, lmk_last_error());
        for (int i = 0; i < st.n && ok; i++) {
            tst_result res;
            ok = TST_REQUIRE(tst_inst_verify(st.in[i], &res), "%s replay %d: %s: %s", name, rep, st.in[i]->c.name,
                             res.msg);
        }
    }
    if (ok)
        printf("%s: %d calls of %d ops, %d kernels, %d replays verified\n", name, st.n, tst_op_count, st.launches,
               REPLAYS);
    if (ok)
        TST_PASS(name);
    if (exec)
        (void)cudaGraphExecDestroy(exec);
    if (graph)
        (void)cudaGraphDestroy(graph);
    step_free(&st);
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
        graph_case(dev, s, false, cudaStreamCaptureModeThreadLocal, false,
                   "graph of a layer step on an lmk stream, lmk buffers");
    lmk_stream_destroy(s);

    cudaStream_t cs = NULL;
    if (TST_REQUIRE(cudaStreamCreate(&cs) == cudaSuccess, "cudaStreamCreate")) {
        lmk_stream *w = NULL;
        st = lmk_stream_wrap_cuda(dev, cs, &w);
        if (CHECK(st == LMK_OK, "lmk_stream_wrap_cuda: %s", lmk_last_error()))
            graph_case(dev, w, true, cudaStreamCaptureModeThreadLocal, false,
                       "graph of a layer step on a wrapped cudaStream_t, caller memory");
        if (st == LMK_OK)
            graph_case(dev, w, true, cudaStreamCaptureModeGlobal, true,
                       "graph of a layer step captured in the global mode, on a stream wrapped during the capture");
        lmk_stream_destroy(w);
        (void)cudaStreamDestroy(cs);
    }

    interop_cases(dev);
    lmk_device_close(dev);
    return harness_summary();
}
