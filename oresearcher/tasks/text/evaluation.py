"""How a text model is scored in the reports: validation loss in nats per token and in bits
per byte (:func:`.data.bits_per_byte`: comparable across tokenizers), and accuracy on the
multiple-choice benchmark (:mod:`.mcq`: k-way questions from the test documents of both
corpora, the agents' and the pretraining one, half each; length-normalized log-likelihood,
95% Wilson interval, chance 1/k; each corpus's accuracy reported beside the whole set's).

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
def _questions(corpus: str, vocab: int, cache_dir, tokenizer_corpus: str, k: int, n: int, seed: int,
               max_tokens: int):
    from .data import prepare
    from .mcq import build_questions

    return build_questions(prepare(corpus, "test", vocab, cache_dir, tokenizer_corpus), k=k, n=n, seed=seed,
                           max_tokens=max_tokens)


def questions(scenario):
    """The benchmark's questions for ``scenario`` (module doc): ``mc_questions`` in all, the
    agents' corpus first (it takes the odd one), then the pretraining corpus where it differs.
    A question whose choice does not fit the training window with one token of context
    (``seq_len - 1`` tokens) is not asked: no model of the run could score it."""
    o = scenario.workload.options
    corpora = list(dict.fromkeys((o.corpus, o.pretrain.corpus)))
    seed = derive(scenario.seed, 41, prime=STREAM)
    ns = [-(-o.mc_questions // len(corpora))] + [o.mc_questions // len(corpora)] * (len(corpora) - 1)
    fits = scenario.workload.seq_len - 1
    sets = [_questions(c, o.vocab_size, o.cache_dir, o.tokenizer_corpus, o.mc_choices, n, seed, fits)
            for c, n in zip(corpora, ns) if n]
    return sum(sets[1:], sets[0])


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
    out.update({f"mc_accuracy_{c}": b["acc_norm"] for c, b in mc.by_corpus.items()})
    out = {prefix + k: float(v) for k, v in out.items()}
    if not prefix:
        out["metric"] = out["mc_accuracy"]
    return out
