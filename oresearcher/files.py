"""File helpers shared by run checkpoints (oresearcher.backends.checkpoint) and model
exports (oresearcher.export)."""
from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks (checkpoints run to gigabytes)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def no_links_between(root: Path, path: Path) -> None:
    """UserError when a folder from ``root`` (exclusive) down to ``path``'s folder is a
    symbolic link: a run writes inside its directory only, never through a link planted
    there (a step folder pointing elsewhere would carry its writes out)."""
    from .errors import UserError

    root, parent = Path(root), Path(path).parent
    try:
        rel = parent.relative_to(root)
    except ValueError:
        return
    at = root
    for part in rel.parts:
        at = at / part
        if at.is_symlink():
            raise UserError(f"{at} is a symbolic link; a run writes only inside its own directory "
                            "(remove the link)")


def write_atomic(path: Path, data, root: Path | None = None) -> None:
    """Write ``data`` (bytes, or ``data(f)`` writing to a binary file) to ``path`` atomically.

    The temporary file is created new (O_EXCL: a link planted at its name is refused by
    the kernel, never followed), flushed to disk, then renamed onto ``path``; a rename
    replaces a link at ``path`` itself, never the file it points to. ``root``: the run
    directory, whose folders must not be links (:func:`no_links_between`)."""
    import os

    path = Path(path)
    if root is not None:
        no_links_between(root, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    if tmp.exists() or tmp.is_symlink():  # ours (the pid is in its name), left by an earlier failure
        tmp.unlink()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        with os.fdopen(os.open(tmp, flags, 0o644), "wb") as f:
            data(f) if callable(data) else f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def writable_dir(path: Path, flag: str = "--out") -> Path:
    """Create the directory ``path`` (and its parents) or say in one line why it cannot be
    written to: a file in its place or on its way, no permission, a read-only disk.
    Checked before a run or a measurement starts, so nothing computed is lost at the end."""
    import os

    from .errors import UserError

    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UserError(f"{flag} {path}: a file, not a directory") from None
    except NotADirectoryError:
        above = next((p for p in path.parents if p.exists() and not p.is_dir()), path.parent)
        raise UserError(f"{flag} {path}: {above} is a file, so no directory can be made under it") from None
    except OSError as e:
        raise UserError(f"{flag} {path}: cannot create the directory: {e.strerror or e}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {path}: the directory is not writable")
    return path
