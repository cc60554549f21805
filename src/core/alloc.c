/*
 * alloc.c - every host allocation of the library, through the caller's allocator hook.
 *
 * Routing all host memory through one place is what lets a test count allocations (an op call
 * must make none) and fail the N-th one (every failure path must return OUT_OF_MEMORY and leak
 * nothing). The default hook is aligned malloc/free.
 */
#include "core/internal.h"

#include <stdlib.h>
#include <string.h>

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
    if (a && a->alloc && a->free)
        g_allocator = *a;
    else
        g_allocator = (lmk_allocator){default_alloc, default_free, NULL};
}

void *lmk_host_alloc(size_t size, size_t alignment)
{
    return g_allocator.alloc(size, alignment ? alignment : 16, g_allocator.user);
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
