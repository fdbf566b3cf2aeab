"""Run the agent programs for real, on torch.distributed (gloo on CPUs, NCCL on GPUs).

    # one machine: starts one local process per agent itself
    python -m oresearcher.run --backend=gloo --scenario scenarios/local-gloo.yaml
    python -m oresearcher.run --backend=gloo --scenario scenarios/local-gloo.yaml \\
        --num_agents=4 --strategy=local_sgd --local_steps=10 --steps=200 --checkpoint_every=50
    # the reference command on 8 GPUs
    python -m oresearcher.run --backend=nccl --scenario scenarios/8xA100.yaml --num_agents=8 \\
        --communication_interval=100 --reward_weights=0.5,0.3,0.2 --strategy=oresearcher
    # several machines: torchrun starts the ranks, this joins them
    torchrun --nnodes=2 --nproc_per_node=8 --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 \\
        -m oresearcher.run --backend=nccl --scenario scenarios/8xA100.yaml --num_agents=16
    # continue a stopped run from its last complete checkpoint
    python -m oresearcher.run --resume runs/local-gloo

Writes ``<out>/report.json`` (rank 0; the simulator's schema, see
:mod:`oresearcher.report`), TensorBoard runs under ``<out>/tensorboard`` and, with
``--checkpoint_every``, per-rank checkpoints under ``<out>/checkpoints``. Flags override
the scenario's fields; ``--set path.to.field=value`` reaches any other field.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

import yaml

from .console import print_report
from .errors import UserError
from .scenario import load_raw, load_scenario

log = logging.getLogger("oresearcher.run")

DEFAULT_SCENARIO = "scenarios/local-gloo.yaml"
SAVED_SCENARIO = "scenario.yaml"

# flag -> scenario field it overrides
FLAG_FIELDS = {
    "num_agents": "agents.count",
    "communication_interval": "communication.interval",
    "reward_weights": "agents.reward_weights",
    "strategy": "training.strategy",
    "steps": "training.steps",
    "local_steps": "training.local_steps",
    "lr": "training.lr",
    "codec": "communication.codec",
    "checkpoint_every": "training.checkpoint_every",
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m oresearcher.run", description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo", help="gloo (CPU) or nccl (GPU)")
    p.add_argument("--scenario", help=f"scenario YAML (default {DEFAULT_SCENARIO}; with --resume, the run's saved copy)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override any scenario field")
    p.add_argument("--num_agents", type=int, help="agents, one rank each (agents.count)")
    p.add_argument("--communication_interval", type=int, help="steps between fusion rounds")
    p.add_argument("--reward_weights", help="task,novelty,safety weights, e.g. 0.5,0.3,0.2")
    p.add_argument("--strategy", help="oresearcher | ddp | local_sgd | diloco | single")
    p.add_argument("--steps", type=int, help="training steps per agent")
    p.add_argument("--local_steps", type=int, help="H of local_sgd/diloco")
    p.add_argument("--lr", type=float, help="learning rate")
    p.add_argument("--codec", help="codec spec for shared gradients, e.g. int8")
    p.add_argument("--checkpoint_every", type=int, help="steps between checkpoints (0: none)")
    p.add_argument("--keep_checkpoints", type=int, default=2, help="checkpoints each rank keeps (0: all)")
    p.add_argument("--out", help="run directory (default runs/<scenario name>/<backend>, beside the simulator's)")
    p.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its last complete checkpoint")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds before a silent or lost rank stops the run (process group and heartbeats)")
    p.add_argument("--profile", action="store_true", help="record torch.profiler traces for TensorBoard")
    p.add_argument("--no-tensorboard", dest="tensorboard", action="store_false", help="write no TensorBoard scalars")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on rank 0 (default: when stderr is a terminal)")
    p.add_argument("--threads", type=int, help="intra-op threads per rank (default 1, or OMP_NUM_THREADS)")
    p.add_argument("--learner", metavar="MODULE:FN",
                   help="build learners with FN(scenario, rank, mode=, device=) instead of the task registry")
    p.add_argument("--log-level", default=None, help="logging level (default INFO on rank 0, WARNING elsewhere)")
    return p


def scenario_overrides(args, raw: dict) -> list[str]:
    """``--set`` plus the named flags as ``field=value`` overrides (flags win)."""
    out = list(args.set)
    for flag, path in FLAG_FIELDS.items():
        value = getattr(args, flag)
        if value is None:
            continue
        if flag == "reward_weights":
            value = "[" + str(value).strip("[]()") + "]"
        out.append(f"{path}={value}")
    if args.num_agents is not None:
        cluster = raw.get("cluster") or {}
        if cluster.get("nodes", 1) == 1 and args.num_agents > cluster.get("gpus_per_node", 8):
            out.append(f"cluster.gpus_per_node={args.num_agents}")  # one node: grow it to fit the agents
    return out


def load(args):
    """(scenario, out_dir) from the flags; UserError on any mistake."""
    if args.resume and not Path(args.resume).is_dir():
        raise UserError(f"--resume {args.resume}: no such run directory")
    path = args.scenario or (str(Path(args.resume) / SAVED_SCENARIO) if args.resume else DEFAULT_SCENARIO)
    scenario = load_scenario(path, scenario_overrides(args, load_raw(path)))
    out = Path(args.out or args.resume or Path("runs") / scenario.name / args.backend)
    return scenario, out


def save_scenario(scenario, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / (SAVED_SCENARIO + ".tmp")
    tmp.write_text(yaml.safe_dump(scenario.resolved(), sort_keys=False))
    tmp.replace(out / SAVED_SCENARIO)


def setup_logging(level: str | None, rank: int | None) -> None:
    who = "launcher" if rank is None else f"rank{rank}"
    default = "INFO" if rank in (None, 0) else "WARNING"
    logging.basicConfig(level=(level or default).upper(), force=True,
                        format=f"%(asctime)s {who} %(levelname)s %(name)s: %(message)s")


def main(argv=None) -> int:
    from oresearcher.backends import launcher
    from oresearcher.backends.worker import RunOptions, backend_unavailable, run_rank

    args = build_parser().parse_args(argv)
    try:
        denv = launcher.from_environ()
    except ValueError as e:
        raise UserError(str(e)) from None
    setup_logging(args.log_level, denv.rank if denv else None)
    scenario, out = load(args)
    reason = backend_unavailable(args.backend)
    if reason:
        raise UserError(reason)
    threads = args.threads or int(os.environ.get("OMP_NUM_THREADS", "1") or 1)
    opts = RunOptions(backend=args.backend, out_dir=out, resume=bool(args.resume), timeout_s=args.timeout,
                      profile=args.profile, tensorboard=args.tensorboard, progress=args.progress,
                      learner=args.learner, threads=threads, keep_checkpoints=args.keep_checkpoints)
    world = scenario.world_size
    if denv is not None:
        if denv.world_size != world:
            raise UserError(f"WORLD_SIZE={denv.world_size} from the launcher, but the scenario has "
                            f"agents.count={world}; pass --num_agents={denv.world_size}")
        if denv.rank == 0 and not args.resume:
            save_scenario(scenario, out)
        return run_rank(scenario, opts, denv)
    if not args.resume:
        save_scenario(scenario, out)
    log.info("starting %d local %s ranks; run directory %s", world, args.backend, out)
    cmd = [sys.executable, "-m", "oresearcher.run", *(sys.argv[1:] if argv is None else argv)]
    result = launcher.launch_local(cmd, world, timeout_s=args.timeout, threads=threads)
    return _outcome(result, out, world)


def _outcome(result, out: Path, world: int) -> int:
    from oresearcher.backends import checkpoint

    if result.ok:
        report = json.loads((out / "report.json").read_text())
        print_report(report, f"{report['scenario']['name']}: {report['scenario']['training']['strategy']}, "
                             f"{report['world_size']} ranks on {report['backend']}, {report['steps']} steps",
                     column="measured")
        log.info("done; report: %s", out / "report.json")
        return 0
    if all(c == 2 for c in result.exit_codes):
        return 2  # every rank already printed the user error
    step = checkpoint.latest_common(checkpoint.steps_held(out, r) for r in range(world))
    where = (f"last complete checkpoint: step {step}; resume with --resume {out}" if step is not None
             else "no complete checkpoint to resume from")
    print(f"error: {result.failure or 'a rank failed'}; the other ranks stopped ({where})", file=sys.stderr)
    return 1


if __name__ == "__main__":
    from oresearcher.backends.worker import entry_point

    entry_point(main)
