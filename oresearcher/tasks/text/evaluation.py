"""How a text model is scored in the reports: validation loss in nats per token and in bits
per byte (:func:`.data.bits_per_byte`: comparable across tokenizers), and accuracy on the
multiple-choice benchmark (:mod:`.mcq`: k-way questions from the test documents of the
agents' corpus, length-normalized log-likelihood, 95% Wilson interval, chance 1/k).

The validation windows are ``options.eval_tokens`` tokens spread evenly over the split
(:func:`.data.windows`); the questions are built once per process and setting (seeded by
the scenario seed), so every agent, the student and the base answer the same ones.
"""
from __future__ import annotations

import functools

import torch

from ...models import lm_loss
from ...seeds import STREAM, derive


@torch.no_grad()
def mean_nll(module, rows: torch.Tensor, device, batch: int = 16) -> float:
    """Mean next-token loss (nats/token) of ``module`` on windows ``rows`` [N, T + 1]."""
    module.eval()
    total = 0.0
    for i in range(0, len(rows), batch):
        x = rows[i:i + batch].to(device)
        total += float(lm_loss(module(x[:, :-1]), x[:, 1:])) * len(x)
    return total / len(rows)


@functools.lru_cache(maxsize=8)
def _questions(corpus: str, vocab: int, cache_dir, tokenizer_corpus: str, k: int, n: int, seed: int):
    from .data import prepare
    from .mcq import build_questions

    return build_questions(prepare(corpus, "test", vocab, cache_dir, tokenizer_corpus), k=k, n=n, seed=seed)


def questions(scenario):
    """The benchmark's questions for ``scenario`` (module doc)."""
    o = scenario.workload.options
    return _questions(o.corpus, o.vocab_size, o.cache_dir, o.tokenizer_corpus, o.mc_choices, o.mc_questions,
                      derive(scenario.seed, 41, prime=STREAM))


@torch.no_grad()
def multiple_choice(module, scenario, device):
    """The :class:`.mcq.Score` of ``module`` on the benchmark."""
    from .mcq import causal_lm_logprobs, score

    module.eval()
    # the model's whole context (its position table), as the harness does: a question's passage
    # may be longer than the training windows
    fn = causal_lm_logprobs(lambda ids: module(ids.to(device)).cpu(), max_len=module.cfg.max_seq_len)
    return score(fn, questions(scenario))


def scores(module, rows: torch.Tensor, val_data, scenario, device, prefix: str = "") -> dict:
    """``{prefix}val_loss`` (nats/token), ``val_bits_per_byte``, ``mc_accuracy`` (acc_norm) with
    its 95% interval and chance, and ``metric`` (the accuracy) of ``module``."""
    from .data import bits_per_byte

    nll = mean_nll(module, rows, device)
    mc = multiple_choice(module, scenario, device)
    out = {"val_loss": nll, "val_bits_per_byte": bits_per_byte(nll, val_data), "mc_accuracy": mc.acc_norm,
           "mc_ci_low": mc.ci95[0], "mc_ci_high": mc.ci95[1], "mc_chance": mc.chance, "mc_questions": float(mc.n)}
    out = {prefix + k: float(v) for k, v in out.items()}
    if not prefix:
        out["metric"] = out["mc_accuracy"]
    return out
