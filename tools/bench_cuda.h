/*
 * bench_cuda.h - device timing for `lmk bench` on CUDA devices (tools/bench_cuda.c; built only with
 * the CUDA backend). Every function takes the stream and the ordinal of its CUDA device (the one the
 * tool opened), which it makes current. Times are medians of many samples taken with cudaEvents on
 * the op's own stream; the copy ceiling is the bandwidth a device-to-device cudaMemcpyAsync
 * achieves, the number every memory-bound kernel is compared with.
 */
#ifndef LMK_BENCH_CUDA_H
#define LMK_BENCH_CUDA_H

#include "lmk.h"

#include <stddef.h>

/* Median device seconds per call of fn(ctx) on stream s: warmup calls, then `reps` samples each
   timing `inner` back-to-back calls with cudaEvents; if use_graph, the `inner` calls are captured once
   into a CUDA graph and each sample replays it. Returns LMK_OK or a status with lmk_last_error set.
   fn must enqueue its work on s; it may rotate among inputs through ctx (each call sees ctx as it
   is at that call; with use_graph, the calls seen during the capture are the ones replayed).
   Errors: INVALID_ARGUMENT (NULL s/fn/median_s, non-CUDA stream, warmup < 0, reps < 1, inner < 1,
   use_graph on the legacy default stream, which cannot be captured); what fn returns; DEVICE. */
lmk_status bench_cuda_time(lmk_stream *s, int ordinal, lmk_status (*fn)(void *ctx), void *ctx,
                               int warmup, int reps, int inner, int use_graph, double *median_s);

/* Device-to-device copy ceiling: median bytes/s (read+write counted) of cudaMemcpyAsync of `bytes`
   bytes, timed as a graph replay of back-to-back copies like the ops. The copies rotate among enough source/destination pairs that together they exceed four
   times the L2 cache, so the figure is DRAM's and not the cache's. Errors: INVALID_ARGUMENT (NULL
   s/bytes_per_s, bytes 0, non-CUDA stream); OUT_OF_MEMORY; DEVICE. */
lmk_status bench_cuda_copy_ceiling(lmk_stream *s, int ordinal, size_t bytes, double *bytes_per_s);

/* Host seconds per op call (enqueue only), median over `calls` calls. The stream is synchronized
   (untimed) every 64 calls so the launch queue never fills and blocks the host. Errors:
   INVALID_ARGUMENT (NULL arguments, calls < 1, non-CUDA stream); what fn returns; DEVICE. */
lmk_status bench_cuda_host_cost(lmk_stream *s, int ordinal, lmk_status (*fn)(void *ctx), void *ctx, int calls,
                                    double *median_s);

#endif /* LMK_BENCH_CUDA_H */
