"""ref.py - float64 NumPy references for the Python tests, written from include/lmk.h's formulas alone (not from
the C code): rope in every mode with YaRN scaling and freq_factors, repeat_heads in both layouts, the RMS norm
of attn_prologue, and the tolerances lmk.h promises (its "Precision" paragraphs).
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
