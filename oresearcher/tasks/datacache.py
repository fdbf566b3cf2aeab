"""A disk cache for arrays derived from data that ships inside a package.

Why: digits' split comes from scikit-learn (``load_digits`` + a stratified
``train_test_split``), and importing scikit-learn costs every rank 1.5-2.5 s of CPU (it
pulls in scipy). A run of 4 gloo ranks on 2 cores paid that four times before its first
step. The split is a pure function of the installed versions, so the first process
stores the arrays (``.npz``, no pickle) and later ones read them.

Where: ``$ORESEARCHER_CACHE`` if set (``off`` disables the cache), else
``$XDG_CACHE_HOME/oresearcher``, else ``~/.cache/oresearcher``. The file name carries a
hash of the key (the recipe name and the versions it depends on), so an upgrade misses
and rebuilds. A file that cannot be read is rebuilt; a directory that cannot be written
only costs the rebuild next time (logged at debug). Writes are atomic (temporary file,
then ``os.replace``), so ranks starting together never read a half-written file.
"""
from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from ..files import write_atomic

log = logging.getLogger(__name__)


def cache_dir() -> Optional[Path]:
    """The cache folder, or None when ``ORESEARCHER_CACHE=off``."""
    env = os.environ.get("ORESEARCHER_CACHE")
    if env is not None:
        return None if env.strip().lower() == "off" else Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "oresearcher"


def cached_arrays(name: str, key: str, build: Callable[[], dict]) -> dict:
    """``build()``'s dict of numpy arrays, from the cache when a file for ``key`` is there."""
    root = cache_dir()
    if root is None:
        return build()
    path = root / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.npz"
    try:
        with np.load(path, allow_pickle=False) as f:
            return {k: f[k] for k in f.files}
    except FileNotFoundError:
        pass
    except Exception as e:  # a truncated or foreign file: rebuild and replace it
        log.debug("%s: unreadable cache file (%s); rebuilding", path, e)
    arrays = build()
    try:
        write_atomic(path, lambda f: np.savez(f, **arrays))
    except OSError as e:
        log.debug("%s: not cached (%s)", path, e)
    return arrays
