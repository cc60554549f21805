"""test_host.py - the compiled host path (lmk._host, python/lmk/_host.c) against the ctypes path: every op on
NumPy arrays and torch tensors, dense and strided, gives the same bits and writes the same caches and states
either way, the compiled path takes the usual calls itself (its counters say so), and the calls it hands to the
Python path (spellings it does not know, errors) come out exactly as the Python path makes them.

tests/test_python.sh builds the module and names it in LMK_EXTENSION; LMK_EXPECT_COMPILED=1 (which it sets
when it built one) makes a missing compiled path a failure instead of a skip."""
import copy
import os

import numpy as np
import pytest

import lmk
from lmk import _compiled, _ops

pytestmark = pytest.mark.skipif(
    _compiled.host is None and os.environ.get("LMK_EXPECT_COMPILED") != "1",
    reason="no compiled host path (%s)" % _compiled.WHY_CTYPES)


def test_compiled_path_loaded():
    assert lmk.HOST_PATH == "compiled", _compiled.WHY_CTYPES


def _both(monkeypatch, fn, args, *, taken=True):
    """fn(*deep copies of args) on the compiled path, then on the ctypes path: (compiled, ctypes) results
    with the arguments after the call (outputs, caches and states written in place). taken: whether the
    compiled path must run the call itself rather than hand it over."""
    a1, a2 = copy.deepcopy(args), copy.deepcopy(args)
    t0, d0 = _compiled.host.stats()
    r1 = fn(a1)
    t1, d1 = _compiled.host.stats()
    assert (t1 - t0, d1 - d0) == ((1, 0) if taken else (0, 1))
    with monkeypatch.context() as m:
        m.setattr(_ops, "_host", None)
        r2 = fn(a2)
    assert _compiled.host.stats() == (t1, d1)
    return (r1, a1), (r2, a2)


def _same(x, y):
    if isinstance(x, (tuple, list)):
        assert type(x) is type(y) and len(x) == len(y)
        for a, b in zip(x, y):
            _same(a, b)
    elif isinstance(x, dict):
        assert x.keys() == y.keys()
        for k in x:
            _same(x[k], y[k])
    elif x is None or isinstance(x, (str, int, float)):
        assert x == y
    else:
        assert type(x) is type(y)
        xa, ya = np.asarray(x), np.asarray(y)
        assert xa.shape == ya.shape and xa.dtype == ya.dtype
        assert xa.tobytes() == ya.tobytes()


def _check(monkeypatch, fn, args, **kw):
    (r1, a1), (r2, a2) = _both(monkeypatch, fn, args, **kw)
    _same(r1, r2)
    _same(a1, a2)


def _f32(rng, *shape):
    return rng.uniform(-1, 1, shape).astype(np.float32)


def test_rope_numpy(monkeypatch, rng):
    T, H, Hk, D = 5, 4, 2, 16
    qg = _f32(rng, T, H, 2 * D)  # q read out of [q | gate]: a strided view
    args = {"qg": qg, "k": _f32(rng, T, Hk, D), "pos": np.arange(T, dtype=np.int32) + 7,
            "out": np.zeros((T, H, D), np.float32)}
    _check(monkeypatch, lambda a: lmk.rope(a["qg"][:, :, :D], a["pos"], k=a["k"], out=a["out"], freq_base=1e4,
                                           rope_dim=8, pairing="half_head"), args)
    _check(monkeypatch, lambda a: lmk.rope(a["k"], a["pos"].astype(np.int64), mode=2), args)
    _check(monkeypatch, lambda a: lmk.rope(a["k"], a["pos"], out=a["k"], mode="normal",
                                           freq_factors=np.linspace(1, 2, D // 2, dtype=np.float32)), args)


def test_rope_multi_positions(monkeypatch, rng):
    T, H, D = 6, 2, 16
    args = {"q": _f32(rng, T, H, D), "pos3": rng.integers(0, 50, (3, T)).astype(np.int64),
            "pos4": rng.integers(0, 50, (4, T)).astype(np.int32)}
    for mode in ("mrope", "imrope", "vision"):
        _check(monkeypatch, lambda a: lmk.rope(a["q"], a["pos3"], mode=mode, sections=[2, 3, 3]), args)
        _check(monkeypatch, lambda a: lmk.rope(a["q"], a["pos4"], mode=mode, sections=(4, 2, 1, 1)), args)


def test_repeat_heads_raw_dtypes(monkeypatch, rng):
    for dtype in (np.float32, np.float64, np.float16, np.int8, np.bool_, np.uint16, np.int64):
        x = rng.uniform(-9, 9, (3, 2, 8)).astype(dtype)
        for layout in ("tiled", "block", 0, 1):
            _check(monkeypatch, lambda a: lmk.repeat_heads(a["x"], 6, layout=layout), {"x": x})
    big = _f32(rng, 3, 2, 16)
    _check(monkeypatch, lambda a: lmk.repeat_heads(a["x"][:, :, :8], 4, out=a["o"][:, :, 4:12]),
           {"x": big, "o": np.zeros((3, 4, 16), np.float32)})


@pytest.mark.skipif(not lmk.has_attn_prologue(), reason="this liblmk has no lmk_attn_prologue")
def test_attn_prologue_caches(monkeypatch, rng):
    T, H, Hk, D, Dv, nb, bs = 4, 4, 2, 16, 8, 3, 4
    args = {"q": _f32(rng, T, H, D), "k": _f32(rng, T, Hk, D), "v": _f32(rng, T, Hk, Dv),
            "qn": _f32(rng, D), "kn": _f32(rng, D), "pos": np.arange(T, dtype=np.int32),
            "slots": np.array([5, 0, 11, 2], np.int64), "kc": np.zeros((nb, bs, Hk, D), np.float32),
            "vc": np.zeros((nb * bs, Hk, Dv), np.float32)}

    def call(a, **kw):
        return lmk.attn_prologue(a["q"], a["k"], a["pos"], v=a["v"], q_norm_w=a["qn"], k_norm_w=a["kn"],
                                 eps=1e-5, weight_offset=1.0, slots=a["slots"], k_cache=a["kc"], v_cache=a["vc"],
                                 mode="neox", rope_dim=8, freq_base=1e6, **kw)
    _check(monkeypatch, call, args)
    _check(monkeypatch, lambda a: call(a, k_out=a["k"], q_out=a["q"]), args)


def _conv_args(rng, T=7, C=12, W=4, slots=3):
    return {"x": _f32(rng, T, C), "w": _f32(rng, C, 1, W), "b": _f32(rng, C),
            "cache": _f32(rng, slots, C, W - 1), "cu": np.array([0, 3, 7], np.int32),
            "sl": np.array([2, 0], np.int64)}


@pytest.mark.skipif(_ops._lib.causal_conv1d is None, reason="this liblmk has no lmk_causal_conv1d")
def test_causal_conv1d(monkeypatch, rng):
    args = _conv_args(rng)
    _check(monkeypatch, lambda a: lmk.causal_conv1d(a["x"], a["w"], bias=a["b"], cu_seqlens=a["cu"],
                                                    state=a["cache"].transpose(0, 2, 1), state_slots=a["sl"]), args)
    _check(monkeypatch, lambda a: lmk.causal_conv1d(a["x"], a["w"][:, 0, :], activation=None,
                                                    state=a["cache"][:1].transpose(0, 2, 1), out=a["x"]), args)


def _gdn_args(rng, T=6, Hk=2, Hv=4, dk=8, dv=8, slots=3):
    return {"qkv": _f32(rng, T, 2 * Hk * dk + Hv * dv), "a": _f32(rng, T, Hv), "b": _f32(rng, T, Hv),
            "A_log": _f32(rng, Hv), "dt": _f32(rng, Hv), "z": _f32(rng, T, Hv, dv), "nw": _f32(rng, dv),
            "state": _f32(rng, slots, Hv, dk, dv) / 4, "cu": np.array([0, 2, 6], np.int64),
            "sl": np.array([1, -1], np.int32), "dims": (Hk, Hv, dk, dv)}


def _gdn_views(a):
    Hk, Hv, dk, dv = a["dims"]
    T = a["qkv"].shape[0]
    qkv = a["qkv"]
    q = qkv[:, :Hk * dk].reshape(T, Hk, dk)
    k = qkv[:, Hk * dk:2 * Hk * dk].reshape(T, Hk, dk)
    v = qkv[:, 2 * Hk * dk:].reshape(T, Hv, dv)
    return q, k, v


@pytest.mark.skipif(_ops._lib.gated_delta_rule is None, reason="this liblmk has no lmk_gated_delta_rule")
def test_gated_delta_rule(monkeypatch, rng):
    args = _gdn_args(rng)

    def full(a):
        q, k, v = _gdn_views(a)
        return lmk.gated_delta_rule(q, k, v, a["a"], a["b"], A_log=a["A_log"], dt_bias=a["dt"], state=a["state"],
                                    cu_seqlens=a["cu"], state_slots=a["sl"], z=a["z"], norm_w=a["nw"], eps=1e-5,
                                    weight_offset=1.0)

    def plain(a):
        q, k, v = _gdn_views(a)
        return lmk.gated_delta_rule(q, k, v, a["a"], a["b"], heads="tiled", scale=0.25, l2norm=False,
                                    state=a["state"].transpose(0, 1, 3, 2))
    _check(monkeypatch, full, args)
    _check(monkeypatch, plain, args)


def test_handed_over_calls_match(monkeypatch, rng):
    """Spellings only the Python path reads run there, with the same result; errors are the Python path's."""
    q, pos = _f32(rng, 3, 2, 8), np.arange(3, dtype=np.int32)
    _check(monkeypatch, lambda a: lmk.rope(a["q"], a["pos"], mode=" NeoX "), {"q": q, "pos": pos}, taken=False)
    _check(monkeypatch, lambda a: lmk.repeat_heads(a["q"], np.int64(4)), {"q": q}, taken=True)
    _check(monkeypatch, lambda a: lmk.rope(a["q"][:0], a["pos"][:0]), {"q": q, "pos": pos}, taken=False)
    errors = []
    for use_host in (True, False):
        with monkeypatch.context() as m:
            if not use_host:
                m.setattr(_ops, "_host", None)
            out = np.zeros((3, 16), np.float32)  # the right element count, the wrong shape
            with pytest.raises(lmk.LmkError) as e1:
                lmk.rope(q, pos, out=out)
            assert not out.any()
            with pytest.raises(lmk.LmkTypeError) as e2:
                lmk.rope(q, pos, freq_base="1e4")
            with pytest.raises(lmk.LmkError) as e3:  # liblmk's own check: an odd rope_dim
                lmk.rope(q, pos, rope_dim=5)
            errors.append([(type(e.value), e.value.status, e.value.message) for e in (e1, e2, e3)])
    assert errors[0] == errors[1]


def test_library_error_raised_once(rng):
    """A status from the op is raised by the compiled path itself, without running the call twice."""
    q, pos = _f32(rng, 3, 2, 8), np.arange(3, dtype=np.int32)
    t0, d0 = _compiled.host.stats()
    with pytest.raises(lmk.LmkError) as e:
        lmk.rope(q, pos, rope_dim=5)
    assert e.value.status == "LMK_ERR_INVALID_ARGUMENT" and "rope_dim" in e.value.message
    assert _compiled.host.stats() == (t0, d0)


def test_read_only_output_handed_over(rng):
    q, pos = _f32(rng, 3, 2, 8), np.arange(3, dtype=np.int32)
    out = np.zeros_like(q)
    out.flags.writeable = False
    with pytest.raises(lmk.LmkError, match="read-only"):
        lmk.rope(q, pos, out=out)


def test_torch_tensors(monkeypatch):
    torch = pytest.importorskip("torch")
    import lmk.torch_ops  # noqa: F401 - registers torch with the compiled path
    g = torch.Generator().manual_seed(0)
    T, H, Hk, D = 5, 4, 2, 16
    args = {"qg": torch.rand(T, H, 2 * D, generator=g), "k": torch.rand(T, Hk, D, generator=g),
            "pos": torch.arange(T, dtype=torch.int64), "kb": torch.rand(T, Hk, D, generator=g).bfloat16()}

    def _np(x):
        if isinstance(x, torch.Tensor):
            return x.view(torch.int16).numpy() if x.dtype == torch.bfloat16 else x.numpy()
        return x
    for fn in (lambda a: lmk.rope(a["qg"][:, :, :D], a["pos"], k=a["k"]),
               lambda a: lmk.repeat_heads(a["kb"], 4, layout="block"),
               lambda a: lmk.repeat_heads(torch.nn.Parameter(a["k"], requires_grad=False), 4)):
        (r1, a1), (r2, a2) = _both(monkeypatch, fn, args)
        r1, r2 = (r1, r2) if isinstance(r1, tuple) else ((r1,), (r2,))
        for x, y in zip(r1 + tuple(a1.values()), r2 + tuple(a2.values())):
            _same(_np(x), _np(y))
    out = torch.empty(T, Hk, D)
    t0 = _compiled.host.stats()[0]
    torch.ops.lmk.rope(args["k"], args["pos"], out)
    assert _compiled.host.stats()[0] == t0 + 1
