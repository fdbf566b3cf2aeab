"""local_sgd: each agent steps alone and the group averages parameters every H =
``training.local_steps`` steps (Stich, ICLR 2019; :func:`oresearcher.programs.data_parallel.local_sgd`)."""
from .spec import Strategy


def every_h(scenario) -> int:
    return scenario.training.local_steps


STRATEGY = Strategy(
    name="local_sgd", program="oresearcher.programs.data_parallel:local_sgd",
    summary="local steps, parameters averaged every training.local_steps steps",
    shares_model=True, symmetric_ranks=True, outer_loop=True, flags=("local_steps",), sync_period=every_h)
