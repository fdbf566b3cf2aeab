"""convergence.ladder: the strategy's multiplier from a measured ladder's trend with model
size, its band the trend's prediction interval, widening with the distance; nothing trains."""
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oresearcher.errors import UserError
from oresearcher.models import ladder_law as LL
from oresearcher.scenario import load_scenario
from oresearcher.sim import convergence as sc

ROOT = Path(__file__).resolve().parents[2]
NS = [25_472, 49_860, 100_096, 233_680, 447_552]


def fits_file(tmp_path, ms=(1.10, 1.12, 1.15, 1.16, 1.20)):
    path = tmp_path / "fits.json"
    path.write_text(json.dumps({
        "multipliers": {"ddp": [{"n": n, "m": 1.0} for n in NS],
                        "cooperative": [{"n": n, "m": m} for n, m in zip(NS, ms)],
                        "diloco-h10": [{"n": n, "m": 0.9} for n in NS[:2]]},  # two sizes: no band
        "chinchilla_ddp": {"coef": {"E": 1.0, "A": 1.0, "B": 1.0, "alpha": 0.3, "beta": 0.25}}}))
    return path


def scenario(path, *extra):
    return load_scenario(ROOT / "scenarios" / "8xA100.yaml",
                         ["convergence.target_loss=2.6", f"convergence.ladder={path}", *extra])


def test_the_multiplier_is_the_trend_at_the_scenarios_n_and_nothing_trains(tmp_path, monkeypatch):
    s = scenario(fits_file(tmp_path))
    monkeypatch.setattr(sc, "run_proxy", lambda *a, **k: pytest.fail("a proxy trained"))
    eff, info = sc.ladder_efficiency(s)
    trend = LL.Trend.fit(NS, (1.10, 1.12, 1.15, 1.16, 1.20))
    n = sc.n_non_embedding(s.workload.model)
    assert (eff.multiplier, eff.low, eff.high) == pytest.approx(trend.predict(n))
    assert eff.low < eff.multiplier < eff.high
    assert info["row"] == "cooperative" and info["distance"] == pytest.approx(n / NS[-1])
    assert sc.proxy_note(s) is None
    sec = sc.section(s, 2.0)
    assert sec["efficiency"]["ladder"]["row"] == "cooperative" and "proxy" not in sec["efficiency"]
    assert sec["to_target"]["steps_low"] <= sec["to_target"]["steps"] <= sec["to_target"]["steps_high"]
    from oresearcher.reporting.convergence_view import lines

    text = "\n".join(lines(sec))
    assert "the ladder's cooperative trend" in text and f"read {n / NS[-1]:,.0f}x past it" in text
    assert "(Chinchilla 0.34, 0.28)" in text
    assert all(len(line) <= 80 for line in lines(sec) if "fits.json" not in line)  # a path is as long as it is


def test_a_strategy_the_ladder_lacks_is_no_prediction_in_one_line(tmp_path):
    path = fits_file(tmp_path)
    why = sc.efficiency(scenario(path, "training.strategy=diloco", "training.local_steps=10"))
    assert isinstance(why, str) and why.startswith("no prediction: the ladder") and "cooperative" in why
    why = sc.efficiency(scenario(path, "training.strategy=diloco", "training.local_steps=20"))
    assert isinstance(why, str) and "diloco" in why


def test_int8_data_parallel_reads_its_own_row(tmp_path):
    path = fits_file(tmp_path)
    why = sc.efficiency(scenario(path, "training.strategy=ddp", "communication.codec=int8"))
    assert isinstance(why, str) and "no row with 3 or more sizes for ddp" in why  # the file has no ddp-int8 row
    why = sc.efficiency(scenario(path, "communication.codec=int8"))  # the cooperative program with a codec
    assert isinstance(why, str) and "for oresearcher" in why


def test_diloco_prints_the_published_direction_beside_the_ladders():
    assert LL.direction_line("diloco-h10", -0.7) == ("published (2503.09799, 35M-2.4B): m rises with N; "
                                                     "the ladder's falls")
    assert LL.direction_line("diloco-h50", 0.1).endswith("the ladder's rises")
    assert LL.direction_line("cooperative", 0.1) is None  # nothing published


def test_an_unreadable_ladder_is_a_user_error(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(UserError, match="convergence.ladder"):
        sc.efficiency(scenario(tmp_path / "bad.json"))


@settings(max_examples=40, deadline=None)
@given(ms=st.lists(st.floats(0.5, 2.0), min_size=5, max_size=5), near=st.floats(NS[0], NS[-1]),
       far=st.floats(1e6, 1e10))
def test_the_band_widens_with_the_distance_from_the_measured_sizes(ms, near, far):
    t = LL.Trend.fit(NS, ms)
    width = lambda n: math.log(t.predict(n)[2] / t.predict(n)[1])  # noqa: E731
    assert width(far) >= width(near) - 1e-12
    m, lo, hi = t.predict(near)
    assert lo <= m <= hi


def test_the_rows_are_the_ladders_strategies():
    assert LL.row_for("ddp", "int8", 1) == "ddp-int8" and LL.row_for("ddp", "other", 1) is None
    assert LL.row_for("diloco", "none", 50) == "diloco-h50" and LL.row_for("oresearcher", "none", 1) == "cooperative"
    assert LL.row_for("diloco", "none", 30) is None and LL.row_for("local_sgd", "none", 10) is None
    assert LL.row_for("oresearcher", "int8", 1) is None and LL.row_for("diloco", "int8", 10) is None


def test_the_shipped_ladder_is_the_default_where_it_measured_the_settings_and_the_proxy_elsewhere(monkeypatch):
    from oresearcher.models.ladder_law import SHIPPED

    shipped = json.loads(SHIPPED.read_text())
    calls = []
    monkeypatch.setattr(sc, "run_proxy", lambda scenario, data, log=None: calls.append(data) or [2.0] * 50)
    s = load_scenario(ROOT / "scenarios" / "8xA100.yaml", ["convergence.target_loss=2.6"])
    assert s.convergence.ladder == "shipped" and sc.uses_ladder(s)
    sec = sc.section(s, 1.0)
    lad = sec["efficiency"]["ladder"]
    want = LL.Trend.fit(*zip(*[(p["n"], p["m"]) for p in shipped["multipliers"]["cooperative"]]))
    assert sec["efficiency"]["multiplier"] == pytest.approx(want.predict(sc.n_non_embedding(s.workload.model))[0])
    commits = lad["made_by"]["commit"].split(", ")  # every invocation's commit, once, in order
    assert commits == list(dict.fromkeys(m["commit"][:7] for m in shipped["made_by"])) and not calls  # nothing trained
    other = load_scenario(ROOT / "scenarios" / "8xA100.yaml", ["convergence.target_loss=2.6",
                                                               "training.strategy=diloco", "training.local_steps=20"])
    assert not sc.uses_ladder(other)  # H = 20: the ladder ran 10 and 50, so the proxy measures it
    assert "proxy" in sc._source(other)
    off = load_scenario(ROOT / "scenarios" / "8xA100.yaml", ["convergence.target_loss=2.6", "convergence.ladder=none"])
    assert not sc.uses_ladder(off) and "proxy" in sc._source(off)
