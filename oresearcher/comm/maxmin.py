"""Max-min fair sharing of links: the rate each flow gets when flows share directional links.

At every moment the active flows' rates are the max-min fair allocation (progressive
filling, Bertsekas & Gallager, "Data Networks", section 6.5.2): no flow can get faster
without slowing a flow that is already no faster. The analytical tier prices a phase's
flows alone with it (:func:`oresearcher.comm.plan.phase_transfer_time`); the simulator's
event-driven network (``sim/network.py``) re-solves it whenever a flow starts or ends.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Sequence

# Relative tolerance for "this link is a bottleneck too".
_REL = 1e-9


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
