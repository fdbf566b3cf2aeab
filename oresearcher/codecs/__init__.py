"""Gradient and parameter codecs, and compressed collectives built on them.

    from oresearcher.codecs import build
    codec = build("ef(topk:0.01+int8)", seed=rank)      # one codec object per agent
    payload = codec.encode(grad, key="bucket0")         # payload.nbytes: bytes on the wire
    approx = codec.decode(payload)                      # same shape, dtype, device
    codec.wire_bytes(grad.numel())                      # the same number, without data

Spec strings, seeds and options: :mod:`.spec`. Interface, payloads, keys, shape mode
and packing: :mod:`.base`. Codecs and their bounds: :mod:`.quant` (none, fp16, bf16,
int8), :mod:`.sparse` (top-k, rand-k), :mod:`.feedback` (ef, ef21). Collectives:
:mod:`.collectives`. Fast paths, each giving the eager path's bits: :mod:`.native` (int8 on
CPU, C) and :mod:`.fused` (Triton kernels for CUDA tensors).
"""
from .base import DEFAULT_KEY, Codec, Field, Payload, compute_dtype, pack, unpack
from .collectives import allgather_exchange, collective_wire_bytes_per_rank, two_phase_allreduce, wide_sum
from .feedback import EF21, ErrorFeedback
from .quant import Cast, Identity, Int8
from .sparse import RandK, TopK, k_of
from .spec import build

__all__ = [
    "DEFAULT_KEY", "Codec", "Field", "Payload", "compute_dtype", "pack", "unpack",
    "allgather_exchange", "two_phase_allreduce", "collective_wire_bytes_per_rank", "wide_sum",
    "ErrorFeedback", "EF21", "Cast", "Identity", "Int8", "RandK", "TopK", "k_of", "build",
]
