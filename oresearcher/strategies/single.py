"""single: every agent trains alone, no communication (the equal-compute baseline;
:func:`oresearcher.programs.data_parallel.single`). Its agents are separate models, so
they may differ in architecture, and the deployable one is the best agent."""
from .spec import Strategy

STRATEGY = Strategy(
    name="single", program="oresearcher.programs.data_parallel:single",
    summary="agents train alone, no communication", symmetric_ranks=True)
