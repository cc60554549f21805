/*
 * test_cli.c - the `lmk` tool's argument parsing: exit statuses and messages.
 *
 * Runs the built tool (the environment variable LMK_TOOL, else ../lmk next to this program's
 * directory: the tool is build/lmk, the tests build/tests/test_*) with posix_spawn, captures its
 * stdout and stderr, and checks the exit status and the message of each bad command line. Every
 * case that the parser should accept is followed by an unknown option (--zz-stop), so that no case
 * ever starts a real check or benchmark: a case the parser wrongly accepts then shows up as the
 * message about --zz-stop instead of the expected one.
 */
#include "harness.h"
#include "lmk.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

HARNESS_DEFINE;

extern char **environ;

static char g_tool[PATH_MAX];

/* The tool's path: $LMK_TOOL, else <directory of this program>/../lmk. */
static bool find_tool(void)
{
    const char *env = getenv("LMK_TOOL");
    if (env && *env) {
        if (snprintf(g_tool, sizeof g_tool, "%s", env) >= (int)sizeof g_tool)
            return false;
        return access(g_tool, X_OK) == 0;
    }
    char self[PATH_MAX];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return false;
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (!slash)
        return false;
    *slash = '\0';
    if (snprintf(g_tool, sizeof g_tool, "%s/../lmk", self) >= (int)sizeof g_tool)
        return false;
    return access(g_tool, X_OK) == 0;
}

/* Runs the tool with args (NULL-terminated, without argv[0]); out gets stdout and stderr together.
 * Returns the exit status, or -1 when it could not run or was killed (a 30 s timeout). */
static int run_tool(const char *const *args, char *out, size_t cap)
{
    const char *argv[32] = {g_tool};
    int argc = 1;
    for (; args[argc - 1] && argc < 31; argc++)
        argv[argc] = args[argc - 1];
    argv[argc] = NULL;
    out[0] = '\0';
    int fds[2];
    if (pipe(fds) != 0)
        return -1;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    posix_spawn_file_actions_addclose(&fa, fds[1]);
    pid_t pid;
    const int err = posix_spawn(&pid, g_tool, &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    if (err != 0) {
        close(fds[0]);
        return -1;
    }
    /* Read until EOF, giving up after 30 s. */
    fcntl(fds[0], F_SETFL, O_NONBLOCK);
    size_t len = 0;
    const struct timespec tick = {0, 5 * 1000 * 1000};
    bool timed_out = false;
    for (int waited_ms = 0;; waited_ms += 5) {
        char buf[4096];
        const ssize_t r = read(fds[0], buf, sizeof buf);
        if (r > 0) {
            const size_t k = len + (size_t)r < cap - 1 ? (size_t)r : cap - 1 - len;
            memcpy(out + len, buf, k);
            len += k;
            out[len] = '\0';
            continue;
        }
        if (r == 0)
            break;
        if (errno != EAGAIN && errno != EINTR)
            break;
        if (waited_ms > 30000) {
            timed_out = true;
            kill(pid, SIGKILL);
            break;
        }
        nanosleep(&tick, NULL);
    }
    close(fds[0]);
    int ws = 0;
    waitpid(pid, &ws, 0);
    if (timed_out || !WIFEXITED(ws))
        return -1;
    return WEXITSTATUS(ws);
}

/* One case: the tool run with args must exit with `want_rc` and print every string of `must`
 * (NULL-terminated) and none of `must_not`. */
static void expect(const char *what, const char *const *args, int want_rc, const char *const *must,
                   const char *const *must_not)
{
    static char out[1 << 16];
    const int rc = run_tool(args, out, sizeof out);
    bool ok = rc == want_rc;
    for (int i = 0; must && must[i]; i++)
        ok = ok && strstr(out, must[i]) != NULL;
    for (int i = 0; must_not && must_not[i]; i++)
        ok = ok && strstr(out, must_not[i]) == NULL;
    CHECK(ok, "%s: exit %d (want %d), output:\n%s", what, rc, want_rc, out);
}

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})
#define NONE NULL

int main(void)
{
    if (!find_tool()) {
        SKIP("cli: the lmk tool was not found at %s (set LMK_TOOL)", g_tool[0] ? g_tool : "../lmk");
        return harness_summary();
    }

    char version[64]; /* the tool prints the library's version: lmk.h's */
    snprintf(version, sizeof version, "lmk %d.%d.%d\n", LMK_VERSION_MAJOR, LMK_VERSION_MINOR, LMK_VERSION_PATCH);
    expect("--version", ARGS("--version"), 0, ARGS(version), NONE);

    /* bench --list times nothing: every headline entry (tools/bench.c) must pick exactly one of its
     * op's cases, so a renamed case breaks this rather than `make run`. */
    expect("bench --list", ARGS("bench", "--list"), 0, ARGS("T=4106 bf16  =  ", "T=1 bf16  =  ", "// Qwen3-8B"),
           ARGS("lmk:"));
    expect("bench --all --list", ARGS("bench", "--all", "--list"), 0, ARGS("T=16384 f32", "T=1 bf16"),
           ARGS("  =  ", "lmk:"));
    expect("bench --op rope --list", ARGS("bench", "--op", "rope", "--list"), 0, ARGS("rope_multi_qk", "T=16384"),
           ARGS("attn_prologue", "  =  "));

    /* --seed: decimal digits only */
    expect("--seed ' -1'", ARGS("check", "--seed", " -1", "--zz-stop"), 2, ARGS("--seed", "' -1'"),
           ARGS("zz-stop"));
    expect("--seed=' 5' (leading blank)", ARGS("check", "--seed= 5", "--zz-stop"), 2, ARGS("--seed", "' 5'"),
           ARGS("zz-stop"));
    expect("--seed -1", ARGS("check", "--seed", "-1", "--zz-stop"), 2, ARGS("--seed", "'-1'"), ARGS("zz-stop"));
    expect("--seed +5", ARGS("check", "--seed", "+5", "--zz-stop"), 2, ARGS("--seed", "'+5'"), ARGS("zz-stop"));
    expect("--seed 5x", ARGS("check", "--seed", "5x", "--zz-stop"), 2, ARGS("--seed", "'5x'"), ARGS("zz-stop"));
    expect("--seed 2^64 (overflow)", ARGS("check", "--seed", "18446744073709551616", "--zz-stop"), 2,
           ARGS("--seed"), ARGS("zz-stop"));
    expect("--seed 2^64-1 is accepted", ARGS("check", "--seed", "18446744073709551615", "--zz-stop"), 2,
           ARGS("unknown option --zz-stop"), NONE);
    expect("--seed 0 is accepted", ARGS("check", "--seed", "0", "--zz-stop"), 2, ARGS("unknown option --zz-stop"),
           NONE);
    expect("--threads ' 4'", ARGS("bench", "--threads", " 4", "--zz-stop"), 2, ARGS("--threads", "' 4'"),
           ARGS("zz-stop"));

    /* --T lists */
    expect("--T 1,,2 (empty item)", ARGS("bench", "--T", "1,,2", "--zz-stop"), 2, ARGS("--T", "empty"),
           ARGS("zz-stop"));
    expect("--T ,1 (empty first item)", ARGS("bench", "--T", ",1", "--zz-stop"), 2, ARGS("--T", "empty"),
           ARGS("zz-stop"));
    expect("--T 1, (empty last item)", ARGS("bench", "--T", "1,", "--zz-stop"), 2, ARGS("--T", "empty"),
           ARGS("zz-stop"));
    expect("--T '' (empty list)", ARGS("bench", "--T", "", "--zz-stop"), 2, ARGS("--T"), ARGS("zz-stop"));
    expect("--T 1,' 2'", ARGS("bench", "--T", "1, 2", "--zz-stop"), 2, ARGS("--T", "' 2'"), ARGS("zz-stop"));
    {
        /* 17 items, 20 characters each: 356 characters, more than the old 256-byte copy held */
        static char list[17 * 21];
        list[0] = '\0';
        for (int i = 0; i < 17; i++)
            strcat(list, i ? ",00000000000000000001" : "00000000000000000001");
        expect("--T with 17 long items", ARGS("bench", "--T", list, "--zz-stop"), 2, ARGS("--T", "at most 16"),
               ARGS("zz-stop"));
        /* 16 long items are fine */
        list[16 * 21 - 1] = '\0';
        expect("--T with 16 long items is accepted", ARGS("bench", "--T", list, "--zz-stop"), 2,
               ARGS("unknown option --zz-stop"), NONE);
    }
    {
        static char list[64];
        strcpy(list, "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17");
        expect("--T with 17 items", ARGS("bench", "--T", list, "--zz-stop"), 2, ARGS("--T", "at most 16"),
               ARGS("zz-stop"));
    }
    expect("--T 1,4106 is accepted", ARGS("bench", "--T", "1,4106", "--zz-stop"), 2,
           ARGS("unknown option --zz-stop"), NONE);
    expect("--T 0", ARGS("bench", "--T", "0", "--zz-stop"), 2, ARGS("--T", "'0'"), ARGS("zz-stop"));

    /* help */
    expect("help check", ARGS("help", "check"), 0, ARGS("usage: lmk check"), NONE);
    expect("help nosuch", ARGS("help", "nosuch"), 2, ARGS("unknown command 'nosuch'"), NONE);
    expect("help check extra", ARGS("help", "check", "extra"), 2, ARGS("extra"), ARGS("unknown command 'check'"));

    return harness_summary();
}
