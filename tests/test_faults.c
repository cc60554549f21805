/*
 * test_faults.c - regression tests for faults a hostile review found in the runtime.
 *
 *  - fork: a CPU stream created before fork() works in the child (its pool's workers do not exist
 *    there): a big op gives the parent's bits, and lmk_stream_destroy returns. A hang is caught by
 *    a 20 s timeout in the parent.
 *  - allocator hook: a hook that ignores the requested alignment makes the allocation fail with
 *    OUT_OF_MEMORY and a message that says so (nothing leaks); a hook with only one of alloc/free
 *    is refused with a message and leaves the current hook in place.
 *  - the CPU device name follows lmk_device_set_threads.
 *  - NULL-argument messages name the argument.
 *  - lmk_build_info prints the simd= field its documentation shows.
 *  - CUDA builds on a machine without a GPU: lmk_device_open(CUDA) says so in plain words.
 */
#include "harness.h"
#include "lmk.h"
#ifdef LMK_WITH_CUDA
#include "lmk_cuda.h"
#endif

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

HARNESS_DEFINE;

static bool has(const char *msg, const char *part)
{
    return strstr(msg, part) != NULL;
}

/* ---- fork ---- */

/* A rope_multi case of 1 MiB per tensor (64 tokens, 32 heads, head_dim 128, f32): well above the
 * size from which the CPU uses its pool. */
enum { F_SEQ = 64, F_HEADS = 32, F_HD = 128, F_N = F_SEQ * F_HEADS * F_HD };

typedef struct rope_case {
    lmk_buffer *in, *out, *pos;
    lmk_rope_multi_params p;
} rope_case;

static lmk_status rope_case_make(lmk_device *dev, rope_case *c)
{
    memset(c, 0, sizeof *c);
    float *in = malloc(F_N * sizeof *in);
    int32_t pos[4 * F_SEQ];
    if (!in)
        return LMK_ERR_OUT_OF_MEMORY;
    uint32_t r = 12345;
    for (size_t i = 0; i < F_N; i++) {
        r = r * 1103515245u + 12345u;
        in[i] = (float)(int32_t)r / 1073741824.0f;
    }
    for (int i = 0; i < 4 * F_SEQ; i++)
        pos[i] = 17 * i + 3;
    lmk_status st = lmk_buffer_alloc(dev, F_N * sizeof(float), LMK_F32, NULL, 0, &c->in);
    if (st == LMK_OK)
        st = lmk_buffer_alloc(dev, F_N * sizeof(float), LMK_F32, NULL, 0, &c->out);
    if (st == LMK_OK)
        st = lmk_buffer_alloc(dev, sizeof pos, LMK_I32, NULL, 0, &c->pos);
    if (st == LMK_OK)
        st = lmk_buffer_write(c->in, 0, in, F_N * sizeof(float));
    if (st == LMK_OK)
        st = lmk_buffer_write(c->pos, 0, pos, sizeof pos);
    free(in);
    c->p = (lmk_rope_multi_params){.head_dim = F_HD, .rope_dim = F_HD, .n_heads = F_HEADS, .seq_len = F_SEQ,
                                   .freq_base = 10000.0f, .mode = LMK_ROPE_IMROPE, .sections = {24, 20, 20, 0}};
    return st;
}

static void rope_case_free(rope_case *c)
{
    lmk_buffer_free(c->pos);
    lmk_buffer_free(c->out);
    lmk_buffer_free(c->in);
}

/* Runs the case on s into c->out and reads the result into host (F_N floats). */
static lmk_status rope_case_run(lmk_stream *s, rope_case *c, float *host)
{
    memset(host, 0, F_N * sizeof *host);
    lmk_status st = lmk_buffer_write(c->out, 0, host, F_N * sizeof *host);
    if (st == LMK_OK)
        st = lmk_rope_multi(s, c->in, c->out, c->pos, &c->p);
    if (st == LMK_OK)
        st = lmk_stream_sync(s);
    if (st == LMK_OK)
        st = lmk_buffer_read(c->out, 0, host, F_N * sizeof *host);
    return st;
}

/* Waits for pid at most `seconds`; returns its wait status, or -1 after killing it on timeout. */
static int wait_with_timeout(pid_t pid, double seconds)
{
    const struct timespec tick = {0, 10 * 1000 * 1000};
    for (double waited = 0; waited < seconds; waited += 0.01) {
        int ws = 0;
        const pid_t r = waitpid(pid, &ws, WNOHANG);
        if (r == pid)
            return ws;
        if (r < 0 && errno != EINTR)
            return -2;
        nanosleep(&tick, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

/* Child exit codes. */
enum { CHILD_OK = 0, CHILD_OP_FAILED = 10, CHILD_MISMATCH = 11, CHILD_NEW_STREAM_FAILED = 12 };

static const char *child_what(int code)
{
    switch (code) {
    case CHILD_OP_FAILED: return "the op failed in the child";
    case CHILD_MISMATCH: return "the child's result differs from the parent's";
    case CHILD_NEW_STREAM_FAILED: return "a stream created in the child failed";
    default: return "unexpected exit status";
    }
}

/* What the child does, by scenario. Returns its exit code. */
static int child_body(int scenario, lmk_device *dev, lmk_stream *used, lmk_stream *unused, rope_case *c,
                      const float *want)
{
    float *got = malloc(F_N * sizeof *got);
    int rc = CHILD_OK;
    if (!got)
        return CHILD_OP_FAILED;
    if (scenario == 0 || scenario == 2) {
        /* the stream the parent used, then one it never used */
        for (int k = 0; k < 2 && rc == CHILD_OK; k++) {
            lmk_stream *s = k == 0 ? used : unused;
            if (rope_case_run(s, c, got) != LMK_OK)
                rc = CHILD_OP_FAILED;
            else if (memcmp(got, want, F_N * sizeof *got) != 0)
                rc = CHILD_MISMATCH;
        }
    }
    if (scenario == 2 && rc == CHILD_OK) {
        /* a grandchild does the same on the same (twice inherited) stream */
        const pid_t pid = fork();
        if (pid == 0) {
            int grc = CHILD_OK;
            if (rope_case_run(used, c, got) != LMK_OK)
                grc = CHILD_OP_FAILED;
            else if (memcmp(got, want, F_N * sizeof *got) != 0)
                grc = CHILD_MISMATCH;
            lmk_stream_destroy(used);
            lmk_stream_destroy(unused);
            _exit(grc);
        }
        const int ws = pid > 0 ? wait_with_timeout(pid, 15.0) : -2;
        if (ws < 0 || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0)
            rc = ws >= 0 && WIFEXITED(ws) ? WEXITSTATUS(ws) : CHILD_OP_FAILED;
    }
    if (rc == CHILD_OK) {
        /* streams made in the child work too */
        lmk_stream *fresh = NULL;
        if (lmk_stream_create(dev, &fresh) != LMK_OK || rope_case_run(fresh, c, got) != LMK_OK ||
            memcmp(got, want, F_N * sizeof *got) != 0)
            rc = CHILD_NEW_STREAM_FAILED;
        lmk_stream_destroy(fresh);
    }
    free(got);
    /* scenario 1 only destroys: inherited streams, used or not, must be destroyable */
    lmk_stream_destroy(used);
    lmk_stream_destroy(unused);
    rope_case_free(c);
    lmk_device_close(dev);
    return rc;
}

static void test_fork(void)
{
    static const char *const scenario_names[] = {
        "child runs a 1 MiB op on inherited streams, then destroys them",
        "child only destroys inherited streams",
        "child and grandchild run the op on inherited streams",
    };
    for (int scenario = 0; scenario < 3; scenario++) {
        lmk_device *dev = NULL;
        lmk_stream *used = NULL, *unused = NULL;
        rope_case c;
        float *want = malloc(F_N * sizeof *want);
        if (!CHECK(want && lmk_device_open(LMK_BACKEND_CPU, 0, &dev) == LMK_OK, "open: %s", lmk_last_error()))
            return;
        lmk_device_set_threads(dev, 4);
        lmk_status st = lmk_stream_create(dev, &used);
        if (st == LMK_OK)
            st = lmk_stream_create(dev, &unused);
        if (st == LMK_OK)
            st = rope_case_make(dev, &c);
        if (st == LMK_OK)
            st = rope_case_run(used, &c, want); /* the parent's workers have run a job */
        if (!CHECK(st == LMK_OK, "fork setup: %s", lmk_last_error()))
            return;
        fflush(NULL);
        const pid_t pid = fork();
        if (pid == 0)
            _exit(child_body(scenario, dev, used, unused, &c, want));
        if (!CHECK(pid > 0, "fork failed: %s", strerror(errno)))
            return;
        const int ws = wait_with_timeout(pid, 20.0);
        if (ws == -1)
            CHECK(0, "fork: %s: the child hung (killed after 20 s)", scenario_names[scenario]);
        else if (WIFSIGNALED(ws))
            CHECK(0, "fork: %s: the child died of signal %d", scenario_names[scenario], WTERMSIG(ws));
        else
            CHECK(ws >= 0 && WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "fork: %s: %s (exit %d)", scenario_names[scenario],
                  child_what(ws >= 0 && WIFEXITED(ws) ? WEXITSTATUS(ws) : -1),
                  ws >= 0 && WIFEXITED(ws) ? WEXITSTATUS(ws) : -1);
        /* the parent's pool still works after the fork */
        float *again = malloc(F_N * sizeof *again);
        st = rope_case_run(used, &c, again);
        CHECK(st == LMK_OK && memcmp(again, want, F_N * sizeof *again) == 0,
              "fork: the parent's stream after the fork: %s", st == LMK_OK ? "result differs" : lmk_last_error());
        free(again);
        free(want);
        lmk_stream_destroy(used);
        lmk_stream_destroy(unused);
        rope_case_free(&c);
        lmk_device_close(dev);
    }
}

/* ---- allocator hook ---- */

static struct {
    long calls, frees, live;
    void *last_returned; /* what the misaligning hook last handed out */
} g_hook;

/* Ignores the alignment: hands out a pointer 16 bytes past a 64-byte boundary. */
static void *misaligned_alloc(size_t size, size_t alignment, void *user)
{
    (void)alignment, (void)user;
    g_hook.calls++;
    unsigned char *base = NULL;
    if (posix_memalign((void **)&base, 64, size + 64) != 0)
        return NULL;
    g_hook.live++;
    g_hook.last_returned = base + 16;
    return base + 16;
}

static void misaligned_free(void *p, void *user)
{
    (void)user;
    g_hook.frees++;
    g_hook.live--;
    unsigned char *base = (unsigned char *)p - 16;
    free(base);
}

static void *counting_alloc(size_t size, size_t alignment, void *user)
{
    (void)user;
    void *p = NULL;
    g_hook.calls++;
    if (posix_memalign(&p, alignment < sizeof(void *) ? sizeof(void *) : alignment, size ? size : 1) != 0)
        return NULL;
    g_hook.live++;
    return p;
}

static void counting_free(void *p, void *user)
{
    (void)user;
    g_hook.frees++;
    g_hook.live--;
    free(p);
}

static void *other_alloc(size_t size, size_t alignment, void *user)
{
    (void)size, (void)alignment, (void)user;
    return NULL;
}

static void other_free(void *p, void *user)
{
    (void)p, (void)user;
}

static void test_allocator(void)
{
    /* A hook that ignores the alignment: the 64-byte-aligned CPU buffer must not be handed out. */
    memset(&g_hook, 0, sizeof g_hook);
    lmk_set_allocator(&(lmk_allocator){misaligned_alloc, misaligned_free, NULL});
    lmk_device *dev = NULL;
    lmk_status st = lmk_device_open(LMK_BACKEND_CPU, 0, &dev); /* 16-byte alignment: fine */
    if (CHECK(st == LMK_OK, "open with a 16-byte-aligning hook: %s", lmk_last_error())) {
        lmk_buffer *b = NULL;
        lmk_clear_error();
        st = lmk_buffer_alloc(dev, 4096, LMK_F32, NULL, 0, &b);
        const char *msg = lmk_last_error();
        CHECK(st == LMK_ERR_OUT_OF_MEMORY && b == NULL, "misaligned hook: lmk_buffer_alloc returned %s (data %p)",
              lmk_status_name(st), b ? lmk_buffer_data(b) : NULL);
        CHECK(has(msg, "lmk_buffer_alloc") && has(msg, "allocator hook") && has(msg, "not aligned to 64 bytes"),
              "misaligned hook: message \"%s\" should name lmk_buffer_alloc, the allocator hook and the 64-byte "
              "alignment", msg);
        lmk_buffer_free(b);
        /* the message does not stick to later, unrelated failures */
        lmk_stream *s = NULL;
        st = lmk_stream_create(NULL, &s);
        CHECK(!has(lmk_last_error(), "allocator hook"), "a later failure's message mentions the hook: \"%s\"",
              lmk_last_error());
        lmk_device_close(dev);
    }
    CHECK(g_hook.live == 0, "misaligned hook: %ld allocations leaked (the misaligned one must be freed)",
          g_hook.live);
    lmk_set_allocator(NULL);

    /* Only one of alloc/free: refused with a message, the current hook stays. */
    memset(&g_hook, 0, sizeof g_hook);
    lmk_set_allocator(&(lmk_allocator){counting_alloc, counting_free, NULL});
    static const lmk_allocator halves[2] = {{other_alloc, NULL, NULL}, {NULL, other_free, NULL}};
    for (int k = 0; k < 2; k++) {
        lmk_clear_error();
        lmk_set_allocator(&halves[k]);
        CHECK(has(lmk_last_error(), "lmk_set_allocator") && has(lmk_last_error(), "both"),
              "a hook with only %s set: message \"%s\"", k ? "free" : "alloc", lmk_last_error());
        const long before = g_hook.calls;
        dev = NULL;
        st = lmk_device_open(LMK_BACKEND_CPU, 0, &dev);
        CHECK(st == LMK_OK && g_hook.calls > before,
              "a hook with only %s set replaced the current hook (open: %s, current hook calls %ld -> %ld)",
              k ? "free" : "alloc", lmk_status_name(st), before, g_hook.calls);
        lmk_device_close(dev);
    }
    CHECK(g_hook.live == 0, "counting hook: %ld allocations leaked", g_hook.live);
    /* {NULL, NULL} and NULL restore the default, without a message */
    lmk_clear_error();
    lmk_set_allocator(&(lmk_allocator){NULL, NULL, NULL});
    const long before = g_hook.calls;
    dev = NULL;
    st = lmk_device_open(LMK_BACKEND_CPU, 0, &dev);
    CHECK(st == LMK_OK && g_hook.calls == before && lmk_last_error()[0] == '\0',
          "{NULL, NULL} should restore malloc/free silently (calls %ld -> %ld, message \"%s\")", before, g_hook.calls,
          lmk_last_error());
    lmk_device_close(dev);
    lmk_set_allocator(NULL);
}

/* ---- device name, NULL messages, build info ---- */

static void test_device_name(void)
{
    lmk_device *dev = NULL;
    if (!CHECK(lmk_device_open(LMK_BACKEND_CPU, 0, &dev) == LMK_OK, "open: %s", lmk_last_error()))
        return;
    const char *name = lmk_device_name(dev);
    lmk_device_set_threads(dev, 3);
    CHECK(has(lmk_device_name(dev), "(3 threads, "), "after lmk_device_set_threads(3) the name is \"%s\"",
          lmk_device_name(dev));
    lmk_device_set_threads(dev, 1);
    CHECK(has(lmk_device_name(dev), "(1 thread, "), "after lmk_device_set_threads(1) the name is \"%s\"",
          lmk_device_name(dev));
    CHECK(name == lmk_device_name(dev), "the name pointer changed at lmk_device_set_threads");
    lmk_device_close(dev);
}

static void test_null_messages(void)
{
    lmk_device *dev = NULL;
    if (!CHECK(lmk_device_open(LMK_BACKEND_CPU, 0, &dev) == LMK_OK, "open: %s", lmk_last_error()))
        return;
    lmk_stream *s = NULL;
    lmk_status st = lmk_stream_create(NULL, &s);
    CHECK(st == LMK_ERR_INVALID_ARGUMENT && has(lmk_last_error(), "lmk_stream_create: dev must not be NULL") &&
              !has(lmk_last_error(), "out"),
          "lmk_stream_create(NULL, &s): \"%s\"", lmk_last_error());
    st = lmk_stream_create(dev, NULL);
    CHECK(st == LMK_ERR_INVALID_ARGUMENT && has(lmk_last_error(), "lmk_stream_create: out must not be NULL") &&
              !has(lmk_last_error(), "dev"),
          "lmk_stream_create(dev, NULL): \"%s\"", lmk_last_error());
    st = lmk_device_open(LMK_BACKEND_CPU, 0, NULL);
    CHECK(st == LMK_ERR_INVALID_ARGUMENT && has(lmk_last_error(), "lmk_device_open: out must not be NULL"),
          "lmk_device_open(cpu, 0, NULL): \"%s\"", lmk_last_error());
    st = lmk_device_set_threads(NULL, 2);
    CHECK(st == LMK_ERR_INVALID_ARGUMENT && has(lmk_last_error(), "lmk_device_set_threads: dev must not be NULL"),
          "lmk_device_set_threads(NULL, 2): \"%s\"", lmk_last_error());
    st = lmk_stream_sync(NULL);
    CHECK(st == LMK_ERR_INVALID_ARGUMENT && has(lmk_last_error(), "lmk_stream_sync: ") &&
              has(lmk_last_error(), "must not be NULL"),
          "lmk_stream_sync(NULL): \"%s\"", lmk_last_error());
#ifdef LMK_WITH_CUDA
    st = lmk_stream_wrap_cuda(NULL, 0, &s);
    CHECK(st == LMK_ERR_INVALID_ARGUMENT && has(lmk_last_error(), "lmk_stream_wrap_cuda: dev must not be NULL") &&
              !has(lmk_last_error(), "out"),
          "lmk_stream_wrap_cuda(NULL, 0, &s): \"%s\"", lmk_last_error());
    st = lmk_stream_wrap_cuda(dev, 0, NULL);
    CHECK(st == LMK_ERR_INVALID_ARGUMENT && has(lmk_last_error(), "lmk_stream_wrap_cuda: out must not be NULL") &&
              !has(lmk_last_error(), "dev"),
          "lmk_stream_wrap_cuda(dev, 0, NULL): \"%s\"", lmk_last_error());
#endif
    lmk_device_close(dev);
}

static void test_build_info(void)
{
    const char *info = lmk_build_info();
    const char *simd = strstr(info, "simd=");
    CHECK(simd && (!strncmp(simd + 5, "scalar", 6) || !strncmp(simd + 5, "avx2", 4) || !strncmp(simd + 5, "avx512", 6)),
          "lmk_build_info() \"%s\" has no simd=<level> field", info);
    /* the level it reports is the one an uncapped CPU device uses */
    lmk_device *dev = NULL;
    const char *cap = getenv("LMK_CPU_ISA");
    if (!cap && simd && lmk_device_open(LMK_BACKEND_CPU, 0, &dev) == LMK_OK) {
        char level[16] = "";
        sscanf(simd + 5, "%15[a-z0-9]", level);
        char want[24];
        snprintf(want, sizeof want, ", %s)", level);
        CHECK(has(lmk_device_name(dev), want), "build info simd=%s, but the CPU device is \"%s\"", level,
              lmk_device_name(dev));
        lmk_device_close(dev);
    }
}

static void test_cuda_no_gpu(void)
{
#ifdef LMK_WITH_CUDA
    if (lmk_device_count(LMK_BACKEND_CUDA) > 0) {
        SKIP("cuda without a GPU: this machine has a GPU");
        return;
    }
    lmk_device *dev = NULL;
    const lmk_status st = lmk_device_open(LMK_BACKEND_CUDA, 0, &dev);
    CHECK(st == LMK_ERR_NOT_FOUND && has(lmk_last_error(), "lmk_device_open: no NVIDIA GPU") &&
              has(lmk_last_error(), "(CUDA: "),
          "lmk_device_open(CUDA) without a GPU: %s \"%s\"", lmk_status_name(st), lmk_last_error());
    lmk_device_close(dev);
#else
    SKIP("cuda without a GPU: this build has no CUDA backend");
#endif
}

int main(void)
{
    test_fork();
    test_allocator();
    test_device_name();
    test_null_messages();
    test_build_info();
    test_cuda_no_gpu();
    return harness_summary();
}
