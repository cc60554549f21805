"""_lib.py - loads liblmk.so and declares, with ctypes, every C function and struct the package uses.

The library is found by absolute path, so nothing depends on the loader's search path: the file named by
the environment variable LMK_LIBRARY (development: a build directory's liblmk.so), else the liblmk.so that
`pip install` put next to this file. Each declaration mirrors include/lmk.h (and include/lmk_cuda.h for
lmk_stream_wrap_cuda, which exists only in CUDA builds). lmk_attn_prologue, lmk_causal_conv1d and
lmk_gated_delta_rule are bound when the library has them and are None otherwise, so their entry points can
say so instead of the import failing. The structs' field order and types, the enum values and the status names
are lmk.h's exactly: python/tests/test_layout.py compiles a program against lmk.h and compares every struct
(found here by the C name that opens its docstring), field, enumerator and copied macro.
"""
import ctypes
import os

_HERE = os.path.dirname(os.path.abspath(__file__))


def _library_path():
    env = os.environ.get("LMK_LIBRARY")
    if env:
        path = os.path.abspath(env)
        if not os.path.isfile(path):
            raise ImportError("lmk: LMK_LIBRARY=%r is not a file (it must name a liblmk.so)" % env)
        return path
    path = os.path.join(_HERE, "liblmk.so")
    if not os.path.isfile(path):
        raise ImportError("lmk: no liblmk.so in %s: install the package with `pip install ./python` from the "
                          "repository root, or point LMK_LIBRARY at a built liblmk.so" % _HERE)
    return path


LIBRARY_PATH = _library_path()
lib = ctypes.CDLL(LIBRARY_PATH)

# ---- lmk.h types ----
c_status = ctypes.c_int      # lmk_status
c_dtype = ctypes.c_int       # lmk_dtype
c_void_p = ctypes.c_void_p   # opaque handles: lmk_device *, lmk_stream *, lmk_buffer *
c_size_p = ctypes.POINTER(ctypes.c_size_t)
c_handle_p = ctypes.POINTER(ctypes.c_void_p)

OK = 0
STATUS_NAMES = {0: "LMK_OK", 1: "LMK_ERR_INVALID_ARGUMENT", 2: "LMK_ERR_UNSUPPORTED", 3: "LMK_ERR_OUT_OF_MEMORY",
                4: "LMK_ERR_DEVICE", 5: "LMK_ERR_NOT_FOUND"}
UNSUPPORTED = 2

F32, F16, BF16, U8, U16, U32, I32, I64, F8E4M3 = range(9)
DTYPE_SIZES = {F32: 4, F16: 2, BF16: 2, U8: 1, U16: 2, U32: 4, I32: 4, I64: 8, F8E4M3: 1}
BACKEND_AUTO, BACKEND_CPU, BACKEND_CUDA = 0, 1, 2


class RopeParams(ctypes.Structure):
    """lmk_rope_params."""
    _fields_ = [("head_dim", ctypes.c_uint32), ("rope_dim", ctypes.c_uint32), ("n_heads", ctypes.c_uint32),
                ("seq_len", ctypes.c_uint32), ("freq_base", ctypes.c_float), ("mode", ctypes.c_int),
                ("sections", ctypes.c_uint32 * 4), ("pairing", ctypes.c_int), ("n_k_heads", ctypes.c_uint32),
                ("freq_scale", ctypes.c_float), ("ext_factor", ctypes.c_float), ("attn_factor", ctypes.c_float),
                ("beta_fast", ctypes.c_float), ("beta_slow", ctypes.c_float), ("n_ctx_orig", ctypes.c_uint32)]


class RepeatHeadsParams(ctypes.Structure):
    """lmk_repeat_heads_params."""
    _fields_ = [("seq", ctypes.c_uint32), ("hg", ctypes.c_uint32), ("h", ctypes.c_uint32), ("k", ctypes.c_uint32),
                ("layout", ctypes.c_int)]


class RmsNormParams(ctypes.Structure):
    """lmk_rms_norm_params."""
    _fields_ = [("eps", ctypes.c_float), ("weight_offset", ctypes.c_float)]


class AttnPrologueIO(ctypes.Structure):
    """lmk_attn_prologue_io: every pointer is an lmk_buffer * or NULL."""
    _fields_ = [("q_in", c_void_p), ("k_in", c_void_p), ("v_in", c_void_p), ("q_norm_w", c_void_p),
                ("k_norm_w", c_void_p), ("positions", c_void_p), ("freq_factors", c_void_p), ("slots", c_void_p),
                ("q_out", c_void_p), ("k_out", c_void_p), ("k_cache", c_void_p), ("v_cache", c_void_p),
                ("k_scale", ctypes.c_float), ("v_scale", ctypes.c_float)]


ACT_NONE, ACT_SILU = 0, 1   # lmk_activation
GDN_NO_L2NORM = 1           # lmk_gdn_params.flags


class CausalConv1dParams(ctypes.Structure):
    """lmk_causal_conv1d_params."""
    _fields_ = [("seq_len", ctypes.c_uint32), ("channels", ctypes.c_uint32), ("width", ctypes.c_uint32),
                ("activation", ctypes.c_int)]


class GdnIO(ctypes.Structure):
    """lmk_gdn_io: every pointer is an lmk_buffer * or NULL."""
    _fields_ = [("q", c_void_p), ("k", c_void_p), ("v", c_void_p), ("a", c_void_p), ("b", c_void_p),
                ("A_log", c_void_p), ("dt_bias", c_void_p), ("cu_seqlens", c_void_p), ("state_slots", c_void_p),
                ("state", c_void_p), ("z", c_void_p), ("norm_w", c_void_p), ("out", c_void_p),
                ("workspace", c_void_p)]


class GdnParams(ctypes.Structure):
    """lmk_gdn_params, with lmk_rms_norm_params embedded."""
    _fields_ = [("seq_len", ctypes.c_uint32), ("n_k_heads", ctypes.c_uint32), ("n_v_heads", ctypes.c_uint32),
                ("k_dim", ctypes.c_uint32), ("v_dim", ctypes.c_uint32), ("head_map", ctypes.c_int),
                ("scale", ctypes.c_float), ("flags", ctypes.c_uint32), ("norm", RmsNormParams)]


def _declare(name, restype, argtypes, required=True):
    fn = getattr(lib, name, None)
    if fn is None:
        if required:
            raise ImportError("lmk: %s has no symbol %s (a library older than this package?)" % (LIBRARY_PATH, name))
        return None
    fn.restype = restype
    fn.argtypes = argtypes
    return fn


status_name = _declare("lmk_status_name", ctypes.c_char_p, [c_status])
last_error = _declare("lmk_last_error", ctypes.c_char_p, [])
clear_error = _declare("lmk_clear_error", None, [])
version = _declare("lmk_version", ctypes.c_char_p, [])
build_info = _declare("lmk_build_info", ctypes.c_char_p, [])
dtype_size = _declare("lmk_dtype_size", ctypes.c_size_t, [c_dtype])

device_open = _declare("lmk_device_open", c_status, [ctypes.c_int, ctypes.c_int, c_handle_p])
device_close = _declare("lmk_device_close", None, [c_void_p])
device_name = _declare("lmk_device_name", ctypes.c_char_p, [c_void_p])
device_count = _declare("lmk_device_count", ctypes.c_int, [ctypes.c_int])

buffer_wrap = _declare("lmk_buffer_wrap", c_status,
                       [c_void_p, c_void_p, ctypes.c_size_t, c_dtype, c_size_p, ctypes.c_int, c_handle_p])
buffer_view_strided = _declare("lmk_buffer_view_strided", c_status,
                               [c_void_p, ctypes.c_size_t, c_dtype, c_size_p, c_size_p, ctypes.c_int, c_handle_p])
buffer_free = _declare("lmk_buffer_free", None, [c_void_p])
buffer_data = _declare("lmk_buffer_data", c_void_p, [c_void_p])

stream_create = _declare("lmk_stream_create", c_status, [c_void_p, c_handle_p])
stream_sync = _declare("lmk_stream_sync", c_status, [c_void_p])
stream_destroy = _declare("lmk_stream_destroy", None, [c_void_p])
# lmk_cuda.h; cudaStream_t is a pointer.
stream_wrap_cuda = _declare("lmk_stream_wrap_cuda", c_status, [c_void_p, c_void_p, c_handle_p], required=False)

rope = _declare("lmk_rope", c_status,
                [c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, ctypes.POINTER(RopeParams)])
repeat_heads = _declare("lmk_repeat_heads", c_status,
                        [c_void_p, c_void_p, c_void_p, ctypes.POINTER(RepeatHeadsParams)])
attn_prologue = _declare("lmk_attn_prologue", c_status,
                         [c_void_p, ctypes.POINTER(AttnPrologueIO), ctypes.POINTER(RopeParams),
                          ctypes.POINTER(RmsNormParams)], required=False)
causal_conv1d = _declare("lmk_causal_conv1d", c_status,
                         [c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p,
                          ctypes.POINTER(CausalConv1dParams)], required=False)
gated_delta_rule = _declare("lmk_gated_delta_rule", c_status,
                            [c_void_p, ctypes.POINTER(GdnIO), ctypes.POINTER(GdnParams)], required=False)
gated_delta_rule_workspace = _declare("lmk_gated_delta_rule_workspace", c_status,
                                      [c_void_p, ctypes.POINTER(GdnIO), ctypes.POINTER(GdnParams),
                                       ctypes.POINTER(ctypes.c_size_t)], required=False)
