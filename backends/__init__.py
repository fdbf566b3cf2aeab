"""The real backend: the agent programs the simulator interprets, run on torch.distributed.

Four rooms, each importing only the rooms listed before it:

- :mod:`.checkpoint`: what a rank saves and resumes from (per-rank files; DCP for fsdp).
- :mod:`.fsdp`: torch's FSDP2 as a learner (its collectives timed, its gradients guarded).
- :mod:`.run`: ``python -m oresearcher.run``: flags and scenario, the launcher, one rank's
  runtime (interpreter, monitor, telemetry, its report), the run directory.
- :mod:`.calibration`: the measurements behind ``python -m oresearcher.calibrate``
  (collectives, compute, device rates, fsdp host costs, peak memory, the roofline check).

Nothing outside this package calls torch.distributed.
"""
