"""The held-out convergence benchmark's --sizes table reads a step ratio at a fraction of
data parallel's drop, and a size trend as a straight line in (ln N, ln m)."""
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_convergence as b  # noqa: E402


def test_ratio_at_counts_steps_to_the_level_on_both_curves():
    base = [10.0 - k for k in range(11)]  # 10 -> 0, one a step: 3/4 of the drop (2.5) first at 2.0, step 9
    twice = [max(0.0, 10.0 - 2 * k) for k in range(11)]  # 2.0 at step 5
    assert b.ratio_at(base, twice, 0.75) == 9 / 5
    assert math.isnan(b.ratio_at(base, [10.0] * 11, 0.75))  # the strategy never gets there


def test_the_sizes_are_the_proxy_between_a_smaller_model_and_the_held_out_one():
    from oresearcher.sim.convergence import n_params

    small, proxy, held_out = (n_params(m) for m in b.SIZES)
    assert b.SIZES[1] == "gpt-proxy" and b.SIZES[2] == b.HELD_OUT
    assert small * 4 <= proxy and proxy * 4 <= held_out
