"""Hypothesis profiles: CI (the CI environment variable set) runs derandomised, so a run is
repeatable and cannot flip on a fresh example; locally every run draws fresh examples.
Fuzz longer locally with HYPOTHESIS_PROFILE=fuzz (10x the examples)."""
import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev")
settings.register_profile("fuzz", max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))
