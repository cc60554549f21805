/*
 * fail.c - how the kit and the tools record a failure: in the library's own per-thread message,
 * so a caller reads it with lmk_last_error() whether the library or the kit failed.
 *
 * A file of its own because every layer of the kit reports failures and no layer depends on one
 * above it (testkit.h, the layers).
 */
#include "core/internal.h"
#include "testkit.h"

#include <stdarg.h>
#include <stdio.h>

lmk_status tst_fail(lmk_status st, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return lmk_fail(st, "%s", msg);
}
