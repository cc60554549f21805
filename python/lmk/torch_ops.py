"""torch_ops.py - lmk's ops as PyTorch custom ops, for torch.compile(fullgraph=True) and CUDA graph capture.

Importing this module registers torch.ops.lmk.rope, torch.ops.lmk.repeat_heads, torch.ops.lmk.attn_prologue,
torch.ops.lmk.causal_conv1d and torch.ops.lmk.gated_delta_rule (lmk does so itself when torch was imported
first or when a torch tensor reaches an lmk op). They are the out-forms: the caller (or a function below)
allocates the outputs with torch, the op writes them and returns nothing. Every written tensor, the caches
and state pools included, is declared in mutates_args, so functionalization sees the writes; pass an input
itself as `out` for in place. A mutating custom op cannot return a list or an optional tensor under
torch.compile, so the allocating forms are the Python functions of this module, rope / repeat_heads /
attn_prologue / causal_conv1d / gated_delta_rule, with exactly the signatures and results of lmk's own: they
allocate with torch.empty and call the op, and trace into a graph with no break. lmk.rope & co. call them
themselves while torch.compile traces.

    torch.ops.lmk.rope(q, positions, out, k=None, k_out=None, freq_factors=None, rope_dim=None,
                       freq_base=10000.0, rope_mode="neox", sections=None, pairing="half_rope", freq_scale=1.0,
                       ext_factor=0.0, attn_factor=1.0, beta_fast=32.0, beta_slow=1.0, n_ctx_orig=0) -> None
    torch.ops.lmk.repeat_heads(x, h, out, layout="tiled") -> None
    torch.ops.lmk.attn_prologue(q, k, positions, q_out, k_out=None, v=None, q_norm_w=None, k_norm_w=None,
                                eps=1e-6, weight_offset=0.0, slots=None, k_cache=None, v_cache=None, k_scale=1.0,
                                v_scale=1.0, freq_factors=None, <rope keywords as above>) -> None
    torch.ops.lmk.causal_conv1d(x, weight, out, bias=None, activation="silu", cu_seqlens=None, state=None,
                                state_slots=None) -> None
    torch.ops.lmk.gated_delta_rule(q, k, v, a, b, out, A_log=None, dt_bias=None, heads="block", scale=None,
                                   l2norm=True, cu_seqlens=None, state=None, state_slots=None, z=None,
                                   norm_w=None, eps=1e-6, weight_offset=0.0, workspace=None) -> None

The op schemas call the mode `rope_mode` (a custom-op argument named `mode` collides with torch.compile's
dispatch-mode handlers); the Python functions keep lmk's `mode`. State pools may be strided views of the
caller's tensors (Hugging Face's conv cache as cache.transpose(1, 2)); the writes land in the tensor viewed.
The kernels run on the current CUDA stream with no synchronisation and no allocation by lmk, so the ops can
be captured into CUDA graphs. The fake (meta) implementations check the shapes and write nothing.
"""
from typing import List, Optional

try:
    import torch
except ModuleNotFoundError as e:
    if e.name != "torch":
        raise
    raise ModuleNotFoundError("lmk.torch_ops needs PyTorch, which is not installed (pip install torch); lmk's "
                              "functions (lmk.rope, ...) work without it on NumPy and other DLPack arrays",
                              name="torch") from e
if not hasattr(torch.library, "custom_op"):
    raise ImportError("lmk.torch_ops needs torch.library.custom_op (PyTorch >= 2.4); this is torch %s, so lmk "
                      "runs torch tensors eagerly only" % torch.__version__)

from . import _compiled, _ops  # noqa: E402
from ._errors import LmkError, LmkTypeError  # noqa: E402

Tensor = torch.Tensor
_compiled.register_torch(torch)  # the compiled host path takes torch tensors from here on


def _rope_kwargs(rope_dim, freq_base, mode, sections, pairing, freq_scale, ext_factor, attn_factor, beta_fast,
                 beta_slow, n_ctx_orig):
    return dict(rope_dim=rope_dim, freq_base=freq_base, mode=mode, sections=sections, pairing=pairing,
                freq_scale=freq_scale, ext_factor=ext_factor, attn_factor=attn_factor, beta_fast=beta_fast,
                beta_slow=beta_slow, n_ctx_orig=n_ctx_orig)


def _check3(op, name, t):
    if t is not None and t.dim() != 3:
        raise LmkError("lmk.%s: %s must be 3-D [T, heads, head_dim], got shape %s" % (op, name, tuple(t.shape)))


def _check_shape(op, name, t, shape):
    if t is not None and tuple(t.shape) != tuple(shape):
        raise LmkError("lmk.%s: %s must have shape %s, got %s" % (op, name, tuple(shape), tuple(t.shape)))


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
    _check_shape("rope", "out", out, q.shape)
    if k is not None:
        _check_shape("rope", "k_out", k_out, k.shape)


@torch.library.custom_op("lmk::repeat_heads", mutates_args=("out",))
def _repeat_heads_op(x: Tensor, h: int, out: Tensor, layout: str = "tiled") -> None:
    _ops.repeat_heads(x, h, layout=layout, out=out)


@_repeat_heads_op.register_fake
def _repeat_heads_fake(x, h, out, layout="tiled"):
    _check3("repeat_heads", "x", x)
    _check_shape("repeat_heads", "out", out, (x.shape[0], h, x.shape[2]))


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
    _check_shape("attn_prologue", "q_out", q_out, q.shape)
    _check_shape("attn_prologue", "k_out", k_out, k.shape)


@torch.library.custom_op("lmk::causal_conv1d", mutates_args=("out", "state"))
def _causal_conv1d_op(x: Tensor, weight: Tensor, out: Tensor, bias: Optional[Tensor] = None,
                      activation: str = "silu", cu_seqlens: Optional[Tensor] = None, state: Optional[Tensor] = None,
                      state_slots: Optional[Tensor] = None) -> None:
    _ops.causal_conv1d(x, weight, bias=bias, activation=activation, cu_seqlens=cu_seqlens, state=state,
                       state_slots=state_slots, out=out)


@_causal_conv1d_op.register_fake
def _causal_conv1d_fake(x, weight, out, bias=None, activation="silu", cu_seqlens=None, state=None,
                        state_slots=None):
    if x.dim() != 2:
        raise LmkError("lmk.causal_conv1d: x must be 2-D [T, C], got shape %s" % (tuple(x.shape),))
    _check_shape("causal_conv1d", "out", out, x.shape)
    if state is not None:
        _check_shape("causal_conv1d", "state", state, (state.shape[0], weight.shape[-1] - 1, x.shape[1]))


@torch.library.custom_op("lmk::gated_delta_rule", mutates_args=("out", "state", "workspace"))
def _gated_delta_rule_op(q: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, out: Tensor,
                         A_log: Optional[Tensor] = None, dt_bias: Optional[Tensor] = None, heads: str = "block",
                         scale: Optional[float] = None, l2norm: bool = True, cu_seqlens: Optional[Tensor] = None,
                         state: Optional[Tensor] = None, state_slots: Optional[Tensor] = None,
                         z: Optional[Tensor] = None, norm_w: Optional[Tensor] = None, eps: float = 1e-6,
                         weight_offset: float = 0.0, workspace: Optional[Tensor] = None) -> None:
    _ops.gated_delta_rule(q, k, v, a, b, A_log=A_log, dt_bias=dt_bias, heads=heads, scale=scale, l2norm=l2norm,
                          cu_seqlens=cu_seqlens, state=state, state_slots=state_slots, z=z, norm_w=norm_w, eps=eps,
                          weight_offset=weight_offset, out=out, workspace=workspace)


@_gated_delta_rule_op.register_fake
def _gated_delta_rule_fake(q, k, v, a, b, out, A_log=None, dt_bias=None, heads="block", scale=None, l2norm=True,
                           cu_seqlens=None, state=None, state_slots=None, z=None, norm_w=None, eps=1e-6,
                           weight_offset=0.0, workspace=None):
    for name, t in (("q", q), ("k", k), ("v", v), ("out", out)):
        _check3("gated_delta_rule", name, t)
    _check_shape("gated_delta_rule", "k", k, q.shape)
    _check_shape("gated_delta_rule", "out", out, (q.shape[0], v.shape[1], v.shape[2]))
    if state is not None:
        _check_shape("gated_delta_rule", "state", state, (state.shape[0], v.shape[1], q.shape[2], v.shape[2]))


# ---- the allocating forms: lmk.rope & co. for torch tensors, traceable by torch.compile ----
# Keywords go through _ops' own checks (a string is not a number, a flag is True or False) before they
# reach the op's typed schema, so the compiled path accepts exactly what the eager one does.

def _num(op, name, v):
    return _ops._float(op, name, v)


def _int_list(op, name, v):
    if v is None:
        return None
    try:
        return [_ops._u32(op, name, x) for x in v]
    except TypeError:
        raise LmkTypeError("lmk.%s: %s must be a list of integers, got %r" % (op, name, v)) from None


def _new(like, shape=None):
    return torch.empty(tuple(like.shape) if shape is None else tuple(shape), dtype=like.dtype, device=like.device)


def _rope_schema_kwargs(op, kw):
    """lmk.rope's keywords as the op schemas type them (mode as rope_mode)."""
    out = {}
    for name, v in kw.items():
        if name == "mode":
            out["rope_mode"] = str(v)
        elif name == "pairing":
            out[name] = str(v)
        elif name in ("freq_base", "freq_scale", "ext_factor", "attn_factor", "beta_fast", "beta_slow"):
            out[name] = _num(op, name, v)
        elif name == "sections":
            out[name] = _int_list(op, name, v)
        elif name == "n_ctx_orig" or (name == "rope_dim" and v is not None):
            out[name] = _ops._u32(op, name, v)
        else:
            out[name] = v
    return out


def rope(q, positions, *, k=None, rope_dim=None, freq_base=10000.0, mode="neox", sections=None,
         pairing="half_rope", freq_scale=1.0, ext_factor=0.0, attn_factor=1.0, beta_fast=32.0, beta_slow=1.0,
         n_ctx_orig=0, freq_factors=None, out=None, k_out=None):
    """lmk.rope through torch.ops.lmk.rope: returns q_out, or (q_out, k_out) when k is given."""
    if k is None and k_out is not None:
        raise LmkError("lmk.rope: k_out was given without k")
    out = _new(q) if out is None else out
    if k is not None and k_out is None:
        k_out = _new(k)
    kw = _rope_schema_kwargs("rope", _rope_kwargs(rope_dim, freq_base, mode, sections, pairing, freq_scale,
                                                  ext_factor, attn_factor, beta_fast, beta_slow, n_ctx_orig))
    torch.ops.lmk.rope(q, positions, out, k=k, k_out=k_out, freq_factors=freq_factors, **kw)
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
    op = "attn_prologue"
    unknown = sorted(set(rope_kwargs) - set(_ops.ROPE_KWARGS))
    if unknown:
        raise LmkTypeError("lmk.attn_prologue: unexpected keyword argument(s) %s" % ", ".join(unknown))
    freq_factors = rope_kwargs.pop("freq_factors", None)
    rope_kwargs = _rope_schema_kwargs(op, rope_kwargs)
    q_out = _new(q) if q_out is None else q_out
    if k_out is None and k_cache is None:
        k_out = _new(k)
    torch.ops.lmk.attn_prologue(q, k, positions, q_out, k_out=k_out, v=v, q_norm_w=q_norm_w, k_norm_w=k_norm_w,
                                eps=_num(op, "eps", eps), weight_offset=_num(op, "weight_offset", weight_offset),
                                slots=slots, k_cache=k_cache, v_cache=v_cache, k_scale=_num(op, "k_scale", k_scale),
                                v_scale=_num(op, "v_scale", v_scale), freq_factors=freq_factors, **rope_kwargs)
    return q_out, k_out


def causal_conv1d(x, weight, *, bias=None, activation="silu", cu_seqlens=None, state=None, state_slots=None,
                  out=None):
    """lmk.causal_conv1d through torch.ops.lmk.causal_conv1d: returns out."""
    if out is None:
        if x.dim() != 2:
            raise LmkError("lmk.causal_conv1d: x must be 2-D [T, C], got shape %s" % (tuple(x.shape),))
        out = _new(x)
    act = "none" if activation is None else str(activation)
    torch.ops.lmk.causal_conv1d(x, weight, out, bias=bias, activation=act, cu_seqlens=cu_seqlens, state=state,
                                state_slots=state_slots)
    return out


def gated_delta_rule(q, k, v, a, b, *, A_log=None, dt_bias=None, heads="block", scale=None, l2norm=True,
                     cu_seqlens=None, state=None, state_slots=None, z=None, norm_w=None, eps=1e-6,
                     weight_offset=0.0, out=None, workspace=None):
    """lmk.gated_delta_rule through torch.ops.lmk.gated_delta_rule: returns out."""
    op = "gated_delta_rule"
    if out is None:
        _check3(op, "q", q)
        _check3(op, "v", v)
        out = torch.empty((q.shape[0], v.shape[1], v.shape[2]), dtype=q.dtype, device=q.device)
    torch.ops.lmk.gated_delta_rule(q, k, v, a, b, out, A_log=A_log, dt_bias=dt_bias, heads=str(heads),
                                   scale=None if scale is None else _num(op, "scale", scale),
                                   l2norm=_ops._bool(op, "l2norm", l2norm), cu_seqlens=cu_seqlens, state=state,
                                   state_slots=state_slots, z=z, norm_w=norm_w, eps=_num(op, "eps", eps),
                                   weight_offset=_num(op, "weight_offset", weight_offset), workspace=workspace)
    return out


is_compiling = torch.compiler.is_compiling
