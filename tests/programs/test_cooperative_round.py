"""The cooperative round's shape (oresearcher.programs.cooperative_round): one Round object,
one hook per mechanism, each mechanism switched by the scenario only.

The numbers the round produces are tested end to end in test_cooperative.py, test_resume_state.py
and the simulated reports (byte-identical to the program before the round became one object)."""
from __future__ import annotations

from pathlib import Path

from oresearcher.cooperation.roles import initial_roles
from oresearcher.experiments.ablation import VARIANTS
from oresearcher.programs import AgentContext
from oresearcher.programs import cooperative_group as G
from oresearcher.programs import cooperative_local as L
from oresearcher.programs.cooperative_round import MECHANISMS, Round
from oresearcher.scenario import load_scenario
from oresearcher.tasks import make_learner

DIGITS = Path(__file__).resolve().parents[2] / "scenarios" / "digits-4.yaml"
SMALL = ["training.steps=12", "communication.interval=6"]
HOOKS = {"start", "begin", "gradient", "share", "after_step", "before_gather", "score", "fuse", "decide", "perturb",
         "exploit", "ensemble", "allocate", "after_round", "final"}


def _round(*overrides, mode="numeric"):
    sc = load_scenario(DIGITS, SMALL + list(overrides))
    return Round(AgentContext(0, sc.world_size, sc, mode=mode), make_learner(sc, 0, mode=mode))


def _switched(key: str) -> list[str]:
    """The mechanisms whose switches cover scenario field ``key``."""
    return [m.name for m in MECHANISMS if any(key == s or key.startswith(s + ".") for s in m.switches)]


def test_every_ablation_row_switches_declared_mechanisms_by_configuration():
    for variant, (_, overrides) in VARIANTS.items():
        for o in overrides:
            key = o.split("=", 1)[0]
            assert _switched(key), f"ablation row {variant!r} sets {key}, which no mechanism declares"


def test_every_mechanism_names_its_module_and_known_hooks():
    import importlib

    for m in MECHANISMS:
        importlib.import_module(m.module)
        assert m.hooks and set(m.hooks) <= HOOKS, m
        assert m.switches, m
    assert len({m.name for m in MECHANISMS}) == len(MECHANISMS)


def test_a_mechanism_turned_off_is_not_built_and_its_hooks_are_skipped():
    plain = _round()
    assert plain.privacy is None and plain.replay is None and plain.sharing.overhead is None
    assert plain.ensemble is None and plain.fusion.outer is None
    full = _round("cooperation.privacy.enabled=true", "cooperation.privacy.noise_multiplier=1.0",
                  "cooperation.roles.optimizer_method=swa", "communication.budget=0.2",
                  "cooperation.fusion.outer=nesterov")
    assert isinstance(full.privacy, L.Privacy) and full.replay is None
    assert full.sharing.overhead is not None and full.fusion.outer is not None
    replay = _round("cooperation.replay.enabled=true")
    assert isinstance(replay.replay, L.Replay) and "replay" in replay.ctx.state
    for name in ("group", "swa", "allocation", "loop", "privacy", "budget"):
        assert name in full.ctx.state  # each mechanism's State, saved with the agent's checkpoints


def _optimizer_round(*overrides):
    """A Round of the first agent whose initial role is optimizer."""
    sc = load_scenario(DIGITS, SMALL + list(overrides))
    rank = initial_roles(sc.world_size, sc.agents.roles, sc.cooperation.roles.policy).index("optimizer")
    return Round(AgentContext(rank, sc.world_size, sc, mode="numeric"), make_learner(sc, rank, mode="numeric"))


def test_the_gradient_hook_goes_to_the_first_mechanism_that_claims_it():
    sam = _optimizer_round("cooperation.roles.optimizer_method=sam")
    assert sam.roles.role == "optimizer" and sam.gradient_op().name == "sam_fwd_bwd"
    assert _optimizer_round("cooperation.roles.optimizer_method=swa").gradient_op().name == "fwd_bwd"
    private = _optimizer_round("cooperation.roles.optimizer_method=swa", "cooperation.privacy.enabled=true", "cooperation.privacy.noise_multiplier=1.0")
    assert private.gradient_op().name == "dp_fwd_bwd"  # privacy claims every step's gradient
    explorer = _round()
    assert explorer.roles.role != "optimizer" and explorer.gradient_op().name == "fwd_bwd"


def test_sharing_follows_share_every_or_the_overhead_controller():
    rd = _round("communication.share_every=2")
    rd.sharing.begin([6, 6, 6, 6], rd.members)
    assert [rd.sharing.plan_step(s)[0] for s in range(6)] == [True, False, True, False, True, False]
    off = _round("communication.gradient_sharing=false")
    off.sharing.begin([6, 6, 6, 6], off.members)
    assert not any(off.sharing.plan_step(s)[0] for s in range(6))

