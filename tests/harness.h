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

#include <stdio.h>

extern int harness_passed, harness_failed, harness_skipped;

#define HARNESS_DEFINE int harness_passed, harness_failed, harness_skipped

/* Counts one case; on failure prints where and the formatted message. Evaluates to cond. */
#define CHECK(cond, ...)                                                                                     \
    ((cond) ? (harness_passed++, 1)                                                                          \
            : (harness_failed++, fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__), fprintf(stderr, __VA_ARGS__), \
               fputc('\n', stderr), 0))

#define SKIP(...) (harness_skipped++, printf("SKIP "), printf(__VA_ARGS__), putchar('\n'))

static inline int harness_summary(void)
{
    printf("%d passed, %d failed, %d skipped\n", harness_passed, harness_failed, harness_skipped);
    fflush(stdout);
    return harness_failed ? 1 : 0;
}

#endif
