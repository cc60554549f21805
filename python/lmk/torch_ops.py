"""torch_ops.py - lmk's ops as PyTorch custom ops, for torch.compile(fullgraph=True) and CUDA graph capture.

Importing this module registers torch.ops.lmk.rope, torch.ops.lmk.repeat_heads and torch.ops.lmk.attn_prologue
(lmk does so itself when torch was imported first or when a torch tensor reaches an lmk op). They are the
out-forms: the caller (or a function below) allocates the outputs with torch, the op writes them and returns
nothing. Every written tensor is declared in mutates_args, so functionalization sees the writes, and pass q
itself as `out` for in place. A mutating custom op cannot return a list or an optional tensor under
torch.compile, so the allocating forms are the Python functions of this module, rope / repeat_heads /
attn_prologue, with exactly the signatures and results of lmk.rope / lmk.repeat_heads / lmk.attn_prologue:
they allocate with torch.empty and call the op, and trace into a graph with no break. lmk.rope & co. call them
themselves while torch.compile traces.

    torch.ops.lmk.rope(q, positions, out, k=None, k_out=None, freq_factors=None, rope_dim=None,
                       freq_base=10000.0, rope_mode="neox", sections=None, pairing="half_rope", freq_scale=1.0,
                       ext_factor=0.0, attn_factor=1.0, beta_fast=32.0, beta_slow=1.0, n_ctx_orig=0) -> None
    torch.ops.lmk.repeat_heads(x, h, out, layout="tiled") -> None
    torch.ops.lmk.attn_prologue(q, k, positions, q_out, k_out=None, v=None, q_norm_w=None, k_norm_w=None,
                                eps=1e-6, weight_offset=0.0, slots=None, k_cache=None, v_cache=None, k_scale=1.0,
                                v_scale=1.0, freq_factors=None, <rope keywords as above>) -> None

The op schemas call the mode `rope_mode` (a custom-op argument named `mode` collides with torch.compile's
dispatch-mode handlers); the Python functions keep lmk's `mode`. The kernels run on the current CUDA stream
with no synchronisation and no allocation by lmk, so the ops can be captured into CUDA graphs. The fake
(meta) implementations check the shapes and write nothing.
"""
from typing import List, Optional

import torch

from . import _ops

Tensor = torch.Tensor


def _rope_kwargs(rope_dim, freq_base, mode, sections, pairing, freq_scale, ext_factor, attn_factor, beta_fast,
                 beta_slow, n_ctx_orig):
    return dict(rope_dim=rope_dim, freq_base=freq_base, mode=mode, sections=sections, pairing=pairing,
                freq_scale=freq_scale, ext_factor=ext_factor, attn_factor=attn_factor, beta_fast=beta_fast,
                beta_slow=beta_slow, n_ctx_orig=n_ctx_orig)


def _check3(op, name, t):
    if t is not None and t.dim() != 3:
        raise ValueError("lmk.%s: %s must be 3-D [T, heads, head_dim], got shape %s" % (op, name, tuple(t.shape)))


# ---- the custom ops (out-forms) ----

@torch.library.custom_op("lmk::rope", mutates_args=("out", "k_out"))
def _rope_op(q: Tensor, positions: Tensor, out: Tensor, k: Optional[Tensor] = None, k_out: Optional[Tensor] = None,
             freq_factors: Optional[Tensor] = None, rope_dim: Optional[int] = None, freq_base: float = 10000.0,
             rope_mode: str = "neox", sections: Optional[List[int]] = None, pairing: str = "half_rope",
             freq_scale: float = 1.0, ext_factor: float = 0.0, attn_factor: float = 1.0, beta_fast: float = 32.0,
             beta_slow: float = 1.0, n_ctx_orig: int = 0) -> None:
    _ops.rope(q, positions, k=k, freq_factors=freq_factors, out=out, k_out=k_out,
              **_rope_kwargs(rope_dim, freq_base, rope_mode, sections, pairing, freq_scale, ext_factor, attn_factor,
                             beta_fast, beta_slow, n_ctx_orig))


@_rope_op.register_fake
def _rope_fake(q, positions, out, k=None, k_out=None, *args, **kwargs):
    for name, t in (("q", q), ("out", out), ("k", k), ("k_out", k_out)):
        _check3("rope", name, t)


@torch.library.custom_op("lmk::repeat_heads", mutates_args=("out",))
def _repeat_heads_op(x: Tensor, h: int, out: Tensor, layout: str = "tiled") -> None:
    _ops.repeat_heads(x, h, layout=layout, out=out)


@_repeat_heads_op.register_fake
def _repeat_heads_fake(x, h, out, layout="tiled"):
    _check3("repeat_heads", "x", x)


@torch.library.custom_op("lmk::attn_prologue", mutates_args=("q_out", "k_out", "k_cache", "v_cache"))
def _attn_prologue_op(q: Tensor, k: Tensor, positions: Tensor, q_out: Tensor, k_out: Optional[Tensor] = None,
                      v: Optional[Tensor] = None, q_norm_w: Optional[Tensor] = None,
                      k_norm_w: Optional[Tensor] = None, eps: float = 1e-6, weight_offset: float = 0.0,
                      slots: Optional[Tensor] = None, k_cache: Optional[Tensor] = None,
                      v_cache: Optional[Tensor] = None, k_scale: float = 1.0, v_scale: float = 1.0,
                      freq_factors: Optional[Tensor] = None, rope_dim: Optional[int] = None,
                      freq_base: float = 10000.0, rope_mode: str = "neox", sections: Optional[List[int]] = None,
                      pairing: str = "half_rope", freq_scale: float = 1.0, ext_factor: float = 0.0,
                      attn_factor: float = 1.0, beta_fast: float = 32.0, beta_slow: float = 1.0,
                      n_ctx_orig: int = 0) -> None:
    _ops.attn_prologue(q, k, positions, v=v, q_norm_w=q_norm_w, k_norm_w=k_norm_w, eps=eps,
                       weight_offset=weight_offset, slots=slots, k_cache=k_cache, v_cache=v_cache, k_scale=k_scale,
                       v_scale=v_scale, q_out=q_out, k_out=k_out, freq_factors=freq_factors,
                       **_rope_kwargs(rope_dim, freq_base, rope_mode, sections, pairing, freq_scale, ext_factor,
                                      attn_factor, beta_fast, beta_slow, n_ctx_orig))


@_attn_prologue_op.register_fake
def _attn_prologue_fake(q, k, positions, q_out, k_out=None, *args, **kwargs):
    for name, t in (("q", q), ("k", k), ("q_out", q_out), ("k_out", k_out)):
        _check3("attn_prologue", name, t)


# ---- the allocating forms: lmk.rope & co. for torch tensors, traceable by torch.compile ----

def _int_list(v):
    return None if v is None else [int(x) for x in v]


def _new(like, shape=None):
    return torch.empty(tuple(like.shape) if shape is None else tuple(shape), dtype=like.dtype, device=like.device)


def rope(q, positions, *, k=None, rope_dim=None, freq_base=10000.0, mode="neox", sections=None,
         pairing="half_rope", freq_scale=1.0, ext_factor=0.0, attn_factor=1.0, beta_fast=32.0, beta_slow=1.0,
         n_ctx_orig=0, freq_factors=None, out=None, k_out=None):
    """lmk.rope through torch.ops.lmk.rope: returns q_out, or (q_out, k_out) when k is given."""
    if k is None and k_out is not None:
        raise ValueError("lmk.rope: k_out was given without k")
    out = _new(q) if out is None else out
    if k is not None and k_out is None:
        k_out = _new(k)
    torch.ops.lmk.rope(q, positions, out, k=k, k_out=k_out, freq_factors=freq_factors, rope_dim=rope_dim,
                       freq_base=float(freq_base), rope_mode=str(mode), sections=_int_list(sections),
                       pairing=str(pairing), freq_scale=float(freq_scale), ext_factor=float(ext_factor),
                       attn_factor=float(attn_factor), beta_fast=float(beta_fast), beta_slow=float(beta_slow),
                       n_ctx_orig=int(n_ctx_orig))
    return out if k is None else (out, k_out)


def repeat_heads(x, h, *, layout="tiled", out=None):
    """lmk.repeat_heads through torch.ops.lmk.repeat_heads."""
    if out is None:
        _check3("repeat_heads", "x", x)
        out = _new(x, (x.shape[0], h, x.shape[2]))
    torch.ops.lmk.repeat_heads(x, h, out, layout=str(layout))
    return out


def attn_prologue(q, k, positions, *, v=None, q_norm_w=None, k_norm_w=None, eps=1e-6, weight_offset=0.0,
                  slots=None, k_cache=None, v_cache=None, k_scale=1.0, v_scale=1.0, q_out=None, k_out=None,
                  **rope_kwargs):
    """lmk.attn_prologue through torch.ops.lmk.attn_prologue: returns (q_out, k_out or None)."""
    unknown = sorted(set(rope_kwargs) - set(_ops.ROPE_KWARGS))
    if unknown:
        raise TypeError("lmk.attn_prologue: unexpected keyword argument(s) %s" % ", ".join(unknown))
    if "mode" in rope_kwargs:
        rope_kwargs["rope_mode"] = str(rope_kwargs.pop("mode"))
    if "pairing" in rope_kwargs:
        rope_kwargs["pairing"] = str(rope_kwargs["pairing"])
    for name in ("freq_base", "freq_scale", "ext_factor", "attn_factor", "beta_fast", "beta_slow"):
        if name in rope_kwargs:
            rope_kwargs[name] = float(rope_kwargs[name])
    if "sections" in rope_kwargs:
        rope_kwargs["sections"] = _int_list(rope_kwargs["sections"])
    q_out = _new(q) if q_out is None else q_out
    if k_out is None and k_cache is None:
        k_out = _new(k)
    torch.ops.lmk.attn_prologue(q, k, positions, q_out, k_out=k_out, v=v, q_norm_w=q_norm_w, k_norm_w=k_norm_w,
                                eps=float(eps), weight_offset=float(weight_offset), slots=slots, k_cache=k_cache,
                                v_cache=v_cache, k_scale=float(k_scale), v_scale=float(v_scale), **rope_kwargs)
    return q_out, k_out


is_compiling = torch.compiler.is_compiling
