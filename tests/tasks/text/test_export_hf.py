"""The deployed text model exports as a Hugging Face GPT-2 directory that transformers loads
(AutoModelForCausalLM, AutoTokenizer) with the project's logits, and that
oresearcher.export checks and loads back."""
import os

import pytest
import torch

from oresearcher.export import main as export_main
from oresearcher.tasks.export import load_model
from oresearcher.tasks.text.hf import hf_logits, write_hf
from oresearcher.tasks.text.model import build_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("name", ["text-25k", "text-230k"])
def test_transformers_loads_the_export_as_gpt2_with_the_same_logits(tmp_path, bible_train, name):
    torch.manual_seed(3)
    model = build_model(name, bible_train.vocab_size).eval()
    with torch.no_grad():  # trained-looking weights: not the init's near-uniform predictions
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    out = write_hf(tmp_path / "m", model, bible_train.tokenizer_path, model_name=name, metrics={"val_loss": 3.0})
    assert {"config.json", "model.safetensors", "tokenizer.json", "model.json"} <= {p.name for p in out.iterdir()}
    x = torch.from_numpy(bible_train.tokens[:2 * 128].astype("int64")).reshape(2, 128)
    with torch.no_grad():
        ours = model(x)
    theirs = hf_logits(out, x)
    assert type(transformers.AutoModelForCausalLM.from_pretrained(str(out))).__name__ == "GPT2LMHeadModel"
    assert (ours - theirs).abs().max().item() < 1e-4


def test_the_tokenizer_loads_and_encodes_as_the_task_does(tmp_path, bible_train):
    write_hf(tmp_path / "m", build_model("text-25k", bible_train.vocab_size), bible_train.tokenizer_path,
             model_name="text-25k")
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "m"))
    text = "In the beginning God created the heaven and the earth."
    assert tok(text)["input_ids"] == bible_train.tokenizer().encode(text, add_special_tokens=False).ids
    assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id == bible_train.eot_id
    assert tok.decode(tok(text)["input_ids"]) == text


def test_oresearcher_export_checks_and_loads_the_same_directory(tmp_path, bible_train, capsys):
    torch.manual_seed(4)
    model = build_model("text-25k", bible_train.vocab_size).eval()
    write_hf(tmp_path / "m", model, bible_train.tokenizer_path, model_name="text-25k")
    back, meta = load_model(tmp_path / "m")
    assert meta["task"] == "text" and meta["architecture"] == "text-25k"
    x = torch.randint(0, bible_train.vocab_size, (1, 32))
    with torch.no_grad():
        assert torch.equal(back(x), model(x))
    assert export_main([str(tmp_path / "m")]) == 0 and "text-25k for text" in capsys.readouterr().out
