"""The run command's flags and scenario: the parser, the flags that are shortcuts for
scenario fields, the checks that a flag is one the strategy uses, and loading the scenario
(or a run directory's saved copy, with ``--resume``). :mod:`oresearcher.backends.run.command`
launches what this loads.

The scenario is parsed once per run: the command reads, overrides and validates it, and
hands the validated scenario to the ranks its launcher starts (:func:`hand_down`: its JSON
in their environment); such a rank rebuilds it with one ``model_validate_json`` and reads
no file (:func:`handed_down`). A rank torchrun started has no command of ours above it and
parses the file itself, once.
"""
from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import Mapping, Optional

import yaml

from oresearcher.errors import Parser, UserError
from oresearcher.scenario import resume, role_mix
from oresearcher.scenario import Scenario, check_resize, load_raw, load_scenario, output_dir, overridden
from oresearcher.scenario import strategy_alias_error
from oresearcher.scenario.shipped import find_scenario

log = logging.getLogger("oresearcher.run")

DEFAULT_SCENARIO = "scenarios/local-gloo.yaml"
RESHARDABLE = ("agents.count", "agents.roles", "fsdp.shard_group_size",  # fsdp resumes may change
               "fsdp.reshard_after_forward")
SAVED_SCENARIO = "scenario.yaml"
# the validated scenario, from the command to the ranks its launcher starts, and its file
HANDED_DOWN, HANDED_DOWN_SOURCE = "ORESEARCHER_SCENARIO_JSON", "ORESEARCHER_SCENARIO_SOURCE"
HANDED_DOWN_MAX = 64 * 1024  # characters; exec refuses an environment string over 128 KiB (Linux)

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


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a number of seconds") from None
    if not (1 <= v <= 7 * 86400):  # below a second a busy host's heartbeats read as lost ranks
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: expected seconds in [1, 604800]")
    return v


def _int_at_least(lo: int):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number") from None
        if not lo <= v <= 10**9:
            raise argparse.ArgumentTypeError(f"{v} is out of range [{lo}, 1e9]")
        return v
    return parse


_nonneg_int, _pos_int = _int_at_least(0), _int_at_least(1)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m oresearcher.run",
                description="Run the agent programs for real, on torch.distributed (gloo on CPUs, NCCL on GPUs).")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo", help="gloo (CPU) or nccl (GPU)")
    p.add_argument("--scenario", help=f"scenario YAML (default {DEFAULT_SCENARIO}; with --resume, the run's saved copy)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override any scenario field")
    p.add_argument("--num_agents", type=int, help="agents, one rank each (agents.count; the scenario's role mix "
                   "is rescaled to it)")
    p.add_argument("--communication_interval", type=int, help="steps between fusion rounds (oresearcher; fsdp with fsdp.replicas=fusion)")
    p.add_argument("--reward_weights", help="task,novelty,safety weights, e.g. 0.5,0.3,0.2 (oresearcher)")
    p.add_argument("--strategy", help="oresearcher | ddp | local_sgd | diloco | single | fsdp "
                   "(sharded, torch FSDP2; colossalai is refused: use fsdp)")
    p.add_argument("--steps", type=int, help="training steps per agent")
    p.add_argument("--local_steps", type=int, help="H of local_sgd/diloco (refused for other strategies)")
    p.add_argument("--lr", type=float, help="learning rate")
    p.add_argument("--codec", help="codec spec for shared gradients, e.g. int8 (oresearcher, ddp)")
    p.add_argument("--checkpoint_every", type=int, help="steps between checkpoints (0: none)")
    p.add_argument("--keep_checkpoints", type=_nonneg_int, default=2, help="checkpoints each rank keeps (0: all)")
    p.add_argument("--out", help="run directory (default runs/<scenario name>/<backend>, beside the simulator's)")
    p.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its last complete checkpoint; "
                   "flags may change only steps, checkpoint_every and eval_every unless --override")
    p.add_argument("--override", action="store_true",
                   help="with --resume: let flags change what the run trains (lr, strategy, seed, codec...); "
                   "the new values take effect, the optimizer's lr included, and become the saved scenario")
    p.add_argument("--resume-step", type=_nonneg_int, metavar="N",
                   help="with --resume: start from checkpoint step N (default: the newest complete one)")
    p.add_argument("--overwrite", action="store_true",
                   help="a new run into a directory that holds a run replaces it (default: refuse)")
    p.add_argument("--timeout", type=_seconds, default=120.0,
                   help="seconds before a silent or lost rank stops the run (process group and heartbeats)")
    p.add_argument("--profile", action="store_true", help="record torch.profiler traces for TensorBoard")
    p.add_argument("--no-tensorboard", dest="tensorboard", action="store_false", help="write no TensorBoard scalars")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on rank 0 (default: when stderr is a terminal)")
    p.add_argument("--threads", type=_pos_int, help="intra-op threads per rank (default 1, or OMP_NUM_THREADS)")
    p.add_argument("--learner", metavar="MODULE:FN",
                   help="build learners with FN(scenario, rank, mode=, device=) instead of the task registry")
    p.add_argument("--export", metavar="DIR", help="after cooperative training, save the deployed model as "
                   "safetensors + JSON in DIR (oresearcher.export): the distilled student (distill.student), else "
                   "the fused agents, one directory per architecture in a heterogeneous run")
    p.add_argument("--log-level", default=None, help="logging level (default INFO on rank 0, WARNING elsewhere)")
    return p


def scenario_overrides(args, raw: dict, labels: dict | None = None) -> list[str]:
    """``--set`` plus the named flags as ``field=value`` overrides (flags win); ``labels``
    is filled with override -> the flag that made it, for error messages."""
    out = list(args.set)
    labels = {} if labels is None else labels
    for flag, path in FLAG_FIELDS.items():
        value = getattr(args, flag)
        if value is None:
            continue
        if flag == "reward_weights":
            value = "[" + str(value).strip("[]()") + "]"
        out.append(f"{path}={value}")
        labels[out[-1]] = f"--{flag}={getattr(args, flag)}"
    if args.num_agents is not None:
        cluster = raw.get("cluster") or {}
        if cluster.get("nodes", 1) == 1 and cluster.get("gpus_per_node", 8) < args.num_agents <= 64:
            out.append(f"cluster.gpus_per_node={args.num_agents}")  # one node: grow it to fit the agents
        if not any(s.startswith("agents.roles") for s in args.set):  # a mix set on purpose is the user's
            agents = role_mix.agents_at(overridden(raw, out, "--set"), args.num_agents)  # sharded: ranks / shard size
            roles = role_mix.override(raw.get("agents"), agents)  # the mix, at the new count
            if roles:
                out.append(roles)
        labels.update({t: f"--num_agents={args.num_agents}" for t in out[len(args.set):] if t not in labels})
    return out


def check_flags_agree(args) -> None:
    """Flags that contradict each other or do nothing here are refused, one line each:
    ``--override`` or ``--resume-step`` without ``--resume``, and a named flag given beside
    a ``--set`` of the field it sets (which one wins would be an accident of order)."""
    for flag in ("override", "resume_step"):
        if getattr(args, flag) not in (None, False) and not args.resume:
            raise UserError(f"--{flag.replace('_', '-')} only applies to --resume DIR")
    for flag, path in FLAG_FIELDS.items():
        same = [s for s in args.set if s.split("=", 1)[0].strip() == path]
        if getattr(args, flag) is not None and same:
            raise UserError(f"--{flag}={getattr(args, flag)} and --set {same[0]} both set {path}; give one")


def check_flags_used(args, scenario) -> None:
    """A named flag whose field the run's strategy never reads is refused in one line that
    names the strategies that read it.

    Refused rather than switching the strategy for the user: a flag sets one field and
    nothing else, so what runs is what the scenario file and the flags say. Picking
    ``--strategy=oresearcher`` because ``--reward_weights`` was given would turn a
    scenario's ddp run into another experiment (other programs, other collectives, other
    report) on a guess, and the same flags would mean different runs under different
    scenario files. The refusal costs one word to fix and cannot be misread."""
    from oresearcher.strategies import all_strategies

    everyone = all_strategies()
    for flag in FLAG_FIELDS:  # a flag no strategy declares (steps, lr, ...) is read by every program
        users = [s for s in everyone if s.flag_user(flag)]
        if not users or getattr(args, flag) is None or scenario.strategy.reads_flag(flag, scenario):
            continue
        who = " or ".join(s.flag_user(flag) for s in users)
        raise UserError(f"--{flag} sets {FLAG_FIELDS[flag]}, which training.strategy {scenario.training.strategy} "
                        f"does not use (used by {who}); pass --strategy={users[0].name} or drop --{flag}")


def load(args):
    """(scenario, out_dir, changes a resume makes on purpose) from the flags; UserError on any mistake."""
    if why := strategy_alias_error(args.strategy, "--strategy="):
        raise UserError(why)
    check_flags_agree(args)
    if args.resume:
        scenario, out, diffs = _load_resume(args)
        check_flags_used(args, scenario)
        return scenario, out, diffs
    path, labels = str(find_scenario(args.scenario or DEFAULT_SCENARIO)), {}
    overrides = scenario_overrides(args, load_raw(path), labels)
    scenario = load_scenario(path, overrides, labels)
    check_resize(scenario, overrides, labels)
    check_flags_used(args, scenario)
    if path != args.scenario:  # the default, or a shipped one: say which
        log.info("scenario file: %s", path)
    return scenario, run_dir(args, scenario), []


def run_dir(args, scenario) -> Path:
    """The run directory: --resume's, --out, or runs/<scenario name>/<backend>."""
    if args.resume:
        return Path(args.resume)
    return Path(args.out) if args.out else output_dir("runs", scenario.name, args.backend)


def hand_down(scenario, base: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment for the ranks a command starts: ``base`` with the validated
    ``scenario`` handed down (:func:`handed_down`), and without any scenario ``base`` held;
    a scenario too large for an environment string is not handed down (the ranks then
    parse the file, as before)."""
    env = {k: v for k, v in base.items() if k not in (HANDED_DOWN, HANDED_DOWN_SOURCE)}
    text = scenario.model_dump_json()
    if len(text) > HANDED_DOWN_MAX:
        log.debug("scenario JSON of %d characters: the ranks parse the file themselves", len(text))
        return env
    source = getattr(scenario, "_source", None)
    return {**env, HANDED_DOWN: text, HANDED_DOWN_SOURCE: "" if source is None else str(source)}


def handed_down(denv, environ: Mapping[str, str] = os.environ) -> Optional[Scenario]:
    """The scenario the launching command handed this rank (:func:`hand_down`), or None
    where it must parse the file itself: not a rank (``denv`` None), a rank that torchrun
    or plain environment variables started, or nothing handed down. A rebuild validates
    the JSON only: no YAML, no overrides, no profile files (the command checked those)."""
    text = environ.get(HANDED_DOWN)
    if denv is None or denv.store_host != "launcher" or text is None:
        return None
    scenario = Scenario.model_validate_json(text)
    source = environ.get(HANDED_DOWN_SOURCE)
    scenario._source = Path(source) if source else None  # relative paths resolve as in the command
    return scenario


def _load_resume(args):
    run_dir = Path(args.resume)
    if not run_dir.is_dir():
        raise UserError(f"--resume {args.resume}: no such run directory")
    if args.out and Path(args.out).resolve() != run_dir.resolve():
        raise UserError(f"--out {args.out} with --resume {args.resume}: a run continues in its own directory")
    saved_path = run_dir / SAVED_SCENARIO
    if not saved_path.is_file():
        raise UserError(f"--resume {args.resume}: no {SAVED_SCENARIO}; not a run directory")
    saved = load_scenario(saved_path)
    path, labels = args.scenario or saved_path, {}
    overrides = scenario_overrides(args, load_raw(path), labels)
    scenario = load_scenario(path, overrides, labels)
    check_resize(scenario, overrides, labels)
    diffs = resume.changes(saved.resolved(), scenario.resolved())
    # fsdp keeps model and optimizer in DCP, which reshards them to another number of ranks
    # or another layout: the same training state, sharded differently
    fsdp = saved.strategy.shards and scenario.strategy.shards
    reshard = [d for d in diffs if d[0] in RESHARDABLE] if fsdp else []
    diffs = resume.check([d for d in diffs if d not in reshard], args.override)
    return scenario, run_dir, reshard + diffs


def save_scenario(scenario, out: Path) -> None:
    from oresearcher.files import write_atomic  # never through a link planted in the run directory

    write_atomic(out / SAVED_SCENARIO, yaml.safe_dump(scenario.resolved(), sort_keys=False).encode())


def setup_logging(level: str | None, rank: int | None) -> None:
    who = "launcher" if rank is None else f"rank{rank}"
    default = "INFO" if rank in (None, 0) else "WARNING"
    logging.basicConfig(level=(level or default).upper(), force=True,
                        format=f"%(asctime)s {who} %(levelname)s %(name)s: %(message)s")
