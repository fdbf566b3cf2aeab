"""Checks the simulator's command line makes before anything runs: where it may write,
flags that set one field twice, and work that takes long enough to say so first.

A prediction writes report.json, trace.json and figures under the names a real run's
directory uses, so it never writes into one (:func:`out_dir`). ``--target-loss`` sets
``convergence.target_loss``; beside another setting of that field, or beside the
collective benchmark (no training, no loss), it is refused (:func:`check_target_loss`).
"""
from __future__ import annotations

from pathlib import Path

from oresearcher.errors import UserError, short
from oresearcher.files import check_dir

# The per-rank engine (one SimPy process per rank) at these sizes, measured on one core
# (cooperative program, shape mode): 1,024 ranks 25 s and 0.7 GB, 4,096 ranks 260 s and
# 3.5 GB; time grows faster than the rank count. Past PER_RANK_NOTE ranks it says so first.
PER_RANK_NOTE = 1024


def out_dir(args, name: str) -> Path:
    """The output directory, checked before anything runs (and created only when the
    results are written): writable (a file in the way, a read-only disk: one line), and
    not a real run's directory, whose measured report, trace and figures a prediction
    must never replace (a sim writes the same names)."""
    from oresearcher.files import Unreadable, read_json

    out = Path(args.out or f"runs/{name}")
    check_dir(out)  # nothing created yet: a refusal further on leaves no directory behind
    flag = f"--out {out}" if args.out else f"{out} (the default --out)"
    if (out / "run.json").exists() or (out / "run.json").is_symlink():
        raise UserError(f"{flag} holds a real run (run.json); a prediction gets its own directory, "
                        f"e.g. --out {out}/predicted")
    if (out / "report.json").is_symlink():
        return out  # replaced by the write, never followed: whatever it points to is left as it is
    try:
        report = read_json(out / "report.json")
    except FileNotFoundError:
        return out
    except (Unreadable, OSError) as e:
        raise UserError(f"{flag}: its report.json is not a prediction's ({e}); move it aside or give "
                        "another --out") from None
    if not isinstance(report, dict) or report.get("backend") != "sim":
        what = report.get("backend") if isinstance(report, dict) else None
        what = f"backend {str(what)[:40]}" if what is not None else "not a prediction's"
        raise UserError(f"{flag} holds a measured report ({what}); a prediction "
                        f"gets its own directory, e.g. --out {out}/predicted")
    return out


def check_target_loss(args, swept: str) -> None:
    """--target-loss sets convergence.target_loss: refused beside another setting of that
    field, and beside the collective benchmark (no training, no loss); its value is checked
    here so the line names the flag the user typed, not the --set it becomes."""
    import math

    target = "convergence.target_loss"
    if args.collective_bench:
        raise UserError("--target-loss applies to a simulated training run, not to --collective-bench")
    def sets_target(text: str) -> bool:
        key, _, value = text.partition("=")
        return key.strip() == target or (key.strip() == "convergence" and "target_loss" in value)

    if same := [s for s in args.set if sets_target(s)]:
        raise UserError(f"--target-loss {args.target_loss:g} and --set {same[0][:80]} both set {target}; give one")
    if args.sweep and sets_target(args.sweep):
        raise UserError(f"--target-loss {args.target_loss:g} and --sweep {swept}=... both set {target}; give one")
    if not (math.isfinite(args.target_loss) and 0 < args.target_loss <= 100):
        raise UserError(f"--target-loss {args.target_loss:g}: expected a loss in nats per token, > 0 and <= 100 "
                        f"(it sets {target})")


def per_rank_note(scenario, mode: str, exact: bool) -> str | None:
    """A line before the first step when the engine will run one process per rank for
    more than :data:`PER_RANK_NOTE` ranks (sim/symmetry.py: a program whose ranks differ,
    numeric mode, a codec, --exact); None otherwise."""
    n = scenario.world_size
    if n <= PER_RANK_NOTE:
        return None
    why = ("--exact" if exact else "numeric mode" if mode == "numeric"
           else f"training.strategy {scenario.training.strategy}" if not scenario.strategy.symmetric_ranks
           else "a codec" if scenario.communication.codec.make() is not None
           else "agents.architectures differ" if len(set(scenario.agents.architectures)) > 1 else None)
    if why is None:
        return None  # one process per class of alike ranks: seconds (faults or jitter may still split them)
    return (f"note: {n:,} ranks, one simulated process each ({why}): minutes to hours and GBs of memory at this "
            f"size (1,024 ranks take ~25 s and 0.7 GB, 4,096 ~4 min and 3.5 GB; time grows faster than ranks)")
