"""The project reads nothing outside its own repository: no tracked file names the folder
that sits beside a checkout on the developers' machines (published curves the tests use are
copied into tests/data with their source line)."""
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OUTSIDE = "../" + "shared"  # spelled in two parts so this file does not name it


def tracked_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / name for name in out.decode().split("\0") if name]


def test_no_tracked_file_names_the_folder_beside_the_checkout():
    files = tracked_files()
    assert len(files) > 50, "git ls-files listed almost nothing"
    hits = []
    for path in files:
        if not path.is_file() or path.suffix in {".png", ".pt", ".so"}:
            continue
        text = path.read_text(errors="replace")
        hits += [f"{path.relative_to(ROOT)}:{i}" for i, line in enumerate(text.splitlines(), 1) if OUTSIDE in line]
    assert not hits, f"{OUTSIDE} named in: {hits[:10]}"


def test_every_shipped_reference_names_its_source():
    refs = sorted((ROOT / "tests" / "data").glob("nccl-*.csv"))
    assert refs
    for ref in refs:
        assert ref.read_text().startswith("# source: http"), ref.name
