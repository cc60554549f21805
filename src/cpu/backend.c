/*
 * backend.c - the CPU backend's vtable: device, host memory, and streams with their thread pools.
 *
 * A stream owns a persistent pool of n_threads threads: the thread that calls an op plus
 * n_threads - 1 workers created with the stream and joined when it is destroyed. Creating threads
 * per op would cost more than a decode-sized op takes, and allocating per op is forbidden (the
 * hot-path rule), so everything a job needs lives in the pool, allocated at stream creation:
 * its scratch memory included (a block per thread for an op's tables, which would otherwise sit
 * on the calling thread's stack, and one shared block; lmk_cpu_scratch).
 * A job is published by bumping a generation counter (release; workers acquire it); waiting,
 * on either side, spins briefly and then sleeps on a condition variable. Each stream has its own
 * pool, so streams used by different threads never contend; a single stream is used by one
 * thread at a time (the API's rule).
 *
 * fork(): the child has the pool's memory but none of its workers, and the pool's mutex and
 * condition variables may be copies taken in any state. Each pool records the process it belongs
 * to; a pthread_atfork child handler refreshes the process id, so the check on the op path is a
 * load, not a system call. In a child, the first op large enough to need the workers re-creates
 * them with fresh synchronisation objects (or, if that fails, runs every later op on the calling
 * thread alone), and destroying an inherited pool joins nothing and destroys nothing it copied.
 *
 * Floating-point environment: every op's work runs under round-to-nearest with flush-to-zero and
 * denormals-are-zero off (x86 MXCSR), whatever the calling thread set: lmk_cpu_parallel switches
 * the caller's environment for the op's duration and gives it back, and workers reset theirs to
 * the default when they start (a new thread inherits its creator's). So results never depend on
 * the caller's fesetround or -ffast-math settings.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pthread_sigmask when compiled outside the build's -D_GNU_SOURCE */
#endif
#include "cpu/cpu.h"

#include <fenv.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>
#if LMK_CPU_X86
#include <cpuid.h>
#endif
#if defined(__SSE__) && (defined(__x86_64__) || defined(__i386__))
#include <xmmintrin.h>
#define LMK_HAVE_MXCSR 1
#else
#define LMK_HAVE_MXCSR 0
#endif

typedef struct cpu_device {
    lmk_cpu_isa isa;
} cpu_device;

typedef struct cpu_pool cpu_pool;

typedef struct cpu_worker {
    cpu_pool *pool;
    pthread_t thread;
    int tid;
} cpu_worker;

struct cpu_pool {
    lmk_cpu_isa isa;
    int n_threads;         /* caller + workers */
    int n_started;         /* workers actually running (rollback joins only these) */
    int n_ready;           /* under mu: workers that have reached worker_main (pool_start_workers) */
    pid_t pid;             /* the process the workers and synchronisation objects belong to */
    int sync_ok;           /* mu, wake and done are initialised (0 only in a fork child that
                              could not re-create them) */
    int solo;              /* a fork child that could not re-create the workers: every job runs
                              on the calling thread alone */
    pthread_mutex_t mu;
    pthread_cond_t wake;   /* a job was published, or quit */
    pthread_cond_t done;   /* the last worker of a job finished, or a worker started */
    atomic_ulong gen;      /* bumped once per published job (release: the job fields below) */
    atomic_int busy;       /* workers of the current job still running */
    int quit;              /* under mu */
    lmk_cpu_task task;     /* the current job, run by every thread of the pool */
    void *ctx;
    unsigned char *scratch; /* LMK_CPU_SHARED_SCRATCH bytes, then LMK_CPU_SCRATCH per thread: after
                               workers[], in the pool's allocation */
    cpu_worker workers[];  /* n_threads - 1 */
};

/* ---- ISA ---- */

static const char *isa_name(lmk_cpu_isa isa)
{
    return isa == LMK_CPU_AVX512 ? "avx512" : isa == LMK_CPU_AVX2 ? "avx2" : "scalar";
}

/* The best level both compiled in and supported by this CPU (LMK_CPU_ISA not applied). */
static lmk_cpu_isa detect_hw_isa(void)
{
    lmk_cpu_isa isa = LMK_CPU_SCALAR;
#if LMK_CPU_X86
    unsigned a, b, c, d;
    /* __builtin_cpu_supports checks that the OS saves the vector state too; F16C is read from
     * CPUID because clang's builtin does not know it (every AVX2 CPU has it, but check anyway). */
    __builtin_cpu_init();
    const int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    if (f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        isa = __builtin_cpu_supports("avx512f") ? LMK_CPU_AVX512 : LMK_CPU_AVX2;
#endif
    return isa;
}

/* "scalar", "avx2" or "avx512": the best level that is both compiled in and supported by this
 * CPU, i.e. what a CPU device uses when LMK_CPU_ISA does not cap it (lmk_build_info's simd=). */
static const char *cpu_simd_name(void)
{
    return isa_name(detect_hw_isa());
}

/* The hardware level, capped by the environment variable LMK_CPU_ISA. */
static lmk_cpu_isa detect_isa(void)
{
    lmk_cpu_isa isa = detect_hw_isa();
    const char *cap = getenv("LMK_CPU_ISA");
    if (cap) {
        lmk_cpu_isa want = isa;
        if (!strcmp(cap, "scalar"))
            want = LMK_CPU_SCALAR;
        else if (!strcmp(cap, "avx2"))
            want = LMK_CPU_AVX2;
        if (want < isa)
            isa = want;
    }
    return isa;
}

lmk_cpu_isa lmk_cpu_stream_isa(const lmk_stream *s)
{
    return ((const cpu_pool *)s->impl)->isa;
}

/* ---- device ---- */

static void cpu_name_device(lmk_device *dev);

static lmk_status cpu_device_open(lmk_device *dev, int ordinal)
{
    if (ordinal != 0)
        return lmk_fail(LMK_ERR_NOT_FOUND, "lmk_device_open: the CPU backend has one device (ordinal 0), not %d",
                        ordinal);
    cpu_device *cd = lmk_host_calloc(sizeof *cd, 0);
    if (!cd)
        return lmk_fail(LMK_ERR_OUT_OF_MEMORY, "lmk_device_open: out of host memory");
    cd->isa = detect_isa();
    dev->impl = cd;
    cpu_name_device(dev);
    return LMK_OK;
}

/* (Re)writes dev->name, "cpu (N threads, isa)", from dev->n_threads: at open and at
 * lmk_device_set_threads (the table's device_threads_changed). */
static void cpu_name_device(lmk_device *dev)
{
    const cpu_device *cd = dev->impl;
    const int n = __atomic_load_n(&dev->n_threads, __ATOMIC_RELAXED);
    char name[sizeof dev->name];
    snprintf(name, sizeof name, "cpu (%d thread%s, %s)", n, n == 1 ? "" : "s", isa_name(cd->isa));
    if (strcmp(name, dev->name) != 0) /* an unchanged name is not rewritten under a reader */
        memcpy(dev->name, name, strlen(name) + 1);
}

static void cpu_device_close(lmk_device *dev)
{
    lmk_host_free(dev->impl);
    dev->impl = NULL;
}

/* ---- memory: host memory, 64-byte aligned so streaming stores and full-line vectors apply ---- */

static lmk_status cpu_mem_alloc(lmk_device *dev, size_t n, void **out)
{
    (void)dev;
    void *p = lmk_host_calloc(n ? n : 1, 64); /* a hook may answer NULL for 0 bytes; 0 must work */
    if (!p)
        return lmk_fail(LMK_ERR_OUT_OF_MEMORY, "lmk_buffer_alloc: cannot allocate %zu bytes of host memory", n);
    *out = p;
    return LMK_OK;
}

static void cpu_mem_free(lmk_device *dev, void *p)
{
    (void)dev;
    lmk_host_free(p);
}

static lmk_status cpu_mem_copy(lmk_device *dev, void *dst, const void *src, size_t n)
{
    (void)dev;
    if (n) /* memcpy with a NULL pointer is undefined even for 0 bytes */
        memcpy(dst, src, n);
    return LMK_OK;
}

/* ---- the floating-point environment of an op ---- */

#if LMK_HAVE_MXCSR
/* MXCSR: bits 0-5 are the sticky exception flags; the rest is control (DAZ 6, masks 7-12,
 * rounding 13-14, FTZ 15). The default control is every exception masked, round to nearest. */
#define MXCSR_FLAGS 0x003Fu
#define MXCSR_DEFAULT_CONTROL 0x1F80u
#endif

typedef struct fp_saved {
#if LMK_HAVE_MXCSR
    int round;      /* fegetround: the x87 control word's mode */
    unsigned mxcsr;
#else
    fenv_t env;
#endif
} fp_saved;

/* Switches the calling thread to the default environment (round to nearest; on x86 also FTZ and
 * DAZ off and exceptions masked) and returns what fp_leave restores. On x86 it writes nothing
 * when the caller already runs under the default, the usual case: a few cycles per op. */
static inline fp_saved fp_enter(void)
{
    fp_saved sv;
#if LMK_HAVE_MXCSR
    sv.mxcsr = _mm_getcsr(); /* before fesetround, which also writes MXCSR's rounding bits */
    sv.round = fegetround(); /* the x87 control word's mode (long double and some libm code) */
    if (sv.round != FE_TONEAREST)
        fesetround(FE_TONEAREST);
    const unsigned cur = _mm_getcsr(), want = (cur & MXCSR_FLAGS) | MXCSR_DEFAULT_CONTROL;
    if (cur != want)
        _mm_setcsr(want);
#else
    fegetenv(&sv.env);
    fesetenv(FE_DFL_ENV); /* also clears flush-to-zero modes such as AArch64's FPCR.FZ */
#endif
    return sv;
}

/* Gives the caller its environment back; exception flags the op raised stay raised. */
static inline void fp_leave(const fp_saved *sv)
{
#if LMK_HAVE_MXCSR
    if (sv->round != FE_TONEAREST)
        fesetround(sv->round);
    const unsigned cur = _mm_getcsr(), want = (cur & MXCSR_FLAGS) | (sv->mxcsr & ~MXCSR_FLAGS);
    if (cur != want)
        _mm_setcsr(want);
#else
    fexcept_t raised;
    fegetexceptflag(&raised, FE_ALL_EXCEPT);
    fesetenv(&sv->env);
    fesetexceptflag(&raised, FE_ALL_EXCEPT);
#endif
}

/* ---- fork: the process a pool belongs to ---- */

static pthread_once_t g_pid_once = PTHREAD_ONCE_INIT;
static _Atomic pid_t g_pid;   /* this process; refreshed in a fork child by the atfork handler */
static int g_pid_tracked;     /* the handler is registered (else every check asks getpid) */

static void pid_after_fork(void)
{
    atomic_store_explicit(&g_pid, getpid(), memory_order_relaxed);
}

static void pid_init(void)
{
    atomic_store_explicit(&g_pid, getpid(), memory_order_relaxed);
    g_pid_tracked = pthread_atfork(NULL, NULL, pid_after_fork) == 0;
}

/* The calling process's id without a system call (once the handler is registered). */
static inline pid_t current_pid(void)
{
    return g_pid_tracked ? atomic_load_explicit(&g_pid, memory_order_relaxed) : getpid();
}

/* ---- streams: the pool ---- */

/* Waiting first spins for this many pause instructions before sleeping. Waking a sleeping thread
 * costs longer than a whole op of a few hundred KB takes (on a VM the idle vCPU must be rescheduled
 * by the host); ops of a prefill follow each other closely, so a worker that has just finished
 * usually finds the next job while still spinning. A short spin also bounds what a spinning thread
 * takes from another process that shares its core (docs/decisions.md, "A spinning-then-sleeping
 * pool per stream"). */
#define SPIN_PAUSES 256

static inline void cpu_pause(void)
{
#if LMK_CPU_X86
    _mm_pause();
#endif
}

static void *worker_main(void *arg)
{
    cpu_worker *w = arg;
    cpu_pool *p = w->pool;
    /* A new thread inherits its creator's environment (e.g. fesetround or FTZ set by the thread
     * that created the stream); a worker runs only ops, under the default one. */
    fesetenv(FE_DFL_ENV);
    pthread_mutex_lock(&p->mu);
    p->n_ready++;
    pthread_cond_signal(&p->done);
    pthread_mutex_unlock(&p->mu);
    unsigned long seen = 0;
    for (;;) {
        unsigned long g = atomic_load_explicit(&p->gen, memory_order_acquire);
        for (int i = 0; g == seen && i < SPIN_PAUSES; i++) {
            cpu_pause();
            g = atomic_load_explicit(&p->gen, memory_order_acquire);
        }
        if (g == seen) {
            /* The publisher bumps gen before taking mu to broadcast, so checking it again under mu
             * cannot miss a job. */
            pthread_mutex_lock(&p->mu);
            while (!p->quit && (g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen)
                pthread_cond_wait(&p->wake, &p->mu);
            const int quit = p->quit;
            pthread_mutex_unlock(&p->mu);
            if (quit)
                return NULL;
        }
        seen = g;
        p->task(p->ctx, w->tid, p->n_threads);
        if (atomic_fetch_sub_explicit(&p->busy, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu); /* the caller may be asleep on done */
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

/* Initialises mu, wake and done; on failure initialises none and returns which one failed
 * ("mutex" or "condition variable"). */
static const char *pool_sync_init(cpu_pool *p)
{
    if (pthread_mutex_init(&p->mu, NULL) != 0)
        return "mutex";
    if (pthread_cond_init(&p->wake, NULL) != 0) {
        pthread_mutex_destroy(&p->mu);
        return "condition variable";
    }
    if (pthread_cond_init(&p->done, NULL) != 0) {
        pthread_cond_destroy(&p->wake);
        pthread_mutex_destroy(&p->mu);
        return "condition variable";
    }
    p->sync_ok = 1;
    return NULL;
}

/* Starts workers 1 .. n_threads-1 (gen must be 0: a new worker has seen no job); returns 0 or
 * the pthread_create error, with n_started counting the workers that did start. */
static int pool_start_workers(cpu_pool *p)
{
    /* Workers block every signal, so the application's handlers run on its own threads. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int err = 0;
    for (int i = 0; i < p->n_threads - 1 && !err; i++) {
        p->workers[i] = (cpu_worker){.pool = p, .tid = i + 1};
        err = pthread_create(&p->workers[i].thread, NULL, worker_main, &p->workers[i]);
        if (!err)
            p->n_started++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    /* Return only once every started worker runs worker_main: a thread still starting may hold a
     * lock of the C runtime (clang 14's AddressSanitizer frees memory in its thread set-up, under
     * its allocator's lock), and a fork() taken then would hand the child that lock held forever
     * (docs/hardening.md, "Findings"; tests/test_faults.c's fork cases under ASan). */
    pthread_mutex_lock(&p->mu);
    while (p->n_ready < p->n_started)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
    return err;
}

/* Stops and joins the started workers. */
static void pool_stop_workers(cpu_pool *p)
{
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_started; i++)
        pthread_join(p->workers[i].thread, NULL);
    p->n_started = p->n_ready = 0;
}

/* Whether the pool was made by another process: this is a fork child, and the workers the pool
 * names do not exist here. `sure` also asks the kernel (for a child made without the atfork
 * handlers, e.g. a raw clone); the op path uses the cached id alone. */
static inline int pool_inherited(const cpu_pool *p, int sure)
{
    return p->pid != current_pid() || (sure && p->pid != getpid());
}

/* In a fork child: makes the inherited pool this process's own. Its copied mutex and condition
 * variables may be in any state (held by a thread that does not exist here, with waiters that do
 * not exist either), so they are re-initialised over, never destroyed; the old workers' stacks
 * are unreachable and stay allocated. If anything fails, the pool runs jobs on the caller alone. */
static void pool_adopt(cpu_pool *p)
{
    p->pid = current_pid();
    p->n_started = 0;
    p->n_ready = 0;
    p->quit = 0;
    p->solo = 0;
    p->sync_ok = 0;
    atomic_store_explicit(&p->gen, 0, memory_order_relaxed);
    atomic_store_explicit(&p->busy, 0, memory_order_relaxed);
    memset(&p->mu, 0, sizeof p->mu);
    memset(&p->wake, 0, sizeof p->wake);
    memset(&p->done, 0, sizeof p->done);
    if (pool_sync_init(p) != NULL) {
        p->solo = 1;
        return;
    }
    if (pool_start_workers(p) != 0) {
        pool_stop_workers(p);
        p->quit = 0;
        p->solo = 1;
    }
}

/* Stops and joins the started workers, then frees the pool. Used by destroy and by rollback. A
 * pool inherited through fork has no workers in this process and copies of synchronisation
 * objects that may be in any state (destroying them could wait forever): only its memory is
 * freed. */
static void pool_free(cpu_pool *p)
{
    if (!pool_inherited(p, 1) && p->sync_ok) {
        pool_stop_workers(p);
        pthread_cond_destroy(&p->done);
        pthread_cond_destroy(&p->wake);
        pthread_mutex_destroy(&p->mu);
    }
    lmk_host_free(p);
}

static lmk_status cpu_stream_create(lmk_stream *s)
{
    static const char fn[] = "lmk_stream_create";
    pthread_once(&g_pid_once, pid_init);
    const cpu_device *cd = s->dev->impl;
    const int want = __atomic_load_n(&s->dev->n_threads, __ATOMIC_RELAXED);
    const int n = want >= 1 ? want : 1;
    /* n <= 1024 (lmk_device_set_threads): no size below overflows. The scratch is not zeroed. */
    const size_t head = (sizeof(cpu_pool) + (size_t)(n - 1) * sizeof(cpu_worker) + 63) / 64 * 64;
    cpu_pool *p = lmk_host_alloc(head + LMK_CPU_SHARED_SCRATCH + (size_t)n * LMK_CPU_SCRATCH, 64);
    if (!p)
        return lmk_fail(LMK_ERR_OUT_OF_MEMORY, "%s: out of host memory for a pool of %d threads", fn, n);
    memset(p, 0, head);
    p->scratch = (unsigned char *)p + head;
    p->isa = cd->isa;
    p->n_threads = n;
    p->pid = current_pid();
    const char *failed = pool_sync_init(p);
    if (failed) {
        lmk_host_free(p);
        return lmk_fail(LMK_ERR_OUT_OF_MEMORY, "%s: cannot create the pool's %s", fn, failed);
    }
    const int err = pool_start_workers(p);
    if (err) {
        const int started = p->n_started;
        pool_free(p);
        return lmk_fail(LMK_ERR_OUT_OF_MEMORY, "%s: cannot start worker thread %d of %d (error %d)", fn, started + 1,
                        n - 1, err);
    }
    s->impl = p;
    return LMK_OK;
}

static lmk_status cpu_stream_sync(lmk_stream *s)
{
    (void)s; /* every op ran to completion before its call returned */
    return LMK_OK;
}

static void cpu_stream_destroy(lmk_stream *s)
{
    pool_free(s->impl);
    s->impl = NULL;
}

/* Runs one job on the pool: share 0 here, the others on the workers. */
static void pool_run(cpu_pool *p, lmk_cpu_task task, void *ctx)
{
    const int n = p->n_threads;
    /* Only this thread writes the job fields, and no worker reads them until gen moves (the
     * previous job ended with busy == 0, so every worker is done with it). */
    p->task = task;
    p->ctx = ctx;
    atomic_store_explicit(&p->busy, n - 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);

    task(ctx, 0, n);

    for (int i = 0; atomic_load_explicit(&p->busy, memory_order_acquire) && i < SPIN_PAUSES; i++)
        cpu_pause();
    if (atomic_load_explicit(&p->busy, memory_order_acquire)) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load_explicit(&p->busy, memory_order_acquire))
            pthread_cond_wait(&p->done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}

void *lmk_cpu_scratch(lmk_stream *s, int tid)
{
    cpu_pool *p = s->impl;
    return p->scratch + LMK_CPU_SHARED_SCRATCH + (size_t)tid * LMK_CPU_SCRATCH;
}

void *lmk_cpu_shared_scratch(lmk_stream *s)
{
    cpu_pool *p = s->impl;
    return p->scratch;
}

int lmk_cpu_parallel_threads(const lmk_stream *s, size_t bytes)
{
    const cpu_pool *p = s->impl;
    return p->n_threads == 1 || bytes < LMK_CPU_PARALLEL_MIN_BYTES ? 1 : p->n_threads;
}

void lmk_cpu_parallel(lmk_stream *s, size_t bytes, lmk_cpu_task task, void *ctx)
{
    cpu_pool *p = s->impl;
    const fp_saved fp = fp_enter();
    if (p->n_threads == 1 || bytes < LMK_CPU_PARALLEL_MIN_BYTES) {
        task(ctx, 0, 1);
    } else {
        if (pool_inherited(p, 0))
            pool_adopt(p);
        if (p->solo)
            task(ctx, 0, 1);
        else
            pool_run(p, task, ctx);
    }
    fp_leave(&fp);
}

/* Every op of src/ops/ops.h has its CPU path, lmk_cpu_<op> in src/ops/<op>/cpu.c. */
#define CPU_OP_DECL(name) lmk_status lmk_cpu_##name(lmk_stream *s, const void *args);
LMK_OPS(CPU_OP_DECL)
#undef CPU_OP_DECL

static int cpu_device_count(void)
{
    return 1;
}

static void cpu_build_detail(char *buf, size_t n)
{
    snprintf(buf, n, "simd=%s", cpu_simd_name());
}

const lmk_backend_ops lmk_cpu_backend = {
    .device_count = cpu_device_count,
    .device_open = cpu_device_open,
    .device_close = cpu_device_close,
    .device_threads_changed = cpu_name_device,
    .build_detail = cpu_build_detail,
    .mem_alloc = cpu_mem_alloc,
    .mem_free = cpu_mem_free,
    .mem_write = cpu_mem_copy,
    .mem_read = cpu_mem_copy,
    .stream_create = cpu_stream_create,
    .stream_sync = cpu_stream_sync,
    .stream_destroy = cpu_stream_destroy,
#define CPU_OP_SLOT(name) [LMK_OP_##name] = lmk_cpu_##name,
    .op = {LMK_OPS(CPU_OP_SLOT)},
#undef CPU_OP_SLOT
};
