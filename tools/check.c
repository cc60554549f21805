/*
 * check.c - `lmk check`: every case of every op on every available backend against the float64
 * reference.
 *
 * The cases are the ops' own (their descriptors, src/ops/<op>/case.c, through the test kit's
 * registry): real model shapes and edge shapes, dense and strided operands. Each case is made on
 * each backend from one seed, so every backend runs it on the same inputs, in memory poisoned with
 * 0xFF (NaN in every float dtype) between guard bytes; the descriptor compares the outputs with the
 * reference under the op's contract (f32 within 1e-5, bf16/f16 within one ulp of the float64 result
 * plus 1e-6, copies bit-exact), then every byte that is not an output element must be unchanged.
 *
 * Output: failures in full, a summary line per op and a closing line; -v adds a line per case and
 * backend; --json prints one JSON object instead. A case that a backend does not support
 * (LMK_ERR_UNSUPPORTED) or that does not fit in memory is a SKIP, counted and named in the summary.
 */
#include "tool.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SLOW_BYTES (64.0 * (1 << 20)) /* a case moving more than this takes seconds: say so first */

enum { RES_OK, RES_FAIL, RES_SKIP };

typedef struct backend {
    const char *name;
    lmk_device *dev;
    lmk_stream *s;
} backend;

typedef struct check_opts {
    bool quick, verbose, json;
    int backends;        /* 0 cpu, 1 cuda, 2 all */
    const tst_op *op;    /* NULL: all */
    uint64_t seed;
} check_opts;

/* Counts of one op, and the first reason it skipped a case. */
typedef struct op_tally {
    int passed, failed, skipped;
    char skip_reason[200];
} op_tally;

typedef struct check_state {
    const check_opts *o;
    backend be[2];
    int n_be;
    op_tally total;
    int name_width;
    bool first_json;
} check_state;

/* ---- reporting ---- */

static void report(check_state *c, op_tally *t, const backend *be, const tst_case *tc, int res, const tst_result *r)
{
    static const char *const tags[] = {"OK", "FAIL", "SKIP"};
    op_tally *counts[2] = {t, &c->total};
    for (int i = 0; i < 2; i++) {
        if (res == RES_OK)
            counts[i]->passed++;
        else if (res == RES_FAIL)
            counts[i]->failed++;
        else
            counts[i]->skipped++;
    }
    for (int i = 0; i < 2; i++)
        if (res == RES_SKIP && !counts[i]->skip_reason[0])
            snprintf(counts[i]->skip_reason, sizeof counts[i]->skip_reason, "%s: %.180s", be->name, r->msg);
    if (c->o->json) {
        printf("%s\n    {\"op\": ", c->first_json ? "" : ",");
        tool_json_string(stdout, tc->op->name);
        printf(", \"case\": ");
        tool_json_string(stdout, tc->name);
        printf(", \"backend\": \"%s\", \"result\": \"%s\", \"detail\": ", be->name, tags[res]);
        tool_json_string(stdout, r->msg);
        if (res == RES_OK && !r->exact)
            printf(", \"max_err\": %.3g, \"max_ratio\": %.3f", r->max_err, r->max_ratio);
        printf("}");
        c->first_json = false;
    } else if (res == RES_FAIL || c->o->verbose) {
        printf("%-5s %-4s %-*s  %s\n", be->name, tags[res], c->name_width, tc->name, r->msg);
    }
    fflush(stdout);
}

/* One case on one backend: made from `seed` (the same inputs on every backend), run, verified. */
static int run_case(const backend *be, const tst_case *tc, uint64_t seed, tst_result *r)
{
    lmk_status st;
    if (tst_case_check(tc, be->s, seed, r, &st))
        return RES_OK;
    /* A backend without the case, or a machine without the memory, is a limit, not a fault. */
    return st == LMK_ERR_UNSUPPORTED || st == LMK_ERR_OUT_OF_MEMORY ? RES_SKIP : RES_FAIL;
}

static void check_op(check_state *c, int op_index, op_tally *t)
{
    const tst_op *op = tst_ops[op_index];
    const int n = op->n_cases();
    for (int i = 0; i < n; i++) {
        const tst_case tc = tst_op_case(op, i);
        if (c->o->quick && (tc.flags & TST_CASE_FULL))
            continue;
        const double mb = op->bytes(&tc) / (1 << 20);
        for (int b = 0; b < c->n_be; b++) {
            if (mb * (1 << 20) > SLOW_BYTES) { /* before a case that takes seconds, say which */
                fprintf(c->o->json ? stderr : stdout, "... %s on %s (%.0f MB)\n", tc.name, c->be[b].name, mb);
                fflush(c->o->json ? stderr : stdout);
            }
            tst_result r;
            const int res = run_case(&c->be[b], &tc, tst_seed_mix(c->o->seed, (uint64_t)op_index, (uint64_t)i), &r);
            report(c, t, &c->be[b], &tc, res, &r);
        }
    }
}

/* ---- the command ---- */

/* Opens `kind` if this machine has it. A backend asked for by name must exist; under "all" a
 * missing CUDA is a visible skip, so the same command runs on a laptop and on a GPU host. */
static int open_backend(check_state *c, lmk_backend kind, bool required)
{
    backend *be = &c->be[c->n_be];
    be->name = kind == LMK_BACKEND_CUDA ? "cuda" : "cpu";
    if (kind == LMK_BACKEND_CUDA && !required && lmk_device_count(LMK_BACKEND_CUDA) == 0) {
#ifdef LMK_WITH_CUDA
        const char *why = "no GPU", *brief = "no GPU";
#else
        const char *why = "this build has no CUDA backend; make CUDA=1 builds it", *brief = "not in this build";
#endif
        c->total.skipped++;
        if (!c->total.skip_reason[0])
            snprintf(c->total.skip_reason, sizeof c->total.skip_reason, "cuda: %s", brief);
        fprintf(c->o->json ? stderr : stdout, "cuda  SKIP every case: %s\n", why);
        return 0;
    }
    char what[64];
    snprintf(what, sizeof what, "cannot open the %s device", be->name);
    lmk_status st = lmk_device_open(kind, 0, &be->dev);
    if (st == LMK_OK && (st = lmk_stream_create(be->dev, &be->s)) != LMK_OK) {
        lmk_device_close(be->dev);
        snprintf(what, sizeof what, "cannot create a %s stream", be->name);
    }
    if (st != LMK_OK)
        return tool_lib_error(st, what);
    if (!c->o->json)
        printf("%-5s device: %s\n", be->name, lmk_device_name(be->dev));
    c->n_be++;
    return 0;
}

static int parse_check_opts(int argc, char **argv, check_opts *o)
{
    static const char *const backends[] = {"cpu", "cuda", "all"};
    *o = (check_opts){.backends = 2};
    o->seed = ((uint64_t)time(NULL) * 1000003u ^ (uint64_t)getpid()) % 1000000000u; /* short enough to retype */
    for (int i = 2; i < argc; i++) {
        const char *v = NULL;
        int r;
        if (tool_flag(argv, i, "--quick")) {
            o->quick = true;
        } else if (tool_flag(argv, i, "-v") || tool_flag(argv, i, "--verbose")) {
            o->verbose = true;
        } else if (tool_flag(argv, i, "--json")) {
            o->json = true;
        } else if ((r = tool_opt(argc, argv, &i, "--backend", &v)) != 0) {
            if (r < 0 || (o->backends = tool_parse_choice("--backend", v, backends, 3)) < 0)
                return TOOL_EXIT_USAGE;
        } else if ((r = tool_opt(argc, argv, &i, "--op", &v)) != 0) {
            if (r < 0 || tool_parse_op(v, &o->op) < 0)
                return TOOL_EXIT_USAGE;
        } else if ((r = tool_opt(argc, argv, &i, "--seed", &v)) != 0) {
            if (r < 0 || tool_parse_u64("--seed", v, 0, UINT64_MAX, &o->seed) < 0)
                return TOOL_EXIT_USAGE;
        } else {
            return tool_unknown_arg("check", argv[i]);
        }
    }
    return 0;
}

/* The longest case name of the selected ops, so that -v lines up. */
static int name_width(const check_opts *o)
{
    int w = 0;
    for (int k = 0; k < tst_op_count; k++)
        for (int i = 0; o->verbose && (!o->op || o->op == tst_ops[k]) && i < tst_ops[k]->n_cases(); i++) {
            const tst_case tc = tst_op_case(tst_ops[k], i);
            const int len = (int)strlen(tc.name);
            w = len > w ? len : w;
        }
    return w;
}

static void print_summary(const check_state *c, int op_index, const op_tally *t)
{
    if (c->o->json)
        return;
    printf("%-14s %4d passed, %d failed, %d skipped", tst_ops[op_index]->name, t->passed, t->failed, t->skipped);
    if (t->skipped)
        printf(" (the first: %s)", t->skip_reason);
    printf("\n");
    fflush(stdout);
}

int tool_check(int argc, char **argv)
{
    check_opts o;
    int rc = parse_check_opts(argc, argv, &o);
    if (rc != 0)
        return rc;
    check_state c = {.o = &o, .name_width = name_width(&o), .first_json = true};
    if (!o.json)
        printf("lmk check %s: seed %llu (rerun with --seed %llu)\n", o.quick ? "--quick" : "(full)",
               (unsigned long long)o.seed, (unsigned long long)o.seed);
    if (o.backends == 0 || o.backends == 2)
        rc = open_backend(&c, LMK_BACKEND_CPU, o.backends == 0);
    if (rc == 0 && (o.backends == 1 || o.backends == 2))
        rc = open_backend(&c, LMK_BACKEND_CUDA, o.backends == 1);
    if (rc == 0) {
        const double t0 = tst_now();
        if (o.json)
            printf("{\"seed\": %llu, \"quick\": %s, \"cases\": [", (unsigned long long)o.seed, o.quick ? "true" : "false");
        for (int k = 0; k < tst_op_count; k++) {
            if (o.op && o.op != tst_ops[k])
                continue;
            op_tally t = {0};
            check_op(&c, k, &t);
            print_summary(&c, k, &t);
        }
        const double secs = tst_now() - t0;
        if (o.json)
            printf("\n  ],\n  \"passed\": %d, \"failed\": %d, \"skipped\": %d, \"seconds\": %.1f}\n", c.total.passed,
                   c.total.failed, c.total.skipped, secs);
        else {
            printf("check: %d passed, %d failed, %d skipped", c.total.passed, c.total.failed, c.total.skipped);
            if (c.total.skipped)
                printf(" (%s%s)", c.total.skipped > 1 ? "the first: " : "", c.total.skip_reason);
            printf(" in %.1f s (seed %llu)\n", secs, (unsigned long long)o.seed);
        }
        rc = c.total.failed ? TOOL_EXIT_FAIL : 0;
    }
    for (int b = 0; b < c.n_be; b++) {
        lmk_stream_destroy(c.be[b].s);
        lmk_device_close(c.be[b].dev);
    }
    return rc;
}
