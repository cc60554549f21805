"""_runtime.py - lmk devices, streams and per-call buffers for the Python package.

One lmk device per backend ordinal, opened on first use and kept for the life of the process. CPU arrays run
on one lmk CPU stream (its worker threads are the parallelism; a lock keeps two Python threads off it at once,
as lmk.h asks). CUDA arrays run on the caller's current stream of their library (torch.cuda.current_stream,
CuPy's current stream; the legacy default stream for other producers), wrapped once per handle with
lmk_stream_wrap_cuda and cached, so a call never synchronises and can be captured into a CUDA graph.
Handles are never destroyed: destroying a wrapped stream waits for it, which at interpreter exit may meet a
torn-down CUDA context, and a cached handle whose cudaStream_t its owner has destroyed cannot be waited for at
all. So the cache holds one small handle per distinct stream handle seen: bounded for PyTorch, whose streams
come from fixed per-device pools and are never destroyed; a program that creates and destroys CuPy or raw
streams without end keeps one handle per distinct address the driver hands out. A forked child forgets its
parent's handles and opens its own.

A Call gathers one op's arrays: it checks that they share the first array's device, turns each into an
lmk_buffer (lmk_buffer_wrap for dense arrays; for a strided view, a wrap of the memory it spans plus
lmk_buffer_view_strided with its element strides, so no data is copied), and frees everything on exit. State
pools (Gated DeltaNet's conv and recurrent states) are 3-D and 4-D views with any strides, the last axis
included: Hugging Face's conv cache seen as [B, W-1, C] and a state whose dk axis is fastest are such views.
"""
import ctypes
import os
import threading

from . import _arrays, _lib
from ._errors import LmkError


def check(status):
    if status != _lib.OK:
        msg = (_lib.last_error() or b"").decode("utf-8", "replace")
        name = (_lib.status_name(status) or b"").decode() or _lib.STATUS_NAMES.get(status, "LMK_UNKNOWN_STATUS")
        raise LmkError(msg or name, name)


_lock = threading.Lock()
_devices = {}
_streams = {}   # ("cpu", 0) or (("cuda", n), handle) -> (lmk_stream, lock)


def _forget_handles():
    """In a forked child the CPU stream's worker threads do not exist and CUDA contexts are unusable: drop the
    parent's handles (without freeing them, which would wait for those threads) and start afresh."""
    global _lock
    _lock = threading.Lock()
    _devices.clear()
    _streams.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_handles)


def device(dev):
    """The lmk device handle of ("cpu", 0) or ("cuda", n), opened once."""
    h = _devices.get(dev)
    if h is not None:
        return h
    with _lock:
        h = _devices.get(dev)
        if h is None:
            out = ctypes.c_void_p()
            backend = _lib.BACKEND_CPU if dev[0] == "cpu" else _lib.BACKEND_CUDA
            check(_lib.device_open(backend, dev[1], ctypes.byref(out)))
            h = _devices[dev] = out.value
    return h


def _stream(key, make):
    entry = _streams.get(key)
    if entry is not None:
        return entry
    with _lock:
        entry = _streams.get(key)
        if entry is None:
            out = ctypes.c_void_p()
            check(make(out))
            entry = _streams[key] = (out.value, threading.Lock())
    return entry


def cuda_stream_handle(dev, like):
    """(cudaStream_t value, DLPack `stream` argument) the call runs on: the caller's current stream."""
    kind = _arrays.kind_of(like)
    if kind == "torch":
        import torch
        handle = torch.cuda.current_stream(dev[1]).cuda_stream
    elif kind == "cupy":
        import cupy
        with cupy.cuda.Device(dev[1]):
            handle = cupy.cuda.get_current_stream().ptr
    else:
        handle = 1  # cudaStreamLegacy: the legacy default stream, DLPack's stream=1
    # DLPack reserves 0; CUDA's 0 is the legacy default stream, which DLPack calls 1.
    return handle, (handle if handle else 1)


def stream(dev, handle=None):
    """(lmk_stream, lock) for the CPU, or for the wrapped CUDA stream `handle` of device dev."""
    if dev[0] == "cpu":
        devh = device(dev)  # before _stream takes _lock, which device() takes too
        return _stream(dev, lambda out: _lib.stream_create(devh, ctypes.byref(out)))
    if _lib.stream_wrap_cuda is None:
        raise LmkError("lmk: this liblmk was built without CUDA (%s), so it cannot run on %s"
                       % (_lib.build_info().decode(), _arrays.device_str(dev)), "LMK_ERR_UNSUPPORTED")
    devh = device(dev)
    return _stream((dev, handle), lambda out: _lib.stream_wrap_cuda(devh, ctypes.c_void_p(handle), ctypes.byref(out)))


class _CudaDeviceGuard:
    """lmk makes a handle's device current and leaves it so (lmk_cuda.h); give the caller's back."""

    def __init__(self, dev, like):
        self.restore = None
        kind = _arrays.kind_of(like)
        if kind == "torch":
            import torch
            prev = torch.cuda.current_device()
            if prev != dev[1]:
                self.restore = lambda: torch.cuda.set_device(prev)
        elif kind == "cupy":
            import cupy
            prev = cupy.cuda.runtime.getDevice()
            if prev != dev[1]:
                self.restore = lambda: cupy.cuda.runtime.setDevice(prev)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.restore:
            self.restore()


class Call:
    """The arrays and lmk buffers of one op call on the device of its first array (`like`)."""

    def __init__(self, op, like, like_name):
        self.op = op
        self.like = like
        self.like_name = like_name
        self.dev = _arrays.device_of(like, like_name)
        self.handle, self.dl_stream = (cuda_stream_handle(self.dev, like) if self.dev[0] == "cuda" else (None, None))
        self.devh = None
        self._arrays = []
        self._buffers = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        bufs, self._buffers = self._buffers, []
        for b in reversed(bufs):  # views before the parents they were made from
            _lib.buffer_free(b)
        arrs, self._arrays = self._arrays, []
        for a in arrs:
            a.release()

    def read(self, obj, name, *, raw=False, writable=False):
        dev = _arrays.device_of(obj, name)  # before exporting: a CPU producer takes no CUDA stream
        if dev != self.dev:
            raise LmkError("lmk.%s: %s is on %s but %s is on %s" % (self.op, name, _arrays.device_str(dev),
                                                                    self.like_name, _arrays.device_str(self.dev)))
        a = _arrays.read(obj, name, raw=raw, stream=self.dl_stream)
        self._arrays.append(a)
        if writable and a.readonly:
            raise LmkError("lmk.%s: %s is read-only (or a copy), so lmk cannot write into it" % (self.op, name))
        return a

    def buffer(self, a, *, dense=False, pool=False):
        """An lmk_buffer over a's memory, without copying. dense: a must be contiguous. pool: a state pool,
        whose strides may be anything lmk_buffer_view_strided takes (its last axis too); lmk checks that its
        elements are distinct."""
        if self.devh is None:
            self.devh = device(self.dev)
        nd = len(a.shape)
        if nd > 8:
            raise LmkError("lmk.%s: %s has %d dimensions (at most 8)" % (self.op, a.name, nd))
        shape = (ctypes.c_size_t * max(nd, 1))(*a.shape)
        out = ctypes.c_void_p()
        if a.is_contiguous():
            check(_lib.buffer_wrap(self.devh, a.ptr or None, a.numel() * a.itemsize, a.dtype,
                                   shape if nd else None, nd, ctypes.byref(out)))
            self._buffers.append(out.value)
            return out.value
        if dense:
            raise LmkError("lmk.%s: %s must be contiguous (shape %s, strides %s)" % (self.op, a.name, a.shape,
                                                                                     a.strides))
        return self._strided(a, shape, nd, pool)

    def _strided(self, a, shape, nd, pool):
        """A wrap of the bytes a spans, then a strided view of it (a has elements: empty arrays are dense)."""
        if not pool and a.shape[-1] > 1 and a.strides[-1] != 1:
            raise LmkError("lmk.%s: %s must have stride 1 on its last axis (shape %s, strides %s in elements)"
                           % (self.op, a.name, a.shape, a.strides))
        strides = [0 if n == 1 else s for n, s in zip(a.shape, a.strides)]
        if any(s < 0 for s in strides):
            raise LmkError("lmk.%s: %s has a negative stride (strides %s); lmk views take strides >= 0"
                           % (self.op, a.name, a.strides))
        span = 1 + sum((n - 1) * s for n, s in zip(a.shape, strides))
        parent = ctypes.c_void_p()
        check(_lib.buffer_wrap(self.devh, a.ptr, span * a.itemsize, a.dtype, None, 0, ctypes.byref(parent)))
        self._buffers.append(parent.value)
        out = ctypes.c_void_p()
        check(_lib.buffer_view_strided(parent, 0, a.dtype, shape, (ctypes.c_size_t * nd)(*strides), nd,
                                       ctypes.byref(out)))
        self._buffers.append(out.value)
        return out.value

    def run(self, fn, *args):
        """Calls the op on this call's stream and raises LmkError on failure."""
        s, lock = stream(self.dev, self.handle)
        if self.dev[0] == "cuda":
            with _CudaDeviceGuard(self.dev, self.like), lock:
                st = fn(s, *args)
        else:
            with lock:
                st = fn(s, *args)
        check(st)
