"""test_torch.py - lmk on PyTorch tensors: CPU always, CUDA when a GPU is present. rope in f32/f16/bf16 against
the float64 reference of ref.py, repeat_heads bit-exact (any element type, float8 included), strided views used
in place, the caller's current CUDA stream (and no synchronisation), the torch.ops.lmk custom ops (opcheck,
torch.compile(fullgraph=True) equal to eager, CUDA graph capture + replay equal to eager)."""
import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
import lmk  # noqa: E402
import lmk.torch_ops  # noqa: E402,F401  (registers torch.ops.lmk.*)
from ref import repeat_ref, rope_ref, rope_tolerance, rotated_mask  # noqa: E402

HAS_CUDA = torch.cuda.is_available() and any(d["backend"] == "cuda" for d in lmk.devices())
NO_CUDA = ("no CUDA GPU visible to torch" if not torch.cuda.is_available()
           else "this liblmk has no CUDA backend (%s)" % lmk.build_info())
cuda_only = pytest.mark.skipif(not HAS_CUDA, reason=NO_CUDA)
DEVICES = ["cpu", pytest.param("cuda", marks=cuda_only)]
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

ROPE_CASES = [
    ("qwen35_imrope", 256, 6, 2, dict(mode="imrope", sections=[11, 11, 10], rope_dim=64, freq_base=1e7)),
    ("llama3_neox", 128, 4, 2, dict(mode="neox", freq_base=500000.0)),
    ("gptj_normal", 256, 4, 1, dict(mode="normal", rope_dim=64)),
    ("qwen2vl_mrope", 128, 4, 2, dict(mode="mrope", sections=[16, 24, 24], freq_base=1e6)),
    ("qwen2vl_vision", 80, 4, 4, dict(mode="vision", sections=[20, 20])),
    ("yarn", 128, 4, 2, dict(mode="neox", freq_scale=0.25, ext_factor=1.0, n_ctx_orig=4096, freq_base=1e6)),
]
MULTI = ("mrope", "imrope", "vision")


def positions_for(gen, mode, T, device, dtype=torch.int32):
    shape = (4, T) if mode in MULTI else (T,)
    return torch.randint(0, 1 << 15, shape, generator=gen, dtype=torch.int64).to(dtype).to(device)


@pytest.fixture
def gen(rng):
    return torch.Generator().manual_seed(int(rng.integers(1 << 62)))


def inputs(gen, shape, dtype, device):
    return (torch.rand(shape, generator=gen, dtype=torch.float64) * 4 - 2).to(dtype).to(device)


def assert_rope(out, x, pos, kw):
    """Rotated elements within lmk.h's tolerance of the float64 reference; the others bit-identical."""
    D = x.shape[-1]
    ref, m = rope_ref(x.double().cpu().numpy(), pos.cpu().numpy(), **kw)
    rot = torch.from_numpy(rotated_mask(kw.get("mode", "neox"), kw.get("pairing", "half_rope"),
                                        kw.get("rope_dim") or D, D))
    name = str(out.dtype).replace("torch.", "")
    tol = torch.as_tensor(rope_tolerance(ref, name, m), dtype=torch.float64)
    err = (out.double().cpu() - torch.from_numpy(ref)).abs()
    bad = (err > tol)[..., rot]
    assert not bad.any(), "max error %g" % err[..., rot].max().item()
    assert same_bits(out.cpu()[..., ~rot], x.cpu()[..., ~rot])


def same_bits(a, b):
    a, b = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    return a.shape == b.shape and a.dtype == b.dtype and a.view(torch.uint8).equal(b.view(torch.uint8))


# ---- rope ----

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("name,D,H,Hk,kw", ROPE_CASES, ids=[c[0] for c in ROPE_CASES])
def test_rope_vs_reference(gen, device, dtype, name, D, H, Hk, kw):
    T = 9
    q, k = inputs(gen, (T, H, D), DTYPES[dtype], device), inputs(gen, (T, Hk, D), DTYPES[dtype], device)
    pos = positions_for(gen, kw["mode"], T, device)
    qo, ko = lmk.rope(q, pos, k=k, **kw)
    assert isinstance(qo, torch.Tensor) and qo.device == q.device and qo.dtype == q.dtype and qo.shape == q.shape
    assert_rope(qo, q, pos, kw)
    assert_rope(ko, k, pos, kw)
    assert same_bits(lmk.rope(q, pos, **kw), qo)


@pytest.mark.parametrize("device", DEVICES)
def test_rope_strided_q_gate_in_place(gen, device):
    """q = qg.view(T, H, 2D)[..., :D] of a [q | gate] projection, rotated in place inside qg."""
    T, H, D = 7, 4, 128
    qg = inputs(gen, (T, H * 2 * D), torch.bfloat16, device)
    orig = qg.clone()
    q = qg.view(T, H, 2 * D)[..., :D]
    assert q.stride() == (2 * H * D, 2 * D, 1)
    pos = positions_for(gen, "imrope", T, device)
    kw = dict(mode="imrope", sections=[11, 11, 10], rope_dim=64, freq_base=1e7)
    res = lmk.rope(q, pos, out=q, **kw)
    assert res is q and res.data_ptr() == qg.data_ptr()
    assert same_bits(qg.view(T, H, 2 * D)[..., D:], orig.view(T, H, 2 * D)[..., D:])  # gate untouched
    assert_rope(qg.view(T, H, 2 * D)[..., :D], orig.view(T, H, 2 * D)[..., :D], pos, kw)


@pytest.mark.parametrize("device", DEVICES)
def test_rope_hf_positions_and_out(gen, device):
    T, H, D = 6, 2, 64
    q = inputs(gen, (T, H, D), torch.float32, device)
    pos3 = positions_for(gen, "mrope", T, device, torch.int64)[:3]
    kw = dict(mode="mrope", sections=[8, 12, 12])
    want = lmk.rope(q, torch.cat([pos3, pos3[:1]]), **kw)
    out = torch.full_like(q, float("nan"))
    assert lmk.rope(q, pos3, out=out, **kw) is out
    assert same_bits(out, want)


@cuda_only
def test_rope_positions_on_another_device_rejected(gen):
    q = inputs(gen, (3, 2, 16), torch.float32, "cuda")
    with pytest.raises(ValueError, match="positions is on cpu but q is on cuda"):
        lmk.rope(q, torch.arange(3, dtype=torch.int32))


# ---- repeat_heads ----

REPEAT_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int8, torch.bool, torch.float64, torch.int64]
if hasattr(torch, "float8_e4m3fn"):
    REPEAT_DTYPES.append(torch.float8_e4m3fn)


def random_bits(gen, shape, dtype, device):
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool().to(device)
    size = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, tuple(shape) + (size,), generator=gen, dtype=torch.int64).to(torch.uint8)
    return raw.view(dtype).reshape(shape).to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", REPEAT_DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["tiled", "block"])
def test_repeat_heads_bit_exact(gen, device, dtype, layout):
    T, Hg, h, K = 5, 4, 24, 64
    x = random_bits(gen, (T, Hg, K), dtype, device)
    out = lmk.repeat_heads(x, h, layout=layout)
    assert out.device == x.device and out.dtype == x.dtype
    idx = torch.arange(h) % Hg if layout == "tiled" else torch.arange(h) // (h // Hg)
    assert same_bits(out, x.cpu()[:, idx])
    if layout == "block":
        assert same_bits(out, x.repeat_interleave(h // Hg, dim=1))


@pytest.mark.parametrize("device", DEVICES)
def test_repeat_heads_strided_in_and_out(gen, device):
    T, H, Hk, K = 4, 8, 2, 32
    qkv = random_bits(gen, (T, (H + 2 * Hk) * K), torch.float16, device)
    v = qkv[:, (H + Hk) * K:].view(T, Hk, K)
    dst = torch.zeros(T, H, 2 * K, dtype=torch.float16, device=device)
    res = lmk.repeat_heads(v, H, layout="block", out=dst[..., K:])
    assert res.data_ptr() == dst.data_ptr() + K * 2
    assert same_bits(dst[..., K:], torch.from_numpy(repeat_ref(v.cpu().numpy(), H, "block")))
    assert not dst[..., :K].any()


# ---- the custom ops ----

def rope_case(gen, device, dtype=torch.bfloat16, T=5):
    H, Hk, D = 6, 2, 256
    kw = dict(mode="imrope", sections=[11, 11, 10], rope_dim=64, freq_base=1e7)
    return (inputs(gen, (T, H, D), dtype, device), inputs(gen, (T, Hk, D), dtype, device),
            positions_for(gen, "imrope", T, device), kw)


@pytest.mark.parametrize("device", DEVICES)
def test_custom_ops_eager_equal_lmk(gen, device):
    q, k, pos, kw = rope_case(gen, device)
    want_q, want_k = lmk.rope(q, pos, k=k, **kw)
    out, k_out = torch.empty_like(q), torch.empty_like(k)
    assert torch.ops.lmk.rope(q, pos, out, k=k, k_out=k_out, rope_mode="imrope", sections=[11, 11, 10],
                              rope_dim=64, freq_base=1e7) is None
    assert same_bits(out, want_q) and same_bits(k_out, want_k)
    got_q, got_k = lmk.torch_ops.rope(q, pos, k=k, **kw)
    assert same_bits(got_q, want_q) and same_bits(got_k, want_k)
    x = k.clone()
    out = torch.empty(5, 6, 256, dtype=x.dtype, device=device)
    torch.ops.lmk.repeat_heads(x, 6, out, layout="block")
    assert same_bits(out, x.repeat_interleave(3, dim=1))
    assert same_bits(lmk.torch_ops.repeat_heads(x, 6), lmk.repeat_heads(x, 6))


@pytest.mark.parametrize("device", DEVICES)
def test_custom_ops_opcheck(gen, device):
    q, k, pos, _ = rope_case(gen, device, torch.float32)
    kw = dict(rope_mode="imrope", sections=[11, 11, 10], rope_dim=64, freq_base=1e7)
    torch.library.opcheck(torch.ops.lmk.rope.default, (q, pos, torch.empty_like(q)), kw)
    torch.library.opcheck(torch.ops.lmk.rope.default, (q, pos, torch.empty_like(q)),
                          dict(kw, k=k, k_out=torch.empty_like(k)))
    torch.library.opcheck(torch.ops.lmk.repeat_heads.default, (k, 6, torch.empty(5, 6, 256, device=device)),
                          {"layout": "tiled"})


def _layer(q, k, pos):
    """A function of the kind a model compiles: rope of q and k, the GQA broadcast, then torch ops."""
    q2, k2 = lmk.rope(q, pos, k=k, mode="imrope", sections=[11, 11, 10], rope_dim=64, freq_base=1e7)
    kk = lmk.repeat_heads(k2, q.shape[1], layout="block")
    return q2 * 2, kk + 1


def _layer_in_place(q, k, pos):
    torch.ops.lmk.rope(q, pos, q, k=k, k_out=k, rope_mode="imrope", sections=[11, 11, 10], rope_dim=64,
                       freq_base=1e7)
    return q + 0, k * 1


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph_equals_eager(gen, device):
    q, k, pos, _ = rope_case(gen, device)
    torch._dynamo.reset()
    want = _layer(q, k, pos)
    got = torch.compile(_layer, fullgraph=True)(q, k, pos)
    assert all(same_bits(a, b) for a, b in zip(got, want))
    qa, ka, qb, kb = q.clone(), k.clone(), q.clone(), k.clone()
    want = _layer_in_place(qa, ka, pos)
    got = torch.compile(_layer_in_place, fullgraph=True)(qb, kb, pos)
    assert all(same_bits(a, b) for a, b in zip(got, want))
    assert same_bits(qa, qb) and same_bits(ka, kb)  # the in-place writes reached the caller's tensors


# ---- CUDA: the caller's stream, no synchronisation, graph capture ----

@cuda_only
def test_cuda_runs_on_current_stream_without_sync(gen):
    q, k, pos, kw = rope_case(gen, "cuda", torch.float32, T=64)
    q_new = inputs(gen, q.shape, torch.float32, "cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: device opened, side stream wrapped
        lmk.rope(q, pos, **kw)
    side.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # keeps the side stream busy for a while
        q.copy_(q_new)                  # ordered after the sleep, on the side stream only
        out = lmk.rope(q, pos, **kw)    # must run on the side stream (after the copy), not block
        still_busy = not side.query()
    side.synchronize()
    assert still_busy, "lmk.rope returned only after the stream had finished: it synchronised"
    assert_rope(out, q_new, pos, kw)


@cuda_only
def test_cuda_graph_capture_and_replay(gen):
    q, k, pos, kw = rope_case(gen, "cuda", torch.bfloat16, T=16)
    pos3 = pos[:3].clone()
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    x_out = torch.empty(16, 6, 256, dtype=q.dtype, device="cuda")

    def step():
        lmk.rope(q, pos3, k=k, out=q_out, k_out=k_out, **kw)
        lmk.repeat_heads(k_out, 6, layout="tiled", out=x_out)
        torch.ops.lmk.rope(q_out, pos3, q_out, rope_mode="imrope", sections=[11, 11, 10], rope_dim=64,
                           freq_base=1e7)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # warm-up on the capture stream
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        step()
    for _ in range(2):  # new inputs and positions between replays
        q.copy_(inputs(gen, q.shape, q.dtype, "cuda"))
        k.copy_(inputs(gen, k.shape, k.dtype, "cuda"))
        pos3.copy_(positions_for(gen, "imrope", 16, "cuda")[:3])
        g.replay()
        torch.cuda.synchronize()
        p4 = torch.cat([pos3, pos3[:1]])
        wq, wk = lmk.rope(q, p4, k=k, **kw)
        wq = lmk.rope(wq, p4, **kw)
        torch.cuda.synchronize()
        assert same_bits(q_out, wq) and same_bits(k_out, wk)
        assert same_bits(x_out, lmk.repeat_heads(wk, 6))


@cuda_only
def test_cuda_graph_on_a_stream_first_seen_in_the_capture(gen):
    """A capture on a stream lmk has not seen before, so the package wraps it inside the capture (as with
    torch.cuda.graph(g) without stream=, on torch's own capture stream): the wrap must not invalidate it.
    The stream is a new one, so that no earlier test can have wrapped it already."""
    q, k, pos, kw = rope_case(gen, "cuda", torch.bfloat16, T=16)
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        lmk.rope(q, pos, k=k, out=q_out, k_out=k_out, **kw)  # warm-up on another stream
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=torch.cuda.Stream()):
        lmk.rope(q, pos, k=k, out=q_out, k_out=k_out, **kw)
    q_out.fill_(float("nan"))
    k_out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    wq, wk = lmk.rope(q, pos, k=k, **kw)
    torch.cuda.synchronize()
    assert same_bits(q_out, wq) and same_bits(k_out, wk)


@cuda_only
def test_cuda_compiled_function_in_graph(gen):
    q, k, pos, _ = rope_case(gen, "cuda", torch.float16, T=8)
    torch._dynamo.reset()
    f = torch.compile(_layer, fullgraph=True)
    want = _layer(q, k, pos)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        f(q, k, pos)  # compile and warm up on the capture stream
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        got = f(q, k, pos)
    g.replay()
    torch.cuda.synchronize()
    assert all(same_bits(a, b) for a, b in zip(got, want))


@pytest.mark.skipif(not HAS_CUDA or torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_cuda_other_device_keeps_current_device(gen):
    torch.cuda.set_device(0)
    q = inputs(gen, (3, 2, 16), torch.float32, "cuda:1")
    out = lmk.rope(q, torch.arange(3, dtype=torch.int32, device="cuda:1"))
    assert out.device == q.device and torch.cuda.current_device() == 0
    assert_rope(out, q, torch.arange(3), dict(mode="neox"))
