"""Run telemetry: TensorBoard scalars, torch.profiler traces and a progress bar.

- Each rank writes its own TensorBoard run ``<out>/tensorboard/agent<rank>`` so agents
  appear side by side: every numeric step metric (loss, accuracy, reward...) under
  ``agent/``, the step's communication overhead (exposed communication / step time),
  wire bytes and step time under ``comm/`` and ``time/``; the cooperative program's
  role code and reward arrive as numeric metrics (``agent/role``, ``agent/reward``), a
  role given as a word also as ``agent/role_id`` (explorer 0, optimizer 1, validator 2),
  and every word-valued metric (a role switch and its reason) as text when it changes.
- ``--profile`` records a few steps with torch.profiler and writes them with
  ``tensorboard_trace_handler`` to ``<out>/tensorboard/profile``; TensorBoard's PyTorch
  Profiler plugin (torch-tb-profiler) opens them. Every op is a ``record_function``
  range named after the op.
- Rank 0 shows a rich progress bar when its stderr is a terminal, otherwise a line
  every few seconds with steps/s and ETA. ``--profile`` keeps kineto's raw lines off stderr.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import Optional

import torch

log = logging.getLogger(__name__)

ROLE_IDS = {"explorer": 0, "optimizer": 1, "validator": 2}


def step_scalars(metrics: dict, stats: dict) -> dict:
    """The scalars logged for one step: numeric metrics plus communication figures."""
    out = {}
    for k, v in metrics.items():
        if isinstance(v, bool):
            out[f"agent/{k}"] = float(v)
        elif isinstance(v, (int, float)):
            out[f"agent/{k}"] = float(v)
    if isinstance(metrics.get("role"), str) and metrics["role"] in ROLE_IDS:
        out["agent/role_id"] = float(ROLE_IDS[metrics["role"]])
    dur = stats.get("duration_s", 0.0)
    out["time/step_s"] = dur
    out["time/compute_s"] = stats.get("compute_s", 0.0)
    out["comm/exposed_s"] = stats.get("exposed_comm_s", 0.0)
    out["comm/overhead"] = stats.get("exposed_comm_s", 0.0) / dur if dur > 0 else 0.0
    out["comm/wire_bytes"] = float(stats.get("wire_bytes", 0))
    return out


class TensorBoard:
    """One SummaryWriter per rank."""

    def __init__(self, out_dir: Path, rank: int):
        from torch.utils.tensorboard import SummaryWriter  # imported late: it is slow to import

        self.writer = SummaryWriter(log_dir=str(Path(out_dir) / "tensorboard" / f"agent{rank}"))
        self._text: dict = {}

    def on_step(self, step: int, metrics: dict, stats: dict) -> None:
        for tag, value in step_scalars(metrics, stats).items():
            self.writer.add_scalar(tag, value, step)
        for key, value in metrics.items():  # words (a role, the reason of a role switch): when they change
            if isinstance(value, str) and self._text.get(key) != value:
                self.writer.add_text(f"agent/{key}", value, step)
                self._text[key] = value

    def close(self) -> None:
        self.writer.close()


def make_profiler(out_dir: Path, rank: int, device: torch.device, *, wait: int = 1, warmup: int = 1, active: int = 3):
    """A torch.profiler recording ``active`` steps after ``wait + warmup`` (call .step() per step)."""
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    trace_dir = Path(out_dir) / "tensorboard" / "profile"
    return QuietProfiler(profile(
        activities=activities,
        schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
        on_trace_ready=tensorboard_trace_handler(str(trace_dir), worker_name=f"rank{rank}"),
        record_shapes=True,
    ))


@contextlib.contextmanager
def quiet_stderr():
    """Point file descriptor 2 at /dev/null for the block. Kineto's C++ side writes
    ``USDT: ... profiler_start`` / ``profiler_stop`` lines straight to it, past Python's
    logging, every time a recording starts or stops."""
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


class QuietProfiler:
    """A torch.profiler whose start, step and stop (where recording starts and stops) are
    silenced with :func:`quiet_stderr`; errors still raise."""

    def __init__(self, prof):
        self.prof = prof

    def start(self) -> None:
        with quiet_stderr():
            self.prof.start()

    def step(self) -> None:
        with quiet_stderr():
            self.prof.step()

    def stop(self) -> None:
        with quiet_stderr():
            self.prof.stop()


class Progress:
    """Progress over training steps on rank 0: a rich bar on a terminal, otherwise a line
    every few seconds with steps/s and ETA (:class:`oresearcher.reporting.progress.ProgressLines`);
    ``enabled=False``: nothing."""

    def __init__(self, total: int, start: int = 0, enabled: Optional[bool] = None):
        self._bar = self._lines = None
        if enabled is False:
            return
        if not sys.stderr.isatty():
            from oresearcher.reporting.progress import ProgressLines

            self._lines = ProgressLines(total, "training steps", start=start)
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, TimeRemainingColumn

        self._bar = Bar(TextColumn("training"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                        TextColumn("{task.fields[loss]}"), console=Console(stderr=True, markup=False), transient=False)
        self._task = self._bar.add_task("train", total=total, completed=start, loss="")
        self._bar.start()

    def on_step(self, step: int, metrics: dict, stats: dict) -> None:
        loss = metrics.get("loss")
        loss = f"loss {loss:.4g}" if isinstance(loss, (int, float)) else ""
        if self._lines is not None:
            self._lines.update(step + 1, f", {loss}" if loss else "")
        if self._bar is not None:
            self._bar.update(self._task, completed=step + 1, loss=loss)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
