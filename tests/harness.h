/*
 * harness.h - the tiny test harness every test program shares.
 *
 * A test program counts cases with CHECK (one per case, not one per element), reports skipped
 * cases with SKIP (a visible line, e.g. "SKIP cuda: no GPU"), and ends with harness_summary(),
 * which prints the closing line "N passed, N failed, N skipped" that tests/run_tests.sh sums and
 * returns the exit status. Failures print the file, line and a message, and never stop the run.
 */
#ifndef LMK_TEST_HARNESS_H
#define LMK_TEST_HARNESS_H

#include <stdarg.h>
#include <stdio.h>

extern int harness_passed, harness_failed, harness_skipped;

#define HARNESS_DEFINE int harness_passed, harness_failed, harness_skipped

/* Counts one case; on failure prints where and the formatted message. Returns cond (0 or 1). */
#define CHECK(cond, ...) harness_check(!!(cond), __FILE__, __LINE__, __VA_ARGS__)

static inline int harness_check(int ok, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static inline int harness_check(int ok, const char *file, int line, const char *fmt, ...)
{
    if (ok) {
        harness_passed++;
        return 1;
    }
    harness_failed++;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL %s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 0;
}

#define SKIP(...) (harness_skipped++, printf("SKIP "), printf(__VA_ARGS__), putchar('\n'))

static inline int harness_summary(void)
{
    printf("%d passed, %d failed, %d skipped\n", harness_passed, harness_failed, harness_skipped);
    fflush(stdout);
    return harness_failed ? 1 : 0;
}

#endif
