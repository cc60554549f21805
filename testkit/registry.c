/*
 * registry.c - the registry of case descriptors, tst_ops[], and the cases it hands out.
 *
 * The registry is generated from src/ops/ops.h's LMK_OPS list: op `name` provides the descriptor
 * tst_op_<name> in src/ops/<name>/case.c, so a new op appears here (and in every driver that loops
 * over tst_ops) by its one line in ops.h. It is the kit's top layer: the descriptors use the rest
 * of the kit (inst.c and below), and only this file refers to them.
 */
#include "core/internal.h"
#include "testkit.h"

#include <string.h>

#define TST_OP_DECLARE(name) extern const tst_op tst_op_##name;
LMK_OPS(TST_OP_DECLARE)
#undef TST_OP_DECLARE

const tst_op *const tst_ops[] = {
#define TST_OP_ENTRY(name) &tst_op_##name,
    LMK_OPS(TST_OP_ENTRY)
#undef TST_OP_ENTRY
};
const int tst_op_count = LMK_OP_COUNT;

const tst_op *tst_op_find(const char *name)
{
    for (int i = 0; i < tst_op_count; i++)
        if (!strcmp(tst_ops[i]->name, name))
            return tst_ops[i];
    return NULL;
}

tst_case tst_op_case(const tst_op *op, int i)
{
    tst_case c;
    memset(&c, 0, sizeof c);
    op->get_case(i, &c);
    c.op = op;
    return c;
}

tst_case tst_op_random_case(const tst_op *op, tst_rng *r)
{
    tst_case c;
    memset(&c, 0, sizeof c);
    op->random_case(r, &c);
    c.op = op;
    return c;
}

int tst_op_bench_cases(const tst_op *op, uint32_t T, lmk_dtype dtype, bool longest, tst_case *out, int max)
{
    memset(out, 0, (size_t)max * sizeof *out);
    const int n = op->bench_cases ? op->bench_cases(T, dtype, longest, out, max) : 0;
    for (int i = 0; i < n; i++)
        out[i].op = op;
    return n;
}
