"""One rank of a real run: join the process group, build the agent, interpret its
program, and (rank 0) write the report (:mod:`oresearcher.backends.run.rank_report`).

The same program generator the simulator interprets runs here unchanged
(:func:`oresearcher.programs.get_program`); the learner comes from the task registry
(:func:`oresearcher.tasks.make_learner` with ``mode="real"``) or from a user factory.

Checkpoints and resuming (the protocol is in :mod:`oresearcher.programs`): a checkpoint
is written only at a StepDone the program marked as a resume boundary
(``ctx.mark_boundary``), under the boundary's nominal step; one that falls due between
two boundaries (mid-round in the cooperative program) is written at the next one. With
``--resume`` ranks agree on the newest checkpoint every rank holds
(:mod:`oresearcher.backends.checkpoint.per_rank`), load the learner and random generators, and
start the program with ``ctx.start_step`` (the boundary + 1) and ``ctx.restored`` (the
saved State objects, loaded as the program registers them).
"""
from __future__ import annotations

import gc
import importlib
import json
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

from oresearcher.errors import UserError, cli_main, short
from oresearcher.programs import AgentContext, get_program
from oresearcher.models.learner import DTYPES
from oresearcher.reporting.report import Timeline

from oresearcher.backends.checkpoint import per_rank as ckpt
from .interpreter import Interpreter, make_clock
from .launcher import EXIT_PEER_LOST, DistEnv, connect_store
from .monitor import Monitor, post_user_error, user_error
from .rank_report import REPORT_WRITTEN, deployed, gather_timeline, report_from_checkpoint, wait_for_report
from .rank_report import write_report as _write_report  # a module global: tests replace it (bk_tiny, bk_kill)
from .telemetry import Progress, TensorBoard, make_profiler

log = logging.getLogger(__name__)


@dataclass
class RunOptions:
    backend: str = "gloo"
    out_dir: Path = Path("runs/scenario")
    resume: bool = False
    timeout_s: float = 120.0
    heartbeat_s: float = 1.0
    profile: bool = False
    tensorboard: bool = True
    progress: Optional[bool] = None  # None: when stderr is a terminal
    learner: Optional[str] = None  # "module:function" building learners instead of the task registry
    threads: int = 1
    keep_checkpoints: int = 2
    export: Optional[Path] = None  # --export DIR: rank 0 saves the deployed model there (oresearcher.export)


def backend_unavailable(backend: str) -> Optional[str]:
    """Why ``backend`` cannot run on this machine, or None when it can."""
    if backend == "gloo":
        return None if dist.is_available() and dist.is_gloo_available() else "this torch build has no gloo backend"
    if backend == "nccl":
        if not torch.cuda.is_available():
            return f"--backend=nccl needs CUDA GPUs; this machine has none (torch {torch.__version__}); use --backend=gloo"
        if not dist.is_nccl_available():
            return f"--backend=nccl needs NCCL; this torch build ({torch.__version__}) has none; use --backend=gloo"
        return None
    return f"unknown backend {backend!r}; use gloo or nccl"


def load_factory(spec: str):
    """``"package.module:function"`` -> the function."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise UserError(f"--learner {short(spec)}: expected MODULE:FUNCTION")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError, TypeError) as e:
        raise UserError(f"--learner {short(spec)}: {short(str(e))}") from None


def build_learner(scenario, rank: int, device, spec: Optional[str]):
    if spec:
        return load_factory(spec)(scenario, rank, mode="real", device=device)
    if scenario.strategy.shards:  # torch's fully_shard per block (backends/fsdp/learner.py)
        from oresearcher.backends.fsdp.learner import make_learner as make_fsdp_learner

        return make_fsdp_learner(scenario, rank, scenario.world_size, device)
    from oresearcher.tasks import make_learner

    return make_learner(scenario, rank, mode="real", device=device)


def _device(backend: str, local_rank: int) -> torch.device:
    if backend != "nccl":
        return torch.device("cpu")
    if local_rank >= torch.cuda.device_count():
        raise UserError(f"LOCAL_RANK={local_rank} but this machine has {torch.cuda.device_count()} GPUs")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def _autocast(scenario, learner, device):
    """Mixed precision on GPUs when the scenario asks for it and the learner kept fp32 weights."""
    dtype = DTYPES[scenario.workload.dtype]
    if device.type != "cuda" or dtype == torch.float32 or learner.dtype != torch.float32:
        return None
    return lambda: torch.autocast(device_type="cuda", dtype=dtype)


def _context(scenario, rank, world, device, start: int, restored: dict) -> AgentContext:
    """The program's context; a resumed run starts at nominal step ``start``."""
    return AgentContext(rank, world, scenario, mode="real", device=device, start_step=start, restored=dict(restored))


def program_states(ctx) -> dict:
    """State objects the program registered in ``ctx.state`` (saved with the agent)."""
    state = getattr(ctx, "state", None)
    return state if isinstance(state, dict) else {}


class _Stopper:
    """Called when another rank is lost (from the monitor thread, or from the main thread
    after a failed collective): log it and, unless the main thread has wound up within
    ``grace_s`` (it may be computing, or stuck in a collective that only times out),
    end the process."""

    def __init__(self, grace_s: float, out_dir: Path, posted_by_user_error=lambda msg: False):
        self.grace_s, self.out_dir, self.finished = grace_s, out_dir, threading.Event()
        self.posted_by_user_error = posted_by_user_error

    def __call__(self, msg: str) -> None:
        if self.posted_by_user_error(msg):  # another rank's one line (divergence...): the launcher prints it
            log.debug("%s; stopping", msg)
        else:
            log.error("%s; stopping (resume with --resume %s)", msg, self.out_dir)
        threading.Thread(target=self._deadline, name="stopper", daemon=True).start()

    def _deadline(self) -> None:
        if not self.finished.wait(self.grace_s):
            logging.shutdown()
            os._exit(EXIT_PEER_LOST)


def is_comm_error(e: BaseException) -> bool:
    """Does ``e`` look like a failed collective (a lost peer) rather than a bug?"""
    if isinstance(e, getattr(dist, "DistError", ())):
        return True
    text = str(e).lower()
    return any(w in text for w in ("gloo", "nccl", "connection", "timed out", "timeout", "peer", "socket"))


def _resume_point(out_dir: Path, rank: int, world: int, wanted: Optional[int],
                  reshard: bool = False, run: Optional[dict] = None) -> tuple[int, dict]:
    """The step to resume from and this rank's saved state. The local launcher checked
    ``wanted`` already; under torchrun ranks agree on the newest step valid everywhere."""
    if wanted is None:
        held = [None] * world
        dist.all_gather_object(held, ckpt.valid_steps(out_dir, rank, run))
        wanted = ckpt.latest_common(held)
    if wanted is None:
        raise UserError(f"{out_dir}: no checkpoint that all {world} ranks completed; nothing to resume")
    step = wanted
    try:
        state = ckpt.load(ckpt.rank_file(out_dir, step, rank))
    except Exception as e:  # noqa: BLE001 -- whatever torch.load makes of a damaged file
        raise UserError(f"{ckpt.rank_file(out_dir, step, rank)}: cannot load: {ckpt.load_error(e)}") from None
    if state.get("world_size") != world and not reshard:  # reshard: fsdp's DCP state fits any world
        raise UserError(f"{out_dir}: checkpoint of step {step} is from {state.get('world_size')} ranks, this run has {world}")
    return step, state


def init_process_group(denv: DistEnv, backend: str, timeout_s: float):
    """Join the run's process group; returns (device, store)."""
    device = _device(backend, denv.local_rank)
    store = connect_store(denv, timeout_s)
    dist.init_process_group(backend, store=dist.PrefixStore(denv.prefix + "pg", store), rank=denv.rank,
                            world_size=denv.world_size, timeout=timedelta(seconds=timeout_s))
    return device, store


def run_rank(scenario, opts: RunOptions, denv: DistEnv, resume_step: Optional[int] = None) -> int:
    """Run this rank to the end; returns its exit code."""
    rank, world = denv.rank, denv.world_size
    if threading.current_thread() is threading.main_thread():
        # SIGINT reaches a rank only when sent to it: it ends the rank as SIGTERM does (the
        # launcher names it; a half-written file is a temp file removed at the next start),
        # not as a KeyboardInterrupt traceback out of torch.save
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    torch.set_num_threads(max(1, opts.threads))
    device, store = init_process_group(denv, opts.backend, opts.timeout_s)
    stopper = _Stopper(min(opts.timeout_s, 5.0), opts.out_dir,
                       lambda msg: _safe_user_error(store, denv.prefix) == msg)
    log.debug("process group ready (%s, %d ranks)", opts.backend, world)
    beat = min(opts.heartbeat_s, opts.timeout_s / 5)  # a few beats per timeout: a short --timeout is no false loss
    monitor = Monitor(store, rank, world, timeout_s=opts.timeout_s, interval_s=beat,
                      prefix=denv.prefix, on_lost=stopper, store_owner=denv.store_owner).start()
    try:
        return _train(scenario, opts, rank, world, device, store, denv.prefix, monitor, resume_step)
    except UserError as e:  # divergence, all excluded, a checkpoint a rank cannot load...
        return _user_error(e, denv, store)
    except RuntimeError as e:
        msg = monitor.identify(wait_s=min(opts.timeout_s, 10.0)) if is_comm_error(e) else None
        if msg is None:
            raise
        log.debug("collective failed: %s", e)
        return EXIT_PEER_LOST
    finally:
        stopper.finished.set()
        monitor.stop(done=True)
        if monitor.lost is None:
            dist.destroy_process_group()
        log.debug("process group destroyed")


def _safe_user_error(store, prefix: str) -> Optional[str]:
    try:
        return user_error(store, prefix)
    except Exception:  # the store host is gone: nothing to tell
        return None


def _user_error(e: UserError, denv: DistEnv, store) -> int:
    """One line for the run, whichever ranks found it (oresearcher.programs.divergence: one rank's
    divergence, or every rank's at once): the first rank to post its error makes it the
    failure notice that stops the others; our launcher prints it once and exits 2. Under
    torchrun (no launcher of ours) the first poster prints it itself."""
    notice = post_user_error(store, denv.prefix, str(e))
    if denv.store_host != "launcher" and notice == str(e):
        raise e
    return 2


def finish_rank(code: int) -> None:
    """End a rank process now that everything is written.

    ``os._exit`` skips the C++ static destructors: with torch 2.13's gloo we saw a rank
    that had finished cleanly (process group destroyed, files closed) occasionally abort
    at interpreter exit ("terminate called without an active exception", SIGABRT),
    which the launcher would report as a lost rank.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def entry_point(main) -> None:
    """``sys.exit(cli_main(main))`` for entry points that also run as rank processes:
    a rank (``RANK`` set by our launcher or torchrun) leaves through :func:`finish_rank`."""
    code = cli_main(main)
    if os.environ.get("RANK") is not None:
        finish_rank(code)
    sys.exit(code)


def _train(scenario, opts: RunOptions, rank, world, device, store, prefix, monitor, resume_step=None) -> int:
    out = Path(opts.out_dir)
    run = _run_identity(store, prefix, rank, out)
    learner = build_learner(scenario, rank, device, opts.learner)
    log.debug("learner built: %d parameters", learner.numel)
    start, saved = 0, {}
    if opts.resume:
        step, saved = _resume_point(out, rank, world, resume_step, reshard=learner.sharded, run=run)
        start = step + 1
        if start >= scenario.training.steps:  # trained to the end, stopped before the report
            return report_from_checkpoint(saved, step, scenario, opts, rank, world, device, store, prefix, monitor)
        log.info("resuming after step %d from %s", step, ckpt.step_dir(out, step))
    ctx = _context(scenario, rank, world, device, start, saved.get("states", {}))
    program = get_program(scenario.training.strategy)(ctx, learner)
    if saved:
        # a resume that overrode training.lr (--override): the optimizer takes the new lr, not the saved one
        new_lr = saved.get("meta", {}).get("lr") != scenario.training.lr
        ckpt.restore_agent(saved, learner, program_states(ctx), keep_lr=new_lr)
        if learner.sharded:  # fsdp: model and optimizer shards from DCP (backends/checkpoint/dcp.py)
            learner.load_sharded(ckpt.step_dir(out, start - 1), keep_lr=new_lr)

    total = scenario.training.steps
    saver = ckpt.Checkpointer(out, rank, world, scenario.training.checkpoint_every, total,
                              keep=opts.keep_checkpoints, store=store, prefix=prefix,
                              meta={"lr": scenario.training.lr}, run=run)
    if opts.tensorboard:  # SummaryWriter opens its files itself: its folders must not lead out of the run
        from oresearcher.files import no_links_between

        no_links_between(out, out / "tensorboard" / f"agent{rank}" / "events")
    tb = TensorBoard(out, rank) if opts.tensorboard else None
    bar = Progress(total, start, opts.progress) if rank == 0 else None
    prof = make_profiler(out, rank, device) if opts.profile else None

    last_boundary = [start - 1]

    def on_step(step, metrics, stats):
        for hook in (tb, bar):
            if hook is not None:
                hook.on_step(step, metrics, stats)
        if prof is not None:
            prof.step()
        boundary, ctx.boundary = ctx.boundary, None
        if boundary is not None:  # the program can resume after this StepDone
            if saver.due(boundary, since=last_boundary[0]):
                if learner.sharded:  # fsdp: DCP first, collectively; then the rank's file
                    learner.save_sharded(ckpt.step_dir(out, boundary))
                # the final step's checkpoint carries what the report is written from
                record = ({"timeline": tl.part(rank), "start_step": start, "wall_s": time.perf_counter() - wall0}
                          if boundary + 1 >= total else None)
                saver.save(boundary, learner, program_states(ctx), record)
            last_boundary[0] = boundary

    tl = Timeline(world, keep_spans=max(1000, 200_000 // world))  # rank 0 merges them all
    dist.barrier()  # a common start: every rank's clock reads 0 here (within the barrier's skew)
    clock = make_clock()
    ctx.clock = clock  # programs that time themselves (communication.budget) read the same clock
    interp = Interpreter(rank, world, device=device, timeline=tl, clock=clock, backend=opts.backend,
                         on_step=on_step, autocast=_autocast(scenario, learner, device),
                         record_functions=opts.profile, inner_collectives=True)
    wall0 = time.perf_counter()
    if prof is not None:
        prof.start()
    try:
        interp.run(program)
    finally:
        interp.close()
        if prof is not None:
            prof.stop()
        for hook in (tb, bar):
            if hook is not None:
                hook.close()
    wall = time.perf_counter() - wall0
    del program, interp
    gc.collect()  # free tensors shared with gloo's threads now, not during interpreter shutdown
    merged = gather_timeline(tl, rank, world)
    if rank == 0:
        more = deployed(learner, scenario, opts, merged)
        _write_report(merged, scenario, opts, start, wall, device, more)
        store.set(prefix + REPORT_WRITTEN, "1")
    elif not wait_for_report(store, prefix, monitor):
        return EXIT_PEER_LOST
    dist.barrier()  # short now (everyone is past the report): nobody tears down before the others
    return 0


RUN_IDENTITY = "run_identity"


def _run_identity(store, prefix: str, rank: int, out: Path) -> Optional[dict]:
    """The run's id and scenario hashes (its run.json), read by rank 0 and handed to the
    others through the store: checkpoints are saved with them and checked against them
    on every rank, whether or not the run directory is shared between machines."""
    if rank == 0:
        from .rundir import read_manifest

        store.set(prefix + RUN_IDENTITY, json.dumps(ckpt.run_identity(read_manifest(out))))
    return json.loads(store.get(prefix + RUN_IDENTITY))
