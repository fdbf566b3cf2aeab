"""Differentially private gradient sharing (``cooperation.privacy``): DP-SGD per agent.

Peers do not trust each other and there is no trusted aggregator, so every agent
privatises its own gradient before it leaves (Abadi et al., "Deep Learning with
Differential Privacy", CCS 2016, algorithm 1):

1. per-sample gradients g_i of the agent's loss on its batch of B samples: opacus'
   ``GradSampleModule`` hooks (one ordinary backward; each layer's per-sample weight
   gradients from its saved activations and backprops), or ``torch.func.vmap`` over
   ``grad`` for a model opacus refuses (the same products either way),
2. each clipped to L2 norm at most C:  g_i * min(1, C / (||g_i|| + 1e-6)),
3. summed, plus Gaussian noise N(0, (sigma C)^2 I) drawn by the agent itself,
4. divided by B; the result is left in ``p.grad`` like any other gradient.

The program then compresses and shares it (``communication.codec``): compression acts
on the already noised gradient, so it is post-processing and keeps the guarantee (the
order is tested). With privacy on, *every* local step uses this gradient, shared or not,
so the parameters the fusion rounds gather are post-processing too.

Accounting: opacus' accountants (RDP by default, PRV selectable) over the history
[(sigma, q, steps)], q = B / N the agent's sample rate (N: its private data). Epsilon is
per agent, at the scenario's delta; a ``target_epsilon`` picks sigma with opacus'
``get_noise_multiplier`` for ``training.steps`` steps. Caveats, stated rather than
hidden: the accountants assume Poisson subsampling, while tasks draw shuffled fixed-size
batches (the usual approximation, as in Abadi et al.); an agent the allocator gives more
than ``training.steps`` steps spends more than the target (the reported epsilon is what it
actually spent); the noise comes from a seeded ``torch.Generator`` so the simulator and the
real backends agree bit for bit -- a deployment would draw it from a secure generator.

Cost charged by the simulator per private step (:func:`private_step_flops`): the plain
forward+backward FLOPs (the per-sample weight gradients are the batched weight gradient's
products, not summed; torch's FLOP counter counts the vmap'd computation exactly as the
batched one), plus ``CLIP_OPS_PER_ELEMENT`` x B x D for the per-sample norms, the clip
scaling and the sum over B, plus ``NOISE_OPS_PER_ELEMENT`` x D for the noise. The
per-sample gradients also take B x D extra memory, which the memory model does not count.
"""
from __future__ import annotations

import math
import warnings
import weakref
from typing import Callable

import torch
from torch.func import functional_call, grad_and_value, vmap

from ..seeds import LARGE, SMALL, derive

ACCOUNTANTS = ("rdp", "prv")
# elementwise work on the [B, D] per-sample gradients: square, add (norms), multiply
# (clip scale), add (sum over B); the charge follows the codecs' convention
# (oresearcher.codecs.collectives): operations per element at the device's FLOP rate
CLIP_OPS_PER_ELEMENT = 4
NOISE_OPS_PER_ELEMENT = 4  # Gaussian draw (Box-Muller), scale, add, divide by B


# ---- pure math -------------------------------------------------------------------------

def clip_per_sample(grads: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """[B, D] per-sample gradients scaled to L2 norm <= clip_norm (opacus' rule)."""
    norms = grads.float().norm(dim=1)
    scale = (clip_norm / (norms + 1e-6)).clamp(max=1.0)
    return grads * scale.to(grads.dtype).unsqueeze(1)


def gaussian_noise(numel: int, std: float, generator: torch.Generator) -> torch.Tensor:
    """[numel] float32 N(0, std^2), on the CPU from ``generator`` (the same on every backend)."""
    return torch.randn(numel, generator=generator, dtype=torch.float32) * std


def privatize(grads: torch.Tensor, clip_norm: float, sigma: float, generator: torch.Generator) -> torch.Tensor:
    """[B, D] per-sample gradients -> [D] private mean: (sum of clipped + N(0, (sigma C)^2)) / B."""
    total = clip_per_sample(grads, clip_norm).sum(0)
    noise = gaussian_noise(total.numel(), sigma * clip_norm, generator).to(total.device, total.dtype)
    return (total + noise) / grads.shape[0]


def make_accountant(name: str):
    from opacus.accountants import PRVAccountant, RDPAccountant

    if name not in ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {name!r}")
    return RDPAccountant() if name == "rdp" else PRVAccountant()


def epsilon(sigma: float, sample_rate: float, steps: int, delta: float, accountant: str = "rdp") -> float:
    """Epsilon spent by ``steps`` subsampled Gaussian steps at ``delta`` (opacus' accountant)."""
    if steps <= 0:
        return 0.0
    if sigma <= 0:
        return math.inf
    acc = make_accountant(accountant)
    acc.history = [(float(sigma), float(sample_rate), int(steps))]
    return float(acc.get_epsilon(delta=delta))


def noise_multiplier(target_epsilon: float, delta: float, sample_rate: float, steps: int,
                     accountant: str = "rdp") -> float:
    """Sigma that spends ``target_epsilon`` in ``steps`` steps (opacus' get_noise_multiplier)."""
    from opacus.accountants.utils import get_noise_multiplier

    with warnings.catch_warnings():  # its search tries sigmas whose RDP optimum is the largest order
        warnings.simplefilter("ignore", UserWarning)
        return float(get_noise_multiplier(target_epsilon=target_epsilon, target_delta=delta, sample_rate=sample_rate,
                                          steps=steps, accountant=accountant, epsilon_tolerance=0.01))


def private_step_flops(fwd_bwd_flops: float, batch: int, numel: int) -> float:
    """What one private step costs the simulator (see the module doc)."""
    return float(fwd_bwd_flops) + CLIP_OPS_PER_ELEMENT * batch * numel + NOISE_OPS_PER_ELEMENT * numel


# ---- per-sample gradients ----------------------------------------------------------------

class _Bound:
    """Calls ``module`` with the given parameters (what a loss function sees as its module)."""

    def __init__(self, module, params, buffers):
        self.module, self.tensors = module, (params, buffers)

    def __call__(self, *args, **kwargs):
        return functional_call(self.module, self.tensors, args, kwargs)


_HOOKED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # module -> GradSampleModule | False


def grad_sample_module(module: torch.nn.Module):
    """opacus' per-sample hooks on ``module`` (added once), or None where opacus refuses a
    layer of it (e.g. BatchNorm mixes samples)."""
    if module not in _HOOKED:
        from opacus import GradSampleModule

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                _HOOKED[module] = GradSampleModule(module, batch_first=True, loss_reduction="mean")
        except Exception:  # opacus' validators raise their own types (NotImplementedError, ...)
            _HOOKED[module] = False
    return _HOOKED[module] or None


def hooked_per_sample_grads(module: torch.nn.Module, loss_fn: Callable, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """([B, D] per-sample flat gradients, mean loss) by one backward through opacus' hooks;
    ``loss_fn(module, batch)`` must be a mean over the samples. None if opacus refuses it."""
    if grad_sample_module(module) is None:
        return None
    module.train()  # opacus' hooks record activations in training mode only
    named = [p for p in module.parameters() if p.requires_grad]
    for p in named:
        p.grad, p.grad_sample = None, None
    loss = loss_fn(module, batch)
    with warnings.catch_warnings():  # torch notes the hooks fire on outputs only (inputs need no grad)
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        loss.backward()
    B = named[0].grad_sample.shape[0]
    grads = torch.cat([p.grad_sample.reshape(B, -1) for p in reversed(named)], dim=1)
    for p in named:
        p.grad_sample = None
    return grads, loss.detach()


def per_sample_grads(module: torch.nn.Module, loss_fn: Callable, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """([B, D] per-sample flat gradients, [B] losses) of ``loss_fn(module, batch_of_one)``
    by ``torch.func.vmap`` (any model; more per-op overhead than the hooks).

    Flat order is the learners' (reversed registration order, as their buckets). ``batch``
    is a tensor or a tuple of tensors with the samples along dim 0.
    """
    named = [(k, p) for k, p in module.named_parameters() if p.requires_grad]
    params = {k: p.detach() for k, p in named}
    buffers = {k: b.detach() for k, b in module.named_buffers()}
    single = not isinstance(batch, (tuple, list))
    samples = (batch,) if single else tuple(batch)

    def one(p, sample):
        rows = tuple(t.unsqueeze(0) for t in sample)
        return loss_fn(_Bound(module, p, buffers), rows[0] if single else rows)

    grads, losses = vmap(grad_and_value(one), in_dims=(None, 0), randomness="different")(params, samples)
    B = losses.shape[0]
    return torch.cat([grads[k].reshape(B, -1) for k, _ in reversed(named)], dim=1), losses


# ---- the agent's state and its step --------------------------------------------------

class PrivacyState:
    """One agent's DP-SGD mechanism: clip norm, sigma, sample rate, its noise generator
    and its accounting history. Checkpointed (``state_dict``) so a resumed agent draws
    the same noise and keeps counting."""

    def __init__(self, clip_norm: float, sigma: float, sample_rate: float, delta: float, accountant: str,
                 seed: int):
        self.clip_norm, self.sigma, self.sample_rate = float(clip_norm), float(sigma), float(sample_rate)
        self.delta, self.accountant = float(delta), accountant
        self.generator = torch.Generator().manual_seed(seed)
        self.steps, self.batch = 0, 1

    def epsilon(self) -> float:
        return epsilon(self.sigma, self.sample_rate, self.steps, self.delta, self.accountant)

    def state_dict(self) -> dict:
        return {"sigma": self.sigma, "steps": self.steps, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.sigma, self.steps = float(state["sigma"]), int(state["steps"])
        self.generator.set_state(state["generator"])


def from_scenario(scenario, rank: int, batch: int, dataset_size: int) -> PrivacyState:
    """The rank's mechanism: sigma given, or picked for ``training.steps`` at the target."""
    p = scenario.cooperation.privacy
    q = min(1.0, batch / dataset_size)
    sigma = p.noise_multiplier if p.target_epsilon is None else noise_multiplier(
        p.target_epsilon, p.delta, q, scenario.training.steps, p.accountant)
    state = PrivacyState(p.clip_norm, sigma, q, p.delta, p.accountant,
                         seed=derive(scenario.seed, rank, 3, prime=(SMALL, LARGE)))
    state.batch = int(batch)
    return state


def private_forward_backward(learner, state: PrivacyState) -> dict:
    """One private gradient of ``learner`` on its next batch, left in ``p.grad``.

    Per-sample gradients by opacus' hooks; where opacus refuses the model, by ``vmap``
    on ``learner.private_loss_fn`` if the learner has one (a loss that does not read values
    out with ``.item()``, which ``vmap`` forbids), else ``learner.loss_fn``.
    """
    state.steps += 1
    if learner.module is None:  # shape mode: sizes only, the step still counts
        return {}
    learner.module.train()
    batch = next(learner.batches)
    out = hooked_per_sample_grads(learner.module, learner.loss_fn, batch)
    if out is None:
        loss_fn = learner.private_loss_fn or learner.loss_fn
        out = per_sample_grads(learner.module, loss_fn, batch)
    grads, losses = out
    flat = privatize(grads, state.clip_norm, state.sigma, state.generator)
    offset = 0
    for p in reversed(learner.params):
        p.grad = flat[offset:offset + p.numel()].view_as(p).to(p.dtype).clone()
        offset += p.numel()
    clipped = float((grads.float().norm(dim=1) > state.clip_norm).float().mean())
    return {"loss": float(losses.mean()), "clipped_fraction": clipped}
