"""Sweeps: one simulation per configuration, one after another or on a process pool.

    python -m oresearcher.sim scenarios/8xA100.yaml --sweep communication.bucket_size_MB=5,25,100 --jobs 2
    python -m oresearcher.sim scenarios/8xA100.yaml --sweep communication.bucket_size_MB=5,25,100 \
        --sweep-backend ray [--ray-address ray://head:10001]

Each configuration is an independent, deterministic simulation (the same scenario gives
the same report, byte for byte), so a pool of ``jobs`` worker processes returns exactly
the reports a serial sweep computes; they come back in the order given whichever worker
finishes first. Workers are forked: they start with the parent's imports and caches.

Workers live and die with the sweep. They stay in the parent's process group (fork keeps
it), ignore SIGINT (a Ctrl-C reaches the whole group; the parent decides), and ask the
kernel for SIGTERM when the parent dies (Linux ``PR_SET_PDEATHSIG``), so even a parent
killed with SIGKILL leaves no worker behind. SIGINT, SIGTERM or SIGHUP to the parent
ends every worker at once, queued configurations unstarted, and exits 128 + the signal
with one line.
With ``--sweep-backend ray`` the configurations are Ray tasks (``pip install
'oresearcher[ray]'``) on the cluster at ``--ray-address`` (``ray.init(address=...)``), or
on a local Ray instance started for the sweep when no address is given; the workers
read the scenario file at its path (the same checkout, or a shared filesystem).
"""
from __future__ import annotations

import multiprocessing
import os
import signal
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
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(configs)), mp_context=ctx, initializer=_worker_init,
                               initargs=(os.getpid(),))
    try:
        with _signals_raise():
            futures = [pool.submit(_one, path, c, mode, exact) for c in configs]
            reports = [f.result() for f in futures]
    except BaseException:
        end_workers(pool)  # a failure, Ctrl-C or SIGTERM: no worker runs on, nothing queued starts
        raise
    pool.shutdown(wait=True)
    return reports


def _worker_init(parent: int) -> None:
    """In each worker: SIGINT is the parent's to act on; die when the parent dies."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the parent's handlers still end the workers
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def end_workers(pool: ProcessPoolExecutor, grace_s: float = 2.0) -> None:
    """Terminate every worker of ``pool`` (SIGTERM, then SIGKILL after ``grace_s``) and
    drop the queued configurations."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(grace_s)
        if p.is_alive():
            p.kill()
            p.join()
    pool.shutdown(wait=False, cancel_futures=True)


class _signals_raise:
    """While a pool runs: SIGTERM and SIGHUP to the parent raise SystemExit(128 + signal)
    (after one line on stderr) where they would kill it outright and orphan the workers;
    SIGINT raises KeyboardInterrupt as always. Main thread only (where Python runs
    handlers); elsewhere nothing changes."""

    SIGNALS = ("SIGTERM", "SIGHUP")

    def __enter__(self):
        import threading

        self.old = {}
        if threading.current_thread() is threading.main_thread():
            for name in self.SIGNALS:
                sig = getattr(signal, name, None)
                if sig is not None:
                    self.old[sig] = signal.signal(sig, _stop)
        return self

    def __exit__(self, *exc):
        for sig, handler in self.old.items():
            signal.signal(sig, handler)
        return False


def _stop(signum, frame):
    import sys

    print(f"stopped by {signal.Signals(signum).name}: the sweep's workers are ended, no report written",
          file=sys.stderr, flush=True)
    raise SystemExit(128 + signum)


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
