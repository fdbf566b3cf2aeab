"""Profile files are input like scenario files: numbers finite and inside ranges wide
around real hardware (NaN, 1e-300 GB/s or 1e308 us hung the simulator), the same YAML
budgets (size, aliases, depth, duplicate keys), and names that cannot shadow a shipped
profile or each other. Each refusal is one line naming the file and the field."""
import math
import time

import pytest
from hypothesis import given, settings, strategies as st

from oresearcher.errors import UserError, cli_main
from oresearcher.sim.__main__ import main
from oresearcher.hardware import load_profile_file
from oresearcher.yamlsafe import MAX_BYTES

DEVICE = {"kind": "device", "name": "dev-x", "peak_flops": "{fp32: 1.0e+10}", "efficiency": "0.5",
          "memory_bytes": "1.0e+9", "host_overhead_us": "10"}
FABRIC = {"kind": "fabric", "name": "fab-x", "topology": "switch", "bandwidth_GBps": "1.0", "efficiency": "1.0",
          "base_latency_us": "10", "hop_latency_us": "5", "call_overhead_us": "1"}


def _doc(base, **changes):
    return "\n".join(f"{k}: {v}" for k, v in {**base, **changes}.items()) + "\n"


def _file(tmp_path, text, name="prof.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize("base, field, value", [
    (DEVICE, "peak_flops", "{fp32: .nan}"), (DEVICE, "peak_flops", "{fp32: 1.0e-300}"),
    (DEVICE, "peak_flops", "{fp32: .inf}"), (DEVICE, "host_overhead_us", "1.0e+308"),
    (DEVICE, "host_overhead_us", ".nan"), (DEVICE, "memory_bytes", ".inf"), (DEVICE, "efficiency", ".nan"),
    (DEVICE, "storage_bandwidth_GBps", "1.0e-300"), (DEVICE, "memory_bandwidth_GBps", ".inf"),
    (FABRIC, "bandwidth_GBps", "1.0e-300"), (FABRIC, "bandwidth_GBps", ".nan"),
    (FABRIC, "bandwidth_GBps", ".inf"), (FABRIC, "base_latency_us", "1.0e+308"),
    (FABRIC, "hop_latency_us", "-1"), (FABRIC, "call_overhead_us", ".inf"),
])
def test_a_number_outside_its_range_is_refused_naming_the_field(tmp_path, base, field, value):
    path = _file(tmp_path, _doc(base, **{field: value}))
    with pytest.raises(UserError, match=f"prof.yaml: {base['name']}.{field}"):
        load_profile_file(path)


def test_the_simulator_refuses_a_hanging_profile_in_one_line(tmp_path, capsys):
    _file(tmp_path, _doc(FABRIC, name="gloo-bad", base_latency_us="1.0e+308"))
    sc = tmp_path / "s.yaml"
    sc.write_text(open("scenarios/local-gloo.yaml").read())
    code = cli_main(main, [str(sc), "--set", "cluster.profile_files=[prof.yaml]", "--set",
                           "cluster.intra_node=gloo-bad", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "base_latency_us" in err[0] and "Traceback" not in err[0], err


@settings(deadline=None)  # file I/O and first imports on a loaded host
@given(x=st.floats(allow_nan=True, allow_infinity=True))
def test_peak_flops_is_accepted_exactly_inside_its_documented_range(tmp_path_factory, x):
    path = _file(tmp_path_factory.mktemp("p"), _doc(DEVICE, peak_flops="{fp32: %r}" % x)
                 .replace("nan", ".nan").replace("inf", ".inf"))
    ok = math.isfinite(x) and 1e3 <= x <= 1e18
    try:
        got = load_profile_file(path)[0].peak_flops["fp32"]
    except UserError:
        assert not ok, x
    else:
        assert ok and got == x


RANGES = [(FABRIC, "bandwidth_GBps", 1e-3, 1e6), (FABRIC, "base_latency_us", 0, 1e6),
          (FABRIC, "hop_latency_us", 0, 1e6), (FABRIC, "call_overhead_us", 0, 1e6),
          (DEVICE, "host_overhead_us", 0, 1e6), (DEVICE, "memory_bandwidth_GBps", 1e-3, 1e6)]


@pytest.mark.parametrize("base, field, lo, hi", RANGES, ids=[r[1] for r in RANGES])
@settings(deadline=None, max_examples=40)  # file I/O on a loaded host
@given(x=st.floats(allow_nan=True, allow_infinity=True))
def test_each_field_is_accepted_exactly_inside_its_documented_range(tmp_path_factory, base, field, lo, hi, x):
    path = _file(tmp_path_factory.mktemp("p"), _doc(base, **{field: repr(x)}).replace("nan", ".nan")
                 .replace("inf", ".inf"))
    ok = math.isfinite(x) and lo <= x <= hi
    try:
        load_profile_file(path)
    except UserError as e:
        assert not ok and field in str(e), (x, str(e))
    else:
        assert ok, x


def test_the_shipped_profiles_still_load():
    from oresearcher.hardware import builtin_profiles

    assert len(builtin_profiles()) >= 10


@pytest.mark.parametrize("text, words", [
    ("a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
                                                      for p, c in zip("abcdefgh", "bcdefghi")), "aliases"),
    ("a: " + "[" * 200 + "]" * 200 + "\n", "nested deeper"),
    (_doc(DEVICE) + "efficiency: 0.9\n", "duplicate key"),
    ("# " + "x" * (MAX_BYTES + 10) + "\n" + _doc(DEVICE), "at most"),
])
def test_a_profile_file_is_under_the_scenario_yaml_budgets(tmp_path, text, words):
    path = _file(tmp_path, text)
    t0 = time.monotonic()
    with pytest.raises(UserError, match=words):
        load_profile_file(path)
    assert time.monotonic() - t0 < 5  # refused before expanding anything (a hang check, not a timing)


@pytest.mark.parametrize("text, words", [
    (_doc(DEVICE, name="H200"), "'H200' is the name of a shipped profile"),
    (_doc(FABRIC, name="loopback"), "'loopback' is the name of a shipped profile"),
    (_doc(DEVICE) + "---\n" + _doc(DEVICE, efficiency="0.9"), "a second device profile named 'dev-x'"),
])
def test_a_profile_cannot_shadow_a_shipped_one_or_another(tmp_path, text, words):
    from oresearcher.scenario import load_scenario

    _file(tmp_path, text)
    sc = tmp_path / "s.yaml"
    sc.write_text(open("scenarios/local-gloo.yaml").read())
    with pytest.raises(UserError, match=words):
        load_scenario(sc, ["cluster.profile_files=[prof.yaml]"])
