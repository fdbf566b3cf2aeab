"""docs/scenario-reference.md is generated from the scenario schema (oresearcher.reporting.scenario_doc):
the checked-in page matches a fresh rendering, every field of every section is on it with its
description, and --check fails on a page that drifted."""
from oresearcher.reporting import scenario_doc
from oresearcher.scenario import Scenario


def test_the_checked_in_page_matches_the_schema():
    assert scenario_doc.PAGE.read_text() == scenario_doc.render(), (
        "docs/scenario-reference.md drifted from the schema; run python -m oresearcher.reporting.scenario_doc")


def test_every_field_is_on_the_page_with_its_description():
    text, seen = scenario_doc.render(), 0

    def walk(path, model):
        nonlocal seen
        assert f"## `{path}`" in text or not path
        for name, field in model.model_fields.items():
            row = next(ln for ln in text.split(f"## `{path}`" if path else "## Top level")[1].splitlines()
                       if ln.startswith(f"| `{name}` |"))
            assert " ".join((field.description or "").split()).replace("|", "\\|") in row
            seen += 1
            for sub in scenario_doc._models(field.annotation):
                walk(f"{path}.{name}" if path else name, sub)

    walk("", Scenario)
    assert seen > 80  # the schema has about a hundred fields; a walk that found few missed sections


def test_types_and_ranges_are_read_from_the_annotations():
    rows = {ln.split(" | ")[0]: ln for ln in scenario_doc.render().splitlines() if ln.startswith("| `")}
    assert "integer (>= 1, <= 16384)" in rows["| `count`"] and "`8`" in rows["| `count`"]
    assert "number or null (> 0, < 1)" in rows["| `budget`"]
    assert "one of: `stop`, `skip` or null" in rows["| `on_divergence`"]
    assert "list of 3: number (>= 0, <= 1000)" in rows["| `reward_weights`"]


def test_check_fails_on_a_drifted_page_and_passes_on_a_fresh_one(tmp_path, capsys):
    page = tmp_path / "ref.md"
    page.write_text(scenario_doc.render().replace("training steps per agent", "steps"))
    assert scenario_doc.main(["--check", "--out", str(page)]) == 1
    assert "differs from the schema" in capsys.readouterr().err
    assert scenario_doc.main(["--out", str(page)]) == 0
    assert scenario_doc.main(["--check", "--out", str(page)]) == 0
