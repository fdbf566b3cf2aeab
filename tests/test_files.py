"""oresearcher.files: the one safe-write path and the one validated reader.

Every write replaces a link planted at the target or at a temporary name, never writes
through it; every read refuses a link, a non-file, an oversized or over-nested file in
one message."""
import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oresearcher import files


@pytest.fixture
def planted(tmp_path):
    """A user's file outside the directory written into, and the directory."""
    user = tmp_path / "user.txt"
    user.write_text("the user's notes\n")
    out = tmp_path / "out"
    out.mkdir()
    return user, out


def _writers():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def figure(path):
        fig, ax = plt.subplots()
        ax.plot([0, 1])
        files.save_figure(fig, path, dpi=20)

    return {"bytes": lambda p: files.write_atomic(p, b"new"), "text": lambda p: files.write_text(p, "new"),
            "callable": lambda p: files.write_atomic(p, lambda f: f.write(b"new")), "figure": figure}


@pytest.mark.parametrize("how", ["bytes", "text", "callable", "figure"])
@pytest.mark.parametrize("where", ["target", "temp", "temp+target"])
def test_a_planted_link_is_replaced_never_written_through(planted, how, where):
    user, out = planted
    target = out / ("x.png" if how == "figure" else "x.json")
    if "target" in where:
        target.symlink_to(user)
    if "temp" in where:
        (out / f".{target.name}.tmp-{os.getpid()}").symlink_to(user)
        (out / f"{target.stem}.tmp").symlink_to(user)  # the old cache's temp name
    _writers()[how](target)
    assert user.read_text() == "the user's notes\n"
    assert target.is_file() and not target.is_symlink()
    assert not (out / f".{target.name}.tmp-{os.getpid()}").exists()  # our temp is gone, the link with it


def test_a_temp_name_taken_by_something_else_is_skipped(planted, monkeypatch):
    """A link that reappears at the temp name after it was removed (a racing planter) is
    never opened: O_EXCL refuses it and the next name is taken."""
    user, out = planted
    target = out / "r.json"
    base = out / f".r.json.tmp-{os.getpid()}"
    base.symlink_to(user)
    monkeypatch.setattr(type(target), "unlink", lambda self, missing_ok=False: None)  # the link "comes back"
    f, tmp = files._new_temp(target)
    with f:
        f.write(b"{}")
    assert tmp != base and tmp.read_bytes() == b"{}" and user.read_text() == "the user's notes\n"


def test_a_link_folder_inside_the_root_is_refused(planted, tmp_path):
    from oresearcher.errors import UserError

    _, out = planted
    (out / "step").symlink_to(tmp_path)
    with pytest.raises(UserError, match="symbolic link"):
        files.write_atomic(out / "step" / "x", b"1", root=out)


@settings(max_examples=40, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=4), c, max_size=4),
                    max_leaves=20))
def test_read_json_reads_back_what_write_text_wrote(tmp_path_factory, value):
    path = tmp_path_factory.mktemp("rt") / "v.json"
    files.write_text(path, json.dumps(value))
    assert files.read_json(path) == value


@pytest.mark.parametrize("damage, why", [
    ("link", "symbolic link"),
    ("fifo", "not a regular file"),
    ("dir", "not a regular file"),
    ("big", "over 100 bytes"),
    ("deep", "nested too deeply"),
    ("cut", "not valid JSON"),
    ("binary", "not valid JSON"),
])
def test_read_json_refuses_what_it_did_not_write(tmp_path, damage, why):
    path = tmp_path / "r.json"
    other = tmp_path / "other.json"
    other.write_text("{}")
    if damage == "link":
        path.symlink_to(other)
    elif damage == "fifo":
        os.mkfifo(path)  # never waited on
    elif damage == "dir":
        path.mkdir()
    elif damage == "big":
        path.write_text(json.dumps(["x" * 200]))
    elif damage == "deep":
        path.write_text("[" * 200_000 + "]" * 200_000)
    elif damage == "cut":
        path.write_text('{"curve": [1, 2')
    else:
        path.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(files.Unreadable, match=why):
        files.read_json(path, max_bytes=100 if damage == "big" else 64 << 20)


def test_read_json_missing_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        files.read_json(tmp_path / "none.json")


def test_no_project_module_writes_a_file_around_the_helper():
    """A write that bypasses oresearcher.files (open(..., 'w'), write_text, savefig to a
    path) is what followed links before; the package, sim/ and backends/ hold none."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    pattern = re.compile(r"\.write_text\(|\.write_bytes\(|savefig\((?!f\b)|open\([^)]*[\"'][wa]b?[\"']")
    allowed = {"oresearcher/files.py",
               "backends/run/rundir.py"}  # the run lock: created O_EXCL | O_NOFOLLOW, a lock and not a replace
    hits = []
    for sub in ("oresearcher", "sim", "backends"):
        for f in (root / sub).rglob("*.py"):
            rel = f.relative_to(root).as_posix()
            if rel in allowed:
                continue
            for n, line in enumerate(f.read_text().splitlines(), 1):
                if pattern.search(line):
                    hits.append(f"{rel}:{n}: {line.strip()}")
    assert not hits, "\n".join(hits)


def test_check_dir_refuses_what_writable_dir_would_and_creates_nothing(tmp_path):
    from oresearcher.errors import UserError

    (tmp_path / "f").write_text("")
    with pytest.raises(UserError, match="a file, not a directory"):
        files.check_dir(tmp_path / "f")
    with pytest.raises(UserError, match="is a file, so no directory can be made under it"):
        files.check_dir(tmp_path / "f" / "sub" / "deeper")
    assert files.check_dir(tmp_path / "new" / "sub") == tmp_path / "new" / "sub"
    assert not (tmp_path / "new").exists()
