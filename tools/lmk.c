/*
 * lmk.c - the `lmk` command-line tool: main, the command table, the usage texts and `lmk info`.
 *
 *     lmk info | check [--quick] ... | bench [--json] ... | help [command] | --help | --version
 *
 * The tool is the project's smoke test and its benchmark: `make run` is `lmk check --quick` then
 * `lmk bench` (its headline cases). Library failures are printed with lmk_status_name and lmk_last_error and end the
 * run with a non-zero exit status; usage errors exit with 2. The ops it runs come from the test
 * kit's registry (testkit.h), so the texts below list them from there.
 */
#include "tool.h"

#include <stdlib.h>
#include <string.h>

static const char usage_main[] =
    "usage: lmk <command> [options]\n"
    "\n"
    "commands:\n"
    "  info             version, build, backends and devices\n"
    "  check            every op on every backend against the float64 reference\n"
    "  bench            times the ops at real model shapes against a measured copy ceiling\n"
    "  help [command]   this text, or one command's options\n"
    "\n"
    "  lmk --version    prints the library version\n";

/* %s: the names of the registry's ops (tst_ops) joined by "|". */
static const char usage_check[] =
    "usage: lmk check [--quick] [--backend cpu|cuda|all] [--op %s|all] [--seed N] [-v] [--json]\n"
    "\n"
    "Runs every case of every op (real model shapes, edge shapes) on every selected backend on fresh\n"
    "random data and compares each result with the float64 reference: f32 within 1e-5, bf16/f16\n"
    "within 1 ulp + 1e-6, copies bit-exact, no byte written outside the outputs. Prints failures in\n"
    "full and a summary per op; the exit status is 1 if any case fails.\n"
    "\n"
    "  --quick                 leave out the prompt-length cases: a few seconds on a CPU\n"
    "  --backend cpu|cuda|all  default all: every backend this machine has (CUDA skipped without a GPU)\n"
    "  --op %s|all   default all\n"
    "  --seed N                seed of the random data (default: a fresh one, printed for reruns)\n"
    "  -v, --verbose           one line per case and backend\n"
    "  --json                  a JSON object on stdout (seed, counts, every case) instead of the text\n";

static const char usage_bench[] =
    "usage: lmk bench [--all] [--backend cpu|cuda] [--op %s|all] [--dtype f32|bf16|all]\n"
    "                 [--T LIST] [--threads N] [--iters N] [--variant NAME|list] [--list] [--json]\n"
    "\n"
    "Times each op at real model shapes and reports GB/s of the bytes it must move against a copy\n"
    "ceiling measured in the same run. docs/bench.md explains the columns. Without --all, --op,\n"
    "--dtype or --T it runs the headline cases: the prompt and decode shapes of a few models, bf16.\n"
    "\n"
    "  --all                 every benchmark case of every op (each dtype, each T of --T)\n"
    "  --backend cpu|cuda    default: CUDA when a GPU is usable, else the CPU\n"
    "  --op %s|all   every case of one op (implies --all's list for that op)\n"
    "  --dtype f32|bf16|all  with --all: default all\n"
    "  --T LIST              with --all: comma-separated token counts (default 1,4106,16384)\n"
    "  --threads N           CPU worker threads (default: LMK_NUM_THREADS, else every core)\n"
    "  --iters N             timed iterations per case (default: adaptive, at least 5)\n"
    "  --variant NAME|list   force one CUDA kernel variant of its op (an A/B); list: the variants\n"
    "  --list                print the cases that would run, time nothing\n"
    "  --json                a JSON array on stdout instead of the table\n";

static const char usage_info[] =
    "usage: lmk info\n\nPrints the version, the build, the backends compiled in and the devices.\n";

/* The command table: name, what runs it, its usage (a format taking the op list twice, or none). */
static const struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *usage;
} k_commands[] = {
    {"info", tool_info, usage_info},
    {"check", tool_check, usage_check},
    {"bench", tool_bench, usage_bench},
};
#define N_COMMANDS (int)(sizeof k_commands / sizeof k_commands[0])

static const struct command *find_command(const char *name)
{
    for (int i = 0; i < N_COMMANDS; i++)
        if (!strcmp(name, k_commands[i].name))
            return &k_commands[i];
    return NULL;
}

static void print_usage(FILE *f, const struct command *c)
{
    if (!c) {
        fputs(usage_main, f);
        return;
    }
    char ops[160] = "";
    for (int i = 0; i < tst_op_count; i++)
        snprintf(ops + strlen(ops), sizeof ops - strlen(ops), "%s%s", i ? "|" : "", tst_ops[i]->name);
    fprintf(f, c->usage, ops, ops);
}

/* One "device" line per device; CUDA says why there is none rather than staying silent. */
int tool_info(int argc, char **argv)
{
    if (argc > 2)
        return tool_unknown_arg("info", argv[2]);
    printf("lmk %s\n", lmk_version());
    printf("build     %s\n", lmk_build_info());
#ifdef LMK_WITH_CUDA
    printf("backends  cpu cuda\n");
#else
    printf("backends  cpu\n");
#endif
    printf("ops      ");
    for (int i = 0; i < tst_op_count; i++)
        printf(" %s", tst_ops[i]->name);
    printf("\n");
    int rc = 0;
    lmk_device *dev = NULL;
    lmk_status st = lmk_device_open(LMK_BACKEND_CPU, 0, &dev);
    if (st != LMK_OK)
        rc = tool_lib_error(st, "cannot open the CPU device");
    else
        printf("device    cpu:0   %s\n", lmk_device_name(dev));
    lmk_device_close(dev);
#ifdef LMK_WITH_CUDA
    const int n_gpus = lmk_device_count(LMK_BACKEND_CUDA);
    if (n_gpus == 0)
        printf("device    cuda    no GPU\n");
    for (int i = 0; i < n_gpus; i++) {
        dev = NULL;
        st = lmk_device_open(LMK_BACKEND_CUDA, i, &dev);
        if (st != LMK_OK) {
            char what[64];
            snprintf(what, sizeof what, "cannot open CUDA device %d", i);
            rc = tool_lib_error(st, what);
        } else {
            printf("device    cuda:%d  %s\n", i, lmk_device_name(dev));
        }
        lmk_device_close(dev);
    }
#else
    printf("device    cuda    not built in (this build has no CUDA backend)\n");
#endif
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        print_usage(stderr, NULL);
        return TOOL_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        if (argc > 3)
            return tool_usage_error("%s takes at most one command, not also '%s' (try lmk help)", cmd, argv[3]);
        if (argc == 3 && !find_command(argv[2]))
            return tool_usage_error("%s: unknown command '%s' (try lmk help)", cmd, argv[2]);
        print_usage(stdout, argc == 3 ? find_command(argv[2]) : NULL);
        return 0;
    }
    if (!strcmp(cmd, "--version")) {
        printf("lmk %s\n", lmk_version());
        return 0;
    }
    const struct command *c = find_command(cmd);
    /* "lmk check --help" prints that command's options. */
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            print_usage(stdout, c);
            return 0;
        }
    if (c)
        return c->run(argc, argv);
    if (cmd[0] == '-')
        return tool_usage_error("unknown option %s (try lmk --help)", cmd);
    return tool_usage_error("unknown command '%s' (try lmk --help)", cmd);
}
