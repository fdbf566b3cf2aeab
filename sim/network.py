"""Event-driven network: flows share links with max-min fairness.

A *flow* moves ``nbytes`` along a route of directional links. At every moment the
active flows' rates are the max-min fair allocation (progressive filling, Bertsekas &
Gallager, "Data Networks", section 6.5.2): no flow can get faster without slowing a
flow that is already no faster. Rates are recomputed whenever a flow starts or ends,
so two groups talking over one link at once slow each other down.

Max-min fairness is not monotone flow by flow: a new flow can slow flow A at one link
and so free capacity for flow B at another, and B speeds up. What the tests check is
the property that matters for a collective: adding a concurrent flow never lets a
collective (all its flows) finish earlier (tests/sim/test_network.py).

:func:`maxmin_rates` is the pure math (property-tested); :class:`FlowNetwork` is the
thin SimPy shell that advances remaining bytes between events.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Sequence

import simpy

# Relative tolerance for "this link is a bottleneck too" and "this flow is done".
_REL = 1e-9
# A flow with less than a picosecond of transfer left is done (float rounding).
_DONE_S = 1e-12


def maxmin_rates(routes: Sequence[Sequence[int]], capacity: Sequence[float]) -> list[float]:
    """Max-min fair rate (bytes/s) of each flow; a flow with an empty route gets inf."""
    rate = [float("inf")] * len(routes)
    users = defaultdict(list)
    for f, route in enumerate(routes):
        for link in route:
            users[link].append(f)
    left = {link: float(capacity[link]) for link in users}
    frozen = [not r for r in routes]
    count = {link: len(fs) for link, fs in users.items()}
    while count:
        share = min(left[l] / n for l, n in count.items())
        limit = share * (1 + _REL)
        newly = sorted({f for l, n in count.items() if left[l] / n <= limit for f in users[l] if not frozen[f]})
        for f in newly:
            frozen[f] = True
            rate[f] = share
            for link in routes[f]:
                left[link] -= share
                count[link] -= 1
        count = {l: n for l, n in count.items() if n > 0}
    return rate


class FlowNetwork:
    """Flows in flight on a set of links; ``transfer`` returns an event per batch."""

    def __init__(self, env: simpy.Environment, capacity: Sequence[float]):
        self.env = env
        self.capacity = list(capacity)
        self._flows = {}  # id -> [remaining bytes, route, rate, batch id]
        self._batches = {}  # id -> [flows left, event]
        self._next_id = 0
        self._last = 0.0
        self._version = 0

    def transfer(self, flows: Sequence[tuple[Sequence[int], float]]) -> simpy.Event:
        """Start ``flows`` = [(route, nbytes), ...]; the event fires when all are done."""
        done = self.env.event()
        live = [(tuple(r), float(b)) for r, b in flows if b > 0 and r]
        if not live:
            done.succeed()
            return done
        self._advance()
        bid = self._new_id()
        self._batches[bid] = [len(live), done]
        for route, nbytes in live:
            self._flows[self._new_id()] = [nbytes, route, 0.0, bid]
        self._reschedule()
        return done

    @property
    def active(self) -> int:
        return len(self._flows)

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _advance(self) -> None:
        dt = self.env.now - self._last
        if dt > 0:
            for f in self._flows.values():
                f[0] -= f[2] * dt
        self._last = self.env.now

    def _reschedule(self) -> None:
        ids = list(self._flows)
        rates = maxmin_rates([self._flows[i][1] for i in ids], self.capacity)
        for i, r in zip(ids, rates):
            self._flows[i][2] = r
        self._version += 1
        if ids:
            dt = min(self._flows[i][0] / self._flows[i][2] for i in ids)
            version = self._version
            ev = self.env.timeout(max(dt, 0.0))
            ev.callbacks.append(lambda _e, v=version: self._on_timer(v))

    def _on_timer(self, version: int) -> None:
        if version != self._version:
            return  # superseded by a later change
        self._advance()
        finished = [i for i, f in self._flows.items() if f[0] <= f[2] * _DONE_S]
        for i in finished:
            bid = self._flows.pop(i)[3]
            batch = self._batches[bid]
            batch[0] -= 1
            if batch[0] == 0:
                del self._batches[bid]
                batch[1].succeed()
        self._reschedule()
