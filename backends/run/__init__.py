"""``python -m oresearcher.run``: :mod:`.command` (launch or join, the outcome) over
:mod:`.flags` (flags, loading the scenario once); :mod:`.launcher` (torchrun's part on one
machine) and :mod:`.rundir` (the run directory's lock and manifest); one rank's runtime:
:mod:`.worker` (setup, train, report), :mod:`.interpreter` (ops on torch.distributed, timed),
:mod:`.monitor` (heartbeats, the lost rank), :mod:`.telemetry` (TensorBoard, profiler,
progress) and :mod:`.rank_report` (rank 0's report)."""
