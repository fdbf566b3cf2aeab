"""Figures of README.md and docs/*.md cannot drift: the quick blocks of benchmarks/readme_figures.py
match a fresh run, and the rewriting touches nothing outside its markers, on the page that holds
each block."""
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("readme_figures", ROOT / "benchmarks" / "readme_figures.py")
rf = importlib.util.module_from_spec(_spec)
sys.modules["readme_figures"] = rf  # its dataclasses look their module up
_spec.loader.exec_module(rf)

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


def test_replace_rewrites_only_inside_markers():
    out = rf.replace(TEXT, {"a": "new a\nsecond line\n"})
    assert out == TEXT.replace("old a\n", "new a\nsecond line\n")
    assert rf.blocks_in(out) == {"a": "new a\nsecond line\n", "b": "old b\n"}
    assert rf.replace(TEXT, {}) == TEXT


@pytest.mark.parametrize("bad, msg", [(TEXT.replace("<!-- /fig:b -->\n", ""), "no matching"),
                                      (TEXT + "<!-- fig:a -->\nx\n<!-- /fig:a -->\n", "appears twice")])
def test_broken_markers_are_named(bad, msg):
    with pytest.raises(ValueError, match=msg):
        rf.blocks_in(bad)


def test_every_block_is_on_one_page_and_check_sees_a_difference(monkeypatch):
    present = rf.all_blocks()
    assert {b.name for b in rf.BLOCKS} <= set(present)
    fake = rf.Block("sim-8xA100", "x", lambda: "not what the README holds\n")
    diffs = rf.check([fake], log=lambda s: None)
    assert len(diffs) == 1 and "+not what the README holds" in diffs[0]


def test_blocks_are_found_on_every_page_and_written_where_they_are(tmp_path):
    one, two = tmp_path / "README.md", tmp_path / "topic.md"
    one.write_text(TEXT)
    two.write_text("# topic\n<!-- fig:c -->\nold c\n<!-- /fig:c -->\n")
    assert rf.where([one, two]) == {"a": one, "b": one, "c": two}
    blocks = [rf.Block("c", "x", lambda: "new c\n"), rf.Block("a", "x", lambda: "new a\n")]
    assert sorted(rf.write(blocks, log=lambda s: None, files=[one, two])) == ["a", "c"]
    assert one.read_text() == TEXT.replace("old a\n", "new a\n")
    assert two.read_text() == "# topic\n<!-- fig:c -->\nnew c\n<!-- /fig:c -->\n"
    assert rf.check(blocks, log=lambda s: None, files=[one, two]) == []


def test_a_block_on_two_pages_is_an_error(tmp_path):
    one, two = tmp_path / "one.md", tmp_path / "two.md"
    one.write_text(TEXT)
    two.write_text("<!-- fig:b -->\nx\n<!-- /fig:b -->\n")
    with pytest.raises(ValueError, match="fig:b appears in both one.md and two.md"):
        rf.where([one, two])


def test_quick_readme_figures_match_a_fresh_run():
    blocks = rf.select(None, quick=True)
    assert len(blocks) >= 4
    diffs = rf.check(blocks, log=lambda s: None)
    assert not diffs, "README figures drifted; run `python benchmarks/readme_figures.py --quick`:\n" + "\n".join(diffs)


def test_a_failing_generator_is_named_and_the_others_still_run():
    def boom():
        raise RuntimeError("exit 2")

    failed, logged = [], []
    blocks = [rf.Block("x", "x", boom), rf.Block("y", "y", lambda: "fresh y\n")]
    assert rf.regenerate(blocks, log=logged.append, failed=failed) == {"y": "fresh y\n"}
    assert failed == ["x"] and any("error: x: RuntimeError: exit 2" in line for line in logged)
    with pytest.raises(RuntimeError):
        rf.regenerate(blocks[:1], log=logged.append)  # --check: a broken generator is an error
