"""Byte amounts as people read them, one rule for the console, the reports and the benchmarks.

Amounts (memory per GPU, bytes on the wire) are decimal, as NCCL and vendors count:
GB (10^9 bytes) from 10 MB up, else MB, three decimals, so that figures of one table or
two reports line up. Message sizes are powers of two: ``binary=True`` names them in
GiB, MiB and KiB, whole where they are (8 B, 64 KiB, 1.5 MiB, 8 GiB).
"""
from __future__ import annotations

from ..comm.units import GB, MB


def format_bytes(n: float, binary: bool = False) -> str:
    """``12.345 GB``, ``0.500 MB``; with ``binary`` ``64 KiB``, ``1.5 MiB``, ``8 B``."""
    if not binary:
        return f"{n / GB:,.3f} GB" if abs(n) >= 10 * MB else f"{n / MB:,.3f} MB"
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if abs(n) >= 1 << k:
            v = n / (1 << k)
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.3g} {unit}"
    return f"{int(n)} B"
