"""compare: refusal of mismatched reports, --force, thousands separators, the in-flight/exposed note."""
import json

import pytest

from oresearcher.compare import main
from oresearcher.reporting.compare import NOTE, mismatch
from oresearcher.errors import cli_main


def _report(name="local-gloo", strategy="ddp", world=2, **kw):
    r = {"step_time_s": 1.990787, "compute_time_s": 1.5, "comm_time_s": 0.4, "exposed_comm_time_s": 0.45,
         "comm_overhead": 0.45 / 1.990787, "wire_bytes_per_step": 3.4e6, "backend": "sim", "world_size": world,
         "scenario": {"name": name, "training": {"strategy": strategy}}}
    r.update(kw)
    return r


def _write(tmp_path, name, report):
    p = tmp_path / f"{name}.json"
    p.write_text(json.dumps(report))
    return str(p)


@pytest.mark.parametrize("other, what", [(_report(name="digits-4"), "scenario local-gloo against digits-4"),
                                         (_report(world=4), "rank count 2 against 4"),
                                         (_report(strategy="local_sgd"), "strategy ddp against local_sgd")])
def test_mismatched_reports_are_refused_in_one_line_unless_forced(tmp_path, capsys, other, what):
    a, b = _write(tmp_path, "a", _report()), _write(tmp_path, "b", dict(other, backend="gloo"))
    assert mismatch(_report(), other) == what
    assert cli_main(main, [a, b]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and what in err and "--force" in err
    assert cli_main(main, [a, b, "--force"]) == 0
    assert "step time" in capsys.readouterr().out


def test_a_figure_a_report_lacks_is_not_held_against_it():
    bare = {k: v for k, v in _report().items() if k not in ("scenario", "world_size")}
    assert mismatch(_report(), bare) is None
    assert mismatch(_report(), _report()) is None


def test_table_has_thousands_separators_and_explains_exposed_above_in_flight(tmp_path, capsys):
    a = _write(tmp_path, "a", _report(step_time_s=1.2))
    b = _write(tmp_path, "b", _report(backend="gloo"))
    assert cli_main(main, [a, b]) == 0
    out = capsys.readouterr().out
    assert "1,990.787 ms" in out and "1,200.000 ms" in out
    assert "issue to completion" in out and "rank blocked" in out
    assert NOTE in out and len(NOTE) <= 80
