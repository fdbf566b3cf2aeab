"""Slow, obvious float64 references for the codecs, and shared hypothesis strategies.

Each reference is written from the definition in the codec's docstring, in float64
with numpy, element by element where that is clearer; nothing here calls the code under
test.
"""
from __future__ import annotations

import math
import os

import numpy as np
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

# CODEC_EXAMPLES_SCALE=10 multiplies every property test's example count (soak runs).
EXAMPLES_SCALE = int(os.environ.get("CODEC_EXAMPLES_SCALE", "1"))
INT8_SLACK = 2.0**-13  # relative slack of the int8 bound (float32 rounding)
INT8_ABS = 2.0**-140  # absolute slack (subnormal scales)



def examples(n: int) -> settings:
    """Hypothesis settings with ``n`` examples (times CODEC_EXAMPLES_SCALE), no deadline."""
    return settings(max_examples=n * EXAMPLES_SCALE, deadline=None)


finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


def arrays32(min_size=0, max_size=300, elements=finite32):
    """float32 vectors of arbitrary finite values (hypothesis also tries constant ones)."""
    return hnp.arrays(np.float32, st.integers(min_size, max_size), elements=elements)


def t32(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))


def int8_ref(x: np.ndarray, chunk: int):
    """Per chunk: absmax ``a``, step ``s = a/127``, codes ``round_half_even(x/s)``,
    decode ``q*s``; all float64. Returns (absmax, step, codes, decoded) per element
    (absmax and step repeated over the chunk's elements)."""
    x64 = np.asarray(x, dtype=np.float64)
    n = x64.size
    absmax, step, codes, dec = (np.zeros(n) for _ in range(4))
    for c0 in range(0, n, chunk):
        seg = x64[c0:c0 + chunk]
        a = float(np.max(np.abs(seg)))
        s = a / 127.0
        q = np.round(seg / s) if a > 0 else np.zeros_like(seg)
        absmax[c0:c0 + chunk], step[c0:c0 + chunk] = a, s
        codes[c0:c0 + chunk], dec[c0:c0 + chunk] = q, q * s
    return absmax, step, codes, dec


def int8_bound(x: np.ndarray, chunk: int, stochastic: bool = False) -> np.ndarray:
    """The promised per-element bound: s/2 (nearest) or s (stochastic), plus slack."""
    _, step, _, _ = int8_ref(x, chunk)
    return (step if stochastic else step / 2) * (1 + INT8_SLACK) + INT8_ABS


CAST = {"fp16": (torch.float16, 15, 2.0**-11, 2.0**-25), "bf16": (torch.bfloat16, 127, 2.0**-8, 2.0**-134)}


def cast_ref(x: np.ndarray, spec: str):
    """(shift, decoded): scale by 2**shift so max|x| lands in [2**(T-1), 2**T), round
    once from float64 to the target type, scale back, round to float32 (clamped)."""
    target, T, _, _ = CAST[spec]
    x64 = np.asarray(x, dtype=np.float64)
    a = float(np.max(np.abs(x64))) if x64.size else 0.0
    shift = 0 if a == 0 else max(-126, min(126, T - math.frexp(a)[1]))
    y = torch.from_numpy(x64 * 2.0**shift).to(target).double().numpy() * 2.0**-shift
    big = float(np.finfo(np.float32).max)
    return shift, np.clip(y, -big, big).astype(np.float32)


def cast_bound(x: np.ndarray, spec: str, shift: int) -> np.ndarray:
    _, _, u, h = CAST[spec]
    x64 = np.abs(np.asarray(x, dtype=np.float64))
    return np.maximum(u * x64, h * 2.0**-shift) + 2.0**-150


def topk_ref_magnitudes(x: np.ndarray, k: int) -> np.ndarray:
    """The k largest |x| in descending order (float64); unique even with ties."""
    return np.sort(np.abs(np.asarray(x, dtype=np.float64)))[::-1][:k]


def k_ref(ratio: float, d: int) -> int:
    return 0 if d == 0 else min(d, max(1, round(ratio * d)))
