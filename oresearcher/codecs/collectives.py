"""Compressed collectives, written with the ops vocabulary (:mod:`oresearcher.ops`).

Both are generator functions used inside agent programs::

    total = yield from allgather_exchange(codec, grad, group=peers, key="bucket0")
    total = yield from two_phase_allreduce(codec, grad, rank=rank, group=peers, key="bucket0")

so the simulator prices the ops they yield and the torch.distributed backend runs them.
Every member of the group must call them with the same codec spec, the same shape,
dtype and key, in the same order. They return the sum over the group (``average=True``:
the mean) in the input's dtype; the sum of decoded payloads is accumulated in float64
(int8 codes are never summed as int8).

- :func:`allgather_exchange`: each rank encodes its tensor, the packed payloads are
  all-gathered, every rank decodes all of them and sums locally. Simple, one
  compression, but each rank receives ``n-1`` whole payloads: with 4x compression at 8
  ranks that is as many bytes as an uncompressed ring all-reduce.
- :func:`two_phase_allreduce` (Tang et al. 2021, "1-bit Adam"): compressed
  reduce-scatter as an all-to-all of compressed chunks (rank ``j`` owns chunk ``j`` of
  ``ceil(numel/n)`` elements; the tail is zero-padded and the padding travels), each
  owner sums its chunk and compresses the sum again, then a compressed all-gather.
  With an ``ef(...)`` codec both phases keep their own residuals (worker error per
  chunk under key ``"{key}/rs{j}"``, server error under ``"{key}/ag{j}"``).

Determinism: every rank sums the same payloads in group order, so all ranks get
bit-identical results. Permuting inputs between ranks gives the same aggregate up to
float64 summation rounding (bit-identical when, per element, the decoded terms span
fewer than about 2**28 in magnitude, which holds for ordinary gradients); see the tests.
"""
from __future__ import annotations

import math

import torch

from .. import ops as O
from ..comm.schedules import ring_bytes_per_rank
from .base import DEFAULT_KEY, Codec, pack, unpack

SCHEMES = ("allreduce", "allgather", "two_phase")

# Encoding and decoding run inside Compute ops so backends time them. The simulator
# charges them as elementwise work: roughly this many operations per element (absmax,
# scale, round, clamp, cast on the way in; cast, scale, add on the way out). On CPUs
# elementwise and small-matmul rates are of one order, so this is a fair charge there;
# on GPUs it is negligible either way (these kernels are memory-bound and short).
ENCODE_OPS_PER_ELEMENT = 8
DECODE_OPS_PER_ELEMENT = 4


def _encode(codec, x, key):
    return (yield O.Compute(codec.encode, x, key=key, flops=ENCODE_OPS_PER_ELEMENT * x.numel(), name="codec_encode"))


def _decode(fn, numel, *args):
    return (yield O.Compute(fn, *args, flops=DECODE_OPS_PER_ELEMENT * numel, name="codec_decode"))


def allgather_exchange(codec: Codec, x: torch.Tensor, *, group=None, world_size=None,
                       key: str = DEFAULT_KEY, average: bool = False) -> O.Program:
    """Compressed exchange by all-gather; ``result = yield from allgather_exchange(...)``.

    ``world_size`` is accepted for symmetry with :func:`two_phase_allreduce` and unused
    (the gathered list's length is the group size).
    """
    p = yield from _encode(codec, x, key)
    gathered = yield O.AllGather(pack(p), group=group, name="codec_allgather")

    def decode_sum(bufs):
        decoded = [codec.decode(unpack(b, codec, x.shape, x.dtype, key)) for b in bufs]
        return _finish(codec.aggregate(wide_sum(decoded), key), len(bufs), average, x.dtype)

    return (yield from _decode(decode_sum, x.numel() * len(gathered), gathered))


def two_phase_allreduce(codec: Codec, x: torch.Tensor, *, rank: int, group=None, world_size=None,
                        key: str = DEFAULT_KEY, average: bool = False, server_codec: Codec = None) -> O.Program:
    """Compressed reduce-scatter (all-to-all) then compressed all-gather.

    ``rank`` is this program's global rank; ``group`` (``None``: all ``world_size``
    ranks) fixes the chunk owners in group order. ``server_codec`` compresses the owned
    chunk sums (default: ``codec`` itself, under separate keys).
    """
    if group is None and world_size is None:
        raise ValueError("two_phase_allreduce needs group or world_size")
    members = (O.resolve_group(group, world_size) if world_size is not None
               else tuple(sorted(int(r) for r in group)))
    if rank not in members:
        raise ValueError(f"rank {rank} is not in group {members}")
    server = codec if server_codec is None else server_codec
    n, me = len(members), members.index(rank)
    numel = x.numel()
    c = -(-numel // n)  # chunk length; n*c - numel elements of zero padding
    chunks = _padded_chunks(x, n, c)
    def encode_chunks(chunks):
        return [pack(codec.encode(chunks[j], key=f"{key}/rs{j}")) for j in range(n)]

    def reduce_mine(bufs):
        mine = [codec.decode(unpack(b, codec, (c,), x.dtype, f"{key}/rs{me}")) for b in bufs]
        owned = codec.aggregate(wide_sum(mine), f"{key}/rs{me}").to(x.dtype)  # re-encoded in the input dtype
        return pack(server.encode(owned, key=f"{key}/ag{me}"))

    def assemble(bufs):
        parts = [server.aggregate(server.decode(unpack(b, server, (c,), x.dtype, f"{key}/ag{j}")).to(torch.float64),
                                  f"{key}/ag{j}")
                 for j, b in enumerate(bufs)]
        if x.device.type == "meta":
            return torch.empty(x.shape, dtype=x.dtype, device="meta")
        return _finish(torch.cat(parts)[:numel].reshape(x.shape), n, average, x.dtype)

    packed = yield O.Compute(encode_chunks, chunks, flops=ENCODE_OPS_PER_ELEMENT * n * c, name="codec_encode")
    received = yield O.AllToAll(packed, group=group, name="codec_reduce_scatter")
    p2 = yield O.Compute(reduce_mine, received, flops=(DECODE_OPS_PER_ELEMENT * n + ENCODE_OPS_PER_ELEMENT) * c,
                         name="codec_reduce")
    gathered = yield O.AllGather(p2, group=group, name="codec_allgather")
    return (yield from _decode(assemble, n * c, gathered))


def _padded_chunks(x: torch.Tensor, n: int, c: int) -> list:
    """``n`` flat chunks of ``c`` elements of ``x``, zero-padded at the end."""
    if x.device.type == "meta":
        return [torch.empty(c, dtype=x.dtype, device="meta") for _ in range(n)]
    flat = torch.zeros(n * c, dtype=x.dtype, device=x.device)
    flat[:x.numel()] = x.detach().reshape(-1)
    return list(flat.view(n, c)) if c else [flat[:0]] * n


def wide_sum(tensors) -> torch.Tensor:
    """Sum in float64, in list order (never in the payload's narrow type)."""
    tensors = list(tensors)
    first = tensors[0]
    if first.device.type == "meta":
        return torch.empty(first.shape, dtype=torch.float64, device="meta")
    acc = first.to(torch.float64, copy=True)
    for t in tensors[1:]:
        acc.add_(t)
    return acc


def _finish(total, n, average, dtype):
    if total.device.type == "meta":
        return torch.empty(total.shape, dtype=dtype, device="meta")
    if average:
        total = total / n
    return total.to(dtype)


def collective_wire_bytes_per_rank(scheme: str, codec: Codec, numel: int, n: int,
                                   dtype: torch.dtype = torch.float32) -> float:
    """Bytes each rank sends for one collective over ``n`` ranks on ``numel`` elements.

    - ``"allreduce"``: plain ring all-reduce (no codec): ``2(n-1)/n * numel * itemsize``.
    - ``"allgather"``: :func:`allgather_exchange` on a ring: ``(n-1) * P(numel)``, with
      ``P = codec.wire_bytes`` (padding: none, payload sizes are equal on all ranks).
    - ``"two_phase"``: :func:`two_phase_allreduce`: the all-to-all sends ``n-1`` chunk
      payloads of ``P(c)`` (its own chunk stays local), ``c = ceil(numel/n)``, and the
      ring all-gather of the owned compressed sums sends ``(n-1) * P(c)``:
      ``2(n-1) * P(c)``, i.e. about ``2(n-1)/n`` of one compressed payload.
    """
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if scheme == "allreduce":
        return ring_bytes_per_rank("AllReduce", numel * dtype.itemsize, n)
    if scheme == "allgather":
        return ring_bytes_per_rank("AllGather", codec.wire_bytes(numel, dtype), n)
    return float(2 * (n - 1) * codec.wire_bytes(math.ceil(numel / n), dtype))
