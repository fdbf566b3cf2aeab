"""Heartbeats and failure notices through a real TCPStore, in this process: a rank whose
heartbeat stops is named, a rank that finished is not, the first notice wins."""
from __future__ import annotations

import socket
import threading
from datetime import timedelta

import pytest
import torch.distributed as dist

from oresearcher.backends.run.launcher import DistEnv, connect_store
from oresearcher.backends.run.monitor import Monitor, post_failure, post_user_error, read_failure, user_error


@pytest.fixture
def store():
    return dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))


def _monitors(store, n, prefix, lost):
    return [Monitor(store, r, n, timeout_s=0.4, interval_s=0.05, prefix=prefix,
                    on_lost=lambda msg, r=r: lost.setdefault(r, msg)) for r in range(n)]


def test_a_silent_rank_is_named_and_a_finished_one_is_not(store):
    lost, seen = {}, threading.Event()
    mons = _monitors(store, 3, "t1/", lost)
    mons[0].on_lost = lambda msg: (lost.setdefault(0, msg), seen.set())
    for m in mons:
        m.start()
    mons[1].stop(done=True)  # finished its program: says so
    mons[2].stop(done=False)  # died: its heartbeat just stops
    assert seen.wait(10), "rank 0 never noticed"
    assert lost[0].startswith("rank 2 lost: no heartbeat")
    assert read_failure(store, "t1/") == lost[0]
    mons[0].stop()


def test_identify_returns_the_notice_and_the_first_poster_wins(store):
    lost = {}
    a, b = _monitors(store, 2, "t2/", lost)
    assert a.identify(wait_s=0.0) is None  # nothing wrong yet
    assert post_failure(store, "t2/", "rank 1 lost (killed by SIGKILL)") == "rank 1 lost (killed by SIGKILL)"
    assert post_failure(store, "t2/", "rank 0 lost: no heartbeat") == "rank 1 lost (killed by SIGKILL)"
    assert a.identify(wait_s=1.0) == "rank 1 lost (killed by SIGKILL)" and a.lost == lost[0]


def test_a_user_error_is_marked_as_one_and_the_first_poster_still_wins(store):
    line = "rank 1 diverged at step 3: non-finite gradient"
    assert post_user_error(store, "t4/", line) == line and user_error(store, "t4/") == line
    assert post_user_error(store, "t4/", "rank 0 diverged at step 3") == line  # a second rank: one line
    assert post_failure(store, "t4/", "rank 1 lost (exit code 2)") == line == read_failure(store, "t4/")
    assert post_failure(store, "t5/", "rank 1 lost (killed by SIGKILL)") and user_error(store, "t5/") is None
    assert post_user_error(store, "t5/", line) == "rank 1 lost (killed by SIGKILL)"
    assert user_error(store, "t5/") is None  # the notice is a lost rank's: not the user's line


def test_identify_finds_a_dead_rank_within_a_few_heartbeats(store):
    lost = {}
    a, b = _monitors(store, 2, "t3/", lost)
    a.timeout_s = 60.0  # far longer than identify needs: it looks for three missed beats
    a.start()
    b.start()
    b.stop(done=False)
    assert a.identify(wait_s=10.0).startswith("rank 1 lost")
    a.stop()


def test_rank0_hosts_the_store_without_a_launcher():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    st = connect_store(DistEnv(0, 1, 0, "127.0.0.1", port, "rank0"), timeout_s=10)
    st.set("k", "v")
    assert st.get("k") == b"v"
    assert DistEnv(0, 1, 0, "h", 1, "agent").store_owner == "the torchrun agent"
