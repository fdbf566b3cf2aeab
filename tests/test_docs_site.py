"""The docs site builds: `mkdocs build --strict` (mkdocs.yml, docs/) passes, so a broken link,
a missing anchor or a page left out of the nav fails CI; the README stays short, keeps CI's
exact test command and links only to pages that exist; no page tells history."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def build(root: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_the_site_builds_strict(tmp_path):
    r = build(ROOT, tmp_path / "site")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    built = {p.parent.name for p in (tmp_path / "site").glob("*/index.html")}
    assert {p.stem for p in (ROOT / "docs").glob("*.md")} - {"index"} <= built


def test_a_broken_link_fails_the_build(tmp_path):
    shutil.copytree(ROOT / "docs", tmp_path / "docs", ignore=shutil.ignore_patterns("*.tmp"))
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    page = tmp_path / "docs" / "design.md"
    page.write_text(page.read_text() + "\n[gone](no-such-page.md)\n")
    r = build(tmp_path, tmp_path / "site")
    assert r.returncode != 0 and "no-such-page.md" in r.stdout + r.stderr


def test_the_readme_is_short_and_keeps_ci_s_command():
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    ci = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln.startswith("python3 -m venv")]
    assert len(ci) == 1 and ci[0] in text.splitlines()  # the README's second set-up command, byte for byte


def test_the_readme_links_to_pages_that_exist():
    links = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", README.read_text())
    assert len(links) >= 10
    missing = [link for link in links if not (ROOT / link).is_file()]
    assert not missing, missing


HISTORY = re.compile(r"this session|last session|the last host|\bissue \d+|\bissue #\d+|sessions? that", re.I)


def test_no_page_tells_history():
    pages = [README, *sorted((ROOT / "docs").glob("*.md"))]
    found = [f"{p.name}:{i}: {ln.strip()}" for p in pages for i, ln in enumerate(p.read_text().splitlines(), 1)
             if HISTORY.search(ln)]
    assert not found, "say what and why, not how the work went:\n" + "\n".join(found)
