"""Checks across sections for sharded training (``training.strategy: fsdp``) and the role mix.

:mod:`oresearcher.scenario` calls these from its model validators; each raises ValueError
with one line, which the loader turns into ``file: message`` and exit code 2.

The role mix (``agents.roles``) counts agents. For every strategy but sharded agents that
is ``agents.count`` (one rank each); with ``fsdp.replicas: fusion`` an agent is a shard
group, so the mix adds up to agents.count / fsdp.shard_group_size, and the roles run as
:mod:`oresearcher.cooperation.sharded_roles` builds them (SAM optimizers).
"""
from __future__ import annotations


def check_fsdp(sc) -> None:
    """``training.strategy: fsdp``: the task, the simulation mode, the shard groups, and what
    sharded agents can do."""
    if sc.training.strategy != "fsdp":
        return
    if sc.workload.task != "synthetic-lm":
        raise ValueError(f"training.strategy fsdp shards transformer blocks: it needs workload.task "
                         f"synthetic-lm (got {sc.workload.task})")
    if sc.simulation.mode == "numeric":
        raise ValueError("training.strategy fsdp is simulated in shape mode (sizes, no math); "
                         "set simulation.mode to auto or shape")
    size = sc.fsdp.group_size(sc.agents.count)
    if sc.agents.count % size:
        raise ValueError(f"fsdp.shard_group_size={size} does not divide agents.count={sc.agents.count}")
    if sc.fsdp.replicas == "fusion" and size == sc.agents.count:
        raise ValueError("fsdp.replicas fusion needs more than one sharded agent: set fsdp.shard_group_size "
                         "below agents.count")
    if sc.fsdp.replicas == "fusion" and sc.cooperation.fusion.outer != "none":
        raise ValueError("cooperation.fusion.outer is not built for sharded agents (fsdp.replicas fusion): "
                         "set it to none")
    if sc.agents.roles is not None:
        _check_sharded_roles(sc)


def _check_sharded_roles(sc) -> None:
    if sc.fsdp.replicas != "fusion":
        raise ValueError("agents.roles with training.strategy fsdp needs sharded agents (fsdp.replicas: fusion): "
                         "the shard groups of fsdp.replicas allreduce are one model; set agents.roles to null")
    roles = sc.cooperation.roles
    if roles.optimizer_method != "sam" and (sc.agents.roles.optimizer or roles.policy == "dynamic"):
        raise ValueError(f"cooperation.roles.optimizer_method {roles.optimizer_method}: sharded optimizers take "
                         f"SAM steps; set it to sam")


def check_role_mix(sc) -> None:
    """``agents.roles`` adds up to the number of agents (sharded agents: shard groups)."""
    mix = sc.agents.roles
    if mix is None:
        return
    total = mix.explorer + mix.optimizer + mix.validator
    if sc.training.strategy == "fsdp" and sc.fsdp.replicas == "fusion":
        size = sc.fsdp.group_size(sc.agents.count)
        if total != sc.agents.count // size:
            raise ValueError(f"agents.roles add up to {total}; there are {sc.agents.count // size} sharded agents "
                             f"(agents.count {sc.agents.count} / fsdp.shard_group_size {size})")
    elif total != sc.agents.count:
        raise ValueError(f"agents.roles add up to {total}, agents.count is {sc.agents.count}")
