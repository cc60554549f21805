/*
 * tool.c - the helpers every command of the `lmk` tool shares: error reporting and option parsing.
 * lmk.c (main and the command table), check.c and bench.c use them; this file uses nothing of
 * theirs, so no command depends on another.
 */
#include "tool.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

int tool_lib_error(lmk_status st, const char *what)
{
    fprintf(stderr, "lmk: %s: %s: %s\n", what, lmk_status_name(st), lmk_last_error());
    return TOOL_EXIT_FAIL;
}

int tool_usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("lmk: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return TOOL_EXIT_USAGE;
}

int tool_unknown_arg(const char *cmd, const char *arg)
{
    if (arg[0] == '-')
        return tool_usage_error("unknown option %s (try lmk %s --help)", arg, cmd);
    return tool_usage_error("unexpected argument '%s' (try lmk %s --help)", arg, cmd);
}

int tool_flag(char **argv, int i, const char *name)
{
    return !strcmp(argv[i], name);
}

int tool_opt(int argc, char **argv, int *i, const char *name, const char **val)
{
    const char *a = argv[*i];
    const size_t n = strlen(name);
    if (strncmp(a, name, n) != 0)
        return 0;
    if (a[n] == '=') {
        *val = a + n + 1;
        return 1;
    }
    if (a[n] != '\0')
        return 0;
    if (*i + 1 >= argc) {
        tool_usage_error("option %s needs a value", name);
        return -1;
    }
    *val = argv[++*i];
    return 1;
}

int tool_parse_u64(const char *opt, const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    /* Digits only: strtoull alone would skip leading blanks and accept a sign, so " -1" would
     * wrap to 2^64 - 1. */
    int digits = *s != '\0';
    for (const char *c = s; *c && digits; c++)
        digits = *c >= '0' && *c <= '9';
    char *end = NULL;
    errno = 0;
    const unsigned long long v = digits ? strtoull(s, &end, 10) : 0;
    if (!digits || *end || errno || v < lo || v > hi) {
        tool_usage_error("bad value for %s: '%s' (expected an integer in [%llu, %llu])", opt, s,
                         (unsigned long long)lo, (unsigned long long)hi);
        return -1;
    }
    *out = v;
    return 0;
}

int tool_parse_choice(const char *opt, const char *s, const char *const *names, int n)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(s, names[i]))
            return i;
    char allowed[128] = "";
    for (int i = 0; i < n; i++)
        snprintf(allowed + strlen(allowed), sizeof allowed - strlen(allowed), "%s%s", i ? ", " : "", names[i]);
    tool_usage_error("bad value for %s: '%s' (expected %s)", opt, s, allowed);
    return -1;
}

int tool_parse_op(const char *s, const tst_op **op)
{
    *op = tst_op_find(s);
    if (*op || !strcmp(s, "all"))
        return 0;
    char allowed[256] = "";
    for (int i = 0; i < tst_op_count; i++)
        snprintf(allowed + strlen(allowed), sizeof allowed - strlen(allowed), "%s, ", tst_ops[i]->name);
    tool_usage_error("bad value for --op: '%s' (expected %sall)", s, allowed);
    return -1;
}

void tool_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fputc('\\', f);
        if ((unsigned char)*s >= 0x20)
            fputc(*s, f);
    }
    fputc('"', f);
}
