"""Helpers of the backend tests: paths and a tiny scenario file.

Child processes import the test helpers (bk_tiny, bk_programs) from this folder, so it
goes on their PYTHONPATH; OMP_NUM_THREADS=1 keeps ranks from oversubscribing the cores.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

TINY = {
    "name": "tiny",
    "seed": 3,
    "cluster": {"nodes": 1, "gpus_per_node": 4, "device": "cpu-local", "intra_node": "loopback"},
    "workload": {"task": "digits", "model": "mlp", "global_batch": 32, "dtype": "fp32", "optimizer": "sgd"},
    "agents": {"count": 2},
    "communication": {"bucket_size_MB": 0.0002, "overlap": True, "algorithm": "ring"},
    "training": {"strategy": "ddp", "steps": 12, "lr": 0.1, "local_steps": 3, "checkpoint_every": 4},
}


def write_scenario(path: Path, **sections) -> Path:
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in TINY.items()}
    for k, v in sections.items():
        data[k] = {**data[k], **v} if isinstance(v, dict) else v
    path.write_text(yaml.safe_dump(data))
    return path


def child_environment() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["OMP_NUM_THREADS"] = "1"
    return env


def child_with_rank(parent: int, rank: int) -> int:
    """The pid of the launcher ``parent``'s child rank process ``rank`` (through /proc)."""
    for task in Path(f"/proc/{parent}/task").iterdir():
        for pid in (task / "children").read_text().split():
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            if f"RANK={rank}".encode() in env:
                return int(pid)
    raise AssertionError(f"no child of {parent} has RANK={rank}")
