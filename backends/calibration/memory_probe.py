"""Peak tensor memory of a piece of a rank's life, measured on CPU (or any device).

CPU tensors have no ``torch.cuda.max_memory_allocated``; the profiler's memory events
are the equivalent: with ``profile_memory=True`` every allocation and free of the c10
allocator is an event with its address and size. :class:`PeakMemory` profiles a block
of code and :func:`peak_live_bytes` replays its events: bytes allocated *inside* the
block and not yet freed, at their highest. Allocations made before the block (and freed
in it) do not count, so the figure is what the block itself held: run the whole
lifetime to compare (model built inside it).

    with PeakMemory() as mem:
        learner = make_learner(...)
        for _ in range(3):
            learner.forward_backward(); learner.optimizer_step()
    mem.peak_bytes
"""
from __future__ import annotations

import json
import os
import tempfile

from torch.profiler import ProfilerActivity, profile

CPU = 0  # the profiler's "Device Type" of host memory


def peak_live_bytes(events, device_type: int = CPU) -> int:
    """Highest sum of live bytes allocated within the trace (chrome-trace events)."""
    mem = sorted((e for e in events if e.get("name") == "[memory]"
                  and e.get("args", {}).get("Device Type") == device_type), key=lambda e: e["ts"])
    live: dict[int, int] = {}
    total = peak = 0
    for e in mem:
        addr, nbytes = e["args"]["Addr"], e["args"]["Bytes"]
        if nbytes > 0:
            live[addr] = live.get(addr, 0) + nbytes
            total += nbytes
        elif addr in live:
            total -= live.pop(addr)
        peak = max(peak, total)
    return peak


class PeakMemory:
    """Profile a ``with`` block's allocations; ``peak_bytes`` afterwards."""

    def __init__(self, device_type: int = CPU):
        self.device_type, self.peak_bytes = device_type, 0
        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)

    def __enter__(self):
        self._prof.start()
        return self

    def __exit__(self, *exc):
        self._prof.stop()
        fd, path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        try:
            self._prof.export_chrome_trace(path)
            with open(path) as f:
                self.peak_bytes = peak_live_bytes(json.load(f)["traceEvents"], self.device_type)
        finally:
            os.unlink(path)
        return False
