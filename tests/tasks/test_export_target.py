"""run --export DIR: the target is checked before any rank starts, both files are written
atomically (a link planted at either name is replaced, never written through), and the
export's optional fields are checked when read back."""
import json

import pytest
import torch

from oresearcher.errors import UserError, cli_main
from oresearcher.export import main as export_main
from oresearcher.tasks.digits import PREPROCESSING, build_model
from oresearcher.tasks.export import META, WEIGHTS, check_target, load_model, save_model


def _save(out):
    torch.manual_seed(3)
    return save_model(out, build_model("mlp"), task="digits", architecture="mlp", preprocessing=PREPROCESSING,
                      n_classes=10, metrics={"test_accuracy": 0.5})


@pytest.mark.parametrize("name", [META, WEIGHTS])
def test_a_link_in_the_export_directory_is_replaced_not_followed(tmp_path, name):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    out = tmp_path / "e"
    out.mkdir()
    (out / name).symlink_to(notes)
    _save(out)
    assert notes.read_text() == "my notes\n" and not (out / name).is_symlink()
    assert load_model(out)[1]["metrics"] == {"test_accuracy": 0.5}


def test_a_file_in_place_of_the_target_is_refused_before_training(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(UserError, match="--export .*f: a file, not a directory"):
        check_target(tmp_path / "f")


def test_another_export_is_replaced_only_on_purpose(tmp_path):
    out = _save(tmp_path / "e")
    with pytest.raises(UserError, match="already holds an exported model .*--overwrite"):
        check_target(out)
    assert check_target(out, replace=True) == out
    (tmp_path / "h" / "mlp").mkdir(parents=True)  # a heterogeneous run's export: one folder per architecture
    _save(tmp_path / "h" / "mlp")
    with pytest.raises(UserError, match="already holds an exported model"):
        check_target(tmp_path / "h")
    assert check_target(tmp_path / "new") == tmp_path / "new"
    (tmp_path / "l").mkdir()
    (tmp_path / "l" / META).symlink_to(tmp_path / "h" / "mlp" / META)  # a planted link: replaced, not an export
    assert check_target(tmp_path / "l") == tmp_path / "l"


def test_the_run_refuses_a_file_target_before_any_rank_starts(tmp_path, capsys):
    from oresearcher.run import main as run_main

    (tmp_path / "f").write_text("")
    code = cli_main(run_main, ["--backend=gloo", "--scenario", "scenarios/digits-4.yaml", "--steps", "2",
                               "--out", str(tmp_path / "r"), "--export", str(tmp_path / "f")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error: --export") and "a file, not a directory" in err[-1]
    assert not (tmp_path / "r").exists()  # nothing started


@pytest.mark.parametrize("field, value", [("metrics", [1, 2]), ("metrics", "x"), ("metrics", {"acc": "high"}),
                                          ("metrics", {"acc": True}), ("scenario", 3)])
def test_optional_fields_of_the_wrong_kind_are_one_line(tmp_path, capsys, field, value):
    out = _save(tmp_path / "e")
    meta = json.loads((out / META).read_text())
    meta[field] = value
    (out / META).write_text(json.dumps(meta))
    assert cli_main(export_main, [str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and field in err and "Traceback" not in err


def test_the_description_file_names_its_directory(tmp_path, capsys):
    out = _save(tmp_path / "e")
    assert cli_main(export_main, [str(out / META)]) == 0
    assert f"{out}: mlp for digits" in capsys.readouterr().out
