"""test_model_example.py - examples/qwen35_lmk.py's check at a tiny size: a Qwen3.5 text model (Hugging Face
transformers >= 5, random weights) whose full-attention prologue is one lmk.attn_prologue call must give the
unmodified model's logits (f32: ||diff|| / ||ref|| < 1e-4) in prefill, with multimodal positions that differ per
rope axis, and through the KV cache in decode; wrong rope / norm parameters must be caught; switching lmk off
must give Hugging Face's forward back. CPU always, CUDA when torch and liblmk have it. Skipped, with the reason
shown, when torch or transformers (>= 5) is missing or liblmk has no attn_prologue."""
import importlib.util
import pathlib

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the model example needs it)")
pytest.importorskip("transformers", reason="transformers is not installed (the model example needs >= 5)")
import lmk  # noqa: E402

if not lmk.has_attn_prologue():
    pytest.skip("this liblmk has no lmk_attn_prologue", allow_module_level=True)

_PATH = pathlib.Path(__file__).resolve().parents[2] / "examples" / "qwen35_lmk.py"
_spec = importlib.util.spec_from_file_location("qwen35_lmk", _PATH)
ex = importlib.util.module_from_spec(_spec)
try:
    _spec.loader.exec_module(ex)
except ImportError as e:  # transformers < 5: no Qwen3.5
    pytest.skip(str(e), allow_module_level=True)

HAS_CUDA = torch.cuda.is_available() and any(d["backend"] == "cuda" for d in lmk.devices())
NO_CUDA = ("no CUDA GPU visible to torch" if not torch.cuda.is_available()
           else "this liblmk has no CUDA backend (%s)" % lmk.build_info())
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason=NO_CUDA))]
# (name, head_dim, q heads, kv heads, mrope_section): the released models' rope geometry (rope_dim 64, sections
# summing to its 32 pairs) and a smaller head whose sections also cover its 8 pairs exactly.
SHAPES = [("hd256", 256, 4, 2, (11, 11, 10)), ("hd64", 64, 4, 1, (3, 3, 2))]
B, T = 2, 24


@pytest.fixture
def seed(rng):
    return int(rng.integers(1 << 30))


def tiny(shape, seed, device, dtype=torch.float32):
    _, head_dim, heads, kv_heads, sections = shape
    cfg = ex.qwen35_config(layers=4, full_every=2, hidden=64, intermediate=128, heads=heads, kv_heads=kv_heads,
                           head_dim=head_dim, vocab=512, linear_heads=2, linear_head_dim=32, mrope_section=sections,
                           attn="eager")
    model = ex.build_model(cfg, seed, device, dtype)
    gen = torch.Generator().manual_seed(seed + 7)
    ids = torch.randint(cfg.vocab_size, (B, T), generator=gen).to(device)
    return model, ids, gen


def axis_positions(gen, device):
    """(3, B, T) t/h/w positions that differ per axis (as an image's grid does), so the sections matter."""
    return torch.randint(0, 4096, (3, B, T), generator=gen).to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=[s[0] for s in SHAPES])
def test_prefill_logits_match(shape, device, seed):
    model, ids, _ = tiny(shape, seed, device)
    ref, got, max_abs, rel, calls = ex.compare(model, ids)
    assert calls == 2, "lmk ran %d times for 2 full-attention layers" % calls
    assert torch.isfinite(got).all() and ref.abs().max() > 0
    assert rel < ex.F32_REL, "f32 logits: rel %.3g, max |diff| %.3g (seed %d)" % (rel, max_abs, seed)


@pytest.mark.parametrize("device", DEVICES)
def test_prefill_logits_match_bf16(device, seed):
    model, ids, _ = tiny(SHAPES[0], seed, device, torch.bfloat16)
    _, _, max_abs, rel, calls = ex.compare(model, ids)
    assert calls == 2
    assert rel < ex.BF16_REL, "bf16 logits: rel %.3g, max |diff| %.3g (seed %d)" % (rel, max_abs, seed)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=[s[0] for s in SHAPES])
def test_per_axis_positions_match(shape, device, seed):
    model, ids, gen = tiny(shape, seed, device)
    pos = axis_positions(gen, device)
    text = ex.forward_logits(model, ids, position_ids=pos[0])
    ref, _, max_abs, rel, calls = ex.compare(model, ids, position_ids=pos)
    assert ex.rel_diff(text, ref)[1] > 1e-3, "per-axis positions changed nothing: the test would prove nothing"
    assert calls == 2
    assert rel < ex.F32_REL, "f32 logits, per-axis positions: rel %.3g, max |diff| %.3g (seed %d)" % (rel, max_abs,
                                                                                                      seed)


@pytest.mark.parametrize("override", [dict(weight_offset=0.0), dict(freq_base=1e6), dict(sections=[32, 0, 0]),
                                      dict(mode="mrope"), dict(rope_dim=32)], ids=lambda o: next(iter(o)))
def test_wrong_parameters_are_caught(override, seed):
    """The comparison is sharp enough to see a wrong norm offset, base, section split (every pair reading t),
    section layout (mrope's contiguous sections instead of interleaved) or rotated width. (A split that moves only
    the slowest pairs to another axis, e.g. [11, 10, 11], changes angles by < 1e-3 rad: below a logit check.)"""
    model, ids, gen = tiny(SHAPES[0], seed, "cpu")
    _, _, _, rel, calls = ex.compare(model, ids, position_ids=axis_positions(gen, "cpu"),
                                     switch=ex.LmkPrologue(model, **override))
    assert calls == 2
    assert rel > 100 * ex.F32_REL, "%s went unnoticed: rel %.3g" % (override, rel)


@pytest.mark.parametrize("device", DEVICES)
def test_decode_through_cache_matches(device, seed):
    model, ids, _ = tiny(SHAPES[0], seed, device)
    steps = 6
    hf_tok, hf_logits, _ = ex.greedy(model, ids, steps)
    with ex.LmkPrologue(model) as switch:
        _, lmk_logits, _ = ex.greedy(model, ids, steps, force=hf_tok)
    assert switch.calls == 2 * steps, "lmk ran %d times in %d forwards of 2 layers" % (switch.calls, steps)
    _, rel = ex.rel_diff(torch.stack(lmk_logits), torch.stack(hf_logits))
    assert rel < ex.F32_REL, "decode logits through the KV cache: rel %.3g (seed %d)" % (rel, seed)


def test_disable_gives_hugging_face_back(seed):
    model, ids, _ = tiny(SHAPES[1], seed, "cpu")
    before = ex.forward_logits(model, ids)
    switch = ex.LmkPrologue(model)
    with switch:
        assert all("forward" in vars(a) for a in switch.layers)
        ex.forward_logits(model, ids)
    assert not any("forward" in vars(a) for a in switch.layers)
    assert torch.equal(ex.forward_logits(model, ids), before)
    assert switch.calls == 2
