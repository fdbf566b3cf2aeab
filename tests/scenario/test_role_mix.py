"""--num_agents keeps a scenario's role mix (oresearcher.scenario.role_mix): the README's multi-node
command (8xA100.yaml, 3/3/2 roles, on 16 agents) loads, and the rescaled counts always add
up to the new count with each role within one of its exact share."""
from __future__ import annotations

import math
import re
import shlex
from pathlib import Path

from hypothesis import given, strategies as st

from oresearcher.scenario import role_mix
from oresearcher.backends.run.flags import build_parser, load

REPO = Path(__file__).resolve().parents[2]
counts = st.integers(0, 50)


@given(st.tuples(counts, counts, counts).filter(lambda t: sum(t) > 0), st.integers(1, 5000))
def test_scaled_mix_adds_up_and_each_role_is_within_one_of_its_share(mix, count):
    roles = dict(zip(role_mix.ORDER, mix))
    new = role_mix.scaled(roles, count)
    assert sum(new.values()) == count
    for r in role_mix.ORDER:
        share = count * roles[r] / sum(mix)
        assert math.floor(share) <= new[r] <= math.ceil(share), (roles, count, new)


def test_scaled_by_hand():
    assert role_mix.scaled({"explorer": 3, "optimizer": 3, "validator": 2}, 16) == {
        "explorer": 6, "optimizer": 6, "validator": 4}
    # shares 0.75 / 1.5 / 0.75: floors 0 / 1 / 0, the two largest remainders (0.75, ties in order) get one each
    assert role_mix.scaled({"explorer": 1, "optimizer": 2, "validator": 1}, 3) == {
        "explorer": 1, "optimizer": 1, "validator": 1}


def test_override_leaves_alone_what_is_not_a_plain_mix():
    assert role_mix.override({"roles": {"explorer": 3, "optimizer": 3, "validator": 2}}, 8) is None  # adds up
    assert role_mix.override({"roles": {"explorer": "3"}}, 8) is None  # validation says what is wrong
    assert role_mix.override({"roles": {"explorer": 1, "chief": 1}}, 8) is None
    assert role_mix.override({"count": 4}, 8) is None
    assert role_mix.override({"roles": {"explorer": 1, "optimizer": 2, "validator": 1}}, 8) == (
        "agents.roles={explorer: 2, optimizer: 4, validator: 2}")


def _readme_command(pattern: str) -> list[str]:
    """The flags the README gives ``-m oresearcher.run`` in the command matching ``pattern``."""
    text = (REPO / "README.md").read_text().replace("\\\n", " ")
    line = next(ln for ln in text.splitlines() if re.search(pattern, ln))
    words = shlex.split(line.split("#")[0])
    return words[words.index("oresearcher.run") + 1:]


def test_the_readme_multi_node_command_loads_with_the_mix_kept(tmp_path):
    argv = _readme_command(r"torchrun --nnodes=2 .*-m oresearcher\.run")
    assert "--num_agents=16" in argv and any("8xA100.yaml" in a for a in argv)
    args = build_parser().parse_args([*argv, "--out", str(tmp_path / "o")])
    scenario, _, _ = load(args)
    assert scenario.agents.count == 16 and scenario.world_size == 16
    assert scenario.agents.roles.model_dump() == {"explorer": 6, "optimizer": 6, "validator": 4}


def test_a_mix_set_on_purpose_is_kept(tmp_path):
    args = build_parser().parse_args(["--scenario", str(REPO / "scenarios" / "8xA100.yaml"), "--num_agents=16",
                                      "--set", "agents.roles={explorer: 16}", "--out", str(tmp_path / "o")])
    assert load(args)[0].agents.roles.model_dump() == {"explorer": 16, "optimizer": 0, "validator": 0}


def test_sharded_agents_count_groups_not_ranks(tmp_path):
    from oresearcher.scenario import overridden

    fsdp = {"training": {"strategy": "fsdp"}, "fsdp": {"replicas": "fusion", "shard_group_size": 2}}
    assert role_mix.agents_at(fsdp, 8) == 4
    assert role_mix.agents_at(overridden(fsdp, ["fsdp.shard_group_size=4"], "t"), 8) == 2  # an override wins
    assert role_mix.agents_at(overridden(fsdp, ["fsdp.replicas=allreduce"], "t"), 8) == 8  # one model: ranks
    assert role_mix.agents_at(fsdp, 7) == 7  # does not divide: validation says so
    assert role_mix.agents_at({"training": {"strategy": "ddp"}}, 8) == 8
    # the run CLI: cpu-fsdp-agents (one explorer, one optimizer; 2 x 2 ranks) on 8 ranks is 4 agents, 2 + 2
    args = build_parser().parse_args(["--scenario", str(REPO / "scenarios" / "cpu-fsdp-agents.yaml"),
                                      "--num_agents=8", "--out", str(tmp_path / "o")])
    sc = load(args)[0]
    assert sc.world_size == 8 and sum(sc.agents.roles.model_dump().values()) == 4


def test_calibrate_keeps_the_mix_too():
    from oresearcher.calibrate import _scenario, build_parser as calibrate_parser

    args = calibrate_parser().parse_args(["--scenario", str(REPO / "scenarios" / "8xA100.yaml"), "--num_agents=16"])
    assert _scenario(args).agents.roles.model_dump() == {"explorer": 6, "optimizer": 6, "validator": 4}
