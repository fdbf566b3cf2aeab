"""The report schema both backends write, and the timeline it is computed from.

A backend records, for every rank, a list of :class:`Span` (what the rank was doing from
``start`` to ``end``, in seconds) and the time each step ended. :func:`summarize` turns
those into the report; because the simulator and the torch.distributed backend share it,
``oresearcher.compare`` can put prediction beside measurement figure by figure.

Definitions (per step, averaged over steps; "mean" is over ranks):

- ``step_time_s``: slowest rank's time from start to its last step end, / steps.
- ``compute_time_s``: mean time in Compute ops.
- ``comm_time_s``: mean time collectives were in flight (issue to completion), whether
  or not the rank was waiting for them. Overlapped communication counts here.
- ``exposed_comm_time_s``: mean time a rank was blocked on communication (a blocking
  collective, a Wait, a Recv) and so not computing: the part overlap did not hide.
  Both this and ``comm_time_s`` include waiting for slower peers. On the real backend a
  blocked rank's time also holds the host work around the collective (the payload copied
  in, the result divided or unpacked after the wire work completed), so exposed can be
  larger than in flight there (the simulator charges no such host work).
- ``comm_overhead``: ``exposed_comm_time_s / step_time_s``.
- ``wire_bytes_per_step``: mean bytes one rank sent on the network per step (what the
  collective algorithm moves, not the payload size).
- ``final``: the last task metric of each agent with its role, and of the deployable
  model (:mod:`oresearcher.reporting.final`); only when the run computed values.
- Nothing is excluded as warm-up: the first step (with its one-off costs) counts like
  any other, and step time is the whole run divided by its steps.
- ``peer_wait_time_s``: the part of ``comm_time_s`` a rank spent waiting for the other
  members of a collective to arrive (load imbalance, not the network). Recorded by
  backends that know when every member arrived (the simulator). Each ``breakdown`` row
  has its collective's share (``peer_wait_s``, all ranks, all steps).
"""
from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from .final import final_section

REPORT_KEYS = (
    "step_time_s", "compute_time_s", "comm_time_s", "exposed_comm_time_s",
    "comm_overhead", "wire_bytes_per_step", "scenario",
)


@dataclass
class Span:
    """One interval of one rank's timeline.

    cat: "compute" (a Compute op), "comm" (a collective in flight, issue to completion),
    "blocked" (the rank waited on communication), "peer_wait" (part of a collective in
    flight before its last member arrived).
    """

    rank: int
    cat: str
    name: str
    start: float
    end: float
    wire_bytes: int = 0
    args: dict = field(default_factory=dict)

    @property
    def duration(self) -> float:
        return self.end - self.start


class Timeline:
    """Everything one run recorded: per-rank totals, step ends, metrics, and spans.

    Totals are accumulated as spans arrive, so summaries never need the span list;
    only the first ``keep_spans`` spans are kept (for traces and timeline figures),
    which keeps memory flat on 1,024-rank simulations.
    """

    def __init__(self, world_size: int, keep_spans: int = 200_000):
        self.world_size = world_size
        self.keep_spans = keep_spans
        self.spans: list[Span] = []
        self.totals = [defaultdict(float) for _ in range(world_size)]  # rank -> cat -> s
        self.wire = [0] * world_size  # rank -> bytes sent
        self.collectives = defaultdict(lambda: [0, 0.0, 0])  # name -> [count, s, bytes]
        self.algorithms = defaultdict(lambda: defaultdict(int))  # name -> algorithm[/protocol] -> calls
        self.waits = defaultdict(float)  # collective name -> s its members waited for the last to arrive
        self.t0: float | None = None
        self.step_ends = defaultdict(list)  # rank -> [time]
        self.metrics = defaultdict(list)  # rank -> [(step, t, {..})]
        self._segments = {}  # record_group's cached stretches of class members (see _record_comm)

    def record(self, rank: int, cat: str, name: str, start: float, end: float,
               wire_bytes: int = 0, args: dict | None = None) -> None:
        if self.t0 is None or start < self.t0:
            self.t0 = start
        self.totals[rank][cat] += end - start
        if cat == "comm":
            self.wire[rank] += wire_bytes
            c = self.collectives[name]
            c[0] += 1
            c[1] += end - start
            c[2] += wire_bytes
            algo = args.get("algorithm") if args else None
            if algo:
                self.algorithms[name][algo] += 1
        elif cat == "peer_wait":
            self.waits[name] += end - start
        if len(self.spans) < self.keep_spans:
            self.spans.append(Span(rank, cat, name, start, end, wire_bytes, args or {}))

    def share(self, classes) -> None:
        """Ranks of one class (sim/symmetry.py) share their representative's (the first
        rank's) totals, step ends and metrics: the engine records those once a class."""
        # figures and traces draw one lane per class (sim/symmetry.py), named for it
        self.lane_names = {c[0]: f"ranks {c[0]}-{c[-1]} ({len(c):,}, one class)" for c in classes if len(c) > 1}
        for members in classes:
            rep = members[0]
            for r in members[1:]:
                self.totals[r] = self.totals[rep]
                self.step_ends[r] = self.step_ends[rep]
                self.metrics[r] = self.metrics[rep]

    def record_group(self, ranks, rep_of, cat: str, name: str, starts: dict, end: float,
                     wire: dict | None = None, args: dict | None = None) -> None:
        """:meth:`record` for each of ``ranks`` in order from ``starts[rep_of[r]]`` to
        ``end`` (spans that start at or after ``end`` are skipped), where a class member
        (``rep_of[r] != r``) adds only to the run-wide sums and its own wire bytes: it
        shares its representative's totals (:meth:`share`) and draws no span of its own.
        The sums add up in the same order as one record per rank would; a run with classes
        (``rep_of`` a list, not a range) records "comm" through :meth:`_record_comm`."""
        if cat == "comm" and not isinstance(rep_of, range):
            return self._record_comm(ranks, rep_of, name, starts, end, wire or {}, args)
        wire = wire or {}
        for r in ranks:
            rep = rep_of[r]
            start = starts[rep]
            if cat == "peer_wait":
                if start >= end:
                    continue
                if rep != r:
                    self.waits[name] += end - start
                    continue
            self.record(r, cat, name, start, end, int(wire.get(r, 0)), args)

    def _record_comm(self, ranks, rep_of, name, starts, end, wire, args) -> None:
        """record_group's "comm" case for a run with classes: the same sums in the same
        order, with each stretch of members that share a representative added at once
        (integers in bulk, the seconds one member after another, as they were)."""
        key = (id(ranks), id(rep_of), id(wire))
        hit = self._segments.get(key)
        if hit is None or hit[0] is not ranks or hit[1] is not rep_of or hit[2] is not wire:
            segs = []  # (rep, None, w) for a representative; (rep, [(rank, w)], sum w) for its members
            for r in ranks:
                rep, w = rep_of[r], int(wire.get(r, 0))
                if rep == r:
                    segs.append((r, None, w))
                elif segs and segs[-1][1] is not None and segs[-1][0] == rep:
                    segs[-1][1].append((r, w))
                else:
                    segs.append((rep, [(r, w)], 0))
            segs = [(rep, m, w if m is None else sum(x for _, x in m)) for rep, m, w in segs]
            if len(self._segments) > 1024:
                self._segments.clear()
            hit = self._segments[key] = (ranks, rep_of, wire, segs)
        c = self.collectives[name]
        algo = args.get("algorithm") if args else None
        own_wire = self.wire
        for rep, members, w in hit[3]:
            start = starts[rep]
            if members is None:
                self.record(rep, "comm", name, start, end, w, args)
                continue
            d, s = end - start, c[1]
            for r, x in members:
                own_wire[r] += x
                s += d
            c[0] += len(members)
            c[1] = s
            c[2] += w
            if algo:
                self.algorithms[name][algo] += len(members)

    def add(self, span: Span) -> None:
        self.record(span.rank, span.cat, span.name, span.start, span.end, span.wire_bytes, span.args)

    def step_done(self, rank: int, step: int, t: float, metrics: dict) -> None:
        self.step_ends[rank].append(t)
        if metrics:
            self.metrics[rank].append((step, t, dict(metrics)))

    def part(self, rank: int) -> dict:
        """What ``rank`` recorded, as plain data to send to the rank that merges."""
        return {
            "totals": dict(self.totals[rank]), "wire": self.wire[rank], "t0": self.t0,
            "collectives": {k: list(v) for k, v in self.collectives.items()},
            "algorithms": {k: dict(v) for k, v in self.algorithms.items()},
            "waits": dict(self.waits),
            "spans": [(s.cat, s.name, s.start, s.end, s.wire_bytes) for s in self.spans],
            "step_ends": list(self.step_ends[rank]), "metrics": list(self.metrics[rank]),
        }

    @classmethod
    def merge(cls, parts: list, keep_spans: int = 200_000) -> "Timeline":
        """One timeline from every rank's :meth:`part` (index = rank)."""
        merged = cls(len(parts), keep_spans=keep_spans)
        for r, part in enumerate(parts):
            merged.totals[r].update(part["totals"])
            merged.wire[r] = part["wire"]
            for name, (count, secs, nbytes) in part["collectives"].items():
                c = merged.collectives[name]
                c[0], c[1], c[2] = c[0] + count, c[1] + secs, c[2] + nbytes
            for name, secs in part.get("waits", {}).items():
                merged.waits[name] += secs
            for name, algos in part.get("algorithms", {}).items():
                for algo, count in algos.items():
                    merged.algorithms[name][algo] += count
            if part["t0"] is not None and (merged.t0 is None or part["t0"] < merged.t0):
                merged.t0 = part["t0"]
            room = merged.keep_spans - len(merged.spans)
            merged.spans.extend(Span(r, c, n, a, b, w) for c, n, a, b, w in part["spans"][:max(room, 0)])
            merged.step_ends[r] = part["step_ends"]
            merged.metrics[r] = part["metrics"]
        return merged


def _mean(xs):
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0


def summarize(tl: Timeline, scenario: dict, backend: str, extra: dict | None = None) -> dict:
    """The report (a JSON-ready dict) of one run."""
    ranks = range(tl.world_size)
    steps = max((len(tl.step_ends[r]) for r in ranks), default=0)
    per = max(steps, 1)
    end = max((tl.step_ends[r][-1] for r in ranks if tl.step_ends[r]), default=0.0)
    t0 = tl.t0 or 0.0
    step_time = (end - t0) / per
    exposed = _mean(tl.totals[r]["blocked"] for r in ranks) / per
    report = {
        "backend": backend,
        "world_size": tl.world_size,
        "steps": steps,
        "step_time_s": step_time,
        "compute_time_s": _mean(tl.totals[r]["compute"] for r in ranks) / per,
        "comm_time_s": _mean(tl.totals[r]["comm"] for r in ranks) / per,
        "exposed_comm_time_s": exposed,
        "comm_overhead": exposed / step_time if step_time > 0 else 0.0,
        "peer_wait_time_s": _mean(tl.totals[r]["peer_wait"] for r in ranks) / per,
        "wire_bytes_per_step": _mean(tl.wire[r] for r in ranks) / per,
        "total_time_s": end - t0,
        "breakdown": [
            {"name": k, "count": c, "time_s": t, "wire_bytes": b, "peer_wait_s": tl.waits.get(k, 0.0),
             "algorithms": dict(sorted(tl.algorithms[k].items(), key=lambda kv: -kv[1]))}
            for k, (c, t, b) in sorted(tl.collectives.items())
        ],
        "metrics": {str(r): [{"step": s, "time_s": t, **m} for s, t, m in tl.metrics[r]] for r in ranks if tl.metrics[r]},
        "scenario": scenario,
    }
    sc = scenario or {}
    fsdp = sc.get("fsdp") or {}
    ranks = fsdp.get("replicas") == "fusion" and (sc.get("agents") or {}).get("count") or None
    size = ranks and (fsdp.get("shard_group_size") or ranks)  # 0: all ranks
    hosted = ((sc.get("cooperation") or {}).get("allocation") or {}).get("agents_per_device", 1) > 1
    student = bool((sc.get("distill") or {}).get("student"))
    final = final_section(report["metrics"], sc.get("training", {}).get("strategy"), size or None, hosted, student)
    if final:
        report["final"] = final
    if extra:
        report.update(extra)
    return report


def _clean(x):
    """JSON cannot hold NaN/inf: write them as null so every reader can parse the file."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def write_json(path: Path, obj) -> None:
    """Write JSON atomically (a new temp file, then rename: never through a link planted
    at either name), sorted keys: byte-identical reruns."""
    from oresearcher.files import write_atomic

    write_atomic(Path(path), (json.dumps(_clean(obj), indent=1, sort_keys=True) + "\n").encode())
