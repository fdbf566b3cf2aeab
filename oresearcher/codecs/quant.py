"""Dense codecs: ``none`` (identity), ``fp16`` / ``bf16`` casts, and ``int8``.

int8 (per-chunk absmax scaling, as in 8-bit all-reduce schemes, e.g. Dettmers 2016,
"8-Bit Approximations for Parallelism in Deep Learning"): the flat input is cut into
chunks of ``chunk`` elements (default :data:`~oresearcher.comm.wire.INT8_CHUNK`, 2048; the last may be shorter). Per chunk ``c``
the wire holds ``absmax[c] = max |x|`` (compute dtype) and int8 codes
``q = round(x * 127 / absmax[c])``; the quantization step is ``s_c = absmax[c] / 127``
and ``decode = q * s_c``. Zero maps to code 0 and decodes to exactly zero.

Bounds (``s = s_c`` of the element's chunk; the slack terms cover float32 rounding of
the scale, the product and the decode, derived in the docstring of
:func:`quantize_int8`):

- round-to-nearest (ties to even): ``|decode - x| <= s/2 * (1 + 2**-13) + 2**-140``;
- stochastic (Gupta et al. 2015, "Deep Learning with Limited Numerical Precision"):
  ``q = floor(x/s + u)``, ``u ~ U[0, 1)``, so ``E[q*s] = x`` and
  ``|decode - x| < s * (1 + 2**-13) + 2**-140``.

Wire bytes: ``numel`` int8 codes plus one compute-dtype absmax per chunk: for float32
and the default chunk, ``numel + 4*ceil(numel/2048)``, 25.05% of float32.

Casts (fp16 / bf16): the input is scaled by a power of two ``2**shift`` (sent as one
int32) so that ``max |x| * 2**shift`` lies in ``[2**(T-1), 2**T)`` with ``T = 15``
(fp16: max 65504 > 2**15) or ``T = 127`` (bf16), then cast. Scaling by a power of two
changes no mantissa bit, so there is no overflow and small values keep precision
(PyTorch's fp16 compression hook divides by the world size first for the same reason).
Bound: ``|decode - x| <= max(u*|x|, h * 2**-shift)`` with unit roundoff
``u = 2**-11`` (fp16) / ``2**-8`` (bf16) and half the smallest subnormal
``h = 2**-25`` (fp16) / ``2**-134`` (bf16), plus ``2**-150`` where the float32 result
is subnormal.
"""
from __future__ import annotations

import math

import torch

from ..comm.wire import INT8_CHUNK
from . import fused, native
from .base import Codec, Field, RngState, check_finite, compute_dtype

# Rows of chunks processed per block on CPU: temporaries of ~2 MB stay in cache, and
# no full-size float temporary is ever allocated (fresh pages cost more than the math).
_BLOCK_ELEMS = 1 << 19
_CAST_TARGET_EXP = {torch.float16: 15, torch.bfloat16: 127}


class Identity(Codec):
    """``none``: the tensor as it is, in its own dtype."""

    spec = "none"

    def layout(self, numel, dtype=torch.float32):
        return (Field("data", dtype, numel),)

    def _encode(self, flat, dtype, key):
        check_finite(flat)
        return {"data": flat.to(dtype, copy=True)}

    def _decode(self, tensors, numel, dtype):
        return tensors["data"].to(compute_dtype(dtype))


class Cast(Codec):
    """``fp16`` / ``bf16``: power-of-two scaling, then a cast (see module docstring)."""

    def __init__(self, target: torch.dtype):
        if target not in _CAST_TARGET_EXP:
            raise ValueError(f"cast target must be float16 or bfloat16, got {target}")
        self.target = target
        self.spec = "fp16" if target == torch.float16 else "bf16"

    def layout(self, numel, dtype=torch.float32):
        return (Field("shift", torch.int32, 1), Field("data", self.target, numel))

    def _encode(self, flat, dtype, key):
        if fused.applies(flat):  # one pass for the absmax, one for scale + cast
            shift = cast_shift(float(fused.absmax(flat)), self.target, flat.dtype) if flat.numel() else 0
            return {"shift": torch.tensor([shift], dtype=torch.int32, device=flat.device),
                    "data": fused.scale_cast(flat, shift, self.target)}
        shift = 0
        if flat.numel():
            a = torch.maximum(flat.amax(), flat.amin().neg())
            if not torch.isfinite(a):
                raise ValueError("codec input holds non-finite values (NaN or inf)")
            shift = cast_shift(float(a), self.target, flat.dtype)
        data = torch.empty(flat.numel(), dtype=self.target, device=flat.device)
        spans = _spans(flat)
        tmp = torch.empty(spans[0][1] if spans and shift else 0, dtype=flat.dtype, device=flat.device)
        for i, j in spans:  # scale into a cached block, then cast: no full-size temporary
            data[i:j].copy_(torch.mul(flat[i:j], 2.0 ** shift, out=tmp[:j - i]) if shift else flat[i:j])
        return {"shift": torch.tensor([shift], dtype=torch.int32, device=flat.device), "data": data}

    def _decode(self, tensors, numel, dtype):
        cdt = compute_dtype(dtype)
        shift = int(tensors["shift"][0])
        data = tensors["data"]
        if cdt == torch.float32 and fused.applies(data, self.target):
            return fused.unscale(data, shift)  # clamped as below
        out = torch.empty(data.numel(), dtype=cdt, device=data.device)
        for i, j in _spans(out):
            out[i:j].copy_(data[i:j])
            if shift:
                out[i:j].mul_(2.0 ** -shift)  # exact: a power of two (bar subnormal results)
        # Rounding up at the top of the range can exceed the compute dtype's maximum
        # only when the decoded range reaches 2**(max exponent); clamp back to finite.
        if _CAST_TARGET_EXP[self.target] - shift >= _maxexp(cdt):
            big = torch.finfo(cdt).max
            out = out.clamp_(-big, big)
        return out


def _maxexp(dtype: torch.dtype) -> int:
    """Smallest ``e`` with every finite value of ``dtype`` below ``2**e`` (128 for float32)."""
    return math.frexp(torch.finfo(dtype).max)[1]


def cast_shift(absmax: float, target: torch.dtype, cdt: torch.dtype) -> int:
    """Exponent ``shift`` so that ``absmax * 2**shift`` is in ``[2**(T-1), 2**T)``,
    clamped so that ``2**shift`` is a normal number of the compute dtype."""
    if absmax == 0.0:
        return 0
    _, e = math.frexp(absmax)  # absmax in [2**(e-1), 2**e)
    lim = _maxexp(cdt) - 2
    return max(-lim, min(lim, _CAST_TARGET_EXP[target] - e))


class Int8(Codec):
    """``int8`` / ``int8:stochastic``: per-chunk absmax int8 (see module docstring).

    Stochastic rounding draws from a generator seeded with ``seed``, which should
    differ between agents (independent rounding errors average out in the sum).
    """

    def __init__(self, stochastic: bool = False, chunk: int = INT8_CHUNK, seed: int = 0):
        if chunk < 1:
            raise ValueError(f"int8 chunk must be >= 1, got {chunk}")
        self.stochastic, self.chunk = bool(stochastic), int(chunk)
        self.rng = RngState(seed) if stochastic else None
        self.spec = "int8" + (":stochastic" if stochastic else "") + (f":chunk={chunk}" if chunk != INT8_CHUNK else "")

    def layout(self, numel, dtype=torch.float32):
        nchunks = -(-numel // self.chunk)
        return (Field("absmax", compute_dtype(dtype), nchunks), Field("codes", torch.int8, numel))

    def _encode(self, flat, dtype, key):
        gen = self.rng.generator(flat.device) if self.stochastic else None
        absmax, codes = quantize_int8(flat, self.chunk, gen)
        return {"absmax": absmax, "codes": codes}

    def _decode(self, tensors, numel, dtype):
        return dequantize_int8(tensors["absmax"], tensors["codes"], self.chunk, compute_dtype(dtype))

    def state_dict(self):
        return {"rng": self.rng.state_dict()} if self.stochastic else {}

    def load_state_dict(self, state):
        if self.stochastic:
            self.rng.load_state_dict(state["rng"])
        else:
            super().load_state_dict(state)


def _chunk_views(flat: torch.Tensor, chunk: int, *others):
    """``(rows, chunk)`` views of the full chunks and a ``(1, tail)`` view of the rest,
    for ``flat`` and for each tensor of ``others`` laid out the same way."""
    n = flat.numel()
    full = n - n % chunk
    out = []
    if full:
        out.append(tuple(t[:full].view(-1, chunk) for t in (flat,) + others))
    if n > full:
        out.append(tuple(t[full:].view(1, -1) for t in (flat,) + others))
    return out


def _spans(t: torch.Tensor):
    """``(start, stop)`` element ranges of cache-sized blocks (one range off CPU)."""
    step = _BLOCK_ELEMS if t.device.type == "cpu" else max(1, t.numel())
    return [(i, min(t.numel(), i + step)) for i in range(0, t.numel(), step)]


def _block_rows(device: torch.device, width: int) -> int:
    return max(1, _BLOCK_ELEMS // width) if device.type == "cpu" else 1 << 62


def quantize_int8(flat: torch.Tensor, chunk: int, gen=None, use_native: bool = True):
    """Per-chunk absmax and int8 codes of ``flat`` (nearest, or stochastic if ``gen``).

    Round-to-nearest on contiguous float32 CPU input runs the fused C kernel of
    :mod:`oresearcher.codecs.native` when it is available (same bits); the torch code
    below is the reference and the fallback (``use_native=False`` forces it).

    Error analysis (round-to-nearest, float32, unit roundoff e = 2**-24): with
    ``inv = fl(127/a)`` and ``y = fl(x*inv)``, ``|y - 127x/a| <= 127*2e`` because
    ``|x| <= a``, so ``|q - 127x/a| <= 1/2 + 2**-16``; the decode ``fl(q*fl(a/127))``
    adds at most ``a*2e``. In units of ``s = a/127``:
    ``|q*s - x| <= s/2 * (1 + 2**-15 + 254*2**-23) <= s/2 * (1 + 2**-13)``.
    Chunks whose ``127/a`` overflows (``a`` tiny) are quantized as ``(x/a)*127``.
    All chunk scales are computed and checked finite before any random draw.
    """
    if use_native and fused.applies(flat):  # CUDA: the Triton kernel (other uniforms when stochastic)
        fast = fused.int8_quantize(flat, chunk, gen)
        if fast is not None:
            return fast[:2]
    if gen is None and use_native:
        fast = native.int8_quantize(flat, chunk)
        if fast is not None:
            return fast
    n = flat.numel()
    absmax = torch.empty(-(-n // chunk), dtype=flat.dtype, device=flat.device)
    codes = torch.empty(n, dtype=torch.int8, device=flat.device)
    views = _chunk_views(flat, chunk, codes)
    row0 = 0
    for src, _ in views:  # pass 1: every chunk's absmax (read-only, vectorised)
        absmax[row0:row0 + src.shape[0]] = torch.maximum(src.amax(1), src.amin(1).neg())
        row0 += src.shape[0]
    if n and not torch.isfinite(absmax).all():
        raise ValueError("codec input holds non-finite values (NaN or inf)")
    inv = torch.full_like(absmax, 127.0).div_(absmax)  # inf where a == 0 (codes 0) or where a is so tiny that 127/a overflows
    tiny = torch.isinf(inv) & (absmax > 0)
    inv.masked_fill_(torch.isinf(inv), 0.0)
    row0 = 0
    for src, dst in views:  # pass 2: codes, block by block
        rows = _block_rows(flat.device, src.shape[1])
        tmp = torch.empty(min(rows, src.shape[0]) * src.shape[1], dtype=flat.dtype, device=flat.device)
        noise = torch.empty_like(tmp) if gen is not None else None
        for r in range(0, src.shape[0], rows):
            blk = src[r:r + rows]
            y = tmp[:blk.numel()].view(blk.shape)
            torch.mul(blk, inv[row0 + r:row0 + r + blk.shape[0], None], out=y)
            _round(y, gen, noise)
            dst[r:r + rows].copy_(y)
        row0 += src.shape[0]
    if n and bool(tiny.any()):  # rare: divide first, |x/a| <= 1 cannot overflow
        for c in torch.nonzero(tiny).view(-1).tolist():
            seg = slice(c * chunk, min(n, (c + 1) * chunk))
            y = flat[seg] / absmax[c] * 127.0
            codes[seg] = _round(y, gen, torch.empty_like(y) if gen is not None else None).to(torch.int8)
    return absmax, codes


def _round(y, gen, noise):
    """In place: round half to even, or stochastic ``floor(y + u)`` clipped to +-127."""
    if gen is None:
        return y.round_()
    u = noise[:y.numel()].view(y.shape)
    torch.rand(y.shape, generator=gen, out=u)
    return y.add_(u).floor_().clamp_(-127.0, 127.0)


def dequantize_int8(absmax: torch.Tensor, codes: torch.Tensor, chunk: int, cdt: torch.dtype,
                    use_native: bool = True) -> torch.Tensor:
    """``codes * absmax/127`` chunk by chunk, into a new ``cdt`` tensor (the native
    kernel where it applies, as in :func:`quantize_int8`)."""
    if use_native and cdt == torch.float32 and fused.applies(absmax):
        return fused.int8_decode(absmax, codes, chunk)
    out = native.int8_dequantize(absmax, codes, chunk, cdt) if use_native else None
    if out is not None:
        return out  # the kernel clamps too
    out = torch.empty(codes.numel(), dtype=cdt, device=codes.device)
    step = absmax.to(cdt) / 127.0
    row0 = 0
    for dst, src in _chunk_views(out, chunk, codes):
        rows = _block_rows(out.device, dst.shape[1])
        for r in range(0, dst.shape[0], rows):
            d = dst[r:r + rows]
            d.copy_(src[r:r + rows]).mul_(step[row0 + r:row0 + r + d.shape[0], None])  # in cache
        row0 += dst.shape[0]
    # 127 * fl(a/127) can round above a; near the top of the range that is inf.
    big = torch.finfo(cdt).max
    if absmax.numel() and bool((absmax.to(cdt) > big * (1 - 2.0**-16)).any()):
        out.clamp_(-big, big)
    return out
