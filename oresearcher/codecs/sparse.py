"""Sparsifying codecs: top-k (exact and sampled-threshold) and rand-k.

Both keep ``k = max(1, round(ratio * d))`` of the ``d`` elements (``k = d`` at most,
``k = 0`` for empty tensors). The kept values travel through a *value codec*
(``none`` by default: the input dtype, bit-exact; ``topk:0.01+int8`` quantizes them).

top-k (Aji & Heafield 2017; Lin et al. 2018, "Deep Gradient Compression"): wire =
``idx`` (int32, or int64 beyond 2**31 elements) and the values, ``k`` slots each.

- exact (``topk:R``): ``torch.topk`` of ``|x|``; exactly ``k`` distinct indices even
  with ties, so the decode has exactly ``k`` non-zeros when ``x`` has at least ``k``.
  Contraction: ``||x - C(x)||^2 <= (1 - k/d) ||x||^2``.
- sampled threshold (``topk:R:approx``, DGC's sampling): the threshold ``t`` is the
  ``(1+margin)k/d`` upper quantile of ``|x|`` on a random sample (``margin = 0.25``,
  sample sized so about 400 sampled values lie above ``t``); every element with
  ``|x| >= t`` is a candidate; if there are at least ``k`` candidates the top ``k`` of
  them are kept, which *is* the exact top-k (all of it lies above ``t``). If there are
  fewer, but at least ``ceil((1-tol) k)`` (``tol = 0.1`` by default), all candidates
  are kept and the spare slots are filled with distinct dropped positions carrying 0;
  otherwise the threshold is lowered (4x the quantile, twice) and finally exact top-k is
  used. So the decode keeps ``k'`` elements with ``ceil((1-tol) k) <= k' <= k``, never
  drops a magnitude larger than a kept one, and contracts with ``k'`` in place of ``k``.
  One pass over ``|x|`` plus a top-k on ~1.25k candidates instead of on ``d``.

rand-k (Stich et al. 2018, "Sparsified SGD with Memory"): ``k`` indices drawn uniformly
*with replacement* from a generator seeded by ``(shared_seed, key, draw)``; the seed
must be equal on all agents, so all agents pick the same indices for the same key and
step, and only the 64-bit stream seed travels (8 bytes), not the indices. Decode sums
``(d/k) * value`` at each drawn index (a repeated index adds twice), which makes the
estimate unbiased: ``E[decode] = x``.

Index streams: on CPU the indices come from ``torch.randint`` on a CPU generator seeded
with the stream seed (63 bits). On CUDA they are generated on the device (drawing them on
the host and copying them cost 27.5 ms at 256M elements, measured on an H200): index
``i`` is ``splitmix64(seed + (i+1) * 0x9E3779B97F4A7C15) >> 1`` mod ``d``
(:func:`hash_indices`; bias below ``d / 2**63``), by a Triton kernel fused with the
gather where Triton runs, else by the same integer arithmetic in torch. Such payloads
carry the seed with its top bit set, so any receiver, on any device, regenerates the
stream the sender used.

On CUDA ``topk:R:approx`` runs exact ``torch.topk``: there it is the faster of the two
(0.67 ms against 0.81 ms at 1% of 25M elements, measured on an H200), and exact top-k
meets approx's promises (``k' = k``).
"""
from __future__ import annotations

import logging
import math
import zlib

import torch

from . import fused
from .base import Codec, Field, RngState, check_finite, compute_dtype, index_dtype, prefixed, sub_tensors
from .quant import Identity

log = logging.getLogger(__name__)

_MARGIN = 0.25  # oversampling of the threshold quantile (DGC uses a similar slack)
_HITS = 400  # sampled values expected above the threshold: quantile rel. error ~5%
_MIN_SAMPLE = 1024
_RETRIES = 2
_BLOCK = 1 << 19


def k_of(ratio: float, numel: int) -> int:
    """Kept elements: ``max(1, round(ratio * numel))``, at most ``numel``."""
    return 0 if numel == 0 else min(numel, max(1, round(ratio * numel)))


def _check_ratio(ratio: float) -> float:
    ratio = float(ratio)
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"ratio must be in (0, 1], got {ratio}")
    return ratio


class _Sparse(Codec):
    """Common part of top-k and rand-k: the value codec and its layout."""

    def __init__(self, ratio: float, values: Codec = None):
        self.ratio = _check_ratio(ratio)
        self.values = values if values is not None else Identity()

    def _values_spec(self) -> str:
        return "" if isinstance(self.values, Identity) else "+" + self.values.spec

    def _values_layout(self, k, dtype):
        return prefixed(self.values.layout(k, dtype), "values.")

    def _encode_values(self, vals, dtype, key) -> dict:
        sub = self.values._encode(vals, dtype, key)
        return {"values." + n: t for n, t in sub.items()}

    def _decode_values(self, tensors, k, dtype):
        return self.values._decode(sub_tensors(tensors, "values."), k, dtype)

    def state_dict(self):
        return {"values": self.values.state_dict()}

    def load_state_dict(self, state):
        self.values.load_state_dict(state["values"])


class TopK(_Sparse):
    """``topk:R`` (exact) and ``topk:R:approx`` (sampled threshold); see module docstring."""

    def __init__(self, ratio, approx=False, tol=0.1, values=None, seed=0):
        super().__init__(ratio, values)
        if not 0.0 <= tol < 1.0:
            raise ValueError(f"topk tol must be in [0, 1), got {tol}")
        self.approx, self.tol = bool(approx), float(tol)
        self.rng = RngState(seed) if approx else None
        extra = (":approx" + (f":tol={self.tol!r}" if self.tol != 0.1 else "")) if approx else ""
        self.spec = f"topk:{self.ratio!r}{extra}" + self._values_spec()

    def layout(self, numel, dtype=torch.float32):
        k = k_of(self.ratio, numel)
        return (Field("idx", index_dtype(numel), k),) + self._values_layout(k, dtype)

    def _encode(self, flat, dtype, key):
        d = flat.numel()
        k = k_of(self.ratio, d)
        if self.approx and d and flat.device.type != "cuda":  # CUDA: exact is faster (module docstring)
            check_finite(flat)
            idx, kept = threshold_topk_indices(flat, k, self.rng.generator(flat.device), self.tol)
        else:
            idx, kept = torch.topk(flat.abs(), k, sorted=False).indices, k
            check_finite(flat[idx])  # NaN and +-inf rank above every finite |x|
        vals = flat[idx]
        vals[kept:] = 0  # padding slots (sampled threshold only) carry zeros
        return {"idx": idx.to(index_dtype(d)), **self._encode_values(vals, dtype, key)}

    def _decode(self, tensors, numel, dtype):
        k = k_of(self.ratio, numel)
        out = torch.zeros(numel, dtype=compute_dtype(dtype), device=tensors["idx"].device)
        # Indices are distinct (padding slots use dropped positions), so a plain
        # scatter is deterministic and keeps the kept values bit-exact.
        out[tensors["idx"].long()] = self._decode_values(tensors, k, dtype)
        return out

    def state_dict(self):
        sd = super().state_dict()
        if self.approx:
            sd["rng"] = self.rng.state_dict()
        return sd

    def load_state_dict(self, state):
        super().load_state_dict(state)
        if self.approx:
            self.rng.load_state_dict(state["rng"])


def threshold_topk_indices(flat: torch.Tensor, k: int, gen: torch.Generator, tol: float):
    """``(idx, k')``: ``k`` distinct indices whose first ``k'`` are kept elements.

    Usually ``k' = k`` and ``idx`` is a top-k of ``|flat|``; rarely ``idx`` holds the
    ``k' >= ceil((1-tol)k)`` elements above a sampled threshold followed by ``k - k'``
    dropped positions used as padding (sent with value 0)."""
    d = flat.numel()
    frac = k / d
    m = min(d, max(_MIN_SAMPLE, math.ceil(_HITS / (frac * (1 + _MARGIN)))))
    sample = flat[torch.randint(d, (m,), generator=gen, device=flat.device)].abs()
    need = math.ceil((1 - tol) * k)
    for attempt in range(_RETRIES + 1):
        above = math.ceil(m * frac * (1 + _MARGIN) * 4 ** attempt)  # sampled values >= t
        if above >= m:
            break
        t = float(torch.kthvalue(sample, m - above + 1).values)
        cand = _indices_at_least(flat, t)
        if cand.numel() >= k:
            keep = torch.topk(flat[cand].abs(), k, sorted=False).indices
            return cand[keep], k
        if cand.numel() >= need:
            return torch.cat([cand, _padding_positions(cand, d, k - cand.numel())]), cand.numel()
        log.debug("threshold top-k: %d candidates for k=%d, lowering the threshold", cand.numel(), k)
    return torch.topk(flat.abs(), k, sorted=False).indices, k


def _indices_at_least(flat: torch.Tensor, t: float) -> torch.Tensor:
    """Sorted indices where ``|flat| >= t`` (blocked on CPU: no full-size temporary)."""
    if flat.device.type != "cpu":
        return torch.nonzero(flat.abs() >= t).view(-1)
    tmp = torch.empty(min(_BLOCK, flat.numel()), dtype=flat.dtype)
    parts = []
    for i in range(0, flat.numel(), _BLOCK):
        blk = flat[i:i + _BLOCK]
        a = torch.abs(blk, out=tmp[:blk.numel()])
        parts.append(torch.nonzero(a >= t).view(-1).add_(i))
    return torch.cat(parts)


def _padding_positions(kept: torch.Tensor, d: int, count: int) -> torch.Tensor:
    """``count`` positions not in ``kept`` (padding slots; their value is sent as 0)."""
    free = torch.ones(d, dtype=torch.bool, device=kept.device)
    free[kept] = False
    return torch.nonzero(free).view(-1)[:count]


class RandK(_Sparse):
    """``randk:R``: shared-seed random-k, scaled by ``d/k`` to be unbiased."""

    def __init__(self, ratio, values=None, shared_seed=0):
        super().__init__(ratio, values)
        self.shared_seed = int(shared_seed)
        self.draws: dict = {}
        self.spec = f"randk:{self.ratio!r}" + self._values_spec()

    def layout(self, numel, dtype=torch.float32):
        return (Field("seed", torch.int64, 1),) + self._values_layout(k_of(self.ratio, numel), dtype)

    def _encode(self, flat, dtype, key):
        check_finite(flat)
        draw = self.draws.get(key, 0)
        self.draws[key] = draw + 1
        seed = stream_seed(self.shared_seed, key, draw)
        d, k = flat.numel(), k_of(self.ratio, flat.numel())
        if flat.device.type == "cuda":  # the device stream (module docstring)
            seed |= DEVICE_STREAM
            if fused.applies(flat):
                vals = fused.randk_gather(flat, seed, k)  # indices generated and gathered in one pass
            else:
                vals = flat[hash_indices(seed, d, k, flat.device)]
        else:
            vals = flat[rand_indices(seed, d, k, flat.device)]
        return {"seed": torch.tensor([_int64(seed)], dtype=torch.int64, device=flat.device),
                **self._encode_values(vals, dtype, key)}

    def _decode(self, tensors, numel, dtype):
        k = k_of(self.ratio, numel)
        seed = int(tensors["seed"][0]) % (1 << 64)
        vals = self._decode_values(tensors, k, dtype)
        idx = rand_indices(seed, numel, k, vals.device)
        out = torch.zeros(numel, dtype=compute_dtype(dtype), device=vals.device)
        return out.index_add_(0, idx, vals, alpha=numel / k) if k else out

    def state_dict(self):
        return {**super().state_dict(), "draws": dict(self.draws)}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.draws = {str(k): int(v) for k, v in state["draws"].items()}


def stream_seed(shared_seed: int, key: str, draw: int) -> int:
    """A 63-bit seed from (shared seed, key, draw); stable across processes (crc32, not
    Python's randomised ``hash``)."""
    h = (shared_seed * 0x9E3779B97F4A7C15 + zlib.crc32(key.encode()) * 0xBF58476D1CE4E5B9 + draw) % (1 << 64)
    h ^= h >> 31
    return (h * 0x94D049BB133111EB % (1 << 64)) >> 1


DEVICE_STREAM = 1 << 63  # seed bit: indices from hash_indices, not the CPU generator
_GOLDEN, _MIX1, _MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _int64(u: int) -> int:
    """An unsigned 64-bit value as the signed int64 with the same bits."""
    return u - (1 << 64) if u >= 1 << 63 else u


def _srl(z: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's ``>>`` is arithmetic)."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def hash_indices(seed: int, d: int, k: int, device) -> torch.Tensor:
    """The device stream's ``k`` indices in ``[0, d)``: splitmix64 of
    ``seed + (i+1)*golden`` (Steele et al. 2014), top 63 bits mod ``d``; int64 products
    wrap as the uint64 ones of the Triton kernel (the eager reference of
    :func:`oresearcher.codecs.fused.device_indices`)."""
    if device is not None and torch.device(device).type == "cuda" and k and fused.applies(
            torch.empty(0, device=device)):
        return fused.device_indices(seed, d, k, device)
    z = torch.arange(1, k + 1, dtype=torch.int64, device=device) * _int64(_GOLDEN) + _int64(seed % (1 << 64))
    z = (z ^ _srl(z, 30)) * _int64(_MIX1)
    z = (z ^ _srl(z, 27)) * _int64(_MIX2)
    return _srl(z ^ _srl(z, 31), 1) % d


def rand_indices(seed: int, d: int, k: int, device) -> torch.Tensor:
    """``k`` indices in ``[0, d)``, uniform with replacement, for stream ``seed``: the
    device stream (:func:`hash_indices`) where the seed's top bit is set, else drawn on
    CPU from ``seed`` (so every device and every agent gets the same ones)."""
    if k == 0:
        return torch.empty(0, dtype=torch.long, device=device)
    if seed & DEVICE_STREAM:
        return hash_indices(seed, d, k, device)
    g = torch.Generator().manual_seed(seed)
    return torch.randint(d, (k,), generator=g).to(device)
