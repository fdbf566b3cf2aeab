"""Per-rank checkpoints: each rank saves its own agent, atomically, and resumes from the
last step every rank completed.

Layout under the run directory::

    checkpoints/step-00000099/rank-0000.pt     state of rank 0 after step 99
    checkpoints/step-00000099/rank-0000.json   its manifest: step, rank, world size, the
                                               run id and scenario hash (the run's
                                               run.json: backends/run/rundir.py), and the
                                               size and SHA-256 of rank-0000.pt
    checkpoints/step-00000099/rank-0001.pt
    checkpoints/step-00000099/rank-0001.json

A file appears under its final name only once it is complete: it is written to a
temporary name in the same directory, flushed to disk and renamed (rename is atomic on
POSIX). The manifest is written last, so a rank *holds* a step only once its manifest is
there; a rank's step is *valid* when the file's size and checksum match the manifest
(a disk that filled up, a truncated copy, bit rot) and its manifest names this run and
one of the scenarios it trained (a rank file copied in from another run is a stranger,
skipped in one line like a damaged one). A checkpoint step is *complete* when
every rank holds a valid file for it. A resume takes the newest complete step, saying in
one line which newer ones it skipped and why (``--resume-step N`` asks for one). Ranks
agree on it by exchanging the steps they hold, so the directory need not be shared
between machines; the local launcher checks it before it starts any rank.

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

import json
import logging
import random
import re
from pathlib import Path
from typing import Iterable, Optional

import torch

from oresearcher.errors import UserError
from oresearcher.files import sha256_file, write_atomic

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step-(\d{8})$")


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / "checkpoints" / f"step-{step:08d}"


def rank_file(root: Path, step: int, rank: int) -> Path:
    return step_dir(root, step) / f"rank-{rank:04d}.pt"


def manifest_file(root: Path, step: int, rank: int) -> Path:
    return step_dir(root, step) / f"rank-{rank:04d}.json"


def save_atomic(obj, path: Path, root: Optional[Path] = None) -> None:
    """torch.save to a new temporary file, fsync, then rename onto ``path``
    (:func:`oresearcher.files.write_atomic`: never through a link)."""
    write_atomic(path, lambda f: torch.save(obj, f), root=root)


def save_checkpoint(root: Path, step: int, rank: int, world_size: int, state: dict,
                    run: Optional[dict] = None) -> Path:
    """This rank's file of ``step``, then its manifest (written last: it makes the step held).
    ``run``: {"run_id", "scenario"} of the run (its run.json), recorded in the manifest."""
    path = rank_file(root, step, rank)
    try:
        save_atomic(state, path, root=root)
        manifest = {"step": int(step), "rank": int(rank), "world_size": int(world_size),
                    **({"run_id": run["run_id"], "scenario_sha256": run["scenario"]} if run else {}),
                    "files": {path.name: {"bytes": path.stat().st_size, "sha256": sha256_file(path)}}}
        write_atomic(manifest_file(root, step, rank), json.dumps(manifest).encode(), root=root)
    except (OSError, RuntimeError) as e:
        why = write_failure(e, Path(root))
        if why is None:
            raise
        raise UserError(f"{path.parent}: cannot write checkpoint step {step}: {why}; the checkpoints before "
                        f"it are intact (resume with --resume {root})") from None
    return path


def write_failure(e: BaseException, where: Path) -> Optional[str]:
    """A failed write as a phrase (a full disk, a quota, a read-only file system), or None
    when ``e`` is not about writing (a bug, which keeps its traceback)."""
    import errno
    import shutil

    if isinstance(e, OSError):
        if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
            return "the disk is full (no space left on the device)"
        return e.strerror or str(e)[:160]
    if "write" not in str(e).lower():
        return None
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        free = None
    full = " (the disk is full)" if free is not None and free < (1 << 20) else ""
    return f"the write failed{full}: {str(e).splitlines()[0][:120]}"


def run_identity(manifest: Optional[dict]) -> Optional[dict]:
    """{"run_id", "scenario", "scenarios"} from a run manifest (backends/run/rundir.py): what
    checkpoints are saved with and checked against; None without a manifest."""
    if not manifest:
        return None
    return {"run_id": manifest["run_id"], "scenario": manifest["scenarios"][-1],
            "scenarios": list(manifest["scenarios"])}


def _stranger(manifest: dict, run: Optional[dict]) -> Optional[str]:
    if run is None:
        return None
    if manifest.get("run_id") != run["run_id"]:
        return f"it belongs to another run (run id {str(manifest.get('run_id'))[:12]}, this run is {run['run_id'][:12]})"
    if manifest.get("scenario_sha256") not in run["scenarios"]:
        return "it was saved under a scenario this run never trained"
    return None


def invalid(root: Path, step: int, rank: int, run: Optional[dict] = None) -> Optional[str]:
    """Why ``rank``'s checkpoint of ``step`` cannot be loaded, or None when it is valid.
    ``run`` (:func:`run_identity`): the checkpoint must name this run and one of its scenarios."""
    mpath, path = manifest_file(root, step, rank), rank_file(root, step, rank)
    try:
        manifest = json.loads(mpath.read_text())
        entry = manifest["files"][path.name]
        size, digest = int(entry["bytes"]), str(entry["sha256"])
        if manifest["step"] != step or manifest["rank"] != rank:
            return "its manifest names another step or rank"
        stranger = _stranger(manifest, run)
        if stranger:
            return stranger
    except FileNotFoundError:
        return "no manifest (the save did not finish)"
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return "its manifest is unreadable"
    if not path.is_file():
        return f"{path.name} is missing"
    if path.stat().st_size != size:
        return f"{path.name} has {path.stat().st_size} bytes, its manifest says {size}"
    if sha256_file(path) != digest:
        return f"{path.name} fails its checksum"
    try:  # intact bytes can still be no checkpoint of ours (a crafted file with a matching manifest)
        torch.load(path, map_location="cpu", weights_only=True, mmap=True)  # mmap: tensors are not read
    except Exception as e:  # noqa: BLE001 -- whatever torch.load makes of the file
        return f"{path.name} cannot be loaded: {load_error(e)}"
    return None


def load_error(e: BaseException) -> str:
    """What was wrong with a file ``torch.load(weights_only=True)`` refused, in a phrase.
    torch's own text advises turning weights_only off, which is exactly what a
    checkpoint from elsewhere must never get; the reason it names is kept."""
    text = str(e)
    if "weights only" in text.lower() or "weights_only" in text:
        why = next((line.strip() for line in text.splitlines()
                    if line.strip() and "weights_only" not in line and "weights only" not in line.lower()
                    and "documentation" not in line), "")
        return f"it holds more than tensors ({why[:120].rstrip('.')}); checkpoints load as tensors only, never as code"
    first = text.strip().splitlines()[0] if text.strip() else type(e).__name__
    return first.split(". ")[0][:160].rstrip(".")


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def steps_held(root: Path, rank: int) -> list[int]:
    """Checkpoint steps for which ``rank``'s manifest exists (its save finished), oldest first."""
    base = Path(root) / "checkpoints"
    if not base.is_dir():
        return []
    out = []
    for d in base.iterdir():
        m = _STEP_DIR.match(d.name)
        if m and (d / f"rank-{rank:04d}.json").is_file():
            out.append(int(m.group(1)))
    return sorted(out)


def all_steps(root: Path) -> list[int]:
    """Every step folder under ``root``'s checkpoints, whatever it holds, newest first."""
    base = Path(root) / "checkpoints"
    found = [int(m.group(1)) for d in base.iterdir() if (m := _STEP_DIR.match(d.name))] if base.is_dir() else []
    return sorted(found, reverse=True)


def newest_complete(root: Path, world_size: int) -> Optional[int]:
    """The newest step every rank holds (manifests only; no checksums)."""
    return latest_common(steps_held(root, r) for r in range(world_size))


def valid_steps(root: Path, rank: int, run: Optional[dict] = None) -> list[int]:
    """Steps ``rank`` holds a valid file for, oldest first; each invalid one is logged in one line."""
    out = []
    for step in steps_held(root, rank):
        why = invalid(root, step, rank, run)
        if why is None:
            out.append(step)
        else:
            log.warning("checkpoint step %d of rank %d skipped: %s", step, rank, why)
    return out


def resume_step(root: Path, world_size: int, wanted: Optional[int] = None, run: Optional[dict] = None) -> int:
    """The step to resume from: ``wanted``, or the newest step whose files are valid on
    every rank; newer steps that are not are skipped, one line each. UserError (one line)
    when there is none, or when ``wanted`` is not complete and valid."""
    skipped = []
    for step in [wanted] if wanted is not None else all_steps(root):
        why = next(((r, w) for r in range(world_size) if (w := invalid(root, step, r, run))), None)
        if why is None:
            for note in skipped:
                log.warning("checkpoint %s", note)
            return step
        if wanted is not None:
            raise UserError(f"--resume-step {step}: rank {why[0]}'s checkpoint cannot be used: {why[1]} "
                            f"(complete steps: {_listed(root, world_size)})")
        skipped.append(f"step {step} skipped: rank {why[0]}: {why[1]}")
    more = f" ({skipped[0]}{f'; {len(skipped) - 1} more skipped' if len(skipped) > 1 else ''})" if skipped else ""
    raise UserError(f"{root}: no checkpoint that all {world_size} ranks completed intact; nothing to resume{more}")


def _listed(root: Path, world_size: int) -> str:
    held = sorted(set.intersection(*(set(steps_held(root, r)) for r in range(world_size))))
    return ", ".join(map(str, held[-5:])) or "none"


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


def agent_state(step: int, world_size: int, learner, states: dict, meta: Optional[dict] = None) -> dict:
    """Everything one rank saves after ``step``; ``meta``: plain values the run notes
    (the scenario's lr, so a resume can tell that --override changed it)."""
    return {
        "step": int(step),
        "meta": dict(meta or {}),
        "world_size": int(world_size),
        "learner": learner.state_dict() if learner.restorable else {},
        "states": {name: obj.state_dict() for name, obj in states.items()},
        "rng": rng_state(),
    }


def restore_agent(ckpt: dict, learner, states: dict, keep_lr: bool = False) -> None:
    """Load ``ckpt`` (from :func:`agent_state`) into the learner and State objects.

    ``keep_lr``: keep the learning rates the fresh learner was built with (a resume that
    overrides training.lr) instead of the saved optimizer's."""
    groups = learner.optimizer.param_groups if learner.optimizer is not None else []
    fresh = [g.get("lr") for g in groups]
    if ckpt.get("learner") and learner.restorable:
        learner.load_state_dict(ckpt["learner"])
    if keep_lr:
        for g, lr in zip(learner.optimizer.param_groups if groups else [], fresh):  # loading replaced the groups
            g["lr"] = lr
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
                 keep: int = 2, store=None, prefix: str = "oresearcher/", meta: Optional[dict] = None,
                 run: Optional[dict] = None):
        self.root, self.rank, self.world_size, self.meta = Path(root), rank, world_size, dict(meta or {})
        self.run = run
        self.every, self.total_steps, self.keep = int(every), int(total_steps), int(keep)
        self.store, self.prefix = store, prefix

    def due(self, step: int, since: Optional[int] = None) -> bool:
        """Is a checkpoint due at resume boundary ``step``? ``since``: the previous
        boundary (default ``step - 1``); a step due in between is saved at this one."""
        if self.every <= 0:
            return False
        prev = step - 1 if since is None else since
        return (step + 1) // self.every > (prev + 1) // self.every or step + 1 == self.total_steps

    def save(self, step: int, learner, states: dict, record: Optional[dict] = None) -> Path:
        """``record``: what the report is written from should the run stop before it is
        (the final step's checkpoint carries the rank's timeline: backends/run/worker.py)."""
        meta = {**self.meta, "record": record} if record is not None else self.meta
        path = save_checkpoint(self.root, step, self.rank, self.world_size,
                               agent_state(step, self.world_size, learner, states, meta), self.run)
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
                manifest_file(self.root, step, self.rank).unlink(missing_ok=True)  # no longer held, then gone
                rank_file(self.root, step, self.rank).unlink(missing_ok=True)
                try:
                    step_dir(self.root, step).rmdir()  # the last rank out removes the folder
                except OSError:
                    pass
