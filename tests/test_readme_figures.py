"""Figures of README.md and docs/*.md cannot drift: the quick blocks of benchmarks/readme_figures.py
match a fresh run, and the rewriting touches nothing outside its markers, on the page that holds
each block.

The script is run as users run it. Its page handling is checked on a copy of it in a scratch
tree (its own README.md and docs/) whose readme_blocks.py is a stand-in: each block there
prints the text blocks.json gives it, or fails where the text is null."""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

TEXT = """# t
prose with a number 1.0 that no block owns
<!-- fig:a -->
old a
<!-- /fig:a -->
between
<!-- fig:b -->
old b
<!-- /fig:b -->
tail
"""
STAND_IN = '''"""Blocks that print what blocks.json says (null: the generator fails)."""
import json
from pathlib import Path

from readme_run import Block


def _generator(text):
    def generate():
        if text is None:
            raise RuntimeError("exit 2")
        return text
    return generate


BLOCKS = [Block(name, f"make {name}", _generator(text))
          for name, text in json.loads(Path(__file__).with_name("blocks.json").read_text()).items()]
'''


def figures(*argv, cwd=ROOT):
    return subprocess.run([sys.executable, "benchmarks/readme_figures.py", *argv], cwd=cwd, capture_output=True,
                          text=True)


@pytest.fixture
def tree(tmp_path):
    """A scratch project: the real script and its runner, stand-in blocks, no pages yet.
    Returns a function that sets the blocks and runs the script there."""
    bench = tmp_path / "benchmarks"
    bench.mkdir()
    (tmp_path / "docs").mkdir()
    for name in ("readme_figures.py", "readme_run.py"):
        shutil.copy(ROOT / "benchmarks" / name, bench / name)
    (bench / "readme_blocks.py").write_text(STAND_IN)

    def run(blocks: dict, *argv):
        (bench / "blocks.json").write_text(json.dumps(blocks))
        return figures(*argv, cwd=tmp_path)
    run.root = tmp_path
    return run


def test_replace_rewrites_only_inside_markers(tree):
    readme = tree.root / "README.md"
    readme.write_text(TEXT)
    blocks = {"a": "new a\nsecond line\n", "b": "old b\n"}
    p = tree(blocks, "--only", "a")
    assert p.returncode == 0 and p.stdout == "1 of 1 figure blocks changed (a)\n", p.stderr
    out = TEXT.replace("old a\n", "new a\nsecond line\n")
    assert readme.read_text() == out
    assert tree(blocks, "--check").returncode == 0  # the page now holds a's new text and b's old one
    p = tree(blocks, "--only", "b")  # nothing new: the page stays as it was
    assert p.stdout == "0 of 1 figure blocks changed\n" and readme.read_text() == out


@pytest.mark.parametrize("bad, msg", [(TEXT.replace("<!-- /fig:b -->\n", ""), "no matching"),
                                      (TEXT + "<!-- fig:a -->\nx\n<!-- /fig:a -->\n", "appears twice")])
def test_broken_markers_are_named(tree, bad, msg):
    (tree.root / "README.md").write_text(bad)
    p = tree({"a": "new a\n"}, "--check")
    assert p.returncode != 0 and re.search(rf"ValueError: README.md: fig:\w+ .*{msg}", p.stderr), p.stderr


def test_every_block_is_on_one_page_and_check_sees_a_difference(tree):
    names = [line.split()[0] for line in figures("--list").stdout.splitlines()]
    assert "sim-8xA100" in names
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        shutil.copy(page, tree.root / page.relative_to(ROOT))
    fake = {name: "not what the README holds\n" for name in names}
    p = tree(fake, "--check")  # every block is found on exactly one page, and each differs from the fake
    assert p.returncode == 1 and p.stderr.splitlines()[-1] == \
        f"{len(names)} of {len(names)} figure blocks differ from a fresh run", p.stderr[-2000:]
    p = tree(fake, "--check", "--only", "sim-8xA100")
    assert p.returncode == 1 and p.stdout.count("+not what the README holds") == 1
    assert p.stderr.splitlines()[-1] == "1 of 1 figure blocks differ from a fresh run"


def test_blocks_are_found_on_every_page_and_written_where_they_are(tree):
    one, two = tree.root / "README.md", tree.root / "docs" / "topic.md"
    one.write_text(TEXT)
    two.write_text("# topic\n<!-- fig:c -->\nold c\n<!-- /fig:c -->\n")
    blocks = {"c": "new c\n", "a": "new a\n"}
    p = tree(blocks)
    assert p.returncode == 0 and p.stdout == "2 of 2 figure blocks changed (a, c)\n", p.stderr
    assert one.read_text() == TEXT.replace("old a\n", "new a\n")
    assert two.read_text() == "# topic\n<!-- fig:c -->\nnew c\n<!-- /fig:c -->\n"
    assert tree(blocks, "--check").returncode == 0


def test_a_block_on_two_pages_is_an_error(tree):
    (tree.root / "README.md").write_text(TEXT)
    (tree.root / "docs" / "two.md").write_text("<!-- fig:b -->\nx\n<!-- /fig:b -->\n")
    p = tree({"b": "new b\n"}, "--check")
    assert p.returncode != 0 and "ValueError: fig:b appears in both README.md and docs/two.md" in p.stderr


def test_quick_readme_figures_match_a_fresh_run():
    p = figures("--check", "--quick")
    assert p.returncode == 0, \
        "README figures drifted; run `python benchmarks/readme_figures.py --quick`:\n" + p.stdout + p.stderr[-2000:]
    n = int(re.fullmatch(r"all (\d+) figure blocks match a fresh run", p.stderr.splitlines()[-1]).group(1))
    assert n >= 4


def test_a_failing_generator_is_named_and_the_others_still_run(tree):
    readme = tree.root / "README.md"
    readme.write_text("<!-- fig:x -->\nold x\n<!-- /fig:x -->\n<!-- fig:y -->\nold y\n<!-- /fig:y -->\n")
    blocks = {"x": None, "y": "fresh y\n"}
    p = tree(blocks)
    assert p.returncode == 1 and "error: x: RuntimeError: exit 2" in p.stderr
    assert p.stderr.splitlines()[-1] == "error: 1 block(s) failed and were left as they were: x"
    assert readme.read_text() == "<!-- fig:x -->\nold x\n<!-- /fig:x -->\n<!-- fig:y -->\nfresh y\n<!-- /fig:y -->\n"
    p = tree(blocks, "--check", "--only", "x")  # --check: a broken generator is an error
    assert p.returncode == 1 and "Traceback" in p.stderr and p.stderr.splitlines()[-1] == "RuntimeError: exit 2"
