"""The base model: one GPT of the text family pretrained on the first corpus, kept in the cache.

    python -m oresearcher.tasks.text.pretrain --model text-100k --corpus sotu --steps 300   # text-4's base: where it is

``workload.options.init: pretrain`` starts every agent from this base. It is trained once per
setting and then found: its cache folder's name hashes everything that decides the weights
(preset and vocabulary, the tokenizer file, the corpus's cache key, steps, batch, learning
rate, seed, this module's version), and the folder's manifest (:mod:`.cache`) checks the
weights' SHA-256 before they are read, so a changed setting trains a new base and a damaged
file is retrained, never loaded. The ranks of one run that need it at once take the cache's
lock: one trains, the others wait and read.

Training is nanoGPT's loop, kept small: AdamW (betas 0.9, 0.95; weight decay 0.1 on matrices),
linear warm-up over the first 10% of steps, cosine decay to 10% of the peak, gradients
clipped at norm 1, windows of the model's whole context in a seeded order
(:class:`.data.Batches`).
"""
from __future__ import annotations

import logging
import math
import sys
import time
from pathlib import Path

import torch

from ...models import lm_loss
from . import cache
from .data import batches, prepare, windows
from .model import CONFIG, WEIGHTS, build_model, model_config

log = logging.getLogger("oresearcher.tasks.text.pretrain")  # its name also when run as python -m
VERSION = 1  # of the training recipe below: part of the key


def lr_at(step: int, steps: int, peak: float, warmup_frac: float = 0.1, floor: float = 0.1) -> float:
    """Linear warm-up to ``peak`` over ``warmup_frac`` of ``steps``, then cosine to ``floor * peak``."""
    warm = max(1, int(round(warmup_frac * steps)))
    if step < warm:
        return peak * (step + 1) / warm
    t = (step - warm) / max(1, steps - warm)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def make_optimizer(module, lr: float) -> torch.optim.AdamW:
    """AdamW as nanoGPT configures it: decay on matrices only."""
    decay = [p for p in module.parameters() if p.dim() >= 2]
    rest = [p for p in module.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95))


def train(module, stream, steps: int, lr: float, report=None) -> list[float]:
    """``steps`` AdamW steps on ``stream`` (LongTensor [B, T + 1] batches); the losses."""
    opt = make_optimizer(module, lr)
    module.train()
    losses = []
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr)
        batch = next(stream)
        loss = lm_loss(module(batch[:, :-1]), batch[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        if report is not None:
            report(step, losses[-1])
    return losses


@torch.no_grad()
def mean_loss(module, rows: torch.Tensor, batch: int = 16) -> float:
    """Mean next-token loss (nats/token) of ``module`` over windows ``rows`` [N, T + 1]."""
    module.eval()
    total = 0.0
    for i in range(0, len(rows), batch):
        x = rows[i:i + batch]
        total += float(lm_loss(module(x[:, :-1]), x[:, 1:])) * len(x)
    return total / len(rows)


def base_inputs(opts, name: str, train_data) -> dict:
    """Everything that decides the base's weights (its cache key)."""
    p = opts.pretrain
    return {"what": "base", "version": VERSION, "model": name, "vocab_size": opts.vocab_size,
            "corpus": p.corpus, "tokens_key": train_data.key, "steps": p.steps, "batch": p.batch, "lr": p.lr,
            "seed": p.seed, "torch": torch.__version__.split("+")[0]}


def find_or_pretrain(opts, name: str) -> Path:
    """The folder of the base for ``opts`` and preset ``name`` (module doc); trains it when absent."""
    p = opts.pretrain
    ctx = model_config(name, opts.vocab_size).max_seq_len
    train_data = prepare(p.corpus, "train", opts.vocab_size, opts.cache_dir, opts.tokenizer_corpus)
    val_data = prepare(p.corpus, "validation", opts.vocab_size, opts.cache_dir, opts.tokenizer_corpus)
    inputs = base_inputs(opts, name, train_data)
    key = cache.key_of(inputs)
    root = cache.root_dir(opts.cache_dir)
    folder = cache.folder_for(root, f"base-{name}-{p.corpus}", key)
    with cache.locked(root):
        if cache.read_manifest(folder, key) is not None:
            return folder
        log.info("text: pretraining the base %s on %s (%d steps of %d x %d tokens, %.2f epochs); cached in %s",
                 name, p.corpus, p.steps, p.batch, ctx, p.steps * p.batch * ctx / len(train_data.tokens), folder)
        t0 = time.perf_counter()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(p.seed)
            module = build_model(name, opts.vocab_size)
        losses = train(module, batches(train_data, p.batch, ctx, seed=p.seed), p.steps, p.lr)
        val = mean_loss(module, windows(val_data, ctx, max_windows=64))
        meta = {**inputs, "final_train_loss": losses[-1], "val_loss": val, "seconds": time.perf_counter() - t0}
        files = _checkpoint_bytes(module, name, meta)
        cache.write_folder(root, folder, key, files, {"inputs": inputs})
        log.info("text: base %s pretrained in %.0f s: %s validation loss %.3f nats/token", name, meta["seconds"],
                 p.corpus, val)
    return folder


def _checkpoint_bytes(module, name: str, meta: dict) -> dict:
    """{file name: bytes} of the checkpoint that :func:`.model.save_checkpoint` writes."""
    import json

    from safetensors.torch import save

    from .model import checkpoint_config

    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in module.state_dict().items()
               if k != "lm_head.weight"}
    config = json.dumps(checkpoint_config(module, name, meta), indent=2, sort_keys=True) + "\n"
    return {WEIGHTS: save(tensors, metadata={"format": "pt"}), CONFIG: config.encode()}


def main(argv=None) -> int:
    """``python -m oresearcher.tasks.text.pretrain [--model M] [--corpus C] ...``: pretrain (or
    find) the base and print its folder. The flags are the scenario's ``workload.options``."""
    from ...errors import Parser
    from .options import PretrainOptions, TextOptions

    ap = Parser(prog="python -m oresearcher.tasks.text.pretrain", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="text-100k", help="a text preset (workload.model)")
    ap.add_argument("--corpus", default="sotu", help="options.pretrain.corpus")
    ap.add_argument("--steps", type=int, default=PretrainOptions().steps)
    ap.add_argument("--batch", type=int, default=PretrainOptions().batch)
    ap.add_argument("--lr", type=float, default=PretrainOptions().lr)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab-size", type=int, default=1024)
    ap.add_argument("--tokenizer-corpus", default="sotu")
    ap.add_argument("--cache-dir", default=None)
    a = ap.parse_args(argv)
    from pydantic import ValidationError

    from ...errors import UserError
    from .model import model_config

    model_config(a.model)  # an unknown preset: one line
    try:
        opts = TextOptions(vocab_size=a.vocab_size, tokenizer_corpus=a.tokenizer_corpus, cache_dir=a.cache_dir,
                           pretrain=PretrainOptions(corpus=a.corpus, steps=a.steps, batch=a.batch, lr=a.lr,
                                                    seed=a.seed))
    except ValidationError as e:
        err = e.errors()[0]
        raise UserError(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from None
    print(find_or_pretrain(opts, a.model))
    return 0


if __name__ == "__main__":
    from ...errors import cli_main

    sys.exit(cli_main(main))
