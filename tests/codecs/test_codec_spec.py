"""The codec spec parsed once into a typed value, and the documented parameter ranges:
ratio in [MIN_RATIO, 1], int8 chunk in [1, MAX_CHUNK], tol in [0, 1)."""
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oresearcher.codecs import Identity, Int8, RandK, TopK, build
from oresearcher.codecs.feedback import ErrorFeedback
from oresearcher.codecs.spec import MAX_CHUNK, MIN_RATIO, NO_CODEC, CodecSpec, parse
from oresearcher.errors import UserError
from oresearcher.scenario import Scenario, validate

sparsifiers = st.sampled_from(["topk", "randk"])


@given(sparsifiers, st.floats(MIN_RATIO, 1.0))
def test_every_ratio_in_the_documented_range_is_accepted(name, ratio):
    spec = parse(f"{name}:{ratio!r}")
    assert spec.sparse.ratio == ratio and not spec.is_none
    assert isinstance(spec.codec(), TopK if name == "topk" else RandK)


@given(sparsifiers, st.floats(0.0, MIN_RATIO, exclude_max=True) | st.floats(1.0, 1e15, exclude_min=True)  # reprs without "e+" ("+" chains)
       | st.sampled_from([math.nan, math.inf, -math.inf, -0.5]))
def test_every_ratio_outside_it_is_refused_naming_it(name, ratio):
    with pytest.raises(ValueError, match="out of range") as e:
        parse(f"{name}:{ratio!r}")
    assert repr(ratio) in str(e.value) and "bad codec spec" in str(e.value)


@given(st.integers(-10, 3 * MAX_CHUNK))
def test_int8_chunk_bound(chunk):
    if 1 <= chunk <= MAX_CHUNK:
        assert parse(f"int8:chunk={chunk}").dense.chunk == chunk
    else:
        with pytest.raises(ValueError, match=f"chunk={chunk}"):
            parse(f"int8:chunk={chunk}")


def test_the_typed_value_builds_what_build_builds():
    spec = parse(" ef(topk:0.01:approx:tol=0.2+int8:stochastic:chunk=64) ")
    assert (spec.feedback, spec.sparse.name, spec.sparse.approx, spec.sparse.tol) == ("ef", "topk", True, 0.2)
    assert (spec.dense.name, spec.dense.stochastic, spec.dense.chunk) == ("int8", True, 64)
    c = spec.make(seed=3)
    assert isinstance(c, ErrorFeedback) and c.spec == build(spec.text, seed=3).spec
    assert isinstance(parse("int8").codec(), Int8)


def test_none_is_decided_in_one_place():
    for text in ("none", " none "):
        assert parse(text).is_none and parse(text).make(seed=1) is None
        assert isinstance(build(text), Identity)  # build always gives a codec
    assert NO_CODEC.is_none
    assert not parse("ef(none)").is_none  # error feedback around an identity still runs the codec path


def test_scenario_holds_the_parsed_codec_and_dumps_its_text():
    sc = validate({"communication": {"codec": "topk:0.05+int8"}}, "s.yaml")
    assert isinstance(sc.communication.codec, CodecSpec) and sc.communication.codec.sparse.ratio == 0.05
    assert sc.resolved()["communication"]["codec"] == "topk:0.05+int8"  # reports and saved copies unchanged
    assert Scenario().communication.codec.is_none and Scenario().resolved()["communication"]["codec"] == "none"
    sc.communication.codec = "int8"  # an assignment is parsed too
    assert sc.communication.codec.dense.name == "int8"


@pytest.mark.parametrize("codec", ["topk:1e-300", "randk:1e-7", "int8:chunk=999999999", "topk:0.1:approx:tol=1"])
def test_nonsense_codec_parameters_are_one_line(codec):
    with pytest.raises(UserError, match="communication.codec") as e:
        validate({"communication": {"codec": codec}}, "s.yaml")
    assert "\n" not in str(e.value) and "out of range" in str(e.value)
