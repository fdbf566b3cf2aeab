"""digits: scikit-learn's bundled 8x8 handwritten digits (1797 images, 10 classes).

The data ships inside scikit-learn, so nothing is downloaded. A fixed stratified split
(seed 0, the same for every scenario seed so all runs are measured on one test set):
60 % train, 20 % validation (the validators' held-out data), 20 % test (the benchmark's
final metric, never seen by any decision). Pixels are scaled to [0, 1].

Models (``workload.model`` or, per agent, ``agents.architectures``):

- ``mlp``: 64 -> 64 -> 10, ReLU.
- ``mlp-wide``: 64 -> 128 -> 10, ReLU.
- ``cnn``: conv 3x3 (8 ch) -> conv 3x3 stride 2 (16 ch) -> linear 10.
- ``transformer``: the 8 pixel rows as 8 tokens of 8 features -> linear 32 + learned
  positions -> one encoder layer (4 heads, feed-forward 64, pre-norm) -> mean -> linear 10.
- ``lstm``: the 8 rows as a sequence -> LSTM (hidden 32) -> last hidden state -> linear 10.

Mixing them (``agents.architectures: [transformer, transformer, lstm, mlp]``) gives
heterogeneous agents: the cooperative program shares gradients and fuses parameters
only inside an architecture group; knowledge crosses groups through outputs.

Every agent of one architecture starts from the same base model (initialised from the
scenario seed: the agents are clones); agents differ by their data order (seeded by
scenario seed and rank) and by the hyperparameters the program gives them. Each agent
draws its batches (``workload.global_batch / agents.count`` samples) from the whole
training set in its own order: statistically the same as sharding it.

Reward-shaped loss (cooperative program, ``cooperation.rewards.shape_loss``): after each
fusion round's parameter all-gather the program hands the agent a frozen snapshot of the
other (healthy) agents' parameters (``set_peers``) and the scheduled reward weights
(``set_reward_weights``); its local steps then minimise
:func:`oresearcher.tasks.rewards.shaped_loss` against the peers' mean prediction on the same
batch, with the peer term the program sets (``set_peer_term``). Each peer forward pass is charged: ``fwd_flops`` grows by the measured forward
FLOPs of each peer's architecture on one batch. No snapshot (first round, one agent,
shaping off): plain cross-entropy.

Shared hard-example pool (``cooperation.replay``): with ``use_shared_replay`` a quarter of
every batch comes from the group's prioritized pool
(:class:`oresearcher.tasks.supervised.HardExamples`), and each sample's cross-entropy is its
priority.

Usage: ``make_learner(scenario, rank, mode="numeric")``.
"""
from __future__ import annotations

import functools

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from .datacache import cached_arrays
from ..errors import UserError
from . import agent_model
from .supervised import HardExamples, ShuffledBatches, expected_calibration_error
from .spec import Task
from ..models.learner import DTYPES, TorchLearner
from .rewards import overconfident_error_safety, shaped_loss
from ..models.workloads import measure_module
from ..seeds import SMALL, derive, name_salt

N_CLASSES = 10


def build_model(name: str) -> nn.Module:
    if name == "mlp":
        return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, N_CLASSES))
    if name == "mlp-wide":
        return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, N_CLASSES))
    if name == "cnn":
        return nn.Sequential(
            nn.Unflatten(1, (1, 8, 8)),
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(),
            nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(),  # [B, 16, 4, 4]
            nn.Flatten(), nn.Linear(16 * 4 * 4, N_CLASSES))
    if name == "transformer":
        return RowTransformer()
    if name == "lstm":
        return RowLSTM()
    raise UserError(f"workload.model: digits has models {', '.join(MODELS)} (got {name!r})")


MODELS = ("mlp", "mlp-wide", "cnn", "transformer", "lstm")
# how raw inputs become model inputs (written into an exported model's JSON, oresearcher.export)
PREPROCESSING = {"input": "an 8x8 grey image as sklearn.datasets.load_digits gives it (values 0-16), "
                          "flattened row-major to 64 values", "scale": "divide by 16 (to [0, 1])",
                 "dtype": "float32", "shape": [64], "output": "logits of the digits 0-9"}


class RowTransformer(nn.Module):
    """[B, 64] -> [B, 10]: pixel rows as tokens, one pre-norm encoder layer, mean pooled."""

    def __init__(self, d: int = 32, heads: int = 4):
        super().__init__()
        self.embed = nn.Linear(8, d)
        self.pos = nn.Parameter(torch.zeros(8, d))
        self.layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=2 * d, dropout=0.0,
                                                batch_first=True, norm_first=True)
        self.head = nn.Linear(d, N_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.embed(x.reshape(-1, 8, 8)) + self.pos  # [B, 8 rows, d]
        return self.head(self.layer(tokens).mean(1))


class RowLSTM(nn.Module):
    """[B, 64] -> [B, 10]: pixel rows read top to bottom by an LSTM, last hidden state.

    The cell is written out (two linears and the gate arithmetic, Hochreiter & Schmidhuber
    1997 with a forget gate) rather than nn.LSTM: torch's fused CPU kernel is invisible to
    the FLOP counter, which would price this agent at its head alone."""

    def __init__(self, hidden: int = 32):
        super().__init__()
        self.hidden = hidden
        self.ih, self.hh = nn.Linear(8, 4 * hidden), nn.Linear(hidden, 4 * hidden, bias=False)
        self.head = nn.Linear(hidden, N_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, 8, 8)  # [B, 8 steps, 8 features]
        h = c = rows.new_zeros(rows.shape[0], self.hidden)
        for t in range(rows.shape[1]):
            i, f, g, o = (self.ih(rows[:, t]) + self.hh(h)).chunk(4, dim=-1)
            c = f.sigmoid() * c + i.sigmoid() * g.tanh()
            h = o.sigmoid() * c.tanh()
        return self.head(h)


@functools.lru_cache(maxsize=1)
def load_splits() -> dict:
    """{"train"|"val"|"test": (X [N, 64] float32 in [0, 1], y [N] int64)}."""
    from importlib.metadata import version

    key = f"digits splits v1; scikit-learn {version('scikit-learn')}; numpy {np.__version__}"
    arrays = cached_arrays("digits", key, _split_arrays)  # skips importing sklearn (oresearcher.tasks.datacache)
    return {s: (torch.from_numpy(arrays[f"{s}_X"]), torch.from_numpy(arrays[f"{s}_y"]))
            for s in ("train", "val", "test")}


def _split_arrays() -> dict:
    """The split itself, from scikit-learn (what ``load_splits`` caches)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    X, y = data.data.astype("float32") / 16.0, data.target.astype("int64")
    X_tr, X_rest, y_tr, y_rest = train_test_split(X, y, test_size=0.4, random_state=0, stratify=y)
    X_val, X_te, y_val, y_te = train_test_split(X_rest, y_rest, test_size=0.5, random_state=0, stratify=y_rest)
    return {"train_X": X_tr, "train_y": y_tr, "val_X": X_val, "val_y": y_val, "test_X": X_te, "test_y": y_te}


def _loss(module, batch):
    x, y = batch
    return F.cross_entropy(module(x), y)


def _seed(scenario_seed: int, arch: str) -> int:
    return derive(scenario_seed, name_salt(arch))


class DigitsLearner(TorchLearner):
    """TorchLearner plus what the cooperative program asks of a task (held-out scoring)."""

    metric_name = "accuracy"
    replay_spec = {"x": ((64,), torch.float32), "y": ((), torch.int64)}  # one sample in the shared pool
    hard_fraction = 0.25  # of each batch drawn from the shared hard-example pool
    n_classes = N_CLASSES

    def __init__(self, arch: str, seed: int, rank: int, batch: int, lr: float, optimizer: str,
                 dtype: torch.dtype, bucket_bytes: int, device="cpu"):
        torch.manual_seed(_seed(seed, arch))
        module = build_model(arch).to(dtype)
        splits = load_splits()
        X, y = splits["train"]
        self.device = torch.device(device)
        opt = (torch.optim.AdamW(module.parameters(), lr=lr) if optimizer == "adamw"
               else torch.optim.SGD(module.parameters(), lr=lr, momentum=0.9))
        fwd, bwd, _ = measure_module(module, (X[:batch].to(dtype),), lambda out: F.cross_entropy(out, y[:batch]))
        module.to(self.device)
        super().__init__(module, opt, ShuffledBatches(X.to(self.device, dtype), y.to(self.device), batch,
                                               derive(seed, rank, prime=1000)), self._shaped_loss,
                         fwd_flops=fwd, bwd_flops=bwd, bucket_bytes=bucket_bytes)
        self.arch, self.dtype_, self._scratch = arch, dtype, {}
        self.train_size = len(X)  # the private data of oresearcher.cooperation.privacy's sample rate
        self.shared_replay, self._per_sample = None, None
        self.base_fwd_flops, self._x_probe, self._peer_fwd = float(fwd), X[:batch].to(self.device, dtype), {}
        self.reward_weights, self.peers, self._peer_params = None, [], []
        self.peer_term, self.agreement = "diversity", 0.0  # the program sets the scenario's (set_peer_term)
        Xv = splits["val"][0].to(self.device, dtype)
        self.eval_flops = float(measure_module(self._module_for(arch), (Xv,), lambda o: o.sum())[0])

    def state_dict(self) -> dict:
        return {**super().state_dict(), "data": self.batches.state_dict(),
                "peers": [{"arch": a, "flat": f} for a, f in self.peers]}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if "data" in state:  # checkpoints from before the data stream was saved lack it
            data = state["data"]
            if "inner" in data and not isinstance(self.batches, HardExamples):  # saved with the hard-example
                self._hard_state, data = data, data["inner"]  # stream, which the program attaches later
            self.batches.load_state_dict(data)
        self.set_peers([(p["arch"], p["flat"]) for p in state.get("peers", [])])

    # ---- the reward-shaped loss -----------------------------------------------------

    def set_reward_weights(self, weights) -> None:
        """Scheduled (w_base, w_novelty, w_safety) for the next local steps (None: plain CE)."""
        self.reward_weights = None if weights is None else tuple(float(w) for w in weights)

    def set_peer_term(self, term: str, agreement: float) -> None:
        """The shaped loss's peer term (oresearcher.tasks.rewards.shaped_loss) and the
        agreement term's current weight."""
        self.peer_term, self.agreement = term, float(agreement)

    def set_peers(self, peers) -> None:
        """Freeze the peer ensemble: ``[(arch, flat params)]`` of the other agents, taken
        from the all-gather every rank received (so every backend builds the same one).
        Non-finite snapshots are dropped. Re-measures ``fwd_flops``: own pass + one per peer."""
        self.peers, self._peer_params = [], []
        with torch.random.fork_rng(devices=[]):  # building a template draws init weights
            for arch, flat in peers:
                module = self._module_for(arch)
                flat = flat.reshape(-1)[: self.arch_numel(arch)].detach().to(self.device, self.dtype_).clone()
                if not bool(torch.isfinite(flat).all()):
                    continue
                shapes = [(name, p.shape, p.numel()) for name, p in module.named_parameters()]
                chunks = flat.split([n for _, _, n in shapes])
                self.peers.append((arch, flat))
                self._peer_params.append((arch, {name: c.view(shape) for (name, shape, _), c in zip(shapes, chunks)}))
        self.fwd_flops = self.base_fwd_flops + sum(self._arch_fwd_flops(a) for a, _ in self.peers)

    def _arch_fwd_flops(self, arch: str) -> float:
        """Forward FLOPs of one ``arch`` model on one training batch (torch's counter)."""
        if arch not in self._peer_fwd:
            self._peer_fwd[arch] = float(measure_module(self._module_for(arch), (self._x_probe,),
                                                        lambda o: o.sum())[0])
        return self._peer_fwd[arch]

    def peer_probs(self, x: torch.Tensor) -> torch.Tensor | None:
        """Mean predicted distribution of the frozen peers on ``x`` ([B, 10]); None without peers."""
        if not self._peer_params:
            return None
        # eval mode always: the scratch modules are shared with the validators' scoring, and a
        # module's mode (train, or eval with its fused fast paths) must not depend on what ran last
        with torch.no_grad():
            probs = [functional_call(self._module_for(a).eval(), params, (x,)).float().softmax(-1)
                     for a, params in self._peer_params]
        return torch.stack(probs).mean(0)

    def _shaped_loss(self, module, batch):
        x, y = batch
        logits = module(x)
        self._per_sample = (logits.detach(), y)  # the hard-example pool's priorities
        if self.reward_weights is None or not self._peer_params:
            self._task_loss = None
            return F.cross_entropy(logits, y)
        self._task_loss = float(F.cross_entropy(logits.detach(), y))  # what the curve shows
        return shaped_loss(logits, y, self.peer_probs(x), self.reward_weights, self.peer_term, self.agreement)

    def private_loss_fn(self, module, batch):
        """The loss of :meth:`_shaped_loss` without recording the task loss (``vmap``
        forbids ``.item()``): what oresearcher.cooperation.privacy differentiates per sample."""
        x, y = batch
        if self.reward_weights is None or not self._peer_params:
            return _loss(module, batch)
        return shaped_loss(module(x), y, self.peer_probs(x), self.reward_weights, self.peer_term, self.agreement)

    def forward_backward(self) -> dict:
        """The step's loss, and its plain cross-entropy as ``task_loss`` (the same number
        unless the loss is reward-shaped): a figure compares tasks by the task's loss."""
        out = super().forward_backward()
        if self.shared_replay is not None:  # each sample's cross-entropy is its priority
            logits, y = self._per_sample
            self.batches.feedback(F.cross_entropy(logits.float(), y, reduction="none").cpu().numpy())
        task = getattr(self, "_task_loss", None)
        out["task_loss"] = out["loss"] if task is None else task
        return out

    def use_shared_replay(self, shared) -> None:
        """Draw part of every batch from ``shared`` (a SharedReplay) as hard examples."""
        self.shared_replay = shared
        self.batches = HardExamples(self.batches, shared, self.hard_fraction, seed=derive(shared.rank, 11, prime=SMALL))
        if getattr(self, "_hard_state", None):  # a resumed run: the stream's own generator too
            self.batches.g.set_state(self._hard_state["generator"])

    def arch_numel(self, arch: str) -> int:
        return sum(p.numel() for p in self._module_for(arch).parameters())

    def _module_for(self, arch: str) -> nn.Module:
        if arch not in self._scratch:
            self._scratch[arch] = build_model(arch).to(self.device, self.dtype_)
        return self._scratch[arch]

    def _score(self, module: nn.Module, split: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        X, y = load_splits()[split]
        module.eval()
        with torch.no_grad():
            logits = module(X.to(self.device, self.dtype_)).float().cpu()
        return logits, y, logits.softmax(-1)

    def evaluate(self) -> dict:
        """Test-set metrics of this agent (the benchmark's final metric)."""
        logits, y, _ = self._score(self.module, "test")
        acc = float((logits.argmax(-1) == y).float().mean())
        return {"test_accuracy": acc, "test_loss": float(F.cross_entropy(logits, y)), "metric": acc}

    # ---- what the trained ensemble and distillation ask (oresearcher.cooperation.ensemble, .distill) ----

    def heldout_labels(self, split: str = "val") -> torch.Tensor:
        return load_splits()[split][1]

    def task_data(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(X [N, 64] in this learner's dtype and device, y [N]) of ``split``."""
        X, y = load_splits()[split]
        return X.to(self.device, self.dtype_), y.to(self.device)

    def predict_params(self, flat: torch.Tensor, arch: str, X: torch.Tensor) -> tuple[torch.Tensor, float]:
        """(logits [N, 10] float32 on the CPU, forward FLOPs) of the ``arch`` model holding ``flat``."""
        module = self._module_for(arch)
        torch.nn.utils.vector_to_parameters(flat[: self.arch_numel(arch)].to(self.device, self.dtype_),
                                            module.parameters())
        module.eval()
        with torch.no_grad():
            logits = module(X).float().cpu()
        per_sample = self._arch_fwd_flops(arch) / max(1, len(self._x_probe))
        return logits, per_sample * len(X)

    def evaluate_params(self, flat: torch.Tensor, arch: str) -> dict:
        """Validator's view of one agent: its flat parameters on the validation split.

        Returns metric (accuracy), loss, calibration (ECE), safety (no confident errors),
        probs ([N_val, 10], for novelty) and flops (what this evaluation computed).
        """
        module = self._module_for(arch)
        torch.nn.utils.vector_to_parameters(flat[: self.arch_numel(arch)].to(self.device, self.dtype_),
                                            module.parameters())
        logits, y, probs = self._score(module, "val")
        if not torch.isfinite(logits).all():
            nan = float("nan")
            return {"metric": nan, "loss": nan, "calibration": nan, "safety": 0.0, "probs": probs,
                    "flops": self.eval_flops}
        return {
            "metric": float((logits.argmax(-1) == y).float().mean()),
            "loss": float(F.cross_entropy(logits, y)),
            "calibration": expected_calibration_error(probs, y),
            "safety": overconfident_error_safety(probs, y),
            "probs": probs,
            "flops": self.eval_flops,
        }


def make_learner(scenario, rank: int, *, mode: str, device="cpu") -> DigitsLearner:
    arch, batch = agent_model(scenario, rank, mode, MODELS)
    w = scenario.workload
    return DigitsLearner(arch, scenario.seed, rank, batch, scenario.training.lr, w.optimizer,
                         DTYPES[w.dtype], scenario.communication.bucket_bytes, device)


TASK = Task(name="digits", make_learner=make_learner, models=MODELS, build_model=build_model,
            preprocessing=lambda arch: PREPROCESSING, n_classes=N_CLASSES, replay="samples")
