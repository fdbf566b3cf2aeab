"""fsdp: sharded data parallel with torch FSDP2's semantics (:mod:`oresearcher.programs.fsdp`).

The shard groups (``fsdp.shard_group_size`` consecutive ranks) are either replicas of one
model whose gradients are all-reduced every step (``fsdp.replicas: allreduce``, HSDP), or
independent sharded agents fused shard by shard every ``communication.interval`` steps
(``fsdp.replicas: fusion``); then an agent is a shard group, and the role mix counts groups.
What the scenario must hold for it is checked here, at load (:func:`check`).
"""
from __future__ import annotations

from .spec import FlagUse, Strategy


def _fusion(sc) -> bool:
    return sc.fsdp.replicas == "fusion"


def sharded_agents(sc) -> int:
    """Ranks per independent sharded agent (``fsdp.replicas: fusion``), else 0."""
    return sc.fsdp.group_size(sc.agents.count) if _fusion(sc) else 0


def agents_at(raw: dict, ranks: int) -> int:
    """How many agents the role mix counts at ``ranks`` ranks, read from the raw scenario
    mapping (before validation): ranks / shard group size for sharded agents, else ranks."""
    fsdp = raw.get("fsdp") if isinstance(raw.get("fsdp"), dict) else {}
    if fsdp.get("replicas") != "fusion":
        return ranks
    size = fsdp.get("shard_group_size") or 0
    if type(size) is not int:
        return ranks  # the scenario's validation names the bad value
    return ranks // size if size > 0 and ranks % size == 0 else ranks


def check(sc) -> None:
    """The task, the simulation mode, the shard groups, and what sharded agents can do."""
    if not sc.task.shardable:
        from ..tasks import TASKS, get_task

        able = " or ".join(n for n in TASKS if get_task(n).shardable)
        raise ValueError(f"training.strategy fsdp shards transformer blocks: it needs workload.task "
                         f"{able} (got {sc.workload.task})")
    if sc.simulation.mode == "numeric":
        raise ValueError("training.strategy fsdp is simulated in shape mode (sizes, no math); "
                         "set simulation.mode to auto or shape")
    size = sc.fsdp.group_size(sc.agents.count)
    if sc.agents.count % size:
        raise ValueError(f"fsdp.shard_group_size={size} does not divide agents.count={sc.agents.count}")
    if _fusion(sc) and size == sc.agents.count:
        raise ValueError("fsdp.replicas fusion needs more than one sharded agent: set fsdp.shard_group_size "
                         "below agents.count")
    if _fusion(sc) and sc.cooperation.fusion.outer != "none":
        raise ValueError("cooperation.fusion.outer is not built for sharded agents (fsdp.replicas fusion): "
                         "set it to none")
    if sc.agents.roles is not None:
        _check_sharded_roles(sc)


def _check_sharded_roles(sc) -> None:
    if not _fusion(sc):
        raise ValueError("agents.roles with training.strategy fsdp needs sharded agents (fsdp.replicas: fusion): "
                         "the shard groups of fsdp.replicas allreduce are one model; set agents.roles to null")
    roles = sc.cooperation.roles
    if roles.optimizer_method != "sam" and (sc.agents.roles.optimizer or roles.policy == "dynamic"):
        raise ValueError(f"cooperation.roles.optimizer_method {roles.optimizer_method}: sharded optimizers take "
                         f"SAM steps; set it to sam")


def _allreduce(sc) -> bool:
    return sc.fsdp.replicas == "allreduce"  # replicas of one model: the update of exact data parallel, sharded


def _no_prediction(sc):
    return "no prediction: no measured efficiency for fsdp with fusion replicas" if _fusion(sc) else None


STRATEGY = Strategy(
    name="fsdp", program="oresearcher.programs.fsdp:fsdp",
    summary="sharded data parallel (FSDP2): shard groups all-reduced (HSDP) or fused as sharded agents",
    shares_model=True, shards=True, needs_every_rank=True,
    flags=(FlagUse("communication_interval", "fsdp.replicas=fusion", _fusion),),
    check=check, sharded_agents=sharded_agents, agents_at=agents_at, exact_baseline=_allreduce,
    no_prediction=_no_prediction)
