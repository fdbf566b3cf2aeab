"""Starting ranks: join a torchrun world from the environment, or spawn local ranks.

Under ``torchrun`` (torch.distributed.run) every worker finds RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR and MASTER_PORT in its environment, and the elastic agent hosts the
rendezvous store (TORCHELASTIC_USE_AGENT_STORE=True). Without them,
:func:`launch_local` plays torchrun's part on one machine: it hosts the store itself (a
TCPStore on 127.0.0.1 bound to a port the kernel picks, so concurrent runs never race
for a port), starts one subprocess per rank with the same environment variables, and
watches them. Hosting the store outside the ranks means the store survives any rank, so
when one dies the launcher can post which one (its exit code or signal) for the others
to read (:mod:`oresearcher.backends.run.monitor`) and stop the rest after the timeout.

Every spawned rank gets OMP_NUM_THREADS (1 unless asked otherwise): several ranks share
the cores, and oversubscribed intra-op threads only slow them down.
"""
from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Mapping, Optional, Sequence

import torch.distributed as dist

from .monitor import post_failure, read_failure, user_error

log = logging.getLogger(__name__)

EXIT_PEER_LOST = 3  # a rank that stopped because another rank was lost
LOCALHOST = "127.0.0.1"


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the world, as torchrun (or our launcher) describes it.

    store_host: "launcher" (our launch_local), "agent" (torchrun's elastic agent) or
    "rank0" (plain environment variables: rank 0 hosts the store).
    """

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    store_host: str = "rank0"
    restart: int = 0

    @property
    def store_owner(self) -> str:
        return {"launcher": "the launcher", "agent": "the torchrun agent"}.get(self.store_host, "rank 0")

    @property
    def prefix(self) -> str:
        """Store key prefix; a torchrun restart gets fresh keys in the agent's store."""
        return f"oresearcher/{self.restart}/"


def from_environ(env: Mapping[str, str] = os.environ) -> Optional[DistEnv]:
    """The DistEnv of this process, or None when no launcher set RANK and WORLD_SIZE."""
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if not env.get(k)]
    if missing:
        raise ValueError(f"RANK and WORLD_SIZE are set but {' and '.join(missing)} are not")
    try:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        local_rank = int(env.get("LOCAL_RANK", rank))
        port, restart = int(env["MASTER_PORT"]), int(env.get("TORCHELASTIC_RESTART_COUNT", 0))
    except ValueError as e:
        raise ValueError(f"bad distributed environment variable: {e}") from None
    if not 0 <= rank < world:
        raise ValueError(f"RANK={rank} is outside WORLD_SIZE={world}")
    if env.get("ORESEARCHER_STORE") == "launcher":
        host = "launcher"
    elif env.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        host = "agent"
    else:
        host = "rank0"
    return DistEnv(rank, world, local_rank, env["MASTER_ADDR"], port, host, restart)


def connect_store(denv: DistEnv, timeout_s: float):
    """A client of the run's TCPStore (rank 0 hosts it when nobody else does)."""
    is_master = denv.store_host == "rank0" and denv.rank == 0
    return dist.TCPStore(denv.master_addr, denv.master_port, denv.world_size, is_master=is_master,
                         timeout=timedelta(seconds=timeout_s), wait_for_workers=False)


def describe_exit(rank: int, code: int) -> str:
    if code < 0:
        try:
            how = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"killed by signal {-code}"
    else:
        how = f"exit code {code}"
    return f"rank {rank} lost ({how})"


@dataclass
class LaunchResult:
    exit_codes: list
    failure: Optional[str] = None  # the failure notice, when a rank was lost
    pids: list = field(default_factory=list)
    user_error: bool = False  # the notice is a rank's user error (divergence...), not a lost rank

    @property
    def ok(self) -> bool:
        return all(c == 0 for c in self.exit_codes)


def rank_env(rank: int, world_size: int, port: int, threads: int, base: Mapping[str, str]) -> dict:
    env = dict(base)
    env.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
               LOCAL_WORLD_SIZE=str(world_size), GROUP_RANK="0", MASTER_ADDR=LOCALHOST,
               MASTER_PORT=str(port), ORESEARCHER_STORE="launcher", OMP_NUM_THREADS=str(threads))
    env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    return env


def launch_local(cmd: Sequence[str], world_size: int, *, timeout_s: float, threads: int = 1,
                 env: Optional[Mapping[str, str]] = None, poll_s: float = 0.05) -> LaunchResult:
    """Run ``cmd`` once per rank on this machine and wait for all of them.

    When a rank exits abnormally, the others are told which (the failure notice) and
    are given ``timeout_s`` seconds to stop on their own before they are terminated.
    """
    store = dist.TCPStore(LOCALHOST, 0, world_size, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=timeout_s))
    prefix = DistEnv(0, world_size, 0, LOCALHOST, store.port, "launcher").prefix
    base = dict(os.environ if env is None else env)
    procs = [subprocess.Popen(list(cmd), env=rank_env(r, world_size, store.port, threads, base),
                              start_new_session=True, preexec_fn=_die_with_parent(os.getpid()))
             for r in range(world_size)]
    log.info("launched %d ranks (pids %s), store on %s:%d", world_size, [p.pid for p in procs], LOCALHOST, store.port)
    try:
        codes, failure = _watch(procs, store, prefix, timeout_s, poll_s)
    except BaseException:
        _terminate(procs)
        raise
    by_user = failure is not None and user_error(store, prefix) == failure
    return LaunchResult(codes, failure, [p.pid for p in procs], by_user)


class Signalled(BaseException):
    """SIGINT, SIGTERM or SIGHUP reached the launcher (raised from the signal handler)."""


@dataclass
class Caught:
    signum: int = 0

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""


@contextlib.contextmanager
def signals_raise():
    """Within the block, SIGINT, SIGTERM and SIGHUP (the terminal closed, an ssh connection
    dropped) raise :class:`Signalled` (once: a second signal while the ranks are being
    stopped is ignored); yields what was caught."""
    caught = Caught()
    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def handler(signum, frame):
        for s in sigs:
            signal.signal(s, signal.SIG_IGN)
        caught.signum = signum
        raise Signalled(signum)

    old = {s: signal.signal(s, handler) for s in sigs}
    try:
        yield caught
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _die_with_parent(parent: int):
    """preexec_fn: the rank gets SIGTERM when the launcher dies, even by SIGKILL (Linux
    prctl PR_SET_PDEATHSIG), instead of living on against a store that is gone. Ranks run
    in their own process group (setsid), so a Ctrl-C in the terminal reaches only the
    launcher, which stops them in order."""
    if not sys.platform.startswith("linux"):
        return None

    def preexec():
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
        except (OSError, AttributeError):
            return
        if os.getppid() != parent:  # the launcher died before prctl took effect
            os._exit(EXIT_PEER_LOST)
    return preexec


def _watch(procs, store, prefix: str, timeout_s: float, poll_s: float):
    deadline = None
    failure = None
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            break
        if failure is None:
            failed = [r for r, c in enumerate(codes) if c not in (None, 0, EXIT_PEER_LOST)]
            if failed:
                failure = post_failure(store, prefix, describe_exit(failed[0], codes[failed[0]]))
                # a rank's own user error is printed once at the end; a lost rank is news now
                (log.info if user_error(store, prefix) == failure else log.error)("%s; stopping the other ranks",
                                                                                 failure)
            else:
                failure = read_failure(store, prefix)  # a rank's monitor found it first
            if failure is not None:
                deadline = time.monotonic() + timeout_s
        if deadline is not None and time.monotonic() > deadline:
            log.error("ranks still running %.0f s after the failure; terminating them", timeout_s)
            _terminate(procs)
        time.sleep(poll_s)
    codes = [p.returncode for p in procs]
    if failure is None and any(c != 0 for c in codes):
        failed = [r for r, c in enumerate(codes) if c not in (0, EXIT_PEER_LOST)]
        failure = read_failure(store, prefix) or (describe_exit(failed[0], codes[failed[0]]) if failed else None)
    return codes, failure


def _terminate(procs, grace_s: float = 5.0) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGCONT)  # a frozen (stopped) rank takes its SIGTERM now, not after the grace
    end = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
