"""ref.py - float64 NumPy references for the Python tests, written from include/lmk.h's formulas alone (not from
the C code): rope in every mode with YaRN scaling and freq_factors, repeat_heads in both layouts, the RMS norm
of attn_prologue, causal_conv1d and gated_delta_rule over packed sequences and state pools, and the tolerances
lmk.h promises (its "Precision" paragraphs).
"""
import math

import numpy as np

MODES = {"normal": 0, "neox": 2, "mrope": 8, "imrope": 40, "vision": 24}


def f32(v):
    """A parameter as the C struct holds it (float), widened: lmk computes from the float value."""
    return float(np.float32(v))


def _axis_and_j(mode, sections, p):
    """lmk.h: the position axis (0 t, 1 h, 2 w, 3 e) of pair p and its exponent index j."""
    if mode in ("normal", "neox"):
        return 0, p
    s = list(sections) + [0] * (4 - len(sections))
    total = sum(s) or 1
    sector = p % total
    if mode == "imrope":
        for axis in range(3):
            if sector % 3 == axis and sector < 3 * s[axis]:
                return axis, p
        return 3, p
    start = 0
    for axis in range(3):
        if sector < start + s[axis]:
            return axis, (sector - start if mode == "vision" else p)
        start += s[axis]
    return 3, (sector - start if mode == "vision" else p)


def _pair(mode, pairing, p, rope_dim, head_dim):
    if mode == "normal":
        return 2 * p, 2 * p + 1
    if mode == "vision" or pairing == "half_head":
        return p, p + head_dim // 2
    return p, p + rope_dim // 2


def rope_ref(x, positions, *, mode="neox", rope_dim=None, freq_base=10000.0, sections=(0, 0, 0, 0),
             pairing="half_rope", freq_scale=1.0, ext_factor=0.0, attn_factor=1.0, beta_fast=32.0, beta_slow=1.0,
             n_ctx_orig=0, freq_factors=None):
    """rope of x [T, H, D] (any float dtype, widened exactly) in float64. positions: T entries, or 4*T
    axis-major for the multi modes. Returns (out64 [T, H, D], m)."""
    x = np.asarray(x, dtype=np.float64)
    T, H, D = x.shape
    rope_dim = D if rope_dim is None else rope_dim
    pos = np.asarray(positions).astype(np.int64).reshape(-1)
    pos = pos.reshape(4, T) if mode in ("mrope", "imrope", "vision") else pos.reshape(1, T)
    pos = pos.astype(np.float64)
    base, fs, af = f32(freq_base), f32(freq_scale) or 1.0, f32(attn_factor) or 1.0
    ext, bf, bs = f32(ext_factor), f32(beta_fast) or 32.0, f32(beta_slow) or 1.0
    n = D / 2 if mode == "vision" else float(rope_dim)
    m = af
    if ext != 0.0:
        def corr(b):
            return n * math.log(n_ctx_orig / (2 * math.pi * b)) / (2 * math.log(base))
        low, high = max(0.0, math.floor(corr(bf))), min(n - 1, math.ceil(corr(bs)))
        m = af * (1 + 0.1 * math.log(1 / fs))
    out = x.copy()
    for p in range(rope_dim // 2):
        axis, j = _axis_and_j(mode, sections, p)
        ff = 1.0 if freq_factors is None else float(np.float32(freq_factors[p]))
        theta_e = pos[axis] * base ** (-2.0 * j / n) / ff
        theta_i = fs * theta_e
        if ext == 0.0:
            theta = theta_i
        else:
            y = (p - low) / max(0.001, high - low)
            ramp = (1 - min(max(y, 0.0), 1.0)) * ext
            theta = theta_i * (1 - ramp) + theta_e * ramp
        ia, ib = _pair(mode, pairing, p, rope_dim, D)
        c, s = np.cos(theta)[:, None], np.sin(theta)[:, None]
        a, b = x[:, :, ia], x[:, :, ib]
        out[:, :, ia] = (a * c - b * s) * m
        out[:, :, ib] = (a * s + b * c) * m
    return out, m


def rotated_mask(mode, pairing, rope_dim, head_dim):
    """True for the elements of a head that rope rotates; the others are copied bit-exactly."""
    mask = np.zeros(head_dim, dtype=bool)
    for p in range(rope_dim // 2):
        ia, ib = _pair(mode, pairing, p, rope_dim, head_dim)
        mask[ia] = mask[ib] = True
    return mask


def ulp(values, dtype):
    """One unit in the last place of dtype at |values| (float16 through NumPy; bfloat16: 8 significant bits)."""
    v = np.abs(np.asarray(values, dtype=np.float64))
    if dtype == "bfloat16":
        e = np.floor(np.log2(np.maximum(v, 2.0 ** -126)))
        return 2.0 ** (e - 7)
    return np.spacing(v.astype(dtype)).astype(np.float64)


def rope_tolerance(ref, dtype, m):
    """lmk.h: f32 within 1e-5 * max(1, m) of the float64 result; bf16/f16 within one ulp of it plus 1e-6."""
    if dtype in ("float32", np.float32):
        return 1e-5 * max(1.0, m)
    return ulp(ref, "bfloat16" if dtype == "bfloat16" else np.dtype(dtype)) + 1e-6


def repeat_ref(x, h, layout):
    hg = x.shape[1]
    idx = np.arange(h) % hg if layout == "tiled" else np.arange(h) // (h // hg)
    return x[:, idx, :]


def rms_norm_ref(x, w, eps, weight_offset):
    """Per-head RMS norm over the last axis: x / sqrt(mean(x^2) + eps) * (w + weight_offset)."""
    x = np.asarray(x, dtype=np.float64)
    r = np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + f32(eps))
    return x / r * (np.asarray(w, dtype=np.float64) + f32(weight_offset))


# ---- Gated DeltaNet (lmk.h "Gated DeltaNet") ----

def sequences(T, cu_seqlens):
    """[(lo, hi)] of each sequence packed along T: cu_seqlens None is one sequence of all T tokens."""
    if cu_seqlens is None:
        return [(0, T)]
    cu = [int(c) for c in np.asarray(cu_seqlens).reshape(-1)]
    return list(zip(cu[:-1], cu[1:]))


def seq_rows(n_seq, state, state_slots):
    """Each sequence's pool row, or None (no pool, or a slot outside [0, n_slots)); and whether it stores
    its row: only the last of several sequences naming one row does (lmk.h)."""
    n_slots = 0 if state is None else state.shape[0]
    slots = list(range(n_seq)) if state_slots is None else [int(s) for s in np.asarray(state_slots).reshape(-1)]
    rows = [s if 0 <= s < n_slots else None for s in slots]
    stores = [r is not None and r not in rows[i + 1:] for i, r in enumerate(rows)]
    return rows, stores


def silu(x):
    return x / (1.0 + np.exp(-x))


def causal_conv1d_ref(x, weight, bias=None, activation="silu", cu_seqlens=None, state=None, state_slots=None):
    """lmk.h causal_conv1d in float64: y[t, c] = act(bias[c] + sum_j weight[c, j] * xx[t - (W-1) + j, c]), xx a
    sequence's tokens after its W-1 state rows (zeros without a row). Returns (y [T, C], the state pool after
    the call or None, bound [T, C]: |bias| + sum |weight * xx|, the scale of lmk.h's error bound). Every
    sequence reads its row as it was before the call."""
    x = np.asarray(x, np.float64)
    T, C = x.shape
    w = np.asarray(weight, np.float64).reshape(C, -1)
    W = w.shape[1]
    b = np.zeros(C) if bias is None else np.asarray(bias, np.float64)
    old = None if state is None else np.asarray(state, np.float64)
    new = None if old is None else old.copy()
    y, bound = np.zeros((T, C)), np.zeros((T, C))
    seqs = sequences(T, cu_seqlens)
    rows, stores = seq_rows(len(seqs), old, state_slots)
    for (lo, hi), row, store in zip(seqs, rows, stores):
        head = np.zeros((W - 1, C)) if row is None else old[row]
        xx = np.concatenate([head, x[lo:hi]])
        for t in range(hi - lo):
            win = xx[t:t + W]                       # [W, C]: the W-1 rows before token t, then token t
            y[lo + t] = b + np.einsum("cj,jc->c", w, win)
            bound[lo + t] = np.abs(b) + np.einsum("cj,jc->c", np.abs(w), np.abs(win))
        if store:
            new[row] = xx[-(W - 1):]
    if activation == "silu":
        y = silu(y)
    return y, new, bound


def gdn_ref(q, k, v, a, b, A_log=None, dt_bias=None, heads="block", scale=None, l2norm=True, cu_seqlens=None,
            state=None, state_slots=None, z=None, norm_w=None, eps=1e-6, weight_offset=0.0):
    """lmk.h gated_delta_rule in float64, token by token. Returns (out [T, Hv, dv], the state pool after the
    call [n_slots, Hv, dk, dv] or None, cond [T, Hv]): the state carried unrounded (the caller rounds a bf16
    pool); cond is each output row's condition number for f32 arithmetic, || |S|^T |qn| || / ||o|| (times
    max|g| ||o|| / ||g o|| for the gate g = (norm_w + weight_offset) * silu(z) of the gated norm): o = S^T qn
    sums terms of either sign, so a row where they nearly cancel carries the rounding of the terms, not of
    the row, and any f32 evaluation's relative error on it grows with cond."""
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    T, Hk, dk = q.shape
    Hv, dv = v.shape[1:]
    kh = np.arange(Hv) % Hk if heads == "tiled" else np.arange(Hv) // (Hv // Hk)
    sc = f32(scale) if scale else 1.0 / math.sqrt(dk)
    old = None if state is None else np.asarray(state, np.float64)
    new = None if old is None else old.copy()
    out, terms = np.zeros((T, Hv, dv)), np.zeros((T, Hv))
    seqs = sequences(T, cu_seqlens)
    rows, stores = seq_rows(len(seqs), old, state_slots)
    for (lo, hi), row, store in zip(seqs, rows, stores):
        S = np.zeros((Hv, dk, dv)) if row is None else old[row].copy()
        for t in range(lo, hi):
            if A_log is not None:
                x = a[t] + np.asarray(dt_bias, np.float64)
                g = -np.exp(np.asarray(A_log, np.float64)) * np.logaddexp(0.0, x)   # softplus(x) = ln(1 + e^x)
                beta = 1.0 / (1.0 + np.exp(-b[t]))
            else:
                g, beta = a[t], b[t]
            qt, kt = q[t][kh], k[t][kh]                                             # [Hv, dk]
            if l2norm:
                qt = qt / np.sqrt(np.sum(qt * qt, -1, keepdims=True) + 1e-6)
                kt = kt / np.sqrt(np.sum(kt * kt, -1, keepdims=True) + 1e-6)
            qt = qt * sc
            S = np.exp(g)[:, None, None] * S
            u = beta[:, None] * (v[t] - np.einsum("hkv,hk->hv", S, kt))
            S = S + kt[:, :, None] * u[:, None, :]
            out[t] = np.einsum("hkv,hk->hv", S, qt)
            terms[t] = np.linalg.norm(np.einsum("hkv,hk->hv", np.abs(S), np.abs(qt)), axis=-1)
        if store:
            new[row] = S
    tiny = 1e-300
    cond = terms / np.maximum(np.linalg.norm(out, axis=-1), tiny)
    if z is not None:
        gate = (np.asarray(norm_w, np.float64) + f32(weight_offset)) * silu(np.asarray(z, np.float64))
        cond = cond * np.abs(gate).max(-1) * np.linalg.norm(out, axis=-1) / np.maximum(
            np.linalg.norm(gate * out, axis=-1), tiny)
        out = out / np.sqrt(np.mean(out * out, -1, keepdims=True) + f32(eps)) * gate
    return out, new, np.maximum(cond, 1.0)


def rel_rows(got, ref, n_axes=1):
    """||got - ref|| / ||ref|| over each row of the last n_axes axes: lmk.h's norm-wise relative error."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    axes = tuple(range(-n_axes, 0))
    err = np.sqrt(np.sum((got - ref) ** 2, axis=axes))
    mag = np.sqrt(np.sum(ref ** 2, axis=axes))
    return err / np.maximum(mag, 1e-30)
