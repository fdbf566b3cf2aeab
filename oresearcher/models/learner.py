"""Learners: the local half of an agent, behind one small interface.

A program (``oresearcher.programs``) decides *when* to compute and communicate; a
learner knows *what* one agent computes: its forward/backward on the next batch, its
gradients as flat buckets, its optimizer step, its flat parameter vector. Programs only
touch learners through Compute ops (so backends can time them) and through the buckets
they hand to collectives.

Two kinds:

The interface is :class:`Learner` (a Protocol: any object with these members is one).
What a learner may offer beyond it (scoring fused parameters, a shaped loss's peers, a
replay pool, sharded checkpoints...) is declared on :class:`LearnerBase` with the value
that means "not offered"; a task's learner overrides what it has, and programs read the
declaration instead of probing with ``hasattr``:

- :class:`TorchLearner` wraps a real ``nn.Module`` (numeric simulation and real runs).
- :class:`ShapeLearner` has only sizes and FLOP counts (shape mode): its buckets are
  meta tensors, so a 70B model costs nothing to simulate.

Gradient buckets follow torch DDP (:func:`oresearcher.models.workloads.bucket_sizes`):
parameters in reverse registration order, a 1 MiB first bucket, then buckets of
``bucket_bytes`` (Li et al., "PyTorch Distributed", VLDB 2020, section 3.2.3).
"""
from __future__ import annotations

from typing import Callable, Iterator, Optional, Protocol, Sequence, runtime_checkable

import torch
from torch import nn

from .workloads import DTYPES, bucket_sizes  # noqa: F401 (DTYPES: importable from here too)


@runtime_checkable
class Learner(Protocol):
    """What every program may ask of an agent's local half (shape or numeric)."""

    numel: int  # parameters
    fwd_flops: float  # FLOPs of one forward pass on one batch (what the simulator charges)
    bwd_flops: float  # of one backward pass (recomputation included)

    def forward_backward(self) -> dict:
        """Forward and backward on the next batch; metrics such as ``{"loss": ...}``."""

    def grad_buckets(self) -> list[torch.Tensor]:
        """The gradients as flat buckets, DDP's order (meta tensors in shape mode)."""

    def apply_grads(self, buckets: list[torch.Tensor]) -> None:
        """Replace the gradients by ``buckets`` (what the exchange returned)."""

    def optimizer_step(self) -> None: ...

    def flat_params(self) -> torch.Tensor:
        """All parameters as one flat vector (a copy)."""

    def set_flat_params(self, flat: torch.Tensor) -> None: ...

    def evaluate(self) -> dict:
        """Held-out metrics (empty in shape mode)."""


class LearnerBase:
    """What a learner may offer beyond :class:`Learner`, declared with its "not offered"
    value: None for a capability (a method in the learners that have it), a plain default
    for a number."""

    arch: Optional[str] = None  # the agent's model name (tasks with several)
    module = None  # the nn.Module (None: shape mode, sizes only)
    optimizer = None  # the torch optimizer (None: nothing to step, copy or checkpoint)
    params: Sequence = ()  # the trainable parameters
    batches = None  # the data stream
    device = None  # where its tensors live (None: wherever the caller's are)
    sharded = False  # FSDP2: save_sharded/load_sharded checkpoints through DCP (oresearcher.backends.fsdp.learner)
    restorable = False  # state_dict/load_state_dict hold its whole training state
    cooperative_result = None  # set by the cooperative program at its end (the fused run's agents)
    distill_result = None  # set by the distillation phase (the student and its metrics)
    train_size: Optional[int] = None  # rows of its private training data (privacy's sample rate)
    replay_spec = None  # {field: (shape, dtype)} of one entry in the shared replay pool
    private_loss_fn = None  # (module, batch) -> per-sample losses for DP-SGD (None: loss_fn)
    reduce_check = None  # FSDP2's check of the reduced gradients (.take(): a non-finite one since last asked)
    eval_flops = None  # FLOPs of scoring on the validation split (a float, or arch -> float)
    min_score_rows: Optional[int] = None  # fewest validation rows a subsample may have
    hard_fraction = 0.25  # of each batch drawn from a shared hard-example pool
    n_classes: Optional[int] = None  # classes it predicts (distillation, the ensemble)
    # scoring and predicting with given flat parameters (validators, the ensemble, distillation)
    evaluate_params: Optional[Callable] = None  # (flat, arch[, rows]) -> metrics
    predict_params: Optional[Callable] = None  # (flat, arch, X) -> (logits, FLOPs)
    task_data: Optional[Callable] = None  # (split) -> (X, y)
    heldout_labels: Optional[Callable] = None  # (split) -> labels
    val_size: Optional[Callable] = None  # (arch) -> rows of arch's own validation split
    # the cooperative program's knobs, for learners with a shaped loss, exploration or a replay pool
    set_peers: Optional[Callable] = None  # (peers) -> None: the shaped loss's peer ensemble (charged as an op)
    set_peer_term: Optional[Callable] = None  # (term, weight): the shaped loss's peer term and agreement weight
    set_reward_weights: Optional[Callable] = None  # (weights): task, novelty and safety weights of the shaped loss
    set_exploration: Optional[Callable] = None  # (scale): an explorer's exploration scale
    set_fixed_epsilon: Optional[Callable] = None  # (epsilon): Ape-X's per-agent exploration epsilon
    use_shared_replay: Optional[Callable] = None  # (shared): draw from the shared replay pool

    def arch_numel(self, arch: str) -> int:
        """Parameters of model ``arch`` (a learner of one model: its own)."""
        return self.numel


class ShapeLearner(LearnerBase):
    """Sizes and FLOPs only; every tensor it hands out lives on the meta device."""

    def __init__(self, param_numels: Sequence[int], fwd_flops: float, bwd_flops: float,
                 dtype: torch.dtype = torch.bfloat16, bucket_bytes: int = 25 * 10**6,
                 recompute_flops: float = 0.0):
        self.param_numels = tuple(int(n) for n in param_numels)
        self.numel = sum(self.param_numels)
        self.fwd_flops, self.bwd_flops = float(fwd_flops), float(bwd_flops) + float(recompute_flops)
        self.dtype = dtype
        self.buckets = bucket_sizes(self.param_numels, bucket_bytes, torch.empty((), dtype=dtype).element_size())
        # meta tensors hold no data: the same ones serve every step
        self._meta_buckets = [torch.empty(n, dtype=dtype, device="meta") for n in self.buckets]

    def forward_backward(self) -> dict:
        return {}

    def grad_buckets(self) -> list[torch.Tensor]:
        return list(self._meta_buckets)

    def apply_grads(self, buckets: list[torch.Tensor]) -> None:
        pass

    def flat_params(self) -> torch.Tensor:
        return torch.empty(self.numel, dtype=self.dtype, device="meta")

    def set_flat_params(self, flat: torch.Tensor) -> None:
        pass

    def optimizer_step(self) -> None:
        pass

    def evaluate(self) -> dict:
        return {}


class TorchLearner(LearnerBase):
    """A real module, its optimizer and its data stream.

    ``loss_fn(module, batch) -> scalar loss``; ``batches`` yields batches forever.
    ``step_flops`` is what the simulator charges per forward+backward; measure it with
    ``oresearcher.models.workloads`` (torch.utils.flop_counter), never by hand.

    Mixed precision (``autocast_dtype`` bf16/fp16, the module in fp32): the forward runs
    under ``torch.autocast``, the parameters, gradients and optimizer state stay fp32
    (master weights; AdamW 4 + 4 + 8 = 16 bytes/parameter, the total the simulator's
    memory model charges) and what goes on the wire is in the compute dtype, as the
    simulator charges it: gradient buckets are cast to it before the all-reduce (DDP's
    bf16_compress_hook) and cast back on apply; flat parameters are the compute-dtype
    copy, and setting them keeps each master's low-order residual below that precision
    (``master = new + (master - low(master))``), so averaging does not round the masters.
    """

    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer,
                 batches: Iterator, loss_fn: Callable, *, fwd_flops: float, bwd_flops: float,
                 bucket_bytes: int = 25 * 10**6, eval_fn: Callable | None = None,
                 autocast_dtype: torch.dtype | None = None):
        self.module, self.optimizer, self.batches, self.loss_fn = module, optimizer, batches, loss_fn
        self.fwd_flops, self.bwd_flops = float(fwd_flops), float(bwd_flops)
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.param_numels = tuple(p.numel() for p in self.params)
        self.numel = sum(self.param_numels)
        self.autocast = autocast_dtype
        self.dtype = autocast_dtype or self.params[0].dtype  # on the wire
        self.buckets = bucket_sizes(self.param_numels, bucket_bytes, torch.empty((), dtype=self.dtype).element_size())
        self.eval_fn = eval_fn

    restorable = True  # module and optimizer state (tasks add their data streams' positions)

    def forward_backward(self) -> dict:
        """Gradients of the loss on the next batch, left in ``p.grad``."""
        self.module.train()
        self.optimizer.zero_grad(set_to_none=False)
        batch = next(self.batches)
        if self.autocast is None:
            loss = self.loss_fn(self.module, batch)
        else:
            with torch.autocast(self.params[0].device.type, dtype=self.autocast):
                loss = self.loss_fn(self.module, batch)
        loss.backward()
        return {"loss": float(loss.detach())}

    def _flat_grads(self) -> torch.Tensor:
        # reverse registration order, matching bucket_sizes
        return torch.cat([
            (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in reversed(self.params)
        ]).to(self.dtype)

    def grad_buckets(self) -> list[torch.Tensor]:
        return list(self._flat_grads().split(self.buckets))

    def apply_grads(self, buckets: list[torch.Tensor]) -> None:
        """Write ``buckets`` back as the gradients and take one optimizer step."""
        flat = torch.cat([b.reshape(-1) for b in buckets])
        offset = 0
        for p in reversed(self.params):
            n = p.numel()
            p.grad = flat[offset:offset + n].view_as(p).to(p.dtype).clone()
            offset += n
        self.optimizer.step()

    def optimizer_step(self) -> None:
        """One optimizer step on the gradients already in ``p.grad``."""
        self.optimizer.step()

    def flat_params(self) -> torch.Tensor:
        return torch.nn.utils.parameters_to_vector(self.params).detach().to(self.dtype).clone()

    def set_flat_params(self, flat: torch.Tensor) -> None:
        master = self.params[0].dtype
        new = flat.to(master)
        if self.dtype != master:  # keep the masters' residual below the compute dtype
            old = torch.nn.utils.parameters_to_vector(self.params).detach()
            new = new + (old - old.to(self.dtype).to(master))
        torch.nn.utils.vector_to_parameters(new, self.params)

    def evaluate(self) -> dict:
        if self.eval_fn is None:
            return {}
        self.module.eval()
        with torch.no_grad():
            return dict(self.eval_fn(self.module))

    def state_dict(self) -> dict:
        return {"module": self.module.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict(state["module"])
        self.optimizer.load_state_dict(state["optimizer"])
