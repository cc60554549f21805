/*
 * ops.h - the list of lmk's ops: the one place an op is registered.
 *
 * Each entry X(name) is an op whose files live in src/ops/<name>/: op.c (validation of the public
 * entry points, then lmk_dispatch), ref.c (float64 reference), cpu.c (lmk_cpu_<name>), cuda.cu
 * (lmk_cuda_<name> and lmk_cuda_<name>_preload) and case.c (its case descriptor for the tools,
 * tests and fuzzers). From this list follow the backend slots (lmk_backend_ops.op), the backends'
 * tables, the CUDA preloads at device open and the case registry. Adding an op adds one line here.
 */
#ifndef LMK_OPS_H
#define LMK_OPS_H

#define LMK_OPS(X) \
    X(repeat)      \
    X(rope)        \
    X(attn_prologue) \
    X(causal_conv1d) \
    X(gated_delta_rule)

typedef enum lmk_op_id {
#define LMK_OP_ENUM(name) LMK_OP_##name,
    LMK_OPS(LMK_OP_ENUM)
#undef LMK_OP_ENUM
    LMK_OP_COUNT
} lmk_op_id;

#endif /* LMK_OPS_H */
