"""compare as a CI gate: a bound or a figure that is not a finite number >= 0 is refused
in one line (exit 2), never compared (NaN would make every comparison pass); so are
figures of the wrong type and JSON nested past the parser's depth."""
import json
import math

import pytest
from hypothesis import given, settings, strategies as st

from oresearcher.compare import main
from oresearcher.reporting.compare import HEADLINE
from oresearcher.errors import cli_main
from reportkit import report as _report


def _write(path, report):
    path.write_text(report if isinstance(report, str) else json.dumps(report))
    return str(path)


def _one_line(capsys, code, words):
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and words in err[0], err
    assert "Traceback" not in err[0]


@pytest.mark.parametrize("bound", ["nan", "NaN", "inf", "-inf", "-0.1", "fast", ""])
def test_a_bound_that_is_not_a_finite_fraction_is_refused(tmp_path, capsys, bound):
    a, b = _write(tmp_path / "a.json", _report()), _write(tmp_path / "b.json", _report(backend="gloo"))
    _one_line(capsys, cli_main(main, [a, b, "--max-error", bound]), "--max-error")


@pytest.mark.parametrize("bad, words", [
    ({"step_time_s": float("nan")}, "step_time_s is nan"),
    ({"comm_overhead": float("inf")}, "comm_overhead is inf"),
    ({"step_time_s": -1.0}, "step_time_s is -1.0"),
    ({"compute_time_s": -0.5}, "compute_time_s"),
    ({"step_time_s": "fast"}, "step_time_s is 'fast'"),
    ({"step_time_s": True}, "step_time_s is True"),
    ({"step_time_s": None}, "step_time_s is None"),
    ({"scenario": "x"}, "scenario is 'x'"),
    ({"scenario": {"name": "local-gloo", "training": 3}}, "scenario.training"),
    ({"world_size": "2"}, "world_size"),
])
@pytest.mark.parametrize("side", ["predicted", "measured"])
def test_a_report_whose_figures_are_not_finite_numbers_is_refused(tmp_path, capsys, bad, words, side):
    good, hurt = _report(), _report(**bad)
    a = _write(tmp_path / "a.json", hurt if side == "predicted" else good)
    b = _write(tmp_path / "b.json", good if side == "predicted" else hurt)
    _one_line(capsys, cli_main(main, [a, b, "--max-error", "0.5"]), words)


@pytest.mark.parametrize("text, words", [("[" * 100_000 + "]" * 100_000, "nested too deeply"),
                                         ('{"a": ' * 100_000 + "1" + "}" * 100_000, "nested too deeply"),
                                         ("[1, 2]", "a JSON list"), ("NaN", "a JSON float")])
def test_deeply_nested_or_non_object_json_is_refused(tmp_path, capsys, text, words):
    a, b = _write(tmp_path / "a.json", _report()), _write(tmp_path / "b.json", text)
    _one_line(capsys, cli_main(main, [a, b]), words)


figure = st.floats(min_value=1e-6, max_value=1e3, allow_nan=False)


@settings(deadline=None)  # file I/O and first imports on a loaded host
@given(pred=st.tuples(figure, figure), meas=st.tuples(figure, figure),
       bound=st.floats(min_value=0, max_value=10, allow_nan=False))
def test_the_gate_fails_exactly_when_a_headline_error_exceeds_the_bound(tmp_path_factory, pred, meas, bound):
    d = tmp_path_factory.mktemp("gate")
    a = _write(d / "a.json", _report(**dict(zip(HEADLINE, pred))))
    b = _write(d / "b.json", _report(backend="gloo", **dict(zip(HEADLINE, meas))))
    worst = max(abs((p - m) / m) for p, m in zip(pred, meas))
    assert math.isfinite(worst)
    assert cli_main(main, [a, b, "--max-error", repr(bound)]) == (1 if worst > bound else 0)
