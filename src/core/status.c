/*
 * status.c - status names, the per-thread failure message, and the version.
 *
 * Errors are values: every failing call returns an lmk_status and leaves a message in a
 * thread-local buffer. The buffer is static per thread (no allocation), so reporting a failure can
 * never itself fail, and one thread's failures never overwrite another's message.
 */
#include "core/internal.h"

#include <stdio.h>
#include <string.h>

static _Thread_local char g_message[512];
/* Why this thread's last host allocation failed, when the hook's answer was unusable (alloc.c);
 * the next OUT_OF_MEMORY message appends it. Any failure consumes it. */
static _Thread_local char g_oom_detail[192];

void lmk_fail_set_oom_detail(const char *fmt, ...) LMK_PRINTF(1, 2);
void lmk_fail_set_oom_detail(const char *fmt, ...)
{
    if (!fmt) {
        g_oom_detail[0] = '\0';
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_oom_detail, sizeof g_oom_detail, fmt, ap);
    va_end(ap);
}

static const char *const g_status_names[] = {
    [LMK_OK] = "LMK_OK",
    [LMK_ERR_INVALID_ARGUMENT] = "LMK_ERR_INVALID_ARGUMENT",
    [LMK_ERR_UNSUPPORTED] = "LMK_ERR_UNSUPPORTED",
    [LMK_ERR_OUT_OF_MEMORY] = "LMK_ERR_OUT_OF_MEMORY",
    [LMK_ERR_DEVICE] = "LMK_ERR_DEVICE",
    [LMK_ERR_NOT_FOUND] = "LMK_ERR_NOT_FOUND",
};

const char *lmk_status_name(lmk_status s)
{
    if ((unsigned)s < sizeof g_status_names / sizeof g_status_names[0])
        return g_status_names[s];
    return "LMK_UNKNOWN_STATUS";
}

const char *lmk_last_error(void)
{
    return g_message;
}

void lmk_clear_error(void)
{
    g_message[0] = '\0';
}

lmk_status lmk_fail(lmk_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_message, sizeof g_message, fmt, ap);
    va_end(ap);
    if (g_oom_detail[0]) {
        if (st == LMK_ERR_OUT_OF_MEMORY) {
            const size_t n = strlen(g_message);
            snprintf(g_message + n, sizeof g_message - n, ": %s", g_oom_detail);
        }
        g_oom_detail[0] = '\0';
    }
    return st;
}

/* Made of lmk.h's macros, the version's one place. */
#define LMK_STR_(x) #x
#define LMK_STR(x) LMK_STR_(x)

const char *lmk_version(void)
{
    return LMK_STR(LMK_VERSION_MAJOR) "." LMK_STR(LMK_VERSION_MINOR) "." LMK_STR(LMK_VERSION_PATCH);
}
