"""Per-rank checkpoints: each rank saves its own agent, atomically, and resumes from the
last step every rank completed.

Layout under the run directory::

    checkpoints/step-00000099/rank-0000.pt    state of rank 0 after step 99
    checkpoints/step-00000099/rank-0001.pt

A file appears under its final name only once it is complete: it is written to a
temporary name in the same directory, flushed to disk and renamed (rename is atomic on
POSIX). A checkpoint step is *complete* when every rank holds its file for that step;
ranks agree on the newest complete step by exchanging the steps they hold, so the
directory need not be shared between machines.

Checkpoints are keyed by the *nominal* step of a resume boundary the program marked
(the same on every rank; see :mod:`oresearcher.programs`).

What a rank saves (the agent state): its learner's ``state_dict()`` (model, optimizer,
data stream position where the task supports it),
the ``state_dict()`` of every State object its program registered (codec error
feedback, role, replay shard, outer optimizer...), its random generators, the step and
the world size. Loading uses ``torch.load(weights_only=True)``: a checkpoint holds
tensors and plain containers only, never pickled code.
"""
from __future__ import annotations

import logging
import os
import random
import re
from pathlib import Path
from typing import Iterable, Optional

import torch

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step-(\d{8})$")


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / "checkpoints" / f"step-{step:08d}"


def rank_file(root: Path, step: int, rank: int) -> Path:
    return step_dir(root, step) / f"rank-{rank:04d}.pt"


def save_atomic(obj, path: Path) -> None:
    """torch.save to a temporary file, fsync, then rename onto ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def steps_held(root: Path, rank: int) -> list[int]:
    """Checkpoint steps for which ``rank``'s file exists, oldest first."""
    base = Path(root) / "checkpoints"
    if not base.is_dir():
        return []
    out = []
    for d in base.iterdir():
        m = _STEP_DIR.match(d.name)
        if m and (d / f"rank-{rank:04d}.pt").is_file():
            out.append(int(m.group(1)))
    return sorted(out)


def latest_common(held_by_rank: Iterable[Iterable[int]]) -> Optional[int]:
    """The newest step every rank holds, or None."""
    sets = [set(h) for h in held_by_rank]
    common = set.intersection(*sets) if sets else set()
    return max(common) if common else None


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": _py_state_to_plain(random.getstate())}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(_py_state_from_plain(state["python"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _py_state_to_plain(s):
    version, internal, gauss = s
    return [version, list(internal), gauss]


def _py_state_from_plain(s):
    version, internal, gauss = s
    return (version, tuple(internal), gauss)


def agent_state(step: int, world_size: int, learner, states: dict) -> dict:
    """Everything one rank saves after ``step``."""
    return {
        "step": int(step),
        "world_size": int(world_size),
        "learner": learner.state_dict() if hasattr(learner, "state_dict") else {},
        "states": {name: obj.state_dict() for name, obj in states.items()},
        "rng": rng_state(),
    }


def restore_agent(ckpt: dict, learner, states: dict) -> None:
    """Load ``ckpt`` (from :func:`agent_state`) into the learner and State objects."""
    if ckpt.get("learner") and hasattr(learner, "load_state_dict"):
        learner.load_state_dict(ckpt["learner"])
    for name, sd in ckpt.get("states", {}).items():
        if name in states:
            states[name].load_state_dict(sd)
    set_rng_state(ckpt["rng"])


class Checkpointer:
    """Saves this rank's state every ``every`` steps and prunes old checkpoints.

    ``keep``: checkpoints a rank keeps of its own (0: all). Pruning only removes steps
    older than the newest step *every* rank has saved (``min_saved()``, read from the
    rendezvous store), so a complete checkpoint always remains.
    """

    def __init__(self, root: Path, rank: int, world_size: int, every: int, total_steps: int,
                 keep: int = 2, store=None, prefix: str = "oresearcher/"):
        self.root, self.rank, self.world_size = Path(root), rank, world_size
        self.every, self.total_steps, self.keep = int(every), int(total_steps), int(keep)
        self.store, self.prefix = store, prefix

    def due(self, step: int, since: Optional[int] = None) -> bool:
        """Is a checkpoint due at resume boundary ``step``? ``since``: the previous
        boundary (default ``step - 1``); a step due in between is saved at this one."""
        if self.every <= 0:
            return False
        prev = step - 1 if since is None else since
        return (step + 1) // self.every > (prev + 1) // self.every or step + 1 == self.total_steps

    def save(self, step: int, learner, states: dict) -> Path:
        path = rank_file(self.root, step, self.rank)
        save_atomic(agent_state(step, self.world_size, learner, states), path)
        log.debug("checkpoint step %d -> %s", step, path)
        if self.store is not None:
            self.store.set(f"{self.prefix}ckpt/{self.rank}", str(step))
        self._prune()
        return path

    def min_saved(self) -> Optional[int]:
        if self.store is None:
            return None
        keys = [f"{self.prefix}ckpt/{r}" for r in range(self.world_size)]
        if not self.store.check(keys):
            return None
        return min(int(v) for v in self.store.multi_get(keys))

    def _prune(self) -> None:
        if self.keep <= 0:
            return
        floor = self.min_saved()
        held = steps_held(self.root, self.rank)
        for step in held[:-self.keep]:
            if floor is not None and step < floor:
                rank_file(self.root, step, self.rank).unlink(missing_ok=True)
                try:
                    step_dir(self.root, step).rmdir()  # the last rank out removes the folder
                except OSError:
                    pass
