"""Units: the one place a number in a profile's or a person's unit becomes SI, and back.

Inside the package every time is seconds, every size bytes, every rate bytes/s. Numbers
that carry another unit carry it in their name (``bandwidth_GBps``, ``latency_us``), and
they cross into SI here, through a named function, at the boundary where they are read
(a profile property, a table lookup in :mod:`.nccl`) or printed (nccl-tests columns).
"GB" and "MB" are 10^9 and 10^6 bytes, as NCCL, nccl-tests and vendors count them.

Each function is the one multiplication or division it names, so a value converted here
has the same bits as the hand-written ``x * 1e-6`` it replaced (10**9 as an int is 1e9
exactly): moving the conversions here changed no simulated report.
"""
from __future__ import annotations

GB = 10**9  # bytes
MB = 10**6  # bytes
US = 1e-6  # a microsecond, in seconds
NS = 1e-9  # a nanosecond, in seconds
US_PER_S = 10**6
NS_PER_S = 10**9


def us_to_s(us: float) -> float:
    """Microseconds (a profile's ``*_us``, NCCL's tuning tables) to seconds."""
    return us * US


def s_to_us(s: float) -> float:
    """Seconds to microseconds (nccl-tests' ``time`` column)."""
    return s * US_PER_S


def ns_to_s(ns: float) -> float:
    """Nanoseconds to seconds."""
    return ns * NS


def GBps_to_Bps(gbps: float) -> float:
    """GB/s (10^9 bytes per second, a profile's ``*_GBps``) to bytes/s."""
    return gbps * GB


def Bps_to_GBps(bps: float) -> float:
    """Bytes/s to GB/s (nccl-tests' ``algbw`` and ``busbw`` columns)."""
    return bps / GB


def Bps_from_ns_per_byte(ns_per_byte: float) -> float:
    """Bytes/s of a link that takes ``ns_per_byte`` nanoseconds a byte (a fit's unknown)."""
    return NS_PER_S / ns_per_byte
