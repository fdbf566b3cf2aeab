"""Sharded checkpoints through torch.distributed.checkpoint (DCP), for fsdp runs.

An fsdp rank holds 1/S of the model and optimizer as DTensor shards, so they are not
saved in the rank's own file (:mod:`oresearcher.backends.checkpoint.per_rank`) but, collectively,
in one DCP folder per step beside those files::

    checkpoints/step-00000099/dcp/.metadata      written last, by the coordinator
    checkpoints/step-00000099/dcp/__0_0.distcp   each rank's shards
    checkpoints/step-00000099/rank-0000.pt       the rest of rank 0's agent (data stream,
                                                 random generators, program state)

The DCP folder is written before the ranks' own files and manifests, so a step every
rank holds (a manifest each) has a complete DCP folder. Loading goes through
``torch.distributed.checkpoint.state_dict`` (``get_state_dict`` / ``set_state_dict``):
DCP reads each rank's slice of every tensor from whatever shards were saved, so a run
resumes at another world size (4 ranks saved, 2 load) with the same model and
optimizer state. Every call here is collective: all ranks of the run call it together.
"""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

log = logging.getLogger(__name__)

FOLDER = "dcp"


def folder(step_dir: Path, agent=None) -> Path:
    """``step_dir/dcp``, or ``step_dir/dcp-agent<a>`` for one of several sharded agents."""
    return Path(step_dir) / (FOLDER if agent is None else f"{FOLDER}-agent{agent}")


def save(step_dir: Path, model, optimizer, agent=None, group=None) -> Path:
    """Save ``model`` and ``optimizer`` (sharded) under :func:`folder`; collective over
    ``group`` (default: the world)."""
    path = folder(step_dir, agent)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path), process_group=group)
    return path


def load(step_dir: Path, model, optimizer, keep_lr: bool = False, agent=None, group=None) -> None:
    """Load :func:`folder` into ``model`` and ``optimizer``, resharded to this run's
    ranks; ``keep_lr``: keep the learning rates the optimizer has now. Collective."""
    path = folder(step_dir, agent)
    if not (path / ".metadata").is_file():
        from oresearcher.errors import UserError

        raise UserError(f"{path}: no DCP checkpoint there (sharded agents resume with the agents they saved)")
    fresh = [g["lr"] for g in optimizer.param_groups]
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(path), process_group=group)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    if keep_lr:
        for g, lr in zip(optimizer.param_groups, fresh):
            g["lr"] = lr


def prune(step_dir: Path) -> None:
    """Remove the DCP folders of steps older than ``step_dir``'s that no rank holds any
    more (their manifests were pruned); call on one rank. Steps are saved one at a time
    and collectively, so an older folder without manifests is never one being written."""
    from .per_rank import _STEP_DIR

    step_dir = Path(step_dir)
    base, m = step_dir.parent, _STEP_DIR.match(step_dir.name)
    if m is None or not base.is_dir():
        return
    before = int(m.group(1))
    for d in base.iterdir():
        m = _STEP_DIR.match(d.name)
        if m and int(m.group(1)) < before and not any(d.glob("rank-*.json")):
            for sub in d.glob(FOLDER + "*"):
                shutil.rmtree(sub, ignore_errors=True)
            try:
                d.rmdir()
            except OSError:
                pass
            log.debug("pruned %s", d / FOLDER)


def is_rank0() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0
