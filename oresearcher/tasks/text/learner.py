"""One text agent: a GPT of the family, cloned from the base, trained on the second corpus.

Every agent of one architecture starts from the same weights (the base checkpoint with
``init``, else one initialisation from the scenario seed): clones, as the seed's "load the
base pretrained model, clone N heterogeneous instances". What makes them heterogeneous:

- data order: each agent draws its own seeded order of windows (:class:`.data.Batches`, rank);
- dropout: residual dropout drawn per agent from ``options.dropout`` by the scenario seed;
- learning rate and role: the cooperative program's (``cooperation.roles.lr_range``, the role
  mix; explorers take a scaled learning rate and parameter noise, optimizers SAM or SWA);
- architecture, with ``agents.architectures`` (other presets of the family; they learn from
  the others through distillation, not fusion).

What the cooperative program asks of a learner (:mod:`oresearcher.programs.cooperative`):
``evaluate_params`` scores an agent's flat parameters on a fixed slice of the validation
split (metric: exp(-loss), the per-token geometric-mean probability of the truth, in [0, 1]
and decreasing with the loss; probs: next-token distributions at fixed positions for the
novelty term; calibration and safety over those positions). ``evaluate`` scores this agent
as the report shows it: validation loss in nats/token and bits/byte, and the multiple-choice
accuracy (:mod:`.evaluation`). The distillation phase is the task's own
(:mod:`.distill`): the teacher's token distributions cannot be precomputed as a classifier's.
"""
from __future__ import annotations

import torch

from ...errors import UserError
from ...models import lm_loss
from ...models.learner import DTYPES, TorchLearner
from ...models.workloads import per_rank_batch
from ...seeds import SMALL, derive, name_salt
from ..supervised import expected_calibration_error
from ..rewards import overconfident_error_safety
from . import evaluation as EV
from .model import add_dropout, build_model, load_checkpoint, model_config, step_cost

VAL_ROWS = 8  # validation windows a validator scores per agent per round
PROB_STRIDE = 8  # every 8th position's distribution goes into the novelty term


def agent_arch(scenario, rank: int) -> str:
    archs = scenario.agents.architectures
    return archs[rank] if archs else scenario.workload.model


def agent_dropout(seed: int, rank: int, lo: float, hi: float) -> float:
    """Residual dropout of agent ``rank``: uniform in [lo, hi], from the scenario seed."""
    g = torch.Generator().manual_seed(derive(seed, rank, 17, prime=SMALL))
    return float(lo + (hi - lo) * torch.rand((), generator=g, dtype=torch.float64))


def check_context(scenario) -> None:
    """workload.seq_len must fit every agent's learned position table (one line, exit 2)."""
    w = scenario.workload
    for arch in dict.fromkeys(scenario.agents.architectures or [w.model]):
        ctx = model_config(arch).max_seq_len
        if w.seq_len > ctx:
            raise UserError(f"workload.seq_len {w.seq_len} is longer than {arch}'s context of {ctx} tokens "
                            f"(its learned position table); set workload.seq_len <= {ctx}")


def initial_weights(opts, arch: str):
    """The checkpoint every agent of ``arch`` starts from, or None (a fresh initialisation)."""
    if opts.init == "none":
        return None
    if opts.init == "pretrain":
        from .pretrain import find_or_pretrain

        return find_or_pretrain(opts, arch)
    return opts.init


class TextLearner(TorchLearner):
    """TorchLearner plus the task's scoring (module doc)."""

    metric_name = "exp(-validation loss)"

    def __init__(self, scenario, rank: int, device="cpu"):
        from .data import batches, prepare, windows

        w, opts, seed = scenario.workload, scenario.workload.options, scenario.seed
        arch = agent_arch(scenario, rank)
        check_context(scenario)
        init = initial_weights(opts, arch)
        with torch.random.fork_rng(devices=[]):  # clones: one initialisation per architecture
            torch.manual_seed(derive(seed, name_salt(arch)))
            module = build_model(arch, opts.vocab_size)
        if init is not None:  # before the corpus is read: a checkpoint that does not fit costs nothing
            load_checkpoint(module, init, arch)
        data = lambda split: prepare(opts.corpus, split, opts.vocab_size, opts.cache_dir,  # noqa: E731
                                     opts.tokenizer_corpus)
        self.train_data, self.val_data = data("train"), data("validation")
        self.dropout = agent_dropout(seed, rank, *opts.dropout)
        add_dropout(module, self.dropout)
        module.to(device)
        mb = per_rank_batch(scenario)
        numels, fwd, bwd = step_cost(arch, opts.vocab_size, mb, w.seq_len, w.dtype)
        optimizer = (torch.optim.AdamW(module.parameters(), lr=scenario.training.lr, betas=(0.9, 0.95))
                     if w.optimizer == "adamw" else
                     torch.optim.SGD(module.parameters(), lr=scenario.training.lr, momentum=0.9))
        stream = batches(self.train_data, mb, w.seq_len, seed=seed, rank=rank)  # world 1: its own order
        super().__init__(module, optimizer, _OnDevice(stream, device), _loss, fwd_flops=fwd, bwd_flops=bwd,
                         bucket_bytes=scenario.communication.bucket_bytes,
                         autocast_dtype=None if w.dtype == "fp32" else DTYPES[w.dtype])
        self.scenario, self.arch, self.rank, self.device = scenario, arch, rank, torch.device(device)
        self.init = init
        self.train_size = len(self.train_data.tokens) // (w.seq_len + 1)  # windows: privacy's sample rate
        self.eval_rows = windows(self.val_data, w.seq_len, max_windows=max(1, opts.eval_tokens // w.seq_len))
        self.val_rows = self.eval_rows[:VAL_ROWS].to(device)
        self.tokens_per_step = mb * w.seq_len
        self._scratch, self._fwd_per_row = {}, fwd / mb
        self.eval_flops = self._fwd_per_row * len(self.val_rows)
        self.opt_steps = 0  # optimizer steps taken: the learning-rate schedule's clock

    def state_dict(self) -> dict:
        out = {**super().state_dict(), "data": self.batches.inner.state_dict()}
        return {**out, "opt_steps": self.opt_steps} if self.scheduled else out

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if "data" in state:
            self.batches.inner.load_state_dict(state["data"])
        self.opt_steps = int(state.get("opt_steps", 0))

    # ---- the learning-rate schedule (options.lr_schedule) --------------------------------

    @property
    def scheduled(self) -> bool:
        return self.scenario.workload.options.lr_schedule != "constant"

    def lr_factor(self) -> float:
        """The schedule's factor at this optimizer step (1 for ``constant``): the pretraining
        recipe's warm-up and cosine over ``training.steps`` (:func:`.pretrain.lr_at`)."""
        if not self.scheduled:
            return 1.0
        from .pretrain import lr_at

        return lr_at(self.opt_steps, self.scenario.training.steps, 1.0)

    def _scaled_step(self, step, *args) -> None:
        """``step(*args)`` with every group's rate times :meth:`lr_factor`, restored after:
        the program keeps setting the base rate (roles, PBT) as it does without a schedule."""
        f = self.lr_factor()
        groups = self.optimizer.param_groups
        base = [g["lr"] for g in groups]
        for g in groups:
            g["lr"] = g["lr"] * f
        try:
            step(*args)
        finally:
            for g, lr in zip(groups, base):
                g["lr"] = lr
            self.opt_steps += 1

    def optimizer_step(self) -> None:
        if not self.scheduled:
            return super().optimizer_step()
        self._scaled_step(super().optimizer_step)

    def apply_grads(self, buckets) -> None:
        if not self.scheduled:
            return super().apply_grads(buckets)
        self._scaled_step(super().apply_grads, buckets)

    @property
    def epochs(self) -> float:
        """Passes over the training split so far."""
        return self.batches.inner.epochs

    def forward_backward(self) -> dict:
        out = super().forward_backward()
        out["epochs"] = self.epochs
        return out

    # ---- scoring ---------------------------------------------------------------------

    def evaluate(self) -> dict:
        """This agent on the validation split and the multiple-choice benchmark."""
        return EV.scores(self.module, self.eval_rows, self.val_data, self.scenario, self.device)

    def arch_numel(self, arch: str) -> int:
        return sum(p.numel() for p in self._module_for(arch).parameters())

    def _module_for(self, arch: str):
        if arch not in self._scratch:
            with torch.random.fork_rng(devices=[]):  # built to be overwritten: no draw on the global stream
                self._scratch[arch] = build_model(arch, self.scenario.workload.options.vocab_size).to(self.device)
        return self._scratch[arch]

    def module_with(self, flat: torch.Tensor, arch: str):
        """The scratch ``arch`` model holding flat parameters ``flat`` (eval mode)."""
        module = self._module_for(arch)
        torch.nn.utils.vector_to_parameters(flat.reshape(-1)[: self.arch_numel(arch)].to(self.device, torch.float32),
                                            module.parameters())
        return module.eval()

    @torch.no_grad()
    def evaluate_params(self, flat: torch.Tensor, arch: str) -> dict:
        """A validator's view of one agent (module doc)."""
        module = self.module_with(flat, arch)
        x = self.val_rows
        logits = module(x[:, :-1]).float()
        loss = float(lm_loss(logits, x[:, 1:]))
        probs = logits[:, ::PROB_STRIDE].softmax(-1).flatten(0, 1).cpu()  # [positions, V]
        labels = x[:, 1:][:, ::PROB_STRIDE].flatten().cpu()
        if not torch.isfinite(logits).all():
            nan = float("nan")
            return {"metric": nan, "loss": nan, "calibration": nan, "safety": 0.0, "probs": probs,
                    "flops": self.eval_flops}
        return {"metric": float(torch.exp(torch.tensor(-loss))), "loss": loss,
                "calibration": expected_calibration_error(probs, labels),
                "safety": overconfident_error_safety(probs, labels), "probs": probs, "flops": self.eval_flops}


class _OnDevice:
    """The batch stream, moved to the learner's device (resumable through ``inner``)."""

    def __init__(self, inner, device):
        self.inner, self.device = inner, torch.device(device)
        self.batch = inner.batch

    def __iter__(self):
        return self

    def __next__(self) -> torch.Tensor:
        return next(self.inner).to(self.device, non_blocking=True)


def _loss(module, batch):
    return lm_loss(module(batch[:, :-1]), batch[:, 1:])
