"""ddp: synchronous data parallel, gradients all-reduced every step (torch DDP's schedule;
the program is :func:`oresearcher.programs.data_parallel.ddp`)."""
from .spec import Strategy


def _exact(scenario) -> bool:
    return scenario.communication.codec.is_none  # a codec's gradients are not the exact mean


STRATEGY = Strategy(
    name="ddp", program="oresearcher.programs.data_parallel:ddp",
    summary="synchronous data parallel: gradient buckets all-reduced every step",
    shares_model=True, symmetric_ranks=True, needs_every_rank=True, flags=("codec",),
    exact_baseline=_exact, closed_form_curve=True)
