"""What a resumed run may change: the saved scenario is the truth.

A run directory keeps the scenario it trained (``scenario.yaml``). ``--resume DIR``
starts from that copy; flags and ``--set`` then describe *changes*, and a change to what
was trained (the strategy, the seed, the learning rate, the codec...) would silently make
the second half of the run a different experiment. So:

- ``FREE`` fields may change on any resume: how long to train and how often to save
  or evaluate;
- ``FIXED`` fields can never change: the checkpoints hold tensors of that model for that
  many ranks, so they could not even be loaded;
- every other change is refused in one line naming the field, unless ``--override``
  says it is meant; then it takes effect for real (the worker resets the optimizer's
  learning rate, which the checkpoint would otherwise restore) and the run directory's
  ``scenario.yaml`` becomes the new truth.
"""
from __future__ import annotations

from typing import Any

from ..errors import UserError, short

FREE = ("training.steps", "training.checkpoint_every", "training.eval_every")
# the checkpoints hold these: tensors of one model in one dtype with one optimizer, for so many ranks
FIXED = ("workload.task", "workload.model", "workload.dtype", "workload.optimizer", "workload.seq_len",
         "agents.count", "agents.architectures")


def flatten(data: dict, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists and scalars are leaves."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, path + "."))
        else:
            out[path] = value
    return out


def changes(saved: dict, new: dict) -> list[tuple[str, Any, Any]]:
    """Fields whose value differs between two resolved scenarios: (path, saved, new)."""
    a, b = flatten(saved), flatten(new)
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def _describe(diffs) -> str:
    path, old, new = diffs[0]
    more = f" (and {len(diffs) - 1} more: {', '.join(p for p, _, _ in diffs[1:4])})" if len(diffs) > 1 else ""
    return f"{path} would change from {short(old)} to {short(new)}{more}"


def check(diffs: list[tuple[str, Any, Any]], override: bool) -> list[tuple[str, Any, Any]]:
    """Refuse what a resume may not change; returns the changes that need ``--override``
    (empty when nothing but FREE fields changed). UserError names the first offender."""
    fixed = [d for d in diffs if d[0] in FIXED]
    if fixed:
        raise UserError(f"--resume: {_describe(fixed)}; the checkpoints hold that model for that many ranks, "
                        "so it cannot change (start a new run instead)")
    guarded = [d for d in diffs if d[0] not in FREE]
    if guarded and not override:
        raise UserError(f"--resume: {_describe(guarded)}, but the saved scenario is what was trained; "
                        "pass --override to change it on purpose")
    return guarded
