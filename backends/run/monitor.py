"""Knowing which rank was lost: heartbeats and one failure notice in the rendezvous store.

gloo reports a dead peer as a closed TCP connection ("Connection reset by peer") without
saying which rank it was; NCCL may just hang until the process-group timeout. So every
rank runs a small :class:`Monitor` thread that

- bumps its own heartbeat key ``hb/<rank>`` every ``interval_s`` seconds;
- watches the other ranks' heartbeats (all of them in worlds up to 64 ranks, otherwise
  its ring successor, so the store sees O(world) traffic) and, when one has not moved for
  ``timeout_s`` and the rank has not said it is done, posts the failure notice
  ``failure = "rank k lost: ..."`` (the first poster wins);
- reads the failure notice, which the local launcher also posts the moment a child exits
  abnormally (it knows the exit code or signal), and calls ``on_lost(message)``.

A rank whose collective fails calls :meth:`Monitor.identify` to learn the name of the
lost rank within a few heartbeat intervals instead of the full timeout.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Optional

log = logging.getLogger(__name__)

FAILURE_KEY = "failure"
USER_KEY = "user_error"  # the notice is a rank's user error (divergence, a bad checkpoint): exit code 2
_SEQ_KEY = "failure_seq"


def post_failure(store, prefix: str, message: str) -> str:
    """Post ``message`` as the run's failure notice unless one exists; returns the notice."""
    if store.add(prefix + _SEQ_KEY, 1) == 1:
        store.set(prefix + FAILURE_KEY, message)
        return message
    return read_failure(store, prefix, wait=True) or message


def post_user_error(store, prefix: str, message: str) -> str:
    """Post a rank's user error (one line for the user, exit code 2) as the failure
    notice unless one exists; the mark is set before the notice, so whoever reads the
    notice can tell it from a lost rank. Returns the notice."""
    if store.add(prefix + _SEQ_KEY, 1) == 1:
        store.set(prefix + USER_KEY, message)
        store.set(prefix + FAILURE_KEY, message)
        return message
    return read_failure(store, prefix, wait=True) or message


def user_error(store, prefix: str) -> Optional[str]:
    """The user error a rank posted as the failure notice, or None."""
    key = prefix + USER_KEY
    return store.get(key).decode() if store.check([key]) else None


def read_failure(store, prefix: str, wait: bool = False) -> Optional[str]:
    """The failure notice, or None. ``wait``: a poster has claimed it; wait for the text."""
    key = prefix + FAILURE_KEY
    if not store.check([key]):
        if not (wait and store.check([prefix + _SEQ_KEY])):
            return None
    return store.get(key).decode()


class Monitor:
    """Heartbeat thread of one rank; see the module docstring."""

    def __init__(self, store, rank: int, world_size: int, *, timeout_s: float, interval_s: float = 1.0,
                 prefix: str = "oresearcher/", on_lost: Optional[Callable[[str], None]] = None,
                 store_owner: str = "the launcher"):
        self.store, self.rank, self.world_size = store, rank, world_size
        self.timeout_s, self.interval_s, self.prefix = float(timeout_s), float(interval_s), prefix
        self.on_lost, self.store_owner = on_lost, store_owner
        self.watched = [r for r in range(world_size) if r != rank] if world_size <= 64 else (
            [(rank + 1) % world_size] if world_size > 1 else [])
        self._seen: dict[int, tuple[str, float]] = {}  # rank -> (last value, when it changed)
        self._beats = 0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.lost: Optional[str] = None

    def _key(self, what: str, r: int) -> str:
        return f"{self.prefix}{what}/{r}"

    def start(self) -> "Monitor":
        self._beat()
        self._thread = threading.Thread(target=self._loop, name=f"monitor-rank{self.rank}", daemon=True)
        self._thread.start()
        return self

    def stop(self, done: bool = True) -> None:
        """Stop the thread; ``done``: tell the others this rank finished on purpose."""
        self._stop.set()
        if done:
            try:
                self.store.set(self._key("done", self.rank), "1")
            except Exception:  # the store host may be gone at teardown; nothing to tell
                pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * self.interval_s + 1)

    def _beat(self) -> None:
        self._beats += 1
        self.store.set(self._key("hb", self.rank), str(self._beats))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._beat()
                msg = read_failure(self.store, self.prefix) or self._check_heartbeats(self.timeout_s)
            except Exception as e:  # the store is unreachable: whoever hosts it is gone
                msg = f"{self.store_owner} lost (the rendezvous store stopped answering: {type(e).__name__})"
            if msg:
                self._lost(msg)
                return

    def _lost(self, msg: str) -> None:
        if self.lost is None:
            self.lost = msg
            if self.on_lost is not None:
                self.on_lost(msg)

    def _done(self, r: int) -> bool:
        return self.store.check([self._key("done", r)])

    def _check_heartbeats(self, stale_s: float, ranks=None) -> Optional[str]:
        """Post and return a failure notice if a watched rank's heartbeat is stale."""
        now = time.monotonic()
        ranks = self.watched if ranks is None else ranks
        for r in ranks:
            key = self._key("hb", r)
            value = self.store.get(key).decode() if self.store.check([key]) else ""
            last = self._seen.get(r)
            if last is None or last[0] != value:
                self._seen[r] = (value, now)
            elif now - last[1] >= stale_s and not self._done(r):
                return post_failure(self.store, self.prefix,
                                    f"rank {r} lost: no heartbeat for {now - last[1]:.0f} s")
        return None

    def identify(self, wait_s: float) -> Optional[str]:
        """After a failed collective: the failure notice, waiting up to ``wait_s`` seconds.

        Checks the notice and, every interval, every rank's heartbeat; a rank whose
        heartbeat has not moved for three intervals is named as lost.
        """
        deadline = time.monotonic() + wait_s
        everyone = [r for r in range(self.world_size) if r != self.rank]
        while True:
            try:
                msg = read_failure(self.store, self.prefix) or self._check_heartbeats(3 * self.interval_s, everyone)
            except Exception as e:
                msg = f"{self.store_owner} lost (the rendezvous store stopped answering: {type(e).__name__})"
            if msg or time.monotonic() >= deadline:
                if msg:
                    self._lost(msg)
                return msg
            time.sleep(min(self.interval_s, max(0.0, deadline - time.monotonic())))
