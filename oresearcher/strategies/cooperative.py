"""oresearcher: the cooperative O-Researcher program (roles, gradient sharing, fusion,
replay, privacy, hosted agents), then a distillation phase when ``distill.student`` is set
(:func:`oresearcher.programs.distill.program`). Its agents are separate models that may
differ in architecture; a diverged agent is left out of a round and goes on (skip)."""
from .spec import Strategy


def sync_period(scenario) -> int:
    """Steps between the collectives that pull ranks together: gradient sharing, else fusion."""
    c = scenario.communication
    return c.share_every if c.gradient_sharing else c.interval


STRATEGY = Strategy(
    name="oresearcher", program="oresearcher.programs.distill:program",
    summary="cooperative agents: roles, gradient sharing, fusion every communication.interval steps",
    cooperative=True, on_divergence="skip", flags=("communication_interval", "reward_weights", "codec"),
    sync_period=sync_period)
