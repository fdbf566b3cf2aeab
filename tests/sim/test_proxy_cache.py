"""The convergence proxy's cache (oresearcher.sim.proxy_cache): an entry is used only when
its key, scenario, schema and checksum hold; anything else is said, run again and
replaced, never written through a link."""
import json

import pytest

import oresearcher.sim.convergence as sc_mod
from oresearcher.scenario import load_scenario
from oresearcher.sim import proxy_cache

CURVE = [5.0 - i / 10 for i in range(20)]


@pytest.fixture
def setup(monkeypatch, tmp_path):
    """A local_sgd scenario whose proxy 'runs' instantly (counted), its data and key."""
    import oresearcher.sim.simulate as simulate_mod

    ran = []
    fake = {"metrics": {"0": [{"step": i, "loss": v} for i, v in enumerate(CURVE)]}}
    monkeypatch.setattr(simulate_mod, "simulate", lambda *a, **k: ran.append(1) or (fake, None))
    s = load_scenario("scenarios/cpu-tiny.yaml", ["training.strategy=local_sgd", "convergence.proxy_steps=20",
                                                  f"convergence.cache_dir={tmp_path / 'c'}"])
    data = sc_mod.proxy_data(s, 0)
    return s, data, sc_mod.cache_key(data), tmp_path / "c", ran


def _other_key_entry(s, root):
    other = sc_mod.proxy_data(s, 7)
    proxy_cache.write(root, sc_mod.cache_key(other), other, [9.0] * 20, sc_mod.METHOD)
    return proxy_cache.entry_path(root, sc_mod.cache_key(other)).read_text()


DAMAGE = {
    "empty curve": lambda e: json.dumps({**e, "curve": []}),
    "a string": lambda e: json.dumps("curve"),
    "strings": lambda e: json.dumps({**e, "curve": ["a"] * 20}),
    "deep": lambda e: "[" * 200_000 + "]" * 200_000,
    "cut short": lambda e: json.dumps({**e, "curve": e["curve"][:5]}),
    "cut file": lambda e: json.dumps(e)[:100],
    "nan": lambda e: json.dumps({**e, "curve": [float("nan")] * 20}),
    "edited": lambda e: json.dumps({**e, "curve": [1.0] * 20}),
    "old format": lambda e: json.dumps({"curve": e["curve"]}),
    "bool": lambda e: json.dumps({**e, "curve": [True] * 20}),
}


@pytest.mark.parametrize("damage", [*DAMAGE, "another key's file"])
def test_a_damaged_or_foreign_entry_is_rerun_and_replaced(setup, damage):
    s, data, key, root, ran = setup
    assert sc_mod.run_proxy(s, data) == CURVE and ran == [1]
    path = proxy_cache.entry_path(root, key)
    entry = json.loads(path.read_text())
    path.write_text(_other_key_entry(s, root) if damage == "another key's file" else DAMAGE[damage](entry))
    said = []
    assert sc_mod.run_proxy(s, data, log=said.append) == CURVE
    assert ran == [1, 1] and "ignored" in said[0] and str(path) in said[0]
    assert json.loads(path.read_text()) == entry  # replaced by a good entry
    assert sc_mod.run_proxy(s, data) == CURVE and ran == [1, 1]  # and used next time


def test_links_planted_in_the_cache_are_replaced_not_followed(setup, tmp_path):
    """The issue's case: each entry replaced by a link, and links at every temp name."""
    import os

    s, data, key, root, ran = setup
    sc_mod.run_proxy(s, data)
    user = tmp_path / "user.txt"
    user.write_text("mine\n")
    path = proxy_cache.entry_path(root, key)
    path.unlink()
    for name in (path.name, f"{key[:24]}.tmp", f".{path.name}.tmp-{os.getpid()}"):
        (root / name).symlink_to(user)
    assert sc_mod.run_proxy(s, data) == CURVE and ran == [1, 1]
    assert user.read_text() == "mine\n"
    assert path.is_file() and not path.is_symlink()


def test_the_key_holds_what_decides_the_curve(setup, monkeypatch):
    import torch

    s, data, key, root, ran = setup
    assert len(key) == 64
    monkeypatch.setattr(torch, "get_num_threads", lambda: 977)
    assert sc_mod.cache_key(data) != key  # another thread count sums in another order
    monkeypatch.undo()
    assert sc_mod.cache_key({**data, "seed": 1}) != key


def test_a_diverged_proxy_is_no_prediction_not_a_failed_simulation(monkeypatch, tmp_path):
    import oresearcher.sim.simulate as simulate_mod

    fake = {"metrics": {"0": [{"step": i, "loss": float("nan") if i > 4 else 5.0} for i in range(20)]}}
    monkeypatch.setattr(simulate_mod, "simulate", lambda *a, **k: (fake, None))
    s = load_scenario("scenarios/cpu-tiny.yaml", ["training.strategy=local_sgd", "convergence.proxy_steps=20",
                                                  "convergence.proxy_seeds=1", f"convergence.cache_dir={tmp_path}",
                                                  "convergence.target_loss=10"])
    section = sc_mod.section(s, 0.1)
    assert section["unavailable"].startswith("no prediction: the convergence proxy (seed")
    assert "checkpoint" not in section["unavailable"]
    cached = [json.loads(p.read_text())["scenario"]["training"]["strategy"] for p in tmp_path.glob("*.json")]
    assert cached == ["ddp"]  # data parallel's good curve is kept; the failed one is not cached


def test_proxy_work_past_an_hour_is_refused_and_past_a_minute_said(tmp_path):
    from oresearcher.errors import UserError

    big = load_scenario("scenarios/128x8xA100.yaml", ["training.strategy=local_sgd", "convergence.target_loss=3",
                                                      f"convergence.cache_dir={tmp_path}"])
    with pytest.raises(UserError, match="convergence proxy trains 6 runs of 1,024 gpt-proxy agents"):
        sc_mod.proxy_note(big)
    mid = load_scenario("scenarios/128x8xA100.yaml", ["training.strategy=local_sgd", "convergence.target_loss=3",
                                                      "convergence.proxy_seeds=1", "convergence.proxy_steps=50",
                                                      f"convergence.cache_dir={tmp_path}"])
    assert sc_mod.proxy_note(mid).startswith("note: the convergence proxy trains 2 runs")
    small = load_scenario("scenarios/cpu-tiny.yaml", ["training.strategy=local_sgd", "convergence.target_loss=3",
                                                      f"convergence.cache_dir={tmp_path}"])
    assert sc_mod.proxy_note(small) is None
