"""The deployed text model as a Hugging Face GPT-2 directory.

    python -m oresearcher.run --backend=gloo --scenario scenarios/text-4.yaml --export runs/text-4/model

    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained("runs/text-4/model")    # GPT2LMHeadModel
    tok = AutoTokenizer.from_pretrained("runs/text-4/model")             # the task's byte-level BPE

The directory holds ``config.json`` (GPT-2's, ``model_type: gpt2``), ``model.safetensors`` in
GPT-2's tensor names and layout, ``tokenizer.json`` with ``tokenizer_config.json``, and
``model.json`` (this project's description, :mod:`oresearcher.tasks.export`: task,
architecture, weights' SHA-256, metrics), so ``python -m oresearcher.export DIR`` checks it too.

The models are GPT-2 by construction (pre-LN blocks, learned positions, the tanh GELU that
GPT-2 calls ``gelu_new``, LayerNorm eps 1e-5, fused q|k|v, tied head), so the mapping is
names plus a transpose: GPT-2 keeps its linear layers as ``Conv1D`` with weights stored
[in, out], torch's ``nn.Linear`` stores [out, in]. The tied head is stored once
(``transformer.wte.weight``), as Hugging Face saves tied weights. Dropout is 0 in the
config: an export is for inference.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

# ours -> GPT-2's, per block; True: a Linear weight stored transposed (Conv1D)
_BLOCK = {"norm1.weight": ("ln_1.weight", False), "norm1.bias": ("ln_1.bias", False),
          "attn.qkv.weight": ("attn.c_attn.weight", True), "attn.qkv.bias": ("attn.c_attn.bias", False),
          "attn.proj.weight": ("attn.c_proj.weight", True), "attn.proj.bias": ("attn.c_proj.bias", False),
          "norm2.weight": ("ln_2.weight", False), "norm2.bias": ("ln_2.bias", False),
          "mlp.up.weight": ("mlp.c_fc.weight", True), "mlp.up.bias": ("mlp.c_fc.bias", False),
          "mlp.down.weight": ("mlp.c_proj.weight", True), "mlp.down.bias": ("mlp.c_proj.bias", False)}
_TOP = {"tok_emb.weight": "transformer.wte.weight", "pos_emb.weight": "transformer.wpe.weight",
        "norm_f.weight": "transformer.ln_f.weight", "norm_f.bias": "transformer.ln_f.bias"}
EOS = "<|endoftext|>"


def to_hf(state: dict) -> dict:
    """Our state dict -> GPT-2's tensor names and layout (the tied head dropped)."""
    out = {}
    for name, t in state.items():
        if name in _TOP:
            out[_TOP[name]] = t
        elif name.startswith("blocks."):
            _, i, rest = name.split(".", 2)
            hf, transpose = _BLOCK[rest]
            out[f"transformer.h.{i}.{hf}"] = t.t() if transpose else t
    return {k: v.detach().cpu().contiguous().clone() for k, v in out.items()}


def is_hf(tensors: dict) -> bool:
    return any(k.startswith("transformer.") for k in tensors)


def from_hf(tensors: dict) -> dict:
    """GPT-2's names and layout -> ours (the inverse of :func:`to_hf`); names it does not
    know pass through, so a loader names them as the mismatch."""
    top = {v: k for k, v in _TOP.items()}
    block = {hf: (ours, tr) for ours, (hf, tr) in _BLOCK.items()}
    out = {}
    for name, t in tensors.items():
        if name in top:
            out[top[name]] = t
        elif name.startswith("transformer.h.") and name.split(".", 3)[3] in block:
            _, _, i, rest = name.split(".", 3)
            ours, transpose = block[rest]
            out[f"blocks.{i}.{ours}"] = t.t().contiguous() if transpose else t
        elif name != "lm_head.weight":  # tied: wte is the head
            out[name] = t
    return out


def hf_config(cfg, eos_id: int | None) -> dict:
    """GPT-2's config.json for a model of ``cfg`` (a ModelConfig of style gpt)."""
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": cfg.vocab_size,
            "n_positions": cfg.max_seq_len, "n_ctx": cfg.max_seq_len, "n_embd": cfg.d_model,
            "n_layer": cfg.n_layer, "n_head": cfg.n_head, "n_inner": cfg.ffn, "activation_function": "gelu_new",
            "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "layer_norm_epsilon": cfg.norm_eps,
            "initializer_range": 0.02, "scale_attn_weights": True, "use_cache": True,
            "bos_token_id": eos_id, "eos_token_id": eos_id, "tie_word_embeddings": True, "dtype": "float32"}


def eos_token(tokenizer_path) -> tuple[str, int | None]:
    """(text, id) of the tokenizer's end-of-text token: GPT-2's ``<|endoftext|>`` if it has
    it, else its first special token."""
    data = json.loads(Path(tokenizer_path).read_text())
    special = [t for t in data.get("added_tokens", []) if t.get("special")]
    for t in special:
        if t["content"] == EOS:
            return EOS, int(t["id"])
    return (special[0]["content"], int(special[0]["id"])) if special else (EOS, None)


def write_hf(directory, module, tokenizer_path, *, model_name: str, task: str = "text",
             metrics: dict | None = None, scenario: str = "") -> Path:
    """Write the Hugging Face directory of the module doc; returns it."""
    from safetensors.torch import save

    from ...files import sha256_file, write_atomic, write_text
    from .. import export as X

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    eos, eos_id = eos_token(tokenizer_path)
    # every file through the safe-write path (a link planted at a name is replaced, never followed);
    # "pt": the safetensors format transformers expects
    write_atomic(out / X.WEIGHTS, save(to_hf(module.state_dict()), metadata={"format": "pt"}))
    write_text(out / "config.json", json.dumps(hf_config(module.cfg, eos_id), indent=2) + "\n")
    write_text(out / "generation_config.json", json.dumps({"bos_token_id": eos_id, "eos_token_id": eos_id}) + "\n")
    write_atomic(out / "tokenizer.json", Path(tokenizer_path).read_bytes())
    write_text(out / "tokenizer_config.json", json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": eos, "eos_token": eos, "unk_token": eos,
        "model_max_length": module.cfg.max_seq_len, "clean_up_tokenization_spaces": False}, indent=2) + "\n")
    meta = {"format": X.FORMAT, "task": task, "architecture": model_name,
            "preprocessing": {"input": "UTF-8 text", "tokenizer": "tokenizer.json (byte-level BPE)",
                              "context": module.cfg.max_seq_len, "output": "next-token logits"},
            "n_classes": module.cfg.vocab_size, "weights_sha256": sha256_file(out / X.WEIGHTS),
            "layout": "huggingface-gpt2", "vocab_size": module.cfg.vocab_size,
            "metrics": {k: float(v) for k, v in (metrics or {}).items()
                        if isinstance(v, (int, float)) and not isinstance(v, bool)},
            "scenario": scenario}
    write_text(out / X.META, json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return out


def hf_logits(directory, tokens: torch.Tensor) -> torch.Tensor:
    """Logits [B, T, V] of the exported directory as ``transformers`` loads it (tests, docs)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(directory)).eval()
    with torch.no_grad():
        return model(tokens).logits
