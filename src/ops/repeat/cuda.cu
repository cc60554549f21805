/*
 * repeat_tiled.cu - the CUDA kernel of repeat_tiled (tiled GQA head broadcast) and its launcher.
 *
 * In the tiled order dst head h reads src head h % hg, so one token's dst block is its src block
 * (hg*k elements, S bytes) repeated rep = h/hg times back to back. The op is therefore a byte copy:
 * every S-byte src block t is read once and written to dst at t*rep*S + r*S for r < rep. The kernel
 * moves w-byte words, w the widest of 16/8/4/2/1 that divides S and both base addresses, so any
 * element size works and f32/bf16 shapes with k = 128 move 16 bytes per access. Each thread reads
 * one word and issues its rep stores; consecutive threads take consecutive words, so a warp reads
 * 512 contiguous bytes and writes rep runs of 512 contiguous bytes.
 *
 * Bytes moved: T*S read + T*rep*S written; the kernel is bound by DRAM bandwidth and is compared
 * with a device-to-device copy of the same byte count (docs/cuda_notes.md). The output goes out
 * with evict-first stores (st.global.cs): at prefill sizes it is far larger than L2, and keeping
 * the written lines from displacing the next src lines is what a streaming copy wants.
 *
 * Indices are 64-bit (T*H*K can pass 2^32); the grid is a fixed multiple of the SM count with a
 * grid-stride loop, so there is no limit on T. A 32-bit instantiation serves the common case
 * where the word count fits in 32 bits, because 64-bit division is a long software routine.
 */
#include "cuda/cuda_internal.h"
#include "ops/repeat/repeat.h"

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4; /* words loaded before the first store: loads in flight per thread */

/* One template over the word type V (uint4, uint2, unsigned, unsigned short, unsigned char) and the
 * index type I (uint32_t when the word count fits, else uint64_t). n: src words in all; nv: src words
 * per token; rep: h / hg. */
template <typename V, typename I>
__global__ void __launch_bounds__(kThreads)
repeat_tiled_kernel(const V *__restrict__ src, V *__restrict__ dst, I n, I nv, uint32_t rep)
{
    const I stride = (I)gridDim.x * kThreads;
    for (I base = (I)blockIdx.x * kThreads + threadIdx.x; base < n; base += kUnroll * stride) {
        V v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; u++) {
            const I i = base + u * stride;
            if (i < n)
                v[u] = __ldcs(src + i);
        }
#pragma unroll
        for (int u = 0; u < kUnroll; u++) {
            const I i = base + u * stride;
            if (i < n) {
                const I t = i / nv;
                V *d = dst + (t * rep * nv + (i - t * nv));
                for (uint32_t r = 0; r < rep; r++)
                    __stcs(d + (I)r * nv, v[u]);
            }
        }
    }
}

template <typename V, typename I>
cudaError_t launch(const lmk_repeat_args *a, size_t w, int blocks_cap, cudaStream_t st)
{
    const uint64_t n = (uint64_t)(a->seq * a->hg * a->k * a->elem_size / w);
    const uint64_t nv = (uint64_t)(a->hg * a->k * a->elem_size / w);
    const uint32_t rep = (uint32_t)(a->h / a->hg);
    uint64_t blocks = (n + kThreads - 1) / kThreads;
    if (blocks > (uint64_t)blocks_cap)
        blocks = (uint64_t)blocks_cap;
    repeat_tiled_kernel<V, I><<<(unsigned)blocks, kThreads, 0, st>>>(
        (const V *)a->src, (V *)a->dst, (I)n, (I)nv, rep);
    return cudaGetLastError();
}

template <typename V>
cudaError_t launch_width(const lmk_repeat_args *a, size_t w, int blocks_cap, cudaStream_t st)
{
    const uint64_t n = (uint64_t)(a->seq * a->hg * a->k * a->elem_size / w);
    /* The 32-bit path needs every dst word index, and every loop index (which runs up to
     * kUnroll grid strides past n), to fit: under 2^31 leaves room for both. */
    const uint64_t dst_words = n * (uint64_t)(a->h / a->hg);
    if (dst_words < (UINT64_C(1) << 31))
        return launch<V, uint32_t>(a, w, blocks_cap, st);
    return launch<V, uint64_t>(a, w, blocks_cap, st);
}

template <typename V>
void preload_width(cudaError_t *first)
{
    cudaFuncAttributes attr;
    cudaError_t e = cudaFuncGetAttributes(&attr, repeat_tiled_kernel<V, uint32_t>);
    if (e == cudaSuccess)
        e = cudaFuncGetAttributes(&attr, repeat_tiled_kernel<V, uint64_t>);
    if (e != cudaSuccess && *first == cudaSuccess)
        *first = e;
}

} /* namespace */

lmk_status lmk_cuda_repeat(lmk_stream *s, const void *args)
{
    const lmk_repeat_args *a = (const lmk_repeat_args *)args;
    const bool dense_tiled = a->layout == LMK_REPEAT_TILED && a->src_head == a->k && a->dst_head == a->k &&
                             a->src_tok == a->hg * a->k && a->dst_tok == a->h * a->k;
    if (!dense_tiled)
        return lmk_fail(LMK_ERR_UNSUPPORTED, "repeat_heads: strided or block layouts are not yet on CUDA");
    const lmk_cuda_device *d = lmk_cuda_dev(s->dev);
    lmk_status st = lmk_cuda_use(d->ordinal, "repeat_tiled: cudaSetDevice");
    if (st != LMK_OK)
        return st;

    /* Widest word that divides the per-token src block and both base addresses. Every word then
     * stays aligned: dst offsets are multiples of S too. */
    const size_t block_bytes = a->hg * a->k * a->elem_size;
    const uintptr_t addr_bits = (uintptr_t)a->src | (uintptr_t)a->dst | (uintptr_t)block_bytes;
    size_t w = 16;
    while (w > 1 && (addr_bits & (w - 1)) != 0)
        w >>= 1;

    /* 8 blocks of 256 threads per SM fill an H100/H200 SM (2048 threads); fewer when there are
     * fewer words. More blocks would only add loop setup. */
    const int blocks_cap = d->sm_count * 8;
    const cudaStream_t cs = lmk_cuda_stream_of(s);
    cudaError_t e;
    switch (w) {
    case 16: e = launch_width<uint4>(a, w, blocks_cap, cs); break;
    case 8: e = launch_width<uint2>(a, w, blocks_cap, cs); break;
    case 4: e = launch_width<unsigned>(a, w, blocks_cap, cs); break;
    case 2: e = launch_width<unsigned short>(a, w, blocks_cap, cs); break;
    default: e = launch_width<unsigned char>(a, w, blocks_cap, cs); break;
    }
    return e == cudaSuccess ? LMK_OK : lmk_cuda_fail(e, "repeat_tiled: kernel launch");
}

cudaError_t lmk_cuda_repeat_preload(void)
{
    cudaError_t first = cudaSuccess;
    preload_width<uint4>(&first);
    preload_width<uint2>(&first);
    preload_width<unsigned>(&first);
    preload_width<unsigned short>(&first);
    preload_width<unsigned char>(&first);
    return first;
}
