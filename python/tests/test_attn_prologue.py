"""test_attn_prologue.py - lmk.attn_prologue (include/lmk.h "attn_prologue"): per-head RMS norm + rope of q and k
and the KV-cache write, against the float64 chain of ref.py, on NumPy (CPU) and torch (CPU, CUDA; f8 caches),
with paged and strided caches, padding slots, in place, errors that write nothing, torch.compile and CUDA graph
capture. Skipped, with the reason shown, while the loaded liblmk has no lmk_attn_prologue."""
import pytest

np = pytest.importorskip("numpy")
import lmk  # noqa: E402
from ref import rms_norm_ref, rope_ref, rotated_mask, ulp  # noqa: E402

HAS = lmk.has_attn_prologue()
needs_prologue = pytest.mark.skipif(not HAS, reason="this liblmk has no lmk_attn_prologue yet")

# (name, H, Hk, D, rope kwargs, norm weight_offset or None for no norms)
CASES = [
    ("qwen3_neox", 8, 2, 128, dict(mode="neox", freq_base=1e6), 0.0),
    ("qwen35_imrope", 6, 2, 256, dict(mode="imrope", sections=[11, 11, 10], rope_dim=64, freq_base=1e7), 1.0),
    ("llama_yarn_no_norm", 4, 1, 64, dict(mode="neox", freq_scale=0.25, ext_factor=1.0, n_ctx_orig=4096), None),
    ("gptj_normal", 4, 4, 64, dict(mode="normal", rope_dim=32), 0.0),
]
MULTI = ("mrope", "imrope", "vision")


def positions_for(rng, mode, T):
    shape = (4, T) if mode in MULTI else (T,)
    return rng.integers(0, 1 << 15, size=shape).astype(np.int32)


def chain_ref(x, w, pos, eps, offset, kw):
    """norm (when w is given) then rope, in float64 with no rounding between them."""
    x = np.asarray(x, np.float64)
    n = rms_norm_ref(x, w, eps, offset) if w is not None else x
    return rope_ref(n, pos, **kw)[0], n


def check_close(got, ref, dtype_name):
    """lmk.h's attn_prologue precision: f32 1e-5 * max(1, |ref|); bf16/f16 one ulp plus 1e-6."""
    got = np.asarray(got, np.float64)
    if dtype_name == "float32":
        tol = 1e-5 * np.maximum(1.0, np.abs(ref))
    else:
        tol = ulp(ref, dtype_name) + 1e-6
    err = np.abs(got - ref)
    assert (err <= tol).all(), "max error %g at %s" % (err.max(), np.unravel_index(err.argmax(), err.shape))


def make_case(rng, name, H, Hk, D, kw, offset, T, dtype):
    q = rng.uniform(-2, 2, (T, H, D)).astype(dtype)
    k = rng.uniform(-2, 2, (T, Hk, D)).astype(dtype)
    v = rng.uniform(-2, 2, (T, Hk, D)).astype(dtype)
    wq = wk = None
    if offset is not None:
        lo = -0.5 if offset else 0.5
        wq = rng.uniform(lo, lo + 1.0, D).astype(dtype)
        wk = rng.uniform(lo, lo + 1.0, D).astype(dtype)
    return q, k, v, wq, wk, positions_for(rng, kw["mode"], T)


@pytest.mark.skipif(HAS, reason="this liblmk has lmk_attn_prologue")
def test_missing_symbol_raises_lmk_error():
    z = np.zeros((1, 1, 2), np.float32)
    with pytest.raises(lmk.LmkError, match="no attn_prologue") as e:
        lmk.attn_prologue(z, z, np.zeros(1, np.int32))
    assert e.value.status == "LMK_ERR_UNSUPPORTED"


@needs_prologue
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("name,H,Hk,D,kw,offset", CASES, ids=[c[0] for c in CASES])
def test_prologue_vs_reference(rng, name, H, Hk, D, kw, offset, dtype):
    T, n_slots, eps = 6, 16, 1e-6
    q, k, v, wq, wk, pos = make_case(rng, name, H, Hk, D, kw, offset, T, dtype)
    q0, k0, v0 = q.copy(), k.copy(), v.copy()
    slots = rng.permutation(n_slots)[:T].astype(np.int64)
    slots[1], slots[4] = -1, n_slots + 3  # padding: both write nothing
    kc = np.full((n_slots, Hk, D), 5.0, dtype)
    vc = np.full((n_slots, Hk, D), 5.0, dtype)
    qo, ko = lmk.attn_prologue(q, k, pos, v=v, q_norm_w=wq, k_norm_w=wk, eps=eps, weight_offset=offset or 0.0,
                               slots=slots, k_cache=kc, v_cache=vc, k_out=np.empty_like(k), **kw)
    dname = np.dtype(dtype).name
    q_ref, qn = chain_ref(q, wq, pos, eps, offset or 0.0, kw)
    k_ref, kn = chain_ref(k, wk, pos, eps, offset or 0.0, kw)
    check_close(qo, q_ref, dname)
    check_close(ko, k_ref, dname)
    if offset is None:  # no norm: the elements outside the rotated pairs are bit copies
        rot = rotated_mask(kw["mode"], kw.get("pairing", "half_rope"), kw.get("rope_dim") or D, D)
        assert qo[..., ~rot].tobytes() == q[..., ~rot].tobytes()
    live = [i for i in range(T) if 0 <= slots[i] < n_slots]
    assert kc[slots[live]].tobytes() == ko[live].tobytes()  # the cache holds exactly k_out's values
    assert vc[slots[live]].tobytes() == v[live].tobytes()
    untouched = np.setdiff1d(np.arange(n_slots), slots[live])
    assert np.all(kc[untouched] == 5.0) and np.all(vc[untouched] == 5.0)
    assert q.tobytes() == q0.tobytes() and k.tobytes() == k0.tobytes() and v.tobytes() == v0.tobytes()


@needs_prologue
def test_prologue_cache_only_and_hf_positions(rng):
    """k_out None with a cache: k goes only to the cache and None is returned. (3, T) positions = (4, T), e = t."""
    T, H, Hk, D = 5, 4, 2, 64
    kw = dict(mode="imrope", sections=[8, 8, 8], rope_dim=48, freq_base=1e7)
    q, k, v, wq, wk, _ = make_case(rng, "", H, Hk, D, kw, 1.0, T, np.float32)
    pos3 = rng.integers(0, 4000, size=(3, T)).astype(np.int32)
    pos4 = np.concatenate([pos3, pos3[:1]])
    slots = np.arange(T, dtype=np.int32)[::-1].copy()
    kc, vc = np.zeros((8, Hk, D), np.float32), np.zeros((8, Hk, D), np.float32)
    qo, ko = lmk.attn_prologue(q, k, pos3, v=v, q_norm_w=wq, k_norm_w=wk, weight_offset=1.0, slots=slots,
                               k_cache=kc, v_cache=vc, **kw)
    assert ko is None
    want_q, want_k = lmk.attn_prologue(q, k, pos4, q_norm_w=wq, k_norm_w=wk, weight_offset=1.0, **kw)
    assert qo.tobytes() == want_q.tobytes()
    assert kc[slots].tobytes() == want_k.tobytes() and vc[slots].tobytes() == v.tobytes()


@needs_prologue
def test_prologue_in_place_strided_and_paged(rng):
    """q, k, v inside one packed QKV row, rotated in place; a [n_blocks, block, 2, Hk, D] K|V cache whose k and
    v halves are strided paged views, passed as [n_blocks, block_size, Hk, D]."""
    T, H, Hk, D, blocks, bs = 6, 4, 2, 64, 3, 4
    kw = dict(mode="neox", freq_base=1e6)
    qkv = rng.uniform(-2, 2, (T, (H + 2 * Hk) * D)).astype(np.float32)
    orig = qkv.copy()
    q = qkv[:, :H * D].reshape(T, H, D)
    k = qkv[:, H * D:(H + Hk) * D].reshape(T, Hk, D)
    v = qkv[:, (H + Hk) * D:].reshape(T, Hk, D)
    wq, wk = rng.uniform(0.5, 1.5, D).astype(np.float32), rng.uniform(0.5, 1.5, D).astype(np.float32)
    kv = np.full((blocks, bs, 2, Hk, D), -3.0, np.float32)
    kc, vc = kv[:, :, 0], kv[:, :, 1]
    assert np.shares_memory(kc, kv) and not kc.flags.c_contiguous
    slots = np.array([0, 5, 6, 11, 2, 9], np.int32)
    pos = positions_for(rng, "neox", T)
    want_q, want_k = lmk.attn_prologue(q.copy(), k.copy(), pos, q_norm_w=wq, k_norm_w=wk, **kw)
    res = lmk.attn_prologue(q, k, pos, v=v, q_norm_w=wq, k_norm_w=wk, slots=slots, k_cache=kc, v_cache=vc,
                            q_out=q, k_out=k, **kw)
    assert res[0] is q and res[1] is k
    assert q.tobytes() == want_q.tobytes() and k.tobytes() == want_k.tobytes()
    assert qkv[:, (H + Hk) * D:].tobytes() == orig[:, (H + Hk) * D:].tobytes()  # v untouched
    rows = kv.reshape(blocks * bs, 2, Hk, D)
    assert rows[slots, 0].tobytes() == want_k.tobytes()
    assert rows[slots, 1].tobytes() == orig[:, (H + Hk) * D:].reshape(T, Hk, D).tobytes()
    others = np.setdiff1d(np.arange(blocks * bs), slots)
    assert np.all(rows[others] == -3.0)


@needs_prologue
def test_prologue_errors_write_nothing(rng):
    T, H, Hk, D = 4, 2, 1, 32
    q, k, v, wq, wk, pos = make_case(rng, "", H, Hk, D, dict(mode="neox"), 0.0, T, np.float32)
    slots = np.arange(T, dtype=np.int32)
    kc, vc = np.full((T, Hk, D), 7.0, np.float32), np.full((T, Hk, D), 7.0, np.float32)
    q_out = np.full_like(q, 9.0)

    def rejected(exc, match, **kw):
        args = dict(q_norm_w=wq, k_norm_w=wk, slots=slots, k_cache=kc, v=v, v_cache=vc, q_out=q_out)
        args.update(kw)
        with pytest.raises(exc, match=match):
            lmk.attn_prologue(q, k, pos, **args)
        assert np.all(q_out == 9.0) and np.all(kc == 7.0) and np.all(vc == 7.0)

    rejected(lmk.LmkError, "eps", eps=0.0)
    rejected(lmk.LmkError, "slots", slots=None)
    rejected(lmk.LmkError, "v", v=None)                       # v_cache without v_in
    rejected(lmk.LmkError, "k_cache", k_cache=np.full((T, Hk, D), 7.0, np.float16))
    rejected(lmk.LmkError, "q_norm_w", q_norm_w=wq[:-1])
    rejected(lmk.LmkError, "rope_dim", rope_dim=5)
    rejected(ValueError, "v needs v_cache", v_cache=None)
    rejected(TypeError, "rope_dimm", rope_dimm=8)
    rejected(ValueError, "k_cache", k_cache=np.zeros((2, 3, Hk, D), np.float32)[:, ::2])


# ---- torch ----

def _torch():
    return pytest.importorskip("torch")


def _has_cuda():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available() and any(d["backend"] == "cuda" for d in lmk.devices())


cuda_only = pytest.mark.skipif(not _has_cuda(), reason="no CUDA GPU visible to torch (or a liblmk without CUDA)")


def _devices():
    return ["cpu", pytest.param("cuda", marks=cuda_only)]


def f8_ulp(y):
    """One OCP E4M3FN ulp at |y| (3 mantissa bits; subnormal spacing 2^-9)."""
    e = np.floor(np.log2(np.maximum(np.abs(y), 2.0 ** -6)))
    return 2.0 ** (e - 3)


@needs_prologue
@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("f8", [False, True], ids=["bf16_cache", "f8_cache"])
def test_prologue_torch_bf16(rng, device, f8):
    torch = _torch()
    if f8 and not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this torch has no float8_e4m3fn")
    T, H, Hk, D, n_slots = 7, 6, 2, 256, 12
    kw = dict(mode="imrope", sections=[11, 11, 10], rope_dim=64, freq_base=1e7)
    q, k, v, wq, wk, pos = make_case(rng, "", H, Hk, D, kw, 1.0, T, np.float32)
    t = {n: torch.from_numpy(a).to(torch.bfloat16).to(device) for n, a in
         dict(q=q, k=k, v=v, wq=wq, wk=wk).items()}
    tpos = torch.from_numpy(pos).to(device)
    slots = torch.from_numpy(rng.permutation(n_slots)[:T].astype(np.int64)).to(device)
    cdt = torch.float8_e4m3fn if f8 else torch.bfloat16
    kc = torch.zeros(n_slots, Hk, D, dtype=cdt, device=device)
    vc = torch.zeros(n_slots, Hk, D, dtype=cdt, device=device)
    ks, vs = (4.0, 0.5) if f8 else (1.0, 1.0)
    qo, ko = lmk.attn_prologue(t["q"], t["k"], tpos, v=t["v"], q_norm_w=t["wq"], k_norm_w=t["wk"],
                               weight_offset=1.0, slots=slots, k_cache=kc, v_cache=vc, k_scale=ks, v_scale=vs,
                               k_out=torch.empty_like(t["k"]), **kw)
    assert isinstance(qo, torch.Tensor) and qo.device == t["q"].device
    np64 = {n: x.double().cpu().numpy() for n, x in t.items()}
    q_ref = chain_ref(np64["q"], np64["wq"], pos, 1e-6, 1.0, kw)[0]
    k_ref = chain_ref(np64["k"], np64["wk"], pos, 1e-6, 1.0, kw)[0]
    check_close(qo.double().cpu().numpy(), q_ref, "bfloat16")
    check_close(ko.double().cpu().numpy(), k_ref, "bfloat16")
    s = slots.cpu().numpy()
    kcached = kc.cpu()[s].double().numpy()
    vcached = vc.cpu()[s].double().numpy()
    if f8:  # quantised from the f32 result: within one f8 ulp of the float64 chain times 1 / scale (lmk.h)
        kinv, vinv = float(np.float32(1.0) / np.float32(ks)), float(np.float32(1.0) / np.float32(vs))
        assert (np.abs(kcached - k_ref * kinv) <= f8_ulp(k_ref * kinv)).all()
        assert (np.abs(vcached - np64["v"] * vinv) <= f8_ulp(np64["v"] * vinv)).all()
    else:
        assert np.array_equal(kcached, ko.double().cpu().numpy()) and np.array_equal(vcached, np64["v"])


@needs_prologue
@pytest.mark.parametrize("device", _devices())
def test_prologue_torch_op_compiled_equals_eager(rng, device):
    torch = _torch()
    import lmk.torch_ops  # noqa: F401
    T, H, Hk, D, n_slots = 4, 8, 2, 128, 8
    kw = dict(mode="neox", freq_base=1e6)
    q, k, v, wq, wk, pos = make_case(rng, "", H, Hk, D, kw, 0.0, T, np.float32)
    t = {n: torch.from_numpy(a).to(torch.float16).to(device) for n, a in dict(q=q, k=k, v=v, wq=wq, wk=wk).items()}
    tpos = torch.from_numpy(pos).to(device)
    slots = torch.tensor([3, 0, 6, 5], dtype=torch.int32, device=device)

    def layer(q, k, v, kc, vc):
        q2, _ = lmk.attn_prologue(q, k, tpos, v=v, q_norm_w=t["wq"], k_norm_w=t["wk"], slots=slots, k_cache=kc,
                                  v_cache=vc, **kw)
        return q2 * 1

    caches = [torch.zeros(n_slots, Hk, D, dtype=torch.float16, device=device) for _ in range(4)]
    want = layer(t["q"], t["k"], t["v"], caches[0], caches[1])
    torch._dynamo.reset()
    got = torch.compile(layer, fullgraph=True)(t["q"], t["k"], t["v"], caches[2], caches[3])
    assert torch.equal(got, want)
    assert torch.equal(caches[2], caches[0]) and torch.equal(caches[3], caches[1])  # the cache writes landed
    assert caches[0].abs().sum() > 0


@needs_prologue
@cuda_only
def test_prologue_cuda_graph_replay(rng):
    torch = _torch()
    T, H, Hk, D, n_slots = 3, 8, 2, 128, 16
    kw = dict(mode="neox", freq_base=1e6)
    q, k, v, wq, wk, pos = make_case(rng, "", H, Hk, D, kw, 0.0, T, np.float32)
    t = {n: torch.from_numpy(a).to(torch.bfloat16).cuda() for n, a in dict(q=q, k=k, v=v, wq=wq, wk=wk).items()}
    tpos = torch.from_numpy(pos).cuda()
    slots = torch.tensor([1, 2, 3], dtype=torch.int64, device="cuda")
    kc = torch.zeros(n_slots, Hk, D, dtype=torch.bfloat16, device="cuda")
    vc = torch.zeros_like(kc)
    q_out = torch.empty_like(t["q"])

    def step():
        lmk.attn_prologue(t["q"], t["k"], tpos, v=t["v"], q_norm_w=t["wq"], k_norm_w=t["wk"], slots=slots,
                          k_cache=kc, v_cache=vc, q_out=q_out, **kw)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        step()
    for step_i in range(3):  # decode: each replay writes the next cache rows
        slots.copy_(torch.tensor([4 + 3 * step_i, 5 + 3 * step_i, 6 + 3 * step_i]))
        tpos.add_(1)
        g.replay()
        torch.cuda.synchronize()
        want_q, want_k = lmk.attn_prologue(t["q"], t["k"], tpos, q_norm_w=t["wq"], k_norm_w=t["wk"], **kw)
        torch.cuda.synchronize()
        assert torch.equal(q_out, want_q)
        assert torch.equal(kc[slots], want_k) and torch.equal(vc[slots], t["v"])
