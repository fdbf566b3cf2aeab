"""Event-driven network: flows share links with max-min fairness.

A *flow* moves ``nbytes`` along a route of directional links. At every moment the
active flows' rates are the max-min fair allocation (:func:`oresearcher.comm.maxmin.maxmin_rates`).
Rates are recomputed whenever a flow starts or ends, so two groups talking over one link
at once slow each other down.

Max-min fairness is not monotone on arbitrary graphs: a new flow can slow flow A at one
link and so free capacity for flow B at another, and B (even a whole batch) finishes
earlier; tests/sim/test_network.py keeps such a case. On the topologies the simulator
builds (every route is a rank's up port, maybe a shared bridge or NIC, and another
rank's down port), tests/sim/test_engine.py checks that adding a concurrent collective
never lets a collective finish earlier.

:func:`maxmin_rates` (the communication room's) is the pure math (property-tested);
:class:`FlowNetwork` is the thin SimPy shell that advances remaining bytes between events.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import simpy

from oresearcher.comm.maxmin import maxmin_rates

# A flow with less than a picosecond of transfer left is done (float rounding).
_DONE_S = 1e-12


def done_within(now: float) -> float:
    """Transfer time below which a flow counts as done at simulated time ``now``: a
    picosecond, or a few units in the last place of ``now`` once the clock is so large
    that ``now + dt`` rounds back to ``now`` (a flow slowed a billionfold by a link
    fault runs for hours, and a remainder under the clock's resolution never drains)."""
    return max(_DONE_S, 4 * math.ulp(now))


def _uniform(nbytes) -> bool:
    """Whether every flow of a batch moves the same bytes."""
    return nbytes.count(nbytes[0]) == len(nbytes)


class _Batch:
    """Flows started together by one ``transfer`` call; done when all are.

    Symmetric collectives start equal-sized flows that get equal rates; such a batch
    is *uniform* and keeps one remaining-bytes number for all its flows (``remaining``
    a float, ``rate`` the common rate) instead of a list, which keeps 56-flow all-pairs
    phases as cheap as one flow. It turns into per-flow numpy arrays the moment rates
    differ (a 16,384-rank ring's 131,072 flows advance in one vector operation; each
    element sees the same IEEE double operations as a Python float would).
    """

    __slots__ = ("base", "base_key", "idx", "count", "remaining", "rates", "rate", "event", "key")

    def __init__(self, routes, nbytes, event, key, uniform):
        self.base, self.event, self.key, self.base_key = routes, event, key, key
        self.idx, self.count = None, len(routes)  # idx: the flows of base still left (None: all)
        self.remaining = float(nbytes[0]) if uniform else np.array(nbytes, dtype=np.float64)
        self.rates, self.rate = None, None

    def set_rates(self, rates, common) -> float:
        """Apply this batch's rates; returns the time until its next flow finishes."""
        self.rates, self.rate = rates, common
        if type(self.remaining) is float:
            if common is not None:
                return self.remaining / common
            self.remaining = np.full(self.count, self.remaining)
        if type(rates) is list:  # equal rates for flows of unequal sizes
            self.rates = rates = np.array(rates, dtype=np.float64)
        return float((self.remaining / rates).min())

    def advance(self, dt) -> None:
        if type(self.remaining) is float:
            self.remaining -= self.rate * dt
        else:
            self.remaining = self.remaining - self.rates * dt

    @property
    def routes(self) -> tuple:
        """Routes of the flows still left."""
        return self.base if self.idx is None else tuple(self.base[i] for i in self.idx.tolist())

    def drop_done(self, done_s: float = _DONE_S):
        """Forget the flows that are done (``done_s``: :func:`done_within`); returns
        None when none was, else whether every flow is."""
        if type(self.remaining) is float:
            return True if self.remaining <= self.rate * done_s else None
        left = self.remaining > self.rates * done_s
        if left.all():
            return None
        if not left.any():
            return True
        self.idx = np.flatnonzero(left) if self.idx is None else self.idx[left]
        self.remaining, self.count = self.remaining[left], len(self.idx)
        return False


class FlowNetwork:
    """Flows in flight on a set of links; ``transfer`` returns an event per batch."""

    def __init__(self, env: simpy.Environment, capacity: Sequence[float]):
        self.env = env
        self.capacity = list(capacity)
        self._batches: list[_Batch] = []
        self._last = 0.0
        self._timer = None  # the pending timeout of the next flow to finish (None: no flow)
        self._shape_ids = {}  # routes tuple of a batch -> small int (cheap cache keys)
        self._big = {}  # id of a long routes tuple or size list the caller keeps -> (it, key or uniform)
        self._rates = {}  # shape ids of the active batches -> per-batch rates (memo)

    def transfer(self, flows: Sequence[tuple[Sequence[int], float]]) -> simpy.Event:
        """Start ``flows`` = [(route, nbytes), ...]; the event fires when all are done."""
        live = [(tuple(r), float(b)) for r, b in flows if b > 0 and r]
        return self.start(tuple(r for r, _ in live), [b for _, b in live])

    def start(self, routes: tuple, nbytes: list) -> simpy.Event:
        """Fast path of :meth:`transfer` for pre-filtered flows (non-empty routes,
        positive sizes), as the engine's cached collective plans hold them."""
        return self.start_batch(self.batch(routes, nbytes))

    def batch(self, routes: tuple, nbytes: list) -> tuple:
        """What :meth:`start_batch` needs to know of ``start(routes, nbytes)``, worked
        out once: the engine keeps one per phase of its cached collective plans."""
        if not routes:  # nothing to move: start_batch fires at once
            return routes, nbytes, None, True
        return routes, nbytes, self._known(routes, self._shape_id), self._known(nbytes, _uniform)

    def start_batch(self, batch: tuple) -> simpy.Event:
        """:meth:`start` of a :meth:`batch`; the event fires when all its flows are done."""
        done = self.env.event()
        routes, nbytes, key, uniform = batch
        if not routes:
            done.succeed()
            return done
        self._advance()
        self._batches.append(_Batch(routes, nbytes, done, key, uniform))
        self._reschedule()
        return done

    def _shape_id(self, routes) -> int:
        return self._shape_ids.setdefault(routes, len(self._shape_ids))

    def _known(self, obj, compute):
        """``compute(obj)``, remembered by identity for long sequences (the engine
        passes its cached plans' tuples and lists again and again: hashing or scanning
        131,072 routes on every call would cost more than moving them)."""
        if len(obj) < 256:
            return compute(obj)
        hit = self._big.get(id(obj))
        if hit is None or hit[0] is not obj:
            hit = self._big[id(obj)] = (obj, compute(obj))
        return hit[1]

    @property
    def active(self) -> int:
        return sum(b.count for b in self._batches)

    def _advance(self) -> None:
        now = self.env.now
        dt = now - self._last
        if dt > 0:
            for b in self._batches:
                b.advance(dt)
        self._last = now

    def _reschedule(self) -> None:
        self._timer = None  # a timer set before this change is stale
        if not self._batches:
            return
        key = tuple([b.key for b in self._batches])
        per_batch = self._rates.get(key)
        if per_batch is None:  # lockstep programs repeat the same flow sets: solve each once
            flat = maxmin_rates([r for b in self._batches for r in b.routes], self.capacity)
            per_batch, i = [], 0
            for b in self._batches:
                rates = flat[i:i + b.count]
                common = rates[0] if all(r == rates[0] for r in rates) else None
                per_batch.append((rates if common is not None else np.array(rates, dtype=np.float64), common))
                i += b.count
            if len(self._rates) > 4096:
                self._rates.clear()
            self._rates[key] = per_batch
        dt = float("inf")
        for b, (rates, common) in zip(self._batches, per_batch):
            dt = min(dt, b.set_rates(rates, common))
        ev = self._timer = self.env.timeout(max(dt, 0.0))
        ev.callbacks.append(self._on_timer)

    def _on_timer(self, ev) -> None:
        if ev is not self._timer:
            return  # superseded by a later change
        self._advance()
        keep, finished = [], []
        done_s = done_within(self.env.now)
        for b in self._batches:
            done = b.drop_done(done_s)
            if done:
                finished.append(b.event)
                continue
            if done is not None:  # some flows left: the key of what is left (the flows by index)
                b.key = self._shape_ids.setdefault((b.base_key, b.idx.tobytes()), len(self._shape_ids))
            keep.append(b)
        self._batches = keep
        self._reschedule()
        # a finished batch's event is processed here, at this instant, as env.step would
        # process it next (its waiter's next flow joins the network after the rates above
        # are set, as it would); one event fewer per collective phase (every shipped
        # scenario's report came out byte-identical either way)
        for ev in finished:
            ev._ok, ev._value = True, None
            callbacks, ev.callbacks = ev.callbacks, None
            for cb in callbacks:
                cb(ev)
