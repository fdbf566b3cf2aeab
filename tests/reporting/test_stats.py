"""The experiments' statistics (oresearcher.reporting.stats) by hand: the t-interval of a
mean, the paired difference and the side of 0 its interval lies on."""
import pytest

from oresearcher.reporting.stats import ci95, paired, verdict_word


def test_ci_by_hand():
    m, lo, hi = ci95([1.0, 2.0, 3.0])
    assert m == 2.0 and hi - m == pytest.approx(4.302653 / 3 ** 0.5, rel=1e-5) and m - lo == pytest.approx(hi - m)


def test_paired_difference_and_its_side_by_hand():
    a = [{"model": x} for x in (0.9, 0.8, 0.85)]
    b = [{"model": x} for x in (0.6, 0.5, 0.6)]
    d = paired(a, b, "model")
    assert d[0] == pytest.approx(0.85 / 3) and verdict_word(d, "wins", "loses", "ties") == "wins"
    assert verdict_word(paired(b, a, "model"), "wins", "loses", "ties") == "loses"
    assert verdict_word((0.0, -0.1, 0.1), "wins", "loses", "ties") == "ties"
    assert paired(a[:1], b[:1], "model") is None and verdict_word(None, "wins", "loses", "ties") == "n/a"
    assert paired([*a, {"error": "x"}], [*b, {"model": 0.0}], "model") == d  # a failed run pairs with nothing
