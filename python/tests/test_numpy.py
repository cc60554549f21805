"""test_numpy.py - lmk's Python package on NumPy arrays (CPU): rope in every mode against the float64 reference
of ref.py, repeat_heads bit-exact in both layouts, strided views used in place without copies, out= and in
place, Hugging Face (3, T) positions, errors (LmkError with lmk's message, arrays left unchanged), threads,
and the library facts (version, build_info, devices)."""
import re
import threading

import pytest

np = pytest.importorskip("numpy")
import lmk  # noqa: E402
from ref import MODES, repeat_ref, rope_ref, rope_tolerance, rotated_mask  # noqa: E402

# (name, head_dim, heads, k heads, rope kwargs): real model shapes and every mode and scaling of lmk.h.
ROPE_CASES = [
    ("gptj_normal", 256, 4, 1, dict(mode="normal", rope_dim=64, freq_base=10000.0)),
    ("llama3_neox", 128, 4, 2, dict(mode="neox", freq_base=500000.0)),
    ("neox_partial", 64, 3, 1, dict(mode="neox", rope_dim=32)),
    ("neox_half_head", 64, 3, 1, dict(mode="neox", rope_dim=32, pairing="half_head")),
    ("qwen2vl_mrope", 128, 4, 2, dict(mode="mrope", sections=[16, 24, 24], freq_base=1e6)),
    ("mrope_half_head", 32, 2, 1, dict(mode="mrope", sections=[2, 1, 1], rope_dim=16, pairing="half_head")),
    ("qwen35_imrope", 256, 6, 2, dict(mode="imrope", sections=[11, 11, 10], rope_dim=64, freq_base=1e7)),
    ("qwen2vl_vision", 80, 4, 4, dict(mode="vision", sections=[20, 20])),
    ("yarn", 128, 4, 2, dict(mode="neox", freq_scale=0.25, ext_factor=1.0, n_ctx_orig=4096, freq_base=1e6)),
    ("linear_attn_factor", 64, 2, 1, dict(mode="neox", freq_scale=0.5, attn_factor=1.25)),
    ("normal_yarn_beta", 64, 2, 1, dict(mode="normal", freq_scale=0.125, ext_factor=0.5, n_ctx_orig=2048,
                                         beta_fast=16.0, beta_slow=2.0)),
]
MULTI = ("mrope", "imrope", "vision")


def positions_for(rng, mode, T, dtype=np.int32):
    if mode in MULTI:
        return rng.integers(0, 1 << 15, size=(4, T)).astype(dtype)
    return rng.integers(0, 1 << 17, size=T).astype(dtype)


def freq_factors_for(kw, D, rng):
    kw = dict(kw)
    if kw.pop("freq_factors", None) == "random":
        kw["freq_factors"] = rng.uniform(1.0, 8.0, size=kw.get("rope_dim", D) // 2).astype(np.float32)
    return kw


def assert_rope(out, x, pos, kw):
    """Rotated elements within lmk.h's tolerance of the float64 reference; the rest bit-identical to x."""
    T, H, D = x.shape
    ref, m = rope_ref(x, pos, **kw)
    rot = rotated_mask(kw.get("mode", "neox"), kw.get("pairing", "half_rope"), kw.get("rope_dim") or D, D)
    tol = rope_tolerance(ref, out.dtype.name, m)
    err = np.abs(out.astype(np.float64) - ref)
    bad = (err > tol)[..., rot]
    assert not bad.any(), "max error %g, tolerance %s" % (err[..., rot].max(), np.max(tol))
    assert same_bits(out[..., ~rot], x[..., ~rot])


def same_bits(a, b):
    """Equal shapes and bit patterns (tobytes copies views in logical order)."""
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def inputs(rng, shape, dtype):
    return rng.uniform(-2.0, 2.0, size=shape).astype(dtype)


# ---- library facts ----

def test_version_build_info_devices():
    assert re.fullmatch(r"\d+\.\d+\.\d+", lmk.version())
    assert lmk.__version__ == lmk.version()
    info = lmk.build_info()
    assert "cuda=" in info and "simd=" in info
    devs = lmk.devices()
    assert devs[0]["backend"] == "cpu" and devs[0]["ordinal"] == 0 and devs[0]["name"].startswith("cpu")
    cuda = [d for d in devs if d["backend"] == "cuda"]
    assert [d["ordinal"] for d in cuda] == list(range(len(cuda)))
    if "cuda=no" in info:
        assert not cuda


# ---- rope ----

@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("name,D,H,Hk,kw", ROPE_CASES, ids=[c[0] for c in ROPE_CASES])
def test_rope_modes_vs_reference(rng, name, D, H, Hk, kw, dtype):
    T = 7
    q, k = inputs(rng, (T, H, D), dtype), inputs(rng, (T, Hk, D), dtype)
    q0, k0 = q.copy(), k.copy()
    pos = positions_for(rng, kw["mode"], T)
    q_only = lmk.rope(q, pos, **kw)
    assert isinstance(q_only, np.ndarray) and q_only.shape == q.shape and q_only.dtype == q.dtype
    assert_rope(q_only, q, pos, kw)
    qo, ko = lmk.rope(q, pos, k=k, **kw)
    assert_rope(ko, k, pos, kw)
    assert same_bits(qo, q_only)  # q and k in one call = q alone
    assert same_bits(q, q0) and same_bits(k, k0)


def test_rope_freq_factors(rng):
    T, H, D = 5, 3, 128
    ff = rng.uniform(1.0, 8.0, size=D // 2).astype(np.float32)
    q, pos = inputs(rng, (T, H, D), np.float32), positions_for(rng, "neox", T)
    kw = dict(mode="neox", freq_base=500000.0, freq_factors=ff)
    assert_rope(lmk.rope(q, pos, **kw), q, pos, kw)


@pytest.mark.parametrize("mode", ["normal", 0, "NEOX", 2, "mrope", 8, "imrope", 40, "vision", 24])
def test_rope_mode_names_and_numbers(rng, mode):
    T, H, D = 3, 2, 16
    q = inputs(rng, (T, H, D), np.float32)
    name = {v: k for k, v in MODES.items()}[mode] if isinstance(mode, int) else mode.lower()
    pos = positions_for(rng, name, T)
    kw = dict(mode=mode, sections=[4, 2, 2]) if name in MULTI else dict(mode=mode)
    assert_rope(lmk.rope(q, pos, **kw), q, pos, dict(kw, mode=name))


@pytest.mark.parametrize("pos_dtype", [np.int32, np.uint32, np.int64])
def test_rope_position_dtypes(rng, pos_dtype):
    T, H, D = 6, 2, 32
    q = inputs(rng, (T, H, D), np.float32)
    pos = positions_for(rng, "imrope", T, np.int32)
    kw = dict(mode="imrope", sections=[3, 3, 2])
    want = lmk.rope(q, pos, **kw)
    assert np.array_equal(lmk.rope(q, pos.astype(pos_dtype), **kw), want)
    assert np.array_equal(lmk.rope(q, pos.reshape(-1).astype(pos_dtype), **kw), want)  # flat 4*T


@pytest.mark.parametrize("mode", ["mrope", "imrope", "vision"])
def test_rope_hf_three_row_positions(rng, mode):
    """Hugging Face's (3, T) t, h, w positions = (4, T) with the fourth axis (e) reading t."""
    T, H, D = 9, 2, 40
    q = inputs(rng, (T, H, D), np.float32)
    pos3 = rng.integers(0, 5000, size=(3, T)).astype(np.int32)
    pos4 = np.concatenate([pos3, pos3[:1]])
    kw = dict(mode=mode, sections=[8, 6, 6] if mode != "vision" else [10, 10])
    want = lmk.rope(q, pos4, **kw)
    got = lmk.rope(q, pos3, **kw)
    assert np.array_equal(got, want)
    assert_rope(got, q, pos4, kw)


def test_rope_out_and_in_place(rng):
    T, H, Hk, D = 5, 4, 2, 64
    kw = dict(mode="imrope", sections=[11, 11, 10], freq_base=1e7, rope_dim=64)
    q, k = inputs(rng, (T, H, D), np.float32), inputs(rng, (T, Hk, D), np.float32)
    pos = positions_for(rng, "imrope", T)
    want_q, want_k = lmk.rope(q, pos, k=k, **kw)
    out, k_out = np.full_like(q, np.nan), np.full_like(k, np.nan)
    got = lmk.rope(q, pos, k=k, out=out, k_out=k_out, **kw)
    assert got[0] is out and got[1] is k_out
    assert np.array_equal(out, want_q) and np.array_equal(k_out, want_k)
    res = lmk.rope(q, pos, k=k, out=q, k_out=k, **kw)  # in place
    assert res[0] is q and res[1] is k
    assert np.array_equal(q, want_q) and np.array_equal(k, want_k)


def test_rope_strided_q_gate_in_place(rng):
    """q of a [q | gate] projection: a [T, H, D] view with strides (2HD, 2D, 1) rotated inside its parent."""
    T, H, D = 6, 4, 64
    qg = inputs(rng, (T, H, 2 * D), np.float32)
    q0, gate0 = qg[..., :D].copy(), qg[..., D:].copy()
    q = qg[..., :D]
    assert q.strides == (2 * H * D * 4, 2 * D * 4, 4)
    pos = positions_for(rng, "neox", T)
    res = lmk.rope(q, pos, out=q)
    assert res is q and np.shares_memory(res, qg)
    assert same_bits(qg[..., D:], gate0)  # gate untouched
    assert_rope(qg[..., :D], q0, pos, dict(mode="neox"))


def test_rope_strided_out_of_place_and_packed_qkv(rng):
    T, H, Hk, D = 5, 4, 2, 32
    kw = dict(mode="mrope", sections=[4, 6, 6])
    pos = positions_for(rng, "mrope", T)
    qkv = inputs(rng, (T, (H + 2 * Hk) * D), np.float32)
    orig = qkv.copy()
    q = qkv[:, :H * D].reshape(T, H, D)
    k = qkv[:, H * D:(H + Hk) * D].reshape(T, Hk, D)
    assert np.shares_memory(q, qkv) and np.shares_memory(k, qkv)
    # out of place, from views of the packed buffer into views of another parent
    dst = np.full((T, H + Hk, 2 * D), 7.0, dtype=np.float32)
    qo, ko = lmk.rope(q, pos, k=k, out=dst[:, :H, D:], k_out=dst[:, H:, :D], **kw)
    assert np.shares_memory(qo, dst) and np.shares_memory(ko, dst)
    assert np.array_equal(qkv, orig)
    assert np.all(dst[:, :H, :D] == 7.0) and np.all(dst[:, H:, D:] == 7.0)
    assert_rope(dst[:, :H, D:], orig[:, :H * D].reshape(T, H, D), pos, kw)
    assert_rope(dst[:, H:, :D], orig[:, H * D:(H + Hk) * D].reshape(T, Hk, D), pos, kw)
    # in place, q and k inside the one packed buffer; v untouched
    lmk.rope(q, pos, k=k, out=q, k_out=k, **kw)
    assert np.array_equal(q, dst[:, :H, D:]) and np.array_equal(k, dst[:, H:, :D])
    assert np.array_equal(qkv[:, (H + Hk) * D:], orig[:, (H + Hk) * D:])


def test_rope_read_only_input(rng):
    T, H, D = 3, 2, 16
    q, pos = inputs(rng, (T, H, D), np.float32), positions_for(rng, "neox", T)
    want = lmk.rope(q, pos)
    q.setflags(write=False)
    assert np.array_equal(lmk.rope(q, pos), want)
    with pytest.raises(ValueError, match="out"):
        lmk.rope(want.copy(), pos, out=q)


# ---- repeat_heads ----

def random_bits(rng, shape, dtype):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    raw = rng.integers(0, 256, size=tuple(shape) + (dtype.itemsize,), dtype=np.uint8)
    return raw.view(dtype).reshape(shape)  # every bit pattern, NaN payloads included


@pytest.mark.parametrize("layout", ["tiled", "block"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.uint8, np.int8, np.bool_, np.int16, np.int64,
                                   np.float64])
@pytest.mark.parametrize("T,Hg,h,K", [(5, 2, 6, 16), (7, 4, 24, 256), (1, 1, 8, 64), (3, 16, 48, 8)])
def test_repeat_heads_bit_exact(rng, layout, dtype, T, Hg, h, K):
    x = random_bits(rng, (T, Hg, K), dtype)
    x0 = x.copy()
    out = lmk.repeat_heads(x, h, layout=layout)
    assert isinstance(out, np.ndarray) and out.dtype == x.dtype
    assert same_bits(out, repeat_ref(x, h, layout))
    assert same_bits(x, x0)


@pytest.mark.parametrize("layout", ["tiled", "block"])
def test_repeat_heads_strided_and_out(rng, layout):
    T, H, Hk, K = 4, 8, 2, 32
    qkv = random_bits(rng, (T, (H + 2 * Hk) * K), np.float32)
    orig = qkv.copy()
    v = qkv[:, (H + Hk) * K:].reshape(T, Hk, K)
    dst = np.zeros((T, H, 2 * K), dtype=np.float32)
    res = lmk.repeat_heads(v, H, layout=layout, out=dst[..., K:])
    assert np.shares_memory(res, dst)
    assert same_bits(dst[..., K:], repeat_ref(v, H, layout))
    assert not dst[..., :K].any() and same_bits(qkv, orig)


def test_repeat_heads_layout_numbers(rng):
    x = random_bits(rng, (2, 2, 4), np.float32)
    assert same_bits(lmk.repeat_heads(x, 4, layout=1), repeat_ref(x, 4, "block"))
    assert same_bits(lmk.repeat_heads(x, 4, layout=0), repeat_ref(x, 4, "tiled"))


# ---- errors: LmkError carries lmk's message; nothing is written ----

def lmk_error(fn, *args, **kwargs):
    with pytest.raises(lmk.LmkError) as e:
        fn(*args, **kwargs)
    assert e.value.status == "LMK_ERR_INVALID_ARGUMENT" and str(e.value) == e.value.message
    return e.value.message


@pytest.mark.parametrize("kw,needle", [
    (dict(rope_dim=3), "rope_dim"),
    (dict(rope_dim=40), "rope_dim"),
    (dict(freq_base=-1.0), "freq_base"),
    (dict(mode="vision", rope_dim=16, sections=[4, 4]), "VISION"),
    (dict(ext_factor=1.0), "n_ctx_orig"),
    (dict(freq_scale=-1.0), "freq_scale"),
    (dict(mode="normal", pairing="half_head"), "HALF_HEAD"),
    (dict(freq_factors="short"), "freq_factors"),
])
def test_rope_errors_leave_arrays_unchanged(rng, kw, needle):
    T, H, D = 4, 2, 32
    q, pos = inputs(rng, (T, H, D), np.float32), positions_for(rng, kw.get("mode", "neox"), T)
    if kw.get("freq_factors") == "short":
        kw = dict(kw, freq_factors=np.ones(3, np.float32))
    out = np.full_like(q, 3.0)
    q0 = q.copy()
    msg = lmk_error(lmk.rope, q, pos, out=out, **kw)
    assert needle in msg and msg.startswith("rope:")
    assert np.all(out == 3.0) and np.array_equal(q, q0)


def test_rope_errors_from_operands(rng):
    T, H, D = 4, 2, 32
    q = inputs(rng, (T, H, D), np.float32)
    pos = positions_for(rng, "neox", T)
    assert "positions" in lmk_error(lmk.rope, q, pos[:-1])
    assert "positions" in lmk_error(lmk.rope, q, pos, mode="mrope", sections=[4, 6, 6])  # multi modes need 4*T
    out16 = np.zeros((T, H, D), np.float16)
    assert "dtype" in lmk_error(lmk.rope, q, pos, out=out16)
    assert not out16.any()
    # an output that partially overlaps the input (one element apart) is rejected, nothing written
    parent = inputs(rng, T * H * D + 1, np.float32)
    before = parent.copy()
    lmk_error(lmk.rope, parent[:-1].reshape(T, H, D), pos, out=parent[1:].reshape(T, H, D))
    assert np.array_equal(parent, before)
    k = inputs(rng, (T, 1, D), np.float16)
    assert "dtype" in lmk_error(lmk.rope, q, pos, k=k)


def test_repeat_heads_errors(rng):
    x = inputs(rng, (3, 2, 8), np.float32)
    out = np.full((3, 5, 8), 9.0, np.float32)
    assert "multiple" in lmk_error(lmk.repeat_heads, x, 5, out=out)
    assert np.all(out == 9.0)
    x0 = x.copy()
    lmk_error(lmk.repeat_heads, x, 2, out=x)  # out overlaps x
    assert np.array_equal(x, x0)
    assert "dtype" in lmk_error(lmk.repeat_heads, x, 4, out=np.zeros((3, 4, 8), np.float16))


def test_python_side_argument_errors(rng):
    T, H, D = 4, 2, 32
    q, pos = inputs(rng, (T, H, D), np.float32), positions_for(rng, "neox", T)
    with pytest.raises(ValueError, match="mode"):
        lmk.rope(q, pos, mode="llama")
    with pytest.raises(ValueError, match="mode"):
        lmk.rope(q, pos, mode=3)
    with pytest.raises(ValueError, match="pairing"):
        lmk.rope(q, pos, pairing="interleaved")
    with pytest.raises(ValueError, match="sections"):
        lmk.rope(q, pos, mode="mrope", sections=[1, 2, 3, 4, 5])
    with pytest.raises(ValueError, match="q must be 3-D"):
        lmk.rope(q.reshape(T, H * D), pos)
    with pytest.raises(ValueError, match="k_out"):
        lmk.rope(q, pos, k_out=q)
    with pytest.raises(TypeError, match="positions"):
        lmk.rope(q, pos.astype(np.float64))
    with pytest.raises(TypeError, match="q"):
        lmk.rope(q.astype(np.float64), pos)
    with pytest.raises(TypeError, match="x"):
        lmk.repeat_heads([[[1.0]]], 2)
    with pytest.raises(ValueError, match="layout"):
        lmk.repeat_heads(q, 4, layout="interleave")
    wide = inputs(rng, (T, H, 2 * D), np.float32)
    with pytest.raises(ValueError, match="q must have stride 1 on its last axis"):
        lmk.rope(wide[..., ::2], pos)
    with pytest.raises(ValueError, match="out must have stride 1"):
        lmk.rope(q, pos, out=wide[..., ::2])
    with pytest.raises(ValueError, match="negative stride"):
        lmk.rope(q[::-1], pos)
    with pytest.raises(ValueError, match="positions must be contiguous"):
        lmk.rope(q, np.stack([pos, pos], axis=1)[:, 0])
    assert np.all(wide == wide)  # nothing NaN-poisoned by a rejected call


# ---- threads: one CPU stream, used by one thread at a time ----

def test_concurrent_calls_from_threads(rng):
    T, H, D = 16, 4, 128
    qs = [inputs(rng, (T, H, D), np.float32) for _ in range(4)]
    pos = positions_for(rng, "neox", T)
    want = [lmk.rope(q, pos, freq_base=1e6) for q in qs]
    errors, results = [], [None] * 4

    def work(i):
        try:
            for _ in range(25):
                results[i] = lmk.rope(qs[i], pos, freq_base=1e6)
                assert np.array_equal(results[i], want[i])
        except BaseException as e:  # reported below: pytest does not see other threads' failures
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_forked_child_runs_ops(rng):
    """A child forked while another thread is inside an op (holding the CPU stream's lock, which the child
    inherits held) forgets the parent's handles and runs ops on its own."""
    import os
    import time
    from lmk import _runtime
    T, H, D = 8, 2, 64
    q, pos = inputs(rng, (T, H, D), np.float32), positions_for(rng, "neox", T)
    want = lmk.rope(q, pos)
    _, lock = _runtime.stream(("cpu", 0))
    with lock:  # as if another thread were inside lmk.rope at the fork
        pid = os.fork()
        if pid == 0:  # child: exit status 0 only if the op ran and matched
            ok = False
            try:
                ok = same_bits(lmk.rope(q, pos), want)
            finally:
                os._exit(0 if ok else 1)
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung (it waited on a lock held at the fork)")
        time.sleep(0.05)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
