/*
 * lmk.c - the `lmk` command-line tool: main, `lmk info`, and the helpers check.c and bench.c share.
 *
 *     lmk info | check [--quick] ... | bench [--json] ... | help [command] | --help | --version
 *
 * The tool is the project's smoke test and its benchmark: `make run` is `lmk check --quick` then
 * `lmk bench`. Library failures are printed with lmk_status_name and lmk_last_error and end the
 * run with a non-zero exit status; usage errors exit with 2.
 */
#include "tool.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char usage_main[] =
    "usage: lmk <command> [options]\n"
    "\n"
    "commands:\n"
    "  info             version, build, backends and devices\n"
    "  check            every op on every backend against the float64 reference\n"
    "  bench            times the ops at Qwen3.5-27B shapes against a measured copy ceiling\n"
    "  help [command]   this text, or one command's options\n"
    "\n"
    "  lmk --version    prints the library version\n";

static const char usage_check[] =
    "usage: lmk check [--quick] [--backend cpu|cuda|all] [--op repeat|rope|all] [--seed N]\n"
    "\n"
    "Runs every op on every selected backend on fresh random data and compares each result with\n"
    "the float64 reference: f32 within 1e-5, bf16/f16 within 1 ulp + 1e-6, copies bit-exact.\n"
    "One line per case; the exit status is 1 if any case fails.\n"
    "\n"
    "  --quick                 small shapes only: a few seconds on a CPU\n"
    "  --backend cpu|cuda|all  default all: every backend this machine has (CUDA skipped without a GPU)\n"
    "  --op repeat|rope|all    default all\n"
    "  --seed N                seed of the random data (default: a fresh one, printed for reruns)\n";

static const char usage_bench[] =
    "usage: lmk bench [--backend cpu|cuda] [--op repeat|rope|all] [--dtype f32|bf16|all]\n"
    "                 [--T LIST] [--threads N] [--iters N] [--json]\n"
    "\n"
    "Times each op at Qwen3.5-27B shapes and reports GB/s of the bytes it must move against a copy\n"
    "ceiling measured in the same run. docs/bench.md explains the columns.\n"
    "\n"
    "  --backend cpu|cuda    default: CUDA when a GPU is usable, else the CPU\n"
    "  --op repeat|rope|all  default all\n"
    "  --dtype f32|bf16|all  default all\n"
    "  --T LIST              comma-separated token counts (default 1,4106,16384)\n"
    "  --threads N           CPU worker threads (default: LMK_NUM_THREADS, else every core)\n"
    "  --iters N             timed iterations per case (default: adaptive, at least 5)\n"
    "  --json                a JSON array on stdout instead of the table\n";

void tool_print_usage(FILE *f, const char *cmd)
{
    if (cmd && !strcmp(cmd, "check"))
        fputs(usage_check, f);
    else if (cmd && !strcmp(cmd, "bench"))
        fputs(usage_bench, f);
    else if (cmd && !strcmp(cmd, "info"))
        fputs("usage: lmk info\n\nPrints the version, the build, the backends compiled in and the devices.\n", f);
    else
        fputs(usage_main, f);
}

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

uint64_t tool_rng_next(tool_rng *r)
{
    uint64_t z = (r->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double tool_rng_uniform(tool_rng *r, double lo, double hi)
{
    return lo + (hi - lo) * (double)(tool_rng_next(r) >> 11) * 0x1.0p-53;
}

void tool_fill_random(tool_rng *r, lmk_dtype t, void *dst, size_t n)
{
    unsigned char *d = dst;
    if (t != LMK_F32 && t != LMK_BF16 && t != LMK_F16) {
        const size_t bytes = n * lmk_dtype_size(t);
        for (size_t i = 0; i < bytes; i += 8) {
            const uint64_t v = tool_rng_next(r);
            memcpy(d + i, &v, bytes - i < 8 ? bytes - i : 8);
        }
        return;
    }
    for (size_t i = 0; i < n; i++) {
        float f = (float)tool_rng_uniform(r, -2.0, 2.0);
        if (f == 0.0f) /* zeros would hide a kernel that never writes (buffers start zeroed) */
            f = 0.5f;
        if (t == LMK_F32) {
            memcpy(d + 4 * i, &f, 4);
        } else {
            const uint16_t h = t == LMK_BF16 ? lmk_f32_to_bf16(f) : lmk_f32_to_f16(f);
            memcpy(d + 2 * i, &h, 2);
        }
    }
}

double tool_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
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
        tool_print_usage(stderr, NULL);
        return TOOL_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        if (argc > 3)
            return tool_usage_error("%s takes at most one command, not also '%s' (try lmk help)", cmd, argv[3]);
        if (argc == 3 && strcmp(argv[2], "info") && strcmp(argv[2], "check") && strcmp(argv[2], "bench"))
            return tool_usage_error("%s: unknown command '%s' (try lmk help)", cmd, argv[2]);
        tool_print_usage(stdout, argc == 3 ? argv[2] : NULL);
        return 0;
    }
    if (!strcmp(cmd, "--version")) {
        printf("lmk %s\n", lmk_version());
        return 0;
    }
    /* "lmk check --help" prints that command's options. */
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            tool_print_usage(stdout, cmd);
            return 0;
        }
    if (!strcmp(cmd, "info"))
        return tool_info(argc, argv);
    if (!strcmp(cmd, "check"))
        return tool_check(argc, argv);
    if (!strcmp(cmd, "bench"))
        return tool_bench(argc, argv);
    if (cmd[0] == '-')
        return tool_usage_error("unknown option %s (try lmk --help)", cmd);
    return tool_usage_error("unknown command '%s' (try lmk --help)", cmd);
}
