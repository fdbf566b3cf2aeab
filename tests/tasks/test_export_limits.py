"""The export refuses, in one line, a model.json nested past the parser's depth and one
whose n_classes contradicts the weights' head (it would otherwise print 'weights verified')."""
import json

import pytest
import torch

from oresearcher.errors import UserError, cli_main
from oresearcher.export import main as export_main
from oresearcher.tasks.export import load_model, save_model
from oresearcher.tasks.digits import PREPROCESSING, build_model


@pytest.fixture
def saved(tmp_path):
    torch.manual_seed(3)
    return save_model(tmp_path / "m", build_model("mlp"), task="digits", architecture="mlp",
                      preprocessing=PREPROCESSING, n_classes=10)


def _one_line(out, capsys, words):
    with pytest.raises(UserError, match=words):
        load_model(out)
    assert cli_main(export_main, [str(out)]) == 2
    err = capsys.readouterr()
    assert err.err.count("\n") == 1 and err.err.startswith("error: ") and "weights verified" not in err.out


@pytest.mark.parametrize("n", [-5, 0, 9, 11, 10**9])
def test_n_classes_the_weights_contradict_is_refused(saved, capsys, n):
    meta = json.loads((saved / "model.json").read_text())
    meta["n_classes"] = n
    (saved / "model.json").write_text(json.dumps(meta))
    _one_line(saved, capsys, f"n_classes is {n}, but the weights' mlp head has 10 outputs")


def test_the_right_n_classes_loads(saved):
    assert load_model(saved)[1]["n_classes"] == 10


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"a": ' * 50_000 + "1" + "}" * 50_000])
def test_deeply_nested_json_is_one_line(saved, capsys, text):
    (saved / "model.json").write_text(text)
    _one_line(saved, capsys, "nested too deeply")
