"""diloco: local SGD with an outer Nesterov step on the pseudo-gradient at each average,
every H = ``training.local_steps`` steps (Douillard et al., 2023;
:func:`oresearcher.programs.data_parallel.diloco`)."""
from .local_sgd import every_h
from .spec import Strategy

STRATEGY = Strategy(
    name="diloco", program="oresearcher.programs.data_parallel:diloco",
    summary="local steps, an outer Nesterov step on the average every training.local_steps steps",
    shares_model=True, symmetric_ranks=True, outer_loop=True, flags=("local_steps",), sync_period=every_h)
