"""The measurements behind ``python -m oresearcher.calibrate`` (the fits are pure math in
:mod:`oresearcher.calibration`): :mod:`.measure` (collectives, compute and host costs inside
a process group), :mod:`.device` (one device alone), :mod:`.device_rates` (the roofline's
rates), :mod:`.fsdp`, :mod:`.fsdp_hooks` and :mod:`.fsdp_inrun` (the fsdp schedule's host
costs and its own step), :mod:`.memory_probe` (peak tensor memory) and
:mod:`.roofline_check` (``python -m oresearcher.backends.calibration.roofline_check``)."""
