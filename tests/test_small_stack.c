/*
 * test_small_stack.c - ops called from threads with small stacks: lmk.h's stack bound.
 *
 * lmk.h ("Conventions") promises that a CPU op call uses at most STACK_BOUND_KIB of the calling
 * thread's stack, since the calling thread runs share 0 of the work. Engines call ops from threads
 * they create themselves (fiber and coroutine pools, language runtimes), whose stacks may be
 * 32-64 KiB; the 0.1 rope kept a 25 KB table on that stack and crashed on a 32 KiB one.
 *
 * Each op call below (rope q+k in f32 and bf16 on a Qwen3.5 shape and a rope_dim 256 shape,
 * repeat_tiled, attn_prologue on three cases of its table (Qwen3-8B, Qwen3.5 with an f8 cache, and
 * bf16 rows of 32 elements: other build steps at -O0), and a rejected rope call, whose message
 * is formatted on the same stack) runs on 1-thread and 2-thread streams, twice:
 *  1. on a fresh thread whose 256 KiB stack is painted with a byte pattern: the deepest byte
 *     changed below the calling frame is the call's stack use, which must be <= the bound;
 *  2. on a thread created with a 32 KiB stack plus what the system keeps at its top (static TLS,
 *     measured on the painted stacks; pthread_attr_setstacksize): an overflow hits the
 *     guard page, the SIGSEGV handler (on an alternate signal stack) jumps back and the test
 *     reports the failure and stops, since the stream is then in an unknown state.
 * After each run the outputs (poisoned before) are checked against the float64 reference (rope;
 * attn_prologue through its case descriptor) or the tiled copy (repeat).
 */
#include "common.h"

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

HARNESS_DEFINE;

#define STACK_BOUND_KIB 16   /* lmk.h, "Conventions" */
#define SMALL_STACK (32 << 10)
#define PAINTED_STACK (256 << 10)
#define PAINT 0xA5u
#define ALT_STACK (64 << 10) /* the SIGSEGV handler's stack */
#define T_TOKENS 64          /* enough bytes that a 2-thread stream splits the work */

/* One op call and the check of its outputs. */
typedef struct op_job {
    char name[96];
    lmk_stream *s;
    lmk_status (*call)(struct op_job *);
    bool (*check)(struct op_job *, char *msg, size_t n);
    lmk_status want;         /* the call's expected status */
    const char *want_msg;    /* rejected calls: a part of the message */
    char err[256];           /* lmk_last_error() of the thread that made the call */
    /* rope: q and k in and out (host memory wrapped as CPU buffers), positions, parameters */
    lmk_rope_params p;
    lmk_dtype dtype;
    void *in[2], *out[2];
    size_t bytes[2];
    int32_t *pos;
    lmk_buffer *b_in[2], *b_out[2], *b_pos;
    /* repeat */
    lmk_repeat_tiled_params rp;
    /* attn_prologue: a case of its descriptor, made on the device */
    tst_inst *inst;
} op_job;

/* ---- running a call on a given stack ---- */

typedef struct stack_run {
    op_job *job;
    void *alt;               /* alternate signal stack */
    uintptr_t top;           /* address of a local of the thread's frame, just above the call */
    lmk_status st;
    int crashed;
} stack_run;

static _Thread_local sigjmp_buf *t_escape;

static void on_segv(int sig, siginfo_t *si, void *uc)
{
    (void)si, (void)uc;
    if (t_escape)
        siglongjmp(*t_escape, 1);
    signal(sig, SIG_DFL); /* not ours: crash as usual */
    raise(sig);
}

static void *run_thread(void *arg)
{
    stack_run *r = arg;
    const stack_t ss = {.ss_sp = r->alt, .ss_size = ALT_STACK};
    sigaltstack(&ss, NULL);
    sigjmp_buf escape;
    if (sigsetjmp(escape, 1)) {
        r->crashed = 1;
        t_escape = NULL;
        return NULL;
    }
    t_escape = &escape;
    volatile char mark = 0;
    r->top = (uintptr_t)&mark;
    r->st = r->job->call(r->job);
    t_escape = NULL;
    snprintf(r->job->err, sizeof r->job->err, "%s", r->st == LMK_OK ? "" : lmk_last_error());
    const stack_t off = {.ss_flags = SS_DISABLE};
    sigaltstack(&off, NULL);
    return NULL;
}

/* Runs job on a new thread: on `stack` (painted first) when given, else on a stack of `size`
 * bytes that pthread allocates. Returns false when the thread could not be made. */
static bool run_on_thread(stack_run *r, void *stack, size_t size)
{
    pthread_attr_t attr;
    pthread_t th;
    pthread_attr_init(&attr);
    const int e = stack ? pthread_attr_setstack(&attr, stack, size) : pthread_attr_setstacksize(&attr, size);
    const bool ok = e == 0 && pthread_create(&th, &attr, run_thread, r) == 0 && pthread_join(th, NULL) == 0;
    pthread_attr_destroy(&attr);
    return ok;
}

/* Bytes of a thread's stack that are not the thread's to use: glibc places the static TLS block
 * (large when the CUDA runtime is linked statically) and the thread descriptor at the top of
 * every thread's stack, and thread start-up takes a few frames. Measured on the painted stacks. */
static size_t g_stack_overhead;

/* The call's stack use on a painted stack, in bytes; SIZE_MAX on failure. */
static size_t measure(op_job *j, stack_run *r)
{
    unsigned char *stack = aligned_alloc(4096, PAINTED_STACK);
    if (!stack)
        return SIZE_MAX;
    memset(stack, (int)PAINT, PAINTED_STACK);
    size_t used = SIZE_MAX;
    *r = (stack_run){.job = j, .alt = r->alt};
    if (run_on_thread(r, stack, PAINTED_STACK) && !r->crashed) {
        size_t lo = 0;
        while (lo < PAINTED_STACK && stack[lo] == PAINT)
            lo++;
        used = r->top > (uintptr_t)(stack + lo) ? (size_t)(r->top - (uintptr_t)(stack + lo)) : 0;
        const size_t overhead = (size_t)((uintptr_t)(stack + PAINTED_STACK) - r->top);
        if (overhead > g_stack_overhead && overhead < PAINTED_STACK)
            g_stack_overhead = overhead;
    }
    free(stack);
    return used;
}

/* ---- the calls ---- */

static lmk_status call_rope(op_job *j)
{
    return lmk_rope(j->s, j->b_in[0], j->b_in[1], j->b_pos, NULL, j->b_out[0], j->b_out[1], &j->p);
}

static lmk_status call_repeat(op_job *j)
{
    return lmk_repeat_tiled(j->s, j->b_in[0], j->b_out[0], &j->rp);
}

static lmk_status call_inst(op_job *j)
{
    return tst_inst_run(j->inst, j->s);
}

static bool check_inst(op_job *j, char *msg, size_t n)
{
    tst_result res = {0};
    const bool ok = lmk_stream_sync(j->s) == LMK_OK && tst_inst_verify(j->inst, &res);
    snprintf(msg, n, "%s", res.msg);
    return ok;
}

static bool check_rope(op_job *j, char *msg, size_t n)
{
    lmk_tensor3 t[4];
    const size_t es = lmk_dtype_size(j->dtype), T = j->p.seq_len, hd = j->p.head_dim;
    t[0] = t[1] = tst_dense3(j->in[0], T, j->p.n_heads, hd, es);
    t[2] = t[3] = tst_dense3(j->in[1], T, j->p.n_k_heads, hd, es);
    const lmk_rope_args a = lmk_rope_args_for(&j->p, j->dtype, t, true, j->pos, LMK_I32, NULL);
    const void *got[2] = {j->out[0], j->out[1]};
    return tst_rope_check(&a, got, 1e-5, msg, n);
}

static bool check_repeat(op_job *j, char *msg, size_t n)
{
    const size_t row = (size_t)j->rp.k * lmk_dtype_size(j->dtype);
    for (size_t t = 0; t < j->rp.seq; t++)
        for (size_t h = 0; h < j->rp.h; h++) {
            const unsigned char *src = (const unsigned char *)j->in[0] + (t * j->rp.hg + h % j->rp.hg) * row;
            if (memcmp((const unsigned char *)j->out[0] + (t * j->rp.h + h) * row, src, row) != 0) {
                snprintf(msg, n, "token %zu head %zu differs from source head %zu", t, h, h % (size_t)j->rp.hg);
                return false;
            }
        }
    snprintf(msg, n, "bit-exact");
    return true;
}

/* A rejected call writes nothing (its outputs still hold the poison) and names the rule. */
static bool check_rejected(op_job *j, char *msg, size_t n)
{
    for (int i = 0; i < 2; i++)
        if (j->out[i] && tst_find_not(j->out[i], 0, j->bytes[i], TST_POISON) >= 0) {
            snprintf(msg, n, "a rejected call wrote output %d", i);
            return false;
        }
    snprintf(msg, n, "message \"%s\"", j->err);
    return strstr(j->err, j->want_msg) != NULL;
}

/* ---- making the jobs ---- */

static void *host(size_t bytes)
{
    return aligned_alloc(64, (bytes + 63) / 64 * 64);
}

static bool wrap(lmk_device *dev, lmk_dtype dt, void *mem, size_t bytes, lmk_buffer **b)
{
    return TST_REQUIRE(mem && lmk_buffer_wrap(dev, mem, bytes, dt, NULL, 0, b) == LMK_OK, "wrap: %s",
                       lmk_last_error());
}

static bool make_rope(op_job *j, lmk_device *dev, tst_rng *rng, const tst_attn_shape *sh, lmk_dtype dt)
{
    j->p = (lmk_rope_params){.head_dim = sh->head_dim, .rope_dim = sh->rope_dim, .n_heads = sh->n_q_heads,
                             .seq_len = T_TOKENS, .freq_base = sh->freq_base, .mode = sh->mode,
                             .n_k_heads = sh->n_k_heads};
    memcpy(j->p.sections, sh->sections, sizeof j->p.sections);
    j->dtype = dt;
    j->call = call_rope, j->check = check_rope, j->want = LMK_OK;
    snprintf(j->name, sizeof j->name, "rope q+k %s hd=%u rd=%u %s", sh->model, sh->head_dim, sh->rope_dim,
             lmk_dtype_name(dt));
    const uint32_t heads[2] = {sh->n_q_heads, sh->n_k_heads};
    for (int i = 0; i < 2; i++) {
        j->bytes[i] = (size_t)T_TOKENS * heads[i] * sh->head_dim * lmk_dtype_size(dt);
        j->in[i] = host(j->bytes[i]), j->out[i] = host(j->bytes[i]);
        if (!wrap(dev, dt, j->in[i], j->bytes[i], &j->b_in[i]) || !wrap(dev, dt, j->out[i], j->bytes[i], &j->b_out[i]))
            return false;
        tst_fill_float(rng, dt, j->in[i], j->bytes[i] / lmk_dtype_size(dt), -2, 2);
    }
    /* T positions for NORMAL and NEOX, 4*T for the multi-axis modes */
    const bool multi = sh->mode == LMK_ROPE_MROPE || sh->mode == LMK_ROPE_IMROPE || sh->mode == LMK_ROPE_VISION;
    j->pos = host(4 * T_TOKENS * sizeof *j->pos);
    if (!wrap(dev, LMK_I32, j->pos, (multi ? 4 : 1) * T_TOKENS * sizeof *j->pos, &j->b_pos))
        return false;
    tst_positions_random(rng, j->pos, T_TOKENS, 0, 1 << 20);
    return true;
}

static bool make_repeat(op_job *j, lmk_device *dev, tst_rng *rng, lmk_dtype dt)
{
    j->rp = (lmk_repeat_tiled_params){.seq = T_TOKENS, .hg = 16, .h = 48, .k = 128};
    j->dtype = dt;
    j->call = call_repeat, j->check = check_repeat, j->want = LMK_OK;
    snprintf(j->name, sizeof j->name, "repeat_tiled T=%d 16->48 k=128 %s", T_TOKENS, lmk_dtype_name(dt));
    const size_t es = lmk_dtype_size(dt);
    j->bytes[0] = (size_t)T_TOKENS * 48 * 128 * es;
    const size_t src_bytes = (size_t)T_TOKENS * 16 * 128 * es;
    j->in[0] = host(src_bytes), j->out[0] = host(j->bytes[0]);
    if (!wrap(dev, dt, j->in[0], src_bytes, &j->b_in[0]) || !wrap(dev, dt, j->out[0], j->bytes[0], &j->b_out[0]))
        return false;
    tst_fill_bytes(rng, j->in[0], src_bytes);
    return true;
}

/* The case of op `name`'s table whose name holds `model`, at T tokens. */
static bool make_inst(op_job *j, lmk_device *dev, const char *name, const char *model, uint32_t T)
{
    const tst_op *op = tst_op_find(name);
    for (int i = 0; op && i < op->n_cases(); i++) {
        const tst_case c = tst_op_case(op, i);
        if (c.T != T || !strstr(c.name, model))
            continue;
        j->call = call_inst, j->check = check_inst, j->want = LMK_OK;
        snprintf(j->name, sizeof j->name, "%s T=%u %s // %s", name, T, lmk_dtype_name(c.dtype),
                 strncmp(model, "// ", 3) ? model : model + 3);
        return TST_REQUIRE(tst_inst_make(&c, dev, 1, 0, NULL, &j->inst) == LMK_OK, "%s: %s", j->name,
                           lmk_last_error());
    }
    return TST_REQUIRE(0, "%s: no case %s at T=%u in the table", name, model, T);
}

static void free_job(op_job *j)
{
    if (j->inst)
        tst_inst_free(j->inst);
    for (int i = 0; i < 2; i++) {
        lmk_buffer_free(j->b_in[i]);
        lmk_buffer_free(j->b_out[i]);
        free(j->in[i]);
        free(j->out[i]);
    }
    lmk_buffer_free(j->b_pos);
    free(j->pos);
}

/* ---- one job on both stacks ---- */

static void poison_outputs(op_job *j)
{
    if (j->inst) /* fresh inputs, outputs poisoned */
        (void)TST_REQUIRE(tst_inst_reset(j->inst, 1) == LMK_OK, "%s: reset: %s", j->name, lmk_last_error());
    for (int i = 0; i < 2; i++)
        if (j->out[i])
            tst_poison(j->out[i], j->bytes[i], TST_POISON);
}

/* Returns false when the call overflowed the small stack (the caller stops the test). */
static bool run_job(op_job *j, int n_threads, void *alt)
{
    char msg[512] = "no thread";
    stack_run r = {.alt = alt};
    poison_outputs(j);
    const size_t used = measure(j, &r);
    const bool ran = used != SIZE_MAX && r.st == j->want && j->check(j, msg, sizeof msg);
    CHECK(ran && used > 0 && used <= (size_t)STACK_BOUND_KIB << 10,
          "%s, %d thread(s), painted stack: used %zu bytes (bound %d KiB), status %s, %s", j->name, n_threads, used,
          STACK_BOUND_KIB, lmk_status_name(r.st), msg);
    printf("  %-58s %dt  stack used %5zu bytes\n", j->name, n_threads, used);

#ifndef __OPTIMIZE__
    /* At -O0 every vector temporary has its own stack slot (rope's frames are about twice as deep)
     * and the thread's static TLS is carved from the same 32 KiB: only the bound above applies. */
    SKIP("%s, %d thread(s): no run on a 32 KiB stack in an unoptimized build", j->name, n_threads);
    return true;
#endif
    /* 32 KiB for the caller's own frames and the op, on top of what the system keeps there. */
    size_t small = SMALL_STACK + (g_stack_overhead + 4095) / 4096 * 4096;
    if (small < (size_t)PTHREAD_STACK_MIN)
        small = (size_t)PTHREAD_STACK_MIN;
    poison_outputs(j);
    r = (stack_run){.job = j, .alt = alt};
    /* Some systems cannot make a 32 KiB thread at all (a static TLS block as large as the CUDA
     * runtime's is carved out of the stack; gVisor's limits): then 64 KiB (musl's default is 128),
     * else a visible skip; the painted-stack measurement above has checked the bound either way. */
    if (!run_on_thread(&r, NULL, small)) {
        small = 2 * small;
        poison_outputs(j);
        r = (stack_run){.job = j, .alt = alt};
        if (!run_on_thread(&r, NULL, small)) {
            SKIP("%s: this system makes no thread with a %zu- or %zu-byte stack", j->name, small / 2, small);
            return true;
        }
    }
    if (r.crashed) {
        TST_FAIL("%s, %d thread(s): overflowed a %zu-byte thread stack (SIGSEGV)", j->name, n_threads, small);
        return false;
    }
    snprintf(msg, sizeof msg, "not checked");
    CHECK(r.st == j->want && j->check(j, msg, sizeof msg), "%s, %d thread(s), %zu-byte stack: status %s, %s",
          j->name, n_threads, small, lmk_status_name(r.st), msg);
    return true;
}

/* The jobs of one stream: rope on both shapes and dtypes, repeat, attn_prologue, the Gated DeltaNet
 * ops, a rejected rope call. */
static int make_jobs(op_job *jobs, lmk_device *dev, tst_rng *rng)
{
    static const tst_attn_shape shapes[2] = {
        {"qwen3.5-27B", 24, 4, 256, 64, 1e7f, LMK_ROPE_IMROPE, {11, 11, 10, 0}},
        {"rope_dim 256", 8, 2, 256, 256, 1e6f, LMK_ROPE_NEOX, {0, 0, 0, 0}},
    };
    static const lmk_dtype dts[2] = {LMK_F32, LMK_BF16};
    int n = 0;
    for (int s = 0; s < 2; s++)
        for (int d = 0; d < 2; d++)
            if (!make_rope(&jobs[n++], dev, rng, &shapes[s], dts[d]))
                return n;
    if (!make_repeat(&jobs[n++], dev, rng, LMK_F32))
        return n;
    if (!make_inst(&jobs[n++], dev, "attn_prologue", "Qwen3-8B", 37) ||
        !make_inst(&jobs[n++], dev, "attn_prologue", "Qwen3.5/3.6-27B, f8 cache", 37) ||
        !make_inst(&jobs[n++], dev, "attn_prologue", "edge: head_dim 32", 37))
        return n;
    /* The Gated DeltaNet ops: a prompt and a decode batch of each (their tiles are on the stack). */
    if (!make_inst(&jobs[n++], dev, "causal_conv1d", "// Qwen3.5-27B prompt, out of place", 256) ||
        !make_inst(&jobs[n++], dev, "causal_conv1d", "// Qwen3-Next decode batch", 128) ||
        !make_inst(&jobs[n++], dev, "gated_delta_rule", "// Qwen3.5-27B prompt", 37) ||
        !make_inst(&jobs[n++], dev, "gated_delta_rule", "// Qwen3.5-27B decode batch", 64) ||
        !make_inst(&jobs[n++], dev, "gated_delta_rule", "// edge: the largest head dims", 3))
        return n;
    op_job *bad = &jobs[n++]; /* as the first rope job, with freq_base NaN (rule R5) */
    if (!make_rope(bad, dev, rng, &shapes[0], LMK_F32))
        return n;
    bad->p.freq_base = NAN;
    bad->want = LMK_ERR_INVALID_ARGUMENT, bad->want_msg = "freq_base", bad->check = check_rejected;
    snprintf(bad->name, sizeof bad->name, "rope rejected (freq_base NaN)");
    return n;
}

int main(void)
{
    tst_rng rng = tst_rng_make(tst_program_seed());
    struct sigaction sa = {.sa_sigaction = on_segv, .sa_flags = SA_SIGINFO | SA_ONSTACK};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, NULL);
    void *alt = malloc(ALT_STACK);
    lmk_device *dev = NULL;
    bool alive = TST_REQUIRE(alt && lmk_device_open(LMK_BACKEND_CPU, 0, &dev) == LMK_OK, "cpu device: %s",
                             lmk_last_error());
    for (int nt = 1; nt <= 2 && alive; nt++) {
        lmk_stream *s = NULL;
        if (!TST_REQUIRE(lmk_device_set_threads(dev, nt) == LMK_OK && lmk_stream_create(dev, &s) == LMK_OK,
                         "stream with %d threads: %s", nt, lmk_last_error()))
            break;
        op_job jobs[18];
        memset(jobs, 0, sizeof jobs);
        const int n = make_jobs(jobs, dev, &rng);
        for (int i = 0; i < n && alive; i++) {
            jobs[i].s = s;
            alive = run_job(&jobs[i], nt, alt);
        }
        if (!alive) /* the stream may be mid-call on another thread: leave it */
            break;
        for (int i = 0; i < n; i++)
            free_job(&jobs[i]);
        lmk_stream_destroy(s);
    }
    const int rc = harness_summary();
    if (!alive)
        _exit(rc);
    lmk_device_close(dev);
    free(alt);
    return rc;
}
