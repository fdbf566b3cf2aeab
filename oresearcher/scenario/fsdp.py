"""The role mix checked against the number of agents.

:mod:`oresearcher.scenario` calls this from its model validators; it raises ValueError
with one line, which the loader turns into ``file: message`` and exit code 2. (What a
strategy itself refuses, fsdp's shard groups among it, its declaration checks:
``Strategy.check``, :mod:`oresearcher.strategies.fsdp`.)

The role mix (``agents.roles``) counts agents. For every strategy but sharded agents that
is ``agents.count`` (one rank each); with ``fsdp.replicas: fusion`` an agent is a shard
group, so the mix adds up to agents.count / fsdp.shard_group_size, and the roles run as
:mod:`oresearcher.cooperation.sharded_roles` builds them (SAM optimizers).
"""
from __future__ import annotations


def check_role_mix(sc) -> None:
    """``agents.roles`` adds up to the number of agents (sharded agents: shard groups)."""
    mix = sc.agents.roles
    if mix is None:
        return
    total = mix.explorer + mix.optimizer + mix.validator
    size = sc.strategy.sharded_agents(sc)
    if size:
        if total != sc.agents.count // size:
            raise ValueError(f"agents.roles add up to {total}; there are {sc.agents.count // size} sharded agents "
                             f"(agents.count {sc.agents.count} / fsdp.shard_group_size {size})")
    elif total != sc.agents.count:
        raise ValueError(f"agents.roles add up to {total}, agents.count is {sc.agents.count}")
