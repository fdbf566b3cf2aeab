"""What numeric mode will cost this host, said before it starts.

In numeric mode the simulator computes every agent's real forward and backward pass, one
agent after another, on this machine's CPU: the simulated clock comes from the device
profile, but the wall clock is this host's. A language model sized for GPUs (gpt-1.3b on
8 agents for 200 steps, about 10^17 FLOPs) would run for months without a word, so the
CLI estimates the work first: the FLOPs torch.utils.flop_counter counts for one agent's
step (:func:`oresearcher.models.workloads.measure_lm`, checkpointing's recompute included) times
agents times steps, at the shipped ``cpu-local`` profile's achieved rate for the
workload's dtype (oresearcher/hardware/profiles/cpu-local.yaml). Above :data:`WARN_S` the estimate is
printed before the run starts; above :data:`REFUSE_S` the run is refused in one line
that points at shape mode, which prices the same configuration in seconds.

The other tasks (digits, cartpole, finance) train models of kilobytes to a few megabytes:
they are not estimated. The rate is a shipped, rough figure, so the estimate is good to a
small factor, which is all a go/no-go needs.
"""
from __future__ import annotations

WARN_S = 30.0  # seconds of estimated CPU work before the run says so
REFUSE_S = 3600.0  # an hour: beyond it the user surely wanted shape mode


def numeric_flops(scenario) -> float | None:
    """FLOPs numeric mode computes for ``scenario``: one agent's step (forward, backward,
    recompute) x agents x steps; None for tasks other than synthetic-lm."""
    if not scenario.task.language_model:
        return None
    from oresearcher.models.workloads import per_rank_batch
    from oresearcher.models.workloads import measure_lm

    w = scenario.workload
    cost = measure_lm(w.model, per_rank_batch(scenario), w.seq_len, w.dtype, w.activation_checkpointing)
    return float(cost.step_flops) * scenario.world_size * scenario.training.steps


def host_rate(dtype: str) -> float:
    """Achieved FLOP/s of one CPU core for ``dtype``: the shipped cpu-local profile."""
    from ..hardware import builtin_profiles

    return builtin_profiles()[("device", "cpu-local")].flops_per_s(dtype)


def numeric_note(scenario) -> str | None:
    """None when numeric mode is quick; one line with the estimate when it takes over
    WARN_S; UserError (one line, exit 2) when it would take over REFUSE_S."""
    from oresearcher.errors import UserError
    from oresearcher.reporting.progress import fmt_duration

    flops = numeric_flops(scenario)
    if flops is None:
        return None
    rate = host_rate(scenario.workload.dtype)
    seconds = flops / rate
    if seconds <= WARN_S:
        return None
    what = (f"numeric mode computes {scenario.workload.model} for real on this CPU, agent after agent: "
            f"{flops:.2g} FLOPs, about {fmt_duration(seconds)} at {rate / 1e9:.3g} GFLOP/s (cpu-local)")
    if seconds > REFUSE_S:
        raise UserError(f"{what}; --mode shape prices it in seconds (sizes only), or lower workload.model "
                        f"or training.steps")
    return f"note: {what}"
