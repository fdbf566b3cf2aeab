"""The real backend: the agent programs the simulator interprets, run on torch.distributed.

- :mod:`.interpreter`: each op becomes a torch.distributed call, timed into a Timeline.
- :mod:`.launcher`: join a torchrun world, or start local ranks around our own store.
- :mod:`.monitor`: heartbeats; which rank was lost.
- :mod:`.worker`: one rank of ``python -m oresearcher.run`` (setup, run, report).
- :mod:`.checkpoint`: atomic per-rank checkpoints and resuming.
- :mod:`.telemetry`: TensorBoard scalars, torch.profiler traces, the progress bar.
- :mod:`.calibration`: the measurements behind ``python -m oresearcher.calibrate``.

Nothing outside this package calls torch.distributed.
"""
