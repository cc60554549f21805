"""hf_compare.py - lmk against Hugging Face transformers on the same tensors, on one CUDA GPU.

Part 1, accuracy. For each case the same inputs go to Hugging Face's own modules (the model's rotary
embedding class and apply_rotary_pos_emb; for the attention prologue its RMSNorm too, with q split from the
projection as the model does) and to lmk through its Python package, which reads the torch tensors in place
(q straight from the [q | gate] projection as a strided view). Three numbers per case:
    lmk-HF   max |lmk - HF|
    HF err   max |HF - ref|      ref: float64 rope of the same inputs with float64 angles computed from
    lmk err  max |lmk - ref|          HF's own inv_freq and attention_scaling (and a float64 norm)
so a difference between lmk and HF is explained by whichever of the two sits far from ref. "f32 angle"
is HF's own angle error: max |fl32(pos * inv_freq) - pos * inv_freq| over the case's positions.

Part 2, speed (--bench): HF eager, HF under torch.compile and lmk on prefill shapes (T=4106, bf16), with
lmk's speed-up over each, timed twice: calls from Python by triton.testing.do_bench (median of CUDA-event
timings, L2 flushed before each call), where a call whose host work (Python, dispatch, lmk's validation)
outlasts its kernels is timed by its host work; and replays of a CUDA graph of each call by
triton.testing.do_bench_cudagraph (the kernels alone, back to back, as an engine that captures its step
runs them).

Run from the repository root after `make`:  PYTHONPATH=python LMK_LIBRARY=build/liblmk.so python3 bench/hf_compare.py [--bench]
"""
import argparse
import math
import sys

import torch

import lmk

DEV = "cuda"


def cfg_kwargs(cls, base, rope):
    """A transformers config of class cls with rope parameters, in transformers 5's form or 4's."""
    try:
        return cls(**base, rope_parameters=dict(rope))
    except TypeError:
        legacy = dict(rope)
        theta = legacy.pop("rope_theta")
        return cls(**base, rope_theta=theta, rope_scaling=legacy if legacy.get("rope_type", "default") != "default" else None)


def hf_rotary(model, cfg):
    mod = __import__("transformers.models.%s.modeling_%s" % (model, model), fromlist=["x"])
    names = [n for n in dir(mod) if n.endswith("RotaryEmbedding") and "Vision" not in n]
    rot = getattr(mod, names[0])(cfg).to(DEV)
    return rot, mod.apply_rotary_pos_emb, mod


def rope64(x, theta, m, rot_dim):
    """float64 rotate_half rope over the first rot_dim elements: x [..., T, D] (T before D), theta [T, rot/2]."""
    x = x.double()
    h = rot_dim // 2
    c, s = torch.cos(theta), torch.sin(theta)
    a, b = x[..., :h], x[..., h:rot_dim]
    out = x.clone()
    out[..., :h] = (a * c - b * s) * m
    out[..., h:rot_dim] = (a * s + b * c) * m
    return out


def angles64(inv_freq, pos):
    return pos.double()[:, None] * inv_freq.double()[None, :]


def f32_angle_err(inv_freq, pos):
    t32 = (pos.float()[:, None] * inv_freq.float()[None, :]).double()
    return (t32 - angles64(inv_freq, pos)).abs().max().item()


def row(name, dt, lmk_out, hf_out, ref, ang):
    d = lambda a, b: (a.double() - b.double()).abs().max().item()
    print("%-44s %-5s lmk-HF %.3e  HF err %.3e  lmk err %.3e  f32 angle %.2e" %
          (name, dt, d(lmk_out, hf_out), d(hf_out, ref), d(lmk_out, ref), ang))


LLAMA = dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072)


def text_rope_cases():
    """(name, model, config base, rope parameters, how lmk maps it)."""
    return [
        ("llama3 (Llama-3.1-8B)", "llama", LLAMA,
         dict(rope_type="llama3", rope_theta=5e5, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=8192), "freq_factors"),
        ("yarn factor 4 (truncate)", "llama", dict(LLAMA, max_position_embeddings=131072),
         dict(rope_type="yarn", rope_theta=1e6, factor=4.0, original_max_position_embeddings=32768), "yarn"),
        ("yarn factor 32, no truncation (gpt-oss)", "llama", dict(LLAMA, head_dim=64, num_attention_heads=64),
         dict(rope_type="yarn", rope_theta=150000.0, factor=32.0, beta_fast=32.0, beta_slow=1.0, truncate=False,
              original_max_position_embeddings=4096), "freq_factors"),
        ("linear factor 2", "llama", LLAMA, dict(rope_type="linear", rope_theta=1e4, factor=2.0), "linear"),
        ("Qwen3-8B (default)", "qwen3", dict(LLAMA, num_attention_heads=32, num_key_value_heads=8),
         dict(rope_type="default", rope_theta=1e6), "plain"),
    ]


def lmk_rope_kwargs(how, rope, rot, D):
    base = rope["rope_theta"]
    kw = dict(mode="neox", rope_dim=D, freq_base=base)
    if how == "linear":
        kw["freq_scale"] = 1.0 / rope["factor"]
    elif how == "yarn":
        kw.update(freq_scale=1.0 / rope["factor"], ext_factor=1.0, n_ctx_orig=rope["original_max_position_embeddings"],
                  beta_fast=rope.get("beta_fast", 32.0), beta_slow=rope.get("beta_slow", 1.0))
    elif how == "freq_factors":
        p = torch.arange(D // 2, dtype=torch.float64, device=DEV)
        kw["freq_factors"] = (base ** (-2.0 * p / D) / rot.inv_freq.double()).float()
        kw["attn_factor"] = float(rot.attention_scaling)
    return kw


def check_text_rope(T, dt):
    for name, model, base, rope, how in text_rope_cases():
        try:
            cfg = cfg_kwargs(__import__("transformers").AutoConfig.for_model(model).__class__, base, rope)
            rot, apply, _ = hf_rotary(model, cfg)
        except Exception as e:  # a transformers without this rope type: say so, do not guess
            print("%-44s skipped: %s" % (name, e))
            continue
        H, Hk, D = base["num_attention_heads"], base["num_key_value_heads"], base["head_dim"]
        q = torch.randn(T, H, D, device=DEV).to(dt)
        k = torch.randn(T, Hk, D, device=DEV).to(dt)
        pos = torch.randint(0, 131072 if how != "plain" else 32768, (T,), device=DEV)
        cos, sin = rot(q, pos[None])
        qh, kh = apply(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
        ql, kl = lmk.rope(q, pos, k=k, **lmk_rope_kwargs(how, rope, rot, D))
        th = angles64(rot.inv_freq, pos)
        m = float(rot.attention_scaling)
        ang = f32_angle_err(rot.inv_freq, pos)
        row(name + " q", str(dt)[6:], ql, qh[0].transpose(0, 1), rope64(q.transpose(0, 1), th, m, D).transpose(0, 1), ang)
        row(name + " k", str(dt)[6:], kl, kh[0].transpose(0, 1), rope64(k.transpose(0, 1), th, m, D).transpose(0, 1), ang)


def qwen35(T, dt, prologue):
    """Qwen3.5-27B full attention: q from the [q | gate] projection, zero-centred RMSNorm, partial IMROPE."""
    import transformers.models.qwen3_5.modeling_qwen3_5 as M
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
    H, Hk, D, R = 24, 4, 256, 64
    base = dict(hidden_size=5120, num_attention_heads=H, num_key_value_heads=Hk, head_dim=D, rms_norm_eps=1e-6,
                max_position_embeddings=262144)
    cfg = cfg_kwargs(Qwen3_5TextConfig, base, dict(rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25,
                                                     mrope_section=[11, 11, 10], mrope_interleaved=True))
    rot = M.Qwen3_5TextRotaryEmbedding(cfg).to(DEV)
    qn, kn = M.Qwen3_5RMSNorm(D, 1e-6).to(DEV), M.Qwen3_5RMSNorm(D, 1e-6).to(DEV)
    with torch.no_grad():
        qn.weight.normal_(0, 0.1), kn.weight.normal_(0, 0.1)
    qg = torch.randn(T, H * 2 * D, device=DEV).to(dt)
    k = torch.randn(T, Hk * D, device=DEV).to(dt)
    pos3 = torch.stack([torch.randint(0, 4096, (T,)), torch.randint(0, 64, (T,)), torch.randint(0, 64, (T,))]).to(DEV)
    q_hf, _gate = torch.chunk(qg.view(1, T, H, 2 * D), 2, dim=-1)
    if prologue:
        q_hf, k_hf = qn(q_hf), kn(k.view(1, T, Hk, D))
    else:
        k_hf = k.view(1, T, Hk, D)
    cos, sin = rot(q_hf, pos3[:, None, :])
    qh, kh = M.apply_rotary_pos_emb(q_hf.transpose(1, 2), k_hf.transpose(1, 2), cos, sin)
    qv = qg.view(T, H, 2 * D)[..., :D]  # the strided view lmk reads in place
    kw = dict(mode="imrope", sections=[11, 11, 10], rope_dim=R, freq_base=1e7)
    if prologue:
        ql, kl = lmk.attn_prologue(qv, k.view(T, Hk, D), pos3, q_norm_w=qn.weight, k_norm_w=kn.weight, eps=1e-6,
                                   weight_offset=1.0, **kw)
    else:
        ql, kl = lmk.rope(qv, pos3, k=k.view(T, Hk, D), **kw)
    # ref: float64 norm (when any), float64 angles from HF's inv_freq with HF's section layout.
    inv = rot.inv_freq.double()
    axis = torch.zeros(R // 2, dtype=torch.long)
    axis[1:33:3], axis[2:30:3] = 1, 2  # HF's recomposition: h at 1, 4, ... (11 of them), w at 2, 5, ... (10)
    th = pos3.double().T[:, axis] * inv[None, :]
    def norm64(x, w):
        x = x.double()
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1.0 + w.double())
    q64 = norm64(qv, qn.weight) if prologue else qv.double()
    k64 = norm64(k.view(T, Hk, D), kn.weight) if prologue else k.view(T, Hk, D).double()
    ang = f32_angle_err(inv, pos3[0])
    tag = "Qwen3.5-27B %s (q from q|gate)" % ("prologue" if prologue else "rope")
    row(tag + " q", str(dt)[6:], ql, qh[0].transpose(0, 1), rope64(q64.transpose(0, 1), th, 1.0, R).transpose(0, 1), ang)
    row(tag + " k", str(dt)[6:], kl, kh[0].transpose(0, 1), rope64(k64.transpose(0, 1), th, 1.0, R).transpose(0, 1), ang)


def qwen3_prologue(T, dt):
    import transformers.models.qwen3.modeling_qwen3 as M
    from transformers import Qwen3Config
    H, Hk, D = 32, 8, 128
    cfg = cfg_kwargs(Qwen3Config, dict(LLAMA, rms_norm_eps=1e-6), dict(rope_type="default", rope_theta=1e6))
    rot = M.Qwen3RotaryEmbedding(cfg).to(DEV)
    qn, kn = M.Qwen3RMSNorm(D, 1e-6).to(DEV), M.Qwen3RMSNorm(D, 1e-6).to(DEV)
    with torch.no_grad():
        qn.weight.normal_(1, 0.1), kn.weight.normal_(1, 0.1)
    qkv = torch.randn(T, (H + 2 * Hk) * D, device=DEV).to(dt)
    q, k = qkv[:, :H * D].view(T, H, D), qkv[:, H * D:(H + Hk) * D].view(T, Hk, D)
    pos = torch.randint(0, 32768, (T,), device=DEV)
    cos, sin = rot(q, pos[None])
    qh, kh = M.apply_rotary_pos_emb(qn(q[None]).transpose(1, 2), kn(k[None]).transpose(1, 2), cos, sin)
    ql, kl = lmk.attn_prologue(q, k, pos, q_norm_w=qn.weight, k_norm_w=kn.weight, eps=1e-6, mode="neox",
                               freq_base=1e6)
    def norm64(x, w):
        x = x.double()
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    th = angles64(rot.inv_freq, pos)
    ang = f32_angle_err(rot.inv_freq, pos)
    row("Qwen3-8B prologue (packed QKV) q", str(dt)[6:], ql, qh[0].transpose(0, 1),
        rope64(norm64(q, qn.weight).transpose(0, 1), th, 1.0, D).transpose(0, 1), ang)
    row("Qwen3-8B prologue (packed QKV) k", str(dt)[6:], kl, kh[0].transpose(0, 1),
        rope64(norm64(k, kn.weight).transpose(0, 1), th, 1.0, D).transpose(0, 1), ang)


def bench(T=4106):
    import triton.testing as tt
    import transformers.models.qwen3_5.modeling_qwen3_5 as M
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
    dt = torch.bfloat16
    H, Hk, D, R = 24, 4, 256, 64
    cfg = cfg_kwargs(Qwen3_5TextConfig, dict(hidden_size=5120, num_attention_heads=H, num_key_value_heads=Hk, head_dim=D,
                                            rms_norm_eps=1e-6, max_position_embeddings=262144),
                     dict(rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25, mrope_section=[11, 11, 10],
                          mrope_interleaved=True))
    rot = M.Qwen3_5TextRotaryEmbedding(cfg).to(DEV)
    qn, kn = M.Qwen3_5RMSNorm(D, 1e-6).to(DEV).to(dt), M.Qwen3_5RMSNorm(D, 1e-6).to(DEV).to(dt)
    qg = torch.randn(T, H * 2 * D, device=DEV, dtype=dt)
    k = torch.randn(T, Hk * D, device=DEV, dtype=dt)
    v = torch.randn(T, Hk * D, device=DEV, dtype=dt)
    n_slots = 2 * T
    kc = torch.zeros(n_slots, Hk, D, device=DEV, dtype=dt)
    vc = torch.zeros(n_slots, Hk, D, device=DEV, dtype=dt)
    slots = torch.randperm(n_slots, device=DEV)[:T]
    pos3 = torch.stack([torch.arange(T)] * 3).to(DEV)

    def hf_rope(qg, k):
        q, _ = torch.chunk(qg.view(1, T, H, 2 * D), 2, dim=-1)
        cos, sin = rot(q, pos3[:, None, :])
        return M.apply_rotary_pos_emb(q.transpose(1, 2), k.view(1, T, Hk, D).transpose(1, 2), cos, sin)

    def hf_prologue(qg, k, v):
        q, _ = torch.chunk(qg.view(1, T, H, 2 * D), 2, dim=-1)
        q, kk = qn(q).transpose(1, 2), kn(k.view(1, T, Hk, D)).transpose(1, 2)
        cos, sin = rot(q, pos3[:, None, :])
        q, kk = M.apply_rotary_pos_emb(q, kk, cos, sin)
        kc.index_copy_(0, slots, kk[0].transpose(0, 1))
        vc.index_copy_(0, slots, v.view(T, Hk, D))
        return q

    kw = dict(mode="imrope", sections=[11, 11, 10], rope_dim=R, freq_base=1e7)
    qv = qg.view(T, H, 2 * D)[..., :D]

    def lmk_rope():
        return lmk.rope(qv, pos3, k=k.view(T, Hk, D), **kw)

    def lmk_separate(qg, k, v):  # norm is not an lmk op: torch's, then lmk's rope, then the cache copies
        q, _ = torch.chunk(qg.view(T, H, 2 * D), 2, dim=-1)
        qq, kk = lmk.rope(qn(q), pos3, k=kn(k.view(T, Hk, D)), **kw)
        kc.index_copy_(0, slots, kk)
        vc.index_copy_(0, slots, v.view(T, Hk, D))
        return qq

    def lmk_fused():
        return lmk.attn_prologue(qv, k.view(T, Hk, D), pos3, v=v.view(T, Hk, D), q_norm_w=qn.weight,
                                 k_norm_w=kn.weight, eps=1e-6, weight_offset=1.0, slots=slots, k_cache=kc,
                                 v_cache=vc, **kw)

    comp_rope, comp_pro = torch.compile(hf_rope), torch.compile(hf_prologue)
    fns = dict(hf_rope=lambda: hf_rope(qg, k), comp_rope=lambda: comp_rope(qg, k), lmk_rope=lmk_rope,
               hf_pro=lambda: hf_prologue(qg, k, v), comp_pro=lambda: comp_pro(qg, k, v),
               lmk_sep=lambda: lmk_separate(qg, k, v), lmk_fused=lmk_fused)

    def graphed(f):  # replays of a CUDA graph of the call: the GPU's time alone, no Python in between
        try:
            return tt.do_bench_cudagraph(f, rep=300, return_mode="median") * 1000.0
        except Exception as e:  # noqa: BLE001 - a call that cannot be captured gets no figure
            print("graph capture failed: %s: %s" % (type(e).__name__, e))
            return float("nan")

    timers = (("calls from Python (each includes its host work: the GPU waits for it when it is longer)",
               lambda f: tt.do_bench(f, warmup=50, rep=300, return_mode="median") * 1000.0),
              ("CUDA graph replays (the kernels alone)", graphed))
    for title, t in timers:
        r = {name: t(f) for name, f in fns.items()}
        print("\nQwen3.5-27B T=%d bf16, us (median), %s" % (T, title))
        print("rope Q+K:   HF eager %.1f, HF compile %.1f, lmk %.1f  (speed-up %.1fx, %.1fx)" %
              (r["hf_rope"], r["comp_rope"], r["lmk_rope"], r["hf_rope"] / r["lmk_rope"],
               r["comp_rope"] / r["lmk_rope"]))
        print("prologue:   HF eager %.1f, HF compile %.1f, lmk separate %.1f, lmk fused %.1f  "
              "(fused vs each: %.1fx %.1fx %.1fx)" %
              (r["hf_pro"], r["comp_pro"], r["lmk_sep"], r["lmk_fused"], r["hf_pro"] / r["lmk_fused"],
               r["comp_pro"] / r["lmk_fused"], r["lmk_sep"] / r["lmk_fused"]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--T", type=int, default=4106)
    args = ap.parse_args()
    torch.manual_seed(0)
    import transformers
    print("transformers %s, torch %s, %s, lmk %s" % (transformers.__version__, torch.__version__,
                                                     torch.cuda.get_device_name(), lmk.version()))
    for dt in (torch.float32, torch.bfloat16):
        for f in (lambda: check_text_rope(args.T, dt), lambda: qwen35(args.T, dt, False),
                  lambda: qwen35(args.T, dt, True), lambda: qwen3_prologue(args.T, dt)):
            try:
                f()
            except Exception as e:
                print("case failed: %s: %s" % (type(e).__name__, e))
    if args.bench:
        bench(args.T)


if __name__ == "__main__":
    sys.exit(main())
