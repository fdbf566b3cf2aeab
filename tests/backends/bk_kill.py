"""bk_tiny's learner with a kill at a named point of the run (the corpus's deterministic
kill timings: no sleeps).

KILL_RANK: the rank that dies (SIGKILL); KILL_AT: where,

    report          rank 0 only: as it starts writing the report (after the final checkpoint)
    saved:STEP      right after the rank's checkpoint of STEP is complete (manifest written)
    saving:STEP     in the middle of writing the rank's checkpoint file of STEP
    sigint:STEP     as saving:STEP, but SIGINT (sent to the rank alone)
    full:STEP       no SIGKILL: the disk fills (ENOSPC) while the rank writes its file of STEP

Under torchrun only the first attempt dies (TORCHELASTIC_RESTART_COUNT 0).
"""
from __future__ import annotations

import errno
import os
import signal

from bk_tiny import make_learner as tiny_learner


def _die():
    os.kill(os.getpid(), signal.SIGKILL)


def make_learner(scenario, rank, *, mode="real", device="cpu"):
    learner = tiny_learner(scenario, rank, mode=mode, device=device)
    if rank != int(os.environ.get("KILL_RANK", "0")) or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return learner
    where, _, arg = os.environ.get("KILL_AT", "").partition(":")
    from oresearcher.backends.checkpoint import per_rank as checkpoint
    from oresearcher.backends.run import worker

    if where == "report":
        worker._write_report = lambda *a, **k: _die()
    elif where == "saved":
        save = checkpoint.Checkpointer.save

        def saved(self, step, *a, **k):
            path = save(self, step, *a, **k)
            if step == int(arg):
                _die()
            return path
        checkpoint.Checkpointer.save = saved
    elif where in ("saving", "sigint", "full"):
        write = checkpoint.save_atomic

        def stop():
            if where == "full":
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            if where == "sigint":
                os.kill(os.getpid(), signal.SIGINT)
            _die()

        def saving(obj, path, root=None):
            if obj.get("step") == int(arg):
                def half(f):
                    f.write(b"half a checkpoint")
                    f.flush()
                    stop()
                return checkpoint.write_atomic(path, half, root=root)
            return write(obj, path, root)
        checkpoint.save_atomic = saving
    return learner
