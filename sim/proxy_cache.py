"""The convergence proxy's cache: one JSON file per proxy run, keyed by what decides it.

    <cache_dir>/<key>.json   {"key", "method", "torch", "threads", "scenario", "curve", "curve_sha256"}

``key`` is the SHA-256 of everything that decides the curve's values: the proxy scenario,
the method version (:data:`oresearcher.sim.convergence.METHOD`), torch's version and the
number of CPU threads torch computes with (a matrix product summed over another split of
threads rounds differently, so its curve is another curve). The file is named by the
key's first 24 hex digits and holds the whole key.

An entry is used only when every check holds: a regular file (a link planted at the name
is not read through), the JSON object this module writes, the full key and the scenario
equal to the ones asked for (a file copied from another key is not ours), a curve with
every value a finite number, and the curve's own SHA-256 matching (a file edited or cut
short). A curve may hold fewer steps than asked for (the cooperative program's
allocation can leave steps that no agent ran), so its length is not judged; its
checksum is. Anything else is said in one line, the proxy runs
again and its result replaces the entry, atomically and never through a link
(:func:`oresearcher.files.write_atomic`).
"""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

MAX_ENTRY_BYTES = 16 << 20  # a curve of 10^5 steps is ~2 MB; anything far bigger is not ours


def key(data: dict, method: str) -> str:
    """Full hex SHA-256 of what decides a proxy run's curve."""
    import torch

    text = json.dumps({"scenario": data, "method": method, "torch": torch.__version__,
                       "threads": torch.get_num_threads()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def entry_path(root: Path, full_key: str) -> Path:
    return Path(root) / f"{full_key[:24]}.json"


def _curve_sha(curve: list) -> str:
    return hashlib.sha256(json.dumps(curve).encode()).hexdigest()


def check_entry(entry, full_key: str, data: dict) -> str | None:
    """Why ``entry`` (a parsed cache file) is not the curve asked for, or None when it is."""
    if not isinstance(entry, dict):
        return f"a JSON {type(entry).__name__}, not a cache entry"
    if entry.get("key") != full_key or entry.get("scenario") != data:
        return "written for another proxy run (its key or scenario differs)"
    curve = entry.get("curve")
    if not isinstance(curve, list) or not curve:
        return "no curve"
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in curve):
        return "a value of the curve is not a finite number"
    if entry.get("curve_sha256") != _curve_sha(curve):
        return "its curve does not match its checksum (edited or damaged)"
    return None


def read(root: Path, full_key: str, data: dict, steps: int, log=None) -> list[float] | None:
    """The cached curve's first ``steps`` values, or None (nothing there, or an entry that
    fails a check: ``log`` hears which and why, and the caller runs the proxy again)."""
    from oresearcher.files import Unreadable, read_json

    path = entry_path(root, full_key)
    try:
        entry = read_json(path, max_bytes=MAX_ENTRY_BYTES)
    except FileNotFoundError:
        return None
    except (Unreadable, OSError) as e:
        why = str(e)
    else:
        why = check_entry(entry, full_key, data)
        if why is None:
            return [float(v) for v in entry["curve"][:steps]]
    if log:
        log(f"convergence proxy: cache entry {path} ignored ({why}); running the proxy again")
    return None


def write(root: Path, full_key: str, data: dict, curve: list[float], method: str) -> Path:
    """Store ``curve`` under ``full_key`` (replacing whatever is at the name, never writing
    through a link); OSError when the directory cannot be written."""
    import torch

    from oresearcher.files import write_text

    path = entry_path(root, full_key)
    entry = {"key": full_key, "method": method, "torch": torch.__version__, "threads": torch.get_num_threads(),
             "scenario": data, "curve": list(curve), "curve_sha256": _curve_sha(list(curve))}
    write_text(path, json.dumps(entry, sort_keys=True))
    return path
