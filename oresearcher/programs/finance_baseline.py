"""The single credit model: what the finance cluster's deployed model is measured against.

For each credit dataset the baseline is one tabular Transformer trained alone (strategy
``single``, in the reference interpreter :mod:`oresearcher.testing`: the same math as the
simulator's numeric mode) on the same training data, for as many optimizer steps of the
same batch as the cluster's agents of that architecture took together: the same training
samples and the same training FLOPs (one step of one model costs the same in both). The
cluster's extra work (validators scoring every agent each round, fusion) is not given to
the baseline: it is the price of cooperating, and it favours the cluster.

The deployed cooperative model of a dataset is the fused model of its architecture (the
plain mean of its healthy final agents, :mod:`oresearcher.cooperation.deploy`). Both go
through the same compliance engine (a vetoed approval becomes a denial) and are scored on
the test split: accuracy, false approvals and false denials (fractions of all
applicants), veto rate, and the fairness gap |approval rate(protected) - approval
rate(not)| over the scenario's protected attribute (:mod:`oresearcher.tasks.finance_compliance`).

A finished ``python -m oresearcher.run`` of a finance scenario writes this comparison into
its report (``finance``, :func:`comparison`) and prints it (:func:`comparison_lines`);
``benchmarks/bench_finance.py`` repeats it over seeds.
"""
from __future__ import annotations

import math
import time

from ..models.workloads import per_rank_batch
from ..tasks import finance as T

DATASET = {"credit-transformer": "credit_data", "loan-transformer": "Boston HMDA"}
FIGURES = ("accuracy", "false_approval", "false_denial", "fairness_gap", "veto_rate")
LABELS = {"accuracy": "accuracy", "false_approval": "false approvals", "false_denial": "false denials",
          "fairness_gap": "fairness gap", "veto_rate": "vetoed"}


def train_programs(scenario):
    """Run ``scenario``'s program on every rank in the reference interpreter (real values,
    one process); (learners, each rank's StepDone records)."""
    from ..tasks import make_learner
    from ..testing import run_programs
    from . import AgentContext, get_program

    n = scenario.world_size
    learners = [make_learner(scenario, r, mode="numeric") for r in range(n)]
    prog = get_program(scenario.training.strategy)
    records = run_programs([prog(AgentContext(r, n, scenario, mode="numeric"), lr) for r, lr in enumerate(learners)])
    return learners, records


def single_overrides(arch: str, batch: int, steps: int) -> list[str]:
    """The fields that turn a finance scenario into one ``arch`` model trained alone for
    ``steps`` steps of ``batch`` samples (no evaluation, checkpoint or fault on the way)."""
    return ["training.strategy=single", "agents.count=1", "agents.roles=null", "agents.architectures=[]",
            "cluster.nodes=1", "cluster.gpus_per_node=1", f"workload.model={arch}", f"workload.global_batch={batch}",
            f"training.steps={steps}", "training.eval_every=0", "training.checkpoint_every=0",
            "distill.student=null"]


def single_scenario(scenario, arch: str, batch: int, steps: int):
    from ..scenario import overridden, validate

    data = scenario.resolved()
    data.pop("faults", None)  # the baseline is trained, not simulated: nothing fails on the way
    data = overridden(data, single_overrides(arch, batch, steps))
    return validate(data, f"{scenario.name} (single {arch})")


def train_single(scenario, arch: str, batch: int, steps: int):
    """The ``arch`` model trained alone (:func:`single_overrides`); its learner."""
    learners, _ = train_programs(single_scenario(scenario, arch, batch, steps))
    return learners[0]


def figures(module, rules, arch: str) -> dict:
    """The test-split figures of one credit model (after the compliance engine's vetoes)."""
    m = T.credit_metrics(module, rules, arch)
    return {k: float(m[k]) for k in FIGURES if k in m}


def comparison(scenario, modules: dict, steps_taken: list[int], rules) -> dict:
    """The report's ``finance`` section: per credit architecture, the deployed (fused)
    model's figures beside the single model's at the same training FLOPs.

    ``modules``: {architecture: fused module} (:func:`oresearcher.cooperation.deploy.fused_modules`);
    ``steps_taken``: local steps each rank took (rank order)."""
    from .cooperative_exchange import arch_ids

    ids, batch = arch_ids(scenario), per_rank_batch(scenario)
    out = {}
    for arch in [a for a in dict.fromkeys(ids) if T.is_credit(a)]:
        ranks = [r for r, a in enumerate(ids) if a == arch]
        steps = sum(steps_taken[r] for r in ranks)
        t0 = time.perf_counter()
        single = train_single(scenario, arch, batch, steps)
        out[arch] = {"dataset": DATASET[arch], "split": "test", "agents": len(ranks),
                     "cooperative": figures(modules[arch], rules, arch) if arch in modules else None,
                     "single": figures(single.module, rules, arch),
                     "single_steps": steps, "single_batch": batch,
                     "single_flops": float(steps * (single.fwd_flops + single.bwd_flops)),
                     "single_wall_s": time.perf_counter() - t0,
                     "protected": T.protected_feature(rules, arch)}
    return out


def _pct(v) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.2f}%"


def comparison_lines(section: dict) -> list[str]:
    """The comparison as printed after a finance run."""
    lines = []
    for arch, s in section.items():
        coop, single = s["cooperative"] or {}, s["single"]
        lines.append(f"{s['dataset']} ({arch}), {s['split']} split, after the compliance engine's vetoes:")
        lines.append(f"  {'':<24}{'deployed (fused model)':>24}{'single credit model, same FLOPs':>34}")
        for k in FIGURES:
            label = LABELS[k] + (f" ({s['protected']})" if k == "fairness_gap" and s.get("protected") else "")
            lines.append(f"  {label:<24}{_pct(coop.get(k)):>24}{_pct(single.get(k)):>34}")
        lines.append(f"  single model: {s['single_steps']:,} steps of {s['single_batch']} samples, the {s['agents']} "
                     f"{arch} agents' local steps together ({s['single_flops'] / 1e9:,.2f} GFLOP; "
                     f"trained here in {s['single_wall_s']:.1f} s)")
        if s["cooperative"] is None:
            lines.append(f"  no deployed model: every {arch} agent was excluded")
    return lines
