"""Sweeps: one simulation per configuration, one after another or on a process pool.

    python -m oresearcher.sim scenarios/8xA100.yaml --sweep communication.bucket_size_MB=5,25,100 --jobs 2

Each configuration is an independent, deterministic simulation (the same scenario gives
the same report, byte for byte), so a pool of ``jobs`` worker processes returns exactly
the reports a serial sweep computes; they come back in the order given whichever worker
finishes first. Workers are forked: they start with the parent's imports and caches.
"""
from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

from oresearcher.errors import UserError
from oresearcher.scenario import load_scenario


def _one(path: str, overrides: list, mode: str | None, exact: bool = False) -> dict:
    from .simulate import simulate

    report, _ = simulate(load_scenario(path, overrides), mode=mode, keep_spans=0, exact=exact)
    return report


def run_pool(path: str, configs: list[list[str]], mode: str | None, jobs: int, exact: bool = False) -> list[dict]:
    """Reports of ``configs`` (override lists of ``path``), in order, on ``jobs`` workers."""
    if jobs < 1:
        raise UserError(f"--jobs {jobs}: expected a number of worker processes >= 1")
    if jobs == 1 or len(configs) <= 1:
        return [_one(path, c, mode, exact) for c in configs]
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    # one thread per worker: the workers are the parallelism (torch would take every core each)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with ProcessPoolExecutor(max_workers=min(jobs, len(configs)), mp_context=ctx) as pool:
        n = len(configs)
        return list(pool.map(_one, [path] * n, configs, [mode] * n, [exact] * n))
