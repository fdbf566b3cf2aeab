"""The fused codec path: Triton kernels for CUDA tensors, the eager path as reference.

Eager torch runs about eight small kernels per int8 chunk pass (0.02-0.12x the speed of
a device copy, measured on an H200); one Triton kernel reads the input once and writes
the payload once. Selection (:func:`applies`): CUDA float32 tensors, when ``triton``
imports and ``ORESEARCHER_TRITON`` is not ``0``; everything else, and every case a
kernel does not cover (float64, int8 chunks over ``MAX_CHUNK``), runs the eager path,
which stays the reference: the kernels use the same float32 operations in the same order
and give the same bits (``tests/codecs/test_codec_triton.py`` runs them on CPU tensors
in Triton's interpreter, ``TRITON_INTERPRET=1``, against the eager path).

What is fused:

- int8 nearest and stochastic: absmax, scale and codes of a chunk in one pass. The
  stochastic uniforms come from Triton's Philox (``tl.rand``) keyed by a seed drawn from
  the codec's own generator, so a run is reproducible and its state checkpoints as
  before; they are *other* uniforms than the eager path's ``torch.rand`` (the same
  distribution, so the same bounds and unbiasedness), so on CUDA ``int8:stochastic``
  rounds differently with and without Triton.
- ``ef(int8...)``: ``v = e + x``, the codes and the new residual ``v - decode`` in the
  same pass; the residual is written to a new buffer, so a non-finite input leaves the
  state untouched, as in :mod:`.feedback`.
- fp16/bf16: the power-of-two scale fused with the cast, and with the cast back.
- rand-k: indices generated on the device (:func:`device_indices`) and gathered in the
  same pass; see :mod:`.sparse` for the index streams.
"""
from __future__ import annotations

import functools
import os

import torch

MAX_CHUNK = 1 << 14  # an int8 chunk is one row of a tile: up to 16384 elements
_TILE = 4096  # elements per program (rows x padded chunk)
_BLOCK = 4096


@functools.cache
def kernels():
    """The kernel module, or None where triton does not import. Triton decides once per
    process, when it is first imported, whether kernels compile for the GPU or run in its
    interpreter (``TRITON_INTERPRET=1``, which runs them on CPU tensors too)."""
    try:
        from . import triton_kernels
    except Exception:  # not installed, or a broken install: the eager path runs
        return None
    return triton_kernels


def interpreted() -> bool:
    """Whether this process runs the kernels in Triton's interpreter (decided when they
    were decorated, whatever TRITON_INTERPRET says now)."""
    k = kernels()
    if k is None:
        return False
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(k.int8_decode, InterpretedFunction)


def applies(t: torch.Tensor, dtype: torch.dtype = torch.float32) -> bool:
    """Whether the fused path runs for ``t``: ``dtype`` (float32) on CUDA, triton
    importable and compiling (not the interpreter), not disabled by ``ORESEARCHER_TRITON=0``."""
    return (t.device.type == "cuda" and t.dtype == dtype
            and os.environ.get("ORESEARCHER_TRITON", "1") != "0" and kernels() is not None and not interpreted())


def _launch(kernel, grid, t, *args, **meta):
    """Launch ``kernel`` for tensor ``t``'s device: compiled kernels take CUDA tensors only."""
    if not interpreted():
        if t.device.type != "cuda":
            raise RuntimeError(f"compiled Triton kernels need CUDA tensors, got {t.device} "
                               "(CPU tensors run in the interpreter: TRITON_INTERPRET=1)")
        meta["enable_fp_fusion"] = False  # v - q*s and v*inv + u rounded twice, as eager
    kernel[grid](*args, **meta)


def _tile(chunk: int) -> tuple[int, int]:
    block = 1 << max(0, (chunk - 1).bit_length())
    return max(1, _TILE // block), block


def int8_encode(flat: torch.Tensor, chunk: int, residual=None, ef: bool = False, seed=None, noise=None):
    """``(absmax, codes, new_residual, flags)`` of int8 (with error feedback if ``ef``),
    or None where the kernel does not apply (chunk over ``MAX_CHUNK``, not float32).

    Stochastic rounding takes uniforms from ``noise`` (a tensor like ``flat``: the tests'
    way to feed the eager path's draws) or from Philox with ``seed``; neither: nearest.
    ``flags`` per chunk: 1 non-finite input, 2 non-finite input plus residual."""
    if chunk > MAX_CHUNK or flat.dtype != torch.float32:
        return None
    k = kernels()
    n = flat.numel()
    nchunks = -(-n // chunk)
    absmax = torch.empty(nchunks, dtype=torch.float32, device=flat.device)
    codes = torch.empty(n, dtype=torch.int8, device=flat.device)
    flags = torch.zeros(nchunks, dtype=torch.int8, device=flat.device)
    enew = torch.empty_like(flat) if ef else codes
    rows, block = _tile(chunk)
    if n:
        mode = 1 if noise is not None else 2 if seed is not None else 0
        _launch(k.int8_encode, (-(-nchunks // rows),), flat, flat, residual if residual is not None else flat, enew,
                noise if noise is not None else flat, absmax, codes, flags, n, nchunks, chunk, int(seed or 0),
                HAS_E=residual is not None, EF=ef, NOISE=mode, ROWS=rows, BLOCK=block)
    return absmax, codes, (enew if ef else None), flags


def int8_quantize(flat: torch.Tensor, chunk: int, gen=None, residual=None, ef: bool = False):
    """:func:`int8_encode` with the codec's checks: ``(absmax, codes, new_residual)`` or
    None. ValueError("...non-finite...") on a non-finite input and OverflowError on a
    finite input whose sum with ``residual`` is not finite; ``gen`` (stochastic rounding)
    is left as it was when either is raised."""
    state = gen.get_state() if gen is not None else None
    seed = int(torch.randint(2**31 - 1, (1,), generator=gen, device=gen.device)) if gen is not None else None
    out = int8_encode(flat, chunk, residual, ef, seed)
    if out is None:
        if gen is not None:
            gen.set_state(state)
        return None
    absmax, codes, enew, flags = out
    if flags.numel() and bool(flags.any()):
        if gen is not None:
            gen.set_state(state)
        if bool((flags & 1).any()):
            raise ValueError("codec input holds non-finite values (NaN or inf)")
        raise OverflowError("input plus residual is not finite")
    return absmax, codes, enew


def int8_decode(absmax: torch.Tensor, codes: torch.Tensor, chunk: int):
    """The decoded float32 tensor (the same bits as :func:`.quant.dequantize_int8`)."""
    out = torch.empty(codes.numel(), dtype=torch.float32, device=codes.device)
    if codes.numel():
        _launch(kernels().int8_decode, (-(-codes.numel() // _BLOCK),), codes, absmax, codes, out, codes.numel(),
                chunk, BLOCK=_BLOCK)
    return out


def absmax(flat: torch.Tensor) -> torch.Tensor:
    """``max |x|`` as a 0-d tensor, or ValueError on a non-finite element."""
    nb = max(1, -(-flat.numel() // _BLOCK))
    part = torch.zeros(nb, dtype=torch.float32, device=flat.device)
    flags = torch.zeros(nb, dtype=torch.int8, device=flat.device)
    if flat.numel():
        _launch(kernels().absmax_partials, (nb,), flat, flat, part, flags, flat.numel(), BLOCK=_BLOCK)
    if bool(flags.any()):
        raise ValueError("codec input holds non-finite values (NaN or inf)")
    return part.amax()


def scale_cast(flat: torch.Tensor, shift: int, target: torch.dtype) -> torch.Tensor:
    """``(flat * 2**shift).to(target)`` in one pass."""
    out = torch.empty(flat.numel(), dtype=target, device=flat.device)
    if flat.numel():
        _launch(kernels().scale_cast, (-(-flat.numel() // _BLOCK),), flat, flat,
                out.view(torch.int16) if target == torch.bfloat16 else out, flat.numel(), float(2.0 ** shift),
                BF16=target == torch.bfloat16, BLOCK=_BLOCK)
    return out


def unscale(data: torch.Tensor, shift: int) -> torch.Tensor:
    """``data.float() * 2**-shift``, clamped to the finite float32 range, in one pass."""
    out = torch.empty(data.numel(), dtype=torch.float32, device=data.device)
    if data.numel():
        _launch(kernels().unscale, (-(-data.numel() // _BLOCK),), data,
                data.view(torch.int16) if data.dtype == torch.bfloat16 else data, out, data.numel(),
                float(2.0 ** -shift), BF16=data.dtype == torch.bfloat16, BLOCK=_BLOCK)
    return out


def device_indices(seed: int, d: int, k: int, device) -> torch.Tensor:
    """Rand-k's device-stream indices (:func:`.sparse.hash_indices`' bits) by the kernel."""
    idx = torch.empty(k, dtype=torch.int64, device=device)
    if k:
        _launch(kernels().randk_indices, (-(-k // _BLOCK),), idx, idx, _signed(seed), d, k, BLOCK=_BLOCK)
    return idx


def randk_gather(flat: torch.Tensor, seed: int, k: int) -> torch.Tensor:
    """``flat[device_indices(seed, d, k)]`` without materialising the indices."""
    vals = torch.empty(k, dtype=flat.dtype, device=flat.device)
    if k:
        _launch(kernels().randk_gather, (-(-k // _BLOCK),), flat, flat, vals, _signed(seed), flat.numel(), k,
                BLOCK=_BLOCK)
    return vals


def _signed(seed: int) -> int:
    return seed - (1 << 64) if seed >= 1 << 63 else seed
