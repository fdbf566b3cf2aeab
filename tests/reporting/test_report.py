"""Timeline: what each rank records survives the trip to the rank that merges it."""
from oresearcher.reporting.report import Timeline, summarize


def _rank_timeline(world, rank):
    tl = Timeline(world)
    tl.record(rank, "compute", "fwd", 0.0, 1.0 + rank)
    tl.record(rank, "comm", "grads", 1.0 + rank, 2.0 + rank, 100, {"algorithm": "ring/LL"})
    tl.record(rank, "comm", "grads", 3.0, 4.0, 50, {"algorithm": "ring/Simple" if rank else "ring/LL"})
    tl.record(rank, "peer_wait", "grads", 1.0, 1.0 + rank)
    tl.step_done(rank, 0, 4.0, {"loss": 1.0 + rank})
    return tl


def test_merge_of_parts_equals_recording_in_one_timeline():
    world = 2
    merged = Timeline.merge([_rank_timeline(world, r).part(r) for r in range(world)])
    whole = Timeline(world)
    for r in range(world):
        whole.record(r, "compute", "fwd", 0.0, 1.0 + r)
        whole.record(r, "comm", "grads", 1.0 + r, 2.0 + r, 100, {"algorithm": "ring/LL"})
        whole.record(r, "comm", "grads", 3.0, 4.0, 50, {"algorithm": "ring/Simple" if r else "ring/LL"})
        whole.record(r, "peer_wait", "grads", 1.0, 1.0 + r)
        whole.step_done(r, 0, 4.0, {"loss": 1.0 + r})
    a, b = summarize(merged, {}, "test"), summarize(whole, {}, "test")
    assert a == b
    assert a["breakdown"][0]["algorithms"] == {"ring/LL": 3, "ring/Simple": 1}
    assert a["breakdown"][0]["count"] == 4 and a["breakdown"][0]["wire_bytes"] == 300
    assert a["breakdown"][0]["peer_wait_s"] == 1.0  # rank 1 waited 1 s for rank 0
    assert [len(merged.spans), merged.wire] == [8, [150, 150]]
