"""_compiled.py - loads the compiled host path, the extension module lmk._host (built from _host.c by
setup.py, optionally), and binds it to the library and runtime the package already uses.

lmk._host reads NumPy arrays and torch tensors, checks and wraps them and calls the op in C, with no Python
object per operand; it hands every call it cannot finish back to the Python path (_ops.py over ctypes), which
stays the fallback where the extension was not built. It does not link liblmk: it gets the addresses of the
functions of the library _lib.py loaded, so both paths call the same library, and callbacks into _runtime.py
for devices, streams and their locks.

The environment variable LMK_EXTENSION names a built module file to load instead of the packaged one (the
tests build one), or is `off` for the ctypes path alone. HOST_PATH says which path runs: "compiled" or
"ctypes"; WHY_CTYPES, why the compiled one does not.
"""
import ctypes
import importlib.machinery
import importlib.util
import os

from . import _arrays, _lib, _runtime


def _load():
    """(module or None, why not)."""
    env = os.environ.get("LMK_EXTENSION", "")
    if env.strip().lower() == "off":
        return None, "LMK_EXTENSION=off"
    if env:
        path = os.path.abspath(env)
        if not os.path.isfile(path):
            raise ImportError("lmk: LMK_EXTENSION=%r is not a file (it must name a built lmk._host module, or be "
                              "`off`)" % env)
        loader = importlib.machinery.ExtensionFileLoader("lmk._host", path)
        spec = importlib.util.spec_from_file_location("lmk._host", path, loader=loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        return module, None
    try:
        from . import _host
    except ImportError as e:
        return None, "lmk._host is not built (%s)" % e
    return _host, None


def _address(fn):
    return 0 if fn is None else ctypes.cast(fn, ctypes.c_void_p).value


def _cpu_context():
    dev = _arrays.CPU
    s, lock = _runtime.stream(dev)
    return _runtime.device(dev), s, lock


def _torch_cuda_context(ordinal):
    """A torch CUDA call's (device, stream, lock, device to give back or -1): the caller's current stream,
    as _runtime.Call runs it, and its current device, which lmk leaves changed (lmk_cuda.h)."""
    import torch
    prev = torch.cuda.current_device()
    dev = ("cuda", ordinal)
    s, lock = _runtime.stream(dev, torch.cuda.current_stream(ordinal).cuda_stream)
    return _runtime.device(dev), s, lock, (prev if prev != ordinal else -1)


def _torch_set_device(ordinal):
    import torch
    torch.cuda.set_device(ordinal)


def _bind(module):
    try:
        import numpy
        ndarray = numpy.ndarray
    except ImportError:
        ndarray = None
    fns = (_lib.buffer_wrap, _lib.buffer_view_strided, _lib.buffer_free, _lib.rope, _lib.repeat_heads,
           _lib.attn_prologue, _lib.causal_conv1d, _lib.gated_delta_rule)
    callbacks = (_cpu_context, _torch_cuda_context, _torch_set_device, _runtime.check, _arrays.empty_like_shape,
                 _arrays.append_first_row)
    module.init(tuple(_address(f) for f in fns), callbacks, ndarray)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=module.forget)
    return module


def register_torch(torch):
    """Lets the compiled path take torch tensors (lmk.torch_ops calls this when it loads)."""
    if host is not None:
        host.set_torch(torch.Tensor, torch.nn.Parameter, dict(_arrays._torch_dtypes()))


host, WHY_CTYPES = _load()
if host is not None:
    host = _bind(host)
HOST_PATH = "ctypes" if host is None else "compiled"
