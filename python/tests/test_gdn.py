"""test_gdn.py - lmk.causal_conv1d and lmk.gated_delta_rule (include/lmk.h "Gated DeltaNet") against the float64
references of ref.py: random inputs, Qwen3.5 / Qwen3-Next head shapes at small T, sequences packed with
cu_seqlens and state pools addressed by slots (padding slots, empty sequences, a row named twice), Hugging
Face's conv cache passed as cache.transpose(1, 2), a dk-fastest state passed as a transposed view, q / k / v as
views of the convolution's output, out= and in place, a sequence split across calls equal to one call, and
errors that write nothing. NumPy covers f32 and f16; torch (when installed) covers bf16 inputs and a bf16 state
pool, the torch.ops.lmk custom ops, torch.compile(fullgraph=True) and, with a GPU, CUDA graphs."""
import pytest

np = pytest.importorskip("numpy")
import lmk  # noqa: E402
from lmk import _lib  # noqa: E402
from ref import causal_conv1d_ref, gdn_ref, rel_rows, ulp  # noqa: E402

HAS = _lib.causal_conv1d is not None and _lib.gated_delta_rule is not None
pytestmark = pytest.mark.skipif(not HAS, reason="this liblmk has no lmk_causal_conv1d / lmk_gated_delta_rule")


def uniform(rng, shape, lo, hi, dtype=np.float32):
    return rng.uniform(lo, hi, size=shape).astype(dtype)


# ---- causal_conv1d ----

def conv_case(rng, T, C, W, dtype, bias=True, n_slots=None):
    x = uniform(rng, (T, C), -2, 2, dtype)
    w = uniform(rng, (C, W), -0.5, 0.5, dtype)
    b = uniform(rng, C, -0.5, 0.5, dtype) if bias else None
    st = None if n_slots is None else uniform(rng, (n_slots, W - 1, C), -2, 2, dtype)
    return x, w, b, st


def check_conv(y, ref, bound):
    name = y.dtype.name
    tol = ulp(ref, name) + 1e-6 * bound
    err = np.abs(y.astype(np.float64) - ref)
    assert (err <= tol).all(), "max error %g (tolerance there %g)" % (err.max(), tol.flat[err.argmax()])


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


# (name, T, C, W, activation, bias): Qwen3.5-27B's conv (10240 channels, width 4), Qwen3-Next's (8192), and
# small ones over every width lmk takes.
CONV_CASES = [
    ("qwen35_27b", 5, 10240, 4, "silu", False),
    ("qwen3next", 3, 8192, 4, "silu", False),
    ("w2_bias_none", 7, 40, 2, "none", True),
    ("w3_bias_silu", 6, 24, 3, "silu", True),
    ("w8_silu", 11, 16, 8, "silu", True),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("name,T,C,W,act,bias", CONV_CASES, ids=[c[0] for c in CONV_CASES])
def test_conv_vs_reference(rng, name, T, C, W, act, bias, dtype):
    x, w, b, st = conv_case(rng, T, C, W, dtype, bias, n_slots=2)
    x0, st0 = x.copy(), st.copy()
    y = lmk.causal_conv1d(x, w, bias=b, activation=act)  # no state: zeros before the sequence
    assert isinstance(y, np.ndarray) and y.shape == (T, C) and y.dtype == x.dtype
    ref, _, bound = causal_conv1d_ref(x, w, b, act)
    check_conv(y, ref, bound)
    y2 = lmk.causal_conv1d(x, w, bias=b, activation=act, state=st)  # one sequence: row 0 of the pool
    ref2, st_ref, bound2 = causal_conv1d_ref(x, w, b, act, state=st0)
    check_conv(y2, ref2, bound2)
    assert same_bits(st, st_ref.astype(dtype))  # the state is a bit copy of the inputs
    assert same_bits(st[1], st0[1]) and same_bits(x, x0)


def test_conv_activation_spellings(rng):
    x, w, b, _ = conv_case(rng, 4, 8, 4, np.float32)
    want_none = lmk.causal_conv1d(x, w, bias=b, activation="none")
    assert same_bits(lmk.causal_conv1d(x, w, bias=b, activation=None), want_none)
    assert same_bits(lmk.causal_conv1d(x, w, bias=b, activation=0), want_none)
    want_silu = lmk.causal_conv1d(x, w, bias=b)
    assert same_bits(lmk.causal_conv1d(x, w, bias=b, activation="SiLU"), want_silu)
    assert same_bits(lmk.causal_conv1d(x, w, bias=b, activation=1), want_silu)
    assert not same_bits(want_none, want_silu)


@pytest.mark.parametrize("idx_dtype", [np.int32, np.int64])
def test_conv_varlen_slots(rng, idx_dtype):
    """Packed sequences: an empty one, one shorter than W-1 (its row shifts along), a padding slot (-1) and
    one past the pool (both start from zeros and store nothing); untouched rows keep their bits."""
    T, C, W, n_slots = 14, 24, 4, 6
    x, w, b, st = conv_case(rng, T, C, W, np.float32, n_slots=n_slots)
    st0 = st.copy()
    cu = np.array([0, 4, 4, 5, 10, 12, 14], idx_dtype)
    slots = np.array([3, 0, 5, -1, 1, n_slots + 2], idx_dtype)
    y = lmk.causal_conv1d(x, w, bias=b, cu_seqlens=cu, state=st, state_slots=slots)
    ref, st_ref, bound = causal_conv1d_ref(x, w, b, "silu", cu, st0, slots)
    check_conv(y, ref, bound)
    assert same_bits(st, st_ref.astype(np.float32))
    for row in (2, 4):  # named by no sequence
        assert same_bits(st[row], st0[row])
    assert same_bits(st[0], st0[0])  # the empty sequence leaves its row as it was
    # the one-token sequence (row 5): its row shifted by one, the token appended
    assert same_bits(st[5], np.concatenate([st0[5][1:], x[4:5]]))


def test_conv_slots_default_rows_and_a_row_named_twice(rng):
    """Slots None: sequence s uses row s. A row named by two sequences: both read it as before the call and the
    last one stores (lmk.h; on the CPU every output is defined)."""
    T, C, W = 9, 16, 3
    x, w, b, st = conv_case(rng, T, C, W, np.float32, n_slots=3)
    cu = np.array([0, 2, 6, 9], np.int32)
    st0 = st.copy()
    y = lmk.causal_conv1d(x, w, bias=b, cu_seqlens=cu, state=st)
    ref, st_ref, bound = causal_conv1d_ref(x, w, b, "silu", cu, st0)
    check_conv(y, ref, bound)
    assert same_bits(st, st_ref.astype(np.float32))
    st = st0.copy()
    slots = np.array([1, 2, 1], np.int64)
    y = lmk.causal_conv1d(x, w, bias=b, cu_seqlens=cu, state=st, state_slots=slots)
    ref, st_ref, bound = causal_conv1d_ref(x, w, b, "silu", cu, st0, slots)
    check_conv(y, ref, bound)
    assert same_bits(st, st_ref.astype(np.float32))
    assert same_bits(st[1], x[7:9])  # the last sequence's last W-1 tokens


def test_conv_hf_cache_layout_through_transpose(rng):
    """Hugging Face's conv cache is [B, C, W-1]: passed as cache.transpose(0, 2, 1), a strided [B, W-1, C]
    view, it is read and updated where it lies, with the results of a dense pool."""
    B, C, W = 3, 40, 4
    lens = [5, 1, 3]
    T = sum(lens)
    x, w, b, _ = conv_case(rng, T, C, W, np.float32)
    cache = uniform(rng, (B, C, W - 1), -2, 2)
    dense = np.ascontiguousarray(cache.transpose(0, 2, 1))
    view = cache.transpose(0, 2, 1)
    assert view.shape == (B, W - 1, C) and np.shares_memory(view, cache) and not view.flags.c_contiguous
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    ref, st_ref, bound = causal_conv1d_ref(x, w, b, "silu", cu, cache.transpose(0, 2, 1))
    check_conv(lmk.causal_conv1d(x, w, bias=b, cu_seqlens=cu, state=dense), ref, bound)
    check_conv(lmk.causal_conv1d(x, w, bias=b, cu_seqlens=cu, state=view), ref, bound)
    assert same_bits(cache, np.ascontiguousarray(st_ref.astype(np.float32).transpose(0, 2, 1)))
    assert same_bits(np.ascontiguousarray(view), dense)


def test_conv_hf_weight_in_place_and_strided(rng):
    """Hugging Face's conv1d.weight [C, 1, W]; x a column slice of a wider projection (token stride > C),
    convolved in place; the columns beside it untouched; out= given returns out."""
    T, C, W = 6, 32, 4
    wide = uniform(rng, (T, C + 8), -2, 2)
    orig = wide.copy()
    x = wide[:, :C]
    w3 = uniform(rng, (C, 1, W), -0.5, 0.5)
    want = lmk.causal_conv1d(x.copy(), w3.reshape(C, W))
    ref, _, bound = causal_conv1d_ref(orig[:, :C], w3.reshape(C, W))
    check_conv(want, ref, bound)
    out = np.full((T, C), np.nan, np.float32)
    assert lmk.causal_conv1d(x, w3, out=out) is out
    assert same_bits(out, want)
    res = lmk.causal_conv1d(x, w3, out=x)
    assert res is x and same_bits(x, want)
    assert same_bits(wide[:, C:], orig[:, C:])


def test_conv_split_sequence_equals_one_call(rng):
    """A sequence convolved in one call, or in pieces (one token at a time included) with its state carried
    through the pool, gives the same outputs and the same final state."""
    T, C, W = 9, 24, 4
    x, w, b, st = conv_case(rng, T, C, W, np.float32, n_slots=2)
    slots = np.array([1], np.int32)
    ref, st_ref, bound = causal_conv1d_ref(x, w, b, "silu", state=st, state_slots=slots)
    st_one = st.copy()
    check_conv(lmk.causal_conv1d(x, w, bias=b, state=st_one, state_slots=slots), ref, bound)
    assert same_bits(st_one, st_ref.astype(np.float32))
    for cuts in ([0, 4, 9], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [0, 2, 2, 9]):
        st_split = st.copy()
        ys = [lmk.causal_conv1d(x[lo:hi], w, bias=b, state=st_split, state_slots=slots)
              for lo, hi in zip(cuts[:-1], cuts[1:])]
        check_conv(np.concatenate(ys), ref, bound)
        assert same_bits(st_split, st_one)


# ---- gated_delta_rule ----

def gdn_case(rng, T, Hk, Hv, dk, dv, dtype=np.float32, gates=True, z=True, n_slots=None, small_k=False):
    """Inputs of one call. gates: a, b with A_log, dt_bias (else a is g <= 0 and b is beta in (0, 1))."""
    kmax = 0.3 if small_k else 1.0
    c = dict(q=uniform(rng, (T, Hk, dk), -1, 1, dtype), k=uniform(rng, (T, Hk, dk), -kmax, kmax, dtype),
             v=uniform(rng, (T, Hv, dv), -1, 1, dtype))
    if gates:
        c.update(a=uniform(rng, (T, Hv), -2, 2), b=uniform(rng, (T, Hv), -3, 3),
                 A_log=np.log(uniform(rng, Hv, 1, 16)), dt_bias=uniform(rng, Hv, -1, 1))
    else:
        c.update(a=uniform(rng, (T, Hv), -1, 0), b=uniform(rng, (T, Hv), 0, 1))
    if z:
        c.update(z=uniform(rng, (T, Hv, dv), -2, 2, dtype), norm_w=uniform(rng, dv, 0.5, 1.5, dtype))
    if n_slots:
        c["state"] = uniform(rng, (n_slots, Hv, dk, dv), -0.5, 0.5)
    return c


# The f32 rounding of an output row's terms (a little under one f32 ulp, 2^-23): lmk's backends evaluate
# o = S^T qn in f32, so a row whose terms nearly cancel (ref.gdn_ref's cond >> 1) carries up to this times
# cond of relative error on top of lmk.h's row bound, whatever the implementation.
F32_ROUNDING = 1e-7


# The spacing of the output dtype's subnormals: a row small enough to be stored in them carries their fixed
# absolute rounding, which no relative bound covers (f16's start at 2^-14; its spacing there is 2^-24).
SUBNORMAL_SPACING = {"float32": 2.0 ** -149, "bfloat16": 2.0 ** -133, "float16": 2.0 ** -24}


def check_gdn(out, ref, dtype_name, cond):
    """lmk.h: f32 rows within 1e-4 relative norm-wise; bf16 / f16 within 4e-3; plus F32_ROUNDING * cond, the
    f32 rounding of the row's terms where they nearly cancel (ref.gdn_ref's cond), and the subnormal
    rounding of rows that small."""
    floor = np.sqrt(ref.shape[-1]) * SUBNORMAL_SPACING[dtype_name] / np.maximum(np.linalg.norm(ref, axis=-1),
                                                                                 1e-300)
    tol = (1e-4 if dtype_name == "float32" else 4e-3) + F32_ROUNDING * cond + floor
    rel = rel_rows(out, ref)
    worst = np.unravel_index(np.argmax(rel / tol), rel.shape)
    assert (rel <= tol).all(), "out: row %s %.3g relative, tolerance %.3g (cond %.3g)" % (
        worst, rel[worst], tol[worst], cond[worst])


def check_state(got, ref, tol=1e-4):
    rel = rel_rows(got, ref, n_axes=2)
    assert (rel <= tol).all(), "state: worst [dk, dv] matrix %.3g relative (tolerance %g)" % (rel.max(), tol)


def run_gdn(c, **kw):
    args = {n: c[n] for n in ("A_log", "dt_bias", "z", "norm_w", "state") if n in c}
    args.update(kw)
    return lmk.gated_delta_rule(c["q"], c["k"], c["v"], c["a"], c["b"], **args)


def ref_gdn(c, state=None, **kw):
    args = {n: c[n] for n in ("A_log", "dt_bias", "z", "norm_w") if n in c}
    args.update(kw)
    return gdn_ref(c["q"], c["k"], c["v"], c["a"], c["b"], state=state, **args)


# (name, T, Hk, Hv, dk, dv, keywords of the call and its case): the released models' head geometry at a few
# tokens (Qwen3.5/3.6-27B: 16 k heads, 48 v heads, 128; Qwen3.5-35B-A3B / Qwen3-Next: 32 v heads), and small
# shapes with dk != dv so that a transposed state cannot pass.
GDN_CASES = [
    ("qwen35_27b", 3, 16, 48, 128, 128, dict()),
    ("qwen3next", 2, 16, 32, 128, 128, dict(weight_offset=1.0)),
    ("small_block", 9, 2, 6, 16, 24, dict()),
    ("small_tiled", 9, 2, 6, 16, 24, dict(heads="tiled")),
    ("mha_scale", 6, 3, 3, 32, 8, dict(scale=0.25, eps=1e-5)),
    ("no_gates_no_norm", 7, 2, 4, 24, 16, dict(gates=False, z=False)),
    ("no_l2norm", 8, 1, 2, 16, 16, dict(l2norm=False, gates=False, small_k=True)),
]
_CASE_KEYS = ("gates", "z", "small_k")


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("name,T,Hk,Hv,dk,dv,kw", GDN_CASES, ids=[c[0] for c in GDN_CASES])
def test_gdn_vs_reference(rng, name, T, Hk, Hv, dk, dv, kw, dtype):
    case_kw = {k: v for k, v in kw.items() if k in _CASE_KEYS}
    call_kw = {k: v for k, v in kw.items() if k not in _CASE_KEYS}
    c = gdn_case(rng, T, Hk, Hv, dk, dv, dtype, n_slots=3, **case_kw)
    before = {n: a.copy() for n, a in c.items()}
    st0 = c["state"].copy()
    out = run_gdn(c, **call_kw)
    assert isinstance(out, np.ndarray) and out.shape == (T, Hv, dv) and out.dtype == c["q"].dtype
    ref, st_ref, cond = ref_gdn(before, state=st0, **call_kw)
    check_gdn(out, ref, np.dtype(dtype).name, cond)
    check_state(c["state"][0], st_ref[0])
    assert same_bits(c["state"][1:], st0[1:])
    assert all(same_bits(c[n], before[n]) for n in c if n != "state")
    # no state: zeros, nothing stored
    ref0, _, cond0 = ref_gdn(before, **call_kw)
    check_gdn(lmk.gated_delta_rule(c["q"], c["k"], c["v"], c["a"], c["b"],
                                   **{n: c[n] for n in ("A_log", "dt_bias", "z", "norm_w") if n in c}, **call_kw),
              ref0, np.dtype(dtype).name, cond0)


def test_gdn_heads_and_scale_matter(rng):
    """The reference is sharp enough to see the head map, the scale and the L2 norm switched."""
    c = gdn_case(rng, 5, 2, 6, 16, 24)
    ref_block, _, cond = ref_gdn(c)
    for kw in (dict(heads="tiled"), dict(scale=0.5), dict(l2norm=False)):
        assert rel_rows(ref_gdn(c, **kw)[0], ref_block).max() > 1e-2, kw
    for kw in (dict(heads="block"), dict(heads=1), dict(scale=None)):
        check_gdn(run_gdn(c, **kw), ref_block, "float32", cond)
    for kw, ref_kw in ((dict(heads="tiled"), dict(heads="tiled")), (dict(heads=0), dict(heads="tiled")),
                       (dict(scale=0.5), dict(scale=0.5))):
        ref, _, cond = ref_gdn(c, **ref_kw)
        check_gdn(run_gdn(c, **kw), ref, "float32", cond)


@pytest.mark.parametrize("idx_dtype", [np.int32, np.int64])
def test_gdn_varlen_slots(rng, idx_dtype):
    """Packed sequences with slots: an empty sequence, padding (-1) and a slot past the pool start from zeros
    and store nothing, rows named by no sequence keep their bits."""
    T, Hk, Hv, dk, dv, n_slots = 12, 2, 4, 16, 8, 6
    c = gdn_case(rng, T, Hk, Hv, dk, dv, n_slots=n_slots)
    st0 = c["state"].copy()
    cu = np.array([0, 3, 3, 4, 9, 12], idx_dtype)
    slots = np.array([4, 1, -1, 0, n_slots], idx_dtype)
    out = run_gdn(c, cu_seqlens=cu, state_slots=slots)
    ref, st_ref, cond = ref_gdn(c, state=st0, cu_seqlens=cu, state_slots=slots)
    check_gdn(out, ref, "float32", cond)
    check_state(c["state"][[4, 0]], st_ref[[4, 0]])
    for row in (1, 2, 3, 5):  # the empty sequence's row 1 and rows nobody names
        assert same_bits(c["state"][row], st0[row])
    # slots None: sequence s uses row s
    c["state"] = st0.copy()
    out = run_gdn(c, cu_seqlens=cu)
    ref, st_ref, cond = ref_gdn(c, state=st0, cu_seqlens=cu)
    check_gdn(out, ref, "float32", cond)
    check_state(c["state"][:5], st_ref[:5])
    assert same_bits(c["state"][5], st0[5])


def test_gdn_row_named_twice(rng):
    """Two sequences naming one row both start from the row as it was before the call; the last one stores
    it (lmk.h; defined on the CPU)."""
    T, Hk, Hv, dk, dv = 8, 1, 2, 16, 16
    c = gdn_case(rng, T, Hk, Hv, dk, dv, n_slots=2)
    st0 = c["state"].copy()
    cu, slots = np.array([0, 5, 8], np.int32), np.array([1, 1], np.int32)
    out = run_gdn(c, cu_seqlens=cu, state_slots=slots)
    ref, st_ref, cond = ref_gdn(c, state=st0, cu_seqlens=cu, state_slots=slots)
    check_gdn(out, ref, "float32", cond)
    check_state(c["state"][1], st_ref[1])
    assert same_bits(c["state"][0], st0[0])


def test_gdn_dk_fastest_state_view(rng):
    """FlashInfer's and ggml's dk-fastest pool [n, Hv, dv, dk] passed as its transposed view [n, Hv, dk, dv]:
    read and updated where it lies, with the results of the dense (dv-fastest) pool."""
    T, Hk, Hv, dk, dv = 6, 2, 4, 16, 24
    c = gdn_case(rng, T, Hk, Hv, dk, dv, n_slots=2)
    dense = c.pop("state")
    pool_t = np.ascontiguousarray(dense.transpose(0, 1, 3, 2))
    view = pool_t.transpose(0, 1, 3, 2)
    assert view.shape == dense.shape and np.shares_memory(view, pool_t) and view.strides[-1] != 4
    ref, st_ref, cond = ref_gdn(c, state=dense.copy(), state_slots=np.array([1], np.int32))
    out_dense = run_gdn(c, state=dense, state_slots=np.array([1], np.int32))
    out_view = run_gdn(c, state=view, state_slots=np.array([1], np.int32))
    check_gdn(out_view, ref, "float32", cond)
    check_gdn(out_dense, ref, "float32", cond)
    check_state(pool_t[1].transpose(0, 2, 1), st_ref[1])
    check_state(dense[1], st_ref[1])
    assert same_bits(pool_t[0].transpose(0, 2, 1), st_ref[0].astype(np.float32))


def test_gdn_views_of_the_conv_output(rng):
    """The layer as an engine runs it: qkv convolved in place, q, k, v strided views of it (no copies), z a
    view of a [z | other] projection, then one gated_delta_rule call, against the float64 chain."""
    T, Hk, Hv, dk, dv, W = 7, 2, 4, 16, 16, 4
    C = 2 * Hk * dk + Hv * dv
    qkv = uniform(rng, (T, C), -1, 1)
    w = uniform(rng, (C, 1, W), -0.5, 0.5)
    conv_state = uniform(rng, (1, C, W - 1), -1, 1)        # Hugging Face's layout
    state = uniform(rng, (1, Hv, dk, dv), -0.5, 0.5)
    c = gdn_case(rng, T, Hk, Hv, dk, dv, z=False)
    zw = uniform(rng, (T, Hv, 2 * dv), -2, 2)
    z, norm_w = zw[..., :dv], uniform(rng, dv, 0.5, 1.5)
    conv_ref, conv_st_ref, _ = causal_conv1d_ref(qkv, w, None, "silu", state=conv_state.transpose(0, 2, 1))
    st0 = state.copy()
    lmk.causal_conv1d(qkv, w, state=conv_state.transpose(0, 2, 1), out=qkv)
    q = qkv[:, :Hk * dk].reshape(T, Hk, dk)
    k = qkv[:, Hk * dk:2 * Hk * dk].reshape(T, Hk, dk)
    v = qkv[:, 2 * Hk * dk:].reshape(T, Hv, dv)
    assert all(np.shares_memory(t, qkv) for t in (q, k, v)) and np.shares_memory(z, zw)
    out = lmk.gated_delta_rule(q, k, v, c["a"], c["b"], A_log=c["A_log"], dt_bias=c["dt_bias"], state=state, z=z,
                               norm_w=norm_w)
    cq = conv_ref[:, :Hk * dk].reshape(T, Hk, dk)
    ck = conv_ref[:, Hk * dk:2 * Hk * dk].reshape(T, Hk, dk)
    cv = conv_ref[:, 2 * Hk * dk:].reshape(T, Hv, dv)
    ref, st_ref, cond = gdn_ref(cq, ck, cv, c["a"], c["b"], A_log=c["A_log"], dt_bias=c["dt_bias"], state=st0,
                                z=z, norm_w=norm_w)
    check_gdn(out, ref, "float32", cond)
    check_state(state[0], st_ref[0])
    assert same_bits(np.ascontiguousarray(conv_state.transpose(0, 2, 1)), conv_st_ref.astype(np.float32))


def test_gdn_out_given(rng):
    T, Hk, Hv, dk, dv = 5, 2, 4, 16, 8
    c = gdn_case(rng, T, Hk, Hv, dk, dv)
    want = run_gdn(c)
    out = np.full((T, Hv, dv), np.nan, np.float32)
    assert run_gdn(c, out=out) is out
    assert same_bits(out, want)
    wide = np.full((T, Hv, 3 * dv), 7.0, np.float32)  # a strided out: columns of a wider buffer
    res = run_gdn(c, out=wide[..., dv:2 * dv])
    assert np.shares_memory(res, wide) and same_bits(wide[..., dv:2 * dv], want)
    assert np.all(wide[..., :dv] == 7.0) and np.all(wide[..., 2 * dv:] == 7.0)


def test_gdn_split_sequence_equals_one_call(rng):
    """One sequence in one call, split at a token across two calls, and one token a call, its state carried
    through the pool: the same outputs and final state within lmk.h's precision (and each within it of the
    float64 reference)."""
    T, Hk, Hv, dk, dv = 10, 2, 4, 16, 24
    c = gdn_case(rng, T, Hk, Hv, dk, dv, n_slots=2)
    st0 = c.pop("state")
    slots = np.array([1], np.int64)
    ref, st_ref, cond = ref_gdn(c, state=st0, state_slots=slots)
    st_one = st0.copy()
    out_one = run_gdn(c, state=st_one, state_slots=slots)
    check_gdn(out_one, ref, "float32", cond)
    check_state(st_one[1], st_ref[1])
    per_token = ["q", "k", "v", "a", "b", "z"]
    for cuts in ([0, 4, 10], list(range(T + 1))):
        st = st0.copy()
        outs = []
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            part = dict(c, **{n: c[n][lo:hi] for n in per_token})
            outs.append(run_gdn(part, state=st, state_slots=slots))
        out = np.concatenate(outs)
        check_gdn(out, ref, "float32", cond)
        check_gdn(out, out_one, "float32", cond)
        check_state(st[1], st_ref[1])
        assert same_bits(st[0], st0[0])


# ---- errors: LmkError with a message naming the argument; nothing written ----

def test_conv_errors_write_nothing(rng):
    T, C, W = 4, 8, 4
    x, w, b, st = conv_case(rng, T, C, W, np.float32, n_slots=2)
    out = np.full((T, C), 9.0, np.float32)
    st0 = st.copy()

    def rejected(exc, match, x=x, w=w, **kw):
        args = dict(bias=b, state=st, out=out)
        args.update(kw)
        with pytest.raises(exc, match=match) as e:
            lmk.causal_conv1d(x, w, **args)
        assert isinstance(e.value, lmk.LmkError)
        assert np.all(out == 9.0) and same_bits(st, st0)

    # Python's checks: shapes, keywords
    rejected(lmk.LmkError, "x must be 2-D", x=x.reshape(T, 2, C // 2))
    rejected(lmk.LmkError, "weight must be", w=w[:4])
    rejected(lmk.LmkError, "weight must be", w=w.reshape(C, 2, W // 2))
    rejected(lmk.LmkError, "out must have shape", out=np.full((C, T), 9.0, np.float32))
    rejected(lmk.LmkError, "out must have shape", out=np.full(T * C, 9.0, np.float32))
    rejected(lmk.LmkError, r"state must be \[n_slots, W-1, C\].*transpose", state=np.zeros((2, C, W - 1), np.float32))
    rejected(lmk.LmkError, "activation", activation="gelu")
    rejected(TypeError, "x must be an array", x=[[1.0]])
    # liblmk's checks
    rejected(lmk.LmkError, "width", w=np.ones((C, 9), np.float32), state=None)
    rejected(lmk.LmkError, "dtype|f16", out=np.full((T, C), 9.0, np.float16))
    rejected(lmk.LmkError, "bias", bias=b[:-1])
    rejected(lmk.LmkError, "state_slots", state=None, state_slots=np.zeros(1, np.int32))
    rejected(lmk.LmkError, "state_slots", state_slots=np.zeros(2, np.int32))  # one sequence: one slot
    rejected(lmk.LmkError, "cu_seqlens", cu_seqlens=np.zeros(1, np.int32))
    rejected(lmk.LmkError, "cu_seqlens", cu_seqlens=np.array([0, T], np.float32))
    rejected(lmk.LmkError, "state", state=st.astype(np.float16))
    rejected(lmk.LmkError, "read-only", state=np.broadcast_to(st[:1], st.shape))
    row = np.zeros((W - 1, C), np.float32)  # two pool rows on the same memory: not distinct elements
    aliased = np.lib.stride_tricks.as_strided(row, shape=(2, W - 1, C), strides=(0,) + row.strides)
    rejected(lmk.LmkError, "state", state=aliased)
    assert not row.any()


def test_gdn_errors_write_nothing(rng):
    T, Hk, Hv, dk, dv = 4, 2, 4, 16, 8
    c = gdn_case(rng, T, Hk, Hv, dk, dv, n_slots=2)
    out = np.full((T, Hv, dv), 9.0, np.float32)
    st, st0 = c["state"], c["state"].copy()

    def rejected(exc, match, **kw):
        args = dict(A_log=c["A_log"], dt_bias=c["dt_bias"], z=c["z"], norm_w=c["norm_w"], state=st, out=out)
        args.update(kw)
        ops = {n: args.pop(n) for n in ("q", "k", "v", "a", "b") if n in args}
        with pytest.raises(exc, match=match) as e:
            lmk.gated_delta_rule(*[ops.get(n, c[n]) for n in ("q", "k", "v", "a", "b")], **args)
        assert isinstance(e.value, lmk.LmkError)
        assert np.all(out == 9.0) and same_bits(st, st0)

    # Python's checks: shapes, keywords
    rejected(lmk.LmkError, "k must have shape", k=c["k"][:, :1])
    rejected(lmk.LmkError, "k must have shape", k=c["k"].reshape(T * 2, Hk, dk // 2))
    rejected(lmk.LmkError, "v must have shape", v=c["v"][:-1])
    rejected(lmk.LmkError, "a must have shape", a=c["a"].reshape(T, Hv, 1))
    rejected(lmk.LmkError, "b must have shape", b=c["b"].reshape(2 * T, Hv // 2))
    rejected(lmk.LmkError, "z must have shape", z=c["z"].reshape(T, Hv * 2, dv // 2))
    rejected(lmk.LmkError, "out must have shape", out=np.full((T, Hv * dv), 9.0, np.float32))
    rejected(lmk.LmkError, r"state must be \[n_slots, Hv, dk, dv\]", state=np.zeros((2, Hv, dv, dk), np.float32))
    rejected(lmk.LmkError, "heads", heads="grouped")
    rejected(TypeError, "l2norm", l2norm="False")
    rejected(TypeError, "scale", scale="0.1")
    rejected(TypeError, "eps", eps="1e-6")
    # liblmk's checks
    rejected(lmk.LmkError, "A_log|dt_bias", dt_bias=None)
    rejected(lmk.LmkError, "z|norm_w", norm_w=None)
    rejected(lmk.LmkError, "eps", eps=0.0)
    rejected(lmk.LmkError, "multiple", v=c["v"][:, :3], a=c["a"][:, :3], b=c["b"][:, :3], z=c["z"][:, :3],
             out=np.full((T, 3, dv), 9.0, np.float32), state=None, A_log=c["A_log"][:3], dt_bias=c["dt_bias"][:3])
    rejected(lmk.LmkError, "dtype|f16", out=np.full((T, Hv, dv), 9.0, np.float16))
    rejected(lmk.LmkError, "state", state=st.astype(np.float16))
    rejected(lmk.LmkError, "state_slots", state=None, state_slots=np.zeros(1, np.int32))
    rejected(lmk.LmkError, "norm_w", norm_w=c["norm_w"][:-1])
    rejected(lmk.LmkError, "dk|k_dim|256", q=np.zeros((T, Hk, 512), np.float32),
             k=np.zeros((T, Hk, 512), np.float32), state=None)
    # an out overlapping an input
    qq = c["q"].copy()
    with pytest.raises(lmk.LmkError):
        lmk.gated_delta_rule(qq, c["k"], c["v"], c["a"], c["b"], out=qq.reshape(T, Hv, dv))
    assert same_bits(qq, c["q"])


# ---- torch: bf16, the custom ops, torch.compile, CUDA graphs ----

def _torch():
    return pytest.importorskip("torch", reason="torch is not installed (bf16 and the custom ops need it)")


def _has_cuda():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available() and any(d["backend"] == "cuda" for d in lmk.devices())


cuda_only = pytest.mark.skipif(not _has_cuda(), reason="no CUDA GPU visible to torch (or a liblmk without CUDA)")
DEVICES = ["cpu", pytest.param("cuda", marks=cuda_only)]


def to_torch(c, device, dtype):
    """The case's arrays as torch tensors: q, k, v, z, norm_w in dtype, the gates in f32."""
    torch = _torch()
    t = {}
    for n, a in c.items():
        x = torch.from_numpy(np.ascontiguousarray(a))
        if n in ("q", "k", "v", "z", "norm_w"):
            x = x.to(dtype)
        t[n] = x.to(device)
    return t


def as64(t):
    return t.detach().double().cpu().numpy()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("state_dtype", ["float32", "bfloat16"])
def test_gdn_torch_bf16(rng, device, state_dtype):
    torch = _torch()
    T, Hk, Hv, dk, dv = 6, 16, 48, 128, 128
    c = gdn_case(rng, T, Hk, Hv, dk, dv, n_slots=2)
    t = to_torch(c, device, torch.bfloat16)
    t["state"] = t["state"].to(getattr(torch, state_dtype))
    st0 = t["state"].clone()
    out = lmk.gated_delta_rule(t["q"], t["k"], t["v"], t["a"], t["b"], A_log=t["A_log"], dt_bias=t["dt_bias"],
                               state=t["state"], state_slots=torch.tensor([1], device=device), z=t["z"],
                               norm_w=t["norm_w"])
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16 and out.device == t["q"].device
    ref, st_ref, cond = gdn_ref(*(as64(t[n]) for n in ("q", "k", "v", "a", "b")), A_log=c["A_log"],
                                dt_bias=c["dt_bias"], state=as64(st0), state_slots=[1], z=as64(t["z"]),
                                norm_w=as64(t["norm_w"]))
    check_gdn(as64(out), ref, "bfloat16", cond)
    # the state: f32 within 1e-4; a bf16 pool rounded once at the end (half a bf16 ulp, 2^-9 relative)
    check_state(as64(t["state"][1]), st_ref[1], 1e-4 if state_dtype == "float32" else 4e-3)
    assert torch.equal(t["state"][0], st0[0])


@pytest.mark.parametrize("device", DEVICES)
def test_conv_torch_bf16_hf_cache(rng, device):
    """bf16 conv on torch with Hugging Face's [B, C, W-1] cache passed as cache.transpose(1, 2)."""
    torch = _torch()
    B, C, W, lens = 2, 10240, 4, [3, 1]
    T = sum(lens)
    x = torch.from_numpy(uniform(rng, (T, C), -2, 2)).to(torch.bfloat16).to(device)
    w = torch.from_numpy(uniform(rng, (C, 1, W), -0.5, 0.5)).to(torch.bfloat16).to(device)
    cache = torch.from_numpy(uniform(rng, (B, C, W - 1), -2, 2)).to(torch.bfloat16).to(device)
    cache0 = cache.clone()
    cu = torch.tensor([0, 3, 4], dtype=torch.int32, device=device)
    y = lmk.causal_conv1d(x, w, cu_seqlens=cu, state=cache.transpose(1, 2))
    ref, st_ref, bound = causal_conv1d_ref(as64(x), as64(w), None, "silu", as64(cu), as64(cache0.transpose(1, 2)))
    err = np.abs(as64(y) - ref)
    assert (err <= ulp(ref, "bfloat16") + 1e-6 * bound).all(), err.max()
    assert torch.equal(cache.transpose(1, 2).cpu(), torch.from_numpy(st_ref).to(torch.bfloat16))


@pytest.mark.parametrize("device", DEVICES)
def test_custom_ops_eager_and_opcheck(rng, device):
    torch = _torch()
    import lmk.torch_ops  # noqa: F401
    T, Hk, Hv, dk, dv, W = 5, 2, 4, 16, 8, 4
    C = 2 * Hk * dk + Hv * dv
    x = torch.from_numpy(uniform(rng, (T, C), -1, 1)).to(device)
    w = torch.from_numpy(uniform(rng, (C, W), -0.5, 0.5)).to(device)
    st = torch.from_numpy(uniform(rng, (2, W - 1, C), -1, 1)).to(device)
    want = lmk.causal_conv1d(x, w, state=st.clone())
    out = torch.empty_like(x)
    st1 = st.clone()
    assert torch.ops.lmk.causal_conv1d(x, w, out, activation="silu", state=st1) is None
    assert torch.equal(out, want)
    torch.library.opcheck(torch.ops.lmk.causal_conv1d.default, (x, w, torch.empty_like(x)),
                          dict(state=st.clone(), activation="silu"))
    c = to_torch(gdn_case(rng, T, Hk, Hv, dk, dv, n_slots=2), device, torch.float32)
    args = (c["q"], c["k"], c["v"], c["a"], c["b"])
    kw = dict(A_log=c["A_log"], dt_bias=c["dt_bias"], z=c["z"], norm_w=c["norm_w"])
    want = lmk.gated_delta_rule(*args, state=c["state"].clone(), **kw)
    out = torch.empty(T, Hv, dv, device=device)
    assert torch.ops.lmk.gated_delta_rule(*args, out, state=c["state"].clone(), **kw) is None
    assert torch.equal(out, want)
    assert torch.equal(lmk.torch_ops.gated_delta_rule(*args, state=c["state"].clone(), **kw), want)
    torch.library.opcheck(torch.ops.lmk.gated_delta_rule.default, args + (torch.empty(T, Hv, dv, device=device),),
                          dict(kw, state=c["state"].clone(), heads="block", l2norm=True))


def _gdn_layer(qkv, w, conv_state, a, b, A_log, dt_bias, z, norm_w, state, Hk, dk, Hv, dv):
    """A Gated DeltaNet layer between its projections, as a model compiles it: conv in place on Hugging
    Face's cache view, q / k / v views of the result, the recurrence with the gated norm, then torch ops."""
    T = qkv.shape[0]
    qkv = lmk.causal_conv1d(qkv, w, state=conv_state.transpose(1, 2), out=qkv)
    q = qkv[:, :Hk * dk].view(T, Hk, dk)
    k = qkv[:, Hk * dk:2 * Hk * dk].view(T, Hk, dk)
    v = qkv[:, 2 * Hk * dk:].view(T, Hv, dv)
    o = lmk.gated_delta_rule(q, k, v, a, b, A_log=A_log, dt_bias=dt_bias, state=state, z=z, norm_w=norm_w)
    return o.reshape(T, Hv * dv) * 2


def _layer_inputs(rng, device, T=5, Hk=2, Hv=4, dk=16, dv=16, W=4):
    torch = _torch()
    C = 2 * Hk * dk + Hv * dv
    c = gdn_case(rng, T, Hk, Hv, dk, dv)
    t = to_torch(c, device, torch.float32)
    return dict(qkv=torch.from_numpy(uniform(rng, (T, C), -1, 1)).to(device),
                w=torch.from_numpy(uniform(rng, (C, 1, W), -0.5, 0.5)).to(device),
                conv_state=torch.from_numpy(uniform(rng, (1, C, W - 1), -1, 1)).to(device),
                a=t["a"], b=t["b"], A_log=t["A_log"], dt_bias=t["dt_bias"], z=t["z"], norm_w=t["norm_w"],
                state=torch.from_numpy(uniform(rng, (1, Hv, dk, dv), -0.5, 0.5)).to(device),
                Hk=Hk, dk=dk, Hv=Hv, dv=dv)


def _clone(inp):
    return {n: (v.clone() if hasattr(v, "clone") else v) for n, v in inp.items()}


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph_equals_eager(rng, device):
    torch = _torch()
    import lmk.torch_ops  # noqa: F401
    inp = _layer_inputs(rng, device)
    eager, compiled = _clone(inp), _clone(inp)
    want = _gdn_layer(**eager)
    torch._dynamo.reset()
    got = torch.compile(_gdn_layer, fullgraph=True)(**compiled)
    assert torch.equal(got, want)
    for n in ("qkv", "conv_state", "state"):  # the in-place writes reached the caller's tensors
        assert torch.equal(compiled[n], eager[n]), n
        assert not torch.equal(compiled[n], inp[n]), n


@cuda_only
def test_cuda_graph_capture_and_replay(rng):
    torch = _torch()
    inp = _layer_inputs(rng, "cuda")
    live = _clone(inp)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        _gdn_layer(**_clone(inp))  # warm-up on the capture stream
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        got = _gdn_layer(**live)
    for _ in range(2):  # each replay continues the sequence from the states the last one left
        before = _clone(live)
        live["qkv"].copy_(inp["qkv"])
        before["qkv"].copy_(inp["qkv"])
        g.replay()
        torch.cuda.synchronize()
        want = _gdn_layer(**before)
        torch.cuda.synchronize()
        assert torch.equal(got, want)
        assert torch.equal(live["conv_state"], before["conv_state"]) and torch.equal(live["state"], before["state"])


def test_gdn_workspace_query_and_rules(rng):
    """lmk.gated_delta_rule_workspace validates like the call and answers 0 on the CPU; a workspace that is not
    a uint8 array, or shares bytes with an operand, is refused and nothing is written."""
    c = gdn_case(rng, 70, 2, 4, 16, 16, n_slots=1)
    assert lmk.gated_delta_rule_workspace(c["q"], c["k"], c["v"], c["a"], c["b"], A_log=c["A_log"],
                                          dt_bias=c["dt_bias"], state=c["state"]) == 0
    with pytest.raises(lmk.LmkError, match="dt_bias"):
        lmk.gated_delta_rule_workspace(c["q"], c["k"], c["v"], c["a"], c["b"], A_log=c["A_log"])
    ref, st, cond = ref_gdn(c, state=c["state"].astype(np.float64))
    check_gdn(run_gdn(c, workspace=np.zeros(64, np.uint8)), ref, "float32", cond)
    out = np.full((70, 4, 16), np.nan, np.float32)
    state0 = c["state"].copy()
    with pytest.raises(lmk.LmkError, match="workspace"):
        run_gdn(c, out=out, workspace=np.zeros(64, np.float32))
    with pytest.raises(lmk.LmkError, match="workspace"):
        run_gdn(c, out=out, workspace=out.view(np.uint8).reshape(-1))
    assert np.isnan(out).all() and np.array_equal(c["state"], state0)


@cuda_only
@pytest.mark.parametrize("heads", ["block", "tiled"])
def test_gdn_cuda_prompt_workspace(rng, heads):
    """A prompt on the GPU: the automatic workspace, an explicit one, and the CPU's token-by-token form agree
    within lmk.h's bf16 bound against the float64 reference, and the same call gives the same bits twice."""
    torch = _torch()
    T, Hk, Hv, dk, dv = 300, 2, 4, 128, 128
    c = gdn_case(rng, T, Hk, Hv, dk, dv, n_slots=2)
    t = to_torch(c, "cuda", torch.bfloat16)
    cu = torch.tensor([0, 37, 37, T], device="cuda", dtype=torch.int32)   # one short, one empty, one long
    slots = torch.tensor([0, 5, 1], device="cuda", dtype=torch.int32)    # 5: padding (the pool has 2 rows)
    kw = dict(A_log=t["A_log"], dt_bias=t["dt_bias"], heads=heads, cu_seqlens=cu, state_slots=slots, z=t["z"],
              norm_w=t["norm_w"])
    n = lmk.gated_delta_rule_workspace(t["q"], t["k"], t["v"], t["a"], t["b"], state=t["state"], **kw)
    outs, states = [], []
    for ws in (None, torch.empty(n + 1, dtype=torch.uint8, device="cuda")):
        st = t["state"].clone()
        outs.append(lmk.gated_delta_rule(t["q"], t["k"], t["v"], t["a"], t["b"], state=st, workspace=ws, **kw))
        states.append(st)
    assert torch.equal(outs[0], outs[1]) and torch.equal(states[0], states[1])
    ref, st_ref, cond = gdn_ref(*(as64(t[n_]) for n_ in ("q", "k", "v", "a", "b")), A_log=c["A_log"],
                                dt_bias=c["dt_bias"], heads=heads, cu_seqlens=[0, 37, 37, T], state=as64(t["state"]),
                                state_slots=[0, 5, 1], z=as64(t["z"]), norm_w=as64(t["norm_w"]))
    check_gdn(as64(outs[0]), ref, "bfloat16", cond)
    check_state(as64(states[0]), st_ref, 4e-3)
