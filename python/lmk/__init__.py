"""lmk: language-model kernels (include/lmk.h) for Python arrays.

    import lmk
    q = lmk.rope(q, positions, mode="imrope", sections=[11, 11, 10], rope_dim=64, freq_base=1e7)
    kv = lmk.repeat_heads(k, 48, layout="block")

Arrays are anything with __dlpack__ (NumPy, PyTorch, CuPy, JAX); results come back as the caller's kind, on
the caller's device; CUDA arrays run asynchronously on the caller's current stream. Strided views whose last
axis has stride 1 are used in place, without copies. lmk.torch_ops registers torch.ops.lmk.* (custom ops
for torch.compile and CUDA graphs); it is loaded by `import lmk.torch_ops`, when torch was imported before
lmk, or when the first torch tensor reaches an lmk op.
"""
import sys

from ._ops import attn_prologue, build_info, devices, has_attn_prologue, repeat_heads, rope, version
from ._runtime import LmkError
from ._lib import LIBRARY_PATH

__version__ = version()
__all__ = ["rope", "repeat_heads", "attn_prologue", "has_attn_prologue", "version", "build_info", "devices",
           "LmkError", "LIBRARY_PATH"]

if "torch" in sys.modules:
    try:
        from . import torch_ops  # noqa: F401
    except Exception:  # noqa: BLE001 - a torch without custom ops keeps the eager path; `import lmk.torch_ops` says why
        pass
