"""Pricing of a hosted agent's switch (oresearcher.cooperation.scheduler): its state moves
between device and host memory at the device profile's ``host_link_GBps``."""
from __future__ import annotations

from oresearcher.comm.units import GBps_to_Bps


def swap_seconds(device, nbytes: float) -> float:
    """Seconds to move ``nbytes`` one way between host and device memory."""
    bw = getattr(device, "host_link_GBps", None)
    if bw is None:
        raise ValueError(f"device profile {device.name!r} has no host_link_GBps: hosted agents "
                         "(cooperation.allocation.agents_per_device > 1) need it to price their switches")
    return float(nbytes) / GBps_to_Bps(bw)
