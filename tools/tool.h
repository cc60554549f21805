/*
 * tool.h - what the files of the `lmk` command-line tool share.
 *
 * lmk.c holds main, the command table and `lmk info`; tool.c the helpers declared here (error
 * reporting, option parsing); check.c `lmk check`, bench.c `lmk bench`. The tool calls the library
 * only through its public API (lmk.h, lmk_cuda.h); what it runs, and how results are compared with
 * the float64 references, comes from the ops' case descriptors of the test kit (testkit.h).
 */
#ifndef LMK_TOOL_H
#define LMK_TOOL_H

#include "lmk.h"
#include "testkit.h"

#include <stdint.h>
#include <stdio.h>

/* Exit statuses: 1 when a check fails or the library reports an error, 2 for a usage error. */
enum { TOOL_EXIT_FAIL = 1, TOOL_EXIT_USAGE = 2 };

/* The commands (main dispatches to them). */
int tool_info(int argc, char **argv);
int tool_check(int argc, char **argv);
int tool_bench(int argc, char **argv);

/* Prints "lmk: <what>: <STATUS NAME>: <lmk_last_error()>" on stderr and returns TOOL_EXIT_FAIL. */
int tool_lib_error(lmk_status st, const char *what);
/* Prints "lmk: <message>" on stderr and returns TOOL_EXIT_USAGE. */
int tool_usage_error(const char *fmt, ...) TST_PRINTF(1, 2);
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

/* --op: an op of the registry (testkit.h) by name, or "all" (*op NULL). Prints why and returns -1
 * for another name. */
int tool_parse_op(const char *s, const tst_op **op);

/* Writes s as a JSON string (quotes and backslashes escaped, control characters dropped). */
void tool_json_string(FILE *f, const char *s);

#endif /* LMK_TOOL_H */
