"""Rank 0's report of a real run: written when training ends, or, after a kill between
the final checkpoint and the report, from the final checkpoints, which carry every rank's
timeline (:func:`report_from_checkpoint`). The other ranks wait for it through the store.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

from oresearcher.errors import UserError
from oresearcher.reporting.report import Timeline, summarize, write_json
from oresearcher.reporting.trace import write_trace

from oresearcher.backends.checkpoint import per_rank as ckpt
from .launcher import EXIT_PEER_LOST

log = logging.getLogger(__name__)


REPORT_WRITTEN = "report_written"


def report_from_checkpoint(saved: dict, step: int, scenario, opts, rank, world, device, store,
                            prefix, monitor) -> int:
    """A run killed after its final checkpoint but before its report (or whose disk
    filled then): the final step's checkpoints hold every rank's timeline, and the report
    is written from them, as the uninterrupted run would have written it."""
    record = saved.get("meta", {}).get("record")
    have = [None] * world
    dist.all_gather_object(have, isinstance(record, dict))
    if not all(have):
        raise UserError(f"{opts.out_dir}: checkpoint step {step} reaches training.steps={scenario.training.steps} "
                        f"but was not the final step of its run, so it holds no record to report from; "
                        f"pass --steps greater than {step + 1} to train longer")
    parts = [None] * world if rank == 0 else None
    dist.gather_object(record["timeline"], parts, dst=0)
    if rank == 0:
        log.info("training finished at step %d; writing the report from its checkpoints", step)
        tl = Timeline.merge(parts, keep_spans=max(1000, 200_000 // world))
        write_report(tl, scenario, opts, int(record["start_step"]), float(record["wall_s"]), device)
        store.set(prefix + REPORT_WRITTEN, "1")
    elif not wait_for_report(store, prefix, monitor):
        return EXIT_PEER_LOST
    dist.barrier()
    return 0


def wait_for_report(store, prefix: str, monitor, poll_s: float = 0.05) -> bool:
    """Ranks other than 0 wait while rank 0 writes the report. Not a barrier: writing
    a long run's report and figures may take longer than the process group's timeout
    (a short ``--timeout``), which must not turn a finished run into a lost rank; the
    monitor's heartbeats still catch a rank 0 that dies meanwhile."""
    while not store.check([prefix + REPORT_WRITTEN]):
        if monitor.lost is not None:
            return False
        time.sleep(poll_s)
    return True


def gather_timeline(tl: Timeline, rank: int, world: int) -> Optional[Timeline]:
    """Every rank's totals, step ends, metrics and kept spans, merged on rank 0 (None elsewhere)."""
    parts = [None] * world if rank == 0 else None
    dist.gather_object(tl.part(rank), parts, dst=0)
    return Timeline.merge(parts, keep_spans=tl.keep_spans) if rank == 0 else None


def distilled(learner, scenario, opts) -> dict:
    """Rank 0, after a distillation phase: the comparison (oresearcher.cooperation.distill) for the
    report, and the export with ``--export``."""
    if learner.distill_result is None:
        return {}
    from oresearcher.cooperation import distill

    section = distill.comparison(learner, scenario)
    if opts.export is not None:
        section["export"] = str(distill.export(learner, scenario, opts.export))
    return {"distill": section}


def deployed(learner, scenario, opts, tl: Timeline) -> dict:
    """Rank 0, after a cooperative run: the distillation comparison, the finance task's
    comparison with the single credit model, and the deployed model saved with
    ``--export`` (the student, else the fused model: oresearcher.cooperation.deploy)."""
    more = distilled(learner, scenario, opts)
    result = learner.cooperative_result
    finance, export = scenario.task.single_model_comparison, opts.export is not None and "distill" not in more
    if result is None or not (finance or export):
        return more
    from oresearcher.cooperation import deploy

    modules = deploy.fused_modules(scenario, result)
    if finance:
        from oresearcher.programs.finance_baseline import comparison

        steps = [1 + max((s for s, _t, _m in tl.metrics[r]), default=-1) for r in range(tl.world_size)]
        try:
            more["finance"] = comparison(scenario, modules, steps, learner.rules)
        except UserError as e:  # a setting the single model cannot take (e.g. privacy): the report stays
            log.warning("no comparison with the single credit model: %s", e)
    if export:
        metrics = {a: {f"test_{k}": v for k, v in s["cooperative"].items() if v == v}  # NaN: not a figure
                   for a, s in more.get("finance", {}).items() if s["cooperative"]}
        more["export"] = [str(p) for p in deploy.export_fused(scenario, result, opts.export, metrics)]
    return more


def write_report(tl: Timeline, scenario, opts, start: int, wall: float, device,
                  more: Optional[dict] = None) -> None:
    """The report, trace and figures (rank 0); a full disk is one line: the final
    checkpoints are complete and ``--resume`` writes the report from them."""
    try:
        _write_report_files(tl, scenario, opts, start, wall, device, more)
    except OSError as e:
        then = (f"--resume {opts.out_dir} writes it from the final checkpoints" if scenario.training.checkpoint_every
                else "run it again (training.checkpoint_every is 0: no checkpoint to write it from)")
        raise UserError(f"{opts.out_dir}: cannot write the report: {ckpt.write_failure(e, Path(opts.out_dir))}; "
                        f"free space, then {then}") from None


def _write_report_files(tl: Timeline, scenario, opts, start: int, wall: float, device,
                        more: Optional[dict] = None) -> None:
    extra = {
        "strategy": scenario.training.strategy,
        "start_step": start,
        "wall_time_s": wall,
        "device": str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
        "torch_version": torch.__version__,
        **(more or {}),
    }
    report = summarize(tl, scenario.resolved(), backend=opts.backend, extra=extra)
    path = Path(opts.out_dir) / "report.json"
    write_json(path, report)
    write_trace(tl, Path(opts.out_dir) / "trace.json", f"{scenario.name} ({opts.backend})")
    from oresearcher.reporting.figures import write_run_figures  # matplotlib: rank 0 only, at the end
    write_run_figures(report, tl, Path(opts.out_dir), f"{scenario.name} ({tl.world_size} ranks, {opts.backend})")
    log.info("step %.4g s (compute %.4g s, exposed comm %.4g s, overhead %.1f%%), %d steps; report: %s",
             report["step_time_s"], report["compute_time_s"], report["exposed_comm_time_s"],
             100 * report["comm_overhead"], report["steps"], path)
