"""_ops.py - the Python entry points of lmk's ops: rope, repeat_heads, attn_prologue, and the library facts.

Each op reads its arguments (Python-side rules raise ValueError/TypeError naming the argument), allocates the
outputs the caller did not pass with the caller's own library, wraps every array without copying, and makes
one C call; liblmk validates everything else and a failure raises LmkError with its message. Nothing the
caller passed is written before the C call, and liblmk writes nothing on a rejected call (lmk.h), so a
failing call leaves every array unchanged.
"""
import ctypes
import operator

from . import _arrays, _lib
from ._runtime import Call, LmkError, check, device

_MODES = {"normal": 0, "neox": 2, "mrope": 8, "imrope": 40, "vision": 24}
_MULTI = (8, 40, 24)
_PAIRINGS = {"half_rope": 0, "half_head": 1}
_LAYOUTS = {"tiled": 0, "block": 1}
ROPE_KWARGS = ("rope_dim", "freq_base", "mode", "sections", "pairing", "freq_scale", "ext_factor", "attn_factor",
               "beta_fast", "beta_slow", "n_ctx_orig", "freq_factors")
_torch_ops_error = None


def _torch_forms(obj):
    """lmk.torch_ops while torch.compile traces a call on torch tensors, else None: the ctypes path cannot
    be traced, so the entry points then hand over to the allocating forms (torch.empty + torch.ops.lmk.*).
    The first torch tensor seen imports lmk.torch_ops, which registers torch.ops.lmk.* (torch is imported
    by then); the module comes from the import statement, which torch.compile also follows. A torch too old
    for torch.library.custom_op keeps the eager path (`import lmk.torch_ops` then says why)."""
    global _torch_ops_error
    if _torch_ops_error is not None or _arrays.kind_of(obj) != "torch":
        return None
    try:
        from . import torch_ops
    except Exception as e:  # noqa: BLE001 - any failure to register leaves the eager path working
        _torch_ops_error = e
        return None
    return torch_ops if torch_ops.is_compiling() else None


def _choice(op, name, value, table):
    if isinstance(value, str):
        key = value.strip().lower()
        if key in table:
            return table[key]
        if key.isdigit() and int(key) in table.values():
            return int(key)
    elif not isinstance(value, bool):
        try:
            v = operator.index(value)
        except TypeError:
            v = None
        if v in table.values():
            return v
    names = ", ".join("%r" % k for k in table)
    nums = ", ".join(str(v) for v in table.values())
    raise ValueError("lmk.%s: %s must be one of %s (or %s), got %r" % (op, name, names, nums, value))


def _u32(op, name, value):
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError("lmk.%s: %s must be an integer, got %r" % (op, name, value)) from None
    if not 0 <= v < 2 ** 32:
        raise ValueError("lmk.%s: %s must be in [0, 2^32), got %d" % (op, name, v))
    return v


def _float(op, name, value):
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError("lmk.%s: %s must be a number, got %r" % (op, name, value)) from None


def _sections(op, sections):
    if sections is None:
        return [0, 0, 0, 0]
    try:
        s = [_u32(op, "sections", v) for v in sections]
    except TypeError:
        raise TypeError("lmk.%s: sections must be a list of up to 4 integers, got %r" % (op, sections)) from None
    if not 1 <= len(s) <= 4:
        raise ValueError("lmk.%s: sections must have 1 to 4 entries (missing ones are 0), got %r" % (op, sections))
    return s + [0] * (4 - len(s))


def _shape3(op, name, a):
    if len(a.shape) != 3:
        raise ValueError("lmk.%s: %s must be 3-D [T, heads, head_dim], got shape %s" % (op, name, a.shape))
    return a.shape


def rope_params(op, T, H, D, Hk, rope_dim=None, freq_base=10000.0, mode="neox", sections=None,
                pairing="half_rope", freq_scale=1.0, ext_factor=0.0, attn_factor=1.0, beta_fast=32.0, beta_slow=1.0,
                n_ctx_orig=0):
    """lmk_rope_params from the keyword arguments. Zero scaling fields mean lmk.h's defaults."""
    p = _lib.RopeParams()
    p.head_dim, p.n_heads, p.seq_len = _u32(op, "head_dim", D), _u32(op, "heads", H), _u32(op, "T", T)
    p.n_k_heads = _u32(op, "k heads", Hk)
    p.rope_dim = p.head_dim if rope_dim is None else _u32(op, "rope_dim", rope_dim)
    p.freq_base = _float(op, "freq_base", freq_base)
    p.mode = _choice(op, "mode", mode, _MODES)
    p.sections[:] = _sections(op, sections)
    p.pairing = _choice(op, "pairing", pairing, _PAIRINGS)
    p.freq_scale, p.ext_factor = _float(op, "freq_scale", freq_scale), _float(op, "ext_factor", ext_factor)
    p.attn_factor = _float(op, "attn_factor", attn_factor)
    p.beta_fast, p.beta_slow = _float(op, "beta_fast", beta_fast), _float(op, "beta_slow", beta_slow)
    p.n_ctx_orig = _u32(op, "n_ctx_orig", n_ctx_orig)
    return p


def _positions(call, positions, mode, T):
    """The positions buffer. Multi modes take (4, T), 4*T, or Hugging Face's (3, T): t, h, w, to which a
    copy of the t row is appended as the fourth axis (e), which reproduces Hugging Face's result."""
    shape = tuple(getattr(positions, "shape", ()))
    if mode in _MULTI and len(shape) == 2 and shape[0] == 3 and shape[1] == T:
        positions = _arrays.append_first_row(positions)
    a = call.read(positions, "positions")
    return call.buffer(a, dense=True), positions


def _optional_buffer(call, obj, name, dense=True):
    if obj is None:
        return None
    return call.buffer(call.read(obj, name), dense=dense)


def rope(q, positions, *, k=None, rope_dim=None, freq_base=10000.0, mode="neox", sections=None,
         pairing="half_rope", freq_scale=1.0, ext_factor=0.0, attn_factor=1.0, beta_fast=32.0, beta_slow=1.0,
         n_ctx_orig=0, freq_factors=None, out=None, k_out=None):
    """Rotary position embedding of q [T, H, D] (and k [T, Hk, D]) by lmk_rope; include/lmk.h has the formulas.

    positions: T entries (normal, neox) or, for mrope/imrope/vision, (4, T), 4*T or Hugging Face's (3, T);
    int32, uint32 or int64. mode: "normal", "neox", "mrope", "imrope", "vision" (or 0, 2, 8, 40, 24).
    rope_dim None: head_dim. sections: up to 4 section sizes (t, h, w, e; missing ones are 0). pairing:
    "half_rope" (Hugging Face) or "half_head". Scaling fields as lmk.h (0 means its default). freq_factors:
    f32 [rope_dim/2] or None. out / k_out: arrays to write (q / k themselves for in place); None allocates
    them like q / k. q, k, out and k_out may be strided views whose last axis has stride 1 (e.g. q of a
    [q | gate] projection); they are used in place, without copies. Returns q_out, or (q_out, k_out) with k.
    """
    forms = _torch_forms(q)
    if forms:
        return forms.rope(q, positions, k=k, rope_dim=rope_dim, freq_base=freq_base, mode=mode, sections=sections,
                          pairing=pairing, freq_scale=freq_scale, ext_factor=ext_factor, attn_factor=attn_factor,
                          beta_fast=beta_fast, beta_slow=beta_slow, n_ctx_orig=n_ctx_orig,
                          freq_factors=freq_factors, out=out, k_out=k_out)
    if k is None and k_out is not None:
        raise ValueError("lmk.rope: k_out was given without k")
    with Call("rope", q, "q") as call:
        qa = call.read(q, "q")
        ka = call.read(k, "k") if k is not None else None
        T, H, D = _shape3("rope", "q", qa)
        Hk = _shape3("rope", "k", ka)[1] if k is not None else 0
        p = rope_params("rope", T, H, D, Hk, rope_dim, freq_base, mode, sections, pairing, freq_scale, ext_factor,
                        attn_factor, beta_fast, beta_slow, n_ctx_orig)
        if out is None:
            out = _arrays.empty_like_shape(q, (T, H, D))
        if k is not None and k_out is None:
            k_out = _arrays.empty_like_shape(k, (T, Hk, D))
        qb = call.buffer(qa)
        kb = call.buffer(ka) if k is not None else None
        pb, _keep = _positions(call, positions, p.mode, T)
        ffb = _optional_buffer(call, freq_factors, "freq_factors")
        ob = call.buffer(call.read(out, "out", writable=True))
        kob = call.buffer(call.read(k_out, "k_out", writable=True)) if k is not None else None
        call.run(_lib.rope, qb, kb, pb, ffb, ob, kob, ctypes.byref(p))
    return out if k is None else (out, k_out)


def repeat_heads(x, h, *, layout="tiled", out=None):
    """GQA head broadcast x [T, Hg, K] -> [T, h, K] by lmk_repeat_heads, a bit-exact copy of any element size.

    layout "tiled": head i reads x head i % Hg (GGUF / llama.cpp); "block": i // (h // Hg) (Hugging Face
    repeat_interleave / repeat_kv). out: an array to write; None allocates one like x. x and out may be
    strided views whose last axis has stride 1.
    """
    forms = _torch_forms(x)
    if forms:
        return forms.repeat_heads(x, h, layout=layout, out=out)
    lay = _choice("repeat_heads", "layout", layout, _LAYOUTS)
    with Call("repeat_heads", x, "x") as call:
        xa = call.read(x, "x", raw=True)
        T, Hg, K = _shape3("repeat_heads", "x", xa)
        p = _lib.RepeatHeadsParams(_u32("repeat_heads", "T", T), _u32("repeat_heads", "Hg", Hg),
                                   _u32("repeat_heads", "h", h), _u32("repeat_heads", "K", K), lay)
        if out is None:
            out = _arrays.empty_like_shape(x, (T, p.h, K))
        xb = call.buffer(xa)
        ob = call.buffer(call.read(out, "out", raw=True, writable=True))
        call.run(_lib.repeat_heads, xb, ob, ctypes.byref(p))
    return out


def _cache_rows(op, name, a):
    """A KV cache as rows [n_slots, Hk, D]: a paged [n_blocks, block_size, Hk, D] whose first two axes merge
    (block stride = block_size * row stride) is viewed as [n_blocks * block_size, Hk, D]."""
    if len(a.shape) == 4:
        nb, bs, hk, d = a.shape
        sb, ss = a.strides[0], a.strides[1]
        if nb > 1 and bs > 1 and sb != bs * ss:
            raise ValueError("lmk.%s: %s [n_blocks, block_size, Hk, D] has strides %s: its blocks are not rows of "
                             "one stride, so it cannot be viewed as [n_slots, Hk, D]" % (op, name, a.strides))
        a.shape = (nb * bs, hk, d)
        a.strides = (ss if bs > 1 else sb, a.strides[2], a.strides[3])
    elif len(a.shape) != 3:
        raise ValueError("lmk.%s: %s must be [n_slots, Hk, D] or [n_blocks, block_size, Hk, D], got shape %s"
                         % (op, name, a.shape))
    return a


def attn_prologue(q, k, positions, *, v=None, q_norm_w=None, k_norm_w=None, eps=1e-6, weight_offset=0.0,
                  slots=None, k_cache=None, v_cache=None, k_scale=1.0, v_scale=1.0, q_out=None, k_out=None,
                  **rope_kwargs):
    """One attention layer's prologue by lmk_attn_prologue: per-head RMS norm of q and k (weights q_norm_w /
    k_norm_w [D], scaled by weight + weight_offset; None skips that norm), rope (rope_kwargs as lmk.rope),
    then k (and v) stored into k_cache / v_cache rows `slots` (stored = x / scale for f8 caches).

    Caches are [n_slots, Hk, D] or paged [n_blocks, block_size, Hk, D], strided views allowed. q_out None
    allocates one; k_out None allocates one unless k_cache is given (then k goes only to the cache and None
    is returned); pass k_out (or k itself, for in place) to get both. Returns (q_out, k_out or None).
    """
    if _lib.attn_prologue is None:
        raise LmkError("this liblmk has no attn_prologue (%s)" % _lib.LIBRARY_PATH, "LMK_ERR_UNSUPPORTED")
    forms = _torch_forms(q)
    if forms:
        return forms.attn_prologue(q, k, positions, v=v, q_norm_w=q_norm_w, k_norm_w=k_norm_w, eps=eps,
                                   weight_offset=weight_offset, slots=slots, k_cache=k_cache, v_cache=v_cache,
                                   k_scale=k_scale, v_scale=v_scale, q_out=q_out, k_out=k_out, **rope_kwargs)
    unknown = sorted(set(rope_kwargs) - set(ROPE_KWARGS))
    if unknown:
        raise TypeError("lmk.attn_prologue: unexpected keyword argument(s) %s" % ", ".join(unknown))
    freq_factors = rope_kwargs.pop("freq_factors", None)
    if v is not None and v_cache is None:
        raise ValueError("lmk.attn_prologue: v needs v_cache")
    op = "attn_prologue"
    with Call(op, q, "q") as call:
        qa, ka = call.read(q, "q"), call.read(k, "k")
        T, H, D = _shape3(op, "q", qa)
        Hk = _shape3(op, "k", ka)[1]
        p = rope_params(op, T, H, D, Hk, **rope_kwargs)
        norm = _lib.RmsNormParams(_float(op, "eps", eps), _float(op, "weight_offset", weight_offset))
        if q_out is None:
            q_out = _arrays.empty_like_shape(q, (T, H, D))
        if k_out is None and k_cache is None:
            k_out = _arrays.empty_like_shape(k, (T, Hk, D))
        io = _lib.AttnPrologueIO()
        io.q_in, io.k_in = call.buffer(qa), call.buffer(ka)
        io.v_in = call.buffer(call.read(v, "v")) if v is not None else None
        io.q_norm_w = _optional_buffer(call, q_norm_w, "q_norm_w")
        io.k_norm_w = _optional_buffer(call, k_norm_w, "k_norm_w")
        io.positions, _keep = _positions(call, positions, p.mode, T)
        io.freq_factors = _optional_buffer(call, freq_factors, "freq_factors")
        io.slots = _optional_buffer(call, slots, "slots")
        io.q_out = call.buffer(call.read(q_out, "q_out", writable=True))
        io.k_out = call.buffer(call.read(k_out, "k_out", writable=True)) if k_out is not None else None
        for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
            if cache is not None:
                a = _cache_rows(op, name, call.read(cache, name, raw=False, writable=True))
                setattr(io, name, call.buffer(a))
        io.k_scale, io.v_scale = _float(op, "k_scale", k_scale), _float(op, "v_scale", v_scale)
        call.run(_lib.attn_prologue, ctypes.byref(io), ctypes.byref(p), ctypes.byref(norm))
    return q_out, k_out


def has_attn_prologue():
    """True when the loaded liblmk has lmk_attn_prologue."""
    return _lib.attn_prologue is not None


def version():
    """liblmk's version, e.g. "0.1.0"."""
    return _lib.version().decode()


def build_info():
    """One line on how liblmk was built, e.g. "cuda=yes (...) simd=avx2"."""
    return _lib.build_info().decode()


def devices():
    """The devices this process can use: [{"backend": "cpu"|"cuda", "ordinal": n, "name": ...}, ...]."""
    found = []
    for backend, lmk_backend in (("cpu", _lib.BACKEND_CPU), ("cuda", _lib.BACKEND_CUDA)):
        n = _lib.device_count(lmk_backend)
        for i in range(max(n, 0)):
            h = device((backend, i))
            found.append({"backend": backend, "ordinal": i, "name": _lib.device_name(h).decode()})
    return found


__all__ = ["rope", "repeat_heads", "attn_prologue", "has_attn_prologue", "version", "build_info", "devices",
           "LmkError", "check"]
