"""Chrome / Perfetto trace export of a Timeline (opens in ui.perfetto.dev or chrome://tracing).

One process per run, one thread (track) per rank; compute and communication spans are
complete events ("ph": "X") with microsecond timestamps, as the Trace Event Format
specifies. Communication in flight and the rank being blocked are on separate tracks so
overlap is visible.
"""
from __future__ import annotations

from pathlib import Path

from .report import Timeline, write_json

_TRACKS = {"compute": 0, "blocked": 1, "comm": 2, "peer_wait": 3}
_PER_RANK = len(_TRACKS)


def to_chrome_trace(tl: Timeline, name: str = "oresearcher") -> dict:
    events = [{"ph": "M", "pid": 0, "name": "process_name", "args": {"name": name}}]
    # tracks for the ranks that recorded spans: a symmetric run (sim/symmetry.py) records
    # one rank per class, named for its class; past 1,024 ranks no empty track is named
    names = getattr(tl, "lane_names", {})
    shown = range(tl.world_size) if tl.world_size <= 1024 and not names else sorted({s.rank for s in tl.spans})
    for r in shown:
        for cat, k in _TRACKS.items():
            events.append({"ph": "M", "pid": 0, "tid": r * _PER_RANK + k, "name": "thread_name",
                           "args": {"name": f"{names.get(r, f'rank {r}')} {cat}"}})
    faults = tl.world_size * _PER_RANK  # faults and checkpoints (sim/faults.py): one track per rank after the rest
    if any(s.cat == "fault" for s in tl.spans):
        events += [{"ph": "M", "pid": 0, "tid": faults + r, "name": "thread_name",
                    "args": {"name": f"rank {r} faults"}} for r in range(tl.world_size)]
    for s in tl.spans:
        tid = faults + s.rank if s.cat == "fault" else s.rank * _PER_RANK + _TRACKS[s.cat]
        events.append({
            "ph": "X", "pid": 0, "tid": tid, "name": s.name, "cat": s.cat,
            "ts": s.start * 1e6, "dur": max(s.end - s.start, 0.0) * 1e6,
            "args": {"wire_bytes": s.wire_bytes, **s.args} if s.cat == "comm" else dict(s.args),
        })
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_trace(tl: Timeline, path: Path, name: str = "oresearcher") -> None:
    write_json(path, to_chrome_trace(tl, name))
