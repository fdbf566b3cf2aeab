"""Pure pieces of the real backend: wire bytes, environment detection, checkpoints,
telemetry scalars, the calibration fit and the report comparison. No process group."""
from __future__ import annotations

import random
import signal

import pytest
import torch
from hypothesis import given, settings, strategies as st

from oresearcher.backends.checkpoint import per_rank as ckpt
from oresearcher.comm.wire import wire_bytes
from oresearcher.backends.run.launcher import describe_exit, from_environ, rank_env
from oresearcher.backends.run.telemetry import step_scalars
from oresearcher.calibrate import FabricFit, device_doc, fabric_doc, fit_fabric, fit_errors, profile_text
from oresearcher.comm.schedules import ring_terms
from oresearcher.reporting.compare import compare, relative_error, worst_headline



# ---- wire bytes ----------------------------------------------------------------------
def test_ring_wire_bytes_hand_values():
    # a 1 MB ring all-reduce on 4 ranks sends 2 * 3/4 MB per rank; all-gather of 1 MB parts: 3 MB
    assert wire_bytes("AllReduce", "ring", 10**6, 4) == 1_500_000
    assert wire_bytes("AllGather", "ring", 10**6, 4) == 3_000_000
    assert wire_bytes("AllReduce", "ring", 10**6, 1) == 0


# ---- environment -----------------------------------------------------------------------
def test_no_launcher_environment_means_local_launch():
    assert from_environ({}) is None


def test_torchrun_environment_is_joined_with_the_agent_store():
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "node0", "MASTER_PORT": "29500",
           "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "2"}
    d = from_environ(env)
    assert (d.rank, d.world_size, d.local_rank, d.master_addr, d.master_port) == (3, 8, 1, "node0", 29500)
    assert d.store_host == "agent" and d.prefix == "oresearcher/2/"


def test_our_launcher_environment_round_trips():
    d = from_environ(rank_env(1, 4, 1234, 1, {}))
    assert (d.rank, d.world_size, d.master_port, d.store_host) == (1, 4, 1234, "launcher")


@pytest.mark.parametrize("env, words", [
    ({"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_ADDR"),
    ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "outside"),
    ({"RANK": "x", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "bad"),
])
def test_broken_environment_is_named(env, words):
    with pytest.raises(ValueError, match=words):
        from_environ(env)


def test_describe_exit_names_rank_and_cause():
    assert describe_exit(2, -signal.SIGKILL) == "rank 2 lost (killed by SIGKILL)"
    assert describe_exit(0, 1) == "rank 0 lost (exit code 1)"


# ---- checkpoints -----------------------------------------------------------------------
class DictStore:
    """The few TCPStore calls the checkpointer makes, on a dict."""

    def __init__(self):
        self.d = {}

    def set(self, k, v):
        self.d[k] = v.encode() if isinstance(v, str) else v

    def check(self, keys):
        return all(k in self.d for k in keys)

    def multi_get(self, keys):
        return [self.d[k] for k in keys]


def _learner():
    from bk_tiny import make_learner
    from bk_helpers import TINY
    from oresearcher.scenario import validate

    return make_learner(validate(TINY, "tiny"), 0)


def test_checkpoint_round_trip_restores_model_optimizer_and_rng(tmp_path):
    learner = _learner()
    learner.forward_backward()
    learner.optimizer_step()

    class Counter:
        def __init__(self):
            self.n = 0

        def state_dict(self):
            return {"n": self.n, "buf": torch.arange(3.0) * self.n}

        def load_state_dict(self, s):
            self.n = s["n"]

    c = Counter()
    c.n = 7
    path = ckpt.rank_file(tmp_path, 5, 1)
    ckpt.save_atomic(ckpt.agent_state(5, 2, learner, {"counter": c}), path)
    expected_draw = torch.rand(3)
    expected_py = random.random()
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left behind

    fresh, c2 = _learner(), Counter()
    torch.rand(10)
    state = ckpt.load(path)  # weights_only=True
    ckpt.restore_agent(state, fresh, {"counter": c2})
    assert state["step"] == 5 and state["world_size"] == 2 and c2.n == 7
    for a, b in zip(learner.module.state_dict().values(), fresh.module.state_dict().values()):
        assert torch.equal(a, b)
    assert torch.equal(torch.rand(3), expected_draw) and random.random() == expected_py


def test_weights_only_load_refuses_pickled_code(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"f": random.Random}, path)
    with pytest.raises(Exception):
        ckpt.load(path)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.sets(st.integers(0, 30), max_size=8), min_size=1, max_size=5))
def test_latest_common_is_the_newest_step_everyone_holds(held):
    got = ckpt.latest_common(held)
    common = set.intersection(*held)
    assert got == (max(common) if common else None)


def test_steps_held_ignores_other_ranks_and_partial_files(tmp_path):
    for step, rank in ((3, 0), (3, 1), (7, 0)):
        ckpt.save_checkpoint(tmp_path, step, rank, 2, {"x": torch.zeros(1)})
    (ckpt.step_dir(tmp_path, 9) / "x").mkdir(parents=True)
    (ckpt.step_dir(tmp_path, 9) / ".rank-0001.pt.tmp-1").write_bytes(b"partial")
    ckpt.save_atomic({"x": torch.zeros(1)}, ckpt.rank_file(tmp_path, 9, 0))  # no manifest: not held
    assert ckpt.steps_held(tmp_path, 0) == [3, 7]
    assert ckpt.steps_held(tmp_path, 1) == [3]
    assert ckpt.latest_common([ckpt.steps_held(tmp_path, r) for r in (0, 1)]) == 3


def test_checkpointer_prunes_only_below_what_every_rank_saved(tmp_path):
    store, learner = DictStore(), _learner()
    a = ckpt.Checkpointer(tmp_path, 0, 2, every=2, total_steps=100, keep=1, store=store)
    b = ckpt.Checkpointer(tmp_path, 1, 2, every=2, total_steps=100, keep=1, store=store)
    assert [s for s in range(8) if a.due(s)] == [1, 3, 5, 7]
    b.save(1, learner, {})
    for s in (1, 3, 5):  # rank 0 runs ahead of rank 1
        a.save(s, learner, {})
    assert ckpt.steps_held(tmp_path, 0) == [1, 3, 5]  # step 1 is the only complete one: kept
    b.save(3, learner, {})
    a.save(7, learner, {})
    assert ckpt.steps_held(tmp_path, 0) == [3, 5, 7]  # 1 went; 3 is the newest complete
    assert ckpt.latest_common([ckpt.steps_held(tmp_path, r) for r in (0, 1)]) == 3


def test_last_step_is_always_checkpointed():
    c = ckpt.Checkpointer("x", 0, 1, every=4, total_steps=10)
    assert [s for s in range(10) if c.due(s)] == [3, 7, 9]
    assert not any(ckpt.Checkpointer("x", 0, 1, every=0, total_steps=10).due(s) for s in range(10))


# ---- telemetry -------------------------------------------------------------------------
def test_step_scalars():
    s = step_scalars({"loss": 2.0, "role": "validator", "note": "x", "ok": True},
                     {"duration_s": 0.5, "compute_s": 0.3, "exposed_comm_s": 0.1, "wire_bytes": 10})
    assert s["agent/loss"] == 2.0 and s["agent/role_id"] == 2.0 and s["agent/ok"] == 1.0
    assert "agent/note" not in s and s["comm/overhead"] == pytest.approx(0.2) and s["comm/wire_bytes"] == 10


# ---- calibration fit -------------------------------------------------------------------
def test_ring_terms():
    assert ring_terms("AllReduce", 4) == (6.0, 1.5)
    assert ring_terms("AllGather", 4) == (3.0, 0.75)
    assert ring_terms("AllReduce", 1) == (0.0, 0.0)


@settings(max_examples=30, deadline=None)
@given(st.floats(0, 500e-6), st.floats(1e-6, 200e-6), st.floats(0.05e9, 20e9), st.integers(2, 4))
def test_fit_recovers_the_model_it_was_made_from(base, hop, bw, n):
    truth = FabricFit(10e-6, base, hop, bw)
    rows = [{"kind": k, "bytes": s, "time_s": truth.predict(k, s, n)}
            for k in ("AllReduce", "AllGather") for s in (1024, 16384, 262144, 4194304, 16777216)]
    fit = fit_fabric(rows, n, call_overhead_s=10e-6)
    for e in fit_errors(rows, n, fit):
        assert abs(e["error"]) < 1e-6
    assert fit.bandwidth_Bps == pytest.approx(bw, rel=1e-4)
    assert fit.hop_latency_s == pytest.approx(hop, rel=1e-3, abs=1e-9)


def test_fit_with_one_kind_puts_latency_in_the_base():
    truth = FabricFit(0.0, 100e-6, 0.0, 1e9)
    rows = [{"kind": "AllReduce", "bytes": s, "time_s": truth.predict("AllReduce", s, 2)} for s in (1e3, 1e5, 1e7)]
    fit = fit_fabric(rows, 2)
    assert fit.hop_latency_s == 0.0 and fit.base_latency_s == pytest.approx(100e-6, rel=1e-4)


def test_profile_text_is_loaded_by_the_simulator(tmp_path):
    from oresearcher.hardware import load_profile_file

    m = {"backend": "gloo", "world_size": 2, "flops_per_step": 2e9, "compute_step_s": 0.1,
         "host_overhead_s": 5e-6, "dtype": "fp32"}
    fit = FabricFit(20e-6, 100e-6, 30e-6, 0.5e9)
    rows = fit_errors([{"kind": "AllReduce", "bytes": 1024, "time_s": 3e-4}], 2, fit)
    path = tmp_path / "p.yaml"
    path.write_text(profile_text(device_doc("cpu-cal", m, 8e9), fabric_doc("gloo-cal", fit), m, rows))
    dev, fab = load_profile_file(path)
    assert dev.name == "cpu-cal" and dev.flops_per_s("fp32") == pytest.approx(2e10)
    assert dev.host_overhead_s == pytest.approx(5e-6)
    assert fab.bandwidth == pytest.approx(0.5e9) and fab.hop_latency == pytest.approx(30e-6)
    assert fab.base_latency + fab.call_overhead == pytest.approx(120e-6)


# ---- compare -----------------------------------------------------------------------------
def test_compare_rows_and_headline():
    pred = {"step_time_s": 1.1, "compute_time_s": 1.0, "comm_time_s": 0.1, "exposed_comm_time_s": 0.1,
            "comm_overhead": 0.1 / 1.1, "wire_bytes_per_step": 100}
    meas = dict(pred, step_time_s=1.0, comm_overhead=0.1, wire_bytes_per_step=0)
    rows = {r["key"]: r for r in compare(pred, meas)}
    assert rows["step_time_s"]["error"] == pytest.approx(0.1)
    assert rows["wire_bytes_per_step"]["error"] is None
    assert worst_headline(list(rows.values())) == pytest.approx(0.1)
    assert relative_error(None, 1.0) is None


def test_compare_cli_prints_and_gates_on_the_headline(tmp_path, capsys):
    import json

    from oresearcher.compare import main

    base = {"step_time_s": 1.0, "compute_time_s": 0.8, "comm_time_s": 0.2, "exposed_comm_time_s": 0.2,
            "comm_overhead": 0.2, "wire_bytes_per_step": 1e6, "backend": "sim", "world_size": 2}
    (tmp_path / "sim").mkdir()
    (tmp_path / "sim" / "report.json").write_text(json.dumps(base))
    (tmp_path / "real.json").write_text(json.dumps(dict(base, step_time_s=1.25, backend="gloo")))
    assert main([str(tmp_path / "sim"), str(tmp_path / "real.json")]) == 0
    out = capsys.readouterr().out
    assert "step time" in out and "-20.0%" in out  # (1.0 - 1.25) / 1.25
    assert main([str(tmp_path / "sim"), str(tmp_path / "real.json"), "--max-error", "0.15"]) == 1
    (tmp_path / "bad.json").write_text("{}")
    from oresearcher.errors import UserError

    with pytest.raises(UserError, match="missing step_time_s"):
        main([str(tmp_path / "sim"), str(tmp_path / "bad.json")])


def test_compute_rate_folds_unmodelled_work_in_and_takes_host_overhead_out():
    from oresearcher.calibrate import compute_rate
    from oresearcher.errors import UserError

    # 1 GFLOP declared; 10 ops x 100 us of host overhead inside the measured 0.101 s
    m = {"flops_per_step": 1e9, "compute_step_s": 0.101, "compute_ops_per_step": 10, "host_overhead_s": 1e-4}
    assert compute_rate(m) == pytest.approx(1e10)
    with pytest.raises(UserError, match="declare no FLOPs"):
        compute_rate(dict(m, flops_per_step=0.0))


def test_a_full_disk_while_writing_the_report_is_one_line_that_says_how_to_get_it(tmp_path, monkeypatch):
    import errno
    import os
    from types import SimpleNamespace

    from oresearcher.backends.run import rank_report
    from oresearcher.errors import UserError

    def full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(rank_report, "_write_report_files", full)
    opts = SimpleNamespace(out_dir=tmp_path)
    for every, words in ((2, f"then --resume {tmp_path} writes it from the final checkpoints"),
                         (0, "no checkpoint to write it from")):
        sc = SimpleNamespace(training=SimpleNamespace(checkpoint_every=every))
        with pytest.raises(UserError) as e:
            rank_report.write_report(None, sc, opts, 0, 0.0, None)
        assert "the disk is full" in str(e.value) and words in str(e.value) and "\n" not in str(e.value)
