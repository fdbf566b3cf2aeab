"""The text task's on-disk cache: folders of files, each folder described by a manifest
that is written last and names every file's length and SHA-256.

Where: the ``cache_dir`` the caller gives, else ``$ORESEARCHER_CACHE/text``, else
``$XDG_CACHE_HOME/oresearcher/text``, else ``~/.cache/oresearcher/text`` (the project's
cache, :mod:`oresearcher.tasks.datacache`). A folder's name carries a hash of everything
that decides its contents (the key), so a new corpus version, split rule, cleaning or
tokenizer misses and rebuilds rather than reading stale tokens.

Trust: a folder is read only when its manifest parses, names the expected key, and every
file it lists has the stated size and checksum; anything else (a partial write, a flipped
byte, a missing manifest) is logged and rebuilt, never read. Writes go to a new temporary
file (O_EXCL | O_NOFOLLOW) renamed into place (:func:`oresearcher.files.write_atomic`), the
manifest after the data, so a crash leaves a folder without a valid manifest, which is
rebuilt. A folder below the cache root that is a symbolic link is refused in one line: the
cache never writes through a link. Processes that prepare at once (the ranks of one run)
take an advisory lock on the root so one builds and the others read.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from pathlib import Path

from ...errors import UserError
from ...files import no_links_between, sha256_file, write_atomic
from ..datacache import cache_dir as project_cache_dir

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FORMAT = 1  # layout of a cache folder; part of every key


def root_dir(cache_dir=None) -> Path:
    """The text cache's root folder (see the module docstring). ``ORESEARCHER_CACHE=off``,
    which turns the project's small caches off, cannot turn this one off (the tokens are
    read from disk), so it then uses the default place."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    base = project_cache_dir()
    if base is None:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = (Path(xdg) if xdg else Path.home() / ".cache") / "oresearcher"
    return base.expanduser() / "text"


def key_of(inputs: dict) -> str:
    """A 16-hex-digit hash of the inputs that decide a folder's contents (sorted JSON)."""
    blob = json.dumps({"format": FORMAT, **inputs}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def folder_for(root: Path, name: str, key: str) -> Path:
    """``root/<name>-<key>``; UserError when it (or a folder on the way) is a link."""
    folder = root / f"{name}-{key}"
    no_links_between(root, folder / MANIFEST)
    return folder


def read_manifest(folder: Path, key: str):
    """The manifest of ``folder`` when every file it names is whole, else None (logged)."""
    path = folder / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        if folder.exists():
            log.warning("%s: no manifest (a partial write?); rebuilding", folder)
        return None
    except (OSError, ValueError) as e:
        log.warning("%s: unreadable manifest (%s); rebuilding", path, e)
        return None
    problem = _check(folder, manifest, key)
    if problem:
        log.warning("%s: %s; rebuilding", folder, problem)
        return None
    return manifest


def _check(folder: Path, manifest, key: str) -> str | None:
    """What is wrong with ``folder`` against ``manifest``, or None when nothing is."""
    if not isinstance(manifest, dict) or manifest.get("key") != key:
        return "manifest of another key"
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return "manifest lists no files"
    for name, meta in files.items():
        path = folder / name
        if "/" in name or name.startswith(".") or path.is_symlink():
            return f"{name}: not a plain file of the folder"
        try:
            size = path.stat().st_size
        except OSError:
            return f"{name}: missing"
        if size != meta.get("bytes"):
            return f"{name}: {size} bytes, manifest says {meta.get('bytes')}"
        if sha256_file(path) != meta.get("sha256"):
            return f"{name}: checksum differs from the manifest"
    return None


def write_folder(root: Path, folder: Path, key: str, files: dict, extra: dict) -> dict:
    """Write ``files`` (name -> bytes) into ``folder``, then its manifest (key, each file's
    size and SHA-256, and ``extra``); returns the manifest."""
    no_links_between(root, folder / MANIFEST)
    if folder.is_symlink():
        raise UserError(f"{folder} is a symbolic link; the text cache writes only real folders "
                        "(remove the link)")
    (folder / MANIFEST).unlink(missing_ok=True)  # the old manifest no longer vouches for anything
    meta = {}
    for name, data in files.items():
        write_atomic(folder / name, data, root=root)
        meta[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    manifest = {"key": key, "files": meta, **extra}
    write_atomic(folder / MANIFEST, json.dumps(manifest, indent=1).encode(), root=root)
    return manifest


@contextlib.contextmanager
def locked(root: Path):
    """An exclusive advisory lock on ``root/.lock`` while the block runs (POSIX); where
    locks are not available, no lock (two builders then write the same bytes)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"text cache {root}: cannot create it ({e.strerror or e}); "
                        "give another cache_dir") from None
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(root / ".lock", flags, 0o644)
    except OSError as e:
        raise UserError(f"text cache {root}: cannot write there ({e.strerror or e}); "
                        "give another cache_dir") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
