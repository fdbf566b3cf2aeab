"""A `--sweep ... --jobs 2` sweep's workers live and die with it: in the parent's process
group, ended at once by SIGINT or SIGTERM to the parent alone (queued configurations
unstarted, exit 128 + signal, one line), and gone when the parent is SIGKILLed."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# long enough that the workers are still busy when the signal comes (each value ~seconds)
SWEEP = ["-m", "oresearcher.sim", str(ROOT / "scenarios/cpu-tiny.yaml"), "--set", "training.steps=400",
         "--sweep", "communication.bucket_size_MB=1,2,3,4,5,6,7,8", "--jobs", "2"]


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not Path("/proc").is_dir() or sys.platform != "linux", reason="Linux process table")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=lambda s: s.name)
def test_workers_end_with_the_parent(tmp_path, sig):
    p = subprocess.Popen([sys.executable, *SWEEP, "--out", str(tmp_path)], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, start_new_session=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        kids = []
        for _ in range(600):  # the workers start once every value has been checked
            time.sleep(0.1)
            kids = _children(p.pid)
            if len(kids) >= 2 or p.poll() is not None:
                break
        assert len(kids) >= 2, p.communicate()[1]
        assert all(os.getpgid(k) == os.getpgid(p.pid) for k in kids)  # the parent's process group
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    for _ in range(50):  # SIGKILL: the kernel's parent-death signal reaches the workers
        if not any(_alive(k) for k in kids):
            break
        time.sleep(0.1)
    assert not any(_alive(k) for k in kids)
    assert not (tmp_path / "sweep.json").exists()
    if sig != signal.SIGKILL:
        assert p.returncode == 128 + sig
        lines = err.strip().splitlines()
        assert len(lines) == 1 and ("interrupted" in lines[0] or "stopped by SIGTERM" in lines[0]), lines
