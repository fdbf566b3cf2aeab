"""Fixtures of the backend tests (helpers live in bk_helpers, importable by name)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bk_helpers import child_environment  # noqa: E402


@pytest.fixture
def child_env():
    return child_environment()
