/*
 * lmk_cuda.h - CUDA interop for lmk: run lmk ops on a caller's cudaStream_t, on memory the caller
 * owns (a PyTorch tensor, a cudaMalloc'd pool), and inside the caller's CUDA graphs.
 *
 * Available when lmk is built with its CUDA backend (lmk_build_info() says "cuda=yes"); include it
 * after or instead of <cuda_runtime_api.h>, which it includes. Everything in lmk.h applies.
 *
 * Memory. lmk_buffer_wrap on a CUDA device takes a device pointer that the caller owns, e.g.
 * (void *)tensor.data_ptr() of a contiguous PyTorch CUDA tensor, or any pointer from cudaMalloc,
 * cudaMallocAsync or cudaMallocManaged, on that device. lmk never frees it; it must stay valid
 * until the last op that uses it has finished on the GPU (not merely been queued). Any pointer
 * aligned to its dtype works; pointers and row sizes that are multiples of 16 bytes take the
 * 16-byte-access path. lmk_buffer_data of a CUDA buffer is a device pointer the caller may hand to
 * its own kernels. lmk_buffer_read/lmk_buffer_write run on a private stream of the device and have
 * finished when they return; they are ordered after work on other streams only if the caller
 * synchronized those streams first.
 *
 * Streams and graphs. An op call makes no allocation, no synchronization and no host copy: it only
 * enqueues one kernel on the stream. It can therefore be captured into a CUDA graph, in any
 * capture mode, on a stream from lmk_stream_create or lmk_stream_wrap_cuda. The captured kernel
 * keeps the buffers' addresses and the parameter values of the call; the buffers' contents are
 * read when the graph runs, so positions (say) may be rewritten between replays.
 *
 * Current device. Every lmk call on a CUDA handle makes that handle's device the calling thread's
 * current device (cudaSetDevice, skipped when it already is) and does not restore the previous one.
 *
 * Errors. A failed launch is LMK_ERR_DEVICE at the op call. A fault while a kernel runs (e.g. an
 * illegal address from a buffer wrapping freed memory) is reported asynchronously, as
 * LMK_ERR_DEVICE with CUDA's text, by lmk_stream_sync or by whichever later call first sees it.
 * Such faults are sticky: the CUDA context of that device in this process is corrupted, and every
 * later CUDA call in the process that touches it, lmk's and other libraries' alike (PyTorch's
 * included), fails with the same error. Handles can still be freed and closed (their errors are
 * ignored), but the GPU is unusable by this process until it exits; a new process starts clean.
 * lmk never calls cudaDeviceReset, which would destroy every other allocation of the process.
 */
#ifndef LMK_CUDA_H
#define LMK_CUDA_H

#include "lmk.h"

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Makes an lmk stream that enqueues onto the caller's CUDA stream `stream` of device `dev`.
 * stream may be 0 (the legacy default stream), cudaStreamLegacy or cudaStreamPerThread. The
 * stream is borrowed: lmk_stream_destroy waits for its work (unless it is being captured into a
 * graph) and frees only the lmk handle, never the cudaStream_t, which must outlive the handle.
 * A stream may be wrapped while it is being captured (CUDA then refuses to say which device it
 * belongs to, so that one check is skipped: a stream of another device fails at its first op).
 * Errors: INVALID_ARGUMENT (dev or out NULL, dev not a CUDA device, stream of another device);
 * OUT_OF_MEMORY (host); DEVICE. */
LMK_API lmk_status lmk_stream_wrap_cuda(lmk_device *dev, cudaStream_t stream, lmk_stream **out);

/* The cudaStream_t an lmk CUDA stream enqueues onto (its own or the borrowed one), e.g. for
 * cudaStreamBeginCapture or for ordering the caller's kernels with cudaEvents. Valid while the
 * handle lives. Returns 0 for NULL or a non-CUDA stream (0 is also the legacy default stream a
 * wrapped stream may hold). */
LMK_API cudaStream_t lmk_stream_cuda_handle(const lmk_stream *s);

#ifdef __cplusplus
}
#endif
#endif /* LMK_CUDA_H */
