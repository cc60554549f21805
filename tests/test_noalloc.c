/*
 * test_noalloc.c - an op call performs no heap allocation (lmk.h: "performs no heap allocation").
 *
 * The seed allocated three small parameter buffers per rope call and needed a cache to hide it;
 * lmk passes parameters by value and promises no allocation at all inside an op call. Every op of
 * the registry (tst_ops) is called on its contract cases (TST_CASE_CONTRACT in src/ops/<op>/case.c),
 * and on the calls it must reject, while two independent counters watch for an allocation:
 *  - an lmk_allocator hook, which sees every allocation the library makes on purpose;
 *  - malloc, calloc, realloc, free, posix_memalign, aligned_alloc, memalign and valloc defined in
 *    this program (forwarding to glibc's __libc_* functions), which see every allocation made by
 *    anything in the process: the library, its worker threads, the C library, the CUDA runtime.
 * Both count only while a flag is set (from any thread). Each counter is first shown to work by
 * catching the allocations of setup (device, stream, buffers), so a zero during the op calls means
 * something. Under AddressSanitizer/ThreadSanitizer, which own malloc, the interposed counter is
 * skipped with a visible SKIP line and only the hook counts.
 */
#include "common.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

HARNESS_DEFINE;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define NO_INTERPOSE 1
#endif
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#undef NO_INTERPOSE
#define NO_INTERPOSE 1
#endif
#endif

static atomic_int g_counting;
static atomic_long g_sys_allocs; /* interposed allocation calls while counting */
static atomic_long g_hook_allocs;

/* ---- the interposed allocator ---- */

#ifndef NO_INTERPOSE
extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t n);
extern void __libc_free(void *p);
extern void *__libc_memalign(size_t alignment, size_t n);
extern void *__libc_valloc(size_t n);

static inline void count_sys(void)
{
    if (atomic_load_explicit(&g_counting, memory_order_relaxed))
        atomic_fetch_add_explicit(&g_sys_allocs, 1, memory_order_relaxed);
}

void *malloc(size_t n)
{
    count_sys();
    return __libc_malloc(n);
}

void *calloc(size_t n, size_t size)
{
    count_sys();
    return __libc_calloc(n, size);
}

void *realloc(void *p, size_t n)
{
    count_sys();
    return __libc_realloc(p, n);
}

void free(void *p)
{
    if (p)
        count_sys(); /* a free inside an op means an allocation somewhere near it */
    __libc_free(p);
}

int posix_memalign(void **out, size_t alignment, size_t n)
{
    count_sys();
    if (alignment % sizeof(void *) != 0 || (alignment & (alignment - 1)) != 0)
        return EINVAL;
    void *p = __libc_memalign(alignment, n);
    if (!p)
        return ENOMEM;
    *out = p;
    return 0;
}

void *aligned_alloc(size_t alignment, size_t n)
{
    count_sys();
    return __libc_memalign(alignment, n);
}

void *memalign(size_t alignment, size_t n)
{
    count_sys();
    return __libc_memalign(alignment, n);
}

void *valloc(size_t n)
{
    count_sys();
    return __libc_valloc(n);
}
#endif

/* ---- the library's allocator hook ---- */

static void *hook_alloc(size_t size, size_t alignment, void *user)
{
    (void)user;
    if (atomic_load_explicit(&g_counting, memory_order_relaxed))
        atomic_fetch_add_explicit(&g_hook_allocs, 1, memory_order_relaxed);
    void *p = NULL;
    if (alignment < sizeof(void *))
        alignment = sizeof(void *);
    return posix_memalign(&p, alignment, size ? size : 1) == 0 ? p : NULL;
}

static void hook_free(void *p, void *user)
{
    (void)user;
    free(p);
}

static void count_start(void)
{
    atomic_store(&g_sys_allocs, 0);
    atomic_store(&g_hook_allocs, 0);
    atomic_store(&g_counting, 1);
}

static void count_stop(long *sys, long *hook)
{
    atomic_store(&g_counting, 0);
    *sys = atomic_load(&g_sys_allocs);
    *hook = atomic_load(&g_hook_allocs);
}

/* ---- one round: setup under the counters, then op calls under the counters ---- */

#define MAX_INST 64

/* Every contract case of every op (tst_ops), made on one device. */
typedef struct setup {
    lmk_device *dev;
    lmk_stream *s;
    tst_inst *in[MAX_INST];
    int n;
} setup;

static void teardown(setup *u)
{
    for (int i = 0; i < u->n; i++)
        tst_inst_free(u->in[i]);
    lmk_stream_destroy(u->s);
    lmk_device_close(u->dev);
    memset(u, 0, sizeof *u);
}

static bool make_setup(setup *u, lmk_backend backend, uint64_t seed)
{
    memset(u, 0, sizeof *u);
    if (lmk_device_open(backend, 0, &u->dev) != LMK_OK || lmk_stream_create(u->dev, &u->s) != LMK_OK)
        return false;
    for (int o = 0; o < tst_op_count; o++)
        for (int i = 0; i < tst_ops[o]->n_cases(); i++) {
            const tst_case c = tst_op_case(tst_ops[o], i);
            if (!(c.flags & TST_CASE_CONTRACT) || u->n == MAX_INST)
                continue;
            if (tst_inst_make(&c, u->dev, tst_seed_mix(seed, (uint64_t)o, (uint64_t)i), 0, NULL, &u->in[u->n]) != LMK_OK)
                return false;
            u->n++;
        }
    return true;
}

/* Allocations made by one op's calls: its runs, then the calls it must reject. */
typedef struct op_counts {
    long sys[2], hook[2];
    int calls, unsupported;
    lmk_status st;          /* the first failing status of a call that should pass */
    char failed[TST_CASE_NAME + 64];
} op_counts;

static void run_op(setup *u, const tst_op *op, op_counts *c)
{
    memset(c, 0, sizeof *c);
    count_start();
    for (int i = 0; i < u->n; i++) {
        if (u->in[i]->c.op != op)
            continue;
        const lmk_status st = tst_inst_run(u->in[i], u->s);
        c->calls++;
        c->unsupported += st == LMK_ERR_UNSUPPORTED;
        if (st != LMK_OK && st != LMK_ERR_UNSUPPORTED && c->st == LMK_OK) {
            c->st = st;
            snprintf(c->failed, sizeof c->failed, "%s", u->in[i]->c.name);
        }
    }
    count_stop(&c->sys[0], &c->hook[0]);
    lmk_stream_sync(u->s);

    /* Rejections format a message: that must not allocate either. */
    count_start();
    for (int i = 0; i < u->n; i++) {
        if (u->in[i]->c.op != op)
            continue;
        for (int k = 0; k < op->n_invalid; k++) {
            const char *want;
            const lmk_status st = op->invalid(u->in[i], u->s, k, &want);
            if (st != LMK_ERR_INVALID_ARGUMENT && c->st == LMK_OK) {
                c->st = LMK_ERR_UNSUPPORTED; /* marks "a bad call was accepted" */
                snprintf(c->failed, sizeof c->failed, "invalid call %d of %s", k, u->in[i]->c.name);
            }
        }
    }
    count_stop(&c->sys[1], &c->hook[1]);
}

/* One op's calls on a round's setup: zero allocations, every call through (CUDA: the second time). */
static void check_op(setup *u, const tst_op *op, lmk_backend backend, const char *bname, const char *how,
                     bool with_hook)
{
    static const char *const what[2] = {"calls", "rejected calls"};
    op_counts c;
    run_op(u, op, &c);
    if (backend == LMK_BACKEND_CUDA) {
        /* The CUDA driver may load a module lazily at a kernel's first launch (outside lmk's
         * control): report the first calls, then hold the second round to zero. */
        for (int i = 0; i < 2; i++)
            if (c.sys[i] || c.hook[i])
                printf("note [%s]: first %s %s made %ld allocations (%ld through the hook)\n", bname, op->name,
                       what[i], c.sys[i], c.hook[i]);
        for (int i = 0; i < 2; i++)
            CHECK(c.hook[i] == 0, "[%s] first %s %s allocated %ld times through the lmk allocator hook %s", bname,
                  op->name, what[i], c.hook[i], how);
        run_op(u, op, &c);
    }
    CHECK(c.calls > 0, "[%s] %s has no contract case (TST_CASE_CONTRACT in its case.c)", bname, op->name);
    CHECK(c.st == LMK_OK, "[%s] %s: %s (%s): %s", bname, op->name, c.failed, lmk_status_name(c.st), lmk_last_error());
    if (c.unsupported)
        SKIP("[%s] %s: %d of %d contract cases are not supported on this backend (LMK_ERR_UNSUPPORTED); their "
             "validation was still counted", bname, op->name, c.unsupported, c.calls);
    for (int i = 0; i < 2; i++) {
        if (with_hook)
            CHECK(c.hook[i] == 0, "[%s] %s %s allocated %ld times through the lmk allocator hook", bname, op->name,
                  what[i], c.hook[i]);
#ifndef NO_INTERPOSE
        CHECK(c.sys[i] == 0, "[%s] %s %s made %ld malloc/free-family calls (%s)", bname, op->name, what[i], c.sys[i],
              how);
#endif
    }
    printf("[%s] %s: %d calls and %d rejected calls made %ld/%ld allocations (%ld/%ld through the hook)\n", bname,
           op->name, c.calls, c.calls * op->n_invalid, c.sys[0], c.sys[1], c.hook[0], c.hook[1]);
}

static void round_for(lmk_backend backend, const char *bname, bool with_hook)
{
    const char *how = with_hook ? "with the allocator hook" : "with the default allocator";
    static const lmk_allocator counting = {hook_alloc, hook_free, NULL};
    if (with_hook)
        lmk_set_allocator(&counting);

    setup u;
    long sys_setup = 0, hook_setup = 0;
    const uint64_t seed = tst_case_seed();
    count_start();
    const bool ok = make_setup(&u, backend, seed);
    count_stop(&sys_setup, &hook_setup);
    if (!CHECK(ok, "[%s] setup %s: %s", bname, how, lmk_last_error())) {
        teardown(&u);
        lmk_set_allocator(NULL);
        return;
    }
    /* The counters can fail: they saw setup allocate. */
    if (with_hook)
        CHECK(hook_setup > 0, "[%s] the allocator hook saw no allocation during setup (device, stream, buffers)",
              bname);
#ifndef NO_INTERPOSE
    CHECK(sys_setup > 0, "[%s] the interposed malloc saw no allocation during setup %s", bname, how);
#endif
    printf("[%s] %s: setup of %d contract cases made %ld allocations (%ld through the hook)\n", bname, how, u.n,
           sys_setup, hook_setup);
    for (int o = 0; o < tst_op_count; o++)
        check_op(&u, tst_ops[o], backend, bname, how, with_hook);
    teardown(&u);
    lmk_set_allocator(NULL);
}

int main(void)
{
    tst_program_seed();
    const double t0 = tst_now();
#ifdef NO_INTERPOSE
    SKIP("interposed malloc counter: a sanitizer owns malloc in this build; only the allocator hook counts");
#else
    /* The interposer is live: a direct call is counted. */
    void *(*volatile m)(size_t) = malloc;
    count_start();
    void *x = m(24);
    long sys, hook;
    count_stop(&sys, &hook);
    free(x);
    CHECK(sys == 1 && hook == 0, "the interposed malloc counted %ld calls for one malloc", sys);
#endif
    round_for(LMK_BACKEND_CPU, "cpu", true);
    round_for(LMK_BACKEND_CPU, "cpu", false);
    if (lmk_device_count(LMK_BACKEND_CUDA) > 0) {
        round_for(LMK_BACKEND_CUDA, "cuda:0", true);
        round_for(LMK_BACKEND_CUDA, "cuda:0", false);
    } else {
        SKIP("cuda: no usable CUDA device (lmk_device_count(LMK_BACKEND_CUDA) == 0); CUDA cases not run");
    }
    printf("test_noalloc: %.2f s\n", tst_now() - t0);
    return harness_summary();
}
