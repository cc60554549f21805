"""test_api_rules.py - the rules every entry point of the Python package keeps, whatever the op: outputs,
caches and state pools of the operation's logical shape (a dense array of the right element count but another
shape is an error naming it), one exception class (LmkError, a ValueError; type errors also TypeErrors),
calls on zero tokens that return empty results without reaching liblmk, strings rejected where numbers go,
sections required by the multi rope modes, a clear error from lmk.torch_ops without torch, and numpy declared
as a dependency (test_layout.py checks the ctypes structs against lmk.h)."""
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

np = pytest.importorskip("numpy")
import lmk  # noqa: E402
from lmk import _lib  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
HAS_GDN = _lib.causal_conv1d is not None and _lib.gated_delta_rule is not None
needs_gdn = pytest.mark.skipif(not HAS_GDN, reason="this liblmk has no lmk_causal_conv1d / lmk_gated_delta_rule")
needs_prologue = pytest.mark.skipif(not lmk.has_attn_prologue(), reason="this liblmk has no lmk_attn_prologue")


def f32(rng, *shape):
    return rng.uniform(-1, 1, size=shape).astype(np.float32)


def rejected(match, fn, *args, **kwargs):
    """fn(*args, **kwargs) raises an LmkError (a ValueError) whose message matches; returns it."""
    with pytest.raises(lmk.LmkError, match=match) as e:
        fn(*args, **kwargs)
    assert isinstance(e.value, ValueError) and e.value.status == "LMK_ERR_INVALID_ARGUMENT"
    return e.value


# ---- outputs and caches of the logical shape ----

def test_rope_out_of_another_shape_rejected(rng):
    q, pos = f32(rng, 4, 2, 8), np.arange(4, dtype=np.int32)
    out = np.full((8, 8), 5.0, np.float32)  # 64 elements, as q's [4, 2, 8]
    rejected(r"out must have shape \(4, 2, 8\)", lmk.rope, q, pos, out=out)
    assert np.all(out == 5.0)
    k = f32(rng, 4, 1, 8)
    rejected("k_out must have shape", lmk.rope, q, pos, k=k, k_out=np.zeros((4, 8), np.float32))
    rejected("k_out must have shape", lmk.rope, q, pos, k=k, k_out=np.zeros((4, 2, 4), np.float32))
    rejected("k must have shape", lmk.rope, q, pos, k=f32(rng, 8, 1, 4))       # T and head_dim of q
    rejected("out must have shape", lmk.rope, q, pos, out=np.zeros((4, 2, 8, 1), np.float32))


def test_repeat_heads_out_of_another_shape_rejected(rng):
    x = f32(rng, 3, 2, 8)
    rejected(r"out must have shape \(3, 4, 8\)", lmk.repeat_heads, x, 4, out=np.zeros((3, 32), np.float32))
    rejected("out must have shape", lmk.repeat_heads, x, 4, out=np.zeros((6, 2, 8), np.float32))


@needs_prologue
def test_attn_prologue_outputs_and_caches_of_another_shape_rejected(rng):
    T, H, Hk, D = 4, 2, 2, 8
    q, k, v = f32(rng, T, H, D), f32(rng, T, Hk, D), f32(rng, T, Hk, D)
    pos, slots = np.arange(T, dtype=np.int32), np.arange(T, dtype=np.int32)
    kc = np.zeros((16, 3, 8), np.float32)  # 384 elements = 24 rows of [Hk = 2, 8]
    rejected(r"k_cache rows must be \[Hk, D\] = \[2, 8\]", lmk.attn_prologue, q, k, pos, slots=slots, k_cache=kc)
    assert not kc.any()
    good = np.zeros((16, Hk, D), np.float32)
    rejected("v_cache rows", lmk.attn_prologue, q, k, pos, slots=slots, k_cache=good, v=v,
             v_cache=np.zeros((16, Hk, 2 * D), np.float32))
    rejected("v_cache rows", lmk.attn_prologue, q, k, pos, slots=slots, k_cache=good, v=v,
             v_cache=np.zeros((4, 4, Hk * 2, D // 2), np.float32))     # paged, rows of another shape
    rejected("q_out must have shape", lmk.attn_prologue, q, k, pos, q_out=np.zeros((T, H * D), np.float32))
    rejected("k_out must have shape", lmk.attn_prologue, q, k, pos, k_out=np.zeros((T * Hk, D), np.float32))
    rejected("k must have shape", lmk.attn_prologue, q, f32(rng, 2 * T, Hk, D // 2), pos, k_out=None)
    rejected("v must have shape", lmk.attn_prologue, q, k, pos, v=f32(rng, 2 * T, Hk, D // 2), slots=slots,
             k_cache=good, v_cache=np.zeros((16, Hk, D // 2), np.float32))
    assert not good.any()


@needs_gdn
def test_gdn_ops_outputs_and_states_of_another_shape_rejected(rng):
    T, C, W = 4, 6, 4
    x, w = f32(rng, T, C), f32(rng, C, W)
    rejected(r"out must have shape \(4, 6\)", lmk.causal_conv1d, x, w, out=np.zeros((C, T), np.float32))
    hf_cache = np.zeros((2, C, W - 1), np.float32)  # Hugging Face's layout, not transposed
    e = rejected("state must be", lmk.causal_conv1d, x, w, state=hf_cache)
    assert "transpose(1, 2)" in str(e)
    Hk, Hv, dk, dv = 1, 2, 4, 3
    q, k, v = f32(rng, T, Hk, dk), f32(rng, T, Hk, dk), f32(rng, T, Hv, dv)
    a, b = f32(rng, T, Hv), f32(rng, T, Hv)
    rejected(r"out must have shape \(4, 2, 3\)", lmk.gated_delta_rule, q, k, v, a, b,
             out=np.zeros((T, dv, Hv), np.float32))
    rejected("state must be", lmk.gated_delta_rule, q, k, v, a, b, state=np.zeros((1, Hv, dv, dk), np.float32))
    rejected("state must be", lmk.gated_delta_rule, q, k, v, a, b, state=np.zeros((Hv, dk, dv), np.float32))


# ---- one exception class ----

def test_one_exception_class(rng):
    assert issubclass(lmk.LmkError, ValueError)
    assert issubclass(lmk.LmkTypeError, lmk.LmkError) and issubclass(lmk.LmkTypeError, TypeError)
    q, pos = f32(rng, 3, 2, 8), np.arange(3, dtype=np.int32)
    failures = [
        lambda: lmk.rope(q, pos, mode="llama"),                 # a Python-side ValueError before
        lambda: lmk.rope(q.reshape(3, 16), pos),
        lambda: lmk.rope(q, pos.astype(np.float64)),            # liblmk's dtype check
        lambda: lmk.rope(q, pos, rope_dim=3),                   # liblmk's rule
        lambda: lmk.repeat_heads([[[1.0]]], 2),                 # a Python-side TypeError before
        lambda: lmk.repeat_heads(q, "4"),
        lambda: lmk.rope(q.astype(np.float64), pos),
        lambda: lmk.rope(q, pos, out=np.zeros((3, 2, 16), np.float32)[..., ::2]),
    ]
    for fail in failures:
        with pytest.raises(lmk.LmkError) as e:
            fail()
        assert str(e.value) == e.value.message and e.value.message.startswith(("lmk", "rope:"))
    with pytest.raises(TypeError):       # still a TypeError where it was one
        lmk.repeat_heads([[[1.0]]], 2)
    with pytest.raises(ValueError):      # and a ValueError for everything
        lmk.repeat_heads([[[1.0]]], 2)


def test_liblmk_failures_keep_status(rng):
    q, pos = f32(rng, 3, 2, 8), np.arange(3, dtype=np.int32)
    with pytest.raises(ValueError) as e:
        lmk.rope(q, pos, freq_base=-1.0)
    assert isinstance(e.value, lmk.LmkError) and e.value.status == "LMK_ERR_INVALID_ARGUMENT"
    assert e.value.message.startswith("rope:") and "freq_base" in e.value.message


# ---- zero tokens: empty results, nothing reaches liblmk ----

def test_rope_zero_tokens(rng):
    wide = f32(rng, 5, 2, 16)
    for q in (np.empty((0, 2, 8), np.float32), wide[:0, :, :8], wide[:0, :, ::2]):
        pos = np.empty(0, np.int32)
        out = lmk.rope(q, pos)
        assert isinstance(out, np.ndarray) and out.shape == (0, 2, 8) and out.dtype == np.float32
        qo, ko = lmk.rope(q, pos, k=wide[:0, :1, :8])
        assert qo.shape == (0, 2, 8) and ko.shape == (0, 1, 8)
        assert lmk.rope(q, pos, out=q) is q
        assert lmk.rope(q, np.empty((3, 0), np.int64), mode="imrope", sections=[2, 1, 1]).shape == (0, 2, 8)
    rejected("out must have shape", lmk.rope, np.empty((0, 2, 8), np.float32), np.empty(0, np.int32),
              out=np.empty((0, 16), np.float32))


def test_repeat_heads_zero_tokens(rng):
    x = f32(rng, 4, 2, 16)[:0, :, ::2]
    out = lmk.repeat_heads(x, 4, layout="block")
    assert out.shape == (0, 4, 8) and out.dtype == np.float32


@needs_prologue
def test_attn_prologue_zero_tokens(rng):
    q, k = np.empty((0, 4, 8), np.float32), f32(rng, 3, 2, 16)[:0, :, :8]
    kc = np.full((4, 2, 8), 3.0, np.float32)
    qo, ko = lmk.attn_prologue(q, k, np.empty(0, np.int32), slots=np.empty(0, np.int32), k_cache=kc)
    assert qo.shape == (0, 4, 8) and ko is None and np.all(kc == 3.0)
    qo, ko = lmk.attn_prologue(q, k, np.empty(0, np.int32), q_norm_w=np.ones(8, np.float32))
    assert qo.shape == (0, 4, 8) and ko.shape == (0, 2, 8)


@needs_gdn
def test_gdn_ops_zero_tokens(rng):
    C, W = 12, 4
    x = f32(rng, 3, 2 * C)[:0, :C]
    st = f32(rng, 2, W - 1, C)
    st0 = st.copy()
    y = lmk.causal_conv1d(x, f32(rng, C, W), state=st)
    assert y.shape == (0, C) and np.array_equal(st, st0)
    assert lmk.causal_conv1d(x, f32(rng, C, 1, W), out=x) is x
    Hk, Hv, dk, dv = 1, 2, 4, 4
    q, v = np.empty((0, Hk, dk), np.float32), np.empty((0, Hv, dv), np.float32)
    s = f32(rng, 1, Hv, dk, dv)
    s0 = s.copy()
    out = lmk.gated_delta_rule(q, q, v, np.empty((0, Hv), np.float32), np.empty((0, Hv), np.float32), state=s,
                               cu_seqlens=np.zeros(2, np.int32))
    assert out.shape == (0, Hv, dv) and np.array_equal(s, s0)


# ---- strings are not numbers; multi rope modes need sections ----

def test_strings_are_not_numbers(rng):
    q, pos = f32(rng, 3, 2, 8), np.arange(3, dtype=np.int32)
    for kw in (dict(freq_base="1e4"), dict(freq_scale="1"), dict(attn_factor=b"1"), dict(rope_dim="8"),
               dict(n_ctx_orig="4096"), dict(sections=["4", 0, 0], mode="mrope")):
        with pytest.raises(lmk.LmkTypeError, match=next(iter(kw))):
            lmk.rope(q, pos, **kw)
    assert lmk.rope(q, pos, freq_base=np.float32(1e4)).shape == q.shape  # NumPy scalars are numbers
    if lmk.has_attn_prologue():
        with pytest.raises(lmk.LmkTypeError, match="eps"):
            lmk.attn_prologue(q, q, pos, eps="1e-6")
        with pytest.raises(lmk.LmkTypeError, match="k_scale"):
            lmk.attn_prologue(q, q, pos, k_scale="2")


@pytest.mark.parametrize("mode", ["mrope", "imrope", "vision", 8, 40, 24])
def test_multi_modes_require_sections(rng, mode):
    q, pos = f32(rng, 3, 2, 8), np.zeros((4, 3), np.int32)
    rejected("needs sections", lmk.rope, q, pos, mode=mode)
    rejected("needs sections", lmk.rope, q, pos, mode=mode, sections=[0, 0, 0])
    assert lmk.rope(q, pos, mode=mode, sections=[2, 2]).shape == q.shape
    if lmk.has_attn_prologue():
        rejected("needs sections", lmk.attn_prologue, q, q, pos, mode=mode)


# ---- lmk.torch_ops without torch ----

def test_torch_ops_without_torch_says_so():
    """In a process where torch cannot be imported, `import lmk.torch_ops` names the missing piece."""
    code = textwrap.dedent("""
        import sys
        class NoTorch:
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ModuleNotFoundError("No module named %r" % name, name=name)
        sys.meta_path.insert(0, NoTorch())
        import lmk
        try:
            import lmk.torch_ops
        except ModuleNotFoundError as e:
            print("ERROR", e.name, e)
        else:
            print("IMPORTED")
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "python")] + sys.path))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ERROR torch ") and "lmk.torch_ops needs PyTorch" in r.stdout, r.stdout


# ---- packaging ----

def test_numpy_is_a_declared_dependency():
    text = (ROOT / "python" / "pyproject.toml").read_text()
    deps = re.search(r"^dependencies\s*=\s*\[(.*?)\]", text, re.M | re.S)
    assert deps and re.search(r"[\"']numpy\b", deps.group(1)), "pyproject.toml [project] dependencies lack numpy"
