"""Hypothesis profiles: CI (the CI environment variable set) runs derandomised, so a run is
repeatable and cannot flip on a fresh example; locally every run draws fresh examples.
Fuzz longer locally with HYPOTHESIS_PROFILE=fuzz (10x the examples).

Every test runs at the repository root, wherever pytest was launched from (``cd /tmp &&
python -m pytest /path/to/checkout/tests``): a relative path in a test (``scenarios/x.yaml``,
``benchmarks/x.py``) names a file of this repository. A test that needs another working
directory takes it with ``monkeypatch.chdir`` itself. Code that runs at collection time
(module level) cannot rely on this and anchors its paths to ``ROOT``."""
import os
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parents[1]

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev")
settings.register_profile("fuzz", max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))


@pytest.fixture(autouse=True)
def _at_repository_root(monkeypatch):
    monkeypatch.chdir(ROOT)
