"""What ``python -m oresearcher.calibrate`` computes from its measurements: the typed
measurement record (:mod:`.record`, built by ``backends/calibration/measure.py``), the fabric
fit, jitter statistics, and the profile documents it writes (the CLI stays in
:mod:`oresearcher.calibrate`)."""
