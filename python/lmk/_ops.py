"""_ops.py - the Python entry points of lmk's ops: rope, repeat_heads, attn_prologue, causal_conv1d,
gated_delta_rule, and the library facts.

Each op reads its arguments, checks in Python what only Python knows (keywords and their types, and the
logical shape of every activation, output, cache and state: the C API counts a dense buffer's elements, so
an array of the right size but the wrong shape would otherwise pass), allocates the outputs the caller did
not pass with the caller's own library, wraps every array without copying, and makes one C call; liblmk
validates everything else. Every failure raises LmkError (a ValueError; LmkTypeError, also a TypeError, for
arguments of the wrong type) naming the op and the argument. Nothing the caller passed is written before the
C call, and liblmk writes nothing on a rejected call (lmk.h), so a failing call leaves every array unchanged.
A call on zero tokens (T = 0) checks its arguments and returns its empty outputs without calling liblmk,
whose ops take T >= 1: there is nothing to compute and no state changes.

Where the compiled host path is loaded (_compiled.py, _host.c), each entry point first offers the call to
it: it runs the usual calls on NumPy arrays and torch tensors in C and returns NotImplemented for the rest,
before writing anything, so what follows here is the path of every other call and the source of every
argument error. These are the eager functions: the public ones (_api.py) hand a call over to lmk.torch_ops
while torch.compile traces it, and lmk.torch_ops' custom ops run these.
"""
import ctypes
import operator

from . import _arrays, _lib
from ._compiled import host as _host
from ._errors import LmkError, LmkTypeError
from ._runtime import Call, check, device

_MODES = {"normal": 0, "neox": 2, "mrope": 8, "imrope": 40, "vision": 24}
_MULTI = (8, 40, 24)
_PAIRINGS = {"half_rope": 0, "half_head": 1}
_LAYOUTS = {"tiled": 0, "block": 1}
_ACTIVATIONS = {"none": _lib.ACT_NONE, "silu": _lib.ACT_SILU}
_NOT_NUMBERS = (str, bytes, bytearray)
ROPE_KWARGS = ("rope_dim", "freq_base", "mode", "sections", "pairing", "freq_scale", "ext_factor", "attn_factor",
               "beta_fast", "beta_slow", "n_ctx_orig", "freq_factors")


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
    raise LmkError("lmk.%s: %s must be one of %s (or %s), got %r" % (op, name, names, nums, value))


def _u32(op, name, value):
    try:
        v = operator.index(value)
    except TypeError:
        raise LmkTypeError("lmk.%s: %s must be an integer, got %r" % (op, name, value)) from None
    if not 0 <= v < 2 ** 32:
        raise LmkError("lmk.%s: %s must be in [0, 2^32), got %d" % (op, name, v))
    return v


def _float(op, name, value):
    """A number as a Python float. Strings are not numbers, although float() would parse them."""
    if not isinstance(value, _NOT_NUMBERS):
        try:
            return float(value)
        except (TypeError, ValueError):
            pass
    raise LmkTypeError("lmk.%s: %s must be a number, got %r" % (op, name, value))


def _bool(op, name, value):
    """True or False: a bool, a NumPy bool scalar, or the integer 0 or 1. Anything else (a string such as
    "False", which Python would read as true) is rejected."""
    if isinstance(value, bool):
        return value
    if getattr(getattr(value, "dtype", None), "kind", None) == "b" and getattr(value, "shape", None) == ():
        return bool(value)
    try:
        v = operator.index(value)
    except TypeError:
        v = None
    if v in (0, 1):
        return bool(v)
    raise LmkTypeError("lmk.%s: %s must be True or False, got %r" % (op, name, value))


def _sections(op, sections, mode):
    """lmk_rope_params.sections. The multi modes read each pair's position axis from them, so they need
    them: without sections every pair would read the fourth (e) axis."""
    if sections is None:
        s = []
    else:
        try:
            s = [_u32(op, "sections", v) for v in sections]
        except TypeError:
            raise LmkTypeError("lmk.%s: sections must be a list of up to 4 integers, got %r"
                               % (op, sections)) from None
        if not 1 <= len(s) <= 4:
            raise LmkError("lmk.%s: sections must have 1 to 4 entries (missing ones are 0), got %r"
                           % (op, sections))
    if mode in _MULTI and not any(s):
        name = {v: k for k, v in _MODES.items()}[mode]
        raise LmkError("lmk.%s: mode %r needs sections (the t, h, w[, e] section sizes in pairs, e.g. "
                       "[11, 11, 10] for Qwen3.5), got %r" % (op, name, sections))
    return s + [0] * (4 - len(s))


def _fmt(shape):
    return "(%s)" % ", ".join(str(n) for n in shape)


def _shape3(op, name, a):
    if len(a.shape) != 3:
        raise LmkError("lmk.%s: %s must be 3-D [T, heads, head_dim], got shape %s" % (op, name, _fmt(a.shape)))
    return a.shape


def _expect(op, name, a, shape, what):
    """a's shape must be exactly `shape` (what: where that shape comes from, for the message)."""
    if tuple(a.shape) != tuple(shape):
        raise LmkError("lmk.%s: %s must have shape %s (%s), got %s" % (op, name, _fmt(shape), what,
                                                                      _fmt(a.shape)))


def require(op, fn):
    if fn is None:
        raise LmkError("this liblmk has no %s (%s)" % (op, _lib.LIBRARY_PATH), "LMK_ERR_UNSUPPORTED")


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
    p.sections[:] = _sections(op, sections, p.mode)
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
    return call.read(positions, "positions"), positions


def _read_optional(call, obj, name, **kw):
    return None if obj is None else call.read(obj, name, **kw)


def _buffer_or_null(call, a, **kw):
    return None if a is None else call.buffer(a, **kw)


def rope(q, positions, *, k=None, rope_dim=None, freq_base=10000.0, mode="neox", sections=None,
         pairing="half_rope", freq_scale=1.0, ext_factor=0.0, attn_factor=1.0, beta_fast=32.0, beta_slow=1.0,
         n_ctx_orig=0, freq_factors=None, out=None, k_out=None):
    """Rotary position embedding of q [T, H, D] (and k [T, Hk, D]) by lmk_rope; include/lmk.h has the formulas.

    positions: T entries (normal, neox) or, for mrope/imrope/vision, (4, T), 4*T or Hugging Face's (3, T);
    int32, uint32 or int64. mode: "normal", "neox", "mrope", "imrope", "vision" (or 0, 2, 8, 40, 24); the
    last three need sections: up to 4 section sizes (t, h, w, e; missing ones are 0). rope_dim None:
    head_dim. pairing: "half_rope" (Hugging Face) or "half_head". Scaling fields as lmk.h (0 means its
    default). freq_factors: f32 [rope_dim/2] or None. out / k_out: arrays of q's / k's shape to write (q / k
    themselves for in place); None allocates them like q / k. q, k, out and k_out may be strided views whose
    last axis has stride 1 (e.g. q of a [q | gate] projection); they are used in place, without copies.
    Returns q_out, or (q_out, k_out) with k.
    """
    if _host is not None:
        r = _host.rope(q, positions, k, out, k_out, freq_factors, rope_dim, freq_base, mode, sections, pairing,
                       freq_scale, ext_factor, attn_factor, beta_fast, beta_slow, n_ctx_orig)
        if r is not NotImplemented:
            return r
    if k is None and k_out is not None:
        raise LmkError("lmk.rope: k_out was given without k")
    op = "rope"
    with Call(op, q, "q") as call:
        qa = call.read(q, "q")
        T, H, D = _shape3(op, "q", qa)
        ka = _read_optional(call, k, "k")
        Hk = _shape3(op, "k", ka)[1] if k is not None else 0
        if k is not None:
            _expect(op, "k", ka, (T, Hk, D), "q's T and head_dim")
        p = rope_params(op, T, H, D, Hk, rope_dim, freq_base, mode, sections, pairing, freq_scale, ext_factor,
                        attn_factor, beta_fast, beta_slow, n_ctx_orig)
        if out is None:
            out = _arrays.empty_like_shape(q, (T, H, D))
        if k is not None and k_out is None:
            k_out = _arrays.empty_like_shape(k, (T, Hk, D))
        pa, _keep = _positions(call, positions, p.mode, T)
        ffa = _read_optional(call, freq_factors, "freq_factors")
        oa = call.read(out, "out", writable=True)
        _expect(op, "out", oa, (T, H, D), "q's [T, heads, head_dim]")
        koa = _read_optional(call, k_out, "k_out", writable=True)
        if k is not None:
            _expect(op, "k_out", koa, (T, Hk, D), "k's [T, heads, head_dim]")
        if T:
            call.run(_lib.rope, call.buffer(qa), _buffer_or_null(call, ka), call.buffer(pa, dense=True),
                     _buffer_or_null(call, ffa, dense=True), call.buffer(oa), _buffer_or_null(call, koa),
                     ctypes.byref(p))
    return out if k is None else (out, k_out)


def repeat_heads(x, h, *, layout="tiled", out=None):
    """GQA head broadcast x [T, Hg, K] -> [T, h, K] by lmk_repeat_heads, a bit-exact copy of any element size.

    layout "tiled": head i reads x head i % Hg (GGUF / llama.cpp); "block": i // (h // Hg) (Hugging Face
    repeat_interleave / repeat_kv). out: an array of shape [T, h, K] to write; None allocates one like x. x
    and out may be strided views whose last axis has stride 1.
    """
    if _host is not None:
        r = _host.repeat_heads(x, h, layout, out)
        if r is not NotImplemented:
            return r
    op = "repeat_heads"
    lay = _choice(op, "layout", layout, _LAYOUTS)
    with Call(op, x, "x") as call:
        xa = call.read(x, "x", raw=True)
        T, Hg, K = _shape3(op, "x", xa)
        p = _lib.RepeatHeadsParams(_u32(op, "T", T), _u32(op, "Hg", Hg), _u32(op, "h", h), _u32(op, "K", K), lay)
        if out is None:
            out = _arrays.empty_like_shape(x, (T, p.h, K))
        oa = call.read(out, "out", raw=True, writable=True)
        _expect(op, "out", oa, (T, p.h, K), "[T, h, K] of x and h")
        if T:
            call.run(_lib.repeat_heads, call.buffer(xa), call.buffer(oa), ctypes.byref(p))
    return out


def _cache_rows(op, name, a, Hk, D):
    """A KV cache as rows [n_slots, Hk, D]: a paged [n_blocks, block_size, Hk, D] whose first two axes merge
    (block stride = block_size * row stride) is viewed as [n_blocks * block_size, Hk, D]. Its rows must be
    [Hk, D] (D None: v's head size is unknown without v, and lmk reports that)."""
    if len(a.shape) == 4:
        nb, bs, hk, d = a.shape
        sb, ss = a.strides[0], a.strides[1]
        if nb > 1 and bs > 1 and sb != bs * ss:
            raise LmkError("lmk.%s: %s [n_blocks, block_size, Hk, D] has strides %s: its blocks are not rows of "
                           "one stride, so it cannot be viewed as [n_slots, Hk, D]" % (op, name, a.strides))
        a.reshape_view((nb * bs, hk, d), (ss if bs > 1 else sb, a.strides[2], a.strides[3]))
    elif len(a.shape) != 3:
        raise LmkError("lmk.%s: %s must be [n_slots, Hk, D] or [n_blocks, block_size, Hk, D], got shape %s"
                       % (op, name, _fmt(a.shape)))
    want = (Hk, a.shape[2] if D is None else D)
    if tuple(a.shape[1:]) != want:
        raise LmkError("lmk.%s: %s rows must be [Hk, D] = [%d, %s] (k's heads and the head size), got shape %s"
                       % (op, name, Hk, "D" if D is None else D, _fmt(a.shape)))
    return a


def attn_prologue(q, k, positions, *, v=None, q_norm_w=None, k_norm_w=None, eps=1e-6, weight_offset=0.0,
                  slots=None, k_cache=None, v_cache=None, k_scale=1.0, v_scale=1.0, q_out=None, k_out=None,
                  **rope_kwargs):
    """One attention layer's prologue by lmk_attn_prologue: per-head RMS norm of q and k (weights q_norm_w /
    k_norm_w [D], scaled by weight + weight_offset; None skips that norm), rope (rope_kwargs as lmk.rope),
    then k (and v) stored into k_cache / v_cache rows `slots` (stored = x * (1 / scale) for f8 caches, 1 / scale formed once in f32).

    q [T, H, D], k [T, Hk, D], v [T, Hk, Dv]. Caches are [n_slots, Hk, D] (v_cache: Dv) or paged
    [n_blocks, block_size, Hk, D], strided views allowed. q_out None allocates one; k_out None allocates
    one unless k_cache is given (then k goes only to the cache and None is returned); pass k_out (or k
    itself, for in place) to get both. Returns (q_out, k_out or None).
    """
    op = "attn_prologue"
    require(op, _lib.attn_prologue)
    if _host is not None:
        r = _host.attn_prologue(q, k, positions, v, q_norm_w, k_norm_w, eps, weight_offset, slots, k_cache, v_cache,
                                k_scale, v_scale, q_out, k_out, rope_kwargs)
        if r is not NotImplemented:
            return r
    unknown = sorted(set(rope_kwargs) - set(ROPE_KWARGS))
    if unknown:
        raise LmkTypeError("lmk.attn_prologue: unexpected keyword argument(s) %s" % ", ".join(unknown))
    freq_factors = rope_kwargs.pop("freq_factors", None)
    if v is not None and v_cache is None:
        raise LmkError("lmk.attn_prologue: v needs v_cache")
    with Call(op, q, "q") as call:
        qa, ka = call.read(q, "q"), call.read(k, "k")
        T, H, D = _shape3(op, "q", qa)
        Hk = _shape3(op, "k", ka)[1]
        _expect(op, "k", ka, (T, Hk, D), "q's T and head_dim")
        va = _read_optional(call, v, "v")
        Dv = None
        if v is not None:
            Dv = _shape3(op, "v", va)[2]
            _expect(op, "v", va, (T, Hk, Dv), "k's T and heads")
        p = rope_params(op, T, H, D, Hk, **rope_kwargs)
        norm = _lib.RmsNormParams(_float(op, "eps", eps), _float(op, "weight_offset", weight_offset))
        scales = _float(op, "k_scale", k_scale), _float(op, "v_scale", v_scale)
        if q_out is None:
            q_out = _arrays.empty_like_shape(q, (T, H, D))
        if k_out is None and k_cache is None:
            k_out = _arrays.empty_like_shape(k, (T, Hk, D))
        weights = [_read_optional(call, w, n) for n, w in (("q_norm_w", q_norm_w), ("k_norm_w", k_norm_w))]
        pa, _keep = _positions(call, positions, p.mode, T)
        ffa = _read_optional(call, freq_factors, "freq_factors")
        sla = _read_optional(call, slots, "slots")
        qoa = call.read(q_out, "q_out", writable=True)
        _expect(op, "q_out", qoa, (T, H, D), "q's [T, heads, head_dim]")
        koa = _read_optional(call, k_out, "k_out", writable=True)
        if k_out is not None:
            _expect(op, "k_out", koa, (T, Hk, D), "k's [T, heads, head_dim]")
        caches = [None if c is None else _cache_rows(op, n, call.read(c, n, writable=True), Hk, d)
                  for n, c, d in (("k_cache", k_cache, D), ("v_cache", v_cache, Dv))]
        if not T:
            return q_out, k_out
        io = _lib.AttnPrologueIO()
        io.q_in, io.k_in, io.v_in = call.buffer(qa), call.buffer(ka), _buffer_or_null(call, va)
        io.q_norm_w, io.k_norm_w = [_buffer_or_null(call, w, dense=True) for w in weights]
        io.positions = call.buffer(pa, dense=True)
        io.freq_factors = _buffer_or_null(call, ffa, dense=True)
        io.slots = _buffer_or_null(call, sla, dense=True)
        io.q_out, io.k_out = call.buffer(qoa), _buffer_or_null(call, koa)
        io.k_cache, io.v_cache = [_buffer_or_null(call, c) for c in caches]
        io.k_scale, io.v_scale = scales
        call.run(_lib.attn_prologue, ctypes.byref(io), ctypes.byref(p), ctypes.byref(norm))
    return q_out, k_out


def _conv_weight(op, a, C):
    """The conv weight as [C, W]: Hugging Face's conv1d.weight [C, 1, W] is viewed without its middle axis.
    Returns W, which only the weight's shape gives."""
    if len(a.shape) == 3 and a.shape[1] == 1:
        a.reshape_view((a.shape[0], a.shape[2]), (a.strides[0], a.strides[2]))
    if len(a.shape) != 2 or a.shape[0] != C:
        raise LmkError("lmk.%s: weight must be [C, W] or Hugging Face's conv1d.weight [C, 1, W] with C = %d "
                       "(x's channels), got shape %s" % (op, C, _fmt(a.shape)))
    return a.shape[1]


def causal_conv1d(x, weight, *, bias=None, activation="silu", cu_seqlens=None, state=None, state_slots=None,
                  out=None):
    """The depthwise causal convolution of the Gated DeltaNet layer, with its state, by lmk_causal_conv1d
    (include/lmk.h "causal_conv1d" has the formula): out[t, c] = act(bias[c] + sum_j weight[c, j] *
    xx[t - (W-1) + j, c]), xx being each sequence's tokens after its W-1 state rows.

    x [T, C] f32 / bf16 / f16 (token stride free: a column slice of a wider projection works). weight
    [C, W] or Hugging Face's conv1d.weight [C, 1, W] (W 2..8); bias [C] or None. activation "silu" or
    "none" (None too). cu_seqlens: [n_seq + 1] int32/int64 offsets of the sequences packed along T, None
    for one sequence. state: the conv state pool [n_slots, W-1, C] of x's dtype, any strides, read and
    updated in place (None: zeros, nothing stored); Hugging Face's cache [B, C, W-1] is passed as the view
    `cache.transpose(1, 2)` (NumPy: `cache.transpose(0, 2, 1)`), so it is updated where it lies.
    state_slots: [n_seq] int32/int64 pool rows (None: sequence s uses row s; a negative or out-of-range slot
    starts from zeros and stores nothing). out: an array of x's shape to write (x itself for in place);
    None allocates one like x. Returns out.
    """
    op = "causal_conv1d"
    require(op, _lib.causal_conv1d)
    if _host is not None:
        r = _host.causal_conv1d(x, weight, bias, activation, cu_seqlens, state, state_slots, out)
        if r is not NotImplemented:
            return r
    act = _choice(op, "activation", "none" if activation is None else activation, _ACTIVATIONS)
    with Call(op, x, "x") as call:
        xa = call.read(x, "x")
        if len(xa.shape) != 2:
            raise LmkError("lmk.%s: x must be 2-D [T, C], got shape %s" % (op, _fmt(xa.shape)))
        T, C = xa.shape
        wa = call.read(weight, "weight")
        W = _conv_weight(op, wa, C)
        p = _lib.CausalConv1dParams(_u32(op, "T", T), _u32(op, "C", C), _u32(op, "W", W), act)
        ba = _read_optional(call, bias, "bias")
        cua = _read_optional(call, cu_seqlens, "cu_seqlens")
        sla = _read_optional(call, state_slots, "state_slots")
        sta = _read_optional(call, state, "state", writable=True)
        if state is not None and (len(sta.shape) != 3 or tuple(sta.shape[1:]) != (W - 1, C)):
            raise LmkError("lmk.%s: state must be [n_slots, W-1, C] = [n_slots, %d, %d], got shape %s (Hugging "
                           "Face's [B, C, W-1] conv cache is passed as cache.transpose(1, 2))"
                           % (op, W - 1, C, _fmt(sta.shape)))
        if out is None:
            out = _arrays.empty_like_shape(x, (T, C))
        oa = call.read(out, "out", writable=True)
        _expect(op, "out", oa, (T, C), "x's [T, C]")
        if T:
            call.run(_lib.causal_conv1d, call.buffer(xa), call.buffer(wa, dense=True),
                     _buffer_or_null(call, ba, dense=True), _buffer_or_null(call, cua, dense=True),
                     _buffer_or_null(call, sla, dense=True), _buffer_or_null(call, sta, pool=True),
                     call.buffer(oa), ctypes.byref(p))
    return out


def _gdn_params(op, T, Hk, Hv, dk, dv, heads, scale, l2norm, eps, weight_offset):
    """lmk_gdn_params from the keywords: scale None is lmk's 0 (1/sqrt(dk)); l2norm False sets
    LMK_GDN_NO_L2NORM."""
    p = _lib.GdnParams()
    p.seq_len, p.n_k_heads, p.n_v_heads = _u32(op, "T", T), _u32(op, "Hk", Hk), _u32(op, "Hv", Hv)
    p.k_dim, p.v_dim = _u32(op, "dk", dk), _u32(op, "dv", dv)
    p.head_map = _choice(op, "heads", heads, _LAYOUTS)
    p.scale = 0.0 if scale is None else _float(op, "scale", scale)
    p.flags = 0 if _bool(op, "l2norm", l2norm) else _lib.GDN_NO_L2NORM
    p.norm = _lib.RmsNormParams(_float(op, "eps", eps), _float(op, "weight_offset", weight_offset))
    return p


def gated_delta_rule(q, k, v, a, b, *, A_log=None, dt_bias=None, heads="block", scale=None, l2norm=True,
                     cu_seqlens=None, state=None, state_slots=None, z=None, norm_w=None, eps=1e-6,
                     weight_offset=0.0, out=None, workspace=None):
    """The Gated DeltaNet recurrence by lmk_gated_delta_rule: gates, the L2 norm of q and k, the delta rule
    over the [dk, dv] state of each value head, and the gated RMS norm of the output, in one call
    (include/lmk.h "gated_delta_rule" has the formulas).

    q, k [T, Hk, dk] and v [T, Hv, dv], f32 / bf16 / f16, one dtype: strided views, e.g. slices of the
    convolution's output. a, b [T, Hv]: in_proj_a / in_proj_b outputs, with A_log and dt_bias [Hv] (both
    or neither; without them a holds the log decay g and b holds beta). heads: "block" (Hugging Face, k head
    h // (Hv/Hk); the default) or "tiled" (GGUF, h % Hk). scale None: 1/sqrt(dk). l2norm False: q and k
    used as given. cu_seqlens / state_slots as lmk.causal_conv1d. state: the pool [n_slots, Hv, dk, dv],
    f32 or bf16, any strides (a dk-fastest pool is the view with its last two axes swapped), updated in
    place; None: zeros, nothing stored. z [T, Hv, dv] with norm_w [dv] (both or neither): out = rms_norm(o)
    * (norm_w + weight_offset) * silu(z), eps the norm's epsilon. out: an array [T, Hv, dv] of q's dtype to
    write; None allocates one. workspace: a uint8 array on q's device of at least gated_delta_rule_workspace's
    bytes, scratch for the chunked prefill (lmk.h "Workspace"); None: for torch tensors on a GPU, one is
    allocated per call from torch's caching allocator where the call would use one (prompts); elsewhere none.
    Returns out.
    """
    op = "gated_delta_rule"
    args = (q, k, v, a, b, A_log, dt_bias, heads, scale, l2norm, cu_seqlens, state, state_slots, z, norm_w, eps,
            weight_offset)
    if workspace is None and _arrays.kind_of(q) == "torch" and q.is_cuda and q.dim() == 3 and q.shape[0] >= 64:
        if out is None and v.dim() == 3:
            out = q.new_empty((q.shape[0], v.shape[1], v.shape[2]))
        workspace = _auto_workspace(args, out)
    if _host is not None:
        r = _host.gated_delta_rule(*args, out, workspace)
        if r is not NotImplemented:
            return r
    return _gdn_ctypes(args, out, workspace, query=False)


_WORKSPACE_BYTES = {}


def _auto_workspace(args, out):
    """A workspace from torch's caching allocator for a call on CUDA tensors, or None where the call uses none.
    The byte count comes from lmk_gated_delta_rule_workspace and is kept per shape, so a shape seen before
    costs no query."""
    if _lib.gated_delta_rule_workspace is None:
        return None
    q, v, cu, state = args[0], args[2], args[10], args[11]
    key = (tuple(q.shape), tuple(v.shape), q.dtype, None if cu is None else cu.numel(),
           None if state is None else state.dtype, bool(args[9]), q.device.index)
    n = _WORKSPACE_BYTES.get(key)
    if n is None:
        n = _gdn_ctypes(args, out, None, query=True)
        if len(_WORKSPACE_BYTES) >= 256:
            _WORKSPACE_BYTES.clear()
        _WORKSPACE_BYTES[key] = n
    if not n:
        return None
    import torch
    return q.new_empty((n,), dtype=torch.uint8)


def gated_delta_rule_workspace(q, k, v, a, b, *, A_log=None, dt_bias=None, heads="block", scale=None, l2norm=True,
                               cu_seqlens=None, state=None, state_slots=None, z=None, norm_w=None, eps=1e-6,
                               weight_offset=0.0, out=None):
    """The bytes of workspace lmk.gated_delta_rule would use for these arguments (lmk_gated_delta_rule_workspace,
    after the same checks): 0 where it uses none (the CPU, short prompts). The count depends only on T, the
    number of sequences, the heads and dims and the dtypes, and never shrinks as T or the sequences grow, so
    one workspace sized for the largest call serves every smaller one."""
    op = "gated_delta_rule_workspace"
    require(op, _lib.gated_delta_rule_workspace)
    args = (q, k, v, a, b, A_log, dt_bias, heads, scale, l2norm, cu_seqlens, state, state_slots, z, norm_w, eps,
            weight_offset)
    return _gdn_ctypes(args, out, None, query=True)


def _gdn_ctypes(args, out, workspace, query):
    """gated_delta_rule through ctypes: the call (returns out), or with query its workspace bytes."""
    (q, k, v, a, b, A_log, dt_bias, heads, scale, l2norm, cu_seqlens, state, state_slots, z, norm_w, eps,
     weight_offset) = args
    op = "gated_delta_rule_workspace" if query else "gated_delta_rule"
    with Call(op, q, "q") as call:
        qa, ka, va = call.read(q, "q"), call.read(k, "k"), call.read(v, "v")
        T, Hk, dk = _shape3(op, "q", qa)
        _expect(op, "k", ka, (T, Hk, dk), "q's [T, Hk, dk]")
        Hv, dv = _shape3(op, "v", va)[1:]
        _expect(op, "v", va, (T, Hv, dv), "q's T")
        p = _gdn_params(op, T, Hk, Hv, dk, dv, heads, scale, l2norm, eps, weight_offset)
        gates = [call.read(g, n) for n, g in (("a", a), ("b", b))]
        for n, g in zip("ab", gates):
            _expect(op, n, g, (T, Hv), "[T, Hv] of v")
        za = _read_optional(call, z, "z")
        if z is not None:
            _expect(op, "z", za, (T, Hv, dv), "v's [T, Hv, dv]")
        vectors = [_read_optional(call, o, n) for n, o in (("A_log", A_log), ("dt_bias", dt_bias),
                                                              ("norm_w", norm_w), ("cu_seqlens", cu_seqlens),
                                                              ("state_slots", state_slots))]
        sta = _read_optional(call, state, "state", writable=True)
        if state is not None and (len(sta.shape) != 4 or tuple(sta.shape[1:]) != (Hv, dk, dv)):
            raise LmkError("lmk.%s: state must be [n_slots, Hv, dk, dv] = [n_slots, %d, %d, %d], got shape %s (a "
                           "dk-fastest pool is passed as the view with its last two axes swapped)"
                           % (op, Hv, dk, dv, _fmt(sta.shape)))
        if out is None:
            out = _arrays.empty_like_shape(q, (T, Hv, dv))
        oa = call.read(out, "out", writable=True)
        _expect(op, "out", oa, (T, Hv, dv), "v's [T, Hv, dv]")
        wa = _read_optional(call, workspace, "workspace", writable=True)
        if not T:
            return 0 if query else out
        io = _lib.GdnIO()
        io.q, io.k, io.v = call.buffer(qa), call.buffer(ka), call.buffer(va)
        io.a, io.b = [call.buffer(g) for g in gates]
        io.A_log, io.dt_bias, io.norm_w, io.cu_seqlens, io.state_slots = [
            _buffer_or_null(call, o, dense=True) for o in vectors]
        io.state = _buffer_or_null(call, sta, pool=True)
        io.z = _buffer_or_null(call, za)
        io.out = call.buffer(oa)
        io.workspace = _buffer_or_null(call, wa, dense=True)
        if query:
            n = ctypes.c_size_t()
            call.run(_lib.gated_delta_rule_workspace, ctypes.byref(io), ctypes.byref(p), ctypes.byref(n))
            return n.value
        call.run(_lib.gated_delta_rule, ctypes.byref(io), ctypes.byref(p))
    return out


def has_attn_prologue():
    """True when the loaded liblmk has lmk_attn_prologue."""
    return _lib.attn_prologue is not None


def version():
    """liblmk's version, e.g. "0.3.0"."""
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


__all__ = ["rope", "repeat_heads", "attn_prologue", "causal_conv1d", "gated_delta_rule", "has_attn_prologue",
           "version", "build_info", "devices", "LmkError", "LmkTypeError", "check"]
