"""qwen35_lmk.py - lmk inside a real model: a small Qwen3.5 (Hugging Face transformers >= 5, random weights from a
config, no download) whose full-attention layers run their prologue -- per-head q/k RMS norm and the interleaved
MRoPE -- as ONE lmk.attn_prologue call (include/lmk.h "attn_prologue") instead of Hugging Face's q_norm, k_norm
and apply_rotary_pos_emb.

It checks the modified model against the unmodified one on the same input ids (prefill logits: max |diff| and
||diff|| / ||ref||; f32 must agree to rel < 1e-4, bf16 to rel < 3e-2), greedy-decodes with both through
Hugging Face's KV cache and reports whether the tokens agree, and times a prefill forward, a decode step and the
prologue alone, before and after (CUDA events, median of N runs; on the CPU wall-clock medians, for the record).

    PYTHONPATH=python LMK_LIBRARY=build/liblmk.so python3 examples/qwen35_lmk.py --device cuda --dtype bf16
    PYTHONPATH=python LMK_LIBRARY=build/liblmk.so python3 examples/qwen35_lmk.py --device cpu --dtype f32
    ... --hf-only                 runs the unmodified model alone (its greedy tokens and timings)

What changes in a full-attention layer (Hugging Face's Qwen3_5Attention.forward, otherwise unchanged):
q_proj's output holds per head [q | gate]; lmk normalises and rotates q inside that buffer (a strided view, no
copy) and k inside k_proj's output, with the layer's own q_norm / k_norm weights (zero-centred: x * (1 + w), lmk's
weight_offset 1) and the rope of the config's rope_parameters (rope_dim = head_dim * partial_rotary_factor,
interleaved sections = mrope_section, rope_theta). Attention, the KV cache (past_key_values / cache .update),
the sigmoid gate and o_proj stay Hugging Face's. v is not passed to lmk: with Hugging Face's cache lmk writes no
cache rows, and lmk takes v only to write it into v_cache. Inference only: lmk writes tensors behind autograd.

Positions: lmk reads the positions Hugging Face's rotary embedding itself receives (a forward pre-hook on
model.model.rotary_emb takes its (3, batch, T) t/h/w rows once per forward), so text-only input (all three rows
equal) and explicit multimodal position_ids both get exactly Hugging Face's rope. In bf16 Hugging Face rounds the
normed values and its cos/sin to bf16 and rotates in bf16; lmk computes norm and rope in f32 and rounds once
(lmk.h "attn_prologue", Precision), so bf16 logits differ slightly and the f32 model is the referee: the check
also reports how far each bf16 model is from the same weights run in f32.
"""
import argparse
import functools
import inspect
import math
import statistics
import sys
import time

import torch

import lmk

try:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.models.qwen3_5 import modeling_qwen3_5 as hf_qwen35
    from transformers.models.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5TextConfig
except ImportError as e:  # transformers < 5 has no Qwen3.5
    raise ImportError("qwen35_lmk needs transformers >= 5 (transformers.models.qwen3_5): %s" % e) from e

DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32}
F32_REL = 1e-4     # f32 logits, lmk vs Hugging Face: only rounding order differs (measured 4e-6 to 9e-7 on the CPU)
BF16_REL = 3e-2    # bf16 logits: measured 7e-3 (the test's tiny size) to 9e-3 (the default size) on the CPU
# transformers 5.17 names the KV cache argument past_key_values; 5.24 calls it cache and passes the layer's
# keyword arguments on to Cache.update. Mirror whichever the installed Qwen3_5Attention.forward does.
_NEW_CACHE_API = "cache" in inspect.signature(hf_qwen35.Qwen3_5Attention.forward).parameters
_CACHE_KW = "cache" if "cache" in inspect.signature(Qwen3_5ForCausalLM.forward).parameters else "past_key_values"


# ---- the model ----

def qwen35_config(layers=4, full_every=2, hidden=1024, intermediate=3584, heads=8, kv_heads=2, head_dim=256,
                  vocab=32000, linear_heads=16, linear_head_dim=128, rope_theta=1e7, mrope_section=(11, 11, 10),
                  attn="sdpa"):
    """A Qwen3.5 text config: every full_every-th layer full attention, the others Gated DeltaNet. The defaults
    are Qwen3.5-0.8B's layer shapes (heads 8/2 of 256, linear 16 heads of 128) with fewer layers and a smaller
    vocabulary; rope as the released models (partial 0.25, interleaved MRoPE sections [11, 11, 10])."""
    layer_types = ["full_attention" if (i + 1) % full_every == 0 else "linear_attention" for i in range(layers)]
    rope = dict(rope_type="default", rope_theta=float(rope_theta), partial_rotary_factor=0.25,
                mrope_section=list(mrope_section), mrope_interleaved=True)
    return Qwen3_5TextConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                             num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                             head_dim=head_dim, linear_num_key_heads=linear_heads, linear_num_value_heads=linear_heads,
                             linear_key_head_dim=linear_head_dim, linear_value_head_dim=linear_head_dim,
                             layer_types=layer_types, rope_parameters=rope, attn_implementation=attn)


def build_model(cfg, seed, device, dtype):
    """Qwen3_5ForCausalLM with seeded random weights, in eval mode. Built in f32 on the CPU, so one seed gives the
    same weights on any device and dtype. The RMS norm weights (Hugging Face initialises them to 0, i.e. scale 1)
    are drawn too, so the zero-centred weight_offset matters. Only parameters are cast to dtype: the rotary
    inverse frequencies stay f32 as Hugging Face computes them (casting them to bf16 would add an error of its own
    to Hugging Face's rope)."""
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(cfg)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, hf_qwen35.Qwen3_5RMSNorm):
                mod.weight.copy_(torch.rand(mod.weight.shape, generator=gen) - 0.5)
        model.to(device)
        for p in model.parameters():
            p.data = p.data.to(dtype)
    return model.eval()


def full_attention_layers(model):
    return [m for m in model.modules() if isinstance(m, hf_qwen35.Qwen3_5Attention)]


def lmk_rope_kwargs(cfg):
    """lmk's rope keywords for Hugging Face's Qwen3_5TextRotaryEmbedding of cfg: imrope (Qwen3.5 always
    interleaves its sections) over rope_dim = head_dim * partial_rotary_factor, base rope_theta."""
    rp = cfg.rope_parameters
    if rp.get("rope_type", "default") != "default":
        raise NotImplementedError("qwen35_lmk maps rope_type 'default' only, the config has %r" % rp["rope_type"])
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return dict(mode="imrope", sections=list(rp.get("mrope_section", [11, 11, 10])),
                rope_dim=int(head_dim * rp.get("partial_rotary_factor", 1.0)), freq_base=float(rp["rope_theta"]))


def lmk_positions(position_ids):
    """Hugging Face's rope positions ((batch, T) or (3, batch, T) t/h/w) as lmk's (4, batch*T): token rows in
    the order of q's flattened [batch*T] rows, the fourth (e) axis a copy of t as lmk.h's IMROPE reads it."""
    p = position_ids.expand(3, -1, -1)
    return torch.cat([p, p[:1]]).reshape(4, -1)


# ---- the swap ----

class LmkPrologue:
    """Switches a Qwen3_5ForCausalLM's full-attention layers to lmk's prologue (enable / disable, or `with`).
    disable() gives every layer Hugging Face's forward back. .calls counts lmk calls, so a caller can see that
    lmk did run. overrides replace keywords of the lmk call (weight_offset, freq_base, sections, ...): the test
    passes wrong ones to show that the comparison catches them."""

    def __init__(self, model, **overrides):
        cfg = model.config
        self.model, self.calls, self.positions, self._hook = model, 0, None, None
        self.layers = full_attention_layers(model)
        eps = {float(a.q_norm.eps) for a in self.layers} | {float(a.k_norm.eps) for a in self.layers}
        if len(eps) > 1:
            raise ValueError("lmk.attn_prologue takes one eps for q and k; the model has %s" % sorted(eps))
        self.kwargs = dict(eps=eps.pop() if eps else cfg.rms_norm_eps, weight_offset=1.0, **lmk_rope_kwargs(cfg))
        self.kwargs.update(overrides)

    def _capture(self, module, args, kwargs):
        pos = args[1] if len(args) > 1 else kwargs["position_ids"]
        self.positions = lmk_positions(pos)

    def enable(self):
        if self._hook is None:
            self._hook = self.model.model.rotary_emb.register_forward_pre_hook(self._capture, with_kwargs=True)
            for attn in self.layers:  # an instance attribute shadows the class's forward
                attn.forward = functools.partial(lmk_attention_forward, attn, self)
        return self

    def disable(self):
        if self._hook is not None:
            self._hook.remove()
            self._hook, self.positions = None, None
            for attn in self.layers:
                del attn.forward

    def __enter__(self):
        return self.enable()

    def __exit__(self, *exc):
        self.disable()


def lmk_attention_forward(attn, switch, hidden_states, position_embeddings=None, attention_mask=None,
                          past_key_values=None, cache=None, **kwargs):
    """Hugging Face's Qwen3_5Attention.forward with q_norm + k_norm + apply_rotary_pos_emb replaced by one
    lmk.attn_prologue call in place (position_embeddings, Hugging Face's cos/sin, go unused)."""
    cache = cache if cache is not None else past_key_values
    input_shape = hidden_states.shape[:-1]
    n, d = math.prod(input_shape), attn.head_dim
    qg = attn.q_proj(hidden_states).view(n, -1, 2 * d)   # per head [q | gate]
    q = qg[..., :d]                                       # strided view of the projection: rotated in place
    k = attn.k_proj(hidden_states).view(n, -1, d)
    if q.requires_grad:
        raise RuntimeError("the lmk prologue is inference only (run under torch.inference_mode or no_grad)")
    pos = switch.positions
    if pos is None or pos.shape[-1] != n:
        raise RuntimeError("lmk prologue: no rope positions for %d tokens (the layer ran outside the model's "
                           "forward, or the rotary embedding was not called)" % n)
    lmk.attn_prologue(q, k, pos, q_norm_w=attn.q_norm.weight, k_norm_w=attn.k_norm.weight, q_out=q, k_out=k,
                      **switch.kwargs)
    switch.calls += 1
    query_states = q.view(*input_shape, -1, d).transpose(1, 2)
    key_states = k.view(*input_shape, -1, d).transpose(1, 2)
    value_states = attn.v_proj(hidden_states).view(*input_shape, -1, d).transpose(1, 2)
    gate = qg[..., d:].reshape(*input_shape, -1)

    if cache is not None:
        if _NEW_CACHE_API:
            key_states, value_states = cache.update(key_states, value_states, attn.layer_idx, kwargs=kwargs)
        else:
            key_states, value_states = cache.update(key_states, value_states, attn.layer_idx)
    interface = ALL_ATTENTION_FUNCTIONS.get_interface(attn.config._attn_implementation,
                                                      hf_qwen35.eager_attention_forward)
    attn_output, attn_weights = interface(attn, query_states, key_states, value_states, attention_mask,
                                          dropout=0.0 if not attn.training else attn.attention_dropout,
                                          scaling=attn.scaling, **kwargs)
    attn_output = attn_output.reshape(*input_shape, -1).contiguous()
    attn_output = attn_output * torch.sigmoid(gate)
    return attn.o_proj(attn_output), attn_weights


# ---- running and comparing ----

def new_cache(model):
    from transformers.cache_utils import DynamicCache
    return DynamicCache(config=model.config)


def forward_logits(model, ids, cache=None, position_ids=None):
    kw = {_CACHE_KW: cache} if cache is not None else {}
    with torch.inference_mode():
        return model(input_ids=ids, position_ids=position_ids, use_cache=cache is not None, **kw).logits


def rel_diff(got, ref):
    """(max |got - ref|, ||got - ref|| / ||ref||), in f64."""
    g, r = got.double(), ref.double()
    d = g - r
    return d.abs().max().item(), (d.norm() / r.norm()).item()


def compare(model, ids, position_ids=None, switch=None):
    """Prefill logits of Hugging Face's model and of the lmk one on the same ids: (hf, lmk, max_abs, rel, calls).
    switch: an LmkPrologue of model (a default one when None); it is disabled again on return."""
    switch = switch or LmkPrologue(model)
    ref = forward_logits(model, ids, position_ids=position_ids)
    with switch:
        calls0 = switch.calls
        got = forward_logits(model, ids, position_ids=position_ids)
        calls = switch.calls - calls0
    max_abs, rel = rel_diff(got, ref)
    return ref, got, max_abs, rel, calls


class Timer:
    """Median milliseconds of a callable: CUDA events on a CUDA device (no synchronisation between runs), the
    wall clock on the CPU."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"

    def run(self, fn, n, warmup=3):
        for _ in range(warmup):
            fn()
        return statistics.median(self.each([fn] * n))

    def each(self, fns):
        """Milliseconds of each call of fns, in order."""
        if not self.cuda:
            out = []
            for fn in fns:
                t0 = time.perf_counter()
                fn()
                out.append((time.perf_counter() - t0) * 1e3)
            return out
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in fns]
        for fn, (a, b) in zip(fns, ev):
            a.record()
            fn()
            b.record()
        torch.cuda.synchronize()
        return [a.elapsed_time(b) for a, b in ev]


def greedy(model, ids, steps, timer=None, force=None):
    """Greedy decoding of `steps` tokens after a prefill of ids, through Hugging Face's DynamicCache.
    Returns (tokens [batch, steps], logits of each step, milliseconds of each decode step after the first
    token). force: tokens [batch, steps] to feed instead of the argmax (teacher forcing, for comparing logits)."""
    cache = new_cache(model)
    logits = [forward_logits(model, ids, cache)[:, -1]]
    state = {"tok": (force[:, :1] if force is not None else logits[0].argmax(-1, keepdim=True))}
    toks = [state["tok"]]

    def step(i):
        logits.append(forward_logits(model, state["tok"], cache)[:, -1])
        state["tok"] = force[:, i:i + 1] if force is not None else logits[-1].argmax(-1, keepdim=True)
        toks.append(state["tok"])

    fns = [functools.partial(step, i) for i in range(1, steps)]
    if timer:
        times = timer.each(fns)
    else:
        times = []
        for fn in fns:
            fn()
    return torch.cat(toks, 1), logits, times


def prologue_bench(model, batch, T, timer, n):
    """The prologue alone at one full-attention layer's prefill shape: Hugging Face's q_norm, k_norm and
    apply_rotary_pos_emb (from precomputed cos/sin, which it computes once per forward) vs one lmk call in place.
    Returns (hf_ms, lmk_ms)."""
    attn = full_attention_layers(model)[0]
    switch = LmkPrologue(model)
    dev, dt = attn.q_proj.weight.device, attn.q_proj.weight.dtype
    d, nt = attn.head_dim, batch * T
    with torch.inference_mode():
        h = torch.randn(batch, T, model.config.hidden_size, device=dev, dtype=dt)
        qg = attn.q_proj(h).view(nt, -1, 2 * d)
        k = attn.k_proj(h).view(nt, -1, d)
        pos_hf = torch.arange(T, device=dev).view(1, 1, T).expand(3, batch, T)
        cos, sin = model.model.rotary_emb(h, pos_hf)
        pos = lmk_positions(pos_hf)

        def hf():
            qs = attn.q_norm(qg[..., :d].view(batch, T, -1, d)).transpose(1, 2)
            ks = attn.k_norm(k.view(batch, T, -1, d)).transpose(1, 2)
            hf_qwen35.apply_rotary_pos_emb(qs, ks, cos, sin)

        def lm():
            q = qg[..., :d]
            lmk.attn_prologue(q, k, pos, q_norm_w=attn.q_norm.weight, k_norm_w=attn.k_norm.weight, q_out=q,
                              k_out=k, **switch.kwargs)

        return timer.run(hf, n), timer.run(lm, n)


# ---- the script ----

def check_logits(model, cfg, ids, args):
    """Prefill logits, lmk vs Hugging Face (and, in bf16, both vs the same weights in f32). True when they match."""
    n_full = len(full_attention_layers(model))
    ref, got, max_abs, rel, calls = compare(model, ids)
    print("prefill logits [%s], lmk vs Hugging Face: max |diff| %.3g, ||diff||/||ref|| %.3g (lmk calls: %d for %d "
          "full-attention layers)" % ("x".join(map(str, ref.shape)), max_abs, rel, calls, n_full))
    ok = calls == n_full
    if args.dtype == "f32":
        ok = ok and rel < F32_REL
        print("  f32 tolerance: rel < %g -> %s" % (F32_REL, "ok" if rel < F32_REL else "FAIL"))
        return ok
    ok = ok and rel < BF16_REL
    print("  bf16 tolerance: rel < %g -> %s" % (BF16_REL, "ok" if rel < BF16_REL else "FAIL"))
    ref32 = forward_logits(build_model(cfg, args.seed, model.device, torch.float32), ids)
    hf_err, lmk_err = rel_diff(ref, ref32)[1], rel_diff(got, ref32)[1]
    print("  vs the same weights in f32: Hugging Face bf16 rel %.3g, lmk bf16 rel %.3g" % (hf_err, lmk_err))
    return ok


def check_decode(model, ids, args, timer):
    """Greedy decoding with both; reports token agreement, the teacher-forced decode logits and step times.
    A short untimed decode of each first keeps one-time costs (kernel loading, allocator growth) out."""
    greedy(model, ids, 3)
    with LmkPrologue(model):
        greedy(model, ids, 3)
    hf_tok, hf_logits, hf_ms = greedy(model, ids, args.decode, timer)
    with LmkPrologue(model):
        lmk_tok, _, lmk_ms = greedy(model, ids, args.decode, timer)
        _, forced_logits, _ = greedy(model, ids, args.decode, force=hf_tok)
    agree = (hf_tok == lmk_tok).float().mean().item()
    first = (hf_tok != lmk_tok).any(0).nonzero()
    print("greedy decode of %d tokens x %d: tokens agree %.1f%%%s" % (args.decode, ids.shape[0], 100 * agree,
          "" if first.numel() == 0 else " (first difference at step %d)" % first[0].item()))
    _, rel = rel_diff(torch.stack(forced_logits), torch.stack(hf_logits))
    print("  decode logits through the KV cache, lmk fed Hugging Face's tokens: ||diff||/||ref|| %.3g" % rel)
    return hf_ms, lmk_ms


def report_times(model, ids, args, timer, decode_ms):
    unit = "CUDA events" if timer.cuda else "wall clock, CPU (for the record)"
    hf = timer.run(lambda: forward_logits(model, ids), args.runs)
    with LmkPrologue(model):
        lm = timer.run(lambda: forward_logits(model, ids), args.runs)
    print("times, median ms (%s):" % unit)
    print("  prefill forward  %d x %d tokens: Hugging Face %8.3f   lmk %8.3f   (%+.1f%%)"
          % (ids.shape[0], ids.shape[1], hf, lm, 100 * (lm / hf - 1)))
    if decode_ms[0]:
        hf_d, lm_d = statistics.median(decode_ms[0]), statistics.median(decode_ms[1])
        print("  decode step      %d x 1 token (median of %d):  Hugging Face %8.3f   lmk %8.3f   (%+.1f%%)"
              % (ids.shape[0], len(decode_ms[0]), hf_d, lm_d, 100 * (lm_d / hf_d - 1)))
    hf_p, lm_p = prologue_bench(model, ids.shape[0], ids.shape[1], timer, args.runs)
    print("  prologue alone, one layer, %d tokens: Hugging Face %8.3f   lmk %8.3f   (x%.2f)"
          % (ids.numel(), hf_p, lm_p, hf_p / lm_p))


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cuda or cpu")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--hf-only", action="store_true", help="run the unmodified Hugging Face model only")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=256, help="prefill length")
    ap.add_argument("--decode", type=int, default=16, help="greedy tokens")
    ap.add_argument("--runs", type=int, default=None, help="timed runs (default 20 on CUDA, 3 on the CPU)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--full-every", type=int, default=2, help="every n-th layer is full attention")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--intermediate", type=int, default=3584)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--linear-heads", type=int, default=16)
    ap.add_argument("--linear-head-dim", type=int, default=128)
    ap.add_argument("--attn", default="sdpa", help="Hugging Face attention implementation (sdpa, eager, ...)")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("qwen35_lmk: --device cuda but torch sees no CUDA GPU", file=sys.stderr)
        return 2
    if args.runs is None:
        args.runs = 20 if device.type == "cuda" else 3
    import transformers
    cfg = qwen35_config(args.layers, args.full_every, args.hidden, args.intermediate, args.heads, args.kv_heads,
                        args.head_dim, args.vocab, args.linear_heads, args.linear_head_dim, attn=args.attn)
    model = build_model(cfg, args.seed, device, DTYPES[args.dtype])
    gen = torch.Generator().manual_seed(args.seed + 2)
    ids = torch.randint(cfg.vocab_size, (args.batch, args.tokens), generator=gen).to(device)
    print("lmk %s (%s) from %s; torch %s, transformers %s; %s" % (lmk.version(), lmk.build_info(), lmk.LIBRARY_PATH,
          torch.__version__, transformers.__version__, torch.cuda.get_device_name(device) if device.type == "cuda"
          else "CPU"))
    print("Qwen3.5 text, random weights (seed %d), %s, %s attention: %s; hidden %d, heads %d/%d x %d, rope %s"
          % (args.seed, args.dtype, cfg._attn_implementation, ",".join(t[0] for t in cfg.layer_types), cfg.hidden_size,
             cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, lmk_rope_kwargs(cfg)))
    timer = Timer(device)
    if args.hf_only:
        tok, _, ms = greedy(model, ids, args.decode, timer)
        print("Hugging Face only: prefill %.3f ms, decode step %.3f ms (median), greedy tokens[0] %s"
              % (timer.run(lambda: forward_logits(model, ids), args.runs), statistics.median(ms) if ms else 0.0,
                 tok[0].tolist()))
        return 0
    ok = check_logits(model, cfg, ids, args)
    decode_ms = check_decode(model, ids, args, timer)
    report_times(model, ids, args, timer, decode_ms)
    print("qwen35_lmk: %s" % ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
