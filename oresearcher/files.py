"""The one way the project writes a file, and the one way it reads back JSON it wrote.

Every file the project writes (reports, traces, figures, sweep results, the convergence
proxy's cache, model exports, checkpoints, profiles) goes through :func:`write_atomic`:
a temporary file created new beside the target (O_EXCL | O_NOFOLLOW: a link planted at
its name is refused by the kernel, never followed), flushed, then renamed onto the
target. A rename replaces a link at the target itself, never the file it points to, and
a reader sees the old file or the new one, never half of one. :func:`write_text` and
:func:`save_figure` are its two common shapes.

Everything read back (a cache entry, a report handed to ``compare``, an export's
``model.json``) goes through :func:`read_json`: not through a link, at most a stated
size, JSON nested at most a stated depth; the caller then checks the fields it uses.
"""
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
    f, tmp = _new_temp(path)
    try:
        with f:
            data(f) if callable(data) else f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _new_temp(path: Path):
    """(binary file, its path): a new file beside ``path`` named ``.NAME.tmp-PID`` (a
    leftover of ours, from an earlier failure in this process, removed first; a name
    taken by anything else, a link planted there included, is skipped, never opened)."""
    import os

    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    base = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    base.unlink(missing_ok=True)  # removes a link itself, never its target
    for k in range(100):
        tmp = base if k == 0 else base.with_name(f"{base.name}.{k}")
        try:
            return os.fdopen(os.open(tmp, flags, 0o644), "wb"), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"{base}: no free temporary name beside {path.name}")


def write_text(path: Path, text: str, root: Path | None = None) -> None:
    """:func:`write_atomic` of ``text`` in UTF-8."""
    write_atomic(path, text.encode("utf-8"), root=root)


def save_figure(fig, path: Path, root: Path | None = None, **savefig) -> None:
    """``fig.savefig`` through :func:`write_atomic` (format from the suffix), then close it."""
    import matplotlib.pyplot as plt

    path = Path(path)
    try:
        write_atomic(path, lambda f: fig.savefig(f, format=path.suffix.lstrip(".") or "png", **savefig), root=root)
    finally:
        plt.close(fig)


class Unreadable(ValueError):
    """A file the project wrote reads back as something else; the message says what."""


def read_json(path: Path, max_bytes: int = 64 << 20):
    """The JSON value in ``path``, read without following a link at ``path``, or
    :class:`Unreadable` saying why not (a link, not a regular file, over ``max_bytes``,
    not UTF-8 JSON, nested too deeply for the parser). FileNotFoundError when there is
    nothing there."""
    import json
    import os
    import stat

    path = Path(path)
    try:  # O_NONBLOCK: a FIFO planted at the name is refused below, not waited on
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise
    except OSError as e:
        why = "a symbolic link" if path.is_symlink() else (e.strerror or str(e))
        raise Unreadable(f"{why}, not a file this program wrote") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # a directory, a FIFO, a device
        os.close(fd)
        raise Unreadable("not a regular file")
    with os.fdopen(fd, "rb") as f:
        raw = f.read(max_bytes + 1)
    if len(raw) > max_bytes:
        raise Unreadable(f"over {max_bytes:,} bytes")
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise Unreadable(f"not valid JSON ({str(e)[:80]})") from None
    except RecursionError:
        raise Unreadable("JSON nested too deeply") from None


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


def check_dir(path: Path, flag: str = "--out") -> Path:
    """What :func:`writable_dir` would refuse, said without creating anything: checked
    before a run, so a refused run leaves no directory behind; :func:`writable_dir`
    creates it when the results are written."""
    import os

    from .errors import UserError

    path = Path(path)
    if path.exists():
        if not path.is_dir():
            raise UserError(f"{flag} {path}: a file, not a directory")
        if not os.access(path, os.W_OK | os.X_OK):
            raise UserError(f"{flag} {path}: the directory is not writable")
        return path
    above = next((p for p in path.absolute().parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise UserError(f"{flag} {path}: {above} is a file, so no directory can be made under it")
    if above is not None and not os.access(above, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {path}: cannot create the directory: {above} is not writable")
    return path
