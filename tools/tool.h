/*
 * tool.h - what the files of the `lmk` command-line tool share.
 *
 * lmk.c holds main, `lmk info` and the helpers declared here (option parsing, error reporting,
 * random data, clocks); check.c holds `lmk check`, bench.c `lmk bench`. The tool uses the public
 * API for everything it runs, and core/internal.h only for the float64 references that `check`
 * compares every backend with (and the argument structs they take).
 */
#ifndef LMK_TOOL_H
#define LMK_TOOL_H

#include "core/internal.h"

#include <stdint.h>
#include <stdio.h>

/* Exit statuses: 1 when a check fails or the library reports an error, 2 for a usage error. */
enum { TOOL_EXIT_FAIL = 1, TOOL_EXIT_USAGE = 2 };

int tool_info(int argc, char **argv);
int tool_check(int argc, char **argv);
int tool_bench(int argc, char **argv);

/* Prints "lmk: <what>: <STATUS NAME>: <lmk_last_error()>" on stderr and returns TOOL_EXIT_FAIL. */
int tool_lib_error(lmk_status st, const char *what);
/* Prints "lmk: <message>" on stderr and returns TOOL_EXIT_USAGE. */
int tool_usage_error(const char *fmt, ...) LMK_PRINTF(1, 2);
/* The usage error for an argument command `cmd` does not take. */
int tool_unknown_arg(const char *cmd, const char *arg);

/* Option parsing. Options are "--name value" or "--name=value"; argv[*i] is the one at hand.
 * tool_flag: 1 when argv[*i] is exactly the flag `name`.
 * tool_opt: 1 when argv[*i] is option `name` (its value goes to *val and *i moves past it); 0 when
 * it is another argument; -1 (after printing why) when the value is missing. */
int tool_flag(char **argv, int i, const char *name);
int tool_opt(int argc, char **argv, int *i, const char *name, const char **val);
/* Parses a decimal unsigned integer in [lo, hi] for option `opt`: decimal digits only (no sign,
 * no blanks). Prints why and returns -1 if not. */
int tool_parse_u64(const char *opt, const char *s, uint64_t lo, uint64_t hi, uint64_t *out);
/* Picks `s` among `n` names; returns its index, or -1 after printing the allowed names. */
int tool_parse_choice(const char *opt, const char *s, const char *const *names, int n);
/* Prints the usage of `cmd` (NULL: the whole tool) on f. */
void tool_print_usage(FILE *f, const char *cmd);

/* A small, fast, seedable generator (splitmix64): check and bench must not depend on libc rand. */
typedef struct tool_rng {
    uint64_t state;
} tool_rng;
uint64_t tool_rng_next(tool_rng *r);
/* Uniform in [lo, hi). */
double tool_rng_uniform(tool_rng *r, double lo, double hi);
/* Fills n elements of dtype t: floats uniform in [-2, 2) (the range the precision contract covers)
 * rounded to the dtype, never exactly zero; integer dtypes get random bits. */
void tool_fill_random(tool_rng *r, lmk_dtype t, void *dst, size_t n);

/* Seconds on a monotonic clock. */
double tool_now(void);

#endif /* LMK_TOOL_H */
