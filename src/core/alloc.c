/*
 * alloc.c - every host allocation of the library, through the caller's allocator hook.
 *
 * Routing all host memory through one place is what lets a test count allocations (an op call
 * must make none) and fail the N-th one (every failure path must return OUT_OF_MEMORY and leak
 * nothing). The default hook is aligned malloc/free.
 *
 * A hook's result is checked against the alignment asked for: a hook that ignores it (a plain
 * malloc wrapper gives 16 bytes where CPU buffers need 64) would otherwise hand misaligned memory
 * to vector code. Such a result is given back to the hook and the allocation fails; the caller's
 * OUT_OF_MEMORY message then says why (the detail goes through status.c).
 */
#include "core/internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* status.c: a detail that the calling thread's next failure message appends when it reports
 * OUT_OF_MEMORY; NULL clears it. (Declared here, its only caller, rather than in internal.h.) */
void lmk_fail_set_oom_detail(const char *fmt, ...) LMK_PRINTF(1, 2);

static void *default_alloc(size_t size, size_t alignment, void *user)
{
    (void)user;
    void *p = NULL;
    if (alignment < sizeof(void *))
        alignment = sizeof(void *);
    if (posix_memalign(&p, alignment, size ? size : 1) != 0)
        return NULL;
    return p;
}

static void default_free(void *p, void *user)
{
    (void)user;
    free(p);
}

static lmk_allocator g_allocator = {default_alloc, default_free, NULL};

void lmk_set_allocator(const lmk_allocator *a)
{
    if (a && !a->alloc != !a->free) {
        lmk_fail(LMK_ERR_INVALID_ARGUMENT,
                 "lmk_set_allocator: alloc and free must both be set or both NULL (alloc %s, free %s); the "
                 "allocator in place is kept",
                 a->alloc ? "set" : "NULL", a->free ? "set" : "NULL");
        return;
    }
    if (a && a->alloc)
        g_allocator = *a;
    else
        g_allocator = (lmk_allocator){default_alloc, default_free, NULL};
}

void *lmk_host_alloc(size_t size, size_t alignment)
{
    if (!alignment)
        alignment = 16;
    lmk_fail_set_oom_detail(NULL);
    void *p = g_allocator.alloc(size, alignment, g_allocator.user);
    if (p && ((uintptr_t)p & (alignment - 1)) != 0) {
        g_allocator.free(p, g_allocator.user);
        lmk_fail_set_oom_detail("the allocator hook returned a pointer (%p) not aligned to %zu bytes; a hook must "
                                "return memory aligned as asked (lmk_set_allocator)",
                                p, alignment);
        return NULL;
    }
    return p;
}

void *lmk_host_calloc(size_t size, size_t alignment)
{
    void *p = lmk_host_alloc(size, alignment);
    if (p)
        memset(p, 0, size);
    return p;
}

void lmk_host_free(void *p)
{
    if (p)
        g_allocator.free(p, g_allocator.user);
}
