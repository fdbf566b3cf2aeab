"""Wire bytes: what a collective's schedule sends, and what a compressed payload weighs.

Prediction (the simulator's plans) and measurement (the real backend, which records
:func:`wire_bytes` for every collective it runs) count wire bytes by this one definition.
The int8 codec's layout (one float32 scale per :data:`INT8_CHUNK` codes) is defined here
too, so the codec library, its spec parser and the overhead controller's predictions
(:mod:`oresearcher.cooperation.budget`) read one chunk and one ratio.
"""
from __future__ import annotations

from .schedules import phases

INT8_CHUNK = 2048  # elements sharing one absmax scale in the int8 codec (oresearcher/codecs/quant.py)
INT8_SCALE_BYTES = 4  # one float32 absmax per chunk


def int8_bytes_per_element(chunk: int = INT8_CHUNK) -> float:
    """Wire bytes per element of a long float32 int8 payload: 1 + 4 / chunk (25.05% of
    float32 at the default chunk)."""
    return 1.0 + float(INT8_SCALE_BYTES) / chunk


def wire_bytes_by_rank(phase_list) -> dict:
    """Bytes each rank sends over all phases."""
    out = {}
    for p in phase_list:
        for s, _, b in p.flows:
            out[s] = out.get(s, 0.0) + b
    return out


def wire_bytes_per_rank(kind: str, algorithm: str, nbytes: float, n: int) -> float:
    """Mean bytes one rank sends for a collective on ``n`` ranks of one node."""
    ranks = tuple(range(n))
    ph = phases(kind, algorithm if algorithm != "auto" else "ring", ranks, nbytes, [0] * n)
    return sum(wire_bytes_by_rank(ph).values()) / n


def wire_bytes(kind: str, algorithm: str, nbytes: int, n: int) -> int:
    """Bytes one rank sends, whole: what the real backend records for a collective, by the
    simulator's formula (:func:`wire_bytes_per_rank`), so prediction and measurement count
    wire bytes by one definition (``nbytes`` as :func:`oresearcher.ops.payload_bytes`)."""
    return int(wire_bytes_per_rank(kind, algorithm, nbytes, n)) if n > 1 else 0
