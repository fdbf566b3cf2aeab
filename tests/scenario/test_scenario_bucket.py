"""communication.bucket_size_MB is at least one byte: a smaller value (1e-300) rounded to
a zero-byte bucket and failed later without naming the field; now the field and the value
are named at load, and every accepted value gives a bucket of at least one byte."""
import math

from hypothesis import given, settings, strategies as st
import pytest

from oresearcher.errors import UserError
from oresearcher.scenario import load_scenario


@settings(deadline=None)  # file I/O and first imports on a loaded host
@given(x=st.floats(allow_nan=True, allow_infinity=True))
def test_bucket_size_is_accepted_exactly_in_its_range_and_never_rounds_to_zero_bytes(x):
    ok = math.isfinite(x) and 1e-6 <= x <= 1e5
    try:
        sc = load_scenario("scenarios/local-gloo.yaml", [f"communication.bucket_size_MB={x!r}".replace("nan", ".nan")
                                                          .replace("inf", ".inf")])
    except UserError as e:
        assert not ok and "communication.bucket_size_MB" in str(e), (x, str(e))
    else:
        assert ok and sc.communication.bucket_bytes >= 1


def test_a_vanishing_bucket_names_the_field_and_the_value():
    with pytest.raises(UserError, match=r"communication.bucket_size_MB: .*1e-300"):
        load_scenario("scenarios/local-gloo.yaml", ["communication.bucket_size_MB=1e-300"])
