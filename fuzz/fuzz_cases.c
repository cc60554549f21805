/*
 * fuzz_cases.c - the fuzz driver of the case descriptors: every op of the registry (tst_ops,
 * generated from src/ops/ops.h), on random valid cases drawn from the input, checked the way the
 * tests check them. A new op is fuzzed here by its src/ops/<op>/case.c alone.
 *
 * One input picks an op, a seed for its descriptor's random_case (every mode, layout, dtype and
 * scaling the op has: dense and strided operands, in place or not, aligned or not), one of three
 * CPU devices (LMK_CPU_ISA capped at scalar, avx2, and the best the machine has) and two of its
 * streams (1, 2 or 3 worker threads), and one of the calls the op must reject. Checked:
 *   valid:   LMK_OK (or LMK_ERR_UNSUPPORTED, counted: the backend lacks the case); outputs within
 *            the op's contract of the float64 reference; every other byte (guards, the gaps of
 *            strided layouts, inputs) untouched; no host allocation inside the call;
 *   the same: made again from the same seed and run on the other stream, the outputs are the same
 *            bits (the result does not depend on the thread count);
 *   invalid: LMK_ERR_INVALID_ARGUMENT with a message naming the op, no byte changed, no host
 *            allocation inside the call;
 *   always:  no leak once the case is freed.
 */
#include "fuzz_common.h"

static lmk_device *g_devs[3];   /* LMK_CPU_ISA = scalar, avx2, (unset) */
static lmk_stream *g_all[3][3]; /* per device: 1, 2 and 3 worker threads */

static void init(void)
{
    if (g_devs[0])
        return;
    fz_install_allocator();
    fz_open_cpu_levels(g_devs, g_all);
}

/* Every region of the instance read back, concatenated. */
static unsigned char *read_all(const tst_inst *in, size_t *len)
{
    *len = 0;
    for (int r = 0; r < in->mem.n_r; r++)
        *len += in->mem.r[r].len;
    unsigned char *all = malloc(*len + 1);
    FZ_CHECK(all != NULL, "harness: out of memory");
    size_t at = 0;
    for (int r = 0; r < in->mem.n_r; r++) {
        FZ_CHECK(tst_mem_read(&in->mem, r, 0, all + at, in->mem.r[r].len) == LMK_OK, "read back: %s",
                 lmk_last_error());
        at += in->mem.r[r].len;
    }
    return all;
}

/* Runs the instance on s with the allocation counter watching; returns the status. */
static lmk_status counted_run(const tst_inst *in, lmk_stream *s, const char *name)
{
    const long before = atomic_load(&fz_n_allocs);
    const lmk_status st = tst_inst_run(in, s);
    FZ_CHECK(atomic_load(&fz_n_allocs) == before, "%s: the op call allocated %ld times", name,
             atomic_load(&fz_n_allocs) - before);
    return st == LMK_OK ? lmk_stream_sync(s) : st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    init();
    fz_in in = {data, size};
    const long live_before = atomic_load(&fz_n_live);
    const tst_op *op = tst_ops[fz_pick(&in, (unsigned)tst_op_count)];
    const uint64_t seed = fz_u64(&in);
    const unsigned dev = 2 - fz_pick(&in, 3); /* 0 (the default byte): the best ISA */
    lmk_stream *s1 = g_all[dev][fz_pick(&in, 3)], *s2 = g_all[dev][fz_pick(&in, 3)];
    const int invalid = op->n_invalid ? (int)fz_pick(&in, (unsigned)op->n_invalid) : -1;

    tst_rng r = tst_rng_make(seed);
    const tst_case c = tst_op_random_case(op, &r);
    tst_inst *inst = NULL;
    lmk_status st = tst_inst_make(&c, g_devs[dev], seed, 0, NULL, &inst);
    FZ_CHECK(st == LMK_OK, "%s: making the case: %s: %s", c.name, lmk_status_name(st), lmk_last_error());
    fz_stat("inputs");

    st = counted_run(inst, s1, c.name);
    if (st == LMK_ERR_UNSUPPORTED) {
        fz_stat("valid calls the CPU does not support yet");
    } else {
        FZ_CHECK(st == LMK_OK, "%s: %s: %s", c.name, lmk_status_name(st), lmk_last_error());
        tst_result res;
        FZ_CHECK(tst_inst_verify(inst, &res), "%s (seed 0x%016llx, %s): %s", c.name, (unsigned long long)seed,
                 lmk_device_name(g_devs[dev]), res.msg);
        fz_stat("valid calls checked against the reference");
        size_t n1, n2;
        unsigned char *first = read_all(inst, &n1);
        FZ_CHECK(tst_inst_reset(inst, seed) == LMK_OK, "reset: %s", lmk_last_error());
        FZ_CHECK(counted_run(inst, s2, c.name) == LMK_OK, "%s: second run: %s", c.name, lmk_last_error());
        unsigned char *second = read_all(inst, &n2);
        FZ_CHECK(n1 == n2 && memcmp(first, second, n1) == 0,
                 "%s (seed 0x%016llx): different bits on a stream of another thread count (byte %lld)", c.name,
                 (unsigned long long)seed, tst_bits_diff(first, second, n1));
        fz_stat("valid calls run twice, the same bits");
        free(first);
        free(second);
    }

    if (invalid >= 0) {
        const long before = atomic_load(&fz_n_allocs);
        const char *want;
        lmk_clear_error();
        const lmk_status bad = op->invalid(inst, s1, invalid, &want);
        FZ_CHECK(atomic_load(&fz_n_allocs) == before, "%s: rejected call %d allocated", c.name, invalid);
        FZ_CHECK(bad == LMK_ERR_INVALID_ARGUMENT, "%s: invalid call %d returned %s", c.name, invalid,
                 lmk_status_name(bad));
        tst_result res;
        FZ_CHECK(tst_inst_reject(inst, s1, invalid, &res), "%s: %s", c.name, res.msg);
        fz_stat("rejected calls that changed nothing");
    }
    tst_inst_free(inst);
    FZ_CHECK(atomic_load(&fz_n_live) == live_before, "leak: %ld host allocations outstanding",
             atomic_load(&fz_n_live) - live_before);
    return 0;
}
