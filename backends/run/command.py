"""``python -m oresearcher.run`` (its usage: :mod:`oresearcher.run`): launch the ranks on
this machine or join a torchrun job, and turn how they ended into an exit code and the
results table. Writes ``<out>/report.json`` (rank 0; the simulator's schema, see
:mod:`oresearcher.reporting.report`), TensorBoard runs under ``<out>/tensorboard`` and, with
``--checkpoint_every``, per-rank checkpoints under ``<out>/checkpoints``.
"""
from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

from oresearcher.cooperation.deploy import exportable
from oresearcher.errors import UserError
from oresearcher.reporting.console import print_report, run_title
from oresearcher.scenario import resume
from oresearcher.tasks import batch_note

from .flags import RESHARDABLE, SAVED_SCENARIO, build_parser, hand_down, handed_down, load, run_dir, save_scenario
from .flags import setup_logging

log = logging.getLogger("oresearcher.run")


def main(argv=None) -> int:
    from oresearcher.backends.run import launcher, rundir
    from oresearcher.backends.run.worker import RunOptions, backend_unavailable

    args = build_parser().parse_args(argv)
    try:
        denv = launcher.from_environ()
    except ValueError as e:
        raise UserError(str(e)) from None
    setup_logging(args.log_level, denv.rank if denv else None)
    if denv is not None and denv.restart and not args.resume:
        _restarted(args)
    scenario, out, diffs = _scenario(args, denv)
    if (denv is None or denv.rank == 0) and (note := batch_note(scenario)):
        log.warning("%s", note)
    reason = backend_unavailable(args.backend)
    if reason:
        raise UserError(reason)
    if args.export and (why := exportable(scenario)):
        raise UserError(why)
    if args.export:  # a file in the way, another export there: refused before any rank starts
        from oresearcher.tasks.export import check_target

        check_target(args.export, replace=bool(args.overwrite or args.resume))
    if args.resume and (done := rundir.finished(out)) is not None:
        if denv is None or denv.rank == 0:
            print(f"{out}: the run finished ({done.get('steps', '?')} steps); nothing to resume, "
                  f"{rundir.REPORT} left as it is")
        return 0
    threads = args.threads or int(os.environ.get("OMP_NUM_THREADS", "1") or 1)
    opts = RunOptions(backend=args.backend, out_dir=out, resume=bool(args.resume), timeout_s=args.timeout,
                      profile=args.profile, tensorboard=args.tensorboard, progress=args.progress,
                      learner=args.learner, threads=threads, keep_checkpoints=args.keep_checkpoints,
                      export=Path(args.export) if args.export else None)
    if denv is not None:
        return _join(scenario, opts, denv, args, diffs)
    return _launch(scenario, opts, args, diffs, argv)


def _scenario(args, denv):
    """(scenario, run directory, changes a resume makes on purpose): parsed from the flags,
    or, in a rank our launcher started, the scenario the command parsed and handed down
    (the command checked the flags, the resume and its changes already)."""
    scenario = handed_down(denv)
    if scenario is None:
        return load(args)
    return scenario, run_dir(args, scenario), []


def _restarted(args) -> None:
    """A torchrun restart (``--max-restarts``; TORCHELASTIC_RESTART_COUNT > 0) runs the
    same command again: it continues the run from its newest checkpoint every rank holds,
    as ``--resume`` would; with none, it starts the run again over the failed attempt's
    directory (it is this run's own)."""
    from oresearcher.backends.checkpoint import per_rank as checkpoint

    scenario, out, _ = load(args)
    if (out / SAVED_SCENARIO).is_file() and checkpoint.newest_complete(out, scenario.world_size) is not None:
        log.warning("torchrun restart %s: resuming %s from its newest complete checkpoint",
                    os.environ.get("TORCHELASTIC_RESTART_COUNT"), out)
        args.resume, args.out = str(out), None
    else:
        log.warning("torchrun restart %s: no complete checkpoint in %s; starting again",
                    os.environ.get("TORCHELASTIC_RESTART_COUNT"), out)
        args.overwrite = True


def _note_overrides(diffs) -> None:
    for path, old, new in diffs:
        how = "resharded (fsdp)" if path in RESHARDABLE else "--override"
        log.warning("%s: %s changes from %s to %s", how, path, resume.short(old), resume.short(new))


def _prepare(scenario, out: Path, args, diffs) -> None:
    """Before any rank trains (the caller holds the run lock): a fresh directory, or a
    checked resume; the saved scenario is written, or rewritten by --override."""
    from oresearcher.backends.run import rundir

    rundir.remove_temp_files(out)
    digest = rundir.scenario_hash(scenario.resolved())
    if not args.resume:
        rundir.prepare_new(out, args.overwrite)
        rundir.write_manifest(out, digest)  # first: the directory is a run's before it holds anything
    else:
        _note_overrides(diffs)
        if diffs and rundir.read_manifest(out) is not None:
            rundir.write_manifest(out, digest)  # checkpoints saved from now on name the new scenario
    if not args.resume or diffs:
        save_scenario(scenario, out)


def _join(scenario, opts, denv, args, diffs) -> int:
    """This process is one rank of a torchrun (or our launcher's) world."""
    from oresearcher.backends.run import rundir
    from oresearcher.backends.run.worker import run_rank

    world = scenario.world_size
    if denv.world_size != world:
        raise UserError(f"WORLD_SIZE={denv.world_size} from the launcher, but the scenario has "
                        f"agents.count={world}; pass --num_agents={denv.world_size}")
    if denv.store_host == "launcher" or denv.rank != 0:
        return run_rank(scenario, opts, denv, resume_step=args.resume_step)
    with rundir.RunLock(opts.out_dir):  # rank 0 prepares before it joins: the others wait in the rendezvous
        _prepare(scenario, opts.out_dir, args, diffs)
        code = run_rank(scenario, opts, denv, resume_step=args.resume_step)
    if code == 0 and (Path(opts.out_dir) / "report.json").is_file():  # the same table a local launch prints
        print_run_report(Path(opts.out_dir))
    return code


def _launch(scenario, opts, args, diffs, argv) -> int:
    """Start one local rank per agent and watch them (we play torchrun's part)."""
    from oresearcher.backends.run import launcher, rundir

    from oresearcher.backends.run.worker import load_factory

    out, world = opts.out_dir, scenario.world_size
    check_local_world(world, args.backend)
    if args.learner:
        load_factory(args.learner)  # a bad --learner is one line here, not one per rank
    with rundir.RunLock(out):
        cmd = [sys.executable, "-m", "oresearcher.run", *(sys.argv[1:] if argv is None else argv)]
        if args.resume:
            step = resume_step(out, world, args.resume_step, scenario.training.steps)
            cmd += ["--resume-step", str(step)]  # every rank loads the step checked here
        _prepare(scenario, out, args, diffs)
        log.info("starting %d local %s ranks; run directory %s", world, args.backend, out)
        with launcher.signals_raise() as caught:
            try:
                result = launcher.launch_local(cmd, world, timeout_s=opts.timeout_s, threads=opts.threads,
                                               env=hand_down(scenario))
            except launcher.Signalled:
                rundir.remove_temp_files(out)
                print(f"error: stopped by {caught.name}; the ranks were stopped and temporary files removed "
                      f"({_where(out, world)})", file=sys.stderr)
                return 128 + caught.signum
    return _outcome(result, out, world)


def check_local_world(world: int, backend: str) -> None:
    """Ranks this machine can host: one per GPU under nccl; a few per core under gloo."""
    if backend == "nccl":
        import torch

        if world > torch.cuda.device_count():
            raise UserError(f"{world} ranks need {world} GPUs; this machine has {torch.cuda.device_count()} "
                            "(start the ranks with torchrun across machines)")
        return
    cap = max(16, 4 * (os.cpu_count() or 1))
    if world > cap:
        raise UserError(f"{world} local gloo ranks on {os.cpu_count()} cores is more than {cap}; "
                        "lower --num_agents or start the ranks with torchrun across machines")


def resume_step(out: Path, world: int, wanted, steps: int) -> int:
    """The checkpoint step a resume starts from, checked before any rank starts (one at
    training.steps' last step: the ranks write the report from it, backends/run/worker.py)."""
    from oresearcher.backends.checkpoint import per_rank as checkpoint
    from oresearcher.backends.run import rundir

    step = checkpoint.resume_step(out, world, wanted, checkpoint.run_identity(rundir.read_manifest(out)))
    if step + 1 > steps:
        raise UserError(f"--resume {out}: checkpoint step {step} is past training.steps={steps}; "
                        f"nothing left to train (pass --steps greater than {step + 1} to train longer)")
    return step


def _where(out: Path, world: int) -> str:
    from oresearcher.backends.checkpoint import per_rank as checkpoint

    step = checkpoint.newest_complete(out, world)
    return (f"last complete checkpoint: step {step}; resume with --resume {out}" if step is not None
            else "no complete checkpoint to resume from")


def print_run_report(out: Path) -> None:
    """The results table of a finished run (its report.json), and distillation's lines."""
    report = json.loads((out / "report.json").read_text())
    print_report(report, run_title(report), column="measured")
    for line in report_lines(report):  # distillation, the finance comparison, the export
        print(line)
    log.info("done; report: %s", out / "report.json")


def _outcome(result, out: Path, world: int) -> int:
    if result.ok:
        print_run_report(out)
        return 0
    if result.user_error:  # a rank's one line (divergence, a checkpoint it cannot load...): exit code 2
        rest = "" if all(c == 2 for c in result.exit_codes) else f"; the other ranks stopped ({_where(out, world)})"
        print(f"error: {result.failure}{rest}", file=sys.stderr)
        return 2
    if all(c == 2 for c in result.exit_codes):
        return 2  # every rank already printed the user error
    print(f"error: {result.failure or 'a rank failed'}; the other ranks stopped ({_where(out, world)})",
          file=sys.stderr)
    return 1


def report_lines(report: dict) -> list[str]:
    """What a finished run prints after its table: the distillation comparison, the finance
    comparison with the single credit model, and where the deployed model was exported."""
    lines = []
    if "distill" in report:
        from oresearcher.cooperation.distill import comparison_lines

        lines += comparison_lines(report["distill"])
    if "finance" in report:
        from oresearcher.programs.finance_baseline import comparison_lines as finance_lines

        lines += finance_lines(report["finance"])
    if report.get("export"):
        lines.append(f"exported the deployed model (the fused agents) to {', '.join(report['export'])} "
                     "(load with oresearcher.export.load_model)")
    return lines


if __name__ == "__main__":
    from oresearcher.backends.run.worker import entry_point

    entry_point(main)
