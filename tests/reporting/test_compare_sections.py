"""compare reads a prediction's convergence section and a run's metrics field by field:
a damaged one is one line naming the field (exit 2), never a traceback or a printed nan."""
import json

import pytest

from oresearcher.compare import main
from oresearcher.errors import cli_main
from reportkit import report as _report

LAW = {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28, "source": "x"}


def _section(**kw):
    c = {"law": dict(LAW), "n_params": 1e6, "tokens_per_step": 128,
         "efficiency": {"multiplier": 0.8, "low": 0.7, "high": 0.9}}
    c.update(kw)
    return c


def _run(tmp_path, capsys, pred, meas=None):
    (tmp_path / "p.json").write_text(json.dumps(pred))
    meas = meas or _report(backend="gloo", metrics={"0": [{"step": i, "loss": 5.0 - i / 10} for i in range(20)]})
    (tmp_path / "m.json").write_text(json.dumps(meas))
    code = cli_main(main, [str(tmp_path / "p.json"), str(tmp_path / "m.json")])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_whole_section_compares(tmp_path, capsys):
    code, out, err = _run(tmp_path, capsys, _report(convergence=_section()))
    assert code == 0 and "loss beside the prediction" in out and "nan" not in out


BAD = {
    "multiplier -1": (_section(efficiency={"multiplier": -1, "low": 0.7, "high": 0.9}), "efficiency.multiplier"),
    "law missing": ({k: v for k, v in _section().items() if k != "law"}, "convergence.law is missing"),
    "a list": ([1], "convergence is [1]"),
    "nan tokens": (_section(tokens_per_step=float("nan")), "tokens_per_step is nan"),
    "law beta 0": (_section(law={**LAW, "beta": 0}), "law.beta"),
    "law E text": (_section(law={**LAW, "E": "1.69"}), "law.E"),
    "source a list": (_section(law={**LAW, "source": ["x"]}), "law.source"),
    "unavailable a number": ({"law": LAW, "unavailable": 3}, "unavailable"),
    "efficiency a string": (_section(efficiency="fast"), "efficiency"),
    "n_params inf": (_section(n_params=float("inf")), "n_params"),
}


@pytest.mark.parametrize("case", BAD)
def test_a_damaged_convergence_section_is_one_line(tmp_path, capsys, case):
    section, words = BAD[case]
    code, out, err = _run(tmp_path, capsys, _report(convergence=section))
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and words in lines[0], lines


@pytest.mark.parametrize("metrics", [[1], {"0": "x"}, {"0": [1]}, {"0": [{"step": "1", "loss": 1.0}]},
                                     {"0": [{"step": 1, "loss": "low"}]}])
def test_damaged_metrics_are_one_line(tmp_path, capsys, metrics):
    code, out, err = _run(tmp_path, capsys, _report(convergence=_section()), _report(backend="gloo", metrics=metrics))
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "metrics" in lines[0], lines


def test_a_diverged_step_is_skipped_not_refused(tmp_path, capsys):
    rows = [{"step": i, "loss": float("nan") if i == 3 else 5.0 - i / 10} for i in range(20)]
    code, out, err = _run(tmp_path, capsys, _report(convergence=_section()), _report(backend="gloo", metrics={"0": rows}))
    assert code == 0, err
