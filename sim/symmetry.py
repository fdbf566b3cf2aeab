"""Rank symmetry: which ranks the engine may simulate once, for a whole class.

Ranks that run the same program on the same data shapes, with no compute jitter, no
fault and no role or architecture that tells them apart, do the same thing at the same
simulated times: every Compute costs them the same, so they reach every collective
together, and a collective ends for all its members at one instant. Such ranks form an
*equivalence class*; the engine runs one representative (the lowest rank) and counts
it with the class's multiplicity wherever the others would have counted (collective
arrivals, per-rank totals, wire bytes, ops interpreted). The network still carries
every member's flows (collective plans are over the full group), so shared links see
the whole load.

:func:`symmetry_classes` decides from the scenario alone (pure, conservative); the
engine checks what the scenario cannot promise as the run goes (every member of a
class sits in every group its representative calls, no point-to-point op names a
single peer) and raises :class:`SymmetryBroken` otherwise, upon which
:func:`oresearcher.sim.simulate.simulate` runs the scenario again with one process per
rank. The report's ``engine`` section says which of the two ran.
"""
from __future__ import annotations


class SymmetryBroken(Exception):
    """A representative did something its class's members would not all do alike."""


def symmetry_classes(scenario, mode: str, device, faults) -> tuple[list[tuple[int, ...]] | None, str]:
    """(classes, why): the equivalence classes of ranks (each a sorted tuple, its first
    rank the representative) or None with the reason the engine must run every rank."""
    n = scenario.world_size
    if n <= 1:
        return None, "a single rank"
    if mode != "shape":
        return None, "numeric mode: ranks compute different values"
    # a strategy declares symmetric_ranks when its ops depend on the rank only through its data, never
    # through its number (oresearcher/programs/data_parallel.py); the cooperative program gives ranks
    # roles and fusion partners, fsdp shards unevenly: both run one process per rank
    if not scenario.strategy.symmetric_ranks:
        return None, f"training.strategy {scenario.training.strategy}: ranks run different programs"
    if scenario.communication.codec.make() is not None:
        return None, "a codec: compressed exchanges address peers by rank"
    if len(set(scenario.agents.architectures)) > 1:
        return None, "agents.architectures differ"
    if float(getattr(device, "compute_jitter_cv", 0.0) or 0.0) > 0:
        return None, "compute jitter: each rank draws its own durations"
    if float(getattr(device, "wake_delay_us", 0.0) or 0.0) > 0:
        return None, "wake-up delays: each rank draws its own"
    if faults is not None:
        return None, "faults: stragglers, failures and checkpoints name ranks"
    return [tuple(range(n))], "every rank runs the same program"
