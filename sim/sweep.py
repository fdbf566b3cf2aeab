"""Sweeps: one simulation per configuration, one after another or on a process pool.

    python -m oresearcher.sim scenarios/8xA100.yaml --sweep communication.bucket_size_MB=5,25,100 --jobs 2
    python -m oresearcher.sim scenarios/8xA100.yaml --sweep communication.bucket_size_MB=5,25,100 \
        --sweep-backend ray [--ray-address ray://head:10001]

Each configuration is an independent, deterministic simulation (the same scenario gives
the same report, byte for byte), so a pool of ``jobs`` worker processes returns exactly
the reports a serial sweep computes; they come back in the order given whichever worker
finishes first. Workers are forked: they start with the parent's imports and caches.
With ``--sweep-backend ray`` the configurations are Ray tasks (``pip install
'oresearcher[ray]'``) on the cluster at ``--ray-address`` (``ray.init(address=...)``), or
on a local Ray instance started for the sweep when no address is given; the workers
read the scenario file at its path (the same checkout, or a shared filesystem).
"""
from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

from oresearcher.errors import UserError
from oresearcher.scenario import load_scenario


def _one(path: str, overrides: list, mode: str | None, exact: bool = False) -> dict:
    from .convergence import attach
    from .simulate import simulate

    scenario = load_scenario(path, overrides)
    report, _ = simulate(scenario, mode=mode, keep_spans=0, exact=exact)
    return attach(scenario, report)


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


def run_ray(path: str, configs: list[list[str]], mode: str | None, address: str | None = None,
            exact: bool = False) -> list[dict]:
    """Reports of ``configs`` as Ray tasks, in order; UserError when Ray is missing."""
    try:
        import ray
    except ImportError:
        raise UserError("--sweep-backend ray needs Ray: pip install 'oresearcher[ray]'") from None
    if address and address not in ("auto", "local"):
        _reachable(address)
    started = not ray.is_initialized()
    if started:
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        except (ConnectionError, RuntimeError, ValueError) as e:  # no cluster there: one line
            raise UserError(f"--ray-address {address}: {str(e).splitlines()[0][:200]}") from None
    try:
        task = ray.remote(_one)
        return ray.get([task.remote(path, c, mode, exact) for c in configs])
    finally:
        if started:
            ray.shutdown()


def _reachable(address: str, timeout_s: float = 5.0) -> None:
    """UserError unless something listens at ``address`` (``[ray://]host:port``): Ray
    itself retries a dead address for minutes before it gives up."""
    import socket

    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"--ray-address {address[:100]!r}: expected [ray://]host:port, auto or local")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise UserError(f"--ray-address {address[:100]}: nothing answers there ({e.strerror or e})") from None
