"""gdn_compare.py - lmk's Gated DeltaNet ops against Hugging Face's own Qwen3_5GatedDeltaNet and against FLA.

Part 1, the layer (runs on the CPU and on a GPU). A Qwen3_5GatedDeltaNet module of transformers with random
weights (A_log, dt_bias and the gated norm's weight drawn, not left at their initial values) runs its own
forward; the same module's projections (torch GEMMs) then run around lmk.causal_conv1d (in place on the
in_proj_qkv output, SiLU) and one lmk.gated_delta_rule call (q, k and v read straight out of the convolution's
output as strided views, Hugging Face's head order "block", the gated RMSNorm fused), and out_proj. Reported:
max |lmk - HF| and ||lmk - HF|| / ||HF|| of the layer outputs, for
    prefill      B sequences of T tokens, packed along T with cu_seqlens, state pools starting at zero;
    decode       the same sequences one more token, through lmk's state pools, against Hugging Face's forward
                 on T + 1 tokens (its last token) and, where transformers builds its cache for the layer,
                 against its own cached decode step.
In f32 the two agree to rounding (lmk.h: nothing rounded between the gates, the recurrence and the norm; Hugging
Face's chunked prefill reorders the same sums), in bf16 to a few bf16 ulps (Hugging Face rounds beta and the
normed output to bf16, lmk does not).

Part 2, FLA (GPU, --fla, fla-core installed): chunk_gated_delta_rule and fused_recurrent_gated_delta_rule on the
same q, k, v, g, beta and initial state as lmk.gated_delta_rule (g and beta precomputed: A_log and dt_bias None),
max difference of outputs and final states.

Part 3, speed (GPU, --bench): decode at Qwen3.5-27B's GDN shape (Hk 16, Hv 48, d 128, f32 state), batches of 1,
64, 256 and 512 sequences one token each: lmk against Hugging Face's torch path
(torch_recurrent_gated_delta_rule, eager and under torch.compile), each call replayed from a CUDA graph
(triton.testing.do_bench_cudagraph), with lmk's speed-up beside each. FLA's fused_recurrent_gated_delta_rule
and the convolution at T = 4106 are not timed here.

Part 4, prefill (GPU, --prefill): the delta rule alone at published prefill shapes (Qwen3.5-27B and 35B-A3B heads, one
sequence of 8192 or 32768 tokens, four of 8192) against FLA's chunk_gated_delta_rule, with nominal TFLOP/s; and
the whole layer at T = 4096 against Hugging Face's module, eager and under torch.compile.

    PYTHONPATH=python LMK_LIBRARY=build/liblmk.so python3 bench/gdn_compare.py --device cpu --dtype f32
    PYTHONPATH=python LMK_LIBRARY=build/liblmk.so python3 bench/gdn_compare.py --device cuda --dtype bf16 --fla --bench --prefill
"""
import argparse
import sys

import torch

import lmk

try:
    from transformers.models.qwen3_5 import modeling_qwen3_5 as hf
    from transformers.models.qwen3_5 import Qwen3_5TextConfig
except ImportError as e:  # transformers < 5 has no Qwen3.5
    raise ImportError("gdn_compare needs transformers >= 5 (transformers.models.qwen3_5): %s" % e) from e

DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32}


def layer_config(hidden, k_heads, v_heads, head_dim, width):
    """A one-layer Qwen3.5 text config whose layer 0 is a Gated DeltaNet layer of the given shape."""
    return Qwen3_5TextConfig(
        vocab_size=256, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=1, head_dim=64, layer_types=["linear_attention"],
        linear_num_key_heads=k_heads, linear_num_value_heads=v_heads, linear_key_head_dim=head_dim,
        linear_value_head_dim=head_dim, linear_conv_kernel_dim=width, rms_norm_eps=1e-6)


def make_layer(cfg, device, dtype, seed):
    """Hugging Face's module with random weights, the gate parameters and norm weight drawn too."""
    torch.manual_seed(seed)
    mod = hf.Qwen3_5GatedDeltaNet(cfg, 0)
    with torch.no_grad():
        for p in mod.parameters():
            p.normal_(0.0, 0.02 if p.dim() > 1 else 1.0)
        mod.conv1d.weight.normal_(0.0, 0.5)
        mod.A_log.copy_(torch.log(torch.empty_like(mod.A_log).uniform_(1.0, 16.0)))
        mod.dt_bias.uniform_(-1.0, 1.0)
        mod.norm.weight.uniform_(0.5, 1.5)
    return mod.to(device=device, dtype=dtype).eval()


class LmkLayer:
    """The same layer with lmk between the projections; state pools of n_slots rows (conv [n, W-1, C],
    recurrent [n, Hv, dk, dv] f32) carried across calls."""

    def __init__(self, mod, n_slots):
        self.mod = mod
        p = next(mod.parameters())
        self.hk, self.hv, self.dk, self.dv = mod.num_k_heads, mod.num_v_heads, mod.head_k_dim, mod.head_v_dim
        w = mod.conv_kernel_size
        self.conv_state = torch.zeros(n_slots, w - 1, mod.conv_dim, device=p.device, dtype=p.dtype)
        self.state = torch.zeros(n_slots, self.hv, self.dk, self.dv, device=p.device, dtype=torch.float32)

    def __call__(self, x, cu_seqlens, slots):
        """x [N, hidden]: the tokens of every sequence packed along N."""
        m, n = self.mod, x.shape[0]
        mixed = m.in_proj_qkv(x)
        lmk.causal_conv1d(mixed, m.conv1d.weight, bias=m.conv1d.bias, activation="silu", cu_seqlens=cu_seqlens,
                          state=self.conv_state, state_slots=slots, out=mixed)
        kd = self.hk * self.dk
        q = mixed[:, :kd].view(n, self.hk, self.dk)
        k = mixed[:, kd:2 * kd].view(n, self.hk, self.dk)
        v = mixed[:, 2 * kd:].view(n, self.hv, self.dv)
        z = m.in_proj_z(x).view(n, self.hv, self.dv)
        o = lmk.gated_delta_rule(q, k, v, m.in_proj_a(x), m.in_proj_b(x), A_log=m.A_log, dt_bias=m.dt_bias,
                                 heads="block", cu_seqlens=cu_seqlens, state=self.state, state_slots=slots, z=z,
                                 norm_w=m.norm.weight, eps=m.norm.variance_epsilon)
        return m.out_proj(o.reshape(n, self.hv * self.dv))


def diff(got, want):
    d = (got.double() - want.double())
    return d.abs().max().item(), (d.norm() / want.double().norm().clamp_min(1e-30)).item()


def check_layer(args):
    dev, dt = args.device, DTYPES[args.dtype]
    cfg = layer_config(args.hidden, args.k_heads, args.v_heads, args.head_dim, args.width)
    mod = make_layer(cfg, dev, dt, args.seed)
    b, t = args.batch, args.T
    torch.manual_seed(args.seed + 1)
    x = torch.randn(b, t + 1, args.hidden, device=dev, dtype=dt)
    cu = torch.arange(0, b * t + 1, t, device=dev, dtype=torch.int32)
    slots = torch.arange(b, device=dev, dtype=torch.int32).flip(0)   # rows in another order than the batch
    lay = LmkLayer(mod, n_slots=b + 3)
    rows = []
    with torch.no_grad():
        want_full = mod(x)                                      # [b, t + 1, hidden], no cache
        got = lay(x[:, :t].reshape(b * t, -1), cu, slots).view(b, t, -1)
        rows.append(("prefill T=%d x %d" % (t, b),) + diff(got, want_full[:, :t]))
        cu1 = torch.arange(0, b + 1, device=dev, dtype=torch.int32)
        got1 = lay(x[:, t].reshape(b, -1), cu1, slots)
        rows.append(("decode 1 token x %d vs HF on T+1" % b,) + diff(got1, want_full[:, t]))
        cached = hf_cached_decode(cfg, mod, x, t)
        if cached is not None:
            rows.append(("decode 1 token x %d vs HF's cache" % b,) + diff(got1, cached))
    print("layer: Qwen3_5GatedDeltaNet hidden %d, Hk %d, Hv %d, d %d, W %d, %s on %s" %
          (args.hidden, args.k_heads, args.v_heads, args.head_dim, args.width, args.dtype, dev))
    for name, mx, rel in rows:
        print("  %-40s max|lmk-HF| %.3e   rel %.3e" % (name, mx, rel))
    limit = 1e-4 if args.dtype == "f32" else 3e-2
    bad = [r for r in rows if not r[2] <= limit]
    print("  verdict: %s (rel <= %g)" % ("agree" if not bad else "DIFFER", limit))
    return not bad


def hf_cached_decode(cfg, mod, x, t):
    """Hugging Face's own decode step (prefill of t tokens, then token t through its cache), or None where this
    transformers cannot build the cache for a lone layer."""
    try:
        from transformers import DynamicCache
        cache = DynamicCache(config=cfg)
        mod(x[:, :t], cache=cache)
        return mod(x[:, t:t + 1], cache=cache)[:, 0]
    except Exception as e:  # noqa: BLE001 - the cache API moves between transformers versions
        print("  (Hugging Face's cached decode not run: %s: %s)" % (type(e).__name__, e))
        return None


def check_fla(args):
    """lmk against FLA's two kernels on the same precomputed gates."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    except ImportError as e:
        print("fla: not installed (%s): skipped" % e)
        return True
    dev, dt = "cuda", DTYPES[args.dtype]
    torch.manual_seed(args.seed + 2)
    b, t, hk, hv, d = args.batch, args.T, args.k_heads, args.v_heads, args.head_dim
    q = torch.randn(b, t, hv, d, device=dev, dtype=dt)          # FLA takes q/k at Hv heads
    k = torch.randn(b, t, hv, d, device=dev, dtype=dt)
    v = torch.randn(b, t, hv, d, device=dev, dtype=dt)
    g = -torch.rand(b, t, hv, device=dev, dtype=torch.float32) * 0.5
    beta = torch.rand(b, t, hv, device=dev, dtype=torch.float32)
    h0 = torch.randn(b, hv, d, d, device=dev, dtype=torch.float32) * 0.1
    ok = True
    for name, fn in (("chunk", chunk_gated_delta_rule), ("fused_recurrent", fused_recurrent_gated_delta_rule)):
        o_f, s_f = fn(q, k, v, g=g, beta=beta, initial_state=h0.clone(), output_final_state=True,
                      use_qk_l2norm_in_kernel=True)
        state = h0.clone()
        cu = torch.arange(0, b * t + 1, t, device=dev, dtype=torch.int32)
        o_l = lmk.gated_delta_rule(q.reshape(b * t, hv, d), k.reshape(b * t, hv, d), v.reshape(b * t, hv, d),
                                   g.reshape(b * t, hv), beta.reshape(b * t, hv), heads="block", cu_seqlens=cu,
                                   state=state)
        mo, ro = diff(o_l.view(b, t, hv, d), o_f)
        ms, rs = diff(state, s_f)
        print("fla %-16s out max %.3e rel %.3e   state max %.3e rel %.3e" % (name, mo, ro, ms, rs))
        ok = ok and ro < 3e-2 and rs < 3e-2
    return ok


def bench(args):
    """Decode and convolution timings from CUDA graph replays (kernels alone)."""
    import triton.testing as tt
    dev, hk, hv, d = "cuda", 16, 48, 128
    rows = []
    for batch in (1, 64, 256, 512):
        q = torch.randn(batch, hk, d, device=dev, dtype=torch.bfloat16)
        k = torch.randn(batch, hk, d, device=dev, dtype=torch.bfloat16)
        v = torch.randn(batch, hv, d, device=dev, dtype=torch.bfloat16)
        a = torch.randn(batch, hv, device=dev, dtype=torch.bfloat16)
        bb = torch.randn(batch, hv, device=dev, dtype=torch.bfloat16)
        z = torch.randn(batch, hv, d, device=dev, dtype=torch.bfloat16)
        a_log = torch.log(torch.empty(hv, device=dev).uniform_(1, 16))
        dt_bias = torch.rand(hv, device=dev)
        nw = torch.ones(d, device=dev, dtype=torch.bfloat16)
        state = torch.zeros(batch, hv, d, d, device=dev, dtype=torch.float32)
        out = torch.empty_like(v)
        cu = torch.arange(batch + 1, device=dev, dtype=torch.int32)

        def run_lmk():
            lmk.gated_delta_rule(q, k, v, a, bb, A_log=a_log, dt_bias=dt_bias, cu_seqlens=cu, state=state, z=z,
                                 norm_w=nw, out=out)

        def run_hf():
            g = -a_log.exp() * torch.nn.functional.softplus(a.float() + dt_bias)
            o, s = hf.torch_recurrent_gated_delta_rule(q[:, None], k[:, None], v[:, None], g=g[:, None],
                                                       beta=bb.sigmoid()[:, None], initial_state=state,
                                                       output_final_state=True, use_qk_l2norm_in_kernel=True)
            state.copy_(s)
            return o

        t_lmk = tt.do_bench_cudagraph(run_lmk)
        t_hf = tt.do_bench_cudagraph(run_hf)
        t_hfc = tt.do_bench_cudagraph(torch.compile(run_hf))
        state_bytes = 2 * batch * hv * d * d * 4
        rows.append(("decode batch %d" % batch, t_lmk, t_hf, t_hfc, state_bytes / (t_lmk * 1e-3) / 1e9))
    print("%-20s %10s %10s %12s %10s" % ("call", "lmk us", "HF us", "HF comp. us", "state GB/s"))
    for name, tl, th, tc, gbs in rows:
        print("%-20s %10.2f %10.2f (%4.1fx) %8.2f (%4.1fx) %8.0f" % (name, tl * 1e3, th * 1e3, th / tl, tc * 1e3,
                                                                    tc / tl, gbs))


PREFILL_SHAPES = (  # (label, Hk, Hv, sequences, tokens each), d = 128: the published H200 prefill shapes
    ("27B 1x8192", 16, 48, 1, 8192), ("27B 1x32768", 16, 48, 1, 32768), ("27B 4x8192", 16, 48, 4, 8192),
    ("35B-A3B 1x8192", 16, 32, 1, 8192), ("35B-A3B 1x32768", 16, 32, 1, 32768), ("35B-A3B 4x8192", 16, 32, 4, 8192))


def bench_prefill(args):
    """Prefill of the delta rule alone (bf16 q/k/v, f32 gates and state, no norm): lmk.gated_delta_rule against
    FLA's chunk_gated_delta_rule on the same inputs, each replayed from a CUDA graph, with the nominal TFLOP/s
    (4 * T * Hv * d^2 per call). FLA is given q and k already at Hv heads (outside the timing); lmk reads Hk."""
    import triton.testing as tt
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError as e:
        chunk_gated_delta_rule = None
        print("fla: not installed (%s): lmk alone" % e)
    dev, d, dt = "cuda", 128, torch.bfloat16
    print("%-18s %10s %7s %10s %7s %8s" % ("prefill", "lmk ms", "TFLOP/s", "FLA ms", "TFLOP/s", "speed-up"))
    for label, hk, hv, nseq, t in PREFILL_SHAPES:
        n = nseq * t
        torch.manual_seed(args.seed + 3)
        q = torch.randn(n, hk, d, device=dev, dtype=dt)
        k = torch.randn(n, hk, d, device=dev, dtype=dt)
        v = torch.randn(n, hv, d, device=dev, dtype=dt)
        g = -torch.rand(n, hv, device=dev, dtype=torch.float32) * 0.5
        beta = torch.rand(n, hv, device=dev, dtype=torch.float32)
        state = torch.zeros(nseq, hv, d, d, device=dev, dtype=torch.float32)
        out = torch.empty_like(v)
        cu = torch.arange(0, n + 1, t, device=dev, dtype=torch.int32)

        def run_lmk():
            lmk.gated_delta_rule(q, k, v, g, beta, heads="block", cu_seqlens=cu, state=state, out=out)

        t_lmk = tt.do_bench_cudagraph(run_lmk)
        flops = 4.0 * n * hv * d * d
        t_fla = float("nan")
        if chunk_gated_delta_rule is not None:
            rep = hv // hk
            qf = q.repeat_interleave(rep, dim=1).view(nseq, t, hv, d)
            kf = k.repeat_interleave(rep, dim=1).view(nseq, t, hv, d)
            vf, gf, bf = v.view(nseq, t, hv, d), g.view(nseq, t, hv), beta.view(nseq, t, hv)

            def run_fla():
                chunk_gated_delta_rule(qf, kf, vf, g=gf, beta=bf, initial_state=state, output_final_state=True,
                                       use_qk_l2norm_in_kernel=True)

            t_fla = tt.do_bench_cudagraph(run_fla)
        print("%-18s %10.3f %7.1f %10.3f %7.1f %7.2fx" % (label, t_lmk, flops / t_lmk / 1e9, t_fla,
                                                          flops / t_fla / 1e9, t_fla / t_lmk))


def bench_layer(args):
    """The whole Gated DeltaNet layer at T = 4096 (Qwen3.5-27B's GDN shape, bf16, one sequence): Hugging Face's
    module eager and under torch.compile against the same module's projections around lmk's two calls; the
    projections are common to both, so the difference is the GDN part (conv + delta rule + gated norm)."""
    import triton.testing as tt
    dev, dt, t = "cuda", torch.bfloat16, 4096
    cfg = layer_config(5120, 16, 48, 128, 4)
    mod = make_layer(cfg, dev, dt, args.seed)
    x = torch.randn(1, t, 5120, device=dev, dtype=dt)
    lay = LmkLayer(mod, n_slots=1)
    cu = torch.tensor([0, t], device=dev, dtype=torch.int32)
    slots = torch.zeros(1, device=dev, dtype=torch.int32)
    with torch.no_grad():
        t_lmk = tt.do_bench_cudagraph(lambda: lay(x[0], cu, slots))
        t_hf = tt.do_bench_cudagraph(lambda: mod(x))
        comp = torch.compile(mod)
        t_hfc = tt.do_bench_cudagraph(lambda: comp(x))
    print("layer T=%d (27B GDN, bf16): lmk %.3f ms, HF eager %.3f ms (%.1fx), HF torch.compile %.3f ms (%.1fx)"
          % (t, t_lmk, t_hf, t_hf / t_lmk, t_hfc, t_hfc / t_lmk))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="f32")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--k-heads", type=int, default=4)
    ap.add_argument("--v-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--width", type=int, default=4)
    ap.add_argument("--batch", type=int, default=3)
    ap.add_argument("--T", type=int, default=37)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--fla", action="store_true", help="compare with FLA's kernels (GPU)")
    ap.add_argument("--bench", action="store_true", help="time decode against Hugging Face (GPU)")
    ap.add_argument("--prefill", action="store_true",
                    help="time prefill against FLA, and the whole layer against Hugging Face (GPU)")
    args = ap.parse_args()
    ok = check_layer(args)
    if args.fla:
        ok = check_fla(args) and ok
    if args.bench:
        bench(args)
    if args.prefill:
        bench_prefill(args)
        bench_layer(args)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
