"""backends.calibration.memory_probe: peak live bytes from the profiler's allocation events."""
import torch

from oresearcher.backends.calibration.memory_probe import PeakMemory, peak_live_bytes


def _ev(ts, addr, nbytes, device=0):
    return {"name": "[memory]", "ts": ts, "args": {"Addr": addr, "Bytes": nbytes, "Device Type": device}}


def test_replay_counts_only_what_the_block_allocated():
    events = [_ev(1, 10, 100), _ev(2, 20, 50), _ev(3, 10, -100), _ev(4, 30, 70),
              _ev(5, 99, -1000),  # freed, but allocated before the block: not counted
              _ev(6, 40, 500, device=1),  # another device
              {"name": "aten::mm", "ts": 7}]
    assert peak_live_bytes(events) == 150
    assert peak_live_bytes(events, device_type=1) == 500


def test_a_known_tensor_is_seen():
    with PeakMemory() as mem:
        a = torch.ones(1 << 18)  # 1 MiB of fp32
        b = torch.ones(1 << 17)  # 0.5 MiB
        del a
        c = torch.ones(1 << 16)
    assert mem.peak_bytes == (1 << 20) + (1 << 19)
    del b, c
