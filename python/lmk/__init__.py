"""lmk: language-model kernels (include/lmk.h) for Python arrays.

    import lmk
    q = lmk.rope(q, positions, mode="imrope", sections=[11, 11, 10], rope_dim=64, freq_base=1e7)
    kv = lmk.repeat_heads(k, 48, layout="block")
    qkv = lmk.causal_conv1d(qkv, conv1d.weight, state=conv_cache.transpose(1, 2), out=qkv)
    o = lmk.gated_delta_rule(q, k, v, a, b, A_log=A_log, dt_bias=dt_bias, state=state, z=z, norm_w=norm_w)

Arrays are anything with __dlpack__ (NumPy, PyTorch, CuPy, JAX); results come back as the caller's kind, on
the caller's device; CUDA arrays run asynchronously on the caller's current stream. Strided views whose last
axis has stride 1 are used in place, without copies. lmk.torch_ops registers torch.ops.lmk.* (custom ops
for torch.compile and CUDA graphs); it is loaded by `import lmk.torch_ops`, when torch was imported before
lmk, or when the first torch tensor reaches an lmk op. Every error is an lmk.LmkError, a ValueError (those
about an argument's type are also TypeErrors).
"""
import sys

from ._errors import LmkError, LmkTypeError
from ._api import attn_prologue, causal_conv1d, gated_delta_rule, repeat_heads, rope
from ._ops import build_info, devices, gated_delta_rule_workspace, has_attn_prologue, version
from ._lib import LIBRARY_PATH
from ._compiled import HOST_PATH

__version__ = version()
__all__ = ["rope", "repeat_heads", "attn_prologue", "causal_conv1d", "gated_delta_rule",
           "gated_delta_rule_workspace", "has_attn_prologue",
           "version", "build_info", "devices", "LmkError", "LmkTypeError", "LIBRARY_PATH", "HOST_PATH"]

if "torch" in sys.modules:
    try:
        from . import torch_ops  # noqa: F401
    except Exception:  # noqa: BLE001 - a torch without custom ops keeps the eager path; `import lmk.torch_ops` says why
        pass
