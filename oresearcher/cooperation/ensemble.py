"""The trained attention ensemble over the agents' outputs.

Agents of different architectures cannot average parameters; what they share is their
*outputs*. :class:`EnsembleState` holds a :class:`oresearcher.cooperation.fusion.HeterogeneousEnsemble`
over all n agents -- per-agent projections of each agent's log-probabilities [N, C] to
``d_model``, multi-head attention (8 heads) over the agent axis, the mean over agents and
a linear head back to C logits -- and fits it on held-out data at every fusion round:

    minimise  CE(ensemble(log p_1 .. log p_n), y)   over the validation split,

where p_k are agent k's predicted distributions on that split (the validators' data;
test data stays unseen). Before any fitting it equals the plain mean of the agents'
log-probabilities (the product-of-experts average, ``init="average"``), so fitting can
only move away from that baseline, and it does so only as far as it helps: every third
validation sample is held back, and the fit keeps the epoch with the lowest held-back
loss, epoch 0 (where it started) included. It starts from the better, on the held-back
samples, of last round's weights and the plain mean, so a group whose agents changed
since can fall back.

Each fitting step leaves one random agent out half the time (its key masked, out of the
mean), so leave-one-out predictions stay in distribution: the novelty reward compares
agent j with the ensemble of the others, ``ensemble(..., present without j)``
(:func:`loo_novelty`). Diverged agents are left out by the same mask.

One rank fits (the first validator, which scores every agent anyway) and a Broadcast
hands the weights to every rank: the fit (about as many FLOPs as a few hundred local
steps of these small agents) is paid once, not once per rank. The weights are a State
object checkpointed with the run (:meth:`EnsembleState.state_dict`), and the distillation
teacher (:mod:`oresearcher.cooperation.distill`) is the ensemble fitted on the final agents.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from .fusion import HeterogeneousEnsemble
from ..ops import Broadcast, Compute
from ..tasks.rewards import tv_novelty
from ..seeds import SMALL, derive

EPS = 1e-12
DROP = 0.5


def as_inputs(probs: torch.Tensor) -> torch.Tensor:
    """The ensemble's input for one agent: log-probabilities [N, C] (float32)."""
    return probs.float().clamp_min(EPS).log()


class EnsembleState:
    """The ensemble's weights and fitting schedule (hyperparameters from
    ``cooperation.ensemble``); ``fits`` counts rounds fitted (it seeds the agent dropout)."""

    def __init__(self, n_agents: int, width: int, *, d_model: int = 16, n_heads: int = 8, epochs: int = 50,
                 lr: float = 0.03, seed: int = 0):
        self.n, self.width, self.d_model, self.n_heads = n_agents, width, d_model, n_heads
        self.epochs, self.lr, self.seed, self.fits = epochs, lr, seed, 0
        self.model = self._fresh()

    def _fresh(self) -> HeterogeneousEnsemble:
        with torch.random.fork_rng(devices=[]):  # init draws are all overwritten: keep them off the global stream
            return HeterogeneousEnsemble([self.width] * self.n, self.d_model, self.n_heads, out_width=self.width)

    # ---- use ---------------------------------------------------------------------------
    @torch.no_grad()
    def predict(self, probs: list, present=None) -> torch.Tensor:
        """Ensemble logits [N, C] from each agent's probabilities (None where absent)."""
        keep = self._present(probs, present)
        self.model.eval()
        return self.model(self._inputs(probs), keep)

    def _inputs(self, probs: list) -> list:
        ref = next(p for p in probs if p is not None)
        return [as_inputs(p) if p is not None else torch.zeros_like(ref, dtype=torch.float32) for p in probs]

    def _present(self, probs: list, present) -> torch.Tensor:
        keep = torch.tensor([p is not None for p in probs]) if present is None else torch.as_tensor(present,
                                                                                                     dtype=torch.bool)
        return keep & torch.tensor([p is not None and bool(torch.isfinite(p).all()) for p in probs])

    # ---- fitting -----------------------------------------------------------------------
    def fit(self, probs: list, labels: torch.Tensor, present=None) -> dict:
        """Fit on held-out ``probs`` (per agent [N, C], None or NaN where absent) and ``labels``."""
        keep = self._present(probs, present)
        if int(keep.sum()) == 0:
            return {}
        x, y = self._inputs(probs), labels.long()
        idx = torch.arange(len(y))
        tr, ho = idx[idx % 3 != 2], idx[idx % 3 == 2]
        part = lambda rows: [t[rows] for t in x]  # noqa: E731
        held = lambda m: float(F.cross_entropy(m(part(ho), keep), y[ho]))  # noqa: E731
        fresh = self._fresh()
        with torch.no_grad():
            start = min((self.model, fresh), key=held)  # ties: last round's weights
            mean_loss = held(fresh)
        model, best_epoch = copy.deepcopy(start), 0
        with torch.no_grad():
            best, best_loss = copy.deepcopy(model.state_dict()), held(model)
        g = torch.Generator().manual_seed(derive(self.seed, self.fits, prime=SMALL))
        _break_symmetry(model, self.width, g)
        opt = torch.optim.AdamW(model.parameters(), lr=self.lr, weight_decay=1e-4)
        healthy = torch.nonzero(keep).reshape(-1)
        for epoch in range(1, self.epochs + 1):
            model.train()
            mask = keep.clone()
            if len(healthy) > 1 and float(torch.rand((), generator=g)) < DROP:
                mask[healthy[int(torch.randint(len(healthy), (), generator=g))]] = False
            loss = F.cross_entropy(model(part(tr), mask), y[tr])
            opt.zero_grad()
            loss.backward()
            opt.step()
            with torch.no_grad():
                now = held(model)
            if now < best_loss:
                best, best_loss, best_epoch = copy.deepcopy(model.state_dict()), now, epoch
        model.load_state_dict(best)
        self.model, self.fits = model, self.fits + 1
        return {"ensemble_heldout_loss": best_loss, "mean_heldout_loss": mean_loss,
                "ensemble_epoch": float(best_epoch)}

    def fit_flops(self, n_samples: int) -> float:
        """FLOPs of one :meth:`fit`: per epoch a forward-backward (3x forward) on two thirds
        of the samples and a forward on the held-back third; matmuls only (2 per MAC)."""
        d, c, n = self.d_model, self.width, self.n
        per_sample = 2 * (n * c * d + 3 * n * d * d + 2 * n * n * d + n * d * d + d * c)
        return float(per_sample * n_samples * (self.epochs + 2) * (3 * 2 / 3 + 1 / 3))

    # ---- one message: weights, fit count and the fit's figures ---------------------------
    FIGURES = ("ensemble_heldout_loss", "mean_heldout_loss", "ensemble_epoch")

    def pack(self, info: dict) -> torch.Tensor:
        """[P + 1 + 3] float64: the weights, ``fits`` and the fit's figures (NaN if none)."""
        tail = [float(self.fits)] + [float(info.get(k, float("nan"))) for k in self.FIGURES]
        return torch.cat([torch.nn.utils.parameters_to_vector(self.model.parameters()).detach().double(),
                          torch.tensor(tail, dtype=torch.float64)])

    def unpack(self, vec: torch.Tensor) -> dict:
        """Load :meth:`pack`'s message; returns the fit's figures (empty if it did not fit)."""
        k = len(self.FIGURES)
        with torch.no_grad():
            torch.nn.utils.vector_to_parameters(vec[:-(k + 1)].float(), self.model.parameters())
        self.fits = int(vec[-(k + 1)])
        figures = {name: float(v) for name, v in zip(self.FIGURES, vec[-k:].tolist())}
        return {} if any(v != v for v in figures.values()) else figures

    # ---- state -------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"model": {k: v.clone() for k, v in self.model.state_dict().items()}, "fits": self.fits}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.fits = int(state["fits"])


@torch.no_grad()
def _break_symmetry(model: HeterogeneousEnsemble, width: int, g: torch.Generator, scale: float = 0.01) -> None:
    """Small seeded noise where the plain-mean start is a saddle: with queries and keys 0
    their gradients are 0 too (attention would stay uniform for ever), and the columns
    beyond the classes' ``width`` carry nothing and receive nothing."""
    d = model.attn.embed_dim
    w = model.attn.in_proj_weight  # [3d, d]: q, k, v
    w[:2 * d] += scale * torch.randn(2 * d, d, generator=g)
    for p in model.proj:
        p.weight[width:] += scale * torch.randn(d - width, p.in_features, generator=g) if d > width else 0.0
    if model.head is not None and d > width:
        model.head.weight[:, width:] += scale * torch.randn(model.head.out_features, d - width, generator=g)


def loo_novelty(ens: EnsembleState, probs: list) -> list[float]:
    """Each agent's TV distance to the trained ensemble of the others (in [0, 1])."""
    n = len(probs)
    if n < 2:
        return [0.0] * n
    out = []
    for j in range(n):
        present = torch.tensor([k != j for k in range(n)])
        if not bool(ens._present(probs, present).any()) or probs[j] is None:
            out.append(0.0)
            continue
        ref = ens.predict(probs, present).softmax(-1)
        out.append(float(tv_novelty(probs[j].float(), ref)))
    return out


def from_scenario(sc, n_classes: int) -> EnsembleState:
    e = sc.cooperation.ensemble
    return EnsembleState(sc.world_size, n_classes, d_model=e.d_model, n_heads=e.heads, epochs=e.epochs, lr=e.lr,
                         seed=sc.seed)


def fitter_rank(roles: list) -> int:
    """The rank that fits: the first validator (it scores every agent anyway), else rank 0."""
    return next((i for i, r in enumerate(roles) if r == "validator"), 0)


def fit_round(ens: EnsembleState, learner, flats: list, ids: list, excluded, rank: int, fitter: int):
    """Generator of ops. Rank ``fitter`` evaluates every healthy agent on the held-out
    split (charged) and fits (charged :meth:`EnsembleState.fit_flops`); a Broadcast hands
    the weights and the fit's figures to every rank, so all hold the same ensemble and
    the fit is paid once. Returns the fit's metrics."""
    vec = ens.pack({})
    if rank == fitter:
        probs = []
        for j, flat in enumerate(flats):
            if bool(excluded[j]):
                probs.append(None)
                continue
            res = yield Compute(learner.evaluate_params, flat, ids[j], name="ensemble_outputs")
            yield Compute(flops=float(res.get("flops", 0.0)), name="ensemble_outputs")
            probs.append(res["probs"])
        labels = learner.heldout_labels()
        info = yield Compute(ens.fit, probs, labels, flops=ens.fit_flops(len(labels)), name="ensemble_fit")
        vec = ens.pack(info or {})
    vec = yield Broadcast(vec.to(vec.device if learner.device is None else learner.device), src=fitter,
                          name="ensemble_broadcast")
    return ens.unpack(vec.cpu())
