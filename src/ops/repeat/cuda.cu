/*
 * cuda.cu - the CUDA kernels of repeat_heads / repeat_tiled (GQA head broadcast, tiled or block
 * layout, dense or strided operands) and their launcher.
 *
 * Two kernels, both byte copies in w-byte words (w the widest of 16/8/4/2/1 that divides every
 * row, stride and base address involved), so any element size is bit-exact and f32/bf16 shapes
 * with k = 128 move 16 bytes per access. Each loads every source word once (ld.global.cs: nothing
 * re-reads it) and stores it to the rep = h/hg places that read it, with evict-first stores
 * (st.global.cs): at prefill sizes the output is far larger than L2, and keeping the written lines
 * from displacing the next source lines is what a streaming copy wants. Bytes moved are the least
 * possible, src once + dst once, so both are bound by DRAM bandwidth and are compared with a
 * device-to-device copy of the same byte count (docs/cuda.md, "repeat").
 *
 * 1. repeat_units_kernel: dense operands in which the output is
 *    a run of units, each a source unit of S bytes repeated rep times back to back. In the tiled
 *    layout a unit is one token's src block (hg*k elements: dst head i reads i % hg); in the block
 *    layout it is one source head row (k elements: dst heads g*rep .. g*rep+rep-1 all read head g).
 *    With hg == h or hg == 1 the two layouts are the same copy, so those take the tiled units.
 *    Each thread reads one word and issues its rep stores; consecutive threads take consecutive
 *    words, so a warp reads 512 contiguous bytes and writes rep runs of 512 contiguous bytes.
 *
 * 2. repeat_rows_kernel: everything else (strided src or dst). The work is the source rows (token
 *    t, source head g) of k elements; consecutive threads take consecutive words of a row, then of
 *    the next row, so warps stay coalesced within rows. Source row (t, g) goes to the dst rows of
 *    the heads that read g, which both layouts place at a fixed stride:
 *        TILED: heads g + r*hg       -> dst + t*dst_tok + g*dst_head     + r*(hg*dst_head)
 *        BLOCK: heads g*rep + r      -> dst + t*dst_tok + g*rep*dst_head + r*dst_head
 *    so the kernel has no layout branch: the host passes the two strides (per source head, per
 *    copy). A thread's position (token, head, word) is kept as mixed-radix counters advanced by
 *    the constant grid stride, so the loop has no division; offsets are 64-bit products.
 *
 * Indices are 64-bit where they can pass 2^32 (T*H*K can); grids are a fixed multiple of the SM
 * count with grid-stride loops, so there is no limit on T. The units kernel has a 32-bit
 * instantiation for the common case where every word index fits, because 64-bit division is a
 * long software routine.
 */
#include "cuda/cuda_internal.h"
#include "ops/repeat/repeat.h"

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4; /* words loaded before the first store: loads in flight per thread */
/* Blocks per SM of each kernel's grid, all resident at once (a grid-stride loop gives every block
 * the same work, so a second wave would run at a fraction of the occupancy). The units kernel needs
 * at most 32 registers in its 32-bit form: 8 blocks of 256 fill an H100/H200 SM (2048 threads). The
 * rows kernel needs 40 with 16-byte words (ptxas spilled 112 bytes under a 32-register cap), so 6
 * blocks of 256: 1536 threads with 4 loads of 16 bytes in flight each, 96 KB per SM, by estimate
 * (latency x bandwidth / SMs ~ 36 KB) more than DRAM latency needs. */
constexpr int kUnitsBlocksPerSm = 8;
constexpr int kRowsBlocksPerSm = 6;

/* One template over the word type V (uint4, uint2, unsigned, unsigned short, unsigned char) and the
 * index type I (uint32_t when the word count fits, else uint64_t). n: src words in all; nv: src words
 * per unit; rep: copies of each unit. */
template <typename V, typename I>
__global__ void __launch_bounds__(kThreads)
repeat_units_kernel(const V *__restrict__ src, V *__restrict__ dst, I n, I nv, uint32_t rep)
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

/* The geometry of repeat_rows_kernel, in words. Source row (t, g) is at src + t*src_tok + g*src_head;
 * its copy r goes to dst + t*dst_tok + g*dst_group + r*dst_rep. A thread advances by the grid's
 * thread count, split here into whole tokens, source heads and words (step_t, step_g, step_j), so
 * its counters move with additions and carries only. */
struct rows_geom {
    uint64_t seq;                 /* tokens */
    uint32_t hg, nw, rep;         /* source heads, words per row, copies per source row */
    uint64_t src_tok, src_head;
    uint64_t dst_tok, dst_group, dst_rep;
    uint64_t step_t;
    uint32_t step_g, step_j;      /* < hg, < nw */
};

template <typename V>
__global__ void __launch_bounds__(kThreads, kRowsBlocksPerSm)
repeat_rows_kernel(const V *__restrict__ src, V *__restrict__ dst, const rows_geom g)
{
    /* This thread's first position: q < gridDim.x * kThreads < 2^31, so 32-bit division suffices
     * (once per thread). */
    const uint32_t q = blockIdx.x * kThreads + threadIdx.x;
    uint32_t j = q % g.nw, h = (q / g.nw) % g.hg;
    uint64_t t = (q / g.nw) / g.hg;
    while (t < g.seq) {
        V v[kUnroll];
        V *d[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; u++) {
            d[u] = nullptr;
            if (t < g.seq) {
                v[u] = __ldcs(src + (t * g.src_tok + h * g.src_head + j));
                d[u] = dst + (t * g.dst_tok + h * g.dst_group + j);
            }
            /* Advance by the grid stride, carrying word -> head -> token. Written as comparisons
             * with nw - step_j and hg - step_g so that no sum can pass 2^32. */
            uint32_t carry = 0;
            if (j >= g.nw - g.step_j) {
                j -= g.nw - g.step_j;
                carry = 1;
            } else {
                j += g.step_j;
            }
            h += carry; /* <= hg */
            if (h >= g.hg - g.step_g) {
                h -= g.hg - g.step_g;
                t += 1;
            } else {
                h += g.step_g;
            }
            t += g.step_t;
        }
#pragma unroll
        for (int u = 0; u < kUnroll; u++)
            if (d[u])
                for (uint32_t r = 0; r < g.rep; r++)
                    __stcs(d[u] + (uint64_t)r * g.dst_rep, v[u]);
    }
}

/* Blocks for `n` words: one per kThreads words, at most blocks_cap (a full SM's worth per SM). More
 * blocks would only add loop setup. */
unsigned grid_for(uint64_t n, int blocks_cap)
{
    uint64_t blocks = (n + kThreads - 1) / kThreads;
    if (blocks > (uint64_t)blocks_cap)
        blocks = (uint64_t)blocks_cap;
    return (unsigned)(blocks ? blocks : 1);
}

/* The units kernel over `units` source units of `unit_bytes` bytes, each copied rep times. */
template <typename V>
cudaError_t launch_units(const lmk_repeat_args *a, uint64_t units, uint64_t unit_bytes, uint32_t rep, size_t w,
                         int sm_count, cudaStream_t st)
{
    const uint64_t nv = unit_bytes / w, n = units * nv;
    const unsigned blocks = grid_for(n, sm_count * kUnitsBlocksPerSm);
    /* The 32-bit path needs every dst word index, and every loop index (which runs up to
     * kUnroll grid strides past n), to fit: under 2^31 leaves room for both. */
    if (n * rep < (UINT64_C(1) << 31))
        repeat_units_kernel<V, uint32_t><<<blocks, kThreads, 0, st>>>((const V *)a->src, (V *)a->dst, (uint32_t)n,
                                                                     (uint32_t)nv, rep);
    else
        repeat_units_kernel<V, uint64_t><<<blocks, kThreads, 0, st>>>((const V *)a->src, (V *)a->dst, n, nv, rep);
    return cudaGetLastError();
}

/* The rows kernel for any strides. */
template <typename V>
cudaError_t launch_rows(const lmk_repeat_args *a, size_t w, int sm_count, cudaStream_t st)
{
    const uint64_t es = a->elem_size, rep = a->h / a->hg;
    rows_geom g;
    g.seq = a->seq;
    g.hg = (uint32_t)a->hg;
    g.nw = (uint32_t)(a->k * es / w); /* w >= es (every size is a multiple of es), so nw <= k < 2^32 */
    g.rep = (uint32_t)rep;
    g.src_tok = a->src_tok * es / w;
    g.src_head = a->src_head * es / w;
    g.dst_tok = a->dst_tok * es / w;
    const uint64_t dst_head = a->dst_head * es / w;
    if (a->layout == LMK_REPEAT_BLOCK) {
        g.dst_group = rep * dst_head;
        g.dst_rep = dst_head;
    } else {
        g.dst_group = dst_head;
        g.dst_rep = a->hg * dst_head;
    }
    const uint64_t row_words = (uint64_t)g.hg * g.nw;
    const unsigned blocks = grid_for(g.seq * row_words, sm_count * kRowsBlocksPerSm);
    const uint64_t step = (uint64_t)blocks * kThreads;
    g.step_j = (uint32_t)(step % g.nw);
    g.step_g = (uint32_t)(step / g.nw % g.hg);
    g.step_t = step / row_words;
    repeat_rows_kernel<V><<<blocks, kThreads, 0, st>>>((const V *)a->src, (V *)a->dst, g);
    return cudaGetLastError();
}

/* Widest word (16, 8, 4, 2 or 1 bytes) that divides every value in `bits` (ORed together). */
size_t word_for(uint64_t bits)
{
    size_t w = 16;
    while (w > 1 && (bits & (w - 1)) != 0)
        w >>= 1;
    return w;
}

/* Whether the operands are dense for the units kernel: every stride that is used (axes longer than
 * 1) is the dense row-major one. */
bool dense(const lmk_repeat_args *a)
{
    return (a->hg == 1 || a->src_head == a->k) && (a->h == 1 || a->dst_head == a->k) &&
           (a->seq == 1 || (a->src_tok == a->hg * a->k && a->dst_tok == a->h * a->k));
}

template <typename V>
void preload_width(cudaError_t *first)
{
    cudaFuncAttributes attr;
    cudaError_t e = cudaFuncGetAttributes(&attr, repeat_units_kernel<V, uint32_t>);
    if (e == cudaSuccess)
        e = cudaFuncGetAttributes(&attr, repeat_units_kernel<V, uint64_t>);
    if (e == cudaSuccess)
        e = cudaFuncGetAttributes(&attr, repeat_rows_kernel<V>);
    if (e != cudaSuccess && *first == cudaSuccess)
        *first = e;
}

} /* namespace */

lmk_status lmk_cuda_repeat(lmk_stream *s, const void *args)
{
    const lmk_repeat_args *a = (const lmk_repeat_args *)args;
    const lmk_cuda_device *d = lmk_cuda_dev(s->dev);
    lmk_status st = lmk_cuda_use(d->ordinal, "repeat_heads/repeat_tiled: cudaSetDevice");
    if (st != LMK_OK)
        return st;
    const cudaStream_t cs = lmk_cuda_stream_of(s);
    const uint64_t es = a->elem_size;
    const uint32_t rep = (uint32_t)(a->h / a->hg);
    cudaError_t e;
    if (dense(a)) {
        /* Tiled units (a token's hg*k elements) whenever the layouts agree; block units (one
         * head row) otherwise. Every word stays aligned: dst offsets are multiples of the unit. */
        const bool tiled = a->layout == LMK_REPEAT_TILED || a->hg == a->h || a->hg == 1;
        const uint64_t units = tiled ? a->seq : (uint64_t)a->seq * a->hg;
        const uint64_t unit_bytes = (tiled ? a->hg * a->k : a->k) * es;
        const size_t w = word_for((uintptr_t)a->src | (uintptr_t)a->dst | unit_bytes);
        switch (w) {
        case 16: e = launch_units<uint4>(a, units, unit_bytes, rep, w, d->sm_count, cs); break;
        case 8: e = launch_units<uint2>(a, units, unit_bytes, rep, w, d->sm_count, cs); break;
        case 4: e = launch_units<unsigned>(a, units, unit_bytes, rep, w, d->sm_count, cs); break;
        case 2: e = launch_units<unsigned short>(a, units, unit_bytes, rep, w, d->sm_count, cs); break;
        default: e = launch_units<unsigned char>(a, units, unit_bytes, rep, w, d->sm_count, cs); break;
        }
    } else {
        /* Strides of axes of length 1 are never applied, so they do not narrow the word. */
        uint64_t bits = (uintptr_t)a->src | (uintptr_t)a->dst | (a->k * es);
        if (a->seq > 1)
            bits |= (a->src_tok | a->dst_tok) * es;
        if (a->hg > 1)
            bits |= a->src_head * es;
        if (a->h > 1)
            bits |= a->dst_head * es;
        const size_t w = word_for(bits);
        switch (w) {
        case 16: e = launch_rows<uint4>(a, w, d->sm_count, cs); break;
        case 8: e = launch_rows<uint2>(a, w, d->sm_count, cs); break;
        case 4: e = launch_rows<unsigned>(a, w, d->sm_count, cs); break;
        case 2: e = launch_rows<unsigned short>(a, w, d->sm_count, cs); break;
        default: e = launch_rows<unsigned char>(a, w, d->sm_count, cs); break;
        }
    }
    return e == cudaSuccess ? LMK_OK : lmk_cuda_fail(e, "repeat_heads/repeat_tiled: kernel launch");
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
