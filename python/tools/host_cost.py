"""host_cost.py - what one lmk call costs the host from Python, on the compiled host path and on the ctypes
path, next to a torch built-in op (python/README.md, "What a call costs on the host", holds its table).

    LMK_LIBRARY=build/liblmk.so PYTHONPATH=python python3 python/tools/host_cost.py [--device cuda] [--big]

Shapes: a Qwen3.5-27B attention layer (q read out of a [T, 24, 2*256] [q | gate] projection, k [T, 4, 256],
imrope over 64 dims, (4, T) int32 positions) at T = 1, and T = 4106 with --big; plus the tiny case of the
host-path target, rope of a [1, 2, 8] f32 NumPy array with out= given. Each figure is the median over
repeats of the mean of a timed loop (CUDA: synchronised after the loop, so it includes the kernels).
"""
import argparse
import statistics
import timeit

import numpy as np

import lmk
from lmk import _compiled, _ops


def median_us(fn, sync, number):
    for _ in range(max(3, number // 10)):
        fn()
    sync()

    def loop():
        for _ in range(number):
            fn()
        sync()
    return statistics.median(timeit.repeat(loop, number=1, repeat=7)) / number * 1e6


def both_paths(fn, sync, number):
    """(compiled, ctypes) microseconds per call; the compiled one None when it is not loaded."""
    compiled = median_us(fn, sync, number) if _compiled.host is not None else None
    saved, _ops._host = _ops._host, None
    try:
        ctypes_us = median_us(fn, sync, number)
    finally:
        _ops._host = saved
    return compiled, ctypes_us


def row(name, T, us):
    compiled, ctypes_us = us if isinstance(us, tuple) else (None, us)
    c = "-" if compiled is None else "%.1f us" % compiled
    print("| %s | %d | %s | %.1f us |" % (name, T, c, ctypes_us))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--big", action="store_true", help="also T = 4106")
    args = ap.parse_args()
    print("lmk %s, %s path; liblmk: %s" % (lmk.version(), lmk.HOST_PATH, lmk.build_info()))
    print("| call | T | compiled | ctypes |")
    print("| --- | --- | --- | --- |")
    q, pos, out = np.ones((1, 2, 8), np.float32), np.zeros(1, np.int32), np.empty((1, 2, 8), np.float32)
    row("lmk.rope, [1, 2, 8] f32 NumPy, out= given", 1, both_paths(lambda: lmk.rope(q, pos, out=out),
                                                                    lambda: None, 2000))
    try:
        import torch
        from lmk import torch_ops  # noqa: F401 - registers torch.ops.lmk.*
    except ImportError:
        torch = None
    kw = dict(mode="imrope", sections=[11, 11, 10], rope_dim=64, freq_base=1e7)
    for T in ([1, 4106] if args.big else [1]):
        number = 1000 if T == 1 else 5
        H, Hk, D = 24, 4, 256
        qg, k = np.random.rand(T, H, 2 * D).astype(np.float32), np.random.rand(T, Hk, D).astype(np.float32)
        pos4 = np.tile(np.arange(T, dtype=np.int32), (4, 1))
        qo, ko = np.empty((T, H, D), np.float32), np.empty((T, Hk, D), np.float32)
        if args.device == "cpu":
            row("lmk.rope(q, pos4, k=k, out=, k_out=), NumPy f32", T, both_paths(
                lambda: lmk.rope(qg[:, :, :D], pos4, k=k, out=qo, k_out=ko, **kw), lambda: None, number))
        if torch is None:
            continue
        dev = torch.device(args.device)
        dt = torch.float32 if args.device == "cpu" else torch.bfloat16
        tq = torch.from_numpy(qg).to(dev, dt)[:, :, :D]
        tk, tpos4 = torch.from_numpy(k).to(dev, dt), torch.from_numpy(pos4).to(dev)
        tpos3 = tpos4[:3].to(torch.int64)
        tqo, tko = torch.empty_like(tq), torch.empty_like(tk)
        sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
        row("`k.add_(0)` in torch, for scale", T, median_us(lambda: tk.add_(0), sync, number))
        row("lmk.rope(q, pos4, k=k, out=, k_out=), torch", T, both_paths(
            lambda: lmk.rope(tq, tpos4, k=tk, out=tqo, k_out=tko, **kw), sync, number))
        row("lmk.rope(q, pos3, k=k), torch: outputs allocated, (3, T) int64", T, both_paths(
            lambda: lmk.rope(tq, tpos3, k=tk, **kw), sync, number))
        row("torch.ops.lmk.rope(q, pos4, q_out, k=k, k_out=k_out)", T, both_paths(
            lambda: torch.ops.lmk.rope(tq, tpos4, tqo, k=tk, k_out=tko, rope_mode="imrope", sections=[11, 11, 10],
                                       rope_dim=64, freq_base=1e7), sync, number))


if __name__ == "__main__":
    main()
