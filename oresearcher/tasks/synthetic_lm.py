"""synthetic-lm: a language-model preset trained on a synthetic token stream.

The simulator's scenarios name transformer presets (``oresearcher.models.PRESETS``) with
no dataset behind them. Real runs train them on a generated stream so the identical
scenario can be simulated and then measured. The stream is a noisy first-order Markov
chain: with probability ``1 - noise`` the next token is ``perm[token]`` for a fixed random
permutation drawn from the scenario seed, otherwise uniform. It is learnable (the loss
falls from log V towards the chain's entropy), costs nothing to generate and is the same
on every backend. :mod:`oresearcher.tasks.token_stream` generates it without a loop per
position and, on CUDA, prefetches it in a background thread.

In shape mode the learner is a :class:`ShapeLearner` with the FLOPs and parameter sizes
measured by :func:`oresearcher.models.workloads.measure_lm` on the meta device.
"""
from __future__ import annotations

import torch

from ..models import PRESETS, build_model, lm_loss
from ..models.learner import DTYPES, ShapeLearner, TorchLearner
from ..models.workloads import measure_lm, per_rank_batch
from .token_stream import NOISE, Prefetcher, TokenStream  # noqa: F401  (TokenStream: public here too)

SHAPE_MODE = True  # presets priced on the meta device (oresearcher.tasks.shape_mode)


def token_stream(vocab: int, batch: int, seq_len: int, seed: int, rank: int, noise: float = NOISE) -> TokenStream:
    """Infinite iterator of LongTensor[batch, seq_len + 1] (inputs + shifted targets)."""
    return TokenStream(vocab, batch, seq_len, seed, rank, noise)


class LMLearner(TorchLearner):
    """TorchLearner whose checkpoints also hold the token stream's position."""

    def state_dict(self) -> dict:
        return {**super().state_dict(), "data": self.batches.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if "data" in state:
            self.batches.load_state_dict(state["data"])


def make_learner(scenario, rank: int, *, mode: str, device="cpu"):
    w, comm = scenario.workload, scenario.communication
    if w.model not in PRESETS:
        raise ValueError(f"workload.model: unknown model preset {w.model!r}; known: {', '.join(PRESETS)}")
    mb = per_rank_batch(scenario)
    cost = measure_lm(w.model, mb, w.seq_len, w.dtype, w.activation_checkpointing)
    if mode == "shape":
        return ShapeLearner(cost.param_numels, cost.fwd_flops, cost.bwd_flops, DTYPES[w.dtype],
                            comm.bucket_bytes, recompute_flops=cost.recompute_flops)
    torch.manual_seed(scenario.seed)  # every agent starts as a clone of one base model
    # mixed precision, as the simulator charges it: fp32 master weights and optimizer state,
    # 16-bit compute under autocast (TorchLearner)
    model = build_model(w.model, device=device, dtype=torch.float32)
    model.activation_checkpointing = w.activation_checkpointing
    vocab = PRESETS[w.model].vocab_size
    batches = TokenStream(vocab, mb, w.seq_len, scenario.seed, rank, device=device)
    if torch.device(device).type == "cuda":
        # off the critical path: the next batches are drawn, pinned and copied while the
        # GPU runs this step. On a CPU the thread would only take cores from the step.
        batches = Prefetcher(batches)
    optimizer = (torch.optim.AdamW(model.parameters(), lr=scenario.training.lr) if w.optimizer == "adamw"
                 # momentum as every other task's SGD, and the one fp32 buffer sim/memory.py charges
                 else torch.optim.SGD(model.parameters(), lr=scenario.training.lr, momentum=0.9))

    def loss_fn(module, batch):
        return lm_loss(module(batch[:, :-1]), batch[:, 1:])

    return LMLearner(model, optimizer, batches, loss_fn, fwd_flops=cost.fwd_flops,
                        bwd_flops=cost.bwd_flops + cost.recompute_flops, bucket_bytes=comm.bucket_bytes,
                        autocast_dtype=None if w.dtype == "fp32" else DTYPES[w.dtype])
