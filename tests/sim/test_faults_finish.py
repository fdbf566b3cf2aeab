"""A job that can never finish is said so in one line (exit 2), not simulated forever:
random failures no longer apart than a restart (each pause brings another failure), and,
as a backstop for any other way a run stops getting ahead, more random failures than
:data:`MAX_FAILURES`."""
import pytest

from oresearcher.errors import UserError, cli_main
from oresearcher.scenario.faults import FaultsSpec
from oresearcher.sim.__main__ import main
from oresearcher.sim.faults import MAX_FAILURES, FaultPlan


@pytest.mark.parametrize("faults", ["{mtbf_s: 0.5}", "{mtbf_s: 60}", "{mtbf_s: 1, restart_delay_s: 2}"])
def test_failures_no_longer_apart_than_a_restart_are_one_line(tmp_path, capsys, faults):
    code = cli_main(main, ["scenarios/local-gloo.yaml", "--set", f"faults={faults}", "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "could never finish" in err[0] and "Traceback" not in err[0], err
    assert not list(tmp_path.iterdir())


def test_a_restart_shorter_than_the_mtbf_is_accepted():
    assert FaultsSpec(mtbf_s=60.5, restart_delay_s=60).mtbf_s == 60.5


def test_more_failures_than_a_run_can_outpace_stop_the_simulation():
    plan = FaultPlan(FaultsSpec(mtbf_s=1.0, restart_delay_s=0.5), world=2, steps=10, every=0,
                     checkpoint_bytes=0, storage_Bps=1.0, seed=0)
    plan._draw_until(1e3)  # a thousand seconds: about a thousand failures, fine
    assert 800 < len(plan.failures) < 1200
    with pytest.raises(UserError, match=f"{MAX_FAILURES:,} failures by simulated time"):
        plan._draw_until(1e9)  # drawn as the clock gets there, but stopped at the cap, not after 1e9 draws
    assert len(plan.failures) == MAX_FAILURES
