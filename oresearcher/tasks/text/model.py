"""The text task's models: the GPT-2-shaped presets of :data:`oresearcher.models.PRESETS`
(``text-6k`` ... ``text-1.5m``, named by non-embedding parameters), residual dropout for
heterogeneous clones, and checkpoints (``model.safetensors`` + ``config.json``).

A checkpoint is read in one of two layouts: this project's own tensor names
(``blocks.0.attn.qkv.weight``, what :func:`save_checkpoint` writes) or a Hugging Face GPT-2
directory (``transformer.h.0.attn.c_attn.weight``, what ``run --export`` writes,
:mod:`oresearcher.tasks.text.hf`). Whatever does not fit the model is refused in one line
naming the first mismatched tensor.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from ...errors import UserError, short
from ...models import PRESETS, DecoderLM, ModelConfig, lm_loss
from ...models.workloads import measure_lm, measure_module

MODELS = tuple(name for name in PRESETS if name.startswith("text-"))
CONFIG, WEIGHTS = "config.json", "model.safetensors"


def model_config(name: str, vocab_size: int | None = None) -> ModelConfig:
    """Preset ``name`` with the tokenizer's vocabulary (the preset's 1024 unless told)."""
    if name not in MODELS:
        raise UserError(f"workload.model: text has models {', '.join(MODELS)} (got {short(name)})")
    cfg = PRESETS[name]
    return cfg if vocab_size in (None, cfg.vocab_size) else dataclasses.replace(cfg, vocab_size=int(vocab_size))


def build_model(name: str, vocab_size: int | None = None, device="cpu") -> DecoderLM:
    """A fresh GPT-2-initialised model of preset ``name`` (float32)."""
    return DecoderLM(model_config(name, vocab_size), device=device, dtype=torch.float32)


def step_cost(arch: str, vocab: int, batch: int, seq_len: int, dtype: str) -> tuple[tuple, float, float]:
    """(parameter numels, forward FLOPs, backward FLOPs) of one step: torch's counter on the
    meta device (oresearcher.models.workloads), the preset's own when the vocabulary is its."""
    if vocab == model_config(arch).vocab_size:
        c = measure_lm(arch, batch, seq_len, dtype)
        return c.param_numels, float(c.fwd_flops), float(c.bwd_flops)
    module = build_model(arch, vocab, device="meta")
    x = torch.zeros(batch, seq_len, dtype=torch.long, device="meta")
    fwd, bwd, _ = measure_module(module, (x,), lambda logits: lm_loss(logits, x))
    return tuple(p.numel() for p in module.parameters()), float(fwd), float(bwd)


def add_dropout(module: DecoderLM, p: float) -> list:
    """Residual dropout (GPT-2's resid_pdrop) on every attention and MLP output, active in
    train mode only; forward hooks, so the model and its state dict stay DecoderLM's.
    Returns the hook handles."""
    if p <= 0:
        return []

    def drop(mod, args, out):
        return F.dropout(out, p, training=mod.training)
    return [h for block in module.blocks for h in (block.attn.register_forward_hook(drop),
                                                   block.mlp.register_forward_hook(drop))]


def save_checkpoint(directory, module: DecoderLM, name: str, meta: dict | None = None) -> Path:
    """``model.safetensors`` (own tensor names, the tied head once) and ``config.json``
    (the preset, its shape, ``meta``) into ``directory``, written whole or not at all."""
    from safetensors.torch import save

    from ...files import write_atomic, write_text

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in module.state_dict().items()
               if k != "lm_head.weight"}  # tied to tok_emb.weight
    write_atomic(out / WEIGHTS, save(tensors, metadata={"format": "pt"}))  # links replaced, never followed
    write_text(out / CONFIG, json.dumps(checkpoint_config(module, name, meta), indent=2, sort_keys=True) + "\n")
    return out


def checkpoint_config(module: DecoderLM, name: str, meta: dict | None = None) -> dict:
    """What ``config.json`` beside the weights says: the preset, its shape, ``meta``."""
    return {"model": name, **dataclasses.asdict(module.cfg), **(meta or {})}


def read_tensors(path) -> dict:
    """The tensors of a checkpoint directory (or a ``.safetensors`` file), in this project's
    names whatever the layout; UserError when there is none or it does not parse."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from .hf import from_hf, is_hf

    p = Path(path).expanduser()
    weights = p / WEIGHTS if p.is_dir() else p
    if not weights.is_file():
        raise UserError(f"workload.options.init: {weights}: no such file (a checkpoint directory holds "
                        f"{WEIGHTS} and {CONFIG})")
    try:
        tensors = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as e:
        raise UserError(f"workload.options.init: {weights}: not a safetensors file ({short(str(e))})") from None
    return from_hf(tensors) if is_hf(tensors) else tensors


def load_into(module: DecoderLM, tensors: dict, where: str, model_name: str) -> None:
    """Copy ``tensors`` into ``module``; one line naming the first tensor that does not fit."""
    want = {k: v for k, v in module.state_dict().items() if k != "lm_head.weight"}
    tensors = {k: v for k, v in tensors.items() if k != "lm_head.weight"}
    for name, t in tensors.items():
        if name not in want:
            raise UserError(f"{where}: tensor {name} is not in {model_name} (a checkpoint of another model)")
        if tuple(t.shape) != tuple(want[name].shape):
            raise UserError(f"{where}: tensor {name} is {tuple(t.shape)}, {model_name} needs "
                            f"{tuple(want[name].shape)} (a checkpoint of another shape)")
    missing = sorted(set(want) - set(tensors))
    if missing:
        raise UserError(f"{where}: tensor {missing[0]} missing ({len(missing)} of {model_name}'s are)")
    with torch.no_grad():
        for name, t in tensors.items():
            want[name].copy_(t.to(want[name].dtype))


def load_checkpoint(module: DecoderLM, path, model_name: str) -> None:
    """Start ``module`` from the checkpoint at ``path`` (see the module doc)."""
    load_into(module, read_tensors(path), f"workload.options.init: {path}", model_name)
