"""Every communication constant and formula has one definition, in oresearcher/comm, and the
modules that price, count or predict bytes use that one (identity, not equal copies); the
pricing modules convert no unit by hand."""
import ast
import math
from pathlib import Path
from typing import get_args

import pytest
from hypothesis import given, strategies as st

from oresearcher import comm
from oresearcher.comm import schedules, units, wire

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = [p for d in ("oresearcher", "sim", "backends") for p in (ROOT / d).rglob("*.py")]
COMM = ROOT / "oresearcher" / "comm"


def _defined(name: str) -> list[str]:
    """Files that assign ``name`` or define a function of that name at module level."""
    out = []
    for p in PACKAGE:
        for node in ast.parse(p.read_text()).body:
            names = [t.id for t in getattr(node, "targets", [getattr(node, "target", None)]) if isinstance(t, ast.Name)]
            if isinstance(node, ast.FunctionDef) and not _delegates(node):
                names = [node.name]
            if name in names:
                out.append(str(p.relative_to(ROOT)))
    return out


def _delegates(f: ast.FunctionDef) -> bool:
    """Whether ``f`` only calls the room's function of its own name (an adapter, not a copy:
    sim/bench.py's bus_factor takes nccl-tests' op names)."""
    body = [n for n in f.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    return (len(body) == 1 and isinstance(body[0], ast.Return) and isinstance(body[0].value, ast.Call)
            and isinstance(body[0].value.func, ast.Attribute) and body[0].value.func.attr == f.name)


@pytest.mark.parametrize("name", ["ALGORITHMS", "ALGORITHM_CHOICES", "SUPPORTED", "DIRECT_MAX_RANKS", "INT8_CHUNK",
                                  "ring_steps", "ring_share", "ring_bytes_per_rank", "bus_factor", "ring_terms",
                                  "ring_time", "maxmin_rates", "plan_time", "wire_bytes", "GB", "MB", "US"])
def test_each_is_defined_once_in_the_comm_room(name):
    where = _defined(name)
    assert len(where) == 1 and where[0].startswith("oresearcher/comm/"), where


def test_the_algorithm_names_are_the_comm_rooms():
    from oresearcher.scenario import types
    from oresearcher.scenario.schema import CommunicationSpec

    assert types.ALGORITHMS is comm.ALGORITHM_CHOICES
    assert get_args(CommunicationSpec.model_fields["algorithm"].annotation) == comm.ALGORITHM_CHOICES
    assert comm.ALGORITHM_CHOICES == ("auto", *comm.ALGORITHMS)
    assert all(set(a) <= set(comm.ALGORITHMS) for a in comm.SUPPORTED.values())


def test_the_int8_chunk_and_ratio_are_the_codecs():
    from oresearcher.codecs import build, quant, spec
    from oresearcher.cooperation import budget

    assert quant.INT8_CHUNK is wire.INT8_CHUNK and spec.INT8_CHUNK is wire.INT8_CHUNK
    assert quant.Int8().chunk == spec.DensePart().chunk == wire.INT8_CHUNK
    n = 1000 * wire.INT8_CHUNK  # whole chunks: the codec's bytes per element exactly
    assert build("int8").wire_bytes(n) / n == wire.int8_bytes_per_element() == budget.bytes_per_element("int8", "fp32")


@given(st.sampled_from(schedules.KINDS), st.integers(2, 4096))
def test_the_peer_term_is_one_formula(kind, n):
    share = schedules.ring_share(kind, n)
    assert schedules.ring_terms(kind, n)[1] == share
    assert schedules.bus_factor(kind, n) == (1.0 if kind == "Broadcast" else share)
    if kind in ("AllReduce", "ReduceScatter"):
        assert schedules.ring_bytes_per_rank(kind, 1.0, n) == share


def test_the_calibration_predicts_with_the_rooms_ring_time():
    from oresearcher.calibration.fabric_fit import FabricFit

    fit = FabricFit(1e-5, 2e-5, 3e-6, 5e9)
    for kind, n, S in (("AllReduce", 8, 2**20), ("AllGather", 4, 10**6), ("Broadcast", 2, 12345)):
        assert fit.predict(kind, S, n) == schedules.ring_time(kind, S, n, 3e-5, 3e-6, 5e9)


def test_profiles_convert_through_the_units_module():
    from oresearcher.hardware import builtin_profiles

    for (kind, _), prof in builtin_profiles().items():
        if kind == "fabric":
            assert prof.bandwidth == units.GBps_to_Bps(prof.bandwidth_GBps) * prof.efficiency
            assert prof.hop_latency == units.us_to_s(prof.hop_latency_us)
            if prof.nccl is not None:
                assert prof.nccl.launch_s == units.us_to_s(prof.nccl.launch_us)
    assert units.us_to_s(1.0) == 1e-6 and units.GBps_to_Bps(1.0) == 1e9 and units.s_to_us(1.0) == 1e6
    assert units.Bps_to_GBps(3e9) == 3.0 and units.Bps_from_ns_per_byte(0.5) == 2e9 and units.ns_to_s(1.0) == 1e-9


def _unit_literals(path: Path) -> list[str]:
    """Numeric literals inside functions that are powers of ten from 1e3 up or down (hand
    unit conversions; a named module constant, such as a tolerance, is not one)."""
    out = []
    funcs = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, (ast.FunctionDef, ast.Lambda))]
    for node in (c for f in funcs for c in ast.walk(f)):
        if isinstance(node, ast.Constant) and type(node.value) in (int, float) and node.value > 0:
            e = math.log10(node.value)
            if abs(e) >= 3 and e == round(e):
                out.append(f"{path.name}:{node.lineno}: {node.value!r}")
    return out


def test_no_hand_unit_conversion_in_the_pricing_code():
    pricing = [p for p in COMM.glob("*.py") if p.name != "units.py"] + [
        ROOT / f for f in ("sim/network.py", "sim/engine.py", "sim/swap.py", "sim/bench.py",
                           "oresearcher/programs/fsdp_costs.py", "oresearcher/calibration/fabric_fit.py")]
    hits = [h for p in pricing for h in _unit_literals(p)]
    assert hits == [], hits


def test_the_tiers_share_one_interface():
    from oresearcher.comm import alpha_beta, nccl_tier

    assert comm.TIERS == (nccl_tier, alpha_beta)
    for tier in comm.TIERS:
        assert callable(tier.applies) and callable(tier.plan)
    topo = comm.build_topology(4, 4, _fabric())
    assert not nccl_tier.applies("AllReduce", "auto", topo) and alpha_beta.applies("AllReduce", "auto", topo)
    pl = comm.plan("AllReduce", (0, 1, 2, 3), 2**20, topo, "ring")
    assert pl == alpha_beta.plan("AllReduce", (0, 1, 2, 3), 2**20, topo, "ring")
    assert comm.closed_form_time("AllReduce", "ring", (0, 1, 2, 3), 2**20, topo) == comm.plan_time(pl, topo)


def _fabric():
    from oresearcher.hardware import FabricProfile

    return FabricProfile(name="t", topology="switch", bandwidth_GBps=10.0, efficiency=1.0, base_latency_us=5.0,
                         hop_latency_us=1.0, call_overhead_us=2.0)
