"""_arrays.py - the caller's arrays as lmk sees them: a pointer, a shape, element strides, a dtype, a device.

Any object with __dlpack__ works (NumPy, CuPy, JAX, PyTorch, ...): its DLPack capsule is parsed with ctypes,
renamed "used_dltensor" (or "used_dltensor_versioned") as the DLPack protocol asks of a consumer, and its
deleter is called once the op has been enqueued (the caller's own object keeps the memory alive). PyTorch
tensors are read directly (data_ptr, stride), which is faster, needs no capsule and also covers dtypes that
DLPack exporters lack (float8). Results are allocated with the caller's own library, found from the type's
module, so NumPy in gives NumPy out and torch in gives torch out, on the caller's device.
"""
import ctypes

from . import _lib
from ._errors import LmkError, LmkTypeError

# ---- DLPack structs (dlpack.h, versions 0.x and 1.x) ----


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32), ("dtype", _DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", _DLPackVersion), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


_FLAG_READ_ONLY = 1 << 0
_FLAG_IS_COPIED = 1 << 1
_KDL_CPU, _KDL_CUDA, _KDL_CUDA_HOST, _KDL_CUDA_MANAGED = 1, 2, 3, 13
# (type code, bits) -> lmk dtype. Codes: 0 int, 1 uint, 2 float, 4 bfloat, 10 float8_e4m3fn.
_DL_DTYPES = {(2, 32): _lib.F32, (2, 16): _lib.F16, (4, 16): _lib.BF16, (1, 8): _lib.U8, (1, 16): _lib.U16,
              (1, 32): _lib.U32, (0, 32): _lib.I32, (0, 64): _lib.I64, (10, 8): _lib.F8E4M3}
# A bit-exact copy (repeat_heads) moves any element as an unsigned integer of its size.
_RAW_BY_SIZE = {1: _lib.U8, 2: _lib.U16, 4: _lib.U32, 8: _lib.I64}

_py = ctypes.pythonapi
_py.PyCapsule_IsValid.restype = ctypes.c_int
_py.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_py.PyCapsule_GetPointer.restype = ctypes.c_void_p
_py.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_py.PyCapsule_SetName.restype = ctypes.c_int
_py.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
# The capsule keeps a pointer to its new name: these bytes objects live as long as the module.
_NAME, _USED = b"dltensor", b"used_dltensor"
_NAME_V, _USED_V = b"dltensor_versioned", b"used_dltensor_versioned"
# Deleters may touch Python objects (NumPy's does): call them with the GIL held.
_DELETER = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)

CPU = ("cpu", 0)


def kind_of(obj):
    """The caller's library: "torch", "numpy", "cupy", "jax", or "dlpack" for any other producer."""
    mod = type(obj).__module__.partition(".")[0]
    if mod in ("torch", "numpy", "cupy"):
        return mod
    if mod in ("jax", "jaxlib"):
        return "jax"
    return "dlpack"


def device_of(obj, name):
    """("cpu", 0) or ("cuda", ordinal) of an array, without exporting it."""
    if kind_of(obj) == "torch":
        dev = obj.device
        if dev.type == "cpu":
            return CPU
        if dev.type == "cuda":
            return ("cuda", dev.index if dev.index is not None else 0)
        raise LmkTypeError("lmk: %s is on torch device %s; lmk runs on cpu and cuda tensors" % (name, dev))
    if not hasattr(obj, "__dlpack_device__"):
        raise LmkTypeError("lmk: %s must be an array with __dlpack__ (NumPy, PyTorch, CuPy, JAX, ...), got %s"
                           % (name, type(obj).__name__))
    dev_type, dev_id = obj.__dlpack_device__()
    return _device_key(int(dev_type), int(dev_id), name)


def _device_key(dev_type, dev_id, name):
    if dev_type in (_KDL_CPU, _KDL_CUDA_HOST):
        return CPU
    if dev_type in (_KDL_CUDA, _KDL_CUDA_MANAGED):
        return ("cuda", dev_id)
    raise LmkTypeError("lmk: %s is on DLPack device type %d; lmk runs on CPU and CUDA memory" % (name, dev_type))


def device_str(dev):
    return "cpu" if dev[0] == "cpu" else "cuda:%d" % dev[1]


class Array:
    """One caller array, read for one call. release() gives a DLPack export back."""
    __slots__ = ("name", "ptr", "shape", "strides", "dtype", "itemsize", "device", "readonly", "_managed",
                 "_deleter")

    def __init__(self, name):
        self.name = name
        self._managed = None
        self._deleter = None

    def release(self):
        deleter, self._deleter = self._deleter, None
        if deleter:
            _DELETER(deleter)(self._managed)

    def is_contiguous(self):
        """Dense row-major, strides of axes of length 1 ignored (lmk.h's rule). An array without elements is
        dense whatever its strides: it spans no memory, so it is wrapped as 0 bytes."""
        if 0 in self.shape:
            return True
        expect = 1
        for n, s in zip(reversed(self.shape), reversed(self.strides)):
            if n != 1 and s != expect:
                return False
            expect *= n
        return True

    def reshape_view(self, shape, strides):
        """The same memory seen with another shape and element strides (a paged cache as rows, Hugging Face's
        conv1d.weight [C, 1, W] as [C, W]); the caller derives them from this array's own."""
        self.shape = tuple(shape)
        self.strides = tuple(strides)
        return self

    def numel(self):
        n = 1
        for d in self.shape:
            n *= d
        return n


_TORCH_DTYPES = None


def _torch_dtypes():
    global _TORCH_DTYPES
    if _TORCH_DTYPES is None:
        import torch
        names = {"float32": _lib.F32, "float16": _lib.F16, "bfloat16": _lib.BF16, "uint8": _lib.U8,
                 "uint16": _lib.U16, "uint32": _lib.U32, "int32": _lib.I32, "int64": _lib.I64,
                 "float8_e4m3fn": _lib.F8E4M3}
        _TORCH_DTYPES = {getattr(torch, n): v for n, v in names.items() if hasattr(torch, n)}
    return _TORCH_DTYPES


def _lmk_dtype(found, itemsize, raw, name, what):
    if found is not None:
        return found
    if raw and itemsize in _RAW_BY_SIZE:
        return _RAW_BY_SIZE[itemsize]
    raise LmkTypeError("lmk: %s has dtype %s, which lmk does not take (f32, f16, bf16, u8, u16, u32, i32, i64, "
                       "f8e4m3)" % (name, what))


def _from_torch(t, name, raw):
    a = Array(name)
    a.device = device_of(t, name)
    a.itemsize = t.element_size()
    a.dtype = _lmk_dtype(_torch_dtypes().get(t.dtype), a.itemsize, raw, name, t.dtype)
    a.ptr = t.data_ptr()
    a.shape = tuple(t.shape)
    a.strides = tuple(t.stride())
    a.readonly = False
    return a


def _export(obj, name, stream):
    """obj.__dlpack__, asking for a versioned capsule first (DLPack 1.x) and falling back to 0.x."""
    kwargs = {} if stream is None else {"stream": stream}
    try:
        return obj.__dlpack__(max_version=(1, 0), **kwargs)
    except TypeError:
        return obj.__dlpack__(**kwargs)
    except BufferError as e:
        raise LmkError("lmk: %s cannot be exported through DLPack: %s" % (name, e)) from e


def _from_dlpack(obj, name, raw, stream):
    if not hasattr(obj, "__dlpack__"):
        raise LmkTypeError("lmk: %s must be an array with __dlpack__ (NumPy, PyTorch, CuPy, JAX, ...), got %s"
                           % (name, type(obj).__name__))
    cap = _export(obj, name, stream)
    a = Array(name)
    if _py.PyCapsule_IsValid(cap, _NAME_V):
        ptr = _py.PyCapsule_GetPointer(cap, _NAME_V)
        m = _DLManagedTensorVersioned.from_address(ptr)
        _py.PyCapsule_SetName(cap, _USED_V)
        flags = m.flags
    elif _py.PyCapsule_IsValid(cap, _NAME):
        ptr = _py.PyCapsule_GetPointer(cap, _NAME)
        m = _DLManagedTensor.from_address(ptr)
        _py.PyCapsule_SetName(cap, _USED)
        flags = 0
    else:
        raise LmkTypeError("lmk: %s.__dlpack__() did not return a DLPack capsule" % name)
    a._managed, a._deleter = ptr, m.deleter
    try:
        _fill_from_dltensor(a, m.dl_tensor, flags, raw)
    except BaseException:
        a.release()
        raise
    return a


def _fill_from_dltensor(a, t, flags, raw):
    name = a.name
    a.device = _device_key(t.device.device_type, t.device.device_id, name)
    if t.dtype.lanes != 1:
        raise LmkTypeError("lmk: %s has %d-lane vector elements; lmk takes scalars" % (name, t.dtype.lanes))
    if t.dtype.bits % 8:
        raise LmkTypeError("lmk: %s has %d-bit elements; lmk takes whole bytes" % (name, t.dtype.bits))
    a.itemsize = t.dtype.bits // 8
    a.dtype = _lmk_dtype(_DL_DTYPES.get((t.dtype.code, t.dtype.bits)), a.itemsize, raw, name,
                         "DLPack (code %d, %d bits)" % (t.dtype.code, t.dtype.bits))
    nd = t.ndim
    a.shape = tuple(t.shape[i] for i in range(nd))
    if t.strides:
        a.strides = tuple(t.strides[i] for i in range(nd))
    else:
        st, acc = [], 1
        for d in reversed(a.shape):
            st.append(acc)
            acc *= d
        a.strides = tuple(reversed(st))
    a.ptr = (t.data or 0) + t.byte_offset
    a.readonly = bool(flags & (_FLAG_READ_ONLY | _FLAG_IS_COPIED))


def read(obj, name, *, raw=False, stream=None):
    """The Array of obj. stream: the DLPack `stream` argument for CUDA producers (None on the CPU)."""
    if kind_of(obj) == "torch":
        return _from_torch(obj, name, raw)
    return _from_dlpack(obj, name, raw, stream)


# ---- results of the caller's kind ----


def empty_like_shape(like, shape):
    """A new uninitialised array of like's library, dtype and device, of the given shape."""
    kind = kind_of(like)
    if kind == "torch":
        import torch
        return torch.empty(tuple(shape), dtype=like.dtype, device=like.device)
    if kind == "numpy":
        import numpy
        return numpy.empty(tuple(shape), dtype=like.dtype)
    if kind == "cupy":
        import cupy
        with like.device:
            return cupy.empty(tuple(shape), dtype=like.dtype)
    if hasattr(like, "__array_namespace__"):  # JAX and other array-API libraries
        xp = like.__array_namespace__()
        return xp.empty(tuple(shape), dtype=like.dtype, device=like.device)
    raise LmkTypeError("lmk: cannot allocate a result like a %s (no __array_namespace__): pass out="
                       % type(like).__name__)


def append_first_row(x):
    """concat([x, x[:1]]) in x's own library: (3, T) positions -> (4, T), the fourth axis reading t."""
    kind = kind_of(x)
    if kind == "torch":
        import torch
        return torch.cat([x, x[:1]], dim=0)
    if kind == "numpy":
        import numpy
        return numpy.concatenate([x, x[:1]], axis=0)
    if kind == "cupy":
        import cupy
        with x.device:
            return cupy.concatenate([x, x[:1]], axis=0)
    if hasattr(x, "__array_namespace__"):
        return x.__array_namespace__().concat([x, x[:1]], axis=0)
    raise LmkTypeError("lmk: positions of shape (3, T) need a copy, and %s has no __array_namespace__: pass (4, T)"
                       % type(x).__name__)
